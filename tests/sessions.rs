//! Sessions and status of a running daemon, through the real binary: two
//! initiators log in, `openarray session list --json` and `session show`
//! describe them (addresses, negotiated parameters, LUNs used, a
//! persistent reservation), `session kill` ends one while the other's
//! verified I/O goes on, `status --json` exits 0 while healthy and 1 with
//! the pool nearly full, and `/metrics` counts sessions and logins,
//! including a refused one with its reason.

mod common;

use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::admin::{pool_config, AdminDaemon};
use common::free_port;
use common::iscsi::{rw10_cdb, LoginParams, Session};
use common::verified_io::BackgroundIo;
use common::{http_get, prometheus_sample, require_tool, run_with_timeout};
use serde_json::Value;

const TARGET: &str = "iqn.2026-11.org.test:sessions";
const KEEPER: &str = "iqn.2026-11.org.test:keeper";
const VICTIM: &str = "iqn.2026-11.org.test:victim";
const GUARDED: &str = "iqn.2026-11.org.test:guarded";
const SECRET: &str = "alice-secret-123";
/// 64 KiB units on an 8 MiB data file: 127 units for data.
const POOL_UNITS: u64 = 127;
const UNIT: usize = 64 << 10;
/// The volume of the pool, and the RAM disk.
const VOLUME: u64 = 0;
const RAM: u64 = 1;

/// The pool's volume as LUN 0 (its data file is 8M), a RAM disk as LUN 1;
/// a second target, guarded by CHAP, shows the RAM disk too and a file
/// device as its LUN 1.
fn config(dir: &std::path::Path, port: u16) -> String {
    let more = format!(
        r#"[[target.lun]]
lun = 1
device = "ram"

[[device]]
name = "ram"
kind = "mem"
size = "16M"

[[target]]
name = "{GUARDED}"
chap = {{ user = "alice", secret = "{SECRET}" }}
[[target.lun]]
lun = 0
device = "ram"
[[target.lun]]
lun = 1
device = "disk"

[[device]]
name = "disk"
kind = "file"
path = "{disk}"
size = "1M"
"#,
        disk = dir.join("disk.img").display()
    );
    pool_config(dir, port, TARGET, "8M", &more)
}

/// `iscsi-inq` of LUN 0 of [`GUARDED`] as CHAP `user` with `secret`:
/// whether it succeeded.
fn chap_inquiry(d: &AdminDaemon, user: &str, secret: &str) -> bool {
    require_tool("iscsi-inq");
    let mut cmd = Command::new("iscsi-inq");
    cmd.arg("-i").arg("iqn.2026-11.org.test:chap").arg(format!(
        "iscsi://{user}%{secret}@127.0.0.1:{}/{GUARDED}/0",
        d.port
    ));
    run_with_timeout(cmd, Duration::from_secs(60))
        .status
        .success()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn sessions(d: &AdminDaemon) -> Vec<Value> {
    let out = d.cli(&["session", "list", "--json"]);
    assert!(out.status.success());
    json_of(&out)["sessions"].as_array().unwrap().clone()
}

fn by_initiator<'a>(list: &'a [Value], initiator: &str) -> &'a Value {
    list.iter()
        .find(|s| s["initiator"] == initiator)
        .unwrap_or_else(|| panic!("{initiator} not listed: {list:?}"))
}

fn metrics(d: &AdminDaemon) -> String {
    let (status, body) = http_get(UnixStream::connect(&d.socket).unwrap(), "/metrics");
    assert!(status.contains("200"), "{status}");
    body
}

/// A command that must end GOOD (past unit attentions).
fn good(s: &mut Session, lun: u64, cdb: &[u8], data: &[u8]) {
    s.command_good(lun, cdb, data, 0)
        .unwrap_or_else(|e| panic!("CDB {cdb:02x?}: {e}"));
}

/// PERSISTENT RESERVE OUT with a basic parameter list.
fn prout(s: &mut Session, lun: u64, action: u8, kind: u8, key: u64, sark: u64) {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    good(s, lun, &[0x5f, action, kind, 0, 0, 0, 0, 0, 24, 0], &p);
}

#[test]
fn sessions_are_listed_killed_and_counted_and_status_tells_health() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let path = dir.path().join("sessions.toml");
    std::fs::write(&path, config(dir.path(), port)).unwrap();
    let d = AdminDaemon::start(&path, dir.path(), port);

    // Healthy: exit 0, nothing degraded, the empty pool listed.
    let out = d.cli(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(0), "healthy status exits 0");
    let status = json_of(&out);
    assert_eq!(status["healthy"], true);
    assert_eq!(status["degraded"], Value::Array(vec![]));
    assert_eq!(status["portals"][0]["address"], format!("127.0.0.1:{port}"));
    assert_eq!(status["portals"][0]["listening"], true);
    assert_eq!(status["pools"][0]["name"], "tank");
    assert_eq!(status["pools"][0]["state"], "ok");

    // Two initiators: one with verified I/O on LUN 0, the other by hand,
    // with an alias, on LUN 1.
    let keeper = BackgroundIo::start(port, KEEPER, TARGET, RAM);
    keeper.wait_rounds(5);
    let stream = TcpStream::connect(d.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut params = LoginParams::normal(VICTIM, TARGET);
    params.isid[5] = 0x42;
    let mut victim =
        Session::login_declaring(stream, &params, &[("InitiatorAlias", "victim host")]).unwrap();

    // Fill the pool above 90% through LUN 1, then take a reservation there.
    let chunk = vec![0x5au8; UNIT];
    let blocks = (UNIT / 512) as u16;
    for unit in 0..POOL_UNITS - 7 {
        let lba = (unit * UNIT as u64 / 512) as u32;
        good(&mut victim, VOLUME, &rw10_cdb(0x2a, lba, blocks), &chunk);
    }
    good(&mut victim, VOLUME, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    prout(&mut victim, VOLUME, 0, 0, 0, 0xabc);
    prout(&mut victim, VOLUME, 1, 1, 0xabc, 0);

    // Refused: a target nobody serves.
    let stranger =
        LoginParams::normal("iqn.2026-11.org.test:stranger", "iqn.2026-11.org.test:none");
    let err = Session::login(d.addr(), &stranger, Duration::from_secs(10))
        .err()
        .expect("a refused login");
    assert!(err.to_string().contains("detail 0x3"), "{err}");
    // Refused by CHAP: a wrong secret, an unknown user.
    assert!(!chap_inquiry(&d, "alice", "alice-secret-124"));
    assert!(!chap_inquiry(&d, "mallory", SECRET));

    let list = sessions(&d);
    assert_eq!(list.len(), 2, "{list:?}");
    let k = by_initiator(&list, KEEPER);
    let v = by_initiator(&list, VICTIM);
    assert_eq!(k["target"], TARGET);
    assert_eq!(k["initiator_alias"], Value::Null);
    assert_eq!(k["luns_used"], serde_json::json!([RAM]));
    assert_eq!(v["initiator_alias"], "victim host");
    assert_eq!(v["target"], TARGET);
    assert_eq!(v["type"], "normal");
    assert_eq!(v["portal"], format!("127.0.0.1:{port}"));
    assert_eq!(v["peer"], victim.stream.local_addr().unwrap().to_string());
    assert_eq!(v["isid"], "801234567842");
    assert_eq!(v["tsih"], victim.tsih);
    assert_eq!(v["connections"].as_array().unwrap().len(), 1);
    assert_eq!(v["header_digest"], "None");
    assert_eq!(v["data_digest"], "None");
    assert_eq!(v["max_recv_data_segment_length"]["initiator"], 65536);
    assert_eq!(
        v["max_recv_data_segment_length"]["target"],
        victim.target_max_recv as u64
    );
    assert_eq!(v["max_burst_length"], 262144);
    assert_eq!(v["first_burst_length"], 65536);
    assert_eq!(v["immediate_data"], true);
    assert_eq!(v["initial_r2t"], true);
    assert_eq!(v["luns_used"], serde_json::json!([VOLUME]));
    assert_eq!(v["logout_requested"], false);
    let login_time = v["login_time"].as_str().unwrap();
    assert!(
        login_time.starts_with("20") && login_time.ends_with('Z'),
        "{login_time}"
    );
    let victim_id = v["id"].as_u64().unwrap();

    // `session show` has the LUN map with what the nexus holds.
    let out = d.cli(&["session", "show", &victim_id.to_string(), "--json"]);
    assert!(out.status.success());
    let shown = json_of(&out);
    let luns = shown["luns"].as_array().unwrap();
    assert_eq!(luns.len(), 2, "{luns:?}");
    assert_eq!(luns[0]["lun"], VOLUME);
    assert_eq!(luns[0]["registered_key"], "0x0000000000000abc");
    assert_eq!(luns[0]["reservation"], "write exclusive");
    assert_eq!(luns[1]["lun"], RAM);
    assert_eq!(luns[1]["registered_key"], Value::Null);
    let text =
        String::from_utf8(d.cli(&["session", "show", &victim_id.to_string()]).stdout).unwrap();
    assert!(text.contains("holds write exclusive reservation"), "{text}");
    let keeper_id = k["id"].as_u64().unwrap();
    let out = d.cli(&["session", "show", &keeper_id.to_string(), "--json"]);
    assert_eq!(json_of(&out)["luns"][0]["reservation"], Value::Null);

    // Degraded: the pool is above 90% used; exit 1.
    let out = d.cli(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(1), "degraded status exits 1");
    let status = json_of(&out);
    assert_eq!(status["healthy"], false);
    let degraded = status["degraded"].as_array().unwrap();
    assert_eq!(degraded.len(), 1, "{degraded:?}");
    assert_eq!(degraded[0]["kind"], "pool");
    assert_eq!(degraded[0]["name"], "tank");
    let used = status["pools"][0]["used_percent"].as_f64().unwrap();
    assert!(used > 90.0 && used <= 100.0, "{used}");
    assert_eq!(status["targets"][0]["sessions"], 2);
    let out = d.cli(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("state: DEGRADED"));

    // Metrics: both sessions, two logins accepted, one refused and why.
    let m = metrics(&d);
    let target = format!(r#"transport="iscsi",target="{TARGET}""#);
    assert_eq!(
        prometheus_sample(&m, "openarray_sessions", &target),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        prometheus_sample(&m, "openarray_connections", r#"transport="iscsi""#),
        Some(2.0)
    );
    let accepted = r#"transport="iscsi",result="accepted""#;
    assert_eq!(
        prometheus_sample(&m, "openarray_logins_total", accepted),
        Some(2.0)
    );
    let refused = |reason: &str| {
        let labels = format!(r#"transport="iscsi",result="refused",reason="{reason}""#);
        prometheus_sample(&m, "openarray_logins_total", &labels)
    };
    assert_eq!(refused("target_unknown"), Some(1.0));
    assert_eq!(refused("initiator_not_allowed"), Some(0.0));
    assert_eq!(refused("wrong_secret"), Some(1.0));
    assert_eq!(refused("unknown_user"), Some(1.0));
    assert_eq!(refused("no_chap"), Some(0.0));
    let log = d.log();
    assert!(
        log.lines().any(|l| l.contains("login refused")
            && l.contains("iqn.2026-11.org.test:stranger")
            && l.contains("target not found: no target of that name")),
        "{log}"
    );
    for why in ["wrong CHAP secret", "unknown CHAP user"] {
        let line = format!("reason=\"authentication failure: {why}\"");
        assert!(
            log.lines()
                .any(|l| l.contains("login refused") && l.contains(GUARDED) && l.contains(&line)),
            "{log}"
        );
    }
    assert!(
        !log.contains("alice-secret"),
        "a secret reached the log:\n{log}"
    );

    // Kill the victim: it is asked to log out, does not, and is dropped
    // after the logout timeout; the keeper's I/O goes on meanwhile.
    let out = d.cli(&["session", "kill", &victim_id.to_string()]);
    assert!(out.status.success());
    let killed_at = Instant::now();
    let asked = victim.recv().expect("an Async Message");
    assert_eq!(asked.opcode(), 0x32, "Async Message");
    assert_eq!(asked.bhs[36], 1, "a logout request");
    let listed = sessions(&d);
    assert_eq!(by_initiator(&listed, VICTIM)["logout_requested"], true);
    let closed = victim.recv();
    assert!(closed.is_err(), "the connection is closed: {closed:?}");
    let waited = killed_at.elapsed();
    assert!(
        waited >= Duration::from_secs(4),
        "closed after {waited:?}, before the logout timeout"
    );
    let start = Instant::now();
    loop {
        let list = sessions(&d);
        if list.len() == 1 {
            assert_eq!(list[0]["initiator"], KEEPER);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still listed: {list:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(d.log().contains("initiator did not log out"));
    let out = d.cli(&["session", "show", &victim_id.to_string()]);
    assert_eq!(out.status.code(), Some(1), "a session that is gone");
    let m = metrics(&d);
    assert_eq!(
        prometheus_sample(&m, "openarray_sessions", &target),
        Some(1.0)
    );

    // The keeper never noticed.
    let done = keeper_rounds_after(&keeper);
    let outcome = keeper.finish().expect("the keeper's I/O");
    assert!(outcome.rounds >= done, "{} < {done}", outcome.rounds);
    assert!(!outcome.lun_gone && !outcome.luns_changed);

    // The file under a LUN removed: that LUN is degraded too.
    std::fs::remove_file(dir.path().join("disk.img")).unwrap();
    let out = d.cli(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let status = json_of(&out);
    let degraded = status["degraded"].as_array().unwrap();
    assert_eq!(degraded.len(), 2, "{degraded:?}");
    let lun = degraded
        .iter()
        .find(|p| p["kind"] == "lun")
        .expect("a degraded LUN");
    assert_eq!(lun["name"], format!("{GUARDED} LUN 1"));
    assert!(degraded.iter().any(|p| p["kind"] == "pool"));
    let problem = lun["problem"].as_str().unwrap();
    assert!(problem.contains("removed or replaced"), "{problem}");
    assert_eq!(status["targets"][1]["luns"][1]["state"], "degraded");
    assert_eq!(status["targets"][1]["luns"][0]["state"], "ok");

    // A daemon that cannot be reached: exit 2.
    drop(d);
    let gone = common::admin::run_openarray([
        "status",
        "--socket",
        dir.path().join("admin.sock").to_str().unwrap(),
    ]);
    assert_eq!(gone.status.code(), Some(2));
}

/// Waits for 20 more verified rounds of `io`; the count reached.
fn keeper_rounds_after(io: &BackgroundIo) -> u64 {
    let now = io.rounds();
    io.wait_rounds(now + 20);
    now + 20
}
