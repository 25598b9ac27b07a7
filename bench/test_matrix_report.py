#!/usr/bin/env python3
"""Unit tests of bench/matrix_report.py: python3 -m unittest bench/test_matrix_report.py"""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # no __pycache__ left in bench/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import matrix_report  # noqa: E402


def captured(func, *args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        func(*args)
    return out.getvalue().split()


def side(ios, iops, bw, lat_pct=None, clat_pct=None):
    return {"total_ios": ios, "iops": iops, "bw_bytes": bw,
            "lat_ns": {"percentile": lat_pct} if lat_pct else {},
            "clat_ns": {"percentile": clat_pct} if clat_pct else {}}


class TempFiles(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path


class ParseFio(TempFiles):
    def test_write_job_after_engine_noise_uses_total_latency(self):
        pct = {"50.000000": 41000, "90.000000": 52000, "99.000000": 90000, "99.900000": 400000}
        doc = {"jobs": [{"read": side(0, 0, 0),
                         "write": side(150000, 30000.4, 122880000, lat_pct=pct,
                                       clat_pct={"50.000000": 1}),
                         "job_runtime": 5000, "usr_cpu": 40.0, "sys_cpu": 20.0}]}
        path = self.write("fio.json", "fio: engine noise\n" + json.dumps(doc))
        # fio's CPU: 60 % of 5 s over 150,000 I/Os = 20 µs each.
        self.assertEqual(captured(matrix_report.parse_fio, path),
                         ["30000", "122.9", "41.0", "52.0", "90.0", "400.0", "150000", "20.0"])

    def test_clat_when_no_total_latency_percentiles(self):
        doc = {"jobs": [{"read": side(10, 5, 4096, clat_pct={"50.000000": 2000}),
                         "write": side(0, 0, 0)}]}
        path = self.write("fio.json", json.dumps(doc))
        self.assertEqual(captured(matrix_report.parse_fio, path)[2:8], ["2.0", "-", "-", "-", "10", "-"])


class ParseQemuIo(TempFiles):
    def test_latency_of_each_single_read(self):
        lines = []
        for ops_per_sec in (20000.0, 10000.0, 25000.0, 50000.0):
            lines.append("qemu-io> read 4096/4096 bytes at offset 0")
            lines.append(f"4 KiB, 1 ops; 00.00 sec (78.125 MiB/sec and {ops_per_sec:.4f} ops/sec)")
        lines.append("qemu-io> ")
        path = self.write("qemu-io.out", "\n".join(lines))
        n, iops, p50, p90, p99, p999 = captured(matrix_report.parse_qemu_io, path)
        # latencies 50, 100, 40, 20 µs: mean 52.5 µs
        self.assertEqual((n, iops), ("4", "19048"))
        self.assertEqual((p50, p90, p99, p999), ("40.0", "100.0", "100.0", "100.0"))


class Percentile(unittest.TestCase):
    def test_nearest_rank(self):
        values = list(range(1, 101))
        self.assertEqual(matrix_report.percentile(values, 50), 50)
        self.assertEqual(matrix_report.percentile(values, 99), 99)
        self.assertEqual(matrix_report.percentile(values, 99.9), 100)
        self.assertEqual(matrix_report.percentile([7], 99.9), 7)


class RandomReads(unittest.TestCase):
    def test_aligned_inside_the_lun_and_repeatable(self):
        first = captured(matrix_report.random_reads, 500, 16)
        self.assertEqual(first, captured(matrix_report.random_reads, 500, 16))
        offsets = [int(w) for w in first[1::3]]
        self.assertEqual(len(offsets), 500)
        self.assertTrue(all(o % 4096 == 0 and 0 <= o <= 16 * 1048576 - 4096 for o in offsets))
        self.assertEqual(first[0::3], ["read"] * 500)
        self.assertEqual(first[2::3], ["4k"] * 500)


def row(section, system, workload, param, iops="-", mbps="-", p50="-", cpu="-"):
    return dict(zip(matrix_report.COLUMNS,
                    (section, system, workload, str(param), iops, mbps, p50, "-", "-", "-", cpu, "-",
                     "-")))


class BestRound(unittest.TestCase):
    rows = [
        row("sessions", "openarray", "4k-randread-qd32", 1, iops="80000", cpu="9.0"),
        row("sessions", "openarray", "4k-randread-qd32", 1, iops="95000", cpu="8.1"),
        row("sessions", "openarray", "4k-randread-qd32", 2, iops="120000", cpu="7.0"),
        row("sessions", "tgt", "4k-randread-qd32", 1, iops="50000", cpu="19.0"),
        row("latency", "tgt", "4k-randread-qd1", 1, iops="15000", p50="55.0"),
        row("latency", "tgt", "4k-randread-qd1", 1, iops="16000", p50="48.5"),
        row("tcp", "iperf3", "one-stream", 1, mbps="3500.0"),
    ]

    def test_highest_throughput_round_with_its_own_cpu(self):
        best = matrix_report.find(self.rows, "sessions", "openarray", param=1)
        self.assertEqual((best["iops"], best["cpu"]), ("95000", "8.1"))

    def test_lowest_median_for_latency(self):
        self.assertEqual(matrix_report.find(self.rows, "latency", "tgt")["p50"], "48.5")

    def test_throughput_only_rows_and_absent_ones(self):
        self.assertEqual(matrix_report.find(self.rows, "tcp", "iperf3")["mbps"], "3500.0")
        self.assertIsNone(matrix_report.find(self.rows, "sessions", "tgt", param=8))

    def test_every_round_listed(self):
        self.assertEqual(matrix_report.every_round(self.rows, "sessions", "openarray", param=1),
                         "80 000, 95 000")


class LoadResults(TempFiles):
    def test_context_switch_column_optional_and_short_lines_skipped(self):
        path = self.write("results.tsv", "\n".join([
            "sessions\ttgt\tw\t1\t5\t-\t-\t-\t-\t-\t20.0\t-\t1.70",
            "sessions\ttgt\tw\t2\t6\t-\t-\t-\t-\t-\t21.0\t-",
            "truncated\tline",
        ]) + "\n")
        rows = matrix_report.load_results(path)
        self.assertEqual([(r["param"], r["ctx"]) for r in rows], [("1", "1.70"), ("2", "-")])


class Report(TempFiles):
    def goals(self, lines):
        """The goals table made from these results.tsv lines."""
        path = self.write("results.tsv", "\n".join(lines) + "\n")
        out = []
        matrix_report.section_goals(matrix_report.load_results(path), out, None)
        return out

    def test_goals_table_from_results(self):
        lines = []
        for system, iops, cpu in (("tgt", 50000, 20.0), ("openarray", 110000, 6.0)):
            lines.append(f"sessions\t{system}\t4k-randread-qd32\t1\t{iops}\t-\t-\t-\t-\t-\t{cpu}\t-")
        out = self.goals(lines)
        goal = next(line for line in out if line.startswith("| 4K random read QD32"))
        self.assertIn("= 2.20x", goal)
        self.assertIn("= 0.30x", goal)
        self.assertTrue(goal.endswith("| yes |"))
        unmeasured = next(line for line in out if line.startswith("| 1 MiB sequential read"))
        self.assertTrue(unmeasured.endswith("| not measured |"))

    def test_writes_are_held_against_the_same_tools_reads(self):
        lines = [
            "write\topenarray\t4k-read\t32\t100000\t-\t-\t-\t-\t-\t7.0\t8.0\t0.05",
            "write\topenarray\t4k-write\t32\t75000\t-\t-\t-\t-\t-\t9.0\t12.5\t0.05",
            "write\ttgt\t4k-write\t32\t30000\t-\t-\t-\t-\t-\t25.0\t15.0\t1.5",
            "sessions\topenarray\t4k-randread-qd32\t1\t150000\t-\t-\t-\t-\t-\t6.0\t-",
        ]
        goal = next(line for line in self.goals(lines) if line.startswith("| 4K write QD32"))
        self.assertIn("0.75 of the same tool's reads", goal)
        self.assertIn("0.50 of iscsi-perf's", goal)
        self.assertIn("2.50x tgt", goal)
        # qemu-img's 12.5 µs per write: one thread does at most 1e6 / 12.5 a second.
        self.assertIn("qemu-img's own 12.5 µs of CPU per write (8.0 per read) "
                      "caps its one thread at 80 000", goal)
        self.assertTrue(goal.endswith("| yes |"))

    def test_qemu_img_table_shows_each_systems_client_cpu(self):
        path = self.write("results.tsv", "\n".join([
            "write\ttgt\t4k-write\t32\t30000\t-\t-\t-\t-\t-\t25.0\t15.0\t1.5",
            "write\topenarray\t4k-write\t32\t75000\t-\t-\t-\t-\t-\t9.0\t12.5\t0.05",
        ]) + "\n")
        out = []
        matrix_report.section_direct_io(matrix_report.load_results(path), out, 3000.0)
        row = next(line for line in out if line.startswith("| 4K write QD32"))
        self.assertIn("| 15.0 / 12.5 |", row)
        unmeasured = next(line for line in out if line.startswith("| 4K read QD32"))
        self.assertIn("| – / – |", unmeasured)

    def test_random_writes_are_held_against_the_higher_read_figure(self):
        base = [
            "matrix\topenarray\t4k-randwrite\t32\t80000\t-\t-\t-\t-\t-\t11.0\t11.0\t0.03",
            "matrix\ttgt\t4k-randwrite\t32\t36000\t-\t-\t-\t-\t-\t28.0\t15.0\t1.90",
            "matrix\topenarray\t4k-randread\t32\t40000\t-\t-\t-\t-\t-\t10.0\t9.0\t0.03",
        ]

        def goal(headline_reads):
            lines = base + [f"sessions\topenarray\t4k-randread-qd32\t1\t{headline_reads}"
                            "\t-\t-\t-\t-\t-\t7.0\t-"]
            return next(line for line in self.goals(lines)
                        if line.startswith("| 4K random write QD32 (fio"))

        met = goal(100000)
        self.assertIn("2.00 of fio's random reads", met)
        self.assertIn("0.80 of iscsi-perf's", met)
        self.assertIn("2.22x tgt", met)
        # fio's 11.0 µs per write: one thread does at most 1e6 / 11.0 a second.
        self.assertIn("fio's own 11.0 µs of CPU per write caps its one thread at 90 909", met)
        self.assertTrue(met.endswith("| yes |"))
        # Faster headline reads: 0.67 of them is not enough, whatever fio's reads.
        self.assertTrue(goal(120000).endswith("| **no** |"))

    def matrix(self, lines):
        """Section 1 made from these results.tsv lines."""
        path = self.write("results.tsv", "\n".join(lines) + "\n")
        out = []
        matrix_report.section_matrix(matrix_report.load_results(path), out)
        return out

    def test_nbd_export_beside_both_targets_where_measured(self):
        iscsi = [
            "matrix\topenarray\t4k-randread\t32\t120000\t491.5\t200\t-\t300\t400\t3.0\t8.0\t0.03",
            "matrix\ttgt\t4k-randread\t32\t40000\t163.8\t700\t-\t900\t990\t20.0\t9.0\t1.90",
        ]
        without = self.matrix(iscsi)
        self.assertIn("| workload | QD | tgt | openarray |", without)
        self.assertFalse(any("NBD" in line for line in without))
        out = self.matrix(iscsi + [
            "matrix\topenarray-nbd\t4k-randread\t32\t150000\t614.4\t150\t-\t250\t350\t2.0\t7.0\t-"])
        self.assertIn("| workload | QD | tgt | openarray | openarray NBD |", out)
        self.assertIn("| 4K random read | 32 | 700 / 900 / 990 | 200 / 300 / 400 | 150 / 250 / 350 |", out)
        row = next(line for line in out if line.startswith("| 4K random read | 32 | 150 000"))
        self.assertEqual(row, "| 4K random read | 32 | 150 000 | 1.25 | 3.75 | 614 | 2.0 | 3.0 | 7.0 / 8.0 |")

    def test_o_direct_is_held_against_fio_at_the_same_depth_beside_its_qd16_figure(self):
        lines = [
            "direct\tfio-io_uring\t4k-randread\t32\t100000\t-\t-\t-\t-\t-\t-\t-\t-",
            "direct\topenarray\t4k-randread\t32\t64000\t-\t-\t-\t-\t-\t8.0\t-\t0.07",
        ]

        def goal(extra):
            return next(line for line in self.goals(lines + extra)
                        if line.startswith("| O_DIRECT"))

        alone = goal([])
        self.assertIn("64 000 vs 100 000 IOPS = 0.64 |", alone)
        self.assertNotIn("QD16", alone)
        with_bound = goal(["direct\tfio-io_uring\t4k-randread\t16\t80000"
                           "\t-\t-\t-\t-\t-\t-\t-\t-"])
        self.assertIn("80 000 = 0.80 of its QD32 one", with_bound)
        self.assertIn("openarray's QD32 = 0.80 of it", with_bound)
        # The goal stays the QD32 figure against fio's at QD32.
        self.assertTrue(with_bound.endswith("| **no** |"))

    def test_data_digest_cost_against_no_digests(self):
        lines = [
            "digests\topenarray\t64k-randread-none\t32\t30000\t1966.1\t-\t-\t-\t-\t28.0\t10.0\t-",
            "digests\topenarray\t64k-randread-header+data\t32\t25000\t1638.4\t-\t-\t-\t-\t35.0\t13.0\t-",
        ]
        goal = next(line for line in self.goals(lines) if line.startswith("| data digest"))
        self.assertEqual(goal, "| data digest cost reported | CPU/IO with header and data "
                               "CRC32C against none: 64k-randread 1.25x | yes |")
        out = []
        path = self.write("digests.tsv", "\n".join(lines) + "\n")
        matrix_report.section_digest(matrix_report.load_results(path), out)
        both = next(line for line in out if line.startswith("| 64k-randread | header+data"))
        self.assertIn("| 35.0 | +25 % | 13.0 |", both)
        self.assertTrue(self.goals([])[-2].endswith("| not measured |"))


if __name__ == "__main__":
    unittest.main()
