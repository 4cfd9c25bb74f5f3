#!/usr/bin/env bash
# The bench-data sets' single-method anchors (BM25, MiniLM, potion-base-8M)
# computed by the sets' own script, ../shared/bench-data/eval_baselines.py,
# with MiniLM run in numpy (scripts/anchors/) instead of torch.
#   scripts/anchors.sh bfcl-live queries.jsonl
#   scripts/anchors.sh metatool queries_2000.jsonl
# Prints one line per method; the JSON results go to $OUT_JSON_DIR (default .).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="${AGENTRY_BENCH_DATA:-$here/../../shared/bench-data}"
"$here/fetch-model.sh"
"$here/fetch-minilm.sh"
models="${XDG_CACHE_HOME:-$HOME/.cache}/agentry/models"
venv="${XDG_CACHE_HOME:-$HOME/.cache}/agentry/anchors-venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet numpy scipy safetensors tokenizers rank_bm25 model2vec
fi
cd "$data"
PYTHONPATH="$here/anchors" exec "$venv/bin/python" eval_baselines.py "$1" "$2" \
  "$models/all-MiniLM-L6-v2" "$models/potion-base-8M"
