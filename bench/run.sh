#!/usr/bin/env bash
# Benchmark openarray against tgt (the Linux SCSI target framework) in one run,
# on the same machine, with the same backing store (a 1 GiB file on tmpfs) and
# the same real clients:
#   - 4K random read, 32 in flight:  iscsi-perf -m 32 -b 8 -r (512-byte blocks)
#   - 4K sequential write, 32 deep:  qemu-img bench -w -t none -d 32 -s 4k
# and the target's CPU time per I/O (utime+stime of the target process, all
# threads, from /proc/PID/stat, before and after each workload).
#
# Usage: bench/run.sh
# Environment (all optional):
#   ROUNDS=2              rounds, each running every workload on every system
#                         in turn; the best round per system is reported
#                         (the machine may be shared, so take the least
#                         disturbed run), all rounds are listed
#   READ_SECONDS=10       length of each read run
#   WRITE_COUNT=250000    writes per write run (250000 x 4 KiB = the whole LUN)
#   OA_PORT=3260          openarray portal on 127.0.0.1
#   TGT_PORT=3261         tgtd portal on 127.0.0.1
#   TGT_CONTROL_PORT=...  tgtd management port (default: TGT_PORT), so that an
#                         already running tgtd (control port 0) is left alone
#   SYSTEMS="tgt openarray"  which targets to measure
#   BENCH_OUT=docs/bench/latest.md  where the report goes
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-2}
READ_SECONDS=${READ_SECONDS:-10}
WRITE_COUNT=${WRITE_COUNT:-250000}
OA_PORT=${OA_PORT:-3260}
TGT_PORT=${TGT_PORT:-3261}
TGT_CONTROL_PORT=${TGT_CONTROL_PORT:-$TGT_PORT}
SYSTEMS=${SYSTEMS:-"tgt openarray"}
BENCH_OUT=${BENCH_OUT:-$ROOT/docs/bench/latest.md}
LUN_SIZE=1G
OA_IQN=iqn.2024-01.org.openarray:bench
TGT_IQN=iqn.2024-01.org.openarray:bench-tgt
CLK_TCK=$(getconf CLK_TCK)

# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"

WORK=""
TGTD_PID=""
OA_PID=""

cleanup() {
    local status=$?
    set +e
    kill_children
    if [ -n "$OA_PID" ]; then stop_process "$OA_PID"; fi
    if [ -n "$TGTD_PID" ]; then
        stop_process "$TGTD_PID"
        # tgtd leaves its management socket behind when it is killed.
        rm -f "/var/run/tgtd/socket.$TGT_CONTROL_PORT" "/var/run/tgtd/socket.$TGT_CONTROL_PORT.lock"
    fi
    if [ -n "$WORK" ]; then rm -rf "$WORK"; fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

make_backing_file() {
    fallocate -l "$LUN_SIZE" "$1" 2>/dev/null || dd if=/dev/zero of="$1" bs=1M count=1024 status=none
}

start_tgt() {
    [ -e "/var/run/tgtd/socket.$TGT_CONTROL_PORT.lock" ] && \
        die "a tgtd with control port $TGT_CONTROL_PORT seems to run already; set TGT_CONTROL_PORT"
    make_backing_file "$WORK/tgt.img"
    # -f: foreground; the portal option binds only to loopback instead of the
    # wildcard address on 3260; -C: a private management socket.
    tgtd -f -C "$TGT_CONTROL_PORT" --iscsi "portal=127.0.0.1:$TGT_PORT" >"$WORK/tgt.log" 2>&1 &
    TGTD_PID=$!
    for _ in $(seq 1 100); do
        [ -S "/var/run/tgtd/socket.$TGT_CONTROL_PORT" ] && break
        kill -0 "$TGTD_PID" 2>/dev/null || die "tgtd exited at start (log: $WORK/tgt.log)"
        sleep 0.1
    done
    local adm=(tgtadm -C "$TGT_CONTROL_PORT" --lld iscsi)
    "${adm[@]}" --op new --mode target --tid 1 -T "$TGT_IQN"
    # LUN 0 of a tgt target is its controller; the disk is LUN 1.
    "${adm[@]}" --op new --mode logicalunit --tid 1 --lun 1 -b "$WORK/tgt.img"
    "${adm[@]}" --op bind --mode target --tid 1 -I ALL
    wait_for_port "$TGT_PORT" "$TGTD_PID" tgt
    log "tgtd pid $TGTD_PID on 127.0.0.1:$TGT_PORT"
}

start_openarray() {
    make_backing_file "$WORK/openarray.img"
    {
        # tgt's file backing store also reports a volatile write cache.
        file_device_toml bench "$WORK/openarray.img" "size = \"$LUN_SIZE\"" \
            "block_size = 512" "write_cache = true"
        target_toml "$OA_IQN" bench
    } >"$WORK/openarray.toml"
    "$OA_BIN" serve --config "$WORK/openarray.toml" --listen "127.0.0.1:$OA_PORT" >"$WORK/openarray.log" 2>&1 &
    OA_PID=$!
    wait_for_port "$OA_PORT" "$OA_PID" openarray
    log "openarray pid $OA_PID on 127.0.0.1:$OA_PORT"
}

# Results, one line per measurement: workload system iops us_per_io
RESULTS=()
FAILED=0

record() { RESULTS+=("$1|$2|$3|$4"); log "$1 $2: $3 IOPS, $4 us/IO"; }

measure_read() {
    local system=$1 pid=$2 url=$3 out="$WORK/$1-read.out" before after iops
    before=$(cpu_ticks "$pid")
    if ! run_child timeout $((READ_SECONDS + 20)) iscsi-perf -m 32 -b 8 -r -t "$READ_SECONDS" "$url" >"$out" 2>&1; then
        log "iscsi-perf against $system failed:"; tr '\r' '\n' <"$out" | tail -5 >&2
        record "4K random read QD32" "$system" failed n/a; FAILED=1; return
    fi
    after=$(cpu_ticks "$pid")
    # Progress lines are separated by '\r'; the final one holds the whole-run average.
    iops=$(tr '\r' '\n' <"$out" | sed -n 's/^iops average \([0-9]*\) .*/\1/p' | tail -1)
    [ -n "$iops" ] || { log "no result from iscsi-perf against $system"; record "4K random read QD32" "$system" failed n/a; FAILED=1; return; }
    record "4K random read QD32" "$system" "$iops" "$(us_per_io $((after - before)) $((iops * READ_SECONDS)))"
}

measure_write() {
    local system=$1 pid=$2 url=$3 out="$WORK/$1-write.out" before after seconds iops
    before=$(cpu_ticks "$pid")
    if ! run_child timeout 120 qemu-img bench -f raw -w -t none -c "$WRITE_COUNT" -d 32 -s 4k --pattern 0x5a "$url" >"$out" 2>&1; then
        log "qemu-img bench against $system failed:"; tail -5 "$out" >&2
        record "4K write QD32" "$system" failed n/a; FAILED=1; return
    fi
    after=$(cpu_ticks "$pid")
    seconds=$(sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p' "$out")
    [ -n "$seconds" ] || { log "no result from qemu-img bench against $system"; record "4K write QD32" "$system" failed n/a; FAILED=1; return; }
    iops=$(awk -v n="$WRITE_COUNT" -v s="$seconds" 'BEGIN { printf "%d", n / s }')
    record "4K write QD32" "$system" "$iops" "$(us_per_io $((after - before)) "$WRITE_COUNT")"
}

WORKLOADS=("4K random read QD32" "4K write QD32")

report_table() {
    local w s best oa tgt
    echo "| workload | system | IOPS (best) | target CPU µs/IO (that run) | IOPS of every round |"
    echo "|---|---|---:|---:|---|"
    for w in "${WORKLOADS[@]}"; do
        for s in $SYSTEMS; do
            best=$(best_of "$w" "$s")
            echo "| $w | $s | ${best%%|*} | ${best#*|} | $(all_of "$w" "$s") |"
        done
    done
    echo
    echo "| workload | IOPS openarray/tgt | CPU per I/O openarray/tgt |"
    echo "|---|---:|---:|"
    for w in "${WORKLOADS[@]}"; do
        oa=$(best_of "$w" openarray)
        tgt=$(best_of "$w" tgt)
        echo "| $w | $(ratio "${oa%%|*}" "${tgt%%|*}") | $(ratio "${oa#*|}" "${tgt#*|}") |"
    done
}

machine_description() {
    echo "- CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), nproc $(nproc)"
    echo "- kernel: $(uname -srm)"
    echo "- memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "- load average before the run: $LOAD_BEFORE (other work on the machine competes for the same cores)"
    echo "- tgt $(tgtd --version 2>&1 | head -1), $(iscsi-perf 2>&1 | grep -m1 -o 'iscsi-perf version [0-9.]*'), $(qemu-img --version | head -1)"
}

write_report() {
    local commit
    commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    mkdir -p "$(dirname "$BENCH_OUT")"
    {
        echo "# openarray vs tgt"
        echo
        echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') at commit $commit with:"
        echo
        echo '```'
        echo "ROUNDS=$ROUNDS READ_SECONDS=$READ_SECONDS WRITE_COUNT=$WRITE_COUNT bench/run.sh"
        echo '```'
        echo
        echo "Machine:"
        echo
        machine_description
        echo
        report_table
        echo
        echo "Setup: each target serves one 1 GiB file on tmpfs (/dev/shm), 512-byte blocks,"
        echo "over 127.0.0.1 (tgt: rdwr backing store, LUN 1; openarray: file device with"
        echo "write_cache = true, LUN 0; both report WCE=1 and neither syncs per write)."
        echo "Reads: \`iscsi-perf -m 32 -b 8 -r -t $READ_SECONDS\` (4 KiB at random 512-byte-aligned LBAs)."
        echo "Writes: \`qemu-img bench -f raw -w -t none -c $WRITE_COUNT -d 32 -s 4k --pattern 0x5a\` (sequential 4 KiB)."
        echo "CPU per I/O counts only the target process (utime+stime of all its threads);"
        echo "clients and target share the same cores, so IOPS are bounded by both."
    } >"$BENCH_OUT"
}

main() {
    LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
    bash "$ROOT/scripts/install-deps.sh"
    WORK=$(mktemp -d /dev/shm/openarray-bench.XXXXXX)

    local system
    for system in $SYSTEMS; do
        case $system in
            tgt) port_in_use "$TGT_PORT" && die "port $TGT_PORT is taken; set TGT_PORT" ;;
            openarray) port_in_use "$OA_PORT" && die "port $OA_PORT is taken; set OA_PORT" ;;
            *) die "unknown system '$system'" ;;
        esac
    done

    case " $SYSTEMS " in
        *" openarray "*)
            log "building openarray (release)"
            run_child cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml" -p openarray --bin openarray
            OA_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/openarray
            start_openarray ;;
    esac
    case " $SYSTEMS " in *" tgt "*) start_tgt ;; esac

    local round
    for round in $(seq 1 "$ROUNDS"); do
        log "round $round of $ROUNDS"
        for system in $SYSTEMS; do
            case $system in
                tgt) measure_read tgt "$TGTD_PID" "iscsi://127.0.0.1:$TGT_PORT/$TGT_IQN/1" ;;
                openarray) measure_read openarray "$OA_PID" "iscsi://127.0.0.1:$OA_PORT/$OA_IQN/0" ;;
            esac
        done
        for system in $SYSTEMS; do
            case $system in
                tgt) measure_write tgt "$TGTD_PID" "iscsi://127.0.0.1:$TGT_PORT/$TGT_IQN/1" ;;
                openarray) measure_write openarray "$OA_PID" "iscsi://127.0.0.1:$OA_PORT/$OA_IQN/0" ;;
            esac
        done
    done

    echo
    report_table
    write_report
    log "report written to $BENCH_OUT"
    return "$FAILED"
}

main "$@"
