#!/usr/bin/env bash
# The cost of thin provisioning: one openarray daemon serves, on the same
# filesystem (tmpfs, so the backing store is not what is measured),
#   LUN 0: a 1 GiB raw file (file device), and
#   LUN 1: a 1 GiB thin volume of a pool on one file,
# and the same real clients run against both, 32 I/Os in flight:
#   - allocating write: 4 KiB writes, one per 64 KiB allocation unit, on a
#     volume that holds nothing (qemu-img bench -w -s 4k -S 64k); each write
#     allocates a unit, zeroes it (a hole punched in the pool file) and
#     writes its 4 KiB. On the raw file the same writes land in place.
#   - overwrite: 4 KiB sequential writes over the whole LUN once every unit
#     is allocated (qemu-img bench -w -s 4k), in place on both.
#   - random read: iscsi-perf -m 32 -b 8 -r (4 KiB at random LBAs) of the
#     fully written LUNs.
#   - write after a snapshot: a snapshot of the fully written volume, then
#     4 KiB writes one per unit as above; each copies its unit (copy-on-
#     write), the raw file's land in place. The snapshot is deleted after.
#     The same pass runs once unmeasured first, its snapshot deleted, so
#     that the measured copies land in memory freed moments before: on a
#     virtual machine that reports free memory to its host, the first
#     touch of memory freed long ago costs a host page fault per page,
#     which made these copies several times slower.
#   - reads beside the copies: iscsi-perf's random reads of a second thin
#     volume (LUN 2, fully written), first alone, then while the first
#     volume's writes after a snapshot run pass after pass, to show how
#     much the copies hold up other I/O of the pool.
# Between rounds the thin volume is emptied again with a discard of the
# whole LUN (UNMAP), so every round's allocating write allocates.
#
# Usage: bench/thin.sh
# Environment (all optional):
#   ROUNDS=3             rounds; the best of each workload is reported
#   READ_SECONDS=10      length of each read run
#   OA_PORT=3260         portal on 127.0.0.1
#   BENCH_OUT=docs/bench/thin.md
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-3}
READ_SECONDS=${READ_SECONDS:-10}
OA_PORT=${OA_PORT:-3260}
BENCH_OUT=${BENCH_OUT:-$ROOT/docs/bench/thin.md}
IQN=iqn.2026-11.org.openarray:thin-bench
LUN_BYTES=$((1 << 30))
UNIT_BYTES=$((64 << 10))
ALLOC_COUNT=$((LUN_BYTES / UNIT_BYTES))
OVERWRITE_COUNT=$((LUN_BYTES / 4096))
CLK_TCK=$(getconf CLK_TCK)

# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"

WORK=""
OA_PID=""

trap cleanup_openarray EXIT
trap 'exit 130' INT TERM

start_openarray() {
    fallocate -l "$LUN_BYTES" "$WORK/raw.img" 2>/dev/null ||
        dd if=/dev/zero of="$WORK/raw.img" bs=1M count=1024 status=none
    {
        printf '[[pool]]\nname = "bench"\ndevices = ["%s"]\ndevice_size = "3300M"\nunit_size = "64K"\n\n' \
            "$WORK/pool.img"
        file_device_toml raw "$WORK/raw.img" "write_cache = true"
        printf '[[device]]\nname = "thin"\nkind = "volume"\npool = "bench"\nsize = "1G"\n\n'
        printf '[[device]]\nname = "other"\nkind = "volume"\npool = "bench"\nsize = "1G"\n\n'
        target_toml "$IQN" raw thin other
    } >"$WORK/openarray.toml"
    serve_openarray
    log "openarray pid $OA_PID on 127.0.0.1:$OA_PORT"
}

url() { echo "iscsi://127.0.0.1:$OA_PORT/$IQN/$1"; }

# Results, one line each: workload|lun|iops|us_per_io
RESULTS=()
FAILED=0
record() { RESULTS+=("$1|$2|$3|$4"); log "$1 on $2: $3 IOPS, $4 us/IO"; }

name_of() {
    case $1 in 0) echo "raw file" ;; 1) echo "thin volume" ;; *) echo "second thin volume" ;; esac
}

# qemu-img bench: workload name, LUN, count, step (0 = the buffer size).
measure_write() {
    local workload=$1 lun=$2 count=$3 step=$4 out="$WORK/write.out" before after seconds iops
    local args=(-f raw -w -t none -c "$count" -d 32 -s 4k --pattern 0x5a)
    if [ "$step" != 0 ]; then args+=(-S "$step"); fi
    before=$(cpu_ticks "$OA_PID")
    if ! run_child timeout 300 qemu-img bench "${args[@]}" "$(url "$lun")" >"$out" 2>&1; then
        log "qemu-img bench ($workload, LUN $lun) failed:"; tail -5 "$out" >&2
        record "$workload" "$(name_of "$lun")" failed n/a; FAILED=1; return
    fi
    after=$(cpu_ticks "$OA_PID")
    seconds=$(sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p' "$out")
    iops=$(awk -v n="$count" -v s="$seconds" 'BEGIN { if (s > 0) printf "%d", n / s; else print "failed" }')
    record "$workload" "$(name_of "$lun")" "$iops" "$(us_per_io $((after - before)) "$count")"
}

measure_read() { # lun [workload]
    local lun=$1 workload=${2:-4K random read QD32} out="$WORK/read.out" before after iops
    before=$(cpu_ticks "$OA_PID")
    if ! run_child timeout $((READ_SECONDS + 20)) iscsi-perf -m 32 -b 8 -r -t "$READ_SECONDS" "$(url "$lun")" >"$out" 2>&1; then
        log "iscsi-perf (LUN $lun) failed:"; tr '\r' '\n' <"$out" | tail -5 >&2
        record "$workload" "$(name_of "$lun")" failed n/a; FAILED=1; return
    fi
    after=$(cpu_ticks "$OA_PID")
    iops=$(tr '\r' '\n' <"$out" | sed -n 's/^iops average \([0-9]*\) .*/\1/p' | tail -1)
    [ -n "$iops" ] || iops=failed
    record "$workload" "$(name_of "$lun")" "$iops" "$(us_per_io $((after - before)) $((${iops//failed/0} * READ_SECONDS)))"
}

# Writes every byte of a LUN (1 MiB sequential writes): allocates the thin
# volume fully before the overwrite and read runs.
fill() {
    run_child qemu-img bench -f raw -w -t none -c 1024 -d 16 -s 1M --pattern 0x33 "$(url "$1")" >/dev/null
}

# Discards the whole thin volume (UNMAP), then SYNCHRONIZE CACHE commits it.
empty_thin() {
    run_child qemu-io -f raw -c "discard 0 1G" -c "flush" "$(url 1)" >/dev/null
}

# SYNCHRONIZE CACHE on the thin volume: commits its new mappings.
flush_thin() {
    run_child qemu-io -f raw -c flush "$(url 1)" >/dev/null
}

volume() {
    "$OA_BIN" volume "$@" --socket "$WORK/admin.sock" --pool bench >/dev/null
}

# One copy-on-write pass over the thin volume; qemu-img's report on stdout.
copy_on_write_pass() {
    volume snapshot thin "$1"
    run_child qemu-img bench -f raw -w -t none -c "$ALLOC_COUNT" -d 32 -s 4k -S 64k -o 8192 "$(url 1)"
    flush_thin
    volume delete "$1"
}

# The second volume's reads while copy-on-write passes run back to back on
# the first; records the reads, and the writes of the passes (their own
# run times summed, so the snapshots and flushes between them not counted).
measure_reads_beside_copies() {
    local passes="$WORK/passes" n=0 seconds
    : >"$passes"
    rm -f "$WORK/stop"
    (
        while [ ! -e "$WORK/stop" ]; do
            copy_on_write_pass "beside-$n" >>"$passes"
            n=$((n + 1))
        done
    ) &
    local loop=$!
    CHILDREN=$loop
    sleep 1
    measure_read 2 "4K random read QD32 beside copies"
    touch "$WORK/stop"
    wait "$loop"
    CHILDREN=""
    seconds=$(sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p' "$passes" | awk '{ s += $1 } END { print s + 0 }')
    n=$(grep -c '^Run completed' "$passes" || true)
    record "4K write after a snapshot QD32 beside reads" "thin volume" \
        "$(awk -v n="$n" -v c="$ALLOC_COUNT" -v s="$seconds" 'BEGIN { if (s > 0) printf "%d", n * c / s; else print "failed" }')" n/a
}

pool_used() {
    "$OA_BIN" pool show --socket "$WORK/admin.sock" bench | sed -n 's/.* used \([0-9]*\) .*/\1/p'
}

WORKLOADS=("4K allocating write QD32" "4K overwrite QD32" "4K random read QD32" "4K write after a snapshot QD32")

report_table() {
    local w raw thin overhead
    echo "| workload | raw file IOPS | thin volume IOPS | thin/raw | thin overhead | CPU µs/IO raw | CPU µs/IO thin | IOPS of every round (raw; thin) |"
    echo "|---|---:|---:|---:|---:|---:|---:|---|"
    for w in "${WORKLOADS[@]}"; do
        raw=$(best_of "$w" "raw file")
        thin=$(best_of "$w" "thin volume")
        overhead=$(awk -v a="${thin%%|*}" -v b="${raw%%|*}" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.1f%%", (b / a - 1) * 100; else print "n/a" }')
        echo "| $w | ${raw%%|*} | ${thin%%|*} | $(ratio "${thin%%|*}" "${raw%%|*}") | $overhead | ${raw#*|} | ${thin#*|} | $(all_of "$w" "raw file"); $(all_of "$w" "thin volume") |"
    done
}

report_beside() {
    local alone beside writes
    alone=$(best_of "4K random read QD32 alone" "second thin volume")
    beside=$(best_of "4K random read QD32 beside copies" "second thin volume")
    writes=$(best_of "4K write after a snapshot QD32 beside reads" "thin volume")
    echo "| second volume's 4K random reads QD32 | IOPS | CPU µs/IO | IOPS of every round |"
    echo "|---|---:|---:|---|"
    echo "| alone | ${alone%%|*} | ${alone#*|} | $(all_of "4K random read QD32 alone" "second thin volume") |"
    echo "| while the first volume's writes copy units | ${beside%%|*} | ${beside#*|} | $(all_of "4K random read QD32 beside copies" "second thin volume") |"
    echo
    echo "Reads beside copies / reads alone: $(ratio "${beside%%|*}" "${alone%%|*}"). The copying writes"
    echo "meanwhile: ${writes%%|*} IOPS (best round; every round: $(all_of "4K write after a snapshot QD32 beside reads" "thin volume"))."
}

write_report() {
    local commit
    commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    mkdir -p "$(dirname "$BENCH_OUT")"
    {
        echo "# Thin volume vs raw file"
        echo
        echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') at commit $commit with:"
        echo
        echo '```'
        echo "ROUNDS=$ROUNDS READ_SECONDS=$READ_SECONDS bench/thin.sh"
        echo '```'
        echo
        echo "- CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), nproc $(nproc)"
        echo "- load average before the run: $LOAD_BEFORE (the machine is shared; the best round is taken)"
        echo "- $(iscsi-perf 2>&1 | grep -m1 -o 'iscsi-perf version [0-9.]*'), $(qemu-img --version | head -1)"
        echo
        report_table
        echo
        report_beside
        echo
        echo "Thin overhead = raw IOPS / thin IOPS - 1 (time per I/O added by the volume)."
        echo "Pool space after the allocating writes of the last round: $ALLOC_USED bytes"
        echo "($ALLOC_COUNT writes of 4 KiB, one 64 KiB unit each); the pool file then held"
        echo "$ALLOC_STORED bytes of tmpfs (its superblock and each unit's written 4 KiB)."
        echo
        echo "Setup: one daemon, every LUN 1 GiB with 512-byte blocks on tmpfs (/dev/shm):"
        echo "LUN 0 a file device with write_cache = true, LUN 1 a thin volume of a pool"
        echo "on one sparse file with 64 KiB units. Allocating write: \`qemu-img bench -f raw -w -t none"
        echo "-c $ALLOC_COUNT -d 32 -s 4k -S 64k\` on the emptied volume. Overwrite: \`qemu-img bench -f raw"
        echo "-w -t none -c $OVERWRITE_COUNT -d 32 -s 4k\` on the fully written LUN. Reads: \`iscsi-perf -m 32"
        echo "-b 8 -r -t $READ_SECONDS\`. Write after a snapshot: the allocating write's command on the"
        echo "fully written LUNs, right after a snapshot of the volume (deleted after the run), so"
        echo "that every write copies its unit; an unmeasured pass with its own snapshot goes first"
        echo "(see bench/thin.sh for why). Reads beside copies: LUN 2, a second fully written thin"
        echo "volume of the same pool, read with the same command, alone and then while the write after"
        echo "a snapshot runs on LUN 1 pass after pass (each with its own snapshot, deleted after it); the"
        echo "copying writes' IOPS count their passes' own run times. CPU per I/O counts the daemon"
        echo "only (utime+stime), over every LUN's I/O in the same seconds."
    } >"$BENCH_OUT"
}

main() {
    LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
    port_in_use "$OA_PORT" && die "port $OA_PORT is taken; set OA_PORT"
    WORK=$(mktemp -d /dev/shm/openarray-thin-bench.XXXXXX)
    build_openarray
    start_openarray
    ALLOC_USED=0
    ALLOC_STORED=0

    local round lun
    for round in $(seq 1 "$ROUNDS"); do
        log "round $round of $ROUNDS"
        empty_thin
        for lun in 0 1; do
            measure_write "4K allocating write QD32" "$lun" "$ALLOC_COUNT" 64k
        done
        flush_thin
        ALLOC_USED=$(pool_used)
        ALLOC_STORED=$(stat -c '%b %B' "$WORK/pool.img" | awk '{ print $1 * $2 }')
        for lun in 0 1 2; do fill "$lun"; done
        for lun in 0 1; do
            measure_write "4K overwrite QD32" "$lun" "$OVERWRITE_COUNT" 0
        done
        for lun in 0 1; do measure_read "$lun"; done
        copy_on_write_pass warm-up >/dev/null
        volume snapshot thin before
        for lun in 0 1; do
            measure_write "4K write after a snapshot QD32" "$lun" "$ALLOC_COUNT" 64k
        done
        flush_thin
        volume delete before
        measure_read 2 "4K random read QD32 alone"
        measure_reads_beside_copies
    done

    echo
    report_table
    echo
    report_beside
    write_report
    log "report written to $BENCH_OUT"
    return "$FAILED"
}

main "$@"
