#!/usr/bin/env bash
# Heap allocations the target makes per command: libc's malloc, calloc
# and realloc counted with uprobes (perf probe) over 100,000 4 KiB reads
# and then 100,000 4 KiB writes at QD32 (qemu-img bench), per build. Unlike
# IOPS on a shared machine, the count barely moves from run to run (what
# the daemon allocates besides commands, such as logins and timers, adds
# up to a few tenths per command).
#
# Usage: bench/allocations.sh BINARY... (e.g. copies of target/release/openarray)
# Environment: COUNT=100000, PORT=3291
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"
[ $# -ge 1 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
COUNT=${COUNT:-100000}
PORT=${PORT:-3291}
IQN=iqn.2024-01.org.openarray:allocations
URL="iscsi://127.0.0.1:$PORT/$IQN/0"
command -v perf >/dev/null || apt_install linux-perf
command -v qemu-img >/dev/null || apt_install qemu-utils
LIBC=$(ldconfig -p | awk '/libc\.so\.6 .*x86-64/ { print $NF; exit }')
[ -n "$LIBC" ] || die "no 64-bit libc.so.6 found"
for fn in malloc calloc realloc; do
    perf probe -q -x "$LIBC" -a "oa_$fn=$fn" 2>/dev/null || true
done
ab_workdir /dev/shm allocations
truncate -s 1G "$WORK/lun.img"
one_lun_config "$WORK/allocations.toml" "$PORT" "$IQN" "$WORK/lun.img"

for bin in "$@"; do
    serve_build "$bin" "$WORK/allocations.toml" "$PORT"
    for mode in read write; do
        flag=""
        [ "$mode" = read ] || flag=-w
        # Counting stops when the workload (sleep) does.
        perf stat -x, -e 'probe_libc:oa_*' -p "$PID" -o "$WORK/stat" -- sleep 3600 2>/dev/null &
        STAT=$!
        sleep 0.5
        qemu-img bench -f raw -t none $flag -c "$COUNT" -d 32 -s 4k "$URL" >/dev/null
        pkill -P "$STAT" -x sleep || true
        wait "$STAT" 2>/dev/null || true
        echo "$bin 4K $mode: $(awk -F, -v n="$COUNT" '/probe_libc/ { s += $1 } END { printf "%.2f", s / n }' "$WORK/stat") allocations per command"
    done
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
done
