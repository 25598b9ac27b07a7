#!/usr/bin/env bash
# Installs what building needs beyond Rust (librbd's headers and libclang for
# the RBD bindings) and what the tests and benchmarks drive: real iSCSI
# clients (libiscsi tools, qemu-img with its iSCSI block driver), the tgt
# peer target for side-by-side benchmarks, fio, systemd-analyze for the
# unit file, and Chromium with its WebDriver for the web console's test.
# Idempotent: apt runs only when something is missing.
set -euo pipefail

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
updated=0
apt_install() {
  if [ "$updated" -eq 0 ]; then
    $SUDO apt-get update -qq
    updated=1
  fi
  $SUDO apt-get install -y -qq --no-install-recommends "$@"
}

# tool -> package that provides it
declare -A NEED=(
  [iscsi-test-cu]=libiscsi-bin
  [iscsi-ls]=libiscsi-bin
  [iscsi-perf]=libiscsi-bin
  [tgtd]=tgt
  [fio]=fio
  # crates/nbd's tests drive real NBD clients.
  [nbdinfo]=libnbd-bin
  [nbdcopy]=libnbd-bin
  [openssl]=openssl
  [ps]=procps
  [fallocate]=util-linux
  [python3]=python3
  # libFuzzer, which the fuzz targets link, is C++.
  [c++]=g++
  # tests/cli_scripting.rs verifies contrib/openarray.service; verify runs
  # man for its Documentation= pages.
  [systemd-analyze]=systemd
  [man]=man-db
  # tests/console.rs drives the web console in headless Chromium through
  # chromedriver (WebDriver).
  [chromium]=chromium
  [chromedriver]=chromium-driver
)
missing=()
for tool in "${!NEED[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${NEED[$tool]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
  echo "installing: ${pkgs[*]}"
  apt_install "${pkgs[@]}"
fi

# Building: the rbd crate generates its librbd bindings with bindgen, which
# needs librbd's headers and libclang (checked by file, since neither is a
# command). The Ceph daemons of the test cluster are installed by
# scripts/ceph-fixture.sh when it starts one.
build_missing=()
[ -e /usr/include/rbd/librbd.h ] || build_missing+=(librbd-dev)
# libclang-cpp (pulled in by other LLVM packages) is not libclang.
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null ||
  compgen -G '/usr/lib/*/libclang.so*' >/dev/null ||
  compgen -G '/usr/lib/*/libclang-[0-9]*.so*' >/dev/null || build_missing+=(libclang-dev)
if [ ${#build_missing[@]} -gt 0 ]; then
  echo "installing: ${build_missing[*]}"
  apt_install "${build_missing[@]}"
fi

# qemu-img opens iscsi:// only through the block-iscsi module of
# qemu-block-extra, which must come from the very same QEMU build as
# qemu-utils. When the installed qemu-utils has no matching module in the
# archives, both are installed at the archive's qemu-block-extra version.
installed_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true; }
utils_version=$(installed_version qemu-utils)
extra_version=$(installed_version qemu-block-extra)
if [ -z "$utils_version" ] || [ "$utils_version" != "$extra_version" ]; then
  if [ "$updated" -eq 0 ]; then $SUDO apt-get update -qq; updated=1; fi
  candidate=$(apt-cache policy qemu-block-extra | awk '/Candidate:/ {print $2}')
  if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
    echo "install-deps: no qemu-block-extra package available; qemu-img cannot open iscsi:// URLs" >&2
    exit 1
  fi
  echo "installing: qemu-utils and qemu-block-extra $candidate"
  apt_install --allow-downgrades "qemu-utils=$candidate" "qemu-block-extra=$candidate"
fi
