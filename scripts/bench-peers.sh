#!/usr/bin/env bash
# Runs scripts/bench-peers.py for `agentry bench discover` and `agentry eval
# --expert`: installs PostgreSQL 15 (Debian package) when missing and a
# virtualenv with psycopg, lancedb, tantivy, usearch and numpy (PyPI), then
# runs the peers on the corpus in DIR.
# Usage: bench-peers.sh DIR CLIENTS [MODE]
# MODE: the peers to time, comma-separated (default postgres,lancedb,expert),
# or rank (the expert ranks DIR's labelled queries).
set -euo pipefail
dir="$1"; clients="$2"; mode="${3:-postgres,lancedb,expert}"
here="$(cd "$(dirname "$0")" && pwd)"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
pg_bin="-"
if [[ ",$mode," == *,postgres,* ]]; then
  pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$pg_bin" ]; then
    echo "bench-peers: installing postgresql" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null
    pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  fi
fi
venv="${AGENTRY_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentry/bench-venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" 2>/dev/null || {
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$venv"
  }
fi
packages=("tantivy>=0.22" "usearch>=2.12" "numpy>=1.26")
if [[ ",$mode," == *,postgres,* ]]; then packages+=("psycopg[binary]>=3.2"); fi
if [[ ",$mode," == *,lancedb,* ]]; then packages+=("lancedb>=0.20" pyarrow); fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}" >&2
exec "$venv/bin/python" "$here/bench-peers.py" "$dir" "$pg_bin" "$clients" "$mode"
