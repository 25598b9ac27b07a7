#!/usr/bin/env bash
# The benchmark matrix: openarray against tgt (the Linux SCSI target
# framework) in one run, on this machine, over loopback, with the same LUN
# contents, and the report docs/bench/matrix.md with its plots.
#
# What runs (every figure with the target's CPU time per I/O, from
# /proc/PID/stat of the target process, all threads):
#   1. fio matrix: 4K randread, 4K randwrite, 4M read, 4M write at QD 1/32/128,
#      fio's libiscsi engine straight to each target (one session per run).
#      Debian's fio lacks that engine, so bench/fio-libiscsi.sh builds the
#      same fio release with it once (kept in target/bench-tools/). The same
#      fio drives openarray's NBD export of that LUN's device with its nbd
#      engine (one connection per run), beside the two iSCSI targets.
#   2. session scaling: 1/2/4/8 concurrent iscsi-perf processes (one session
#      each), 4K random read QD32 each, plus openarray's RAM LUN at 1 session.
#   3. QD1 4K random read latency measured directly: qemu-io (qemu's iSCSI
#      driver) times every read; median, p99, p99.9.
#   4. 4K write QD32 directly: qemu-img bench -w (sequential offsets), beside
#      4K reads by the same tool.
#   5. 1 MiB sequential read and write (qemu-img bench, QD8) against one
#      loopback TCP stream measured by iperf3 in the same round.
#   6. O_DIRECT file LUN on the real disk (a file under /var/tmp): iscsi-perf
#      at QD1, QD16 and QD32 against fio ioengine=io_uring direct=1 on that
#      file (fio's QD16 figure bounds a target at QD32: techniques.md s. 42).
#   7. header digests: iscsi-perf QD32 with header_digest=crc32c vs none;
#      data digests, which no client here negotiates: benches/digests.rs, the
#      project's own initiator against openarray alone (cargo bench).
#
# Usage: bench/matrix.sh [--quick]
#   --quick   shorter runs (2 s) and fewer points, for trying the script out;
#             its report goes to /tmp/openarray-matrix-quick unless MATRIX_OUT is set
# Environment (optional):
#   OA_PORT=13260 TGT_PORT=13261   portals on 127.0.0.1 (tgt's control port
#                                  is TGT_PORT too, so a running tgtd is left alone)
#   NBD_PORT=10810                 openarray's NBD listener on 127.0.0.1
#   IPERF_PORT=15201               iperf3 server port
#   RUNTIME=5                      seconds per timed run (--quick: 2)
#   ROUNDS=3                       rounds of the direct measurements (2-7 above;
#                                  --quick: 1); the report keeps each one's best
#                                  round (the machine is shared: the least
#                                  disturbed run), the raw file keeps them all
#   MATRIX_ROUNDS=2                rounds of the fio matrix (1 above; --quick: 1)
#   DISK_DIR=/var/tmp              where the O_DIRECT LUN's file lives (not tmpfs)
#   MATRIX_OUT=docs/bench          where matrix.md, its plots and raw figures go
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
QUICK=0
case "${1:-}" in
    --quick) QUICK=1 ;;
    "") ;;
    *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac

OA_PORT=${OA_PORT:-13260}
TGT_PORT=${TGT_PORT:-13261}
NBD_PORT=${NBD_PORT:-10810}
IPERF_PORT=${IPERF_PORT:-15201}
DISK_DIR=${DISK_DIR:-/var/tmp}
if [ "$QUICK" -eq 1 ]; then
    # A quick run does not replace the committed report.
    MATRIX_OUT=${MATRIX_OUT:-/tmp/openarray-matrix-quick}
    RUNTIME=${RUNTIME:-2}
    DEPTHS="1 32"
    SESSIONS="1 4"
    LAT_READS=5000
    SEQ_MIB=512
    ROUNDS=${ROUNDS:-1}
    MATRIX_ROUNDS=${MATRIX_ROUNDS:-1}
else
    MATRIX_OUT=${MATRIX_OUT:-$ROOT/docs/bench}
    RUNTIME=${RUNTIME:-5}
    DEPTHS="1 32 128"
    SESSIONS="1 2 4 8"
    LAT_READS=20000
    SEQ_MIB=2048
    ROUNDS=${ROUNDS:-3}
    MATRIX_ROUNDS=${MATRIX_ROUNDS:-2}
fi
LUN_MIB=1024
OA_IQN=iqn.2024-01.org.openarray:matrix
TGT_IQN=iqn.2024-01.org.openarray:matrix-tgt
TGT_DIRECT_IQN=iqn.2024-01.org.openarray:matrix-tgt-direct
# openarray LUNs: 0 file on tmpfs, 1 RAM, 2 O_DIRECT file on disk.
# tgt: LUN 0 of each target is its controller, the disk is LUN 1.
OA_URL=iscsi://127.0.0.1:$OA_PORT/$OA_IQN
TGT_URL=iscsi://127.0.0.1:$TGT_PORT/$TGT_IQN
TGT_DIRECT_URL=iscsi://127.0.0.1:$TGT_PORT/$TGT_DIRECT_IQN
# openarray's NBD export of LUN 0's device.
OA_NBD_URL=nbd://127.0.0.1:$NBD_PORT/tmpfs
CLK_TCK=$(getconf CLK_TCK)
TOOL="python3 $ROOT/bench/matrix_report.py"

# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"

WORK=""
DISK_FILE=""
PIDS=()

cleanup() {
    local status=$? i
    set +e
    kill_children
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_process "${PIDS[i]}"; done
    rm -f "/var/run/tgtd/socket.$TGT_PORT" "/var/run/tgtd/socket.$TGT_PORT.lock"
    [ -n "$WORK" ] && rm -rf "$WORK"
    [ -n "$DISK_FILE" ] && rm -f "$DISK_FILE"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

install_tools() {
    bash "$ROOT/scripts/install-deps.sh"
    local missing=()
    command -v qemu-img >/dev/null || missing+=(qemu-utils)
    command -v iperf3 >/dev/null || missing+=(iperf3)
    command -v gnuplot >/dev/null || missing+=(gnuplot-nox)
    command -v python3 >/dev/null || missing+=(python3)
    [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
    # fio io_uring on the disk file comes from the package; fio against the
    # targets needs the libiscsi engine, built once.
    FIO=$(bash "$ROOT/bench/fio-libiscsi.sh") || die "cannot build fio with the libiscsi and nbd engines"
}

# Random contents, so that every read moves real data and no layer can
# answer from a hole.
make_random_file() {
    head -c "$((LUN_MIB * 1048576))" /dev/urandom >"$1"
}

start_openarray() {
    {
        # tgt's file backing store also reports a volatile write cache.
        file_device_toml tmpfs "$WORK/openarray.img" "size = \"${LUN_MIB}M\"" \
            "block_size = 512" "write_cache = true"
        printf '[[device]]\nname = "ram"\nkind = "mem"\nsize = "%sM"\nblock_size = 512\n\n' "$LUN_MIB"
        file_device_toml disk "$DISK_FILE" "size = \"${LUN_MIB}M\"" "block_size = 512" "direct = true"
        target_toml "$OA_IQN" tmpfs ram disk
        printf '\n[nbd]\nlisten = ["127.0.0.1:%s"]\n\n' "$NBD_PORT"
        printf '[[nbd.export]]\nname = "tmpfs"\ndevice = "tmpfs"\n'
    } >"$WORK/openarray.toml"
    "$OA_BIN" serve --config "$WORK/openarray.toml" --listen "127.0.0.1:$OA_PORT" >"$WORK/openarray.log" 2>&1 &
    OA_PID=$!
    PIDS+=("$OA_PID")
    wait_for_port "$OA_PORT" "$OA_PID" openarray
    wait_for_port "$NBD_PORT" "$OA_PID" openarray
    log "openarray pid $OA_PID on 127.0.0.1:$OA_PORT (NBD: $NBD_PORT)"
}

start_tgt() {
    [ -e "/var/run/tgtd/socket.$TGT_PORT.lock" ] && die "a tgtd with control port $TGT_PORT runs already; set TGT_PORT"
    tgtd -f -C "$TGT_PORT" --iscsi "portal=127.0.0.1:$TGT_PORT" >"$WORK/tgt.log" 2>&1 &
    TGT_PID=$!
    PIDS+=("$TGT_PID")
    for _ in $(seq 1 100); do
        [ -S "/var/run/tgtd/socket.$TGT_PORT" ] && break
        kill -0 "$TGT_PID" 2>/dev/null || die "tgtd exited at start (log: $WORK/tgt.log)"
        sleep 0.1
    done
    local adm=(tgtadm -C "$TGT_PORT" --lld iscsi)
    "${adm[@]}" --op new --mode target --tid 1 -T "$TGT_IQN"
    "${adm[@]}" --op new --mode logicalunit --tid 1 --lun 1 -b "$WORK/tgt.img"
    "${adm[@]}" --op bind --mode target --tid 1 -I ALL
    "${adm[@]}" --op new --mode target --tid 2 -T "$TGT_DIRECT_IQN"
    "${adm[@]}" --op new --mode logicalunit --tid 2 --lun 1 -b "$DISK_FILE" --bsoflags direct
    "${adm[@]}" --op bind --mode target --tid 2 -I ALL
    wait_for_port "$TGT_PORT" "$TGT_PID" tgt
    log "tgtd pid $TGT_PID on 127.0.0.1:$TGT_PORT"
}

RESULTS=""
CTX0=0

# Context switches of the target per I/O since CTX0 was sampled: how often
# serving one command puts a thread to sleep or takes it off a core.
ctx_per_io() { # pid ios
    awk -v c="$(( $(ctx_switches "$1") - CTX0 ))" -v n="$2" 'BEGIN { if (n > 0) printf "%.2f", c / n; else print "n/a" }'
}
# section system workload param iops mbps p50 p90 p99 p999 cpu_us client_cpu_us ctxsw
record() {
    local IFS=$'\t'
    echo "$*" >>"$RESULTS"
    log "$(echo "$*" | tr '\t' ' ')"
}

# Target process of a system.
target_pid() {
    case $1 in
        openarray|openarray-ram|openarray-nbd) echo "$OA_PID" ;;
        tgt) echo "$TGT_PID" ;;
        *) echo "" ;;
    esac
}

# 1. fio straight to a target: its libiscsi engine, or its nbd engine for
# openarray's NBD export.
fio_run() { # system workload depth
    local system=$1 workload=$2 depth=$3 rw bs target out="$WORK/fio-$1-$2-$3.json"
    case $workload in
        4k-randread) rw=randread; bs=4k ;;
        4k-randwrite) rw=randwrite; bs=4k ;;
        4m-read) rw="read"; bs=4m ;;
        4m-write) rw="write"; bs=4m ;;
    esac
    if [ "$system" = openarray-nbd ]; then
        target=(--ioengine=nbd --uri="$OA_NBD_URL")
    else
        # fio's name for the LUN: its iSCSI URL with every colon escaped.
        target=(--ioengine=libiscsi --filename="$(lun_url "$system" | sed 's/:/\\:/g')")
    fi
    local tpid t0 t1
    tpid=$(target_pid "$system")
    t0=$(cpu_ticks "$tpid")
    CTX0=$(ctx_switches "$tpid")
    if ! run_child timeout $((RUNTIME + 60)) "$FIO" --name="$workload" "${target[@]}" \
        --rw="$rw" --bs="$bs" \
        --iodepth="$depth" --time_based --runtime="$RUNTIME" --size="${LUN_MIB}M" \
        --lat_percentiles=1 --percentile_list=50:90:99:99.9 --output-format=json --output="$out" >/dev/null 2>"$out.err"; then
        log "fio $workload QD$depth against $system failed: $(tail -2 "$out.err")"
        FAILED=1
        return
    fi
    t1=$(cpu_ticks "$tpid")
    local iops mbps p50 p90 p99 p999 ios client
    read -r iops mbps p50 p90 p99 p999 ios client < <($TOOL parse-fio "$out")
    record matrix "$system" "$workload" "$depth" "$iops" "$mbps" "$p50" "$p90" "$p99" "$p999" \
        "$(us_per_io $((t1 - t0)) "$ios")" "$client" "$(ctx_per_io "$tpid" "$ios")"
}

# 2. N concurrent iscsi-perf sessions, 4K random read QD32 each.
sessions_run() { # system url sessions [section]
    local system=$1 url=$2 n=$3 section=${4:-sessions} pid t0 t1 i rc=0 pids=()
    pid=$(target_pid "$system")
    t0=$(cpu_ticks "$pid")
    CTX0=$(ctx_switches "$pid")
    for i in $(seq 1 "$n"); do
        timeout $((RUNTIME + 30)) iscsi-perf -i "iqn.2024-01.org.openarray:bench-client-$i" \
            -m 32 -b 8 -r -t "$RUNTIME" "$url" >"$WORK/perf-$system-$n-$i.out" 2>&1 &
        pids+=($!)
    done
    CHILDREN="${pids[*]}"
    for i in "${pids[@]}"; do wait "$i" || rc=1; done
    CHILDREN=""
    t1=$(cpu_ticks "$pid")
    local total=0 iops
    for i in $(seq 1 "$n"); do
        iops=$(tr '\r' '\n' <"$WORK/perf-$system-$n-$i.out" | sed -n 's/^iops average \([0-9]*\) .*/\1/p' | tail -1)
        if [ -z "$iops" ]; then rc=1; break; fi
        total=$((total + iops))
    done
    if [ "$rc" -ne 0 ]; then
        log "iscsi-perf x$n against $system ($url) failed: $(tr '\r' '\n' <"$WORK/perf-$system-$n-1.out" | tail -2)"
        FAILED=1
        return
    fi
    record "$section" "$system" 4k-randread-qd32 "$n" "$total" \
        "$(awk -v i="$total" 'BEGIN { printf "%.1f", i * 4096 / 1e6 }')" - - - - \
        "$(us_per_io $((t1 - t0)) $((total * RUNTIME)))" - "$(ctx_per_io "$pid" $((total * RUNTIME)))"
}

# 3. QD1 latency, timed per read by qemu-io.
latency_run() { # system url
    local system=$1 url=$2 pid t0 t1 out="$WORK/qemu-io-$1.out"
    $TOOL random-reads "$LAT_READS" "$LUN_MIB" >"$WORK/reads.txt"
    pid=$(target_pid "$system")
    t0=$(cpu_ticks "$pid")
    CTX0=$(ctx_switches "$pid")
    # qemu-io reads its commands from stdin, which a background child of a
    # script would get as /dev/null: redirect inside the child.
    # shellcheck disable=SC2016 # expanded by the inner shell
    if ! run_child timeout 300 sh -c 'exec qemu-io -f raw "$1" <"$2"' sh "$url" "$WORK/reads.txt" >"$out" 2>&1; then
        log "qemu-io against $system failed: $(tail -2 "$out")"; FAILED=1; return
    fi
    t1=$(cpu_ticks "$pid")
    local n iops p50 p90 p99 p999
    read -r n iops p50 p90 p99 p999 < <($TOOL parse-qemu-io "$out")
    [ "$n" -eq "$LAT_READS" ] || { log "qemu-io against $system: $n of $LAT_READS reads timed"; FAILED=1; return; }
    record latency "$system" 4k-randread-qd1 1 "$iops" - "$p50" "$p90" "$p99" "$p999" "$(us_per_io $((t1 - t0)) "$n")" - "$(ctx_per_io "$pid" "$n")"
}

# 4 and 5. qemu-img bench straight to the target.
qemu_bench_run() { # section system url workload size depth count [-w]
    local section=$1 system=$2 url=$3 workload=$4 size=$5 depth=$6 count=$7 mode=${8:-}
    local pid t0 t1 c0 c1 out="$WORK/bench-$system-$workload.out" seconds
    pid=$(target_pid "$system")
    t0=$(cpu_ticks "$pid")
    CTX0=$(ctx_switches "$pid")
    children_cpu_ms c0
    # shellcheck disable=SC2086 # mode is empty or -w
    if ! run_child timeout 300 qemu-img bench -f raw -t none $mode -d "$depth" -s "$size" -c "$count" \
        --pattern 0x5a "$url" >"$out" 2>&1; then
        log "qemu-img bench $workload against $system failed: $(tail -2 "$out")"; FAILED=1; return
    fi
    t1=$(cpu_ticks "$pid")
    children_cpu_ms c1
    seconds=$(sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p' "$out")
    [ -n "$seconds" ] || { log "no result from qemu-img bench against $system"; FAILED=1; return; }
    local bytes
    bytes=$(numfmt --from=iec "${size^^}")
    record "$section" "$system" "$workload" "$depth" \
        "$(awk -v n="$count" -v s="$seconds" 'BEGIN { printf "%d", n / s }')" \
        "$(awk -v n="$count" -v b="$bytes" -v s="$seconds" 'BEGIN { printf "%.1f", n * b / s / 1e6 }')" \
        - - - - "$(us_per_io $((t1 - t0)) "$count")" \
        "$(awk -v ms=$((c1 - c0)) -v n="$count" 'BEGIN { printf "%.1f", ms * 1000 / n }')" \
        "$(ctx_per_io "$pid" "$count")"
}

start_tcp_server() {
    # No --one-off: the readiness probe below is a connection of its own.
    iperf3 -s -B 127.0.0.1 -p "$IPERF_PORT" >"$WORK/iperf-server.log" 2>&1 &
    local spid=$!
    PIDS+=("$spid")
    wait_for_port "$IPERF_PORT" "$spid" iperf3
}

# One loopback TCP stream, the ceiling for one iSCSI connection's data.
tcp_stream_run() {
    if ! run_child timeout 60 iperf3 -c 127.0.0.1 -p "$IPERF_PORT" -t "$RUNTIME" -J >"$WORK/iperf.json" 2>&1; then
        log "iperf3 failed: $(tail -2 "$WORK/iperf.json")"; FAILED=1; return
    fi
    record tcp iperf3 one-stream 1 - "$($TOOL parse-iperf "$WORK/iperf.json")" - - - - - - -
}

# 6. fio io_uring straight on the disk file, as the device's own figure.
direct_fio_run() { # depth
    local depth=$1 out="$WORK/fio-direct-$1.json"
    if ! run_child timeout $((RUNTIME + 60)) fio --name=direct --ioengine=io_uring --direct=1 \
        --filename="$DISK_FILE" --rw=randread --bs=4k --iodepth="$depth" --time_based \
        --runtime="$RUNTIME" --lat_percentiles=1 --percentile_list=50:90:99:99.9 --output-format=json \
        --output="$out" >/dev/null 2>"$out.err"; then
        log "fio io_uring on $DISK_FILE failed: $(tail -2 "$out.err")"; FAILED=1; return
    fi
    local iops mbps p50 p90 p99 p999 ios
    read -r iops mbps p50 p90 p99 p999 ios < <($TOOL parse-fio "$out")
    record direct fio-io_uring 4k-randread "$depth" "$iops" "$mbps" "$p50" "$p90" "$p99" "$p999" - - -
}

direct_target_run() { # system url depth
    local system=$1 url=$2 depth=$3 pid t0 t1 out="$WORK/direct-$1-$3.out" iops
    pid=$(target_pid "$system")
    t0=$(cpu_ticks "$pid")
    CTX0=$(ctx_switches "$pid")
    if ! run_child timeout $((RUNTIME + 30)) iscsi-perf -m "$depth" -b 8 -r -t "$RUNTIME" "$url" >"$out" 2>&1; then
        log "iscsi-perf QD$depth against $system's O_DIRECT LUN failed"; FAILED=1; return
    fi
    t1=$(cpu_ticks "$pid")
    iops=$(tr '\r' '\n' <"$out" | sed -n 's/^iops average \([0-9]*\) .*/\1/p' | tail -1)
    [ -n "$iops" ] || { log "no result from iscsi-perf against $system's O_DIRECT LUN"; FAILED=1; return; }
    record direct "$system" 4k-randread "$depth" "$iops" \
        "$(awk -v i="$iops" 'BEGIN { printf "%.1f", i * 4096 / 1e6 }')" - - - - \
        "$(us_per_io $((t1 - t0)) $((iops * RUNTIME)))" - "$(ctx_per_io "$pid" $((iops * RUNTIME)))"
}

# The two targets take turns going first, round after round, so that a
# change of load during a pair does not always favour the same one.
targets_in_round() {
    if [ $(($1 % 2)) -eq 1 ]; then echo "tgt openarray"; else echo "openarray tgt"; fi
}

# The fio matrix's systems in a round: the iSCSI targets in turns, with
# openarray's NBD export first and last by turns too.
matrix_systems_in_round() {
    if [ $(($1 % 2)) -eq 1 ]; then echo "$(targets_in_round "$1") openarray-nbd"; else echo "openarray-nbd $(targets_in_round "$1")"; fi
}

# The tmpfs file LUN of a target.
lun_url() {
    case $1 in
        tgt) echo "$TGT_URL/1" ;;
        openarray) echo "$OA_URL/0" ;;
    esac
}

# Sections 2-7 once; main runs
# this ROUNDS times and the report keeps the best round of each.
direct_round() { # round
    local n system depth targets
    targets=$(targets_in_round "$1")
    for n in $SESSIONS; do
        for system in $targets; do sessions_run "$system" "$(lun_url "$system")" "$n"; done
    done
    sessions_run openarray-ram "$OA_URL/1" 1 ram

    for system in $targets; do latency_run "$system" "$(lun_url "$system")"; done

    tcp_stream_run
    for system in $targets; do
        # The same tool's 4K reads: what the writes are held against.
        qemu_bench_run write "$system" "$(lun_url "$system")" 4k-read 4k 32 $((RUNTIME * 40000))
        qemu_bench_run write "$system" "$(lun_url "$system")" 4k-write 4k 32 $((RUNTIME * 40000)) -w
        qemu_bench_run seq "$system" "$(lun_url "$system")" 1m-read 1M 8 "$SEQ_MIB"
        qemu_bench_run seq "$system" "$(lun_url "$system")" 1m-write 1M 8 "$SEQ_MIB" -w
    done

    for depth in 1 16 32; do
        direct_fio_run "$depth"
        direct_target_run openarray "$OA_URL/2" "$depth"
        direct_target_run tgt "$TGT_DIRECT_URL/1" "$depth"
    done

    for system in $targets; do
        sessions_run "$system" "$(lun_url "$system")?header_digest=none" 1 digest-none
        sessions_run "$system" "$(lun_url "$system")?header_digest=crc32c" 1 digest-crc32c
    done
}

main() {
    local load_before
    load_before=$(cut -d' ' -f1-3 /proc/loadavg)
    local started=$SECONDS
    install_tools
    port_in_use "$OA_PORT" && die "port $OA_PORT is taken; set OA_PORT"
    port_in_use "$TGT_PORT" && die "port $TGT_PORT is taken; set TGT_PORT"
    port_in_use "$NBD_PORT" && die "port $NBD_PORT is taken; set NBD_PORT"
    port_in_use "$IPERF_PORT" && die "port $IPERF_PORT is taken; set IPERF_PORT"
    if [ "$(stat -f -c %T "$DISK_DIR")" = tmpfs ]; then die "$DISK_DIR is tmpfs; set DISK_DIR to a disk"; fi

    log "building openarray (release)"
    run_child cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml" -p openarray --bin openarray
    run_child cargo bench --quiet --no-run --manifest-path "$ROOT/Cargo.toml" --bench digests
    OA_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/openarray
    # What was built: the commit, and whether the working tree differed from it.
    local commit dirty
    commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    dirty=$(git -C "$ROOT" status --porcelain --untracked-files=no -- src crates Cargo.toml Cargo.lock 2>/dev/null | wc -l)
    [ "$dirty" -eq 0 ] || commit="$commit (+ uncommitted changes in $dirty files of src/, crates/)"

    WORK=$(mktemp -d /dev/shm/openarray-matrix.XXXXXX)
    RESULTS=$WORK/results.tsv
    : >"$RESULTS"
    log "writing the LUN contents (random, ${LUN_MIB} MiB, the same for both targets)"
    make_random_file "$WORK/base.img"
    cp "$WORK/base.img" "$WORK/openarray.img"
    cp "$WORK/base.img" "$WORK/tgt.img"
    DISK_FILE=$(mktemp "$DISK_DIR/openarray-matrix-disk.XXXXXX")
    make_random_file "$DISK_FILE"
    sync "$DISK_FILE"

    start_openarray
    start_tgt
    # The RAM LUN starts empty (reads of unwritten blocks cost nothing);
    # give it the same contents as the others.
    run_child qemu-img convert -n -f raw -O raw -t none "$WORK/base.img" "$OA_URL/1"

    FAILED=0
    start_tcp_server

    local workload depth system round
    for round in $(seq 1 "$MATRIX_ROUNDS"); do
        log "fio matrix (libiscsi and nbd engines), round $round of $MATRIX_ROUNDS"
        for workload in 4k-randread 4k-randwrite 4m-read 4m-write; do
            for depth in $DEPTHS; do
                for system in $(matrix_systems_in_round "$round"); do fio_run "$system" "$workload" "$depth"; done
            done
        done
    done

    for round in $(seq 1 "$ROUNDS"); do
        log "direct measurements, round $round of $ROUNDS"
        direct_round "$round"
    done

    log "data digests (benches/digests.rs), $ROUNDS round(s)"
    if ! run_child cargo bench --quiet --manifest-path "$ROOT/Cargo.toml" --bench digests -- \
        --seconds "$RUNTIME" --rounds "$ROUNDS" --tsv "$RESULTS" >"$WORK/digests.out" 2>&1; then
        log "the digest bench failed: $(tail -2 "$WORK/digests.out")"; FAILED=1
    fi

    local cmd="bench/matrix.sh"
    [ "$QUICK" -eq 1 ] && cmd="bench/matrix.sh --quick"
    mkdir -p "$MATRIX_OUT"
    cp "$RESULTS" "$MATRIX_OUT/matrix-results.tsv"
    $TOOL report --results "$RESULTS" --out "$MATRIX_OUT" --command "$cmd" --commit "$commit" \
        --runtime "$RUNTIME" --load-before "$load_before" --load-after "$(cut -d' ' -f1-3 /proc/loadavg)" \
        --minutes "$(( (SECONDS - started + 59) / 60 ))" --disk-dir "$DISK_DIR" --lat-reads "$LAT_READS" \
        --seq-mib "$SEQ_MIB" --rounds "$ROUNDS" --matrix-rounds "$MATRIX_ROUNDS" --failed "$FAILED"
    log "report written to $MATRIX_OUT/matrix.md"
    return "$FAILED"
}

# Sourced (bench/bench-vs-matrix.sh reuses its setup and fio runs): no run.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then main "$@"; fi
