#!/usr/bin/env bash
# The MCP server test's Node.js clients: the MCP Inspector (driven in its
# `--cli` mode to list and call Agentry's MCP tools) and the MCP conformance
# suite (its `server --url` checks). Both need Node.js 22, newer than many
# distributions ship, so Node.js 22 comes from npm too (the `node` package)
# and the tools run with it first on PATH. Installs them once into a cache
# directory of their own; prints nothing when they are already there. Tests
# find it via AGENTRY_NODE_TOOLS (default: the directory below).
set -euo pipefail

dir="${AGENTRY_NODE_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/agentry/node-tools}"
bin="$dir/node_modules/.bin"
if [ -x "$bin/node" ] && [ -x "$bin/mcp-inspector" ] && [ -x "$bin/conformance" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch-node-tools: installing npm" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm >/dev/null
fi
echo "fetch-node-tools: installing Node.js 22, the MCP Inspector and the MCP conformance suite into $dir" >&2
mkdir -p "$dir"
if [ ! -f "$dir/package.json" ]; then
  printf '{ "name": "agentry-node-tools", "private": true }\n' >"$dir/package.json"
fi
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "node@22" >/dev/null
PATH="$bin:$PATH" npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
  "@modelcontextprotocol/inspector@^2" "@modelcontextprotocol/conformance@^0.1.16" >/dev/null
