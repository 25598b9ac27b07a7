#!/usr/bin/env bash
# NBD servers side by side on the same machine and the same 1 GiB file on
# tmpfs: openarray's NBD export, qemu-nbd and nbdkit's file plugin, driven
# by fio's nbd engine (libnbd), one, two and four jobs (each job its own
# connection) per row:
#   - 4K randread and randwrite at QD 1, 32 and 128,
#   - 1M sequential read and write at QD 8,
# with IOPS and the server's CPU time per I/O (utime+stime of the server
# process, all threads, from /proc/PID/stat before and after each run), and
# fio's own CPU use (usr+sys, as fio reports it per job) to tell a client
# at its limit. Loopback TCP streams (iperf3), as many at once as the row
# has jobs, measured before each 1M row in each round, are the bound the
# 1M rows are held against.
#
# Beside the peers runs the least a server can do for the same rows
# (crates/nbd-minimal-server: a thread per connection, one recv and one
# writev per batch, reads from a mapping of the file, writes by pwrite, no
# checks, locks or statistics; structured replies, as the peers give fio's
# libnbd, whose client takes a data chunk's header and offset in receives
# of their own), once sleeping between requests
# ("minimal") and once polling for 50 µs first ("minimal-polling"). Where
# each request's round trip sets the pace (QD1), the better of the two is
# about the most any server can reach with this client on this machine,
# and the report holds openarray and the best peer against it: where it
# is itself under 1.5x the best peer, no server reaches that ratio in the
# row. With many requests in flight or large ones it is no bound: it
# answers one batch at a time and copies each write twice.
#
# fio's nbd engine runs one libnbd thread per job, which saturates a core
# near 80K IOPS on this kind of machine: one-job rows measure the client as
# much as the server; the rows of several jobs show more of the server, and
# where the cores are full, how much of them the server leaves to clients.
#
# All servers run from the start and each row runs on each server in turn,
# so that the figures of one row are taken minutes apart at most, not a
# whole server's rows apart: on a shared machine the load changes faster.
# The whole set runs ROUNDS times, the servers' order turning each round;
# the report keeps each server's median round of a row (median IOPS, with
# that round's CPU figures), gives the ratio of the best rounds beside it,
# as bench/matrix.sh reports them, and lists the ratio of every round, so
# a run shows how far the figures move. The median, because the best of a
# few rounds favours whichever server's figures scatter most: a server
# whose rounds spread over 100-135K beats one steady at 125-130K by its
# one lucky round.
#
# Usage: bench/nbd.sh
# Environment (all optional):
#   SECONDS_PER_RUN=5    length of each fio run
#   SERVERS="openarray qemu-nbd nbdkit minimal minimal-polling"
#   JOBS="1 2 4"         fio jobs (connections) per row
#   ROWS_MATCHING=RE     only the rows whose "rw bs qd" matches this
#                        extended regex (e.g. "1M", "4k 1$")
#   ROUNDS=5             times the whole set runs
#   OPENARRAY=PATH       a built openarray (default: cargo build --release)
#   MINIMAL=PATH         a built nbd-minimal-server (the same default)
#   BENCH_OUT=docs/bench/nbd.md  where the report goes
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
SERVERS=${SERVERS:-"openarray qemu-nbd nbdkit minimal minimal-polling"}
JOBS=${JOBS:-"1 2 4"}
ROWS_MATCHING=${ROWS_MATCHING:-}
ROUNDS=${ROUNDS:-5}
BENCH_OUT=${BENCH_OUT:-$ROOT/docs/bench/nbd.md}
SIZE_MIB=1024
CLK_TCK=$(getconf CLK_TCK)

# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"

WORK=""
declare -A SERVER_PID PORT
cleanup() {
    local status=$?
    set +e
    kill_children
    for pid in "${SERVER_PID[@]}"; do stop_process "$pid"; done
    [ -z "$WORK" ] || rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT

for tool in fio qemu-nbd nbdkit nbdinfo iperf3; do
    command -v "$tool" >/dev/null || apt_install fio qemu-utils nbdkit libnbd-bin iperf3
done
fio --enghelp=nbd >/dev/null 2>&1 || die "this fio has no nbd engine"

if [ -z "${OPENARRAY:-}" ] || [ -z "${MINIMAL:-}" ]; then
    log "building openarray and nbd-minimal-server (release)"
    (cd "$ROOT" && cargo build --release --quiet -p openarray -p nbd-minimal-server)
    TARGET=$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    OPENARRAY=${OPENARRAY:-$TARGET/release/openarray}
    MINIMAL=${MINIMAL:-$TARGET/release/nbd-minimal-server}
fi

# Whether server $1 is a peer: not openarray, nor a minimal server.
is_peer() { case "$1" in openarray | minimal*) return 1 ;; esac; }

# tmpfs, so that the device costs nothing and the servers are compared.
WORK=$(mktemp -d /dev/shm/openarray-nbd-bench.XXXXXX)
DISK=$WORK/disk.img
log "writing a ${SIZE_MIB} MiB file of random data on tmpfs"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$DISK"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Starts server $1 on 127.0.0.1:$2 serving $DISK as export `d`; its PID
# goes in SERVER_PID[$1].
start_server() {
    local name=$1 port=$2
    case "$name" in
    openarray)
        cat >"$WORK/openarray.toml" <<EOF
[[portal]]
listen = "127.0.0.1:$(free_port)"

[[device]]
name = "d"
kind = "file"
path = "$DISK"

[nbd]
listen = ["127.0.0.1:$port"]

[[nbd.export]]
name = "d"
device = "d"
EOF
        "$OPENARRAY" serve -c "$WORK/openarray.toml" --admin-socket none --log-level warn \
            >"$WORK/openarray.log" 2>&1 &
        ;;
    qemu-nbd)
        # --cache=none needs O_DIRECT, which tmpfs refuses: the page cache
        # is the file here. io_uring is its fastest AIO.
        qemu-nbd -f raw -x d -b 127.0.0.1 -p "$port" --persistent --shared=16 \
            --cache=writeback --aio=io_uring "$DISK" >"$WORK/qemu-nbd.log" 2>&1 &
        ;;
    nbdkit)
        nbdkit --foreground --exit-with-parent -i 127.0.0.1 -p "$port" --exportname d \
            file "$DISK" >"$WORK/nbdkit.log" 2>&1 &
        ;;
    minimal) "$MINIMAL" "127.0.0.1:$port" "$DISK" 0 >"$WORK/minimal.log" 2>&1 & ;;
    minimal-polling) "$MINIMAL" "127.0.0.1:$port" "$DISK" 50 >"$WORK/minimal-polling.log" 2>&1 & ;;
    *) die "no such server: $name" ;;
    esac
    SERVER_PID[$name]=$!
    wait_for_port "$port" "${SERVER_PID[$name]}" "$name"
    nbdinfo --size "nbd://127.0.0.1:$port/d" >/dev/null || die "$name does not serve export d"
}

# $1 loopback TCP streams at once for SECONDS_PER_RUN, each between an
# iperf3 client and server of its own (one iperf3 is one thread, as one
# fio job is): prints their MiB/s together, or n/a. The most $1
# connections' bytes can move on this machine, against which the 1M rows
# of $1 jobs are held.
tcp_streams() {
    local n=$1 i port try total mibs out=$WORK/iperf
    local -a servers=() ports=() clients=()
    for i in $(seq 1 "$n"); do
        port=$(free_port)
        # Not `-1`: the readiness probe is a client too.
        iperf3 -s -B 127.0.0.1 -p "$port" >"$out-server-$i.log" 2>&1 &
        servers+=("$!")
        ports+=("$port")
        wait_for_port "$port" "$!" iperf3
    done
    total=n/a
    for try in 1 2 3; do
        # A server may still be busy with the readiness probe ("the
        # server is busy running a test"): the streams start together
        # after a pause, and all again if any failed.
        sleep 1
        clients=()
        for i in $(seq 1 "$n"); do
            iperf3 -c 127.0.0.1 -p "${ports[i - 1]}" -t "$SECONDS_PER_RUN" -J \
                >"$out-$i.json" 2>"$out-$i.err" &
            clients+=("$!")
        done
        wait "${clients[@]}" || true
        total=0
        for i in $(seq 1 "$n"); do
            mibs=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 8 / 2**20))' "$out-$i.json" 2>/dev/null) || {
                log "iperf3 attempt $try failed: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("error", ""))' "$out-$i.json" 2>/dev/null) $(cat "$out-$i.err")"
                total=n/a
                break
            }
            total=$((total + mibs))
        done
        [ "$total" = n/a ] || break
    done
    for i in "${servers[@]}"; do stop_process "$i"; done
    echo "$total"
}

# One fio run against server $1: prints
# "iops|us_per_io|MiB/s|client CPU %|machine busy %".
run_fio() {
    local server=$1 rw=$2 bs=$3 qd=$4 jobs=$5 port out before after iops bw client
    local busy0 all0 busy1 all1
    port=${PORT[$server]}
    read -r busy0 all0 < <(machine_ticks)
    before=$(cpu_ticks "${SERVER_PID[$server]}")
    out=$(fio --name=nbd --ioengine=nbd --uri="nbd://127.0.0.1:$port/d" --rw="$rw" \
        --bs="$bs" --iodepth="$qd" --numjobs="$jobs" --size="${SIZE_MIB}M" \
        --time_based --runtime="$SECONDS_PER_RUN" --ramp_time=1 --group_reporting \
        --output-format=terse 2>"$WORK/fio.err") || { log "fio failed: $(cat "$WORK/fio.err")"; echo "n/a|n/a|n/a|n/a|n/a"; return; }
    after=$(cpu_ticks "${SERVER_PID[$server]}")
    read -r busy1 all1 < <(machine_ticks)
    # Terse v3 (the one line with its 130 fields; fio may print notes
    # before it): field 8 read IOPS, 7 read KiB/s; 49 write IOPS, 48 write
    # KiB/s.
    iops=$(awk -F';' 'NF > 100 {printf "%d", $8 + $49}' <<<"$out")
    # Fields 88 and 89: the job's usr and sys CPU, in percent.
    client=$(awk -F';' 'NF > 100 {printf "%d", $88 + $89}' <<<"$out")
    bw=$(awk -F';' 'NF > 100 {printf "%d", ($7 + $48) / 1024}' <<<"$out")
    # The ramp second is in the CPU time but not in the IOPS: count it.
    echo "$iops|$(us_per_io "$((after - before))" "$((iops * (SECONDS_PER_RUN + 1)))")|$bw|$client|$(awk -v b=$((busy1 - busy0)) -v a=$((all1 - all0)) 'BEGIN { printf "%.0f", a ? 100 * b / a : 0 }')"
}

ROWS=()
for rw in randread randwrite; do
    for qd in 1 32 128; do ROWS+=("$rw 4k $qd"); done
done
ROWS+=("read 1M 8" "write 1M 8")
if [ -n "$ROWS_MATCHING" ]; then
    mapfile -t ROWS < <(printf '%s\n' "${ROWS[@]}" | grep -E -- "$ROWS_MATCHING" || true)
    [ "${#ROWS[@]}" -gt 0 ] || die "no row matches ROWS_MATCHING=$ROWS_MATCHING"
fi

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
log "one loopback TCP stream (iperf3)"
TCP_MIBS=$(tcp_streams 1)
log "TCP stream: $TCP_MIBS MiB/s"
# RESULT: each server's median round of a row; BEST: its best round;
# ROUND: every round's result; STREAMS: the streams measured before a 1M
# row (as many at once as it has jobs), STREAM: their median.
declare -A RESULT BEST ROUND STREAMS STREAM
for server in $SERVERS; do
    PORT[$server]=$(free_port)
    log "$server on port ${PORT[$server]}"
    start_server "$server" "${PORT[$server]}"
done

# The servers in round $1's order: turned by one place each round.
servers_in_round() {
    local -a all
    read -r -a all <<<"$SERVERS"
    local n=${#all[@]} i
    for ((i = 0; i < n; i++)); do printf '%s ' "${all[(i + $1) % n]}"; done
}

# The first field (IOPS or MiB/s) of a result as a number, 0 for n/a.
figure_of() { # result bs
    local iops bw
    IFS='|' read -r iops _ bw _ _ <<<"$1"
    local v=$iops
    [ "$2" = 4k ] || v=$bw
    [[ "$v" =~ ^[0-9]+$ ]] && echo "$v" || echo 0
}

for round in $(seq 1 "$ROUNDS"); do
    log "round $round of $ROUNDS"
    for row in "${ROWS[@]}"; do
        read -r rw bs qd <<<"$row"
        for jobs in $JOBS; do
            # As many streams as jobs just before each 1M row: the load
            # may have changed since the first.
            if [ "$bs" != 4k ]; then
                mibs=$(tcp_streams "$jobs")
                log "TCP streams ($jobs): $mibs MiB/s"
                [[ ! "$mibs" =~ ^[0-9]+$ ]] || STREAMS["$row|$jobs"]+=" $mibs"
            fi
            for server in $(servers_in_round "$round"); do
                key="$server|$row|$jobs"
                ROUND["$key|$round"]=$(run_fio "$server" "$rw" "$bs" "$qd" "$jobs")
                log "$server $rw $bs QD$qd ${jobs}j: ${ROUND["$key|$round"]}"
            done
        done
    done
done

# The line of median first field among lines that start with a number
# (the lower middle one of an even count); nothing for none.
median() { grep -E '^[0-9.]+( |$)' | sort -n | awk '{ v[NR] = $0 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
# Each server's median and best round of a row, from "figure round" lines.
for server in $SERVERS; do
    for row in "${ROWS[@]}"; do
        read -r _ bs _ <<<"$row"
        for jobs in $JOBS; do
            key="$server|$row|$jobs"
            by_figure=$(for round in $(seq 1 "$ROUNDS"); do
                echo "$(figure_of "${ROUND["$key|$round"]:-}" "$bs") $round"
            done | sort -n)
            RESULT[$key]=${ROUND["$key|$(median <<<"$by_figure" | cut -d' ' -f2)"]}
            BEST[$key]=${ROUND["$key|$(tail -n 1 <<<"$by_figure" | cut -d' ' -f2)"]}
        done
    done
done
for key in "${!STREAMS[@]}"; do
    # shellcheck disable=SC2086 # one stream per word
    STREAM[$key]=$(printf '%s\n' ${STREAMS[$key]} | median)
done
# A server's CPU per I/O in a row, the median of its rounds: CPU time
# moves with the machine's load more than IOPS do, and the CPU of the
# median-IOPS round is one sample of it.
cpu_median() { # server|row|jobs
    local round
    for round in $(seq 1 "$ROUNDS"); do
        IFS='|' read -r _ us _ _ _ <<<"${ROUND["$1|$round"]:-}"
        echo "$us"
    done | median
}

# openarray's figure of a row against the best peer's, from results
# named by suffix $4 ("" for the median rounds, "best" for the best
# rounds, "|N" for round N).
against_peers() { # row jobs bs suffix
    local best
    best=$(best_of peer "$1" "$2" "$3" "$4")
    ratio "$(figure_of "$(result_of "openarray|$1|$2" "$4")" "$3")" "$best"
}

# The best figure of a row among the peers ($1 = peer) or the minimal
# servers ($1 = minimal), 0 for none; results named as for against_peers.
best_of() { # peer|minimal row jobs bs suffix
    local best=0 value server
    for server in $SERVERS; do
        case "$server" in openarray) continue ;; minimal*) [ "$1" = minimal ] ;; *) [ "$1" = peer ] ;; esac || continue
        value=$(figure_of "$(result_of "$server|$2|$3" "$5")" "$4")
        [ "$value" -le "$best" ] || best=$value
    done
    echo "$best"
}

# The result of a server's row: its median round (suffix ""), its best
# (suffix "best") or round N (suffix "|N").
result_of() { # server|row|jobs suffix
    case "$2" in
    "") echo "${RESULT["$1"]:-}" ;;
    best) echo "${BEST["$1"]:-}" ;;
    *) echo "${ROUND["$1$2"]:-}" ;;
    esac
}

# Prints a table row for each row and job count: its first two cells,
# then the rest of the line from function $1, given row, jobs and bs.
table_rows() { # cells_function
    local row rw bs qd jobs
    for row in "${ROWS[@]}"; do
        read -r rw bs qd <<<"$row"
        for jobs in $JOBS; do
            printf '| %s %s QD%s | %s |' "$rw" "$bs" "$qd" "$jobs"
            "$1" "$row" "$jobs" "$bs"
        done
    done
}

# The main table's cells: each server's median round, openarray against
# the best peer, and a 1M row against the stream.
main_cells() { # row jobs bs
    local server iops us bw client busy figure stream=-
    for server in $SERVERS; do
        IFS='|' read -r iops us bw client busy <<<"${RESULT["$server|$1|$2"]}"
        figure=$iops
        [ "$3" = 4k ] || figure="$bw MiB/s"
        printf ' %s | %s | %s | %s |' "$figure" "$us" "$client" "$busy"
    done
    [ "$3" = 4k ] ||
        stream="$(ratio "$(figure_of "${RESULT["openarray|$1|$2"]:-}" "$3")" "${STREAM["$1|$2"]:-}") (${STREAM["$1|$2"]:-n/a})"
    echo " $(against_peers "$1" "$2" "$3" "") | $(against_peers "$1" "$2" "$3" best) | $stream |"
}

# The minimal server's table cells (median rounds): openarray, the best
# peer, the better minimal server, it against the best peer and openarray
# against it.
minimal_cells() { # row jobs bs
    local peer minimal own
    peer=$(best_of peer "$1" "$2" "$3" "")
    minimal=$(best_of minimal "$1" "$2" "$3" "")
    own=$(figure_of "${RESULT["openarray|$1|$2"]:-}" "$3")
    echo " $own | $peer | $minimal | $(ratio "$minimal" "$peer") | $(ratio "$own" "$minimal") | $(bar_of "$1" "$2" "$3" "$own" "$peer" "$minimal") |"
}

# Where openarray's median round stands against "1.5x the best peer where
# the client is not the limit": "met"; else what limits the row, as
# measured in this run (one job's libnbd thread near a core, 1M transfers
# near as many loopback TCP streams as jobs, or at QD1 the minimal server
# itself under 1.5x); else "missed". Given the row's median figures of
# openarray, the best peer and the better minimal server.
bar_of() { # row jobs bs own peer minimal
    local own=$4 peer=$5 versus client qd stream minimal
    versus=$(ratio "$own" "$peer")
    IFS='|' read -r _ _ _ client _ <<<"${RESULT["openarray|$1|$2"]:-}"
    read -r _ _ qd <<<"$1"
    stream=$(ratio "$own" "${STREAM["$1|$2"]:-}")
    minimal=$(ratio "$6" "$peer")
    if at_least "$versus" 1.5; then
        echo "met"
    elif [ "$2" = 1 ] && at_least "${client:-0}" 90; then
        echo "client: fio at ${client} %"
    elif [ "$3" != 4k ] && at_least "$stream" 0.9; then
        echo "TCP streams: $stream of $2"
    elif [ "$qd" = 1 ] && [ "$minimal" != n/a ] && ! at_least "$minimal" 1.5; then
        echo "no server: minimal at $minimal"
    else
        echo "missed"
    fi
}

# Whether number $1 is at least $2 ("n/a" is not).
at_least() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a ~ /^[0-9.]+$/ && a + 0 >= b + 0) }'; }

# The CPU table's cells: each server's median CPU per I/O, and
# openarray's against the cheaper peer's.
cpu_cells() { # row jobs bs
    local server us cheapest=""
    for server in $SERVERS; do
        us=$(cpu_median "$server|$1|$2")
        printf ' %s |' "${us:-n/a}"
        is_peer "$server" && [ -n "$us" ] || continue
        if [ -z "$cheapest" ] || awk -v a="$us" -v b="$cheapest" 'BEGIN { exit !(a < b) }'; then cheapest=$us; fi
    done
    echo " $(ratio "$(cpu_median "openarray|$1|$2")" "$cheapest") |"
}

# The every-round table's cells.
round_cells() { # row jobs bs
    local round
    for round in $(seq 1 "$ROUNDS"); do printf ' %s |' "$(against_peers "$1" "$2" "$3" "|$round")"; done
    echo
}

{
    echo "# NBD: openarray, qemu-nbd and nbdkit on one tmpfs file"
    echo
    echo "One run of \`bench/nbd.sh\` on $(date -u +%Y-%m-%d), $(nproc) cores"
    echo "($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), ${SECONDS_PER_RUN} s per row"
    echo "after a 1 s ramp; fio $(fio --version | sed 's/fio-//') with its nbd engine (libnbd),"
    echo "$(qemu-nbd --version | head -1), $(nbdkit --version | head -1)."
    echo "All servers ($SERVERS) run throughout; each row runs on each in turn,"
    echo "and the whole set $ROUNDS time(s), the servers' order turning each"
    echo "round. Each server's median round of a row is shown (median figure,"
    echo "with that round's CPU figures); \"best rounds\" holds openarray's best"
    echo "round against the best peer's best, and the last table gives every"
    echo "round."
    echo "IOPS (MiB/s for the 1M rows), the server's CPU time per I/O in µs"
    echo "(all its threads), fio's CPU use (usr+sys % per job, \"fio %\") and"
    echo "the whole machine's busy share (all cores, \"busy %\"): near 100, the"
    echo "cores, shared by client and server, are the limit, not the client alone."
    echo "One loopback TCP stream (iperf3, same run, ${SECONDS_PER_RUN} s): $TCP_MIBS MiB/s"
    echo "at the start; the last column holds each 1M row of N jobs against the"
    echo "median of N streams at once (N iperf3 pairs, one thread each as one"
    echo "fio job is), measured just before that row in each round (their MiB/s"
    echo "together in brackets)."
    echo "One job is one connection and one libnbd thread,"
    echo "which caps near a core's worth of client work; two and four jobs, two"
    echo "and four of each."
    echo "qemu-nbd runs \`--cache=writeback --aio=io_uring --shared=16\` (tmpfs"
    echo "refuses the O_DIRECT of \`--cache=none\`); nbdkit the file plugin with"
    echo "its defaults (parallel thread model). \"minimal\" and \"minimal-polling\""
    echo "are the least a server can do (crates/nbd-minimal-server), sleeping"
    echo "between requests or polling 50 µs first (the table after the CPU"
    echo "table)."
    echo "Load average (1, 5, 15 min)"
    echo "before the runs: $LOAD_BEFORE; after: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo
    printf '| workload | jobs |'
    for server in $SERVERS; do printf ' %s | µs/IO | fio %% | busy %% |' "$server"; done
    echo " openarray / best peer | best rounds | openarray / TCP streams |"
    printf '| --- | --- |'
    for _ in $SERVERS; do printf ' ---: | ---: | ---: | ---: |'; done
    echo " ---: | ---: | ---: |"
    table_rows main_cells
    echo
    echo "Server CPU per I/O, µs, each server's median over the rounds (all its"
    echo "threads), and openarray's against the cheaper peer's."
    echo
    printf '| workload | jobs |'
    for server in $SERVERS; do printf ' %s |' "$server"; done
    echo " openarray / cheaper peer |"
    printf '| --- | --- |'
    for _ in $SERVERS; do printf ' ---: |'; done
    echo " ---: |"
    table_rows cpu_cells
    echo
    if [[ " $SERVERS " == *" minimal"* ]]; then
        echo "The better of the two minimal servers' median rounds against the best"
        echo "peer's and openarray's. At QD1, where each request waits for the one"
        echo "before, it is about the most any server reaches here: under 1.5 in"
        echo "\"minimal / best peer\", no server is 1.5x the best peer in the row."
        echo "With many requests in flight or 1M requests it is no bound (one batch"
        echo "at a time, each write copied twice)."
        echo
        echo "The last column holds each row against the bar of 1.5x the best"
        echo "peer where the client is not the limit: met, or what limits the row"
        echo "in this run (one job's fio at 90 % of a core or more, a 1M row of N"
        echo "jobs at 0.9 of N TCP streams at once or more, a QD1 row where the"
        echo "minimal server is under 1.5x itself), or missed."
        echo
        echo "| workload | jobs | openarray | best peer | minimal | minimal / best peer | openarray / minimal | 1.5x bar |"
        echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"
        table_rows minimal_cells
        echo
    fi
    echo "Every round: openarray / best peer in that round (the same servers'"
    echo "figures of one round, taken minutes apart)."
    echo
    printf '| workload | jobs |'
    for round in $(seq 1 "$ROUNDS"); do printf ' round %s |' "$round"; done
    echo
    printf '| --- | --- |'
    for _ in $(seq 1 "$ROUNDS"); do printf ' ---: |'; done
    echo
    table_rows round_cells
} >"$BENCH_OUT"
log "report: $BENCH_OUT"
