//! `[[schedule]]` with a fast clock: a volume is snapshotted every two
//! seconds, the newest `keep` are kept, and a VDI clone is refreshed to the
//! newest snapshot only while no session is logged in to its target; the
//! snapshot the clone still depends on is kept past `keep` until then.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::admin::{run_openarray, AdminDaemon};
use common::free_port;
use common::iscsi::{rw10_cdb, LoginParams, Session};
use serde_json::Value;

const GOLD: &str = "iqn.2026-11.org.test:gold";
const VDI: &str = "iqn.2026-11.org.test:vdi";
const HOST: &str = "iqn.2026-11.org.test:host";
const KEEP: usize = 2;

fn pool(dir: &Path) -> String {
    format!(
        "[[pool]]\nname = \"tank\"\ndevices = [\"{}/tank0.img\"]\ndevice_size = \"64M\"\nunit_size = \"64K\"\n",
        dir.display()
    )
}

fn config(dir: &Path, port: u16) -> String {
    format!(
        r#"{pool}
[[schedule]]
volume = "gold"
every = "2s"
keep = {KEEP}
refresh = ["vdi"]

[[portal]]
listen = "127.0.0.1:{port}"

[[device]]
name = "gold"
kind = "volume"
pool = "tank"

[[device]]
name = "vdi"
kind = "volume"
pool = "tank"

[[target]]
name = "{GOLD}"
[[target.lun]]
lun = 0
device = "gold"

[[target]]
name = "{VDI}"
[[target.lun]]
lun = 0
device = "vdi"
"#,
        pool = pool(dir)
    )
}

fn get(socket: &Path, path: &str) -> Value {
    let mut s = UnixStream::connect(socket).expect("admin socket");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: openarray\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (_, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    serde_json::from_str(body).expect("JSON")
}

fn schedule(d: &AdminDaemon) -> Value {
    get(&d.socket, "/v1/schedules")["schedules"][0].clone()
}

/// Names of gold's scheduled snapshots, and the parent of the clone.
fn lineage(d: &AdminDaemon) -> (Vec<String>, String) {
    let vols = get(&d.socket, "/v1/volumes/tank");
    let list = vols["volumes"].as_array().expect("volumes").clone();
    let autos = list
        .iter()
        .filter(|v| v["name"].as_str().unwrap_or("").starts_with("gold.auto-"))
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    let parent = list
        .iter()
        .find(|v| v["name"] == "vdi")
        .and_then(|v| v["parent"].as_str())
        .unwrap_or("")
        .to_string();
    (autos, parent)
}

fn session(port: u16, target: &str) -> Session {
    let addr = ([127, 0, 0, 1], port).into();
    Session::login(
        addr,
        &LoginParams::normal(HOST, target),
        Duration::from_secs(5),
    )
    .expect("login")
}

fn write_pattern(port: u16, byte: u8) {
    let mut s = session(port, GOLD);
    s.command_good(0, &rw10_cdb(0x2a, 0, 8), &[byte; 4096], 0)
        .expect("WRITE(10) to gold");
    s.logout().unwrap();
}

fn first_block(s: &mut Session) -> Vec<u8> {
    s.command_good(0, &rw10_cdb(0x28, 0, 8), &[], 4096)
        .expect("READ(10)")
}

fn wait_until(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn snapshots_are_taken_pruned_and_a_clone_refreshed_when_free() {
    let dir = tempfile::tempdir().unwrap();
    // The volume, a first snapshot and the clone exist before the daemon.
    let setup = dir.path().join("setup.toml");
    std::fs::write(&setup, pool(dir.path())).unwrap();
    let cfg = setup.to_str().unwrap();
    for args in [
        &[
            "volume", "create", "-c", cfg, "--pool", "tank", "gold", "8M",
        ][..],
        &[
            "volume", "snapshot", "-c", cfg, "--pool", "tank", "gold", "base",
        ],
        &[
            "volume", "clone", "-c", cfg, "--pool", "tank", "base", "vdi",
        ],
    ] {
        let out = run_openarray(args);
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    let port = free_port();
    let path = dir.path().join("openarray.toml");
    std::fs::write(&path, config(dir.path(), port)).unwrap();
    let d = AdminDaemon::start(&path, dir.path(), port);

    // First run: a snapshot at once, and the clone (no session) follows it.
    write_pattern(port, 0xa1);
    let first = lineage(&d).0.len();
    wait_until(Duration::from_secs(10), "the clone's first refresh", || {
        let (autos, parent) = lineage(&d);
        autos.len() > first && autos.last() == Some(&parent)
    });
    let mut vdi = session(port, VDI);
    assert_eq!(first_block(&mut vdi), vec![0xa1; 4096]);

    // With a session on the clone's target, new snapshots do not refresh
    // it, and the one it depends on is kept past `keep`.
    let (_, pinned) = lineage(&d);
    write_pattern(port, 0xb2);
    wait_until(Duration::from_secs(15), "three more snapshots", || {
        schedule(&d)["taken"].as_u64().unwrap_or(0) >= 4
    });
    let (autos, parent) = lineage(&d);
    assert_eq!(parent, pinned, "refreshed under a logged-in session");
    assert!(autos.contains(&pinned), "pruned what the clone needs");
    assert_eq!(autos.len(), KEEP + 1, "{autos:?}");
    let s = schedule(&d);
    assert_eq!(s["waiting"], serde_json::json!(["vdi"]), "{s}");
    assert_eq!(s["held"], serde_json::json!([pinned]), "{s}");
    assert_eq!(first_block(&mut vdi), vec![0xa1; 4096], "the data moved");
    vdi.logout().unwrap();

    // Free again: refreshed to the newest, and the old one pruned.
    wait_until(Duration::from_secs(10), "the refresh after logout", || {
        let (autos, parent) = lineage(&d);
        parent != pinned && autos.last() == Some(&parent) && autos.len() == KEEP
    });
    let mut vdi = session(port, VDI);
    assert_eq!(first_block(&mut vdi), vec![0xb2; 4096]);
    vdi.logout().unwrap();
    // `status` shows the schedule.
    let status = get(&d.socket, "/v1/status");
    assert_eq!(status["schedules"][0]["volume"], "gold", "{status}");
    assert_eq!(status["healthy"], true, "{status}");

    // Each run with work to do was a job of the pool.
    let jobs = get(&d.socket, "/v1/pools/tank/jobs");
    let runs = jobs["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter(|j| j["operation"] == "scheduled snapshot" && j["state"] == "done")
        .count();
    assert!(runs >= 5, "{jobs}");
    let log = d.log();
    assert!(log.contains("clone refresh waits"), "{log}");
    assert!(log.contains("scheduled snapshot pruned"), "{log}");
}
