#!/usr/bin/env bash
# One run: the same RBD image of a one-node Ceph cluster served over iSCSI
# by openarray and by tgt's rbd backing store (tgt-rbd), both driven by
# fio's libiscsi engine, beside fio's own rbd engine (librbd straight to
# the cluster, no gateway) as the limit. 4K random read and write at QD 1
# and 32, 1M sequential read and write at QD 8; IOPS, mean latency and the
# gateway's CPU per I/O. Also the iSCSI hop alone (the same initiator and
# daemon to a RAM disk at QD 1), the least any gateway adds to librbd's
# latency here, and the whole machine's busy share and CPU per I/O in
# each run, which set the IOPS where the cores are all busy. Writes the
# report to docs/bench/rbd.md (or $1).
#
# Starts its own cluster with scripts/ceph-fixture.sh, installs tgt-rbd
# and builds fio with libiscsi (bench/fio-libiscsi.sh) when missing.
#   RUNTIME=15   seconds per run
#   OPENARRAY=…  the openarray binary (default: target/release/openarray)
#   TGT_CONTROL=N  tgtd's control port (default: the first free one)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/common.sh
. "$ROOT/bench/common.sh"

OUT=${1:-$ROOT/docs/bench/rbd.md}
RUNTIME=${RUNTIME:-15}
OPENARRAY=${OPENARRAY:-$ROOT/target/release/openarray}
CLK_TCK=$(getconf CLK_TCK)
SPAN=1G # the part of the image every run works on
IQN=iqn.2026-11.org.openarray:bench-rbd
TGT_IQN=iqn.2026-11.org.openarray:bench-rbd-tgt
IMAGE=bench
WORK=$(mktemp -d /tmp/openarray-rbd-bench.XXXXXX)
CEPH=$WORK/ceph
GATEWAY_PID=""

cleanup() {
    kill_children
    [ -z "$GATEWAY_PID" ] || stop_process "$GATEWAY_PID" || true
    "$ROOT/scripts/ceph-fixture.sh" stop "$CEPH" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

[ -x "$OPENARRAY" ] || die "no $OPENARRAY (cargo build --release, or set OPENARRAY)"
dpkg -s tgt-rbd >/dev/null 2>&1 || apt_install tgt tgt-rbd
FIO_ISCSI=$(bash "$ROOT/bench/fio-libiscsi.sh") || die "cannot build fio with the libiscsi engine"
fio --enghelp 2>/dev/null | grep -qx '[[:space:]]*rbd' || die "Debian's fio has no rbd engine here"

# tgtd's control port is a number naming its management socket,
# /var/run/tgtd/socket.N; a running tgtd holds a lock on socket.N.lock. The
# first N that no running tgtd holds, after removing the socket and lock
# file a killed one left behind.
tgt_control_port() {
    python3 - <<'PY'
import fcntl, os, sys
for n in range(77, 1000):
    lock = f"/var/run/tgtd/socket.{n}.lock"
    try:
        fd = os.open(lock, os.O_WRONLY)
    except FileNotFoundError:
        print(n)
        sys.exit(0)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1)
    except OSError:
        os.close(fd)
        continue  # a running tgtd
    os.close(fd)
    for stale in (lock, f"/var/run/tgtd/socket.{n}"):
        try:
            os.unlink(stale)
        except FileNotFoundError:
            pass
    print(n)
    sys.exit(0)
sys.exit(1)
PY
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
log "starting the Ceph cluster"
CEPH_FIXTURE_PORT=$(free_port) "$ROOT/scripts/ceph-fixture.sh" start "$CEPH" >/dev/null
eval "$("$ROOT/scripts/ceph-fixture.sh" env "$CEPH")"
rbd_tool() { rbd -c "$OPENARRAY_CEPH_CONF" --name "$OPENARRAY_CEPH_CLIENT" --keyring "$OPENARRAY_CEPH_KEYRING" "$@"; }
rbd_tool create --size 4G "$OPENARRAY_CEPH_POOL/$IMAGE"

RESULTS=()
# system workload iops lat_us gateway_us_per_io
record() {
    RESULTS+=("$*")
    log "$*"
}

# fio's JSON: IOPS, mean completion latency in µs and I/Os done.
parse_fio() {
    python3 -c '
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
iops = lat = ios = 0
for d in ("read", "write"):
    p = job[d]
    if p["total_ios"]:
        iops, lat, ios = p["iops"], p["clat_ns"]["mean"] / 1000, p["total_ios"]
print(f"{iops:.0f} {lat:.0f} {ios}")' "$1"
}

WORKLOADS=(randread:4k:1 randread:4k:32 randwrite:4k:1 randwrite:4k:32 read:1m:8 write:1m:8)

# fio's name for an iSCSI LUN: its URL with every colon escaped.
fio_lun() { echo "iscsi://127.0.0.1:$1/$2/$3" | sed 's/:/\\:/g'; }

# fio against one system: rbd (the engine), or an iSCSI URL with the
# gateway's pid, whose CPU time is counted. Also the whole machine's CPU
# (the cluster, the initiator and the gateway): how busy it was, and its
# CPU time per I/O.
run_all() { # system engine-args... (the gateway's pid in GATEWAY_PID; WORKLOADS)
    local system=$1 w rw bs qd out t0 t1 c0 c1 iops lat ios busy0 all0 busy1 all1 machine
    shift
    for w in "${WORKLOADS[@]}"; do
        IFS=: read -r rw bs qd <<<"$w"
        out="$WORK/$system-$rw-$bs-$qd.json"
        t0=0
        [ -z "$GATEWAY_PID" ] || t0=$(cpu_ticks "$GATEWAY_PID")
        children_cpu_ms c0
        read -r busy0 all0 < <(machine_ticks)
        run_child timeout $((RUNTIME + 60)) "$@" --name="$rw" --rw="$rw" --bs="$bs" --iodepth="$qd" \
            --size="$SPAN" --time_based --runtime="$RUNTIME" --output-format=json --output="$out" \
            >/dev/null 2>"$out.err" || die "fio $rw $bs QD$qd against $system: $(tail -2 "$out.err")"
        read -r busy1 all1 < <(machine_ticks)
        read -r iops lat ios < <(parse_fio "$out")
        machine="$(awk -v b=$((busy1 - busy0)) -v a=$((all1 - all0)) 'BEGIN { printf "%.0f", a ? 100 * b / a : 0 }') $(us_per_io $((busy1 - busy0)) "$ios")"
        if [ -n "$GATEWAY_PID" ]; then
            t1=$(cpu_ticks "$GATEWAY_PID")
            record "$system $rw-$bs-qd$qd $iops $lat $(us_per_io $((t1 - t0)) "$ios") $machine"
        else
            # No gateway: the CPU of fio's own process, librbd's threads
            # included, which is what librbd costs a client per I/O.
            children_cpu_ms c1
            record "$system $rw-$bs-qd$qd $iops $lat $(CLK_TCK=1000 us_per_io $((c1 - c0)) "$ios") $machine"
        fi
    done
}

FIO_RBD=(fio --ioengine=rbd --clientname="${OPENARRAY_CEPH_CLIENT#client.}" --pool="$OPENARRAY_CEPH_POOL" --rbdname="$IMAGE")
log "filling the first $SPAN of the image"
run_child "${FIO_RBD[@]}" --name=fill --rw=write --bs=4m --iodepth=8 --size="$SPAN" >/dev/null

log "fio's rbd engine"
run_all fio-rbd "${FIO_RBD[@]}"
# The same with librbd set as openarray sets it (docs/rbd.md): the
# writeback cache policy from the first write, where librbd's default is
# writearound. A gateway over librbd cannot beat this.
log "fio's rbd engine with openarray's librbd settings"
export CEPH_ARGS="--rbd_cache_policy=writeback --rbd_cache_writethrough_until_flush=false"
run_all fio-rbd-wb "${FIO_RBD[@]}"
unset CEPH_ARGS

log "openarray"
PORT=$(free_port)
cat >"$WORK/openarray.toml" <<EOF
[[portal]]
listen = "127.0.0.1:$PORT"

[[device]]
name = "bench"
kind = "rbd"
pool = "$OPENARRAY_CEPH_POOL"
image = "$IMAGE"
ceph_conf = "$OPENARRAY_CEPH_CONF"
client = "$OPENARRAY_CEPH_CLIENT"
keyring = "$OPENARRAY_CEPH_KEYRING"

[[target]]
name = "$IQN"

[[target.lun]]
lun = 0
device = "bench"

# The iSCSI hop alone, to memory: the least a gateway adds to librbd here.
[[device]]
name = "ram"
kind = "mem"
size = "1G"

[[target.lun]]
lun = 1
device = "ram"
EOF
"$OPENARRAY" serve -c "$WORK/openarray.toml" --admin-socket none --log-level warn >"$WORK/openarray.log" 2>&1 &
GATEWAY_PID=$!
wait_for_port "$PORT" "$GATEWAY_PID" openarray
run_all openarray "$FIO_ISCSI" --ioengine=libiscsi --filename="$(fio_lun "$PORT" "$IQN" 0)"
ALL_WORKLOADS=("${WORKLOADS[@]}")
WORKLOADS=(randread:4k:1 randwrite:4k:1)
run_all iscsi-to-ram "$FIO_ISCSI" --ioengine=libiscsi --filename="$(fio_lun "$PORT" "$IQN" 1)"
WORKLOADS=("${ALL_WORKLOADS[@]}")
stop_process "$GATEWAY_PID" || true
GATEWAY_PID=""

log "tgt with its rbd backing store"
PORT=$(free_port)
CONTROL=${TGT_CONTROL:-$(tgt_control_port)} || die "no free tgtd control port"
tgtd -f -C "$CONTROL" --iscsi "portal=127.0.0.1:$PORT" >"$WORK/tgt.log" 2>&1 &
GATEWAY_PID=$!
for _ in $(seq 1 100); do
    [ -S "/var/run/tgtd/socket.$CONTROL" ] && break
    sleep 0.1
done
adm=(tgtadm -C "$CONTROL" --lld iscsi)
"${adm[@]}" --op new --mode target --tid 1 -T "$TGT_IQN"
"${adm[@]}" --op new --mode logicalunit --tid 1 --lun 1 --bstype rbd \
    --backing-store "$OPENARRAY_CEPH_POOL/$IMAGE" \
    --bsopts "conf=$OPENARRAY_CEPH_CONF;id=${OPENARRAY_CEPH_CLIENT#client.}"
"${adm[@]}" --op bind --mode target --tid 1 -I ALL
wait_for_port "$PORT" "$GATEWAY_PID" tgt
run_all tgt-rbd "$FIO_ISCSI" --ioengine=libiscsi --filename="$(fio_lun "$PORT" "$TGT_IQN" 1)"
stop_process "$GATEWAY_PID" || true # tgtd ends by SIGKILL
rm -f "/var/run/tgtd/socket.$CONTROL" "/var/run/tgtd/socket.$CONTROL.lock"
GATEWAY_PID=""

# The report: one row per workload, the three systems side by side.
figure() { # system workload field(3 iops, 4 latency, 5 cpu)
    local r
    for r in "${RESULTS[@]}"; do
        # shellcheck disable=SC2086
        set -- $r
        if [ "$1" = "$SYSTEM" ] && [ "$2" = "$WORKLOAD" ]; then
            echo "${!FIELD}"
            return
        fi
    done
}
# The bar, row by row: openarray >= 0.8x fio-rbd's IOPS and >= tgt-rbd's,
# <= 0.5x tgt-rbd's CPU per I/O, and at QD 1 a latency within 1.3x of
# fio-rbd's.
ratios() {
    python3 - "$1" <<'PY'
import sys
r = {}
for line in open(sys.argv[1]):
    system, workload, iops, lat, cpu, busy, machine = line.split()
    r[(system, workload)] = (float(iops), float(lat), float(cpu), float(busy), float(machine))

def bar(o, limit, t, qd1):
    """The checks openarray misses against `limit` and tgt-rbd."""
    checks = [
        (o[0] >= 0.8 * limit[0], "IOPS vs the limit"),
        (o[0] >= t[0], "IOPS vs tgt-rbd"),
        (o[2] <= 0.5 * t[2], "CPU"),
    ]
    if qd1:
        checks.append((o[1] <= 1.3 * limit[1], "latency"))
    missed = [name for ok, name in checks if not ok]
    return "met" if not missed else "not met: " + ", ".join(missed)

print("| workload | IOPS / fio-rbd | IOPS / fio-rbd-wb | IOPS / tgt-rbd | CPU per I/O / tgt-rbd | QD 1 latency / fio-rbd | QD 1 latency / fio-rbd-wb | bar, limit fio-rbd | bar, limit fio-rbd-wb |")
print("|---|---:|---:|---:|---:|---:|---:|---|---|")
for workload in dict.fromkeys(w for _, w in r):
    o, f, w, t = (r.get((s, workload)) for s in ("openarray", "fio-rbd", "fio-rbd-wb", "tgt-rbd"))
    if not (o and f and w and t):
        continue
    qd1 = workload.endswith("-qd1")
    lat = lambda limit: f"{o[1] / limit[1]:.2f}" if qd1 else "-"
    cells = [f"{o[0] / f[0]:.2f}", f"{o[0] / w[0]:.2f}", f"{o[0] / t[0]:.2f}",
             f"{o[2] / t[2]:.2f}", lat(f), lat(w), bar(o, f, t, qd1), bar(o, w, t, qd1)]
    print(f"| {workload} | " + " | ".join(cells) + " |")

print()
print("**The iSCSI hop.** The same initiator and gateway to a RAM disk (LUN 1 of the")
print("same target) at QD 1: what the hop alone takes, and the least QD 1 latency")
print("a gateway over librbd could have here, librbd's own latency plus the hop, as a")
print("multiple of the limit's.")
print()
print("| workload | hop to RAM µs | fio-rbd µs | (fio-rbd + hop) / fio-rbd | fio-rbd-wb µs | (fio-rbd-wb + hop) / fio-rbd-wb | openarray µs |")
print("|---|---:|---:|---:|---:|---:|---:|")
for workload in ("randread-4k-qd1", "randwrite-4k-qd1"):
    h, f, w, o = (r.get((s, workload)) for s in ("iscsi-to-ram", "fio-rbd", "fio-rbd-wb", "openarray"))
    if h and f and w and o:
        print(f"| {workload} | {h[1]:.0f} | {f[1]:.0f} | {(f[1] + h[1]) / f[1]:.2f} | {w[1]:.0f} | {(w[1] + h[1]) / w[1]:.2f} | {o[1]:.0f} |")

print()
print("**The whole machine.** Its CPUs' busy share during each run (all cores,")
print("cluster, initiator and gateway) and its CPU time per I/O. Where the machine")
print("is near all busy, IOPS follow the inverse of the whole path's CPU per I/O.")
print()
print("| workload | fio-rbd busy % | fio-rbd-wb busy % | openarray busy % | tgt-rbd busy % | fio-rbd µs/IO | fio-rbd-wb µs/IO | openarray µs/IO | tgt-rbd µs/IO |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for workload in dict.fromkeys(w for _, w in r):
    rows = [r.get((s, workload)) for s in ("fio-rbd", "fio-rbd-wb", "openarray", "tgt-rbd")]
    if all(rows):
        print(f"| {workload} | " + " | ".join(f"{x[3]:.0f}" for x in rows) + " | "
              + " | ".join(f"{x[4]:.1f}" for x in rows) + " |")
PY
}

LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p "$(dirname "$OUT")"
{
    echo "# RBD: openarray, tgt-rbd and fio's rbd engine"
    echo
    echo "One run of \`bench/rbd.sh\` on $(date -u +%Y-%m-%d), $(nproc) cores, a one-node"
    echo "Ceph cluster (\`scripts/ceph-fixture.sh\`: one BlueStore OSD on a sparse file,"
    echo "pool size 1) on the same machine, a 4 GiB image of which the first $SPAN is"
    echo "used. fio's libiscsi engine drives the two gateways over loopback; fio's"
    echo "rbd engine goes to the cluster directly. ${RUNTIME} s per run. Latency is the"
    echo "mean completion latency; CPU is the gateway process's user+system time per"
    echo "I/O (the cluster's daemons and the initiator are not counted), and for"
    echo "fio-rbd the whole fio process's, librbd's threads included: what librbd"
    echo "itself costs a client per I/O. fio-rbd runs with librbd's defaults (cache"
    echo "policy writearound); fio-rbd-wb with openarray's librbd settings (writeback"
    echo "from the first write). Load average at the start: $LOAD_START; at the end: $LOAD."
    echo
    echo "| workload | fio-rbd IOPS | fio-rbd-wb IOPS | openarray IOPS | tgt-rbd IOPS | fio-rbd µs | fio-rbd-wb µs | openarray µs | tgt-rbd µs | fio-rbd (librbd) CPU µs/IO | fio-rbd-wb (librbd) CPU µs/IO | openarray CPU µs/IO | tgt-rbd CPU µs/IO |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for w in "${WORKLOADS[@]}"; do
        IFS=: read -r rw bs qd <<<"$w"
        WORKLOAD="$rw-$bs-qd$qd"
        row="| $WORKLOAD"
        for FIELD in 3 4; do
            for SYSTEM in fio-rbd fio-rbd-wb openarray tgt-rbd; do row="$row | $(figure)"; done
        done
        FIELD=5
        for SYSTEM in fio-rbd fio-rbd-wb openarray tgt-rbd; do row="$row | $(figure)"; done
        echo "$row |"
    done
    echo
    printf '%s\n' "${RESULTS[@]}" >"$WORK/results"
    ratios "$WORK/results"
} >"$OUT"
log "wrote $OUT"
