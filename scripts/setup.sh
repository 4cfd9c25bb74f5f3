#!/usr/bin/env bash
# Installs what building Agentry needs beyond Rust: a C++ compiler and
# clang/libclang for RocksDB's bindings, make for jemalloc. Does nothing
# when they are present.
set -euo pipefail

have_libclang() {
  ldconfig -p 2>/dev/null | grep -q 'libclang.*\.so' && return 0
  compgen -G '/usr/lib/llvm-*/lib/libclang*.so*' >/dev/null && return 0
  compgen -G '/usr/lib/x86_64-linux-gnu/libclang*.so*' >/dev/null && return 0
  compgen -G '/usr/lib/aarch64-linux-gnu/libclang*.so*' >/dev/null && return 0
  return 1
}

missing=()
command -v c++ >/dev/null 2>&1 || missing+=(g++)
# jemalloc (the binary's allocator) is built by its configure and make.
command -v make >/dev/null 2>&1 || missing+=(make)
command -v clang >/dev/null 2>&1 || missing+=(clang)
have_libclang || missing+=(libclang-dev)
# The test suite makes throwaway TLS certificates for the peer listener.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} (needed to build RocksDB and jemalloc)" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Reuse a build cache kept outside the clone when there is one (CI keeps it
# between runs); a fresh machine simply builds into ./target.
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  cache="${AGENTRY_TARGET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentry-target}"
  if [ -d "$cache" ]; then
    export CARGO_TARGET_DIR="$cache"
  fi
fi

# The default embedding model for discovery (verified, offline afterwards).
"$(dirname "${BASH_SOURCE[0]}")/fetch-model.sh"
