#!/usr/bin/env bash
# Runs the whole test suite: unit tests, openraft's storage conformance
# suite, and the integration tests that start real servers on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo test --all-targets "$@"
