#!/usr/bin/env bash
# The SSD cache tier against the devices it is made of, side by side in
# one daemon, one run:
#   LUN 0: the slow backing alone: a `delay` device over a file, set to a
#          spinning disk's figures (LATENCY, IOPS, BANDWIDTH);
#   LUN 1: a `cache` in write-back mode: a file on tmpfs, 10x smaller than
#          the backing, in front of a second slow backing like LUN 0's;
#   LUN 2: the fast device alone: a file on tmpfs.
# with fio's libiscsi engine (bench/fio-libiscsi.sh), QD DEPTH:
#   - 4K random reads, Zipf-distributed (zipf:ZIPF) over a hot set of HOT
#     bytes that fits the cache, on each LUN; on the cache: a warm-up curve
#     (IOPS and read hit ratio per interval of WARM_SECS, until an interval
#     reads WARM_HIT% from the cache, or WARM_MAX intervals), then warm;
#     the daemon's CPU time per I/O of the warm cache and the fast device;
#   - a full sequential scan of the cached LUN (1M reads) in the middle of
#     the hot-set run: the hit ratio before and after;
#   - 4K random writes (Zipf, the hot set) on the backing alone and on the
#     cache, then
#     the write-back drain rate (`openarray cache flush`);
#   - an OLTP-like mix: 8K, 70% reads, Zipf over the hot set (it fits the
#     cache) and over the whole LUN (its long tail does not), on the
#     backing alone and the cache.
# The warm-up curve and the write-back drain are plotted to cache.png
# beside BENCH_OUT (gnuplot, installed here when missing).
# The hit ratios come from `openarray cache status --json`.
#
# Usage: bench/cache.sh
# Environment (all optional):
#   SECS=10  WARM_SECS=3  WARM_MAX=40  WARM_HIT=99.9  DEPTH=32  ZIPF=1.2
#   LATENCY=8ms  IOPS=150  BANDWIDTH=150M  BACKING=1G  CACHE=100M  HOT=64M
#   OA_PORT=3260  BENCH_OUT=docs/bench/cache.md
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECS=${SECS:-10}
WARM_SECS=${WARM_SECS:-3}
WARM_MAX=${WARM_MAX:-40}
WARM_HIT=${WARM_HIT:-99.9}
DEPTH=${DEPTH:-32}
ZIPF=${ZIPF:-1.2}
LATENCY=${LATENCY:-8ms}
IOPS=${IOPS:-150}
BANDWIDTH=${BANDWIDTH:-150M}
BACKING=${BACKING:-1G}
CACHE=${CACHE:-100M}
HOT=${HOT:-64M}
OA_PORT=${OA_PORT:-3260}
BENCH_OUT=${BENCH_OUT:-$ROOT/docs/bench/cache.md}
IQN=iqn.2026-11.org.openarray:cache-bench

# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"

command -v gnuplot >/dev/null || apt_install gnuplot-nox
FIO=$("$ROOT/bench/fio-libiscsi.sh")
CLK_TCK=$(getconf CLK_TCK)
PLOT=$(dirname "$BENCH_OUT")/cache.png
BIN=${OA_BIN:-$ROOT/target/release/openarray}
[ -x "$BIN" ] || die "build it first: cargo build --release --bin openarray (or set OA_BIN)"

WORK=$(mktemp -d /dev/shm/openarray-cache-bench.XXXXXX)
PID=""
cleanup() {
    [ -z "$PID" ] || kill -9 "$PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

slow() { # name, file
    printf '[[device]]\nname = "%s_file"\nkind = "file"\npath = "%s"\nsize = "%s"\n\n' "$1" "$2" "$BACKING"
    printf '[[device]]\nname = "%s"\nkind = "delay"\nover = "%s_file"\nlatency = "%s"\niops = %s\nbandwidth = "%s"\n\n' \
        "$1" "$1" "$LATENCY" "$IOPS" "$BANDWIDTH"
}
{
    printf '[[portal]]\nlisten = "127.0.0.1:%s"\n\n' "$OA_PORT"
    slow hdd0 "$WORK/hdd0.img"
    slow hdd1 "$WORK/hdd1.img"
    printf '[[device]]\nname = "ssd"\nkind = "file"\npath = "%s"\nsize = "%s"\n\n' "$WORK/ssd.img" "$CACHE"
    printf '[[device]]\nname = "hybrid"\nkind = "cache"\ncache = "ssd"\nbacking = "hdd1"\nmode = "writeback"\n\n'
    printf '[[device]]\nname = "fast"\nkind = "file"\npath = "%s"\nsize = "%s"\n\n' "$WORK/fast.img" "$BACKING"
    target_toml "$IQN" hdd0 hybrid fast
} >"$WORK/cache.toml"
SOCK=$WORK/admin.sock

"$BIN" serve -c "$WORK/cache.toml" --admin-socket "$SOCK" --log-level warn >"$WORK/openarray.log" 2>&1 &
PID=$!
wait_for_port "$OA_PORT" "$PID" openarray

lun() { echo "iscsi\\://127.0.0.1\\:$OA_PORT/${IQN//:/\\:}/$1"; }

# fio's JSON -> "IOPS IOS": reads plus writes a second, and in all
iops() {
    python3 -c '
import json, sys
t = sys.stdin.read()
j = json.loads(t[t.index("{"):])["jobs"][0]
print(int(j["read"]["iops"] + j["write"]["iops"]), j["read"]["total_ios"] + j["write"]["total_ios"])'
}

# LUN, seconds, bytes from the start, then fio arguments -> "IOPS US":
# IOPS and the daemon's CPU time (user and system) per I/O, microseconds
fio_measure() {
    local lun=$1 secs=$2 size=$3 t0 out
    shift 3
    t0=$(cpu_ticks "$PID")
    out=$(timeout -s KILL $((secs + 60)) "$FIO" --name=b --ioengine=libiscsi --filename="$(lun "$lun")" \
        --size="$size" --iodepth="$DEPTH" --runtime="$secs" --time_based \
        --output-format=json "$@" 2>/dev/null | iops)
    set -- $out
    echo "$1 $(us_per_io $(($(cpu_ticks "$PID") - t0)) "$2")"
}
fio_iops() { fio_measure "$@" | cut -d' ' -f1; }
zipf_args() { echo --rw="$1" --bs=4k --random_distribution=zipf:"$ZIPF"; }
zipf_reads() { fio_iops "$1" "$2" "$HOT" $(zipf_args randread); }

# Read hit and miss bytes of the cache so far: "HIT MISS"
hits() {
    "$BIN" cache status hybrid --json --socket "$SOCK" | python3 -c '
import json, sys
r = json.load(sys.stdin)["status"]["reads"]
print(r["hit_bytes"], r["miss_bytes"])'
}
dirty_bytes() {
    "$BIN" cache status hybrid --json --socket "$SOCK" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["status"]["dirty_bytes"])'
}
# Hit ratio between two `hits` readings, in percent
hit_ratio() { awk -v h0="$1" -v m0="$2" -v h1="$3" -v m1="$4" \
    'BEGIN { d = (h1 - h0) + (m1 - m0); if (d > 0) printf "%.1f", 100 * (h1 - h0) / d; else print "n/a" }'; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
log "backing alone: Zipf 4K reads"
HDD_READ=$(zipf_reads 0 "$SECS")
log "fast device alone: Zipf 4K reads"
read -r FAST_READ FAST_US <<<"$(fio_measure 2 "$SECS" "$HOT" $(zipf_args randread))"

log "cache: warm-up, until an interval reads $WARM_HIT% from the cache"
CURVE=""
WARM_TIME=""
: >"$WORK/warmup.tsv"
set -- $(hits)
for step in $(seq 1 "$WARM_MAX"); do
    n=$(zipf_reads 1 "$WARM_SECS")
    set -- "$@" $(hits)
    r=$(hit_ratio "$1" "$2" "$3" "$4")
    shift 2
    CURVE+="| $((step * WARM_SECS)) | $n | $r |"$'\n'
    printf '%s\t%s\t%s\n' "$((step * WARM_SECS))" "$n" "$r" >>"$WORK/warmup.tsv"
    if awk -v r="$r" -v w="$WARM_HIT" 'BEGIN { exit !(r + 0 >= w) }'; then
        WARM_TIME=$((step * WARM_SECS))
        break
    fi
done
WARM_TIME=${WARM_TIME:-"more than $((WARM_MAX * WARM_SECS))"}
log "cache: warm Zipf 4K reads"
set -- $(hits)
read -r CACHE_READ CACHE_US <<<"$(fio_measure 1 "$SECS" "$HOT" $(zipf_args randread))"
set -- "$@" $(hits)
BEFORE_SCAN=$(hit_ratio "$@")

log "cache: a full sequential scan"
SCAN_START=$(date +%s.%N)
timeout -s KILL 600 "$FIO" --name=scan --ioengine=libiscsi --filename="$(lun 1)" --size="$BACKING" \
    --rw=read --bs=1M --iodepth=4 --output-format=json >/dev/null 2>&1
SCAN_SECS=$(since "$SCAN_START")
set -- $(hits)
AFTER_READ=$(zipf_reads 1 "$SECS")
set -- "$@" $(hits)
AFTER_SCAN=$(hit_ratio "$@")

log "random 4K writes (Zipf)"
HDD_WRITE=$(fio_iops 0 "$SECS" "$HOT" $(zipf_args randwrite))
CACHE_WRITE=$(fio_iops 1 "$SECS" "$HOT" $(zipf_args randwrite))
log "write-back drain"
DIRTY=$(dirty_bytes)
DRAIN_START=$(date +%s.%N)
"$BIN" cache flush hybrid --socket "$SOCK" >/dev/null &
FLUSH=$!
# The drain curve: dirty bytes left over time while the flush runs.
: >"$WORK/drain.tsv"
while kill -0 "$FLUSH" 2>/dev/null; do
    printf '%s\t%s\n' "$(since "$DRAIN_START")" "$(dirty_bytes)" >>"$WORK/drain.tsv"
    sleep 0.25
done
wait "$FLUSH"
DRAIN_SECS=$(since "$DRAIN_START")
printf '%s\t%s\n' "$DRAIN_SECS" "$(dirty_bytes)" >>"$WORK/drain.tsv"
DRAIN_RATE=$(awk -v d="$DIRTY" -v s="$DRAIN_SECS" 'BEGIN { if (s > 0) printf "%.1f", d / s / 1048576; else print "n/a" }')

log "OLTP-like 8K mix, 70% reads"
oltp() { fio_iops "$1" "$SECS" "$2" --rw=randrw --rwmixread=70 --bs=8k --random_distribution=zipf:"$ZIPF"; }
HDD_OLTP_HOT=$(oltp 0 "$HOT")
CACHE_OLTP_HOT=$(oltp 1 "$HOT")
HDD_OLTP=$(oltp 0 "$BACKING")
CACHE_OLTP=$(oltp 1 "$BACKING")

STATUS=$("$BIN" cache status hybrid --socket "$SOCK")
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

log "plotting $PLOT"
mkdir -p "$(dirname "$BENCH_OUT")"
gnuplot <<EOF
set terminal pngcairo size 1100,420 font 'sans,10'
set output '$PLOT'
set multiplot layout 1,2 title 'bench/cache.sh: a $CACHE cache on tmpfs in front of a $BACKING backing ($LATENCY, $IOPS IOPS)'
set title 'Warm-up: Zipf $ZIPF 4K reads over the first $HOT, QD$DEPTH'
set xlabel 'seconds'
set ylabel 'IOPS'
set y2label 'read hit ratio %'
set ytics nomirror
set y2tics
set yrange [0:*]
set y2range [0:100]
set key bottom right
plot '$WORK/warmup.tsv' using 1:2 with linespoints title 'IOPS', \
     '' using 1:3 axes x1y2 with linespoints title 'read hit ratio %'
set title 'Write-back drain: cache flush after the 4K writes'
unset y2label
unset y2tics
set ytics mirror
set ylabel 'dirty MiB left'
set key top right
plot '$WORK/drain.tsv' using 1:(\$2/1048576) with linespoints title 'dirty MiB'
unset multiplot
EOF

cat >"$BENCH_OUT" <<EOF
# SSD cache tier: measured

Produced by \`bench/cache.sh\` on $(date -u +%Y-%m-%d) ($(nproc) CPUs, shared with other
work: load average $LOAD_START at the start, $LOAD_END at the end). One daemon
serves three LUNs side by side: the slow backing alone (a \`delay\` device
over a file: latency $LATENCY, at most $IOPS IOPS and $BANDWIDTH/s, like a
spinning disk), a write-back \`cache\` of $CACHE on tmpfs in front of a
second such backing of $BACKING, and the fast device alone (a file on
tmpfs). fio $("$FIO" --version) with the libiscsi engine, queue depth
$DEPTH, $SECS s a run. Reads and writes are Zipf $ZIPF over a hot set of
the first $HOT (it fits the cache); the OLTP mix runs over that hot set and
over the whole LUN, whose long tail does not fit.

| workload | backing alone | cache | fast alone | cache / backing | cache / fast |
| --- | ---: | ---: | ---: | ---: | ---: |
| 4K random reads (warm) | $HDD_READ | $CACHE_READ | $FAST_READ | $(ratio "$CACHE_READ" "$HDD_READ") | $(ratio "$CACHE_READ" "$FAST_READ") |
| 4K random writes (write-back) | $HDD_WRITE | $CACHE_WRITE | | $(ratio "$CACHE_WRITE" "$HDD_WRITE") | |
| 8K OLTP mix, 70% reads, hot set | $HDD_OLTP_HOT | $CACHE_OLTP_HOT | | $(ratio "$CACHE_OLTP_HOT" "$HDD_OLTP_HOT") | |
| 8K OLTP mix, 70% reads, whole LUN | $HDD_OLTP | $CACHE_OLTP | | $(ratio "$CACHE_OLTP" "$HDD_OLTP") | |

IOPS. The warm figure is taken once the hot set is resident: the cold
cache warmed up in $WARM_TIME s (the first interval of $WARM_SECS s that read
at least $WARM_HIT% from the cache; curve below). The daemon's CPU time per
4K read (user and system, robust to the load): $CACHE_US µs from the warm
cache, $FAST_US µs from the fast device alone.

Scan resistance: the read hit ratio of the hot-set run was
$BEFORE_SCAN% before a full sequential scan of the cached LUN (1M reads,
$SCAN_SECS s) and $AFTER_SCAN% after it ($AFTER_READ IOPS after).
Write-back drain: $DIRTY dirty bytes written back by \`cache flush\` in
$DRAIN_SECS s ($DRAIN_RATE MiB/s).

![warm-up and write-back drain](cache.png)

Warm-up (Zipf 4K reads on the cold cache, $WARM_SECS s intervals):

| seconds | IOPS | read hit ratio % |
| ---: | ---: | ---: |
$CURVE
The cache at the end:

\`\`\`
$STATUS
\`\`\`
EOF
log "wrote $BENCH_OUT and $PLOT"
