# Sourced by the fetch scripts that give the tests a Python tool of their
# own. new_venv TOOL DIR PACKAGE...: makes a fresh virtualenv at DIR with
# PACKAGE... from PyPI, installing Debian's python3 and python3-venv first
# when the machine lacks them (TOOL names the caller in the messages).
new_venv() {
  local tool="$1" dir="$2"
  shift 2
  if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    echo "$tool: installing python3 and python3-venv" >&2
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3 python3-venv >/dev/null
  fi
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/pip" install -q "$@"
}
