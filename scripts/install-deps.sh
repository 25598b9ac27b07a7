#!/usr/bin/env bash
# Installs the Debian packages the test suite and benchmarks drive: real
# iSCSI clients (libiscsi tools, qemu-img), the tgt peer target for
# side-by-side benchmarks, and fio. Idempotent: does nothing when every
# tool is already present.
set -euo pipefail

# tool -> package that provides it
declare -A NEED=(
  [iscsi-test-cu]=libiscsi-bin
  [iscsi-ls]=libiscsi-bin
  [iscsi-perf]=libiscsi-bin
  [qemu-img]=qemu-utils
  [tgtd]=tgt
  [fio]=fio
  [ps]=procps
)

missing=()
for tool in "${!NEED[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${NEED[$tool]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

# de-duplicate package names
mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
echo "installing: ${pkgs[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
