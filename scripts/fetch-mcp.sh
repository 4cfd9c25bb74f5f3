#!/usr/bin/env bash
# The tests' Python clients and servers, in a virtualenv of their own: the
# official MCP Python SDK (`mcp` from PyPI; the gateway's MCP test runs it
# as a real MCP server), grpcio-reflection and grpcio-status (a gRPC client
# that knows the services only through reflection and reads gRPC's rich
# error details) and the official A2A Python SDK
# (`a2a-sdk` with its HTTP server extra, served by uvicorn; the gateway's
# A2A tests run tests/fixtures/a2a_agent.py on it as real A2A agents).
# Installs them once; prints nothing when they are already there. Tests
# find it via AGENTRY_MCP_PYTHON.
set -euo pipefail

venv="${AGENTRY_MCP_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentry/mcp-venv}"
a2a_version="1.3.0"
want=("mcp>=2.3,<3" "grpcio>=1.60,<2" "grpcio-reflection>=1.60,<2" "grpcio-status>=1.60,<2"
  "a2a-sdk[http-server]==$a2a_version" "uvicorn>=0.30")
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import mcp.server.mcpserver' 2>/dev/null; then
  if "$venv/bin/python" -c '
import sys
from importlib.metadata import version
import grpc_reflection.v1alpha, grpc_status.rpc_status, uvicorn, sse_starlette, a2a.server.routes
sys.exit(version("a2a-sdk") != sys.argv[1])' "$a2a_version" 2>/dev/null; then
    exit 0
  fi
  echo "fetch-mcp: adding grpcio-reflection, grpcio-status and the A2A SDK to $venv" >&2
  "$venv/bin/pip" install -q "${want[@]}"
  exit 0
fi
echo "fetch-mcp: installing the MCP and A2A Python SDKs and grpcio-reflection into $venv" >&2
source "$(dirname "$0")/python-venv.sh"
new_venv fetch-mcp "$venv" "${want[@]}"
