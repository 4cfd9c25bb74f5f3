#!/usr/bin/env bash
# Prometheus' promtool, for the test of the Helm chart's alert rules
# (tests/api/alerts.rs). Takes promtool out of Debian's `prometheus`
# package into ~/.cache/agentry/promtool without installing the package,
# which would also set up (and under systemd start) a Prometheus server.
# Prints the path; does nothing more when it is already there.
set -euo pipefail

dir="${XDG_CACHE_HOME:-$HOME/.cache}/agentry/promtool"
if [ -x "$dir/promtool" ]; then
  echo "$dir/promtool"
  exit 0
fi
echo "fetch-promtool: taking promtool from Debian's prometheus package" >&2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get download -qq prometheus >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  apt-get download -qq prometheus >/dev/null
fi
dpkg-deb -x prometheus_*.deb root
mkdir -p "$dir"
install -m 0755 root/usr/bin/promtool "$dir/promtool.new"
mv "$dir/promtool.new" "$dir/promtool"
"$dir/promtool" --version >/dev/null
echo "$dir/promtool"
