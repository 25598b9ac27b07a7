//! `openarray bench` against the daemon's own RAM devices: the report
//! folder of a short matrix over NBD, iSCSI and NVMe/TCP, the guard rail
//! of write patterns on a device that holds data, and a comparison of two
//! exports.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::admin::AdminDaemon;
use common::{free_port, require_tool, retrying_taken_ports, run_echoed};

const IQN: &str = "iqn.2026-11.org.openarray.test:bench";
const NQN: &str = "nqn.2026-11.org.openarray.test:bench";

/// A portal, NBD and NVMe/TCP on free ports; devices `a` (also LUN 0 and
/// namespace 1), `full`, `b` and `c`, each exported over NBD under its
/// own name.
struct Served {
    _daemon: AdminDaemon,
    port: u16,
    nbd: SocketAddr,
    nvmf: u16,
    dir: tempfile::TempDir,
}

fn serve() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let mut devices = String::new();
    for name in ["a", "full", "b", "c"] {
        devices += &format!(
            "[[device]]\nname = \"{name}\"\nkind = \"mem\"\nsize = \"64M\"\n\n\
             [[nbd.export]]\nname = \"{name}\"\ndevice = \"{name}\"\n\n"
        );
    }
    let (daemon, port, nbd_port, nvmf) = retrying_taken_ports(|| {
        let (port, nbd_port, nvmf) = (free_port(), free_port(), free_port());
        let text = format!(
            "[[portal]]\nlisten = \"127.0.0.1:{port}\"\n\n[nbd]\nlisten = [\"127.0.0.1:{nbd_port}\"]\n\n\
             {devices}[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nlun = 0\ndevice = \"a\"\n\n\
             [nvmf]\nlisten = [\"127.0.0.1:{nvmf}\"]\n\n[[nvmf.subsystem]]\nnqn = \"{NQN}\"\n\
             allow_hosts = [\"*\"]\n\n[[nvmf.subsystem.namespace]]\nnsid = 1\ndevice = \"a\"\n"
        );
        let cfg = dir.path().join("openarray.toml");
        std::fs::write(&cfg, text).unwrap();
        AdminDaemon::try_start(&cfg, dir.path(), port).map(|d| (d, port, nbd_port, nvmf))
    });
    Served {
        _daemon: daemon,
        port,
        nbd: SocketAddr::from(([127, 0, 0, 1], nbd_port)),
        nvmf,
        dir,
    }
}

impl Served {
    fn nbd_url(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.nbd)
    }

    fn iscsi_url(&self) -> String {
        format!("iscsi://127.0.0.1:{}/{IQN}/0", self.port)
    }

    fn nvmf_url(&self) -> String {
        format!("nvme+tcp://127.0.0.1:{}/{NQN}/1", self.nvmf)
    }
}

fn bench(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_openarray"));
    cmd.arg("bench").args(args);
    run_echoed(cmd, Duration::from_secs(120))
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The rows of report.md's first table: pattern, QD and IOPS.
fn table_rows(report: &str) -> Vec<(String, u32, f64)> {
    report
        .lines()
        .skip_while(|l| !l.starts_with("| pattern |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (
                cells[1].to_string(),
                cells[2].parse().unwrap(),
                cells[4].parse().unwrap(),
            )
        })
        .collect()
}

/// A PNG file: its signature, and an IHDR chunk with a non-empty image.
fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        path.display()
    );
    assert_eq!(&bytes[12..16], b"IHDR", "{}", path.display());
    let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert!(
        width > 100 && height > 100,
        "{}: {width}x{height}",
        path.display()
    );
    assert!(
        bytes.ends_with(b"IEND\xaeB`\x82"),
        "{} is cut short",
        path.display()
    );
}

/// A short matrix's report folder: one row per point with real IOPS, the
/// plots, results.json, and the engine named.
fn check_report(dir: &Path, stderr: &str, engine: &str) {
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let rows = table_rows(&report);
    let points: Vec<(&str, u32)> = rows.iter().map(|(p, d, _)| (p.as_str(), *d)).collect();
    assert_eq!(
        points,
        [
            ("4K randread", 1),
            ("4K randread", 4),
            ("4K randwrite", 1),
            ("4K randwrite", 4)
        ],
        "{report}"
    );
    assert!(rows.iter().all(|r| r.2 > 0.0), "{report}");
    assert!(report.contains(&format!("Engine: {engine}")), "{report}");
    assert!(stderr.contains(engine), "{stderr}");
    assert!(
        report.contains("## Client machine") && report.contains("kernel: "),
        "{report}"
    );
    for png in ["iops.png", "bandwidth.png", "latency-p99.png"] {
        assert!(report.contains(&format!("]({png})")), "{report}");
        assert_png(&dir.join(png));
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{json}");
    assert!(
        rows.iter()
            .all(|r| r["measured"][0]["iops"].as_f64().unwrap() > 0.0),
        "{json}"
    );
    assert!(json["machine"]["cores"].as_u64().unwrap() > 0, "{json}");
}

const SHORT: [&str; 6] = [
    "--runtime",
    "1",
    "--depths",
    "1,4",
    "--patterns",
    "randread,randwrite",
];

#[test]
fn nbd_matrix_writes_a_report_folder() {
    require_tool("fio");
    let s = serve();
    let out_dir = s.dir.path().join("nbd-report");
    let url = s.nbd_url("a");
    let mut args = vec![url.as_str(), "--out", out_dir.to_str().unwrap()];
    args.extend(SHORT);
    let out = bench(&args);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    check_report(&out_dir, &stderr, "fio nbd engine");
    assert_eq!(table_rows(&stdout).len(), 4, "{stdout}");
}

#[test]
fn write_patterns_need_destroy_data_on_a_device_that_holds_data() {
    require_tool("fio");
    require_tool("qemu-io");
    let s = serve();
    let url = s.nbd_url("full");
    // Data in one stretch of the middle: the first sampled block in it is
    // the one the refusal must name.
    let (from, len) = (40u64 << 20, 1u64 << 20);
    let sampled = bench::probe::sample_offsets(64 << 20);
    let first = sampled
        .iter()
        .find(|&&o| o >= from && o < from + len)
        .unwrap();
    let mut write = Command::new("qemu-io");
    write
        .args(["-f", "raw", "-c"])
        .arg(format!("write -P 0x5a {from} {len}"))
        .arg(&url);
    assert!(run_echoed(write, Duration::from_secs(60)).status.success());

    let out_dir = s.dir.path().join("guard");
    let out_dir = out_dir.to_str().unwrap();
    // One point of `pattern` at QD1 into the folder `guard`.
    let one = |pattern: &str, extra: &[&str]| {
        let mut args = vec![url.as_str(), "--runtime", "1", "--depths", "1"];
        args.extend(["--patterns", pattern, "--out", out_dir]);
        args.extend(extra);
        bench(&args)
    };
    let refused = one("randwrite", &[]);
    let (_, stderr) = text(&refused);
    assert!(!refused.status.success(), "{stderr}");
    let offset = format!("byte offset {first} ");
    assert!(stderr.contains(&offset), "{stderr}");
    assert!(stderr.contains("--destroy-data"), "{stderr}");
    assert!(!Path::new(out_dir).join("report.md").exists());

    let reads = one("randread", &[]);
    assert!(reads.status.success(), "{:?}", text(&reads));

    let accepted = one("randwrite", &["--destroy-data"]);
    assert!(accepted.status.success(), "{:?}", text(&accepted));
    let report = std::fs::read_to_string(Path::new(out_dir).join("report.md")).unwrap();
    let rows = table_rows(&report);
    assert!(
        rows.len() == 1 && rows[0].0 == "4K randwrite" && rows[0].2 > 0.0,
        "{report}"
    );
}

#[test]
fn compare_runs_both_targets_and_reports_ratios() {
    require_tool("fio");
    let s = serve();
    let out_dir = s.dir.path().join("compare");
    let (b, c) = (s.nbd_url("b"), s.nbd_url("c"));
    let out = bench(&[
        &b,
        "--compare",
        &c,
        "--runtime",
        "1",
        "--depths",
        "1,4",
        "--patterns",
        "randread",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let ratios: Vec<f64> = stdout
        .lines()
        .skip_while(|l| !l.starts_with(&format!("ratios {b} / {c}")))
        .filter(|l| l.starts_with("| 4K randread"))
        .map(|l| l.split('|').nth(3).unwrap().trim().parse().unwrap())
        .collect();
    assert_eq!(ratios.len(), 2, "{stdout}");
    // The same RAM device kind on the same daemon: within a wide margin of
    // each other, and certainly not zero or missing.
    assert!(ratios.iter().all(|r| *r > 0.1 && *r < 10.0), "{stdout}");
    let report = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(
        report.contains(&format!("## Ratios: {b} / {c}")),
        "{report}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("results.json")).unwrap())
            .unwrap();
    assert_eq!(json["targets"].as_array().unwrap().len(), 2);
    assert!(
        json["rows"][1]["measured"][1]["iops"].as_f64().unwrap() > 0.0,
        "{json}"
    );
}

/// The built-in initiator unless a fio with the libiscsi engine is found.
fn iscsi_engine() -> &'static str {
    match bench::fio::find_with_engine("libiscsi") {
        Some(_) => "fio libiscsi engine",
        None => "built-in iSCSI initiator",
    }
}

#[test]
fn iscsi_matrix_writes_a_report_folder_and_its_writes_land() {
    let s = serve();
    let out_dir = s.dir.path().join("iscsi-report");
    let url = s.iscsi_url();
    let mut args = vec![
        url.as_str(),
        "--jobs",
        "2",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    args.extend(SHORT);
    let out = bench(&args);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    check_report(&out_dir, &stderr, iscsi_engine());

    // The LUN's device is also export `a`: the writes are there to read.
    let target = bench::url::Target::parse(&s.nbd_url("a")).unwrap();
    let mut nbd = bench::nbd_client::NbdClient::connect(&target).unwrap();
    let at = bench::probe::first_data(&mut nbd)
        .unwrap()
        .expect("the writes landed");
    assert!(nbd.read(at, 4096).unwrap().iter().any(|&b| b != 0));
    drop(nbd);

    // So the guard rail, reading through iSCSI, now refuses writes.
    let again = bench(&[
        &url,
        "--runtime",
        "1",
        "--depths",
        "1",
        "--patterns",
        "randwrite",
    ]);
    let (_, stderr) = text(&again);
    assert!(!again.status.success(), "{stderr}");
    assert!(
        stderr.contains("holds data (the block at byte offset"),
        "{stderr}"
    );
}

#[test]
fn nvme_tcp_matrix_writes_a_report_folder_and_its_writes_land() {
    let s = serve();
    let out_dir = s.dir.path().join("nvmf-report");
    let url = s.nvmf_url();
    // Two jobs: two I/O queues even at QD1, on any number of cores.
    let mut args = vec![
        url.as_str(),
        "--jobs",
        "2",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    args.extend(SHORT);
    let out = bench(&args);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    check_report(&out_dir, &stderr, "built-in NVMe/TCP initiator");
    let report = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(report.contains(&url), "{report}");

    // The namespace's device is also export `a`: the writes are there.
    let target = bench::url::Target::parse(&s.nbd_url("a")).unwrap();
    let mut nbd = bench::nbd_client::NbdClient::connect(&target).unwrap();
    let at = bench::probe::first_data(&mut nbd)
        .unwrap()
        .expect("the writes landed");
    assert_eq!(nbd.read(at, 4096).unwrap(), vec![0xa5; 4096]);
    drop(nbd);

    // The guard rail reads through NVMe/TCP too, and now refuses writes.
    let again = bench(&[
        &url,
        "--runtime",
        "1",
        "--depths",
        "1",
        "--patterns",
        "randwrite",
    ]);
    let (_, stderr) = text(&again);
    assert!(!again.status.success(), "{stderr}");
    assert!(
        stderr.contains("holds data (the block at byte offset"),
        "{stderr}"
    );
}

/// The rows of the report.md table under `heading`: pattern, QD, and the
/// numeric cells after them.
fn section_rows(report: &str, heading: &str) -> Vec<(String, u32, Vec<f64>)> {
    report
        .lines()
        .skip_while(|l| !l.starts_with(heading))
        .skip_while(|l| !l.starts_with("| pattern |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let numbers = cells[3..cells.len() - 1]
                .iter()
                .map(|c| c.parse().unwrap_or_else(|_| panic!("{c} in {l}")))
                .collect();
            (cells[1].to_string(), cells[2].parse().unwrap(), numbers)
        })
        .collect()
}

/// A short matrix of every pattern, the daemon's iSCSI LUN compared with
/// one of its NBD exports (two transports, two load engines): both tables,
/// the ratios, results.json and the plots, with the sequential block size
/// given on the command line.
#[test]
fn compare_iscsi_with_nbd_over_a_short_matrix() {
    require_tool("fio");
    let s = serve();
    let out_dir = s.dir.path().join("iscsi-vs-nbd");
    let (iscsi, nbd) = (s.iscsi_url(), s.nbd_url("b"));
    let out = bench(&[
        &iscsi,
        "--compare",
        &nbd,
        "--runtime",
        "1",
        "--depths",
        "1,8",
        "--seq-block-size",
        "256K",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let report = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    let points: Vec<(String, u32)> = [
        "4K randread",
        "4K randwrite",
        "256K seqread",
        "256K seqwrite",
    ]
    .iter()
    .flat_map(|p| [1, 8].map(|d| (p.to_string(), d)))
    .collect();
    for heading in [format!("## {iscsi}"), format!("## {nbd}")] {
        let rows = section_rows(&report, &heading);
        let got: Vec<(String, u32)> = rows.iter().map(|r| (r.0.clone(), r.1)).collect();
        assert_eq!(got, points, "{heading}\n{report}");
        // jobs, IOPS, MB/s, p50, p99 and p99.9: all measured.
        for (pattern, depth, cells) in &rows {
            assert!(
                cells[..6].iter().all(|&v| v > 0.0),
                "{heading} {pattern} QD{depth}: {cells:?}\n{report}"
            );
        }
    }
    let ratios = section_rows(&report, &format!("## Ratios: {iscsi} / {nbd}"));
    assert_eq!(ratios.len(), points.len(), "{report}");
    assert!(
        ratios.iter().all(|r| r.2.iter().all(|&v| v > 0.0)),
        "{report}"
    );
    assert!(report.contains("Engine: fio nbd engine"), "{report}");
    assert!(
        report.contains(&format!("Engine: {}", iscsi_engine())),
        "{report}"
    );
    for png in ["iops.png", "bandwidth.png", "latency-p99.png"] {
        assert_png(&out_dir.join(png));
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("results.json")).unwrap())
            .unwrap();
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), points.len(), "{json}");
    for row in rows {
        let block = row["point"]["block_size"].as_u64().unwrap();
        assert!(block == 4096 || block == 256 << 10, "{row}");
        let measured = row["measured"].as_array().unwrap();
        assert_eq!(measured.len(), 2, "{row}");
        for m in measured {
            for field in ["iops", "bytes_per_sec", "p50_us", "p99_us", "ios"] {
                assert!(m[field].as_f64().unwrap() > 0.0, "{field}: {row}");
            }
        }
    }
    // The ratio table is printed too.
    assert!(
        stdout.contains(&format!("ratios {iscsi} / {nbd}")),
        "{stdout}"
    );
}
