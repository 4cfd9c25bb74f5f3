#!/usr/bin/env bash
# The gateway's MCP test talks to a real MCP server: the official Python
# SDK (`mcp` from PyPI) in a virtualenv of its own. Installs it once; prints
# nothing when it is already there. Tests find it via AGENTRY_MCP_PYTHON.
set -euo pipefail

venv="${AGENTRY_MCP_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentry/mcp-venv}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import mcp.server.mcpserver' 2>/dev/null; then
  exit 0
fi
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "fetch-mcp: installing python3 and python3-venv" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3 python3-venv >/dev/null
fi
echo "fetch-mcp: installing the MCP Python SDK into $venv" >&2
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q "mcp>=2.3,<3"
