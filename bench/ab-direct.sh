#!/usr/bin/env bash
# A/B of openarray builds on an O_DIRECT file LUN: a 1 GiB file on the disk
# (not tmpfs, which has no O_DIRECT), served with `direct = true`. Each
# build serves in turn, round after round (every other round in the reverse
# order); each round ends with fio's io_uring engine on the same file at the
# same depths, the device's own figure. Per build, round and depth it
# prints IOPS, the median completion latency and the target's CPU time per
# read (utime+stime from /proc).
#
#   4K random read at DEPTHS      fio --ioengine=libiscsi (bench/fio-libiscsi.sh)
#   the same on the file          fio --ioengine=io_uring --direct=1
#
# Usage: bench/ab-direct.sh BINARY... (e.g. copies of target/release/openarray)
# Environment: ROUNDS=3, SECONDS_PER_RUN=5, DEPTHS="1 32", PORT=3291, DIR=/var/tmp
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"
ROUNDS=${ROUNDS:-3}
SECS=${SECONDS_PER_RUN:-5}
read -r -a DEPTHS <<<"${DEPTHS:-1 32}"
PORT=${PORT:-3291}
CLK_TCK=$(getconf CLK_TCK)
IQN=iqn.2024-01.org.openarray:abd
LUN="iscsi\\://127.0.0.1\\:$PORT/${IQN//:/\\:}/0"
ab_workdir "${DIR:-/var/tmp}" abd
FIO=$(bash "$ROOT/bench/fio-libiscsi.sh")

head -c 1G /dev/urandom >"$WORK/lun.img"
# Written back now, not during the first build's reads.
sync "$WORK/lun.img"
one_lun_config "$WORK/abd.toml" "$PORT" "$IQN" "$WORK/lun.img" "direct = true"

# fio's JSON -> "IOPS median_us total_ios"
summary() {
    python3 -c '
import json, sys
t = sys.stdin.read()
r = json.loads(t[t.index("{"):])["jobs"][0]["read"]
print(int(r["iops"]), round(r["clat_ns"]["percentile"]["50.000000"] / 1000), r["total_ios"])'
}

# A client that outlives its target retries forever; the timeout ends it.
fio_run() { # depth, then fio's target arguments
    local depth=$1
    shift
    timeout -s KILL $((SECS + 20)) "$@" --name=r --rw=randread --bs=4k --iodepth="$depth" \
        --runtime="$SECS" --time_based --output-format=json 2>/dev/null | summary
}

one() {
    local bin=$1 depth c0 c1
    serve_build "$bin" "$WORK/abd.toml" "$PORT"
    for depth in "${DEPTHS[@]}"; do
        c0=$(cpu_ticks "$PID")
        set -- $(fio_run "$depth" "$FIO" --ioengine=libiscsi --filename="$LUN" --size=1G)
        c1=$(cpu_ticks "$PID")
        echo "  QD$depth: $1 IOPS, median $2 us, $(us_per_io $((c1 - c0)) "$3") us CPU/IO"
    done
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
}

BUILDS=("$@")
for round in $(seq "$ROUNDS"); do
    mapfile -t order < <(builds_in_round "$round" "${BUILDS[@]}")
    for bin in "${order[@]}"; do
        echo "round $round, $bin (load $(cut -d' ' -f1 /proc/loadavg))"
        one "$bin"
    done
    for depth in "${DEPTHS[@]}"; do
        set -- $(fio_run "$depth" fio --ioengine=io_uring --direct=1 --filename="$WORK/lun.img")
        echo "round $round, fio io_uring on the file QD$depth: $1 IOPS, median $2 us"
    done
done
