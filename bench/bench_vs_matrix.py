#!/usr/bin/env python3
"""The report of bench/bench-vs-matrix.sh: the openarray/tgt ratios that
`openarray bench --compare` measured beside the ones of bench/matrix.sh's
fio runs, per point, with their difference and the round-to-round spread.

Inputs: matrix.sh's results TSV (section "matrix" rows) and the report
folders of `openarray bench`, BENCH_DIR/rROUND-WORKLOAD/results.json.
Prints the tables and writes them, with the run's description, to --out.
"""

import argparse
import json
import os
import statistics
import subprocess

WORKLOADS = ("4k-randread", "4k-randwrite", "4m-read", "4m-write")
LABELS = {"4k-randread": "4K randread", "4k-randwrite": "4K randwrite",
          "4m-read": "4M seqread", "4m-write": "4M seqwrite"}
COLUMNS = ("section", "system", "workload", "param", "iops", "mbps",
           "p50", "p90", "p99", "p999", "cpu", "client_cpu", "ctx")
# With one round there is no spread to judge by: 10 % is what repeated
# runs of matrix.sh on this kind of shared machine differ by at the least.
DEFAULT_NOISE = 0.10


def num(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def matrix_runs(path):
    """{(workload, depth, system): [{"iops", "p99", "cpu_pct"} per round]}"""
    runs = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = dict(zip(COLUMNS, line.rstrip("\n").split("\t")))
            if row.get("section") != "matrix":
                continue
            iops, client = num(row["iops"]), num(row["client_cpu"])
            runs.setdefault((row["workload"], int(row["param"]), row["system"]), []).append({
                "iops": iops, "p99": num(row["p99"]),
                # fio's µs of CPU per I/O back to percent of one CPU.
                "cpu_pct": client * iops / 1e4 if client is not None and iops else None,
            })
    return runs


def bench_runs(bench_dir, rounds, openarray_url):
    """The same keys as matrix_runs, from `openarray bench`'s results.json
    (openarray's LUN is URL in some rounds and URL2 in others)."""
    runs = {}
    for r in range(1, rounds + 1):
        for workload in WORKLOADS:
            path = os.path.join(bench_dir, f"r{r}-{workload}", "results.json")
            if not os.path.exists(path):
                continue
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            systems = ["openarray" if t["url"] == openarray_url else "tgt" for t in doc["targets"]]
            for row in doc["rows"]:
                for system, m in zip(systems, row["measured"]):
                    runs.setdefault((workload, row["point"]["depth"], system), []).append({
                        "iops": m["iops"], "p99": m["p99_us"], "cpu_pct": m["client_cpu_pct"]})
    return runs


def ratios(runs, workload, depth, key):
    """openarray/tgt per round."""
    oa = runs.get((workload, depth, "openarray"), [])
    tgt = runs.get((workload, depth, "tgt"), [])
    return [o[key] / t[key] for o, t in zip(oa, tgt) if o[key] and t[key]]


def mean(values, key=None):
    values = [v[key] if key else v for v in values]
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def spread(values):
    """Half the range over the mean: how far one round strays."""
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / 2 / statistics.mean(values)


def fmt(value, digits=2):
    return "–" if value is None else f"{value:.{digits}f}"


def depths(runs):
    return sorted({d for (_, d, _) in runs})


def ratio_table(matrix, bench, key, title):
    out = [f"| workload | QD | matrix.sh {title} (rounds) | bench {title} (rounds) "
           "| matrix.sh | bench | difference | noise | within noise |",
           "|---|---:|---|---|---:|---:|---:|---:|---|"]
    for workload in WORKLOADS:
        for depth in depths(matrix):
            m, b = ratios(matrix, workload, depth, key), ratios(bench, workload, depth, key)
            if not m and not b:
                continue
            mm, bm = mean(m), mean(b)
            diff = bm / mm - 1 if mm and bm else None
            noises = [s for s in (spread(m), spread(b)) if s is not None]
            noise = max(noises) if noises else DEFAULT_NOISE
            # Two ratios, each off by up to the noise.
            ok = "–" if diff is None else ("yes" if abs(diff) <= 2 * noise else "**no**")
            out.append(f"| {LABELS[workload]} | {depth} | {', '.join(fmt(v) for v in m)} "
                       f"| {', '.join(fmt(v) for v in b)} | {fmt(mm)} | {fmt(bm)} "
                       f"| {fmt(diff * 100 if diff is not None else None, 0)} % "
                       f"| ±{noise * 100:.0f} % | {ok} |")
    return out


def absolute_table(matrix, bench):
    out = ["| workload | QD | tgt IOPS matrix.sh / bench | openarray IOPS matrix.sh / bench "
           "| fio CPU % tgt, matrix.sh / bench | fio CPU % openarray, matrix.sh / bench |",
           "|---|---:|---:|---:|---:|---:|"]
    for workload in WORKLOADS:
        for depth in depths(matrix):
            cells = []
            for key, digits in (("iops", 0), ("cpu_pct", 0)):
                for system in ("tgt", "openarray"):
                    m = mean(matrix.get((workload, depth, system), []), key)
                    b = mean(bench.get((workload, depth, system), []), key)
                    cells.append(f"{fmt(m, digits)} / {fmt(b, digits)}")
            out.append(f"| {LABELS[workload]} | {depth} | " + " | ".join(cells) + " |")
    return out


def machine():
    model = "unknown CPU"
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    kernel = subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip()
    return f"{model}, {os.cpu_count()} logical cores, Linux {kernel}"


def main():
    p = argparse.ArgumentParser()
    for name in ("matrix", "bench-dir", "command", "commit", "load-before", "load-after",
                 "fio", "openarray-url", "out"):
        p.add_argument("--" + name, required=True)
    for name in ("rounds", "runtime", "minutes"):
        p.add_argument("--" + name, type=int, required=True)
    a = p.parse_args()
    matrix, bench = matrix_runs(a.matrix), bench_runs(a.bench_dir, a.rounds, a.openarray_url)

    tables = ["### IOPS, openarray / tgt", ""]
    tables += ratio_table(matrix, bench, "iops", "IOPS ratio")
    tables += ["", "### p99 latency, openarray / tgt (submission to completion)", ""]
    tables += ratio_table(matrix, bench, "p99", "p99 ratio")
    tables += ["", "### The figures the ratios come from (mean of the rounds)", ""]
    tables += absolute_table(matrix, bench)
    print("\n".join(tables))

    head = [
        "# `openarray bench --compare` against bench/matrix.sh",
        "",
        f"Command: `{a.command}` (commit {a.commit}), {a.rounds} round(s), {a.runtime} s "
        f"per run, {a.minutes} minutes in all; load average {a.load_before} before and "
        f"{a.load_after} after.",
        "",
        f"Machine: {machine()}. fio: `{a.fio}`, the same binary for both tools.",
        "",
        "openarray's 1 GiB file LUN on tmpfs against tgt's on the same kind of backing "
        "(bench/matrix.sh's targets), over loopback, one iSCSI session per run. In each "
        "round, pattern by pattern, bench/matrix.sh's fio runs and `openarray bench "
        "iscsi://…openarray/0 --compare iscsi://…tgt/1 --seq-block-size 4M "
        "--destroy-data` take turns going first (the two URLs swap places every other "
        "round, so that no point always measures the same target first). A ratio above 1 means openarray "
        "does more IOPS (or, for latency, takes longer). The difference is the bench "
        "command's mean ratio over matrix.sh's, less 1; the noise is the larger "
        "round-to-round spread (half the range over the mean) of the two, "
        f"{DEFAULT_NOISE * 100:.0f} % with one round; a difference within twice the "
        "noise is within noise (each of the two ratios may be off by it).",
        "",
    ]
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(head + tables) + "\n")


if __name__ == "__main__":
    main()
