#!/usr/bin/env bash
# Builds and starts a single-node registry on the embedded defaults:
# data in ./agentry-data, HTTP on 127.0.0.1:8470, gRPC on 127.0.0.1:8471.
# Extra arguments go to `agentry serve`.
set -euo pipefail
exec "$(dirname "$0")/agentry.sh" serve "$@"
