#!/usr/bin/env bash
# Runs the whole test suite: unit tests, openraft's storage conformance
# suite, and the integration tests that start real servers on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
# The `minilm` embedder's tests load the real model.
scripts/fetch-minilm.sh
cargo test --all-targets "$@"
