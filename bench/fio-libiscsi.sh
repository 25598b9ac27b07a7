#!/usr/bin/env bash
# Builds fio with its libiscsi engine and prints the binary's path.
#
# Debian's fio package is built without libiscsi, so fio could only reach a
# target through a bridge (qemu-nbd). This builds the same fio release from
# Debian's own source (checked against the archive's SHA-256) with
# `--enable-libiscsi` and `--enable-libnbd`, once: the result is kept in
# target/bench-tools/ and later calls only print its path. With both
# engines in one binary, the matrix drives a target's iSCSI LUN and its
# NBD export with the same fio. Needs network access to the Debian archive
# on the first call; installs gcc, make, libiscsi-dev and libnbd-dev.
#
# Usage: bench/fio-libiscsi.sh     (progress on stderr, the path on stdout)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=3.33
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TARBALL=fio_$VERSION.orig.tar.gz
OUT=$ROOT/target/bench-tools/fio-$VERSION-libiscsi
BIN=$OUT/fio

# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"

has_engine() { "$1" --enghelp 2>/dev/null | grep -qx "[[:space:]]*$2"; }
has_engines() { has_engine "$1" libiscsi && has_engine "$1" nbd; }

if [ -x "$BIN" ] && has_engines "$BIN"; then
    echo "$BIN"
    exit 0
fi

need=()
for pkg in libiscsi-dev libnbd-dev gcc make zlib1g-dev curl xz-utils; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] || apt_install "${need[@]}"

BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
cd "$BUILD"

# The archive's source index names the tarball's SHA-256.
log "fetching the source index of $SUITE"
curl -fsS --retry 3 -o Sources.xz "$MIRROR/dists/$SUITE/main/source/Sources.xz"
xz -d Sources.xz
sum=$(awk -v f="$TARBALL" '
    /^Package: / { pkg = $2 }
    /^Checksums-Sha256:/ { in_sums = (pkg == "fio"); next }
    /^[^ ]/ { in_sums = 0 }
    in_sums && $3 == f && !found { print $1; found = 1 }' Sources)
[ -n "$sum" ] || die "no $TARBALL in $SUITE's source index"

log "fetching $TARBALL"
curl -fsS --retry 3 -o "$TARBALL" "$MIRROR/pool/main/f/fio/$TARBALL"
echo "$sum  $TARBALL" | sha256sum -c --quiet - >&2

tar xzf "$TARBALL"
cd "fio-$VERSION"
log "building fio $VERSION with the libiscsi and nbd engines"
./configure --enable-libiscsi --enable-libnbd >configure.log 2>&1 || { cat configure.log >&2; exit 1; }
grep -q '^iscsi engine *yes' configure.log || die "configure found no libiscsi"
grep -q '^NBD engine *yes' configure.log || die "configure found no libnbd"
make -j"$(nproc)" fio >make.log 2>&1 || { tail -20 make.log >&2; exit 1; }
has_engines ./fio || die "the built fio lacks the libiscsi or the nbd engine"

mkdir -p "$OUT"
install -m 0755 fio "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
log "built $BIN"
echo "$BIN"
