#!/usr/bin/env bash
# Builds and starts a single-node registry on the embedded defaults:
# data in ./agentry-data, HTTP on 127.0.0.1:8470, gRPC on 127.0.0.1:8471.
# Extra arguments go to `agentry serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
# Build the same targets as scripts/test.sh so both share one set of
# compiled dependencies (RocksDB takes long to build; build it once).
cargo build --quiet --all-targets
exec "${CARGO_TARGET_DIR:-target}/debug/agentry" serve "$@"
