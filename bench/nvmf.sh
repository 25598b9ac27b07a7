#!/usr/bin/env bash
# NVMe/TCP against iSCSI on one daemon and one RAM device: the device
# (`kind = "mem"`) is LUN 0 of a target and namespace 1 of a subsystem of
# the same `openarray serve`, and the project's own initiators drive both
# (`openarray bench`: the built-in iSCSI initiator, one session keeping the
# whole depth, and the built-in NVMe/TCP host, the depth spread over I/O
# queues as a host spreads it over its CPUs, one TCP connection each):
#   - 4K randread and randwrite at QD 32,
#   - 1M sequential read and write at QD 8,
# with IOPS, MB/s and the daemon's CPU time per I/O (utime+stime of the
# daemon, all threads, from /proc/PID/stat before and after each run over
# the I/Os the run completed), the clients' own CPU (as `openarray bench`
# measures it with getrusage) and the whole machine's busy share, to tell
# which side filled the cores. Client and daemon share the machine's cores:
# with two, a busy client takes what the server could have had.
#
# Each row runs on both transports in turn, the order turning each round,
# ROUNDS times; the report keeps each transport's median round of a row
# (median IOPS, with that round's CPU figures) and lists every round's
# ratios, so a run shows how far the figures move on a shared machine.
# CLIENTS="1 2" runs each row with one client process and again with two
# at once (the IOPS summed), for when one client process is the limit.
#
# Usage: bench/nvmf.sh
# Environment (all optional):
#   SECONDS_PER_RUN=8   length of each run
#   ROUNDS=3            times the whole set runs
#   CLIENTS="1 2"       client processes per row, each its own set
#   SIZE=1G             the RAM device's size
#   OPENARRAY=PATH      a built openarray (default: cargo build --release)
#   BENCH_OUT=docs/bench/nvmf.md  where the report goes
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_PER_RUN=${SECONDS_PER_RUN:-8}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-"1 2"}
SIZE=${SIZE:-1G}
BENCH_OUT=${BENCH_OUT:-$ROOT/docs/bench/nvmf.md}
CLK_TCK=$(getconf CLK_TCK)
IQN=iqn.2026-11.org.openarray.bench:nvmf
NQN=nqn.2026-11.org.openarray.bench:nvmf
COMMAND="bench/nvmf.sh (SECONDS_PER_RUN=$SECONDS_PER_RUN ROUNDS=$ROUNDS CLIENTS=\"$CLIENTS\" SIZE=$SIZE)"

# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/openarray-nvmf-bench.XXXXXX")
OA_PID=""
trap cleanup_openarray EXIT

if [ -z "${OPENARRAY:-}" ]; then
    log "building openarray (release)"
    (cd "$ROOT" && cargo build --release --quiet -p openarray --bin openarray)
    TARGET=$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    OPENARRAY=$TARGET/release/openarray
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

ISCSI_PORT=$(free_port)
NVMF_PORT=$(free_port)
cat >"$WORK/openarray.toml" <<EOF
[[portal]]
listen = "127.0.0.1:$ISCSI_PORT"

[[device]]
name = "d"
kind = "mem"
size = "$SIZE"

[[target]]
name = "$IQN"
[[target.lun]]
lun = 0
device = "d"

[nvmf]
listen = ["127.0.0.1:$NVMF_PORT"]

[[nvmf.subsystem]]
nqn = "$NQN"
allow_hosts = ["*"]

[[nvmf.subsystem.namespace]]
nsid = 1
device = "d"
EOF
"$OPENARRAY" serve -c "$WORK/openarray.toml" --admin-socket none --log-level warn \
    >"$WORK/openarray.log" 2>&1 &
OA_PID=$!
wait_for_port "$ISCSI_PORT" "$OA_PID" openarray
wait_for_port "$NVMF_PORT" "$OA_PID" openarray

declare -A URL=(
    [iscsi]="iscsi://127.0.0.1:$ISCSI_PORT/$IQN/0"
    [nvme]="nvme+tcp://127.0.0.1:$NVMF_PORT/$NQN/1"
)
ROWS=("randread 32" "randwrite 32" "seqread 8" "seqwrite 8")
RESULTS=$WORK/results
: >"$RESULTS"

# One run of row "$1 $2" over transport $3 with $4 client processes:
# appends "pattern|qd|clients|transport|round|iops|MB/s|server µs/IO|
# server %|client %|machine %" to RESULTS.
run_one() {
    local pattern=$1 qd=$2 transport=$3 clients=$4 round=$5 c before after busy0 all0 busy1 all1
    local -a pids=()
    rm -rf "$WORK"/out-*
    read -r busy0 all0 < <(machine_ticks)
    before=$(cpu_ticks "$OA_PID")
    local start=$SECONDS
    for c in $(seq 1 "$clients"); do
        "$OPENARRAY" bench "${URL[$transport]}" --patterns "$pattern" --depths "$qd" \
            --runtime "$SECONDS_PER_RUN" --destroy-data --out "$WORK/out-$c" \
            >"$WORK/client-$c.log" 2>&1 &
        pids+=("$!")
    done
    for c in "${pids[@]}"; do
        wait "$c" || die "openarray bench failed: $(cat "$WORK"/client-*.log)"
    done
    after=$(cpu_ticks "$OA_PID")
    read -r busy1 all1 < <(machine_ticks)
    python3 - "$WORK" "$clients" "$((after - before))" "$CLK_TCK" "$((busy1 - busy0))" \
        "$((all1 - all0))" "$((SECONDS - start))" <<'PY' >>"$RESULTS.tmp"
import json, sys
work, clients, ticks, hz, busy, total, wall = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:])
iops = mbps = ios = client = 0.0
for c in range(1, clients + 1):
    m = json.load(open(f"{work}/out-{c}/results.json"))["rows"][0]["measured"][0]
    iops += m["iops"]; mbps += m["bytes_per_sec"] / 1e6; ios += m["ios"]; client += m["client_cpu_pct"]
# The daemon's CPU over the whole command (connect, guard rail, load) per
# completed I/O; its share of one core over the command's wall time.
us = ticks / hz * 1e6 / ios if ios else float("nan")
print(f"{iops:.0f}|{mbps:.1f}|{us:.1f}|{100 * ticks / hz / max(wall, 1):.0f}|{client:.0f}|{100 * busy / total if total else 0:.0f}")
PY
    echo "$pattern|$qd|$clients|$transport|$round|$(tail -1 "$RESULTS.tmp")" >>"$RESULTS"
    log "$pattern QD$qd ×$clients $transport round $round: $(tail -1 "$RESULTS.tmp")"
}

for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) -eq 1 ]; then order="nvme iscsi"; else order="iscsi nvme"; fi
    for clients in $CLIENTS; do
        for row in "${ROWS[@]}"; do
            read -r pattern qd <<<"$row"
            for transport in $order; do run_one "$pattern" "$qd" "$transport" "$clients" "$round"; done
        done
    done
done

# The host side: what a real NVMe/TCP host would need here.
if [ -d "/sys/module/nvme_tcp" ] || modprobe -n nvme_tcp 2>/dev/null; then
    HOSTS="the kernel's nvme_tcp module is available (not driven by this script yet)"
else
    HOSTS="no kernel nvme_tcp module (no /sys/module/nvme_tcp, no modprobe)"
fi
if command -v spdk_nvme_perf >/dev/null || command -v perf_nvme >/dev/null; then
    HOSTS="$HOSTS; SPDK's perf is installed (not driven by this script yet)"
else
    HOSTS="$HOSTS; no SPDK perf"
fi

CPU_MODEL=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
python3 - "$RESULTS" "$BENCH_OUT" "$COMMAND" "$(nproc)" "$CPU_MODEL" "$(uname -r)" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" "$HOSTS" <<'PY'
import statistics, sys
from collections import defaultdict
results, out, command, cores, cpu, kernel, commit, hosts = sys.argv[1:]
runs = defaultdict(list)
for line in open(results):
    p, qd, clients, t, rnd, iops, mbps, us, srv, cli, mach = line.strip().split("|")
    runs[(p, int(qd), int(clients), t)].append(
        dict(round=int(rnd), iops=float(iops), mbps=float(mbps), us=float(us),
             server=float(srv), client=float(cli), machine=float(mach)))
def median(rs):
    s = sorted(rs, key=lambda r: r["iops"])
    return s[(len(s) - 1) // 2]
label = {"randread": "4K randread", "randwrite": "4K randwrite", "seqread": "1M seqread", "seqwrite": "1M seqwrite"}
keys = sorted({k[:3] for k in runs}, key=lambda k: (k[2], list(label).index(k[0])))
lines = []
lines.append("| row | clients | NVMe/TCP IOPS | MB/s | server µs/IO | iSCSI IOPS | MB/s | server µs/IO | IOPS nvme/iscsi | CPU/IO nvme/iscsi | bars | limit |")
lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
per_round = []
for p, qd, c in keys:
    n, i = runs.get((p, qd, c, "nvme")), runs.get((p, qd, c, "iscsi"))
    if not n or not i:
        continue
    mn, mi = median(n), median(i)
    r_iops, r_cpu = mn["iops"] / mi["iops"], mn["us"] / mi["us"]
    ok = "met" if r_iops >= 1.0 and r_cpu <= 0.8 else "not met"
    worst = max(mn["machine"], mi["machine"])
    if worst >= 90:
        limit = (f"cores full ({worst:.0f}% busy); daemon {mn['server']:.0f}%/{mi['server']:.0f}%, "
                 f"clients {mn['client']:.0f}%/{mi['client']:.0f}% of a core (nvme/iscsi)")
    else:
        limit = (f"round trips ({worst:.0f}% busy); daemon {mn['server']:.0f}%/{mi['server']:.0f}%, "
                 f"clients {mn['client']:.0f}%/{mi['client']:.0f}% (nvme/iscsi)")
    lines.append(f"| {label[p]} QD{qd} | {c} | {mn['iops']:.0f} | {mn['mbps']:.0f} | {mn['us']:.1f} | "
                 f"{mi['iops']:.0f} | {mi['mbps']:.0f} | {mi['us']:.1f} | {r_iops:.2f} | {r_cpu:.2f} | {ok} | {limit} |")
    by_round = {r["round"]: r for r in i}
    pairs = [f"{r['iops'] / by_round[r['round']]['iops']:.2f} / {r['us'] / by_round[r['round']]['us']:.2f}"
             for r in sorted(n, key=lambda r: r["round"]) if r["round"] in by_round]
    per_round.append(f"| {label[p]} QD{qd} | {c} | {', '.join(pairs)} |")
table = "\n".join(lines)
print(table)
doc = f"""# NVMe/TCP against iSCSI on one RAM device

Produced by `{command}` at commit {commit}: one `openarray serve` (release
build) with one RAM device (`kind = "mem"`) exported as iSCSI LUN 0 and as
NVMe/TCP namespace 1, driven by the project's own initiators through
`openarray bench` on the same machine (loopback TCP): the built-in iSCSI
initiator (one session keeping the whole depth) and the built-in NVMe/TCP
host (the depth spread over I/O queues, one TCP connection each: as many
queues as cores, as the Linux host has one per CPU). Each row ran on both
transports in turn, the order turning each round; the figures are each
transport's median round by IOPS, with that round's CPU figures.

Machine: {cores} cores ({cpu}), kernel {kernel}, shared with other work
(builds and test runs) while this ran: the clients and the daemon share
the same cores, so a client's CPU is CPU the daemon does not get, and the
load of others moves the figures between rounds (see the per-round ratios).

Server µs/IO is the daemon's CPU time (utime+stime of all its threads,
from /proc/PID/stat) over the whole client command, connection set-up
included, divided by the I/Os the command completed. The bars of the
issue: NVMe/TCP's server CPU per I/O at most 0.8x iSCSI's, and its IOPS at
least iSCSI's. "limit" gives the machine's busy share (all processes,
both cores) and the daemon's and the clients' share of one core.

{table}

Ratios per round (IOPS nvme/iscsi / CPU per I/O nvme/iscsi):

| row | clients | rounds |
|---|---|---|
""" + "\n".join(per_round) + f"""

Real NVMe/TCP hosts: {hosts} on this machine (a container without kernel
modules), so no run with Linux's `nvme_tcp` or SPDK's perf is recorded here.
"""
open(out, "w").write(doc)
PY
log "report: $BENCH_OUT"
