#!/usr/bin/env bash
# What open web consoles cost the data path: 4K random read QD32
# (iscsi-perf -m 32 -b 8 -r) on one LUN over a 1 GiB file on tmpfs, with
# no console open and with CONSOLES consoles' live streams open
# (GET /console/api/v1/stats/live, one sample a second each, as a browser tab holds
# it), alternating round after round on one daemon. Prints IOPS and the
# daemon's CPU per I/O for each.
#
# Usage: bench/console.sh [BINARY]   (default target/release/openarray)
# Environment: ROUNDS=3, SECONDS_PER_READ=8, CONSOLES=5, PORT=3296
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"
BIN=${1:-$ROOT/target/release/openarray}
ROUNDS=${ROUNDS:-3}
SECS=${SECONDS_PER_READ:-8}
CONSOLES=${CONSOLES:-5}
PORT=${PORT:-3296}
API_PORT=$((PORT + 1))
TCK=$(getconf CLK_TCK)
IQN=iqn.2024-01.org.openarray:console-bench
URL="iscsi://127.0.0.1:$PORT/$IQN/0"
ab_workdir /dev/shm console

truncate -s 1G "$WORK/lun.img"
one_lun_config "$WORK/oa.toml" "$PORT" "$IQN" "$WORK/lun.img"
head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$WORK/token"
chmod 600 "$WORK/token"
{
    printf '\n[daemon]\napi_listen = "127.0.0.1:%s"\napi_token_file = "%s"\n' "$API_PORT" "$WORK/token"
    # Every console holds one API connection from this address.
    printf 'max_logins_per_source = %s\n' $((CONSOLES + 8))
} >>"$WORK/oa.toml"
serve_build "$BIN" "$WORK/oa.toml" "$PORT"
wait_for_port "$API_PORT" "$PID" openarray

cpu() { awk '{print $14 + $15}' "/proc/$PID/stat"; }

read_qd32() { # -> IOPS
    iscsi-perf -m 32 -b 8 -r -t "$SECS" "$URL" 2>&1 | tr '\r' '\n' |
        sed -nE 's/.*iops average ([0-9]+) \(([0-9]+) MB\/s\).*/\1/p' | tail -1
}

STREAMS=""
open_consoles() {
    local i jar
    for i in $(seq "$CONSOLES"); do
        jar="$WORK/cookies.$i"
        curl -s -o /dev/null -c "$jar" --data-urlencode "token=$(cat "$WORK/token")" \
            "http://127.0.0.1:$API_PORT/console/login"
        grep -q openarray_console "$jar" || die "console login refused"
        curl -s -N -b "$jar" -o "$WORK/events.$i" "http://127.0.0.1:$API_PORT/console/api/v1/stats/live" &
        STREAMS="$STREAMS $!"
    done
    CHILDREN="$STREAMS"
    sleep 2
}
close_consoles() {
    kill_children || true
    STREAMS=""
}

one() { # label
    local c0 c1 iops
    c0=$(cpu)
    iops=$(read_qd32)
    c1=$(cpu)
    python3 -c "print(f'  {\"$1\":<22} {$iops:>8} IOPS  {($c1 - $c0) / $TCK * 1e6 / max($iops * $SECS, 1):.2f} us CPU/IO')"
}

echo "4K random read QD32, ${SECS}s per run, $CONSOLES consoles' live streams against none"
for round in $(seq "$ROUNDS"); do
    echo "round $round (load $(cut -d' ' -f1 /proc/loadavg))"
    if [ $((round % 2)) -eq 1 ]; then
        one "no console"
        open_consoles
        one "$CONSOLES consoles open"
        close_consoles
    else
        open_consoles
        one "$CONSOLES consoles open"
        close_consoles
        one "no console"
    fi
done
lines=$(cat "$WORK"/events.* | grep -c '^data:' || true)
echo "event stream lines received: $lines"
