#!/usr/bin/env bash
# Runs the whole test suite: unit tests, openraft's storage conformance
# suite, and the integration tests that start real servers on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
# The `minilm` embedder's tests load the real model.
scripts/fetch-minilm.sh
# The gateway's MCP test runs the official MCP Python SDK as its server.
scripts/fetch-mcp.sh
# The directory page's browser test (tests/api/ui.rs) drives headless Chromium.
scripts/fetch-chromium.sh
# The MCP server test also drives the MCP Inspector CLI and conformance suite.
scripts/fetch-node-tools.sh
# The Helm chart's alert rules are checked and unit-tested by promtool.
AGENTRY_PROMTOOL="$(scripts/fetch-promtool.sh)"
export AGENTRY_PROMTOOL
# The Helm chart is rendered, linted and validated by Helm itself and
# kubernetes-validate, and its pods are run (tests/api/helm.rs).
AGENTRY_HELM_BIN="$(scripts/fetch-helm.sh)"
export AGENTRY_HELM_BIN
export AGENTRY_MCP_PYTHON="${AGENTRY_MCP_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentry/mcp-venv}/bin/python"
cargo test --all-targets "$@"
