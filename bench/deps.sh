#!/usr/bin/env bash
# Install, only when missing, the real clients and the reference target that the
# benchmark and the real-client integration tests use. Idempotent; apt-get only.
#
# qemu-img speaks iscsi:// only through the block-iscsi module of
# qemu-block-extra, which must come from the very same QEMU build as qemu-utils.
# When the installed qemu-utils has no matching qemu-block-extra in the
# configured archives, both are installed at the archive's qemu-block-extra
# version (a downgrade of qemu-utils if a newer one was installed by hand).
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
updated=0
apt_install() {
    if [ "$updated" -eq 0 ]; then
        $SUDO apt-get update -qq
        updated=1
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@"
}

missing=()
command -v iscsi-perf >/dev/null || missing+=(libiscsi-bin)
command -v tgtd >/dev/null || missing+=(tgt)
command -v ps >/dev/null || missing+=(procps)
command -v fallocate >/dev/null || missing+=(util-linux)
if [ "${#missing[@]}" -gt 0 ]; then
    apt_install "${missing[@]}"
fi

installed_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true; }

utils_version=$(installed_version qemu-utils)
extra_version=$(installed_version qemu-block-extra)
if [ -z "$utils_version" ] || [ "$utils_version" != "$extra_version" ]; then
    if [ "$updated" -eq 0 ]; then $SUDO apt-get update -qq; updated=1; fi
    candidate=$(apt-cache policy qemu-block-extra | awk '/Candidate:/ {print $2}')
    if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
        echo "deps: no qemu-block-extra package available; qemu-img cannot open iscsi:// URLs" >&2
        exit 1
    fi
    apt_install --allow-downgrades "qemu-utils=$candidate" "qemu-block-extra=$candidate"
fi
