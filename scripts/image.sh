#!/usr/bin/env bash
# Builds the Agentry container image on this machine without a container
# engine or a container registry, then runs it once to prove it works.
#
# The Containerfile needs a registry (rust and debian base images). This
# script only needs the Debian archive, PyPI (the model) and crates.io (the
# build): mmdebstrap makes a small Debian bookworm root filesystem, umoci
# stacks it, the model and the binary into an OCI image, skopeo exports a
# docker-archive tarball. The image has the Containerfile's layout, user,
# environment, ports, volume, entrypoint and healthcheck; only the base
# differs (see AGENTRY_IMAGE_BASE).
#
# Usage:
#   scripts/image.sh             build, then check
#   scripts/image.sh --no-check  build only
#   scripts/image.sh --check     check the image built before
#
# Output (in AGENTRY_IMAGE_OUT, default ./target/image):
#   agentry-oci/        OCI image layout, tag = the crate version
#   agentry-image.tar   docker-archive: `docker load -i`, `podman load -i`,
#                       `kind load image-archive`, `k3s ctr images import`
#
# Environment:
#   AGENTRY_BINARY       use this agentry binary instead of building one
#                        (it is copied first, so a concurrent cargo build
#                        cannot change it halfway)
#   AGENTRY_IMAGE_OUT    output folder (default ./target/image)
#   AGENTRY_IMAGE_NAME   image name in the tarball (default agentry)
#   AGENTRY_IMAGE_TAG    tag (default: version in Cargo.toml, the chart's
#                        appVersion)
#   AGENTRY_IMAGE_BASE   minimal (default): only the libraries the binary
#                        links (libc6, libgcc-s1, libstdc++6) plus base-files
#                        and netbase, no shell; slim: a debian:bookworm-slim
#                        equivalent (minbase: shell, dpkg, apt), like the
#                        Containerfile's runtime stage
#   AGENTRY_IMAGE_CHECK  auto (default: podman when it can run containers
#                        here, else unshare), podman or unshare
#   AGENTRY_IMAGE_REVISION, AGENTRY_IMAGE_SOURCE   OCI revision and source
#                        labels (default: git HEAD, "-dirty" when the tree
#                        differs; the origin remote's URL, if any)
#   AGENTRY_MODEL_DIR    where scripts/fetch-model.sh keeps the model
#   DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR   Debian archive URLs
#
# Needs root (mmdebstrap, umoci and the check keep file ownership and use
# mounts and namespaces) and Debian or Ubuntu (installs what it misses with
# apt-get). Under sudo, build the binary as yourself first and pass it:
#   cargo build --locked && sudo AGENTRY_BINARY="$PWD/target/debug/agentry" scripts/image.sh
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

log() { echo "image: $*" >&2; }
die() {
  echo "image: FAILED: $*" >&2
  exit 1
}

action=all
case "${1:-}" in
  "") ;;
  --no-check) action=build ;;
  --check) action=check ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *) die "unknown argument '$1' (try --help)" ;;
esac

# ---------------------------------------------------------------------------
# What the image is. This mirrors the runtime stage of ./Containerfile;
# check_containerfile (below) refuses to build when the two drift apart.
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
name=${AGENTRY_IMAGE_NAME:-agentry}
tag=${AGENTRY_IMAGE_TAG:-$version}
base=${AGENTRY_IMAGE_BASE:-minimal}
out=${AGENTRY_IMAGE_OUT:-$repo/target/image}
oci=$out/agentry-oci
archive=$out/agentry-image.tar

uid=10001
data_path=/var/lib/agentry
model_path=/usr/share/agentry/models/potion-base-8M
bin_path=/usr/local/bin/agentry
image_env=(
  "AGENTRY_MODEL_DIR=$model_path"
  "AGENTRY_DATA_DIR=$data_path"
  "AGENTRY_HTTP_ADDR=0.0.0.0:8470"
  "AGENTRY_GRPC_ADDR=0.0.0.0:8471"
  "AGENTRY_RAFT_ADDR=0.0.0.0:8472"
  "AGENTRY_PEER_ADDR=0.0.0.0:8473"
)
ports=(8470 8471 8472 8473)
entrypoint=(agentry)
cmd=(serve)
health=(agentry health)
# interval, timeout, start period (seconds), retries
health_timing=(30 5 60 3)
revision=${AGENTRY_IMAGE_REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
if [ "$revision" != unknown ] && [ -z "${AGENTRY_IMAGE_REVISION:-}" ] &&
  ! git diff --quiet HEAD -- 2>/dev/null; then
  revision="$revision-dirty"
fi
source_url=${AGENTRY_IMAGE_SOURCE:-$(git remote get-url origin 2>/dev/null || true)}
labels=(
  "org.opencontainers.image.title=agentry"
  "org.opencontainers.image.description=A federated registry cluster for AI agents"
  "org.opencontainers.image.licenses=Apache-2.0"
  "org.opencontainers.image.version=$version"
  "org.opencontainers.image.revision=$revision"
)
if [ -n "$source_url" ]; then labels+=("org.opencontainers.image.source=$source_url"); fi

# JSON array of the arguments, as the Containerfile writes them.
json_array() {
  python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
}

# The Containerfile must say the same about everything a user or the Helm
# chart relies on; a mismatch is a bug in one of the two files.
check_containerfile() {
  local want
  local -a wants=("USER $uid:$uid" "WORKDIR $data_path" "VOLUME [\"$data_path\"]"
    "ENTRYPOINT $(json_array "${entrypoint[@]}")" "CMD $(json_array "${cmd[@]}")"
    "CMD $(json_array "${health[@]}")"
    "--interval=${health_timing[0]}s --timeout=${health_timing[1]}s --start-period=${health_timing[2]}s --retries=${health_timing[3]}"
    "EXPOSE $(printf '%s/tcp ' "${ports[@]}" | sed 's/ $//')"
    "$model_path" "$bin_path" "ARG VERSION=$version")
  wants+=("${image_env[@]}")
  for want in "${wants[@]}"; do
    grep -qF -- "$want" Containerfile ||
      die "Containerfile and scripts/image.sh disagree: Containerfile lacks '$want'"
  done
}

# ---------------------------------------------------------------------------
# Tools.
need_root() {
  [ "$(id -u)" -eq 0 ] || die "run as root (mmdebstrap, umoci and the check keep file ownership and use mounts)"
}

# Installs the Debian packages that provide the given commands, when missing.
need_commands() {
  local -a missing=()
  local pair
  for pair in "$@"; do
    command -v "${pair%%=*}" >/dev/null 2>&1 || missing+=("${pair#*=}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

work=""
cleanup() {
  if [ -n "$work" ]; then rm -rf "$work"; fi
}
trap cleanup EXIT

# ---------------------------------------------------------------------------
# Build.

# The binary: AGENTRY_BINARY, or the project's one build (dev profile,
# optimised in Cargo.toml). Debug info is stripped (~450 MB of line tables);
# the symbols stay, so a panic's backtrace still names its functions.
stage_binary() {
  local src
  if [ -n "${AGENTRY_BINARY:-}" ]; then
    src=$AGENTRY_BINARY
    [ -x "$src" ] || die "AGENTRY_BINARY=$src is not an executable file"
  else
    command -v cargo >/dev/null 2>&1 ||
      die "cargo not found (under sudo: build as yourself, then sudo AGENTRY_BINARY=\$PWD/target/debug/agentry scripts/image.sh)"
    log "building the binary (scripts/setup.sh, cargo build --locked)"
    # shellcheck source=scripts/setup.sh
    source scripts/setup.sh
    cargo build --locked
    src=${CARGO_TARGET_DIR:-target}/debug/agentry
  fi
  cp "$src" "$work/agentry.full"
  objcopy --strip-debug "$work/agentry.full" "$work/agentry"
  rm "$work/agentry.full"
  chmod 0755 "$work/agentry"
}

# The model, verified against its manifest (fetch-model.sh does nothing
# when a verified copy is in place).
stage_model() {
  scripts/fetch-model.sh
  model_src=${AGENTRY_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentry/models/potion-base-8M}
  [ -f "$model_src/MODEL-MANIFEST.json" ] || die "no model in $model_src"
}

# A Debian bookworm root filesystem as a tarball.
make_rootfs() {
  local -a opts
  # Merged /usr the way debootstrap (and so Debian's official images) sets
  # it up: directory symlinks, not the usrmerge package, which would pull in
  # perl. The excludes are what the debian:bookworm-slim image leaves out.
  opts=(--mode=root --format=tar
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/lintian/*'
    --dpkgopt='path-exclude=/usr/share/groff/*')
  case "$base" in
    minimal)
      # Only unpacked, no maintainer scripts: nothing these packages' scripts
      # do matters to a static set of libraries, and the "custom" variant
      # would need dpkg inside. The .debs are kept for the dpkg status below.
      # No ca-certificates: the binary's TLS clients use their bundled web
      # PKI roots (or --ca-file), never /etc/ssl.
      # shellcheck disable=SC2054 # the commas separate packages
      opts+=(--variant=extract --skip=cleanup/apt/cache
        --include=base-files,libc6,libgcc-s1,libstdc++6,netbase)
      ;;
    slim)
      opts+=(--variant=minbase --include=libstdc++6)
      ;;
    *) die "AGENTRY_IMAGE_BASE must be minimal or slim, not '$base'" ;;
  esac
  local mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
  local security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
  log "making a Debian bookworm root filesystem ($base) with mmdebstrap"
  mmdebstrap "${opts[@]}" bookworm "$work/rootfs.tar" \
    "deb $mirror bookworm main" \
    "deb $mirror bookworm-updates main" \
    "deb $security bookworm-security main" >"$work/mmdebstrap.log" 2>&1 ||
    {
      tail -n 30 "$work/mmdebstrap.log" >&2
      die "mmdebstrap failed"
    }
}

# Turns the extracted tarball into the image's base layer: no apt state, no
# device nodes (runtimes mount /dev), no host resolver settings, the user,
# the data directory.
prepare_base() {
  local root=$1 deb
  tar -xpf "$work/rootfs.tar" -C "$root" --numeric-owner
  find "$root/dev" -mindepth 1 -delete
  rm -f "$root/etc/resolv.conf" "$root/etc/hostname"
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
  if [ "$base" = minimal ]; then
    # A dpkg status database, so that image scanners (trivy, grype, syft)
    # see the packages and their versions.
    : >"$root/var/lib/dpkg/status"
    for deb in "$root"/var/cache/apt/archives/*.deb; do
      dpkg-deb -f "$deb" |
        awk '{ print } /^Package:/ { print "Status: install ok installed" }' \
          >>"$root/var/lib/dpkg/status"
      echo >>"$root/var/lib/dpkg/status"
    done
    rm -rf "$root/etc/apt" "$root/var/lib/apt" "$root/var/cache/apt" "$root/var/log/apt" \
      "$root/etc/dpkg/dpkg.cfg.d/99mmdebstrap"
    # No passwd package (no useradd): the entries are written directly.
    printf '%s\n' 'root:x:0:0:root:/root:/usr/sbin/nologin' \
      'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin' \
      "agentry:x:$uid:$uid:agentry:$data_path:/usr/sbin/nologin" >"$root/etc/passwd"
    printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' "agentry:x:$uid:" >"$root/etc/group"
    # libc-bin (not installed) ships this; without it glibc asks DNS before
    # /etc/hosts.
    printf '%s\n' 'passwd: files' 'group: files' 'shadow: files' 'hosts: files dns' \
      'networks: files' 'protocols: files' 'services: files' >"$root/etc/nsswitch.conf"
  else
    rm -rf "$root"/var/lib/apt/lists/*
    # The Containerfile's own commands.
    chroot "$root" groupadd --gid "$uid" agentry
    chroot "$root" useradd --uid "$uid" --gid "$uid" --no-log-init --no-create-home \
      --home-dir "$data_path" --shell /usr/sbin/nologin agentry
  fi
  install -d -o "$uid" -g "$uid" -m 0700 "$root$data_path"
}

# OCI layout with three layers (Debian base, model, binary: the one that
# changes most comes last) and the runtime config.
assemble() {
  local bundle=$work/bundle root e p l
  rm -rf "$oci"
  mkdir -p "$out"
  umoci init --layout "$oci"
  umoci new --image "$oci:$tag"
  umoci unpack --image "$oci:$tag" "$bundle" >/dev/null
  root=$bundle/rootfs

  prepare_base "$root"
  umoci repack --refresh-bundle --image "$oci:$tag" \
    --history.created_by "mmdebstrap --variant=$([ "$base" = minimal ] && echo extract || echo minbase) bookworm ($base base), user agentry ($uid), $data_path" \
    "$bundle"

  mkdir -p "$root$(dirname "$model_path")"
  cp -r "$model_src" "$root$model_path"
  chown -R 0:0 "$root$model_path"
  chmod -R u=rwX,go=rX "$root$model_path"
  umoci repack --refresh-bundle --image "$oci:$tag" \
    --history.created_by "scripts/fetch-model.sh: potion-base-8M at $model_path" "$bundle"

  install -D -o 0 -g 0 -m 0755 "$work/agentry" "$root$bin_path"
  # The libraries it links are there, in the versions it needs.
  chroot "$root" "$bin_path" --version >/dev/null ||
    die "the binary does not run in the $base root filesystem (missing library?)"
  umoci repack --image "$oci:$tag" \
    --history.created_by "cargo build --locked (dev profile), objcopy --strip-debug: $bin_path" "$bundle"

  # The runtime config, set after the layers: repack leaves volumes out.
  local -a conf=(--config.user "$uid:$uid" --config.workingdir "$data_path"
    --config.env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    --config.volume "$data_path")
  for e in "${image_env[@]}"; do conf+=(--config.env "$e"); done
  for p in "${ports[@]}"; do conf+=(--config.exposedports "$p/tcp"); done
  for e in "${entrypoint[@]}"; do conf+=(--config.entrypoint "$e"); done
  for e in "${cmd[@]}"; do conf+=(--config.cmd "$e"); done
  for l in "${labels[@]}"; do conf+=(--config.label "$l"); done
  umoci config --image "$oci:$tag" "${conf[@]}" \
    --history.created_by "config: user, env, ports, volume, entrypoint, cmd, labels"

  add_healthcheck
  umoci gc --layout "$oci"
}

# The OCI image config has no healthcheck field; Docker's has
# (config.Healthcheck), and OCI tells readers to ignore fields they do not
# know. Writing it into the config blob lets `docker load` and `podman load`
# of the docker-archive pick it up (skopeo keeps the config blob as it is);
# Kubernetes ignores it either way and uses the chart's probes.
add_healthcheck() {
  python3 - "$oci" "$tag" "${health_timing[@]}" "${health[@]}" <<'PY'
import hashlib, json, os, sys

layout, tag, interval, timeout, start, retries, *test = sys.argv[1:]
ns = 1_000_000_000

def path(digest):
    algo, hexa = digest.split(":")
    return os.path.join(layout, "blobs", algo, hexa)

def load(digest):
    with open(path(digest), "rb") as f:
        return json.load(f)

def store(obj, desc):
    data = json.dumps(obj, separators=(",", ":")).encode()
    desc["digest"] = "sha256:" + hashlib.sha256(data).hexdigest()
    desc["size"] = len(data)
    with open(path(desc["digest"]), "wb") as f:
        f.write(data)

index_path = os.path.join(layout, "index.json")
with open(index_path) as f:
    index = json.load(f)
ref = "org.opencontainers.image.ref.name"
mdesc = next(d for d in index["manifests"] if d.get("annotations", {}).get(ref) == tag)
manifest = load(mdesc["digest"])
config = load(manifest["config"]["digest"])
config.setdefault("config", {})["Healthcheck"] = {
    "Test": ["CMD", *test],
    "Interval": int(interval) * ns,
    "Timeout": int(timeout) * ns,
    "StartPeriod": int(start) * ns,
    "Retries": int(retries),
}
store(config, manifest["config"])
store(manifest, mdesc)
with open(index_path + ".new", "w") as f:
    json.dump(index, f)
os.replace(index_path + ".new", index_path)
PY
}

export_archive() {
  rm -f "$archive"
  skopeo copy --quiet "oci:$oci:$tag" "docker-archive:$archive:$name:$tag"
}

human() { numfmt --to=iec-i --suffix=B --format='%.1f' "$1"; }

report_sizes() {
  local layers unpacked gz
  layers=$(python3 - "$oci" "$tag" <<'PY'
import json, os, sys
layout, tag = sys.argv[1:]
index = json.load(open(os.path.join(layout, "index.json")))
ref = "org.opencontainers.image.ref.name"
d = next(d for d in index["manifests"] if d.get("annotations", {}).get(ref) == tag)
m = json.load(open(os.path.join(layout, "blobs", *d["digest"].split(":"))))
print(sum(l["size"] for l in m["layers"]))
PY
  )
  unpacked=$(du -sb "$work/bundle/rootfs" | cut -f1)
  gz=$(gzip -1 -c "$archive" | wc -c)
  log "image $name:$tag ($base base, revision $revision)"
  log "  unpacked root filesystem: $(human "$unpacked")"
  log "  compressed layers (registry push/pull): $(human "$layers")"
  log "  $archive: $(human "$(stat -c %s "$archive")") (gzip -1: $(human "$gz"))"
}

# ---------------------------------------------------------------------------
# Check: run the image once, as it ships (no --user, no env, no args), with
# a read-only root filesystem and only the data volume writable, and prove
#   - the server becomes ready (GET /readyz = 200, curl from the host),
#   - it runs as uid/gid 10001 without group 0,
#   - its root filesystem is mounted read-only and nothing writable is
#     mounted on /tmp or /var/tmp,
#   - it loaded the built-in model from the image,
#   - it wrote its state (admin key digest, cluster secret, RocksDB) into
#     the volume, as uid 10001,
#   - the image's healthcheck command passes,
#   - it stops cleanly on SIGTERM (exit 0), as PID 1.

check_log=""

fail_check() {
  if [ -n "$check_log" ] && [ -s "$check_log" ]; then
    echo "---- server output (last 40 lines) ----" >&2
    tail -n 40 "$check_log" >&2
    echo "----" >&2
  fi
  if [ -s "$work/podman.log" ]; then
    echo "---- podman's messages ----" >&2
    tail -n 20 "$work/podman.log" >&2
    echo "----" >&2
  fi
  die "check: $*"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_ready ALIVE CURL...: polls /readyz with CURL for up to 120 s while
# the command ALIVE succeeds.
wait_ready() {
  local alive=$1 code=000 i
  shift
  for i in $(seq 1 240); do
    $alive || fail_check "the server exited before it was ready"
    code=$("$@" -s -o /dev/null -w '%{http_code}' --max-time 2 2>/dev/null) || code=000
    if [ "$code" = 200 ]; then
      log "check: GET /readyz = 200 within $(((i + 1) / 2)) s"
      return 0
    fi
    sleep 0.5
  done
  fail_check "GET /readyz did not answer 200 within 120 s (last: $code)"
}

# Proves user and read-only root from the kernel's view of process PID.
prove_process() {
  local pid=$1 ids groups root_opts tmp_mounts
  ids=$(awk '/^(Uid|Gid):/ { print $2, $3, $4, $5 }' "/proc/$pid/status" | tr '\n' ' ')
  [ "$ids" = "$uid $uid $uid $uid $uid $uid $uid $uid " ] ||
    fail_check "the server runs as uid/gid '$ids', not $uid"
  groups=$(awk '/^Groups:/ { $1 = ""; print }' "/proc/$pid/status")
  case " $groups " in *" 0 "*) fail_check "the server has supplementary group 0 ($groups)" ;; esac
  # mountinfo is seen from the process's root: field 5 is the mount point,
  # field 6 the mount options.
  root_opts=$(awk '$5 == "/" { o = $6 } END { print o }' "/proc/$pid/mountinfo")
  case ",$root_opts," in
    *,ro,*) ;;
    *) fail_check "the root filesystem is mounted '$root_opts', not read-only" ;;
  esac
  tmp_mounts=$(awk '$5 ~ "^/(tmp|var/tmp)(/|$)"' "/proc/$pid/mountinfo")
  [ -z "$tmp_mounts" ] || fail_check "something is mounted on /tmp: $tmp_mounts"
  log "check: runs as uid/gid $uid (groups:${groups:- none}), root filesystem read-only ($root_opts), nothing mounted on /tmp"
}

prove_model() {
  grep -q 'embedding model loaded' "$check_log" ||
    fail_check "the server did not load the built-in model (no 'embedding model loaded' line)"
  log "check: $(grep -o 'embedding model loaded.*' "$check_log" | head -n 1 | sed 's/\x1b\[[0-9;]*m//g')"
}

prove_data() {
  local dir=$1 foreign
  [ -f "$dir/admin-key.sha256" ] || fail_check "no admin-key.sha256 in the data volume"
  [ -n "$(find "$dir" -name CURRENT -print -quit)" ] ||
    fail_check "no RocksDB store in the data volume"
  foreign=$(find "$dir" ! -uid "$uid" -print -quit)
  [ -z "$foreign" ] || fail_check "$foreign in the data volume is not owned by $uid"
  log "check: the volume holds $(find "$dir" -type f | wc -l) files, all owned by $uid: $(cd "$dir" && find . -mindepth 1 -maxdepth 1 -printf '%P ')"
}

# Can podman run the image here? Loads the archive (into podman's storage,
# where it stays) and sets podman_image and podman_run.
podman_image=""
podman_run=()
podman_usable() {
  local nofile
  command -v podman >/dev/null 2>&1 || return 1
  # podman asks the runtime to raise RLIMIT_NOFILE/NPROC to its defaults;
  # where the caller's hard limits are lower and CAP_SYS_RESOURCE is not
  # usable (CI sandboxes, some VMs) crun/runc fail with EPERM. Ask for what
  # this shell has.
  nofile=$(ulimit -Hn)
  [ "$nofile" = unlimited ] && nofile=1048576
  podman_run=(podman run --ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096)
  log "check: podman load -i $archive"
  podman load -q -i "$archive" >/dev/null || return 1
  podman_image=$(podman image inspect --format '{{.Id}}' "$name:$tag") || return 1
  "${podman_run[@]}" --rm --network=none "$podman_image" --version >/dev/null 2>&1 && return 0
  # crun cannot run on a hybrid cgroup v1/v2 host; runc can.
  command -v runc >/dev/null 2>&1 || return 1
  podman_run=(podman --runtime runc run "${podman_run[@]:2}")
  "${podman_run[@]}" --rm --network=none "$podman_image" --version >/dev/null 2>&1
}

# podman's own complaints (e.g. that it cannot set up systemd timers for
# the healthcheck where there is no systemd) go to a file, shown on failure.
podman_quiet() { podman "$@" 2>>"$work/podman.log"; }

check_podman() {
  local image=$podman_image vol ctr port pid mountpoint code
  [ "$(podman image inspect --format '{{.Config.User}}' "$image")" = "$uid:$uid" ] ||
    fail_check "the loaded image's user is not $uid:$uid"
  podman image inspect --format '{{json .HealthCheck}}' "$image" | grep -qF "$(json_array CMD "${health[@]}" | tr -d ' ')" ||
    fail_check "the loaded image has no healthcheck '${health[*]}'"
  vol=agentry-image-check-$$
  ctr=agentry-image-check-$$
  port=$(free_port)
  podman volume create "$vol" >/dev/null
  # shellcheck disable=SC2064 # expand now: the names are fixed
  trap "podman rm -f -t 0 $ctr >/dev/null 2>&1 || true; podman volume rm -f $vol >/dev/null 2>&1 || true; cleanup" EXIT
  # No --user, -e or args: what the image says. --read-only-tmpfs=false:
  # no writable /tmp, /var/tmp or /run either. A fresh named volume, as
  # `docker run -v agentry-data:/var/lib/agentry` gives (podman and docker
  # copy the image's ownership of the directory into it).
  # --health-interval=disable: keep the image's healthcheck but no timer
  # (podman runs it from systemd timers); it is run once by hand below.
  podman_quiet "${podman_run[@]:1}" -d --name "$ctr" --read-only --read-only-tmpfs=false --cap-drop=all \
    --security-opt=no-new-privileges --health-interval=disable \
    -p "127.0.0.1:$port:8470" -v "$vol:$data_path" "$image" >/dev/null
  check_log=$work/server.log
  podman_alive() {
    podman logs "$ctr" >"$check_log" 2>&1 || true
    [ "$(podman inspect --format '{{.State.Running}}' "$ctr")" = true ]
  }
  wait_ready podman_alive curl "http://127.0.0.1:$port/readyz"
  podman logs "$ctr" >"$check_log" 2>&1
  pid=$(podman inspect --format '{{.State.Pid}}' "$ctr")
  prove_process "$pid"
  prove_model

  podman_quiet healthcheck run "$ctr" >/dev/null ||
    fail_check "the image's healthcheck (${health[*]}) fails"
  log "check: healthcheck '${health[*]}' passes"

  podman_quiet stop -t 30 "$ctr" >/dev/null
  podman logs "$ctr" >"$check_log" 2>&1
  code=$(podman inspect --format '{{.State.ExitCode}}' "$ctr")
  [ "$code" = 0 ] || fail_check "the server exited with $code on SIGTERM"
  log "check: stopped cleanly on SIGTERM (as PID 1)"
  mountpoint=$(podman volume inspect --format '{{.Mountpoint}}' "$vol")
  prove_data "$mountpoint"
  podman_quiet rm -f "$ctr" >/dev/null
  podman volume rm -f "$vol" >/dev/null
  trap cleanup EXIT
  log "check: passed with podman ($name:$tag stays loaded in podman's storage)"
}

# Without a container engine: the image's own bundle (umoci unpack: its
# layers and its runtime config), run in fresh mount, PID, network, UTS and
# IPC namespaces, chrooted, as the config's user, with the config's
# environment and arguments; the root a read-only bind mount, the volume a
# fresh directory owned like the image's data directory (what docker and
# podman do for a new named volume).
# The unshare process and the server in its namespaces (the server is their
# PID 1: killing it ends everything in them).
unshare_pid=""
server_pid=""
stop_unshare() {
  if [ -n "$server_pid" ]; then kill -KILL "$server_pid" 2>/dev/null || true; fi
  if [ -n "$unshare_pid" ]; then
    pkill -KILL -P "$unshare_pid" 2>/dev/null || true
    kill -KILL "$unshare_pid" 2>/dev/null || true
    wait "$unshare_pid" 2>/dev/null || true
  fi
}

check_unshare() {
  local bundle=$work/check root data sup pid code i cuid cgid
  local -a env args inside
  need_commands ip=iproute2 nsenter=util-linux unshare=util-linux
  umoci unpack --image "$oci:$tag" "$bundle" >/dev/null
  root=$bundle/rootfs
  mapfile -d '' env < <(python3 -c 'import json, sys
p = json.load(open(sys.argv[1]))["process"]
sys.stdout.write("".join(e + "\0" for e in p["env"]))' "$bundle/config.json")
  mapfile -d '' args < <(python3 -c 'import json, sys
p = json.load(open(sys.argv[1]))["process"]
sys.stdout.write("".join(a + "\0" for a in p["args"]))' "$bundle/config.json")
  read -r cuid cgid < <(python3 -c 'import json, sys
u = json.load(open(sys.argv[1]))["process"]["user"]
print(u["uid"], u["gid"])' "$bundle/config.json")
  [ "$cuid:$cgid" = "$uid:$uid" ] || fail_check "the image's user is $cuid:$cgid, not $uid:$uid"

  data=$work/volume
  mkdir "$data"
  chown --reference="$root$data_path" "$data"
  chmod --reference="$root$data_path" "$data"
  check_log=$work/server.log

  # Runs as root in the new namespaces, then becomes the server.
  # shellcheck disable=SC2016 # the inner script expands its own arguments
  local inner='
    set -euo pipefail
    root=$1 data=$2 data_path=$3 uid=$4 gid=$5
    shift 5
    env=()
    while [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    mount --make-rprivate /
    mount --bind "$root" "$root"
    mount --bind "$data" "$root$data_path"
    mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
    mount -t tmpfs -o nosuid,mode=0755 dev "$root/dev"
    for n in null zero full random urandom; do
      : >"$root/dev/$n"
      mount --bind "/dev/$n" "$root/dev/$n"
    done
    mount -o remount,bind,ro,nosuid,nodev "$root"
    ip link set lo up
    exec env -i "${env[@]}" chroot --userspec="$uid:$gid" --groups="$gid" "$root" "$@"'
  unshare --mount --pid --net --uts --ipc --fork -- \
    bash -c "$inner" inner "$root" "$data" "$data_path" "$cuid" "$cgid" "${env[@]}" -- "${args[@]}" \
    >"$check_log" 2>&1 &
  sup=$!
  unshare_pid=$sup
  trap 'stop_unshare; cleanup' EXIT

  # The server is unshare's child (PID 1 in its namespace) once exec'd.
  pid=""
  for i in $(seq 1 100); do
    pid=$(pgrep -P "$sup" || true)
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = agentry ]; then break; fi
    kill -0 "$sup" 2>/dev/null || fail_check "the namespace setup failed"
    sleep 0.1
  done
  [ -n "$pid" ] || fail_check "the server did not start"
  server_pid=$pid
  unshare_alive() { kill -0 "$pid" 2>/dev/null; }
  wait_ready unshare_alive nsenter --net="/proc/$pid/ns/net" curl http://127.0.0.1:8470/readyz
  prove_process "$pid"
  prove_model

  # Same namespaces, root, user and environment as the server.
  inside=(nsenter --target "$pid" --mount --net --pid -- env -i "${env[@]}"
    chroot --userspec="$cuid:$cgid" --groups="$cgid" "$root")
  "${inside[@]}" "${health[@]}" >/dev/null || fail_check "the image's healthcheck (${health[*]}) fails"
  log "check: healthcheck '${health[*]}' passes"

  kill -TERM "$pid"
  for i in $(seq 1 300); do
    kill -0 "$sup" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$sup" 2>/dev/null && fail_check "the server did not stop within 30 s of SIGTERM"
  code=0
  wait "$sup" || code=$?
  unshare_pid="" server_pid=""
  trap cleanup EXIT
  [ "$code" = 0 ] || fail_check "the server exited with $code on SIGTERM"
  log "check: stopped cleanly on SIGTERM (as PID 1)"
  prove_data "$data"
  log "check: passed (umoci unpack + unshare: read-only root, $data_path a bind-mounted volume)"
}

check() {
  if [ ! -f "$oci/index.json" ] || [ ! -f "$archive" ]; then
    die "no image in $out; build it first"
  fi
  need_commands curl=curl umoci=umoci
  local how=${AGENTRY_IMAGE_CHECK:-auto}
  case "$how" in
    podman)
      podman_usable || die "check: podman cannot run the image here (AGENTRY_IMAGE_CHECK=unshare avoids it)"
      check_podman
      ;;
    unshare) check_unshare ;;
    auto)
      if podman_usable; then
        check_podman
      else
        log "check: podman missing or unable to run containers here: umoci unpack + unshare"
        check_unshare
      fi
      ;;
    *) die "AGENTRY_IMAGE_CHECK must be auto, podman or unshare, not '$how'" ;;
  esac
}

# ---------------------------------------------------------------------------
need_root
need_commands python3=python3
work=$(mktemp -d "${TMPDIR:-/var/tmp}/agentry-image.XXXXXX")

if [ "$action" != check ]; then
  check_containerfile
  need_commands mmdebstrap=mmdebstrap umoci=umoci skopeo=skopeo objcopy=binutils
  stage_binary
  stage_model
  make_rootfs
  assemble
  export_archive
  report_sizes
  log "OCI layout: $oci (tag $tag); docker-archive: $archive ($name:$tag)"
fi
if [ "$action" != build ]; then
  check
fi
