#!/usr/bin/env bash
# RAID rebuild and replace speed against the members' own cap: one
# openarray daemon, members on tmpfs each behind a `delay` device capped
# at MEMBER_BW (so the cap, not the memory, is what limits), arrays filled
# with data first (a rebuild of zeros discards rather than writes):
#   RAID5 x4 + 2 spares: a member failed and rebuilt onto a spare; then
#                        `raid replace` of a member by the other spare
#   RAID1 x2 + 1 spare:  a member failed and rebuilt onto the spare
#   RAID10 x4 + 1 spare: the same
# Each figure is member bytes rebuilt (or copied) a second, from the
# command to the status showing the array clean (polled every 0.1 s),
# beside the member cap (the physical limit: every byte is read from one
# capped member and written to another).
#
# Usage: bench/raid_rebuild.sh
# Environment (all optional):
#   MEMBER_BW=80M  MEMBER_IOPS=4000  MEMBER_SIZE=320M
#   OA_PORT=3281   OA_BIN=path/to/openarray
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MEMBER_IOPS=${MEMBER_IOPS:-4000}
MEMBER_BW=${MEMBER_BW:-80M}
MEMBER_SIZE=${MEMBER_SIZE:-320M}
OA_PORT=${OA_PORT:-3281}
IQN=iqn.2026-11.org.openarray:raid-rebuild-bench

# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"
# shellcheck source=bench/raid_members.sh
. "$ROOT/bench/raid_members.sh"

WORK=""
OA_PID=""
trap cleanup_openarray EXIT
trap 'exit 130' INT TERM

size_of() { oa raid status "$1" --json | sed -n 's/.*"size_bytes": \([0-9]*\).*/\1/p' | head -1; }

# Times `oa raid ARGS...` on array $1 to clean; member bytes a second.
timed() { # ARRAY DATA_MEMBERS ARGS...
    local array=$1 data=$2 t0 t1 bytes
    shift 2
    bytes=$(( $(size_of "$array") / data ))
    t0=$(date +%s.%N)
    oa raid "$@" >/dev/null
    wait_clean "$array"
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v m="$bytes" 'BEGIN { printf "%d", m / (b - a) / 1e6 }'
}

main() {
    WORK=$(mktemp -d /dev/shm/openarray-rebuild-bench.XXXXXX)
    LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
    build_openarray
    {
        for i in 0 1 2 3 4 5; do member "d$i"; done
        for i in 0 1 2; do member "c$i"; done
        for i in 0 1 2 3 4; do member "t$i"; done
        raid r5 5 "d0 d1 d2 d3" "d4 d5" 'sync_speed_max = "1G"'
        raid r1 1 "c0 c1" "c2" 'sync_speed_max = "1G"'
        raid r10 10 "t0 t1 t2 t3" "t4" 'sync_speed_max = "1G"'
        target_toml "$IQN" r5 r1 r10
    } >"$WORK/openarray.toml"
    serve_openarray
    local lun name
    for name in r5 r1 r10; do wait_clean "$name"; done
    lun=0
    for name in r5 r1 r10; do
        log "filling $name"
        run_child timeout 900 qemu-img bench -f raw -t none -w --pattern 0x5a -d 8 -s 1M \
            -c $(( $(size_of "$name") >> 20 )) "$(url "$lun")" >/dev/null
        lun=$((lun + 1))
    done
    R5=$(timed r5 3 fail r5 d1); log "RAID5 rebuild: $R5 MB/s"
    R5REP=$(timed r5 3 replace r5 d2 d5); log "RAID5 replace: $R5REP MB/s"
    R1=$(timed r1 1 fail r1 c1); log "RAID1 rebuild: $R1 MB/s"
    R10=$(timed r10 2 fail r10 t1); log "RAID10 rebuild: $R10 MB/s"
    local cap
    cap=$(numfmt --from=iec "$MEMBER_BW" | awk '{ printf "%d", $1 / 1e6 }')
    echo "members capped at $MEMBER_BW/s ($cap MB/s) and $MEMBER_IOPS IOPS, $MEMBER_SIZE each, arrays full of data"
    echo "| operation | MB/s of member data | / member cap |"
    echo "|---|---:|---:|"
    echo "| RAID5 x4 rebuild onto a spare | $R5 | $(ratio "$R5" "$cap") |"
    echo "| RAID5 x4 replace (copy beside the member) | $R5REP | $(ratio "$R5REP" "$cap") |"
    echo "| RAID1 x2 rebuild onto a spare | $R1 | $(ratio "$R1" "$cap") |"
    echo "| RAID10 x4 rebuild onto a spare | $R10 | $(ratio "$R10" "$cap") |"
    echo "load average at the start: $LOAD_BEFORE; at the end: $(cut -d' ' -f1-3 /proc/loadavg) (2 cores shared with other work)"
}

main "$@"
