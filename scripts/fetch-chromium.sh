#!/usr/bin/env bash
# Headless Chromium and its WebDriver, for the directory page's browser test
# (tests/api/ui.rs). Installs Debian's `chromium` and `chromium-driver` once;
# prints nothing when they are already there.
set -euo pipefail

if command -v chromedriver >/dev/null 2>&1 \
  && { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }; then
  exit 0
fi
echo "fetch-chromium: installing chromium and chromium-driver" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
