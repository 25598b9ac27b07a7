#!/usr/bin/env bash
# RAID against its own members: one openarray daemon serves, from files
# on tmpfs each behind a `delay` device capped at a set speed (so the
# members' caps, not the memory, are what is measured),
#   LUN 0  one member alone ("member"), the reference of every figure
#   LUN 1  one member at half speed alone ("half member")
#   LUN 2  RAID0 over 4 members
#   LUN 3  RAID0 over 3 members and one at half speed
#   LUN 4  RAID1 over 2 members
#   LUN 5  RAID5 over 4 members and a hot spare
#   LUN 6  RAID6 over 5 members
# and runs on each: 1 MiB sequential reads and writes QD8 (qemu-img bench)
# and 4 KiB random reads QD32 (iscsi-perf) and 4 KiB writes QD32 (qemu-img
# bench, one per 260 KiB so that they land on every member). Then RAID5
# with one member failed (degraded reads), its rebuild onto the spare
# alone and under 4 KiB random reads, and the weakest link RAID0's status
# names. Every figure stands beside the member's own of the same run.
#
# Usage: bench/raid.sh
# Environment (all optional):
#   MEMBER_IOPS=4000  MEMBER_BW=80M   a member's caps
#   SECONDS_EACH=8    length of each random-read run
#   OA_PORT=3260      BENCH_OUT=docs/bench/raid.md
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MEMBER_IOPS=${MEMBER_IOPS:-4000}
MEMBER_BW=${MEMBER_BW:-80M}
SECONDS_EACH=${SECONDS_EACH:-8}
OA_PORT=${OA_PORT:-3260}
BENCH_OUT=${BENCH_OUT:-$ROOT/docs/bench/raid.md}
IQN=iqn.2026-11.org.openarray:raid-bench
MEMBER_SIZE=320M
SEQ_MIB=128
CLK_TCK=$(getconf CLK_TCK)

# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"
# shellcheck source=bench/raid_members.sh
. "$ROOT/bench/raid_members.sh"

WORK=""
OA_PID=""
trap cleanup_openarray EXIT
trap 'exit 130' INT TERM

start_openarray() {
    {
        member ref; member refhalf half
        for i in 0 1 2 3; do member "a$i"; done
        for i in 0 1 2; do member "b$i"; done; member b3 half
        for i in 0 1; do member "c$i"; done
        for i in 0 1 2 3 4 5; do member "d$i"; done
        for i in 0 1 2 3 4; do member "e$i"; done
        raid r0 0 "a0 a1 a2 a3"
        raid r0half 0 "b0 b1 b2 b3"
        raid r1 1 "c0 c1"
        raid r5 5 "d0 d1 d2 d3" "d4 d5" $'sync_speed_min = "4M"\nsync_speed_max = "200M"'
        raid r6 6 "e0 e1 e2 e3 e4"
        target_toml "$IQN" ref refhalf r0 r0half r1 r5 r6
    } >"$WORK/openarray.toml"
    serve_openarray
}

RESULTS=()
record() { RESULTS+=("$1|$2|$3|$4"); log "$1 on $2: $3 ($4 us CPU/IO)"; }
LUN_NAMES=("member" "half member" "RAID0 x4" "RAID0 x4, one at half speed" "RAID1 x2" "RAID5 x4" "RAID6 x5")

# qemu-img bench: workload LUN count depth size step(0: none) write(0/1); MB/s or IOPS.
qbench() {
    local workload=$1 lun=$2 count=$3 depth=$4 size=$5 step=$6 write=$7 out="$WORK/q.out" before after s
    local args=(-f raw -t none -c "$count" -d "$depth" -s "$size")
    [ "$step" = 0 ] || args+=(-S "$step")
    [ "$write" = 0 ] || args+=(-w --pattern 0x5a)
    before=$(cpu_ticks "$OA_PID")
    run_child timeout 600 qemu-img bench "${args[@]}" "$(url "$lun")" >"$out" 2>&1 ||
        { tail -3 "$out" >&2; record "$workload" "${LUN_NAMES[$lun]}" failed n/a; return; }
    after=$(cpu_ticks "$OA_PID")
    s=$(sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p' "$out")
    local bytes
    bytes=$(numfmt --from=iec "${size^^}")
    if [ "$bytes" -ge 65536 ]; then
        record "$workload" "${LUN_NAMES[$lun]}" "$(awk -v n="$count" -v b="$bytes" -v s="$s" 'BEGIN { printf "%d MB/s", n * b / 1e6 / s }')" "$(us_per_io $((after - before)) "$count")"
    else
        record "$workload" "${LUN_NAMES[$lun]}" "$(awk -v n="$count" -v s="$s" 'BEGIN { printf "%d IOPS", n / s }')" "$(us_per_io $((after - before)) "$count")"
    fi
}

perf_read() { # workload lun [column]
    local out="$WORK/p.out" iops before after
    before=$(cpu_ticks "$OA_PID")
    run_child timeout $((SECONDS_EACH + 20)) iscsi-perf -m 32 -b 8 -r -t "$SECONDS_EACH" "$(url "$2")" >"$out" 2>&1 || true
    after=$(cpu_ticks "$OA_PID")
    iops=$(tr '\r' '\n' <"$out" | sed -n 's/^iops average \([0-9]*\) .*/\1/p' | tail -1)
    record "$1" "${3:-${LUN_NAMES[$2]}}" "${iops:-failed} IOPS" "$(us_per_io $((after - before)) $((${iops:-0} * SECONDS_EACH)))"
}

figure() { # workload column -> the figure
    local r w c f u
    for r in "${RESULTS[@]}"; do
        IFS='|' read -r w c f u <<<"$r"
        if [ "$w" = "$1" ] && [ "$c" = "$2" ]; then echo "$f"; return; fi
    done
}
cpu() {
    local r w c f u
    for r in "${RESULTS[@]}"; do
        IFS='|' read -r w c f u <<<"$r"
        if [ "$w" = "$1" ] && [ "$c" = "$2" ]; then echo "$u"; return; fi
    done
}
num() { echo "${1%% *}"; }

main() {
    WORK=$(mktemp -d /dev/shm/openarray-raid-bench.XXXXXX)
    LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
    build_openarray
    start_openarray
    for r in r0 r0half r1 r5 r6; do wait_clean "$r"; done
    local lun
    for lun in 0 1 2 3 4 5 6; do
        qbench "1M sequential write QD8" "$lun" "$SEQ_MIB" 8 1M 0 1
        # Whole stripes: a multiple of the data width (RAID5 x4 and
        # RAID6 x5 both have 3 data chunks of 64K a row).
        if [ "$lun" = 5 ] || [ "$lun" = 6 ]; then
            qbench "full-stripe sequential write QD8" "$lun" $((SEQ_MIB * 4 / 3)) 8 768K 0 1
        elif [ "$lun" = 0 ]; then
            qbench "full-stripe sequential write QD8" "$lun" "$SEQ_MIB" 8 1M 0 1
        fi
        qbench "1M sequential read QD8" "$lun" "$SEQ_MIB" 8 1M 0 0
        perf_read "4K random read QD32" "$lun"
        qbench "4K write QD32" "$lun" 4000 32 4k 260k 1
    done
    local weakest
    weakest=$(oa raid status r0half | sed -n 's/^weakest link: //p')

    # RAID5: a rebuild onto a spare alone, another under 4K random reads,
    # then reads with a member lost and no spare left.
    local t0 t1 member_bytes rebuild_alone rebuild_loaded during
    member_bytes=$(oa raid status r5 --json | sed -n 's/.*"size_bytes": \([0-9]*\).*/\1/p' | head -1)
    member_bytes=$((member_bytes / 3))
    t0=$(date +%s.%N)
    oa raid fail r5 d1 >/dev/null
    wait_clean r5
    t1=$(date +%s.%N)
    rebuild_alone=$(awk -v a="$t0" -v b="$t1" -v m="$member_bytes" 'BEGIN { printf "%d", m / (b - a) / 1e6 }')
    iscsi-perf -m 32 -b 8 -r -t "$SECONDS_EACH" "$(url 5)" >"$WORK/during.out" 2>&1 &
    CHILDREN=$!
    sleep 1
    t0=$(date +%s.%N)
    oa raid fail r5 d2 >/dev/null
    wait_clean r5
    t1=$(date +%s.%N)
    wait "$CHILDREN" || true
    CHILDREN=""
    rebuild_loaded=$(awk -v a="$t0" -v b="$t1" -v m="$member_bytes" 'BEGIN { printf "%d", m / (b - a) / 1e6 }')
    during=$(tr '\r' '\n' <"$WORK/during.out" | sed -n 's/^iops average \([0-9]*\) .*/\1/p' | tail -1)
    oa raid fail r5 d3 >/dev/null
    qbench "1M sequential read QD8, degraded" 5 "$SEQ_MIB" 8 1M 0 0
    perf_read "4K random read QD32, degraded" 5
    echo "$rebuild_loaded|${during:-failed}" >"$WORK/rebuild"
    echo "$weakest" >"$WORK/weakest"
    report "$rebuild_alone"
}

report() {
    local rebuild_alone=$1 w m loaded during
    {
        echo "# RAID against its members"
        echo
        echo "\`bench/raid.sh\` on $(date -u +%Y-%m-%d), $(nproc) CPUs. Members are files on tmpfs behind"
        echo "\`delay\` devices capped at $MEMBER_IOPS IOPS and $MEMBER_BW/s (the half-speed one at half both);"
        echo "every array runs on members of its own, and \"member\" is one such member alone, measured in the same run."
        echo
        echo "| workload | member | RAID0 x4 | RAID0 x4, one half | half member | RAID1 x2 | RAID5 x4 | RAID6 x5 |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|"
        for w in "1M sequential write QD8" "1M sequential read QD8" "4K random read QD32" "4K write QD32"; do
            echo "| $w | $(figure "$w" member) | $(figure "$w" "RAID0 x4") | $(figure "$w" "RAID0 x4, one at half speed") | $(figure "$w" "half member") | $(figure "$w" "RAID1 x2") | $(figure "$w" "RAID5 x4") | $(figure "$w" "RAID6 x5") |"
        done
        echo
        echo "Against the member's own figure (ratio of the array's to the member's):"
        echo
        echo "| workload | RAID0 x4 / member (goal ≥ 3.6) | RAID0 x4 one half / half member (goal ≈ 4) | RAID1 / member | RAID5 / member | RAID6 / member |"
        echo "|---|---:|---:|---:|---:|---:|"
        for w in "1M sequential write QD8" "1M sequential read QD8" "4K random read QD32" "4K write QD32"; do
            m=$(num "$(figure "$w" member)")
            echo "| $w | $(ratio "$(num "$(figure "$w" "RAID0 x4")")" "$m") | $(ratio "$(num "$(figure "$w" "RAID0 x4, one at half speed")")" "$(num "$(figure "$w" "half member")")") | $(ratio "$(num "$(figure "$w" "RAID1 x2")")" "$m") | $(ratio "$(num "$(figure "$w" "RAID5 x4")")" "$m") | $(ratio "$(num "$(figure "$w" "RAID6 x5")")" "$m") |"
        done
        echo
        m=$(num "$(figure "full-stripe sequential write QD8" member)")
        echo "Full-stripe sequential writes QD8 (768K requests, 4 whole rows of 3 data chunks of 64K on both; the member in 1M):"
        echo "RAID5 x4 $(figure "full-stripe sequential write QD8" "RAID5 x4"), $(ratio "$(num "$(figure "full-stripe sequential write QD8" "RAID5 x4")")" "$m") x the member's $(figure "full-stripe sequential write QD8" member);"
        echo "RAID6 x5 $(figure "full-stripe sequential write QD8" "RAID6 x5"), $(ratio "$(num "$(figure "full-stripe sequential write QD8" "RAID6 x5")")" "$m") x (goal for both: 0.8 x 3 data members = 2.4)."
        echo
        echo "RAID5 x4 with one member lost: 1M sequential reads $(figure "1M sequential read QD8, degraded" "RAID5 x4") (whole: $(figure "1M sequential read QD8" "RAID5 x4")),"
        echo "4K random reads $(figure "4K random read QD32, degraded" "RAID5 x4") (whole: $(figure "4K random read QD32" "RAID5 x4"))."
        echo
        IFS='|' read -r loaded during <"$WORK/rebuild"
        echo "RAID5 rebuild onto a spare: $rebuild_alone MB/s of member data with no foreground I/O, $loaded MB/s under"
        echo "4K random reads QD32 (sync_speed_min 4M, max 200M; a member's cap: $MEMBER_BW/s). The reads ran at $during IOPS"
        echo "during that rebuild (the whole period of the run, partly after it), $(ratio "$during" "$(num "$(figure "4K random read QD32" "RAID5 x4")")") of the $(figure "4K random read QD32" "RAID5 x4") before it."
        echo
        echo "CPU of the daemon per I/O (µs): RAID5 4K write $(cpu "4K write QD32" "RAID5 x4"), RAID5 1M write $(cpu "1M sequential write QD8" "RAID5 x4"),"
        echo "RAID6 4K write $(cpu "4K write QD32" "RAID6 x5"), RAID6 1M write $(cpu "1M sequential write QD8" "RAID6 x5"); the member alone: 4K write $(cpu "4K write QD32" member), 1M write $(cpu "1M sequential write QD8" member)."
        echo
        echo "Load average at the start: $LOAD_BEFORE; at the end: $(cut -d' ' -f1-3 /proc/loadavg) (2 cores shared with other work)."
        echo
        echo "Weakest link named by \`openarray raid status\` for RAID0 with one half-speed member: $(cat "$WORK/weakest")"
    } >"$BENCH_OUT"
    log "wrote $BENCH_OUT"
}

main "$@"
