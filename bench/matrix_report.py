#!/usr/bin/env python3
"""Parsing and reporting for bench/matrix.sh.

Subcommands:
  parse-fio FILE             fio JSON -> "iops MB/s p50 p90 p99 p99.9 ios client_µs_per_io"
                             (total latency, µs; fio's own CPU per I/O)
  parse-qemu-io FILE         qemu-io output of single reads -> "n iops p50 p90 p99 p99.9"
  parse-iperf FILE           iperf3 JSON -> MB/s received
  random-reads N LUN_MIB     N qemu-io read commands at random 4 KiB-aligned offsets
  report --results TSV ...   docs/bench/matrix.md and the PNG plots

The results TSV has one measurement a line:
  section system workload param iops mbps p50 p90 p99 p99.9 cpu_us client_cpu_us ctxsw
(cpu_us: the target's CPU per I/O; client_cpu_us: the client's own, where
the client is fio or qemu-img bench; ctxsw: the target's context switches per I/O) with "-" or "n/a"
where a column does not apply.
"""

import argparse
import datetime
import json
import os
import random
import re
import subprocess
import sys

PERCENTILES = ("50.000000", "90.000000", "99.000000", "99.900000")
COLUMNS = ("section", "system", "workload", "param", "iops", "mbps",
           "p50", "p90", "p99", "p999", "cpu", "client_cpu", "ctx")


def load_json_after_noise(path):
    """Some fio engines print a line before the JSON document."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    start = text.find("{")
    if start < 0:
        raise SystemExit(f"{path}: no JSON document")
    return json.loads(text[start:])


def parse_fio(path):
    job = load_json_after_noise(path)["jobs"][0]
    # The direction that did the I/O (fio reports both).
    side = max((job["read"], job["write"]), key=lambda s: s["total_ios"])
    # Submission to completion (lat), not clat: with engines that queue in
    # a library (libiscsi), clat starts only after the hand-over.
    pct = side["lat_ns"].get("percentile") or side["clat_ns"].get("percentile", {})
    lat = [f"{pct[p] / 1000:.1f}" if p in pct else "-" for p in PERCENTILES]
    # fio's CPU: percent of one CPU over the job's run time.
    seconds = job.get("job_runtime", 0) / 1000
    busy = (job.get("usr_cpu", 0) + job.get("sys_cpu", 0)) / 100 * seconds
    client = f"{busy * 1e6 / side['total_ios']:.1f}" if side["total_ios"] and seconds else "-"
    print(f"{side['iops']:.0f} {side['bw_bytes'] / 1e6:.1f} {' '.join(lat)} {side['total_ios']} {client}")


def percentile(sorted_values, p):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * p // 100))
    return sorted_values[int(min(rank, len(sorted_values))) - 1]


QEMU_IO_OPS = re.compile(r"1 ops; [0-9:.]+ sec \([^)]* and ([0-9.]+) ops/sec\)")


def parse_qemu_io(path):
    """qemu-io times each command; one op per command gives its latency."""
    lat = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = QEMU_IO_OPS.search(line)
            if m and float(m.group(1)) > 0:
                lat.append(1e6 / float(m.group(1)))
    lat.sort()
    iops = len(lat) / (sum(lat) / 1e6) if lat else 0
    cols = " ".join(f"{percentile(lat, p):.1f}" for p in (50, 90, 99, 99.9))
    print(f"{len(lat)} {iops:.0f} {cols}")


def parse_iperf(path):
    doc = load_json_after_noise(path)
    print(f"{doc['end']['sum_received']['bits_per_second'] / 8e6:.1f}")


def random_reads(n, lun_mib):
    rng = random.Random(7)
    blocks = lun_mib * 256
    for _ in range(n):
        print(f"read {rng.randrange(blocks) * 4096} 4k")


# --- report -----------------------------------------------------------------


def load_results(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            # Files written before the context switch column lack it.
            if len(fields) == len(COLUMNS) - 1:
                fields.append("-")
            if len(fields) == len(COLUMNS):
                rows.append(dict(zip(COLUMNS, fields)))
    return rows


def num(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def matching(rows, section, system, workload=None, param=None):
    return [r for r in rows
            if r["section"] == section and r["system"] == system
            and (workload is None or r["workload"] == workload)
            and (param is None or r["param"] == str(param))]


def find(rows, section, system, workload=None, param=None):
    """The best round of a measurement: the lowest median latency for the
    latency runs, else the highest throughput (the least disturbed run on a
    shared machine)."""
    candidates = matching(rows, section, system, workload, param)
    if not candidates:
        return None
    if section == "latency":
        return min(candidates, key=lambda r: num(r["p50"]) or float("inf"))
    return max(candidates, key=lambda r: num(r["iops"]) or num(r["mbps"]) or 0)


def every_round(rows, section, system, workload=None, param=None, col="iops"):
    values = [fmt(num(r[col])) for r in matching(rows, section, system, workload, param)]
    return ", ".join(values) if values else "–"


def get(row, col):
    return num(row[col]) if row else None


def fmt(value, digits=0):
    if value is None:
        return "–"
    return f"{value:,.{digits}f}".replace(",", " ") if digits == 0 else f"{value:.{digits}f}"


def ratio(a, b):
    return a / b if a is not None and b else None


def verdict(ok):
    if ok is None:
        return "not measured"
    return "yes" if ok else "**no**"


def machine_lines(args):
    def pkg(name):
        try:
            out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", name],
                                 capture_output=True, text=True, timeout=10)
            return out.stdout.strip() or "unknown"
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"

    cpuinfo = open("/proc/cpuinfo", encoding="utf-8").read()
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.M)
    flags = flags.group(1).split() if flags else []
    mem = re.search(r"MemTotal:\s*(\d+)", open("/proc/meminfo", encoding="utf-8").read())
    try:
        out = subprocess.run(["df", "--output=source,fstype", args.disk_dir],
                             capture_output=True, text=True, timeout=10)
        disk = " ".join(out.stdout.split()[2:4])
    except (OSError, subprocess.TimeoutExpired):
        disk = "unknown"
    return [
        f"- CPU: {model.group(1) if model else 'unknown'}, {os.cpu_count()} cores; "
        f"SSE4.2 (hardware CRC32C): {'yes' if 'sse4_2' in flags else 'no'}",
        f"- kernel: {' '.join(os.uname()[i] for i in (0, 2, 4))}",
        f"- memory: {int(mem.group(1)) / 1048576:.1f} GiB" if mem else "- memory: unknown",
        f"- load average: {args.load_before} before the run, {args.load_after} after "
        "(other people's builds and tests share the two cores; every ratio below "
        "compares runs taken minutes apart in the same conditions)",
        f"- O_DIRECT LUN file in {args.disk_dir}: {disk}",
        f"- tgt {pkg('tgt')}, libiscsi {pkg('libiscsi7')}, fio {pkg('fio')} (for the disk) "
        f"and fio 3.33 with the libiscsi and nbd engines (bench/fio-libiscsi.sh, for the targets), "
        f"qemu-utils {pkg('qemu-utils')}, iperf3 {pkg('iperf3')}, "
        f"gnuplot {pkg('gnuplot-nox') if pkg('gnuplot-nox') != 'unknown' else pkg('gnuplot')}",
    ]


WORKLOADS = (("4k-randread", "4K random read"), ("4k-randwrite", "4K random write"),
             ("4m-read", "4M sequential read"), ("4m-write", "4M sequential write"))


def depths(rows):
    return sorted({int(r["param"]) for r in rows if r["section"] == "matrix"})


def section_matrix(rows, out):
    out.append("## 1. The fio matrix\n")
    out.append("fio `ioengine=libiscsi`, one session per run, straight to each target's "
               "tmpfs file LUN (fio 3.33 built with that engine by `bench/fio-libiscsi.sh`; "
               "Debian's fio lacks it). Target CPU is the target process, all threads; "
               "fio's own CPU per I/O is listed too, since fio and the target share the "
               "two cores.\n")
    out.append("| workload | QD | tgt IOPS | openarray IOPS | IOPS oa/tgt "
               "| tgt MB/s | openarray MB/s | tgt µs CPU/IO | openarray µs CPU/IO "
               "| CPU oa/tgt | fio µs CPU/IO (tgt / openarray) |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def against_tgt(name, qd, t, o):
        return (f"| {name} | {qd} | {fmt(get(t, 'iops'))} | {fmt(get(o, 'iops'))} "
                f"| {fmt(ratio(get(o, 'iops'), get(t, 'iops')), 2)} "
                f"| {fmt(get(t, 'mbps'))} | {fmt(get(o, 'mbps'))} "
                f"| {fmt(get(t, 'cpu'), 1)} | {fmt(get(o, 'cpu'), 1)} "
                f"| {fmt(ratio(get(o, 'cpu'), get(t, 'cpu')), 2)} "
                f"| {fmt(get(t, 'client_cpu'), 1)} / {fmt(get(o, 'client_cpu'), 1)} |")

    out.extend(matrix_lines(rows, ("tgt", "openarray"), against_tgt))
    out.append("")
    out.append("Latency seen by fio from submission to completion (µs): p50 / p99 / p99.9\n")
    systems = matrix_systems(rows)
    out.append("| workload | QD | " + " | ".join(TITLES[s] for s in systems) + " |")
    out.append("|---|---:|" + "---:|" * len(systems))

    def lat(r):
        if not r:
            return "–"
        return " / ".join(fmt(get(r, c)) for c in ("p50", "p99", "p999"))

    out.extend(matrix_lines(rows, systems, lambda name, qd, *found: (
        f"| {name} | {qd} | " + " | ".join(lat(r) for r in found) + " |")))
    section_matrix_nbd(rows, out)
    out.append("\n![IOPS vs depth](iops-vs-depth.png)\n")


def matrix_lines(rows, systems, line):
    """One table line per workload and depth of the fio matrix: `line`
    gets the workload's name, the depth and each system's best round."""
    return [line(name, qd, *(find(rows, "matrix", s, wl, qd) for s in systems))
            for wl, name in WORKLOADS for qd in depths(rows)]


def matrix_systems(rows):
    """The fio matrix's systems in this run: the two iSCSI targets, and
    openarray's NBD export where the run measured it."""
    return [s for s in ("tgt", "openarray", "openarray-nbd")
            if s != "openarray-nbd" or matching(rows, "matrix", s)]


def section_matrix_nbd(rows, out):
    """The same fio workloads over openarray's NBD export of the LUN's
    device, against its iSCSI LUN and tgt."""
    if not matching(rows, "matrix", "openarray-nbd"):
        return
    out.append("\nThe same fio, its `ioengine=nbd` (libnbd, one connection per run), "
               "against openarray's NBD export of the same device, in the same rounds:\n")
    out.append("| workload | QD | NBD IOPS | NBD / openarray iSCSI | NBD / tgt | NBD MB/s "
               "| NBD µs CPU/IO | iSCSI µs CPU/IO | fio µs CPU/IO (NBD / iSCSI) |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")

    def nbd_line(name, qd, n, o, t):
        return (f"| {name} | {qd} | {fmt(get(n, 'iops'))} "
                f"| {fmt(ratio(get(n, 'iops'), get(o, 'iops')), 2)} "
                f"| {fmt(ratio(get(n, 'iops'), get(t, 'iops')), 2)} | {fmt(get(n, 'mbps'))} "
                f"| {fmt(get(n, 'cpu'), 1)} | {fmt(get(o, 'cpu'), 1)} "
                f"| {fmt(get(n, 'client_cpu'), 1)} / {fmt(get(o, 'client_cpu'), 1)} |")

    out.extend(matrix_lines(rows, ("openarray-nbd", "openarray", "tgt"), nbd_line))


def section_sessions(rows, out):
    out.append("## 2. Sessions\n")
    out.append("N concurrent `iscsi-perf -m 32 -b 8 -r` processes, each its own session "
               "(own initiator name), 4K random read at QD32 each, against the tmpfs file LUN. "
               "IOPS are the sum; initiators and target share the same two cores, so the "
               "curve flattens when the cores are full, not when the target serializes.\n")
    out.append("| sessions | tgt IOPS | openarray IOPS | IOPS oa/tgt | tgt µs CPU/IO "
               "| openarray µs CPU/IO | CPU oa/tgt | tgt ctx sw/IO | openarray ctx sw/IO |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sorted({int(r["param"]) for r in rows if r["section"] == "sessions"}):
        t = find(rows, "sessions", "tgt", param=n)
        o = find(rows, "sessions", "openarray", param=n)
        out.append(f"| {n} | {fmt(get(t, 'iops'))} | {fmt(get(o, 'iops'))} "
                   f"| {fmt(ratio(get(o, 'iops'), get(t, 'iops')), 2)} "
                   f"| {fmt(get(t, 'cpu'), 1)} | {fmt(get(o, 'cpu'), 1)} "
                   f"| {fmt(ratio(get(o, 'cpu'), get(t, 'cpu')), 2)} "
                   f"| {fmt(get(t, 'ctx'), 2)} | {fmt(get(o, 'ctx'), 2)} |")
    ram = find(rows, "ram", "openarray-ram")
    if ram:
        out.append(f"\nopenarray's RAM LUN (same contents), 1 session: {fmt(get(ram, 'iops'))} IOPS "
                   f"at {fmt(get(ram, 'cpu'), 1)} µs of target CPU per I/O.")
    out.append("\n![IOPS vs sessions](iops-vs-sessions.png)\n")


def section_latency(rows, out, lat_reads):
    out.append("## 3. QD1 4K random read latency\n")
    out.append(f"`qemu-io` (qemu's iSCSI driver) issues {lat_reads} single "
               "4 KiB reads at random offsets one after the other and times each one; "
               "fio's QD1 random reads of section 1 beside them.\n")
    out.append("| path | system | p50 µs | p90 µs | p99 µs | p99.9 µs | IOPS | µs CPU/IO | ctx sw/IO |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for system in ("tgt", "openarray"):
        r = find(rows, "latency", system)
        out.append(f"| qemu-io | {system} | {fmt(get(r, 'p50'), 1)} | {fmt(get(r, 'p90'), 1)} "
                   f"| {fmt(get(r, 'p99'), 1)} | {fmt(get(r, 'p999'), 1)} | {fmt(get(r, 'iops'))} "
                   f"| {fmt(get(r, 'cpu'), 1)} | {fmt(get(r, 'ctx'), 2)} |")
    for system in ("tgt", "openarray"):
        r = find(rows, "matrix", system, "4k-randread", 1)
        out.append(f"| fio (libiscsi) | {system} | {fmt(get(r, 'p50'), 1)} | {fmt(get(r, 'p90'), 1)} "
                   f"| {fmt(get(r, 'p99'), 1)} | {fmt(get(r, 'p999'), 1)} | {fmt(get(r, 'iops'))} "
                   f"| {fmt(get(r, 'cpu'), 1)} | {fmt(get(r, 'ctx'), 2)} |")
    out.append("\n![latency percentiles](latency-percentiles.png)\n")


def section_direct_io(rows, out, tcp):
    out.append("## 4. Writes and 1 MiB sequential, direct\n")
    out.append("`qemu-img bench -t none` straight to the target: 4 KiB reads and "
               "writes at QD32 (sequential offsets), and 1 MiB reads and writes at QD8. "
               f"One loopback TCP stream (iperf3, best of the same rounds): **{fmt(tcp)} MB/s**.\n")
    out.append("qemu-img runs the iSCSI driver on one thread; its own CPU per I/O (user and "
               "system, from the rusage of the finished process) is in the column before last: "
               "over loopback it includes the target socket's receive, which the kernel runs "
               "in the sender's system call.\n")
    out.append("| workload | tgt | openarray | oa/tgt | tgt µs CPU/IO | openarray µs CPU/IO "
               "| tgt ctx sw/IO | openarray ctx sw/IO | qemu-img µs CPU/IO (tgt / openarray) "
               "| openarray / TCP stream |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for section, wl, name, col, unit in (("write", "4k-read", "4K read QD32", "iops", "IOPS"),
                                         ("write", "4k-write", "4K write QD32", "iops", "IOPS"),
                                         ("seq", "1m-read", "1 MiB read QD8", "mbps", "MB/s"),
                                         ("seq", "1m-write", "1 MiB write QD8", "mbps", "MB/s")):
        t = find(rows, section, "tgt", wl)
        o = find(rows, section, "openarray", wl)
        vs_tcp = fmt(ratio(get(o, "mbps"), tcp), 2) if col == "mbps" else "–"
        out.append(f"| {name} ({unit}) | {fmt(get(t, col))} | {fmt(get(o, col))} "
                   f"| {fmt(ratio(get(o, col), get(t, col)), 2)} | {fmt(get(t, 'cpu'), 1)} "
                   f"| {fmt(get(o, 'cpu'), 1)} | {fmt(get(t, 'ctx'), 2)} | {fmt(get(o, 'ctx'), 2)} "
                   f"| {fmt(get(t, 'client_cpu'), 1)} / {fmt(get(o, 'client_cpu'), 1)} "
                   f"| {vs_tcp} |")
    out.append("")


def section_odirect(rows, out, disk_dir):
    out.append("## 5. O_DIRECT file LUN on the disk\n")
    out.append(f"One 1 GiB file of random data in {disk_dir} (not tmpfs), served by openarray "
               "(`direct = true`) and by tgt (`--bsoflags direct`), read with "
               "`iscsi-perf -b 8 -r` at the given depth; the device's own figure is fio "
               "`ioengine=io_uring direct=1` 4K randread on the very same file at the same depth. "
               "QD16 is there because this disk answers a batch of reads only once its queue is "
               "empty: an initiator, which needs 150-180 µs to turn 16 answers into 16 commands, "
               "keeps two batches of 16 on it at QD32, so fio's QD16 figure is the most a target "
               "can reach at QD32 (docs/bench/techniques.md, section 42).\n")
    out.append("| QD | fio io_uring IOPS | openarray IOPS | openarray / fio | tgt IOPS | tgt / fio "
               "| openarray µs CPU/IO | tgt µs CPU/IO | openarray ctx sw/IO | tgt ctx sw/IO |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for qd in sorted({int(r["param"]) for r in rows if r["section"] == "direct"}):
        f = find(rows, "direct", "fio-io_uring", param=qd)
        o = find(rows, "direct", "openarray", param=qd)
        t = find(rows, "direct", "tgt", param=qd)
        out.append(f"| {qd} | {fmt(get(f, 'iops'))} | {fmt(get(o, 'iops'))} "
                   f"| {fmt(ratio(get(o, 'iops'), get(f, 'iops')), 2)} | {fmt(get(t, 'iops'))} "
                   f"| {fmt(ratio(get(t, 'iops'), get(f, 'iops')), 2)} | {fmt(get(o, 'cpu'), 1)} "
                   f"| {fmt(get(t, 'cpu'), 1)} | {fmt(get(o, 'ctx'), 2)} | {fmt(get(t, 'ctx'), 2)} |")
    out.append("")


def section_digest(rows, out):
    out.append("## 6. Digests\n")
    out.append("Header digests: `iscsi-perf -m 32 -b 8 -r`, one session, with "
               "`?header_digest=none` and `?header_digest=crc32c` on the URL (libiscsi then "
               "offers only that value). openarray computes CRC32C with the `crc32c` crate, "
               "which uses the SSE4.2 instruction when the CPU has it.\n")
    out.append("| system | IOPS none | IOPS CRC32C | IOPS change | µs CPU/IO none "
               "| µs CPU/IO CRC32C | CPU change |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for system in ("tgt", "openarray"):
        n = find(rows, "digest-none", system)
        c = find(rows, "digest-crc32c", system)
        out.append(f"| {system} | {fmt(get(n, 'iops'))} | {fmt(get(c, 'iops'))} "
                   f"| {change(get(n, 'iops'), get(c, 'iops'))} | {fmt(get(n, 'cpu'), 1)} "
                   f"| {fmt(get(c, 'cpu'), 1)} | {change(get(n, 'cpu'), get(c, 'cpu'))} |")
    out.append("")
    out.append("Data digests: no client on this machine negotiates them (libiscsi has none), "
               "so `cargo bench --bench digests` drives openarray with the project's own "
               "initiator (the integration tests' one, pipelined to QD32 on one session, "
               "CRC32C from the same crate) against the embedded default's RAM LUN, written "
               "whole before the runs. tgt is not measured here. Initiator µs CPU/IO is that "
               "initiator's own.\n")
    out.append("| workload | digests | IOPS | MB/s | µs CPU/IO | CPU change | initiator µs CPU/IO |")
    out.append("|---|---|---:|---:|---:|---:|---:|")
    for workload in DIGEST_WORKLOADS:
        base = find(rows, "digests", "openarray", f"{workload}-none")
        for setting in DIGEST_SETTINGS:
            r = find(rows, "digests", "openarray", f"{workload}-{setting}")
            out.append(f"| {workload} | {setting} | {fmt(get(r, 'iops'))} "
                       f"| {fmt(get(r, 'mbps'), 1)} | {fmt(get(r, 'cpu'), 1)} "
                       f"| {change(get(base, 'cpu'), get(r, 'cpu'))} | {fmt(get(r, 'client_cpu'), 1)} |")
    out.append("")


DIGEST_WORKLOADS = ("4k-randread", "4k-randwrite", "64k-randread")
DIGEST_SETTINGS = ("none", "header", "header+data")


def change(a, b):
    """b against a as a signed percentage."""
    r = ratio(b, a)
    return f"{(r - 1) * 100:+.0f} %" if r is not None else "–"


def section_goals(rows, out, tcp):
    """Each goal of the performance work against what this run measured."""
    out.append("## Goals against this run\n")
    out.append("| goal | measured | met |")
    out.append("|---|---|---|")
    t1 = find(rows, "sessions", "tgt", param=1)
    o1 = find(rows, "sessions", "openarray", param=1)
    ri = ratio(get(o1, "iops"), get(t1, "iops"))
    rc = ratio(get(o1, "cpu"), get(t1, "cpu"))
    out.append(f"| 4K random read QD32, tmpfs file LUN: ≥ 2.0x tgt IOPS, ≤ 0.35x tgt CPU/IO "
               f"| {fmt(get(o1, 'iops'))} vs {fmt(get(t1, 'iops'))} IOPS = {fmt(ri, 2)}x; "
               f"CPU {fmt(get(o1, 'cpu'), 1)} vs {fmt(get(t1, 'cpu'), 1)} µs = {fmt(rc, 2)}x "
               f"(every round: openarray {every_round(rows, 'sessions', 'openarray', param=1)}; "
               f"tgt {every_round(rows, 'sessions', 'tgt', param=1)}) "
               f"| {verdict(None if ri is None or rc is None else ri >= 2.0 and rc <= 0.35)} |")
    ram = find(rows, "ram", "openarray-ram")
    rr = ratio(get(ram, "iops"), get(t1, "iops"))
    rrc = ratio(get(ram, "cpu"), get(t1, "cpu"))
    out.append(f"| same on a RAM LUN (against tgt's tmpfs file) | {fmt(get(ram, 'iops'))} IOPS = "
               f"{fmt(rr, 2)}x; CPU {fmt(get(ram, 'cpu'), 1)} µs = {fmt(rrc, 2)}x "
               f"| {verdict(None if rr is None or rrc is None else rr >= 2.0 and rrc <= 0.35)} |")
    tw = find(rows, "write", "tgt", "4k-write")
    ow = find(rows, "write", "openarray", "4k-write")
    orr = find(rows, "write", "openarray", "4k-read")
    w_read = ratio(get(ow, "iops"), get(orr, "iops"))
    w_perf = ratio(get(ow, "iops"), get(o1, "iops"))
    w_tgt = ratio(get(ow, "iops"), get(tw, "iops"))
    # qemu-img's one thread: its own CPU per write and per read bound the
    # two figures whatever the target does.
    q_write, q_read = get(ow, "client_cpu"), get(orr, "client_cpu")
    q_cap = ratio(1e6, q_write)
    out.append(f"| 4K write QD32 (qemu-img bench -w): ≥ 70 % of the read figure and ≥ 2x tgt "
               f"| {fmt(get(ow, 'iops'))} IOPS = {fmt(w_read, 2)} of the same tool's reads "
               f"({fmt(get(orr, 'iops'))}; {fmt(w_perf, 2)} of iscsi-perf's), {fmt(w_tgt, 2)}x tgt; "
               f"qemu-img's own {fmt(q_write, 1)} µs of CPU per write ({fmt(q_read, 1)} per read) "
               f"caps its one thread at {fmt(q_cap)} "
               f"| {verdict(None if w_read is None or w_tgt is None else w_read >= 0.7 and w_tgt >= 2.0)} |")
    tr = find(rows, "matrix", "tgt", "4k-randwrite", 32)
    orw = find(rows, "matrix", "openarray", "4k-randwrite", 32)
    orr_fio = find(rows, "matrix", "openarray", "4k-randread", 32)
    rw_tgt = ratio(get(orw, "iops"), get(tr, "iops"))
    rw_fio = ratio(get(orw, "iops"), get(orr_fio, "iops"))
    rw_perf = ratio(get(orw, "iops"), get(o1, "iops"))
    # Held against the higher of the two read figures: fio's own and the
    # headline iscsi-perf one.
    rw_read = min((r for r in (rw_fio, rw_perf) if r is not None), default=None)
    # fio runs its job on one thread: its own CPU per write bounds the
    # row whatever the target does.
    fio_cpu = get(orw, "client_cpu")
    fio_cap = ratio(1e6, fio_cpu)
    out.append(f"| 4K random write QD32 (fio, libiscsi engine): ≥ 70 % of the read figure and ≥ 2x tgt "
               f"| {fmt(get(orw, 'iops'))} IOPS = {fmt(rw_fio, 2)} of fio's random reads "
               f"({fmt(get(orr_fio, 'iops'))}), {fmt(rw_perf, 2)} of iscsi-perf's; "
               f"{fmt(rw_tgt, 2)}x tgt ({fmt(get(tr, 'iops'))}); fio's own {fmt(fio_cpu, 1)} µs "
               f"of CPU per write caps its one thread at {fmt(fio_cap)} "
               f"| {verdict(None if rw_tgt is None or rw_read is None else rw_tgt >= 2.0 and rw_read >= 0.7)} |")
    tl = find(rows, "latency", "tgt")
    ol = find(rows, "latency", "openarray")
    lat_ok = None
    if get(tl, "p50") and get(ol, "p50"):
        lat_ok = get(ol, "p50") < get(tl, "p50") and get(ol, "p99") < get(tl, "p99")
    out.append(f"| QD1 4K read latency lower than tgt (direct) | median {fmt(get(ol, 'p50'), 1)} vs "
               f"{fmt(get(tl, 'p50'), 1)} µs, p99 {fmt(get(ol, 'p99'), 1)} vs {fmt(get(tl, 'p99'), 1)} µs "
               f"| {verdict(lat_ok)} |")
    for wl, name in (("1m-read", "read"), ("1m-write", "write")):
        o = find(rows, "seq", "openarray", wl)
        r = ratio(get(o, "mbps"), tcp)
        out.append(f"| 1 MiB sequential {name}: ≥ 85 % of one loopback TCP stream "
                   f"| {fmt(get(o, 'mbps'))} of {fmt(tcp)} MB/s = {fmt(r, 2)} "
                   f"| {verdict(None if r is None else r >= 0.85)} |")
    counts = sorted({int(r["param"]) for r in rows
                     if r["section"] == "sessions" and r["system"] == "openarray"})
    sess = [(n, get(find(rows, "sessions", "openarray", param=n), "iops")) for n in counts]
    if sess:
        curve = ", ".join(f"{n}: {fmt(i)}" for n, i in sess)
        grows = all(b is not None and a is not None and b >= a * 0.9
                    for (_, a), (_, b) in zip(sess, sess[1:]))
        out.append(f"| IOPS grow with sessions until the cores are full | {curve} "
                   f"| {verdict(grows)} (no drop beyond 10 % from one point to the next) |")
    do = find(rows, "direct", "openarray", param=32)
    df = find(rows, "direct", "fio-io_uring", param=32)
    rd = ratio(get(do, "iops"), get(df, "iops"))
    # The disk answers a batch only once its queue is empty, and an
    # initiator's turnaround leaves two batches of 16 on it at QD32
    # (techniques.md section 42): fio's own QD16 figure bounds any target.
    bound = ""
    f16 = get(find(rows, "direct", "fio-io_uring", param=16), "iops")
    if f16 is not None:
        bound = (f"; fio's own QD16 figure, the most two batches of 16 keep the disk at, "
                 f"{fmt(f16)} = {fmt(ratio(f16, get(df, 'iops')), 2)} of its QD32 one, "
                 f"and openarray's QD32 = {fmt(ratio(get(do, 'iops'), f16), 2)} of it")
    out.append(f"| O_DIRECT file LUN on disk: within 10 % of fio io_uring, QD32 "
               f"| {fmt(get(do, 'iops'))} vs {fmt(get(df, 'iops'))} IOPS = {fmt(rd, 2)}{bound} "
               f"| {verdict(None if rd is None else rd >= 0.9)} |")
    dn = find(rows, "digest-none", "openarray")
    dc = find(rows, "digest-crc32c", "openarray")
    dr = ratio(get(dc, "cpu"), get(dn, "cpu"))
    out.append(f"| header digest cost reported | CPU/IO with CRC32C = {fmt(dr, 2)}x without "
               f"| {verdict(None if dr is None else True)} |")
    data = [(w, ratio(get(find(rows, "digests", "openarray", f"{w}-header+data"), "cpu"),
                      get(find(rows, "digests", "openarray", f"{w}-none"), "cpu")))
            for w in DIGEST_WORKLOADS]
    known = [(w, r) for w, r in data if r is not None]
    listed = ", ".join(f"{w} {fmt(r, 2)}x" for w, r in known) or "not measured"
    out.append(f"| data digest cost reported | CPU/IO with header and data CRC32C against none: "
               f"{listed} | {verdict(True if known else None)} |")
    out.append("")


def gnuplot(script):
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True, timeout=60,
                       capture_output=True)
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or ""
        print(f"gnuplot failed: {e}\n{detail}", file=sys.stderr)


def datablock(name, lines):
    return f"${name} << EOD\n" + "\n".join(lines) + "\nEOD\n"


PLOT_HEAD = "set terminal pngcairo size {w},{h} font 'sans,10'\nset output '{out}'\n"
STYLES = {"tgt": "lc rgb '#d62728' pt 7", "openarray": "lc rgb '#1f77b4' pt 5",
          "openarray-nbd": "lc rgb '#2ca02c' pt 9"}
TITLES = {"tgt": "tgt", "openarray": "openarray", "openarray-nbd": "openarray NBD"}


def best_and_all(rows, section, system, workload=None, cols=("iops", "mbps")):
    """Data lines of the best round per depth or session count (the line)
    and of every round (the dots)."""
    params = sorted({int(r["param"]) for r in matching(rows, section, system, workload)})
    best = [find(rows, section, system, workload, p) for p in params]
    every = sorted(matching(rows, section, system, workload), key=lambda r: int(r["param"]))

    def data(selected):
        return [" ".join([r["param"]] + [r[c] for c in cols]) for r in selected
                if num(r[cols[0]]) is not None] or ["1 0 0"]

    return data(best), data(every)


def plot_series(name, col, style, title):
    """The best rounds as a line, every round as dots of the same colour."""
    colour = style.split(" pt ")[0]
    return (f"${name}_best using 1:{col} with linespoints {style} title '{title}', "
            f"${name}_all using 1:{col} with points {colour} pt 1 notitle")


def plot_depth(rows, out_dir):
    script = PLOT_HEAD.format(w=1100, h=800, out=os.path.join(out_dir, "iops-vs-depth.png"))
    systems = matrix_systems(rows)
    for wl, _ in WORKLOADS:
        for system in systems:
            key = f"{wl}_{system}".replace("-", "_")
            best, every = best_and_all(rows, "matrix", system, wl)
            script += datablock(f"d_{key}_best", best)
            script += datablock(f"d_{key}_all", every)
    script += ("set multiplot layout 2,2 title 'fio (libiscsi and nbd engines), by queue depth "
               "(line: best round, +: every round)'\n")
    script += "set logscale x 2\nset xlabel 'queue depth'\nset grid\nset key top left\nset yrange [0:*]\n"
    for wl, name in WORKLOADS:
        col, unit = (2, "IOPS") if wl.startswith("4k") else (3, "MB/s")
        script += f"set title '{name}'\nset ylabel '{unit}'\n"
        series = [plot_series(f"d_{wl}_{s}".replace("-", "_"), col, STYLES[s], TITLES[s])
                  for s in systems]
        script += "plot " + ", ".join(series) + "\n"
    script += "unset multiplot\n"
    gnuplot(script)


def plot_sessions(rows, out_dir):
    script = PLOT_HEAD.format(w=1100, h=420, out=os.path.join(out_dir, "iops-vs-sessions.png"))
    for system in ("tgt", "openarray"):
        best, every = best_and_all(rows, "sessions", system, cols=("iops", "cpu"))
        script += datablock(f"s_{system}_best", best)
        script += datablock(f"s_{system}_all", every)
    script += ("set multiplot layout 1,2 title '4K random read, QD32 per session (iscsi-perf; "
               "line: best round, +: every round)'\n"
               "set logscale x 2\nset xlabel 'sessions'\nset grid\nset key top left\nset yrange [0:*]\n"
               "set title 'IOPS (sum over sessions)'\nset ylabel 'IOPS'\n"
               f"plot {plot_series('s_tgt', 2, STYLES['tgt'], 'tgt')}, "
               f"{plot_series('s_openarray', 2, STYLES['openarray'], 'openarray')}\n"
               "set title 'target CPU per I/O (of the same rounds)'\nset ylabel 'µs'\n"
               f"plot {plot_series('s_tgt', 3, STYLES['tgt'], 'tgt')}, "
               f"{plot_series('s_openarray', 3, STYLES['openarray'], 'openarray')}\n"
               "unset multiplot\n")
    gnuplot(script)


def plot_latency(rows, out_dir):
    script = PLOT_HEAD.format(w=900, h=500, out=os.path.join(out_dir, "latency-percentiles.png"))
    series = []
    labels = ("p50", "p90", "p99", "p99.9")
    cols = ("p50", "p90", "p99", "p999")
    sources = (("latency", "tgt", None, "tgt, qemu-io", "lc rgb '#d62728' pt 7"),
               ("latency", "openarray", None, "openarray, qemu-io", "lc rgb '#1f77b4' pt 5"),
               ("matrix", "tgt", "4k-randread", "tgt, fio", "lc rgb '#d62728' pt 6 dt 2"),
               ("matrix", "openarray", "4k-randread", "openarray, fio", "lc rgb '#1f77b4' pt 4 dt 2"))
    for i, (section, system, wl, title, style) in enumerate(sources):
        r = find(rows, section, system, wl, 1 if section == "matrix" else None)
        if not r or any(num(r[c]) is None for c in cols):
            continue
        script += datablock(f"l{i}", [f"{j} {r[c]}" for j, c in enumerate(cols)])
        series.append(f"$l{i} using 1:2 with linespoints {style} title '{title}'")
    if not series:
        return
    xt = ", ".join(f"'{label}' {j}" for j, label in enumerate(labels))
    script += ("set title 'QD1 4K random read latency percentiles'\nset ylabel 'µs (log)'\n"
               f"set logscale y\nset grid\nset key top left\nset xtics ({xt})\nset xrange [-0.2:3.2]\n"
               "plot " + ", ".join(series) + "\n")
    gnuplot(script)


def report(args):
    rows = load_results(args.results)
    tcp_row = find(rows, "tcp", "iperf3")
    tcp = get(tcp_row, "mbps")
    out = ["# Benchmark matrix: openarray vs tgt", ""]
    out.append(f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC at commit "
               f"{args.commit} in about {args.minutes} minutes with:\n")
    out.append(f"```\n{args.command}\n```\n")
    if args.failed != "0":
        out.append("**Some measurements failed in this run; they show as –.**\n")
    out.append("Machine:\n")
    out.extend(machine_lines(args))
    out.append("")
    out.append(f"Each measurement of sections 2–6 ran {args.rounds} time(s), the two "
               "targets alternating; the tables show the best round of each (highest "
               "throughput; for latency the lowest median), with the target CPU of that "
               f"same round. The fio matrix (section 1) ran {args.matrix_rounds} time(s), "
               "reported the same way.\n")
    out.append("Setup: both targets serve the same 1 GiB of random data from a file on tmpfs "
               "(/dev/shm), 512-byte blocks, over 127.0.0.1; tgt: rdwr backing store, LUN 1; "
               "openarray: file device with `write_cache = true`, LUN 0 (both report WCE=1 "
               "and neither syncs per write). CPU per I/O is utime+stime of the target "
               f"process (all threads) from /proc/PID/stat over each run of {args.runtime} s, "
               "divided by the I/Os of that run; context switches per I/O (ctx sw/IO) "
               "likewise, from the voluntary and involuntary switches of every thread of the "
               "target in /proc/PID/task/*/status. Initiators and the target "
               "share the same two cores, so IOPS are bounded by all of them; CPU per I/O "
               "is the steadier figure.\n")
    section_goals(rows, out, tcp)
    section_matrix(rows, out)
    section_sessions(rows, out)
    section_latency(rows, out, args.lat_reads)
    section_direct_io(rows, out, tcp)
    section_odirect(rows, out, args.disk_dir)
    section_digest(rows, out)
    out.append(f"The raw figures of this run are in `matrix-results.tsv` beside this file "
               "(one measurement a line: section, system, workload, depth or sessions, "
               "IOPS, MB/s, p50/p90/p99/p99.9 µs, target µs CPU/IO, fio's µs CPU/IO, "
               "target context switches per I/O).\n")
    with open(os.path.join(args.out, "matrix.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(out))
    plot_depth(rows, args.out)
    plot_sessions(rows, args.out)
    plot_latency(rows, args.out)


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "parse-fio" and len(rest) == 1:
        parse_fio(rest[0])
    elif cmd == "parse-qemu-io" and len(rest) == 1:
        parse_qemu_io(rest[0])
    elif cmd == "parse-iperf" and len(rest) == 1:
        parse_iperf(rest[0])
    elif cmd == "random-reads" and len(rest) == 2:
        random_reads(int(rest[0]), int(rest[1]))
    elif cmd == "report":
        p = argparse.ArgumentParser(prog="matrix_report.py report")
        for opt in ("results", "out", "command", "commit", "runtime", "load-before",
                    "load-after", "minutes", "disk-dir", "lat-reads", "seq-mib", "rounds",
                    "matrix-rounds", "failed"):
            p.add_argument(f"--{opt}", required=True)
        report(p.parse_args(rest))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
