#!/usr/bin/env bash
# Idempotent host set-up for Stasis: Debian packages, CRIU 4.2.1 from source,
# the built-in base sandbox image and the Python environment.
# A second run only checks what is there and takes seconds.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${STASIS_CACHE:-/var/cache/stasis}
criu_version=4.2.1
criu_sha256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
criu_rundir=/run/criu
# CRIU is built without what it only links for features Stasis does not use: GnuTLS (a TLS page
# server) and libnftables (nftables network locking). A CRIU process then starts in 1.3 ms, where
# loading them took 2.8 ms, and every dump starts one, every lazy restore two.
criu_without="gnutls libnftables"
base_suite=bookworm

log() { printf '[host-setup] %s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }
mkdir -p "$cache"

packages=(
  runc iptables iproute2 docker.io debootstrap tar xz-utils zstd procps curl openssl
  skopeo umoci docker-registry apache2-utils
  build-essential pkg-config dpkg-dev patch
  libprotobuf-dev libprotobuf-c-dev libnl-3-dev libnet1-dev libcap-dev libbsd-dev
  libgnutls28-dev libnftables-dev libaio-dev
  protobuf-c-compiler protobuf-compiler python3-protobuf python3-venv
  postgresql-15
)

install_packages() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install_criu() {
  # The build is named by the version, its options and the patches applied to it (scripts/criu-patches).
  local build_id stamp="$cache/criu-build.id"
  build_id="${criu_version} rundir=${criu_rundir} without=${criu_without// /,} $(cat "$repo"/scripts/criu-patches/*.patch | sha256sum | cut -c1-16)"
  if command -v criu >/dev/null && criu --version 2>/dev/null | grep -q "Version: ${criu_version}" \
    && [ "$(cat "$stamp" 2>/dev/null)" = "$build_id" ]; then
    return 0
  fi
  log "building CRIU ${criu_version} from Debian's source package, with $(ls "$repo"/scripts/criu-patches | wc -l) patch(es)"
  # Only a deb-src entry: newer binary criu packages need a newer glibc.
  local src=/etc/apt/sources.list.d/stasis-criu-src.sources
  if [ ! -f "$src" ]; then
    cat >"$src" <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: sid forky
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt-get update -qq
  fi
  local work="$cache/criu-src"
  local tarball="$work/criu_${criu_version}.orig.tar.xz"
  mkdir -p "$work"
  if ! echo "${criu_sha256}  ${tarball}" | sha256sum -c --status 2>/dev/null; then
    # The .debian.tar.xz may 404 while the orig tarball arrives: trust the checksum, not the exit code.
    (cd "$work" && apt-get source --download-only "criu=${criu_version}-1" >/dev/null 2>&1 || true)
    echo "${criu_sha256}  ${tarball}" | sha256sum -c --status || { log "CRIU source checksum mismatch or download failed"; exit 1; }
  fi
  rm -rf "$work/build" && mkdir -p "$work/build"
  tar -xJf "$tarball" -C "$work/build" --strip-components=1
  local patch
  for patch in "$repo"/scripts/criu-patches/*.patch; do
    patch -d "$work/build" -p1 --forward --quiet <"$patch" || { log "CRIU patch $(basename "$patch") does not apply"; exit 1; }
  done
  # RUNDIR: where CRIU caches what it probed of the kernel, kept only on a tmpfs, which the node
  # agent mounts there (a dump or restore that probes again costs about 40 ms).
  # CRIU's build links each library pkg-config finds: this one finds none of $criu_without.
  local pkg_config="$work/pkg-config-without"
  printf '#!/bin/sh\nfor arg in "$@"; do case "$arg" in %s) exit 1 ;; esac; done\nexec pkg-config "$@"\n' \
    "${criu_without// /|}" >"$pkg_config"
  chmod +x "$pkg_config"
  make -C "$work/build" -j"$(nproc)" criu RUNDIR="$criu_rundir" PKG_CONFIG="$pkg_config" >"$work/build.log" 2>&1 \
    || { tail -30 "$work/build.log"; exit 1; }
  install -m 0755 "$work/build/criu/criu" /usr/local/sbin/criu
  hash -r
  criu --version | grep -q "Version: ${criu_version}"
  echo "$build_id" >"$stamp"
}

manual_postgres_cluster() {
  # The suite starts a PostgreSQL server of its own (tests/postgres.py). The `main` cluster
  # Debian's package creates would only hold port 5432 and memory, so it starts only by hand.
  local conf=/etc/postgresql/15/main/start.conf
  [ -f "$conf" ] && ! grep -qx manual "$conf" || return 0
  log "PostgreSQL's main cluster: stopped, and started only by hand from now on"
  echo manual >"$conf"
  pg_ctlcluster 15 main stop >/dev/null 2>&1 || true
}

check_criu() {
  local stamp="$cache/criu-check.ok"
  [ -f "$stamp" ] && [ "$stamp" -nt /usr/local/sbin/criu ] && return 0
  log "criu check"
  criu check >/dev/null
  touch "$stamp"
}

configure_runc_criu() {
  # runc passes this file to CRIU: TCP connections come back closed on restore.
  mkdir -p /etc/criu
  grep -qx 'tcp-close' /etc/criu/runc.conf 2>/dev/null || echo 'tcp-close' >>/etc/criu/runc.conf
}

build_base_image() {
  local out="$cache/images/base"
  if [ -f "$out/rootfs.tar" ] && [ -f "$out/digest" ] && [ ! -f "$out/no-devices" ]; then
    # Made before device nodes were left out: drop them (runc gives every sandbox its own /dev).
    tar --delete --wildcards -f "$out/rootfs.tar" './dev/?*' && touch "$out/no-devices"
    sha256sum "$out/rootfs.tar" | awk '{print "sha256:" $1}' >"$out/digest"
  fi
  [ -f "$out/rootfs.tar" ] && [ -f "$out/digest" ] && return 0
  log "building the base sandbox image (debootstrap ${base_suite} minbase + python3)"
  local tmp="$cache/images/base.tmp"
  rm -rf "$tmp" && mkdir -p "$tmp/rootfs"
  debootstrap --variant=minbase --include=python3,procps,iproute2 "$base_suite" "$tmp/rootfs" http://deb.debian.org/debian >"$tmp/debootstrap.log" 2>&1 \
    || { tail -30 "$tmp/debootstrap.log"; exit 1; }
  rm -rf "$tmp/rootfs/var/cache/apt/archives/"*.deb "$tmp/rootfs/var/lib/apt/lists/"*
  # A reproducible tarball: sorted names, fixed mtimes for the digest to be stable.
  # No device nodes: runc gives every sandbox its own /dev, and images may not carry them.
  rm -rf "$tmp/rootfs/dev/"*
  tar --sort=name --numeric-owner --xattrs --xattrs-include='*' -C "$tmp/rootfs" -cf "$tmp/rootfs.tar" .
  touch "$tmp/no-devices"
  sha256sum "$tmp/rootfs.tar" | awk '{print "sha256:" $1}' >"$tmp/digest"
  rm -rf "$tmp/rootfs" "$out"
  mv "$tmp" "$out"
}

python_env() {
  local venv="$repo/.venv"
  local stamp="$venv/.installed"
  local constraints="$repo/scripts/python-constraints.txt"
  if [ -f "$stamp" ] && [ "$stamp" -nt "$repo/pyproject.toml" ] && [ "$stamp" -nt "$constraints" ]; then
    return 0
  fi
  log "installing the Python environment in .venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q -c "$constraints" -e "$repo[dev]" >"$venv/pip.log" 2>&1 \
    || { tail -30 "$venv/pip.log"; exit 1; }
  touch "$stamp"
}

install_packages
manual_postgres_cluster
install_criu
# Harness binaries from the npm registry, pinned by version and checked against the registry's
# sha512 integrity, unpacked once into the cache. Test images are the base image plus these.
harnesses=(
  "claude-code 2.1.328 https://registry.npmjs.org/@anthropic-ai/claude-code-linux-x64/-/claude-code-linux-x64-2.1.328.tgz sha512-KuzL+dBHgDCFTHJxwW+xuBJdVKfBsesGx2BBcTOG9sYDGoAD7b1hUV8rsTS4xjoJsB2SmeGraGjBiFuhrYuC9w=="
  "codex 0.169.0 https://registry.npmjs.org/@openai/codex/-/codex-0.169.0-linux-x64.tgz sha512-o05NyAOCDygSPRo1yinzxvkRSdmsZyBD9E7mbpmjRanSfM8lypqWtQgEo4XfNkwhuCR2aFu8mlGOsQGFXVbVww=="
)

install_harnesses() {
  local entry name version url integrity dir tgz
  mkdir -p "$cache/harnesses"
  for entry in "${harnesses[@]}"; do
    read -r name version url integrity <<<"$entry"
    dir="$cache/harnesses/$name-$version"
    [ -f "$dir/.integrity" ] && [ "$(cat "$dir/.integrity")" = "$integrity" ] && continue
    log "fetching harness $name $version from the npm registry"
    tgz="$cache/harnesses/$name-$version.tgz.part"
    curl -fsSL --retry 3 -o "$tgz" "$url" || { log "download of $name $version failed"; exit 1; }
    if [ "sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)" != "$integrity" ]; then
      rm -f "$tgz"; log "$name $version does not match its pinned sha512"; exit 1
    fi
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    tar -xzf "$tgz" -C "$dir.tmp" --strip-components=1 && rm -f "$tgz"
    echo "$integrity" >"$dir.tmp/.integrity"
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
  done
}

check_criu
configure_runc_criu
build_base_image
install_harnesses
python_env
"$repo/scripts/k8s-tools.sh"
log "ready: criu $(criu --version | awk '/Version/{print $2}'), runc $(runc --version | awk 'NR==1{print $3}'), base image $(cat "$cache/images/base/digest"), harnesses $(cd "$cache/harnesses" && ls -d */ | tr -d / | tr '\n' ' ')"
