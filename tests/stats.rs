//! Statistics per LUN and initiator: real I/O from two initiators (our own
//! test initiator writing and reading LUN 0, libiscsi's `iscsi-perf`
//! reading LUN 5) shows up in `/metrics` (on the administration socket and
//! on `--metrics-listen`), in `GET /v1/stats` and in `openarray stat`, each
//! under its own LUN and initiator.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::iscsi::{LoginParams, Session};
use common::{free_port, listening_on, require_tool, run_with_timeout, serve_command};
use common::{http_get as get, metric_sample as sample};

const TARGET: &str = "iqn.2026-11.org.test:stats";
const WRITER: &str = "iqn.2026-11.org.test:writer";
const READER: &str = "iqn.2026-11.org.test:reader";

const CONFIG: &str = r#"[[portal]]
listen = "127.0.0.1:3260"

[[device]]
name = "a"
kind = "mem"
size = "64M"

[[device]]
name = "b"
kind = "mem"
size = "64M"

[[target]]
name = "iqn.2026-11.org.test:stats"
[[target.lun]]
lun = 0
device = "a"
[[target.lun]]
lun = 5
device = "b"
"#;

/// The daemon with an administration socket and a metrics port; killed on drop.
struct Daemon {
    child: Child,
    port: u16,
    metrics_port: u16,
    socket: PathBuf,
    log: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        let config = dir.join("stats.toml");
        std::fs::write(&config, CONFIG).unwrap();
        let (port, metrics_port) = (free_port(), free_port());
        let socket = dir.join("admin.sock");
        let log = dir.join("daemon.log");
        let logfile = std::fs::File::create(&log).unwrap();
        let child = serve_command()
            .arg("--config")
            .arg(&config)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--admin-socket")
            .arg(&socket)
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .stdin(Stdio::null())
            .stdout(logfile.try_clone().unwrap())
            .stderr(logfile)
            .spawn()
            .expect("spawn openarray serve");
        let d = Daemon {
            child,
            port,
            metrics_port,
            socket,
            log,
        };
        let start = Instant::now();
        while !listening_on(&d.log(), port)
            || std::net::TcpStream::connect(("127.0.0.1", metrics_port)).is_err()
            || !d.socket.exists()
        {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "daemon did not start:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn labels(lun: u64, initiator: &str, extra: &str) -> String {
    format!(r#"target="{TARGET}",lun="{lun}",initiator="{initiator}"{extra}"#)
}

#[test]
fn io_is_counted_per_lun_and_initiator() {
    require_tool("iscsi-perf");
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path());

    // Verified writes and reads of 4 KiB on LUN 0 by the writer.
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], daemon.port));
    let mut session = Session::login(
        addr,
        &LoginParams::normal(WRITER, TARGET),
        Duration::from_secs(10),
    )
    .expect("writer login");
    for i in 0..100u32 {
        let data = vec![(i % 251) as u8; 4096];
        session.write10(0, i * 8, &data, 512).unwrap();
        assert_eq!(session.read10(0, i * 8, 8, 512).unwrap(), data);
    }
    session.logout().unwrap();

    // libiscsi's iscsi-perf reads LUN 5 as the reader for a few seconds,
    // while `openarray stat` watches.
    let url = format!("iscsi://127.0.0.1:{}/{TARGET}/5", daemon.port);
    let mut perf = Command::new("iscsi-perf")
        .args(["-i", READER, "-t", "4", "-m", "8", &url])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn iscsi-perf");
    std::thread::sleep(Duration::from_millis(1000));
    let mut stat = Command::new(env!("CARGO_BIN_EXE_openarray"));
    stat.arg("stat")
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["--interval", "1", "--count", "2"]);
    let out = run_with_timeout(stat, Duration::from_secs(30));
    let stat_text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!(
        "openarray stat:\n{stat_text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success());
    let perf_status = perf.wait().unwrap();
    assert!(
        perf_status.success(),
        "iscsi-perf failed:\n{}",
        daemon.log()
    );

    // Two reports, each with the reader's reads of LUN 5 and nothing of
    // LUN 0 (the writer was done before `stat` started).
    assert_eq!(stat_text.matches(&format!("target {TARGET}")).count(), 2);
    let rows: Vec<Vec<&str>> = stat_text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|cols| cols.len() == 14 && cols[1].starts_with("iqn."))
        .collect();
    assert_eq!(rows.len(), 2, "{stat_text}");
    for cols in &rows {
        assert_eq!((cols[0], cols[1]), ("5", READER), "{stat_text}");
        let reads: f64 = cols[2].parse().unwrap();
        let writes: f64 = cols[3].parse().unwrap();
        assert!(reads > 10.0 && writes == 0.0, "{stat_text}");
        let p50: f64 = cols[6].parse().unwrap();
        let p999: f64 = cols[8].parse().unwrap();
        assert!(p50 > 0.0 && p999 >= p50, "{stat_text}");
    }

    // Prometheus text on the metrics port and on the administration socket.
    let (status, text) = get(
        std::net::TcpStream::connect(("127.0.0.1", daemon.metrics_port)).unwrap(),
        "/metrics",
    );
    assert!(status.contains(" 200 "), "{status}");
    let (status, on_socket) = get(
        std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap(),
        "/metrics",
    );
    assert!(status.contains(" 200 "), "{status}");
    let commands = "openarray_scsi_commands_total";
    let bytes = "openarray_scsi_bytes_total";
    let errors = "openarray_scsi_errors_total";
    for text in [&text, &on_socket] {
        let w = |op: &str| labels(0, WRITER, &format!(r#",op="{op}""#));
        // The session's first command meets the power-on unit attention
        // and is sent again: one failed command more, its bytes not counted.
        let failed =
            sample(text, errors, &w("write")).unwrap() + sample(text, errors, &w("read")).unwrap();
        assert_eq!(failed, 1.0, "{text}");
        assert_eq!(
            sample(text, commands, &w("write")).unwrap()
                + sample(text, commands, &w("read")).unwrap(),
            201.0
        );
        assert_eq!(sample(text, bytes, &w("write")), Some(409_600.0));
        assert_eq!(sample(text, bytes, &w("read")), Some(409_600.0));
        let r = |op: &str| labels(5, READER, &format!(r#",op="{op}""#));
        let reads = sample(text, commands, &r("read")).expect("reader's reads");
        assert!(reads > 100.0, "{reads}");
        assert!(sample(text, bytes, &r("read")).unwrap() >= reads * 512.0);
        assert_eq!(sample(text, commands, &r("write")), Some(0.0));
        // Each initiator only where it did I/O.
        assert_eq!(
            sample(text, commands, &labels(0, READER, r#",op="read""#)),
            None
        );
        assert_eq!(
            sample(text, commands, &labels(5, WRITER, r#",op="read""#)),
            None
        );
        for q in ["0.5", "0.99", "0.999"] {
            let at = labels(5, READER, &format!(r#",op="read",quantile="{q}""#));
            let seconds = sample(text, "openarray_scsi_latency_seconds", &at)
                .unwrap_or_else(|| panic!("no p{q} in\n{text}"));
            assert!(seconds > 0.0 && seconds < 1.0, "p{q} = {seconds}");
        }
        assert_eq!(
            sample(text, "openarray_scsi_in_flight", &labels(5, READER, "")),
            Some(0.0)
        );
    }

    // The JSON behind `openarray stat`.
    let (status, json) = get(
        std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap(),
        "/v1/stats",
    );
    assert!(status.contains(" 200 "), "{status}");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let entries = json["entries"].as_array().unwrap();
    let writer = entries
        .iter()
        .find(|e| e["lun"] == 0 && e["initiator"] == WRITER)
        .expect("writer's entry");
    assert_eq!(writer["write"]["bytes"], 409_600);
    assert_eq!(writer["target"], TARGET);
}
