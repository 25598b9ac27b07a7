//! A LUN served through `faulty(delay(file))`, configured as a graph of
//! devices: the delay slows every command down, and faults injected live
//! with `openarray device fault` reach the initiator as the sense data a
//! failing disk gives (MEDIUM ERROR, unrecovered read error / write error)
//! or, for a silent corruption, as wrong bytes; `heal` and a rewrite
//! clear them. `device show` prints the tree with each node's state.
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::admin::AdminDaemon;
use common::free_port;
use common::iscsi::{rw10_cdb, Completion, LoginParams, Session};

const IQN: &str = "iqn.2026-11.org.openarray.test:graph";
const BLOCK: u32 = 512;
const LATENCY: Duration = Duration::from_millis(20);

fn config(dir: &Path, port: u16) -> String {
    format!(
        r#"
[[portal]]
listen = "127.0.0.1:{port}"

[[device]]
name = "disk0"
kind = "file"
path = "{d}/disk0.img"
size = "4M"

[[device]]
name = "slow0"
kind = "delay"
over = "disk0"
latency = "20ms"
iops = 1000
bandwidth = "100M"

[[device]]
name = "flaky0"
kind = "faulty"
over = "slow0"

[[target]]
name = "{IQN}"
[[target.lun]]
lun = 0
device = "flaky0"
"#,
        d = dir.display()
    )
}

/// (sense key, ASC, ASCQ) of a CHECK CONDITION in fixed format.
fn sense(c: &Completion) -> (Option<u8>, Option<u8>, Option<u8>) {
    (
        c.sense_key(),
        c.sense.get(12).copied(),
        c.sense.get(13).copied(),
    )
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn faults_injected_live_reach_the_initiator_as_sense_data() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = dir.path().join("openarray.toml");
    std::fs::write(&cfg, config(dir.path(), port)).unwrap();
    let daemon = AdminDaemon::start(&cfg, dir.path(), port);
    let params = LoginParams::normal("iqn.2026-11.org.openarray.test:host", IQN);
    let mut s = Session::login(daemon.addr(), &params, Duration::from_secs(10)).unwrap();

    let data = pattern(7, 8 * BLOCK as usize);
    s.write10(0, 0, &data, BLOCK).unwrap();
    s.command_good(0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0)
        .unwrap();
    let started = Instant::now();
    assert_eq!(s.read10(0, 0, 8, BLOCK).unwrap(), data);
    assert!(
        started.elapsed() >= LATENCY,
        "the delay device added nothing: {:?}",
        started.elapsed()
    );

    let shown = daemon.ok(&["device", "show", "flaky0"]);
    assert!(shown.contains("flaky0 (faulty, 4M)"), "{shown}");
    assert!(shown.contains("└─ slow0 (delay, 4M)"), "{shown}");
    assert!(shown.contains("latency 20ms"), "{shown}");
    assert!(shown.contains("└─ disk0 (file, 4M)"), "{shown}");

    // Reads fail: MEDIUM ERROR, UNRECOVERED READ ERROR; writes still work.
    daemon.ok(&["device", "fault", "flaky0", "fail", "--reads"]);
    let shown = daemon.ok(&["device", "show", "flaky0"]);
    assert!(shown.contains("failing reads"), "{shown}");
    let c = s
        .command(0, &rw10_cdb(0x28, 0, 8), &[], data.len())
        .unwrap();
    assert_eq!((c.status, sense(&c)), (2, (Some(3), Some(0x11), Some(0))));
    s.write10(0, 16, &data, BLOCK).unwrap();

    // Writes fail: MEDIUM ERROR, WRITE ERROR.
    daemon.ok(&["device", "fault", "flaky0", "fail", "--writes"]);
    let c = s.command(0, &rw10_cdb(0x2a, 0, 8), &data, 0).unwrap();
    assert_eq!((c.status, sense(&c)), (2, (Some(3), Some(0x0c), Some(0))));
    assert_eq!(s.read10(0, 0, 8, BLOCK).unwrap(), data);

    daemon.ok(&["device", "fault", "flaky0", "heal"]);
    assert_eq!(s.read10(0, 16, 8, BLOCK).unwrap(), data);

    // A silent corruption of one block: no error, wrong bytes there only.
    daemon.ok(&["device", "fault", "flaky0", "corrupt", "1024", "512"]);
    let read = s.read10(0, 0, 8, BLOCK).unwrap();
    assert_eq!(read[..1024], data[..1024]);
    assert_ne!(read[1024..1536], data[1024..1536]);
    assert_eq!(read[1536..], data[1536..]);
    // Rewritten, the block is whole again.
    s.write10(0, 2, &data[1024..1536], BLOCK).unwrap();
    assert_eq!(s.read10(0, 0, 8, BLOCK).unwrap(), data);

    // Only a `faulty` device takes faults, and only one that exists.
    let out = daemon.cli(&["device", "fault", "slow0", "fail"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a `faulty` device"));
    let out = daemon.cli(&["device", "fault", "nothing", "heal"]);
    assert_eq!(out.status.code(), Some(1));
    s.logout().unwrap();
    assert!(daemon.terminate().success());
}

#[test]
fn a_graph_with_a_loop_or_a_shared_device_is_refused_with_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = config(dir.path(), port);
    let looped = base.replace("over = \"disk0\"", "over = \"flaky0\"");
    let shared =
        format!("{base}\n[[device]]\nname = \"f2\"\nkind = \"faulty\"\nover = \"slow0\"\n");
    let under = base.replace("device = \"flaky0\"", "device = \"slow0\"");
    for (text, expected) in [
        (looped, "devices form a loop"),
        (shared, "`slow0` is already used by device `flaky0`"),
        (
            under,
            "`slow0` is under device `flaky0` and cannot also be a LUN",
        ),
    ] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let out = common::admin::run_openarray(["check-config", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(expected), "{stderr}");
        assert!(stderr.contains("bad.toml:"), "{stderr}");
    }
}
