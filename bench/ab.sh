#!/usr/bin/env bash
# A/B of openarray builds on the bench's setup (a 1 GiB file on tmpfs, one
# LUN, loopback): each build serves in turn, round after round (every other
# round in the reverse order), so every build sees the same load. Per build
# and round it prints IOPS or MB/s and the target's CPU time per I/O or per
# GB (utime+stime from /proc/PID/stat).
#
#   4K random read QD32   iscsi-perf -m 32 -b 8 -r
#   4K random read QD1    iscsi-perf -m 1 -b 8 -r (mean latency = 1 / IOPS)
#   4K write QD32         qemu-img bench -w -d 32 -s 4k (200000 writes)
#   1 MiB read QD8        iscsi-perf -m 8 -b 2048
#   1 MiB write QD8       qemu-img bench -w -d 8 -s 1M (3000 writes)
#
# Usage: bench/ab.sh BINARY... (e.g. copies of target/release/openarray)
# Environment: ROUNDS=2, SECONDS_PER_READ=8, PORT=3290
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"
[ $# -ge 1 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
ROUNDS=${ROUNDS:-2}
SECS=${SECONDS_PER_READ:-8}
PORT=${PORT:-3290}
TCK=$(getconf CLK_TCK)
IQN=iqn.2024-01.org.openarray:ab
URL="iscsi://127.0.0.1:$PORT/$IQN/0"
ab_workdir /dev/shm ab

truncate -s 1G "$WORK/lun.img"
one_lun_config "$WORK/ab.toml" "$PORT" "$IQN" "$WORK/lun.img"

cpu() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
# per UNITS_DONE CPU_TICKS SCALE: CPU seconds * SCALE / units
per() { python3 -c "print(f'{$2 / $TCK * $3 / max($1, 1):.2f}')"; }

perf_read() { # depth blocks -> "IOPS MB/s"
    iscsi-perf -m "$1" -b "$2" $3 -t "$SECS" "$URL" 2>&1 | tr '\r' '\n' |
        sed -nE 's/.*iops average ([0-9]+) \(([0-9]+) MB\/s\).*/\1 \2/p' | tail -1
}

bench_write() { # count depth size -> seconds
    local s e
    s=$(date +%s.%N)
    qemu-img bench -f raw -w -t none -c "$1" -d "$2" -s "$3" "$URL" >/dev/null 2>&1
    e=$(date +%s.%N)
    python3 -c "print($e - $s)"
}

one() {
    local bin=$1 c0 c1 r w
    serve_build "$bin" "$WORK/ab.toml" "$PORT"
    c0=$(cpu); r=$(perf_read 32 8 -r); c1=$(cpu)
    set -- $r
    echo "  4K read QD32:  $1 IOPS, $(per $(($1 * SECS)) $((c1 - c0)) 1e6) us CPU/IO"
    c0=$(cpu); r=$(perf_read 1 8 -r); c1=$(cpu)
    set -- $r
    echo "  4K read QD1:   $1 IOPS, $(python3 -c "print(f'{1e6 / max($1, 1):.1f}')") us mean latency, $(per $(($1 * SECS)) $((c1 - c0)) 1e6) us CPU/IO"
    c0=$(cpu); w=$(bench_write 200000 32 4k); c1=$(cpu)
    echo "  4K write QD32: $(python3 -c "print(int(200000 / $w))") IOPS, $(per 200000 $((c1 - c0)) 1e6) us CPU/IO"
    c0=$(cpu); r=$(perf_read 8 2048 ""); c1=$(cpu)
    set -- $r
    echo "  1M read QD8:   $2 MB/s, $(per $(($2 * SECS)) $((c1 - c0)) 1e6) ms CPU/GB"
    c0=$(cpu); w=$(bench_write 3000 8 1M); c1=$(cpu)
    echo "  1M write QD8:  $(python3 -c "print(int(3000 * 1.048576 / $w))") MB/s, $(per 3146 $((c1 - c0)) 1e6) ms CPU/GB"
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
}

for round in $(seq "$ROUNDS"); do
    mapfile -t order < <(builds_in_round "$round" "$@")
    for bin in "${order[@]}"; do
        echo "round $round, $bin (load $(cut -d' ' -f1 /proc/loadavg))"
        one "$bin"
    done
done
