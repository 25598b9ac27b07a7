//! Two daemons on this machine as an HA pair: `[ha]` starts each node's
//! link, a `mirror` device over a file is LUN 0 on both, and the planned
//! moves of `openarray ha` decide which node writes: what an initiator
//! wrote through node a reads back through node b after a demote and a
//! promote, and the secondary refuses writes meanwhile. Each node is its
//! own target port group, whose ALUA state follows its mirror's role.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::admin::{http_exchange, AdminDaemon};
use common::iscsi::{rw10_cdb, Completion, LoginParams, Session};
use common::{free_port, retrying_taken_ports};

const IQN: &str = "iqn.2026-11.org.openarray.test:pair";
const INITIATOR: &str = "iqn.2026-11.org.openarray.test:host";
const BS: u32 = 512;

struct Node {
    daemon: AdminDaemon,
    _dir: tempfile::TempDir,
}

fn node_config(dir: &Path, me: &str, peer: &str, portal: u16, link: u16, peer_link: u16) -> String {
    let d = dir.display();
    format!(
        r#"[[portal]]
listen = "127.0.0.1:{portal}"

[ha]
node = "{me}"
peer = "{peer}"
listen = "127.0.0.1:{link}"
peer_address = "127.0.0.1:{peer_link}"
secret_file = "{d}/ha.secret"
heartbeat_interval_ms = 100
heartbeat_timeout_ms = 1000

[[device]]
name = "disk"
kind = "file"
path = "{d}/disk.img"
size = "8M"

[[device]]
name = "vm"
kind = "mirror"
over = "disk"

[[target]]
name = "{IQN}"

[[target.lun]]
lun = 0
device = "vm"
"#
    )
}

fn start_pair() -> (Node, Node) {
    retrying_taken_ports(|| {
        let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
        let node = |me: &str, peer: &str, portal: u16, link: u16, peer_link: u16| {
            let dir = tempfile::tempdir().unwrap();
            let secret = dir.path().join("ha.secret");
            std::fs::write(&secret, "a shared secret of the pair\n").unwrap();
            std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
            let cfg = dir.path().join("openarray.toml");
            let text = node_config(dir.path(), me, peer, portal, link, peer_link);
            std::fs::write(&cfg, text).unwrap();
            AdminDaemon::try_start(&cfg, dir.path(), portal)
                .map(|daemon| Node { daemon, _dir: dir })
        };
        let a = node("a", "b", ports[0], ports[1], ports[2])?;
        let b = node("b", "a", ports[3], ports[2], ports[1])?;
        Ok((a, b))
    })
}

fn mirror(n: &Node) -> serde_json::Value {
    let stream = std::os::unix::net::UnixStream::connect(&n.daemon.socket).unwrap();
    let (status, body) = http_exchange(
        stream,
        "GET /v1/mirrors/vm HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn wait_for(what: &str, a: &Node, b: &Node, ok: impl Fn(&Node, &Node) -> bool) {
    let start = Instant::now();
    while !ok(a, b) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: a {:#}\nb {:#}\n{}\n{}",
            mirror(a),
            mirror(b),
            a.daemon.log(),
            b.daemon.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn connected(n: &Node) -> bool {
    mirror(n)["status"]["connection"] == "connected"
}

fn login(n: &Node) -> Session {
    Session::login(
        n.daemon.addr(),
        &LoginParams::normal(INITIATOR, IQN),
        Duration::from_secs(10),
    )
    .unwrap()
}

/// (sense key, ASC, ASCQ) of fixed or descriptor sense data.
fn sense(c: &Completion) -> (u8, u8, u8) {
    let at = |i: usize| c.sense.get(i).copied().unwrap_or(0);
    match at(0) & 0x7f {
        0x72 | 0x73 => (at(1) & 0x0f, at(2), at(3)),
        _ => (at(2) & 0x0f, at(12), at(13)),
    }
}

/// REPORT TARGET PORT GROUPS: (group, asymmetric access state) of each.
fn rtpg(s: &mut Session) -> Vec<(u16, u8)> {
    let cdb = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
    let data = s.command_good(0, &cdb, &[], 1024).unwrap();
    let mut groups = Vec::new();
    let mut at = 4;
    while at + 8 <= data.len() {
        let id = u16::from_be_bytes([data[at + 2], data[at + 3]]);
        groups.push((id, data[at] & 0x0f));
        at += 8 + 4 * data[at + 7] as usize;
    }
    groups
}

/// The first completion of `cdb` that is not a unit attention other
/// than `keep`.
fn command(s: &mut Session, cdb: &[u8], keep: Option<(u8, u8)>) -> Completion {
    loop {
        let c = s.command(0, cdb, &[], 4096).unwrap();
        let (key, asc, ascq) = sense(&c);
        if key != 6 || keep == Some((asc, ascq)) {
            return c;
        }
    }
}

/// Waits for REPORT TARGET PORT GROUPS to say `want`: a node hears the
/// peer's role a moment after the peer changed it.
fn wait_groups(s: &mut Session, want: &[(u16, u8)]) {
    let start = Instant::now();
    loop {
        let groups = rtpg(s);
        if groups == want {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{groups:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

const OPTIMIZED: u8 = 0;
const STANDBY: u8 = 2;

#[test]
fn a_write_through_one_node_reads_back_through_the_other_after_a_planned_move() {
    let (a, b) = start_pair();
    wait_for("the link", &a, &b, |a, b| {
        mirror(a)["link"]["connected"] == true && mirror(b)["link"]["connected"] == true
    });

    let promoted = a.daemon.ok(&["ha", "promote", "vm"]);
    assert!(promoted.contains("vm: primary"), "{promoted}");
    wait_for("the pair in sync", &a, &b, |a, b| {
        connected(a) && connected(b)
    });
    let status = a.daemon.ok(&["ha", "status", "vm"]);
    assert!(
        status.contains("mirror vm over disk: primary (peer secondary), connected"),
        "{status}"
    );
    assert!(status.contains("link a → b: connected"), "{status}");

    let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 + i / 512) as u8).collect();
    let mut on_a = login(&a);
    on_a.write10(0, 100, &data, BS).unwrap();
    // The secondary takes no writes of its own.
    let mut on_b = login(&b);
    assert!(on_b.write10(0, 0, &data[..4096], BS).is_err());

    // ALUA: a's group (1) serves, b's (2) stands by, through either node.
    let a_serves = [(1, OPTIMIZED), (2, STANDBY)];
    assert_eq!(rtpg(&mut on_a), a_serves);
    wait_groups(&mut on_b, &a_serves);
    let read = rw10_cdb(0x28, 0, 1);
    let c = command(&mut on_b, &read, None);
    assert_eq!(sense(&c), (2, 0x04, 0x0b), "{c:?}");

    // A planned move: a steps down, b takes over and serves a's writes.
    let out = a.daemon.cli(&["ha", "promote", "vm"]);
    assert!(
        out.status.success(),
        "promoting the primary again changes nothing"
    );
    let refused = b.daemon.cli(&["ha", "promote", "vm"]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("a is primary; demote it first"), "{err}");

    assert!(a
        .daemon
        .ok(&["ha", "demote", "vm"])
        .contains("vm: secondary"));
    wait_for("a's demotion reaching b", &a, &b, |_, b| {
        mirror(b)["status"]["peer_role"] == "secondary"
    });
    assert!(b
        .daemon
        .ok(&["ha", "promote", "vm"])
        .contains("vm: primary"));
    let mut on_b = login(&b);
    assert_eq!(on_b.read10(0, 100, 128, BS).unwrap(), data);
    on_b.write10(0, 0, &data[..4096], BS).unwrap();
    // The move is announced on a's session, and the states flipped.
    let tur = [0u8; 6];
    let c = command(&mut on_a, &tur, Some((0x2a, 0x06)));
    assert_eq!(sense(&c), (6, 0x2a, 0x06), "{c:?}");
    let b_serves = [(1, STANDBY), (2, OPTIMIZED)];
    wait_groups(&mut on_a, &b_serves);
    assert_eq!(rtpg(&mut on_b), b_serves);
    assert!(on_a.write10(0, 0, &data[..4096], BS).is_err());
}
