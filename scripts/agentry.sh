#!/usr/bin/env bash
# Builds Agentry if needed (installing the build prerequisites) and runs the
# `agentry` binary with the given arguments, e.g. `scripts/agentry.sh cluster
# status`. The build is shared with scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
source scripts/setup.sh
# Build the same targets as scripts/test.sh so both share one set of
# compiled dependencies (RocksDB takes long to build; build it once).
cargo build --quiet --all-targets
cd "$OLDPWD"
exec "${CARGO_TARGET_DIR:-$root/target}/debug/agentry" "$@"
