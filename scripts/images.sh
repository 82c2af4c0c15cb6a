#!/usr/bin/env bash
# `make images`: container images of Stasis itself, built with the real Docker engine and tagged
# with helm/stasis's appVersion V, as the chart deploys them:
#   stasis-agent:V            `stasis-agent`, with runc, CRIU 4.2+, iptables, skopeo and umoci
#   stasis:V                  the same image: it holds every command of this repository, and
#                             the chart runs it for all three of its pods
#   stasis-orchestrator:V     `stasis server`: API, scheduler, ledger and inference gateway
#   stasis-reference-model:V  `python3 -m orchestrator.reference_model`
# and stasis-python:V, not an image to run: the Python trees the three copy in.
#
# The Dockerfiles live in helm/images/<image>/: beside the chart that deploys the images and
# whose version tags them, not among the host scripts. Nothing is pulled from an image registry:
# everything starts FROM the Debian base rootfs scripts/host-setup.sh makes, imported as
# stasis-base:<digest>. Python wheels come from PyPI once and are kept in $cache/images/wheels;
# Docker's layer cache does the rest, so a second run with nothing changed rebuilds nothing.
#
# The engine is $DOCKER_HOST's, else the default socket's. If none answers, the script starts a
# dockerd of its own (not the test suite's: its own socket, data root and exec root) and stops it
# again on exit; its images stay in its data root for the next run.
#
# Usage: scripts/images.sh [--save FILE]   (FILE: a `docker save` archive of the four tags)
set -euo pipefail
shopt -s inherit_errexit

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${STASIS_CACHE:-/var/cache/stasis}
venv=${STASIS_VENV:-$repo/.venv}
criu_bin=/usr/local/sbin/criu
base_dir="$cache/images/base"
build="$cache/images/build"
wheel_cache="$cache/images/wheels"
engine_root=/var/lib/stasis-images-docker
engine_exec=/run/stasis-images-docker
engine_socket=/run/stasis-images-docker.sock

log() { printf '[images] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

save=""
while [ $# -gt 0 ]; do
  case "$1" in
    --save) [ $# -ge 2 ] || die "--save takes a file"; save=$2; shift 2 ;;
    *) die "unknown argument $1 (usage: scripts/images.sh [--save FILE])" ;;
  esac
done

# The legacy builder: it ships inside the engine, where BuildKit would need the buildx plugin.
export DOCKER_BUILDKIT=0

version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$repo/helm/stasis/Chart.yaml")
[ -n "$version" ] || die "no appVersion in helm/stasis/Chart.yaml"
package_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -1)
[ "$version" = "$package_version" ] \
  || die "the chart's appVersion $version is not pyproject.toml's version $package_version: the image would carry another Stasis than its tag says"

[ -f "$base_dir/rootfs.tar" ] && [ -f "$base_dir/digest" ] || die "no base rootfs in $base_dir; run make setup (scripts/host-setup.sh) first"
[ -x "$criu_bin" ] || die "no CRIU at $criu_bin; run make setup (scripts/host-setup.sh) first"
[ -x "$venv/bin/python" ] || die "no Python environment at $venv; run make setup (scripts/host-setup.sh) first"
criu_version=$("$criu_bin" --version | awk '/^Version:/{print $2}')
case "$criu_version" in
  4.[2-9]* | 4.[1-9][0-9]* | [5-9].*) ;;
  *) die "CRIU at $criu_bin is ${criu_version:-unknown}, the agent needs 4.2 or newer; run make setup" ;;
esac

# -- the engine -------------------------------------------------------------------------------

own_engine=""

answers() { docker -H "$1" version >/dev/null 2>&1; }

start_engine() {
  local url="unix://$engine_socket"
  if [ -n "${DOCKER_HOST:-}" ] && [ "$DOCKER_HOST" != "$url" ]; then
    answers "$DOCKER_HOST" || die "no Docker engine answers at DOCKER_HOST=$DOCKER_HOST"
    return 0
  fi
  if [ -z "${DOCKER_HOST:-}" ] && answers unix:///var/run/docker.sock; then
    export DOCKER_HOST=unix:///var/run/docker.sock
    return 0
  fi
  export DOCKER_HOST=$url
  answers "$url" && return 0
  [ "$(id -u)" = 0 ] || die "no Docker engine answers, and starting one needs root"
  log "starting a dockerd of its own on $engine_socket (data in $engine_root)"
  mkdir -p "$engine_root" "$engine_exec"
  # No bridge and no iptables rules: builds and containers use the host network or none, and
  # the host's firewall (which the suite and the agents program) stays untouched.
  dockerd --host "$url" --pidfile "$engine_exec.pid" \
    --data-root "$engine_root" --exec-root "$engine_exec" \
    --bridge none --iptables=false --ip-masq=false \
    --containerd-namespace stasis-images --containerd-plugins-namespace stasis-images-plugins \
    >"$engine_exec.log" 2>&1 &
  own_engine=$!
  local waited=0
  until answers "$url"; do
    kill -0 "$own_engine" 2>/dev/null || { tail -20 "$engine_exec.log" >&2; own_engine=""; die "dockerd exited"; }
    [ "$waited" -lt 600 ] || { tail -20 "$engine_exec.log" >&2; die "dockerd did not answer in 60 s"; }
    sleep 0.1
    waited=$((waited + 1))
  done
}

stop_engine() {
  [ -n "$own_engine" ] || return 0
  log "stopping its dockerd"
  kill -TERM "$own_engine" 2>/dev/null || true
  local waited=0
  while kill -0 "$own_engine" 2>/dev/null && [ "$waited" -lt 300 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  kill -KILL "$own_engine" 2>/dev/null || true
  wait "$own_engine" 2>/dev/null || true
  own_engine=""
  # What a killed engine may leave mounted (overlay layers, its netns files).
  awk -v a="$engine_root" -v b="$engine_exec" 'index($2, a) == 1 || index($2, b) == 1 {print $2}' /proc/self/mounts \
    | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
}

# -- the build context --------------------------------------------------------------------------

python_version() {
  docker run --rm --network none "$1" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])'
}

# Stasis's dependencies as wheels for the image's python3, at the versions .venv has (the pip
# constraints `make test` passed with), one directory per dependency list, constraints and Python
# version: a second run with the same ones finds them and asks PyPI nothing.
wheelhouse() {
  local py=$1 requirements key dir constraints="$repo/scripts/python-constraints.txt"
  requirements=$("$venv/bin/python" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' "$repo/pyproject.toml")
  key=$(printf '%s\ncp%s manylinux_2_36_x86_64\n' "$requirements" "$py" | cat - "$constraints" | sha256sum | cut -c1-16)
  dir="$wheel_cache/$key"
  if [ ! -f "$dir/.complete" ]; then
    log "downloading Stasis's dependencies as Python $py wheels from PyPI"
    rm -rf "$dir" && mkdir -p "$dir/wheels" "$dir/pip"
    printf '%s\n' "$requirements" >"$dir/wheels/requirements.txt"
    # Every manylinux tag the base's glibc (2.36) runs: older pips do not infer the older ones.
    local target=(--only-binary=:all: --implementation cp --python-version "$py" --abi "cp${py/./}") glibc
    for glibc in $(seq 36 -1 17); do target+=(--platform "manylinux_2_${glibc}_x86_64"); done
    target+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
    { "$venv/bin/python" -m pip download --disable-pip-version-check --cache-dir "$cache/pip" \
        "${target[@]}" -d "$dir/wheels" -r "$dir/wheels/requirements.txt" -c "$constraints" \
      && "$venv/bin/python" -m pip download --disable-pip-version-check --cache-dir "$cache/pip" \
        "${target[@]}" --no-deps -d "$dir/pip" pip; } >"$build/pip.log" 2>&1 \
      || { tail -20 "$build/pip.log" >&2; die "downloading wheels failed (log: $build/pip.log)"; }
    touch "$dir/.complete"
  fi
  echo "$dir"
}

# Stasis's wheel, from a copy of this checkout's packages (setuptools builds in the source tree).
# A fixed SOURCE_DATE_EPOCH makes it byte-identical while the sources are, so Docker's cache holds.
stasis_wheel() {
  local out=$1 src="$build/src"
  rm -rf "$src" && mkdir -p "$src"
  tar -C "$repo" --exclude=__pycache__ --exclude='*.pyc' -cf - \
    pyproject.toml README.md orchestrator sandbox_agent snapshots protos | tar -C "$src" -xf -
  SOURCE_DATE_EPOCH=315532800 "$venv/bin/python" -m pip wheel -q --disable-pip-version-check \
    --no-deps --no-build-isolation -w "$out" "$src" >"$build/wheel.log" 2>&1 \
    || { tail -20 "$build/wheel.log" >&2; die "building Stasis's wheel failed"; }
  rm -rf "$src"
}

# The Debian packages owning the shared libraries the criu binary links.
criu_packages() {
  local lib owner
  ldd "$criu_bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    # usrmerge: dpkg may know the file under /lib or under /usr/lib.
    owner=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "${lib#/usr}" 2>/dev/null || dpkg -S "/usr$lib" 2>/dev/null) \
      || die "no Debian package owns $lib, which criu links"
    echo "${owner%%:*}"
  done | sort -u | tr '\n' ' '
}

# One context directory per image: only what its Dockerfile copies goes to the engine.
stage() {
  local name=$1
  rm -rf "${build:?}/$name" && mkdir -p "$build/$name"
  cp "$repo/helm/images/$name/Dockerfile" "$build/$name/Dockerfile"
}

image_id() { docker image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }

build_image() {
  local name=$1 tag=$2 network=$3
  shift 3
  local before
  before=$(image_id "$tag")
  log "building $tag"
  docker build --force-rm --network "$network" "$@" -t "$tag" "$build/$name" \
    >"$build/$name.log" 2>&1 || { tail -30 "$build/$name.log" >&2; die "building $tag failed"; }
  [ "$(image_id "$tag")" = "$before" ] && log "  $tag unchanged"
  return 0
}

# -- main ---------------------------------------------------------------------------------------

mkdir -p "$build" "$wheel_cache"
exec 9>"$build/.lock"
flock 9
trap stop_engine EXIT
start_engine

digest=$(cut -d: -f2 <"$base_dir/digest")
base="stasis-base:${digest:0:16}"
if [ -z "$(image_id "$base")" ]; then
  log "importing the base rootfs ($base_dir/rootfs.tar) as $base"
  docker import "$base_dir/rootfs.tar" "$base" >/dev/null
fi

py=$(python_version "$base")
wheels=$(wheelhouse "$py")

stage python
cp -al "$wheels/wheels" "$build/python/wheels"
cp "$wheels"/pip/pip-*.whl "$build/python/pip.whl"
stasis_wheel "$build/python/stasis"
build_image python "stasis-python:$version" none --build-arg "BASE=$base"
args=(--build-arg "BASE=$base" --build-arg "VERSION=$version")

stage orchestrator
build_image orchestrator "stasis-orchestrator:$version" none "${args[@]}"

stage reference-model
build_image reference-model "stasis-reference-model:$version" none "${args[@]}"

stage agent
cp "$criu_bin" "$build/agent/criu"
mkdir -p "$build/agent/base"
ln "$base_dir/rootfs.tar" "$build/agent/base/rootfs.tar"
cp "$base_dir/digest" "$build/agent/base/digest"
criu_libraries=$(criu_packages)
build_image agent "stasis-agent:$version" host "${args[@]}" --build-arg "CRIU_PACKAGES=$criu_libraries"
docker tag "stasis-agent:$version" "stasis:$version"

deployed=("stasis:$version" "stasis-orchestrator:$version" "stasis-agent:$version" "stasis-reference-model:$version")
if [ -n "$save" ]; then
  log "saving ${deployed[*]} to $save"
  docker save -o "$save" "${deployed[@]}"
fi
for tag in "${deployed[@]}"; do
  log "ready: $tag $(docker image inspect --format '{{.Id}} {{.Size}}' "$tag" | awk '{printf "%s %.0f MB", substr($1, 1, 19), $2 / 1e6}')"
done
