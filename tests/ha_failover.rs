//! Failover with a witness: two daemons and `openarray witness` on this
//! machine. The owner killed, the standby takes over with every write
//! acknowledged before the kill; the witness alone lost changes nothing;
//! the peer and the witness lost together stop the owner's writes within
//! its lease; a standby that missed writes never promotes itself. The
//! link runs through a proxy the test can cut.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::admin::{http_exchange, AdminDaemon};
use common::iscsi::{LoginParams, Session};
use common::{free_port, retrying_taken_ports};

const IQN: &str = "iqn.2026-11.org.openarray.test:pair";
const INITIATOR: &str = "iqn.2026-11.org.openarray.test:host";
const BS: u32 = 512;
const LEASE: Duration = Duration::from_millis(3000);
const SECRET: &str = "a shared secret of the pair\n";

fn write_secret(dir: &Path) -> PathBuf {
    let secret = dir.join("ha.secret");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    secret
}

/// `openarray witness`, killed with SIGKILL when dropped.
struct Witness {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Witness {
    fn start() -> Witness {
        let dir = tempfile::tempdir().unwrap();
        let secret = write_secret(dir.path());
        let log = dir.path().join("witness.log");
        for _ in 0..5 {
            let port = free_port();
            let file = std::fs::File::create(&log).unwrap();
            let mut child = Command::new(env!("CARGO_BIN_EXE_openarray"))
                .args(["witness", "--listen", &format!("127.0.0.1:{port}")])
                .arg("--secret-file")
                .arg(&secret)
                .arg("--state-dir")
                .arg(dir.path().join("state"))
                .stdin(Stdio::null())
                .stdout(file.try_clone().unwrap())
                .stderr(file)
                .spawn()
                .unwrap();
            let start = Instant::now();
            loop {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text.contains("witness listening") {
                    return Witness {
                        child,
                        port,
                        log,
                        _dir: dir,
                    };
                }
                if child.try_wait().unwrap().is_some() {
                    assert!(text.contains("Address already in use"), "{text}");
                    break;
                }
                assert!(start.elapsed() < Duration::from_secs(20), "{text}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("no free port for the witness");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP proxy the test cuts: every connection through it closed, new
/// ones closed on arrival.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

impl Proxy {
    fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let streams: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (c, s) = (cut.clone(), streams.clone());
        std::thread::spawn(move || {
            for inbound in listener.incoming() {
                let Ok(inbound) = inbound else { continue };
                if c.load(Ordering::SeqCst) {
                    continue; // dropped: closed on arrival
                }
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let mut held = s.lock().unwrap();
                held.push(inbound.try_clone().unwrap());
                held.push(outbound.try_clone().unwrap());
                let (i2, o2) = (inbound.try_clone().unwrap(), outbound.try_clone().unwrap());
                std::thread::spawn(move || pipe(inbound, outbound));
                std::thread::spawn(move || pipe(o2, i2));
            }
        });
        Proxy { port, cut, streams }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.streams.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

struct Node {
    daemon: AdminDaemon,
    cfg: PathBuf,
    portal: u16,
    dir: tempfile::TempDir,
}

impl Node {
    /// SIGKILL, the node's files kept for a restart.
    fn kill(&self) {
        // SAFETY: kill(2) on the test's own child, not yet reaped.
        unsafe { libc::kill(self.daemon.pid() as i32, libc::SIGKILL) };
    }

    fn restart(&mut self) {
        self.daemon = AdminDaemon::try_start(&self.cfg, self.dir.path(), self.portal).unwrap();
    }
}

#[allow(clippy::too_many_arguments)]
fn node_config(
    dir: &Path,
    me: &str,
    peer: &str,
    portal: u16,
    link: u16,
    peer_link: u16,
    witness: u16,
) -> String {
    let d = dir.display();
    let lease = LEASE.as_millis();
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
witness = "127.0.0.1:{witness}"
lease_ms = {lease}

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

/// Node a (which dials the link, through the proxy) and node b, both
/// with the witness; a promoted and the pair in sync.
fn start_pair(witness: &Witness) -> (Node, Node, Proxy) {
    let (a, b, proxy) = retrying_taken_ports(|| {
        let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
        let proxy = Proxy::start(ports[2]);
        let node = |me: &str, peer: &str, portal: u16, link: u16, peer_link: u16| {
            let dir = tempfile::tempdir().unwrap();
            write_secret(dir.path());
            let cfg = dir.path().join("openarray.toml");
            let text = node_config(dir.path(), me, peer, portal, link, peer_link, witness.port);
            std::fs::write(&cfg, text).unwrap();
            AdminDaemon::try_start(&cfg, dir.path(), portal).map(|daemon| Node {
                daemon,
                cfg,
                portal,
                dir,
            })
        };
        let a = node("a", "b", ports[0], ports[1], proxy.port)?;
        let b = node("b", "a", ports[3], ports[2], ports[1])?;
        Ok((a, b, proxy))
    });
    wait_until("the link", Duration::from_secs(30), || {
        mirror(&a)["link"]["connected"] == true && mirror(&b)["link"]["connected"] == true
    });
    a.daemon.ok(&["ha", "promote", "vm"]);
    let start = Instant::now();
    while !(connected(&a) && connected(&b)) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the pair in sync: a {:#}\nb {:#}\n{}\n{}",
            mirror(&a),
            mirror(&b),
            a.daemon.log(),
            b.daemon.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (a, b, proxy)
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

fn connected(n: &Node) -> bool {
    mirror(n)["status"]["connection"] == "connected"
}

fn role(n: &Node) -> String {
    mirror(n)["status"]["role"].as_str().unwrap().to_string()
}

fn wait_until(what: &str, limit: Duration, ok: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

fn login(n: &Node) -> Session {
    Session::login(
        n.daemon.addr(),
        &LoginParams::normal(INITIATOR, IQN),
        Duration::from_secs(10),
    )
    .unwrap()
}

/// Block `lba`'s contents at `version`: the two numbers, repeated.
fn versioned(lba: u32, version: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(BS as usize);
    while b.len() < BS as usize {
        b.extend_from_slice(&lba.to_le_bytes());
        b.extend_from_slice(&version.to_le_bytes());
    }
    b
}

const SYNC_CACHE: [u8; 10] = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// REPORT TARGET PORT GROUPS: (group, asymmetric access state) of each.
fn rtpg(s: &mut Session) -> Vec<(u16, u8)> {
    let cdb = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
    let data = loop {
        // Unit attentions of the moves come first.
        if let Ok(d) = s.command_good(0, &cdb, &[], 1024) {
            break d;
        }
    };
    let mut groups = Vec::new();
    let mut at = 4;
    while at + 8 <= data.len() {
        let id = u16::from_be_bytes([data[at + 2], data[at + 3]]);
        groups.push((id, data[at] & 0x0f));
        at += 8 + 4 * data[at + 7] as usize;
    }
    groups
}

const OPTIMIZED: u8 = 0;
const STANDBY: u8 = 2;

#[test]
fn the_standby_takes_over_a_killed_owner_with_every_acknowledged_write() {
    let witness = Witness::start();
    let (a, b, _proxy) = start_pair(&witness);
    let mut on_a = login(&a);
    // Versioned blocks, each write acknowledged, then flushed.
    let mut acked = vec![0u32; 256];
    for version in 1..=3u32 {
        for lba in (0..256u32).step_by(version as usize) {
            on_a.write10(0, lba, &versioned(lba, version), BS).unwrap();
            acked[lba as usize] = version;
        }
        on_a.command_good(0, &SYNC_CACHE, &[], 0).unwrap();
    }
    let killed = Instant::now();
    drop(a); // SIGKILL
    let took = wait_until("b taking over", Duration::from_secs(10), || {
        role(&b) == "primary"
    });
    let mut on_b = login(&b);
    for (lba, version) in acked.iter().enumerate() {
        let got = on_b.read10(0, lba as u32, 1, BS).unwrap();
        assert_eq!(got, versioned(lba as u32, *version), "block {lba}");
    }
    on_b.write10(0, 0, &versioned(0, 9), BS).unwrap();
    let served = killed.elapsed();
    println!("takeover after the kill: promoted in {took:?}, serving in {served:?}");
    assert!(served < Duration::from_secs(10), "{served:?}");
    assert_eq!(rtpg(&mut on_b), [(1, 3), (2, OPTIMIZED)]);
    let log = b.daemon.log();
    assert!(log.contains("took over from a"), "{log}");
    drop(witness);
}

#[test]
fn losing_the_witness_alone_changes_nothing() {
    let witness = Witness::start();
    let (a, b, _proxy) = start_pair(&witness);
    drop(witness);
    let mut on_a = login(&a);
    let start = Instant::now();
    // Past two leases: the peer's vote keeps a the owner.
    let mut lba = 0;
    while start.elapsed() < 2 * LEASE {
        on_a.write10(0, lba % 1024, &versioned(lba, 1), BS).unwrap();
        lba += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        (role(&a), role(&b)),
        ("primary".into(), "secondary".into()),
        "{}\n{}",
        a.daemon.log(),
        b.daemon.log()
    );
    assert!(connected(&a) && connected(&b));
    assert_eq!(rtpg(&mut on_a), [(1, OPTIMIZED), (2, STANDBY)]);
    let status = a.daemon.ok(&["ha", "status", "vm"]);
    assert!(status.contains("witness 127.0.0.1:"), "{status}");
    assert!(status.contains("unreachable"), "{status}");
}

#[test]
fn losing_the_peer_and_the_witness_stops_the_owners_writes_within_its_lease() {
    let witness = Witness::start();
    let (a, b, _proxy) = start_pair(&witness);
    let mut on_a = login(&a);
    on_a.write10(0, 0, &versioned(0, 1), BS).unwrap();
    drop(witness);
    drop(b);
    let lost = Instant::now();
    // Writes go on failing once they fail; none succeeds past the lease.
    let mut last_ok = None;
    let mut failed = 0;
    while lost.elapsed() < LEASE + Duration::from_secs(1) {
        match on_a.write10(0, 1, &versioned(1, 2), BS) {
            Ok(()) => last_ok = Some(lost.elapsed()),
            Err(_) => failed += 1,
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(failed > 0);
    assert!(
        last_ok.is_none_or(|t| t < LEASE),
        "a write succeeded {last_ok:?} after the loss"
    );
    // Sooner still: a write alone needs the witness to record its
    // generation first, so none is taken at all.
    assert_eq!(last_ok, None, "a write taken alone without the witness");
    // Its paths say so: a's group stands by.
    wait_until("a stepping down", LEASE, || role(&a) == "secondary");
    assert_eq!(rtpg(&mut on_a)[0], (1, STANDBY));
    let log = a.daemon.log();
    assert!(log.contains("stepping down"), "{log}");
}

#[test]
fn a_standby_that_missed_writes_never_promotes_itself() {
    let witness = Witness::start();
    let (a, b, proxy) = start_pair(&witness);
    proxy.cut();
    wait_until("a seeing the link cut", Duration::from_secs(10), || {
        mirror(&a)["status"]["connection"] == "disconnected"
    });
    // a goes on alone, with the witness's grant: a new generation.
    let mut on_a = login(&a);
    on_a.write10(0, 0, &versioned(0, 7), BS).unwrap();
    drop(on_a);
    drop(a);
    // Well past a's lease: the witness refuses b as behind.
    std::thread::sleep(LEASE + Duration::from_secs(2));
    assert_eq!(role(&b), "secondary");
    let w = &mirror(&b)["witness"];
    assert!(
        w["last"].as_str().unwrap_or("").contains("behind"),
        "{w}\n{}",
        witness.log()
    );
    let mut on_b = login(&b);
    assert!(on_b.write10(0, 0, &versioned(0, 8), BS).is_err());
}

#[test]
fn a_planned_failover_moves_the_owner_and_a_forced_one_needs_neither_peer_nor_witness() {
    let witness = Witness::start();
    let (a, b, _proxy) = start_pair(&witness);
    let mut on_a = login(&a);
    on_a.write10(0, 5, &versioned(5, 1), BS).unwrap();
    // Planned: a steps down, b promotes, with no write lost.
    let moved = b.daemon.ok(&["ha", "failover", "vm"]);
    assert!(moved.contains("vm: primary"), "{moved}");
    assert_eq!((role(&a), role(&b)), ("secondary".into(), "primary".into()));
    let mut on_b = login(&b);
    assert_eq!(on_b.read10(0, 5, 1, BS).unwrap(), versioned(5, 1));
    on_b.write10(0, 6, &versioned(6, 1), BS).unwrap();
    wait_until("the pair in sync", Duration::from_secs(10), || {
        connected(&a) && connected(&b)
    });
    // The owner and the witness gone: a takes over only when forced.
    drop(witness);
    drop(on_b);
    drop(b);
    wait_until("a losing the link", Duration::from_secs(10), || {
        mirror(&a)["status"]["connection"] == "disconnected"
    });
    let refused = a.daemon.cli(&["ha", "failover", "vm"]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("--force"), "{err}");
    let forced = a.daemon.cli(&["ha", "failover", "vm", "--force"]);
    assert!(forced.status.success());
    let err = String::from_utf8_lossy(&forced.stderr);
    assert!(err.contains("split brain"), "{err}");
    let mut on_a = login(&a);
    assert_eq!(on_a.read10(0, 6, 1, BS).unwrap(), versioned(6, 1));
    on_a.write10(0, 7, &versioned(7, 1), BS).unwrap();
    let status = a.daemon.ok(&["ha", "status", "vm"]);
    assert!(status.contains("FORCED"), "{status}");
}

/// An initiator that follows the pair the way a multipath host does: it
/// writes through one node's portal and, on a lost connection or an
/// error (NOT READY from a standby or fenced group), logs in to the
/// other and retries, up to a deadline.
struct PairInitiator {
    portals: [std::net::SocketAddr; 2],
    at: usize,
    session: Option<Session>,
}

impl PairInitiator {
    fn write(&mut self, lba: u32, data: &[u8], deadline: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if self.session.is_none() {
                let params = LoginParams::normal(INITIATOR, IQN);
                self.session =
                    Session::login(self.portals[self.at], &params, Duration::from_secs(2)).ok();
            }
            if let Some(s) = &mut self.session {
                let done = s
                    .write10(0, lba, data, BS)
                    .and_then(|()| s.command_good(0, &SYNC_CACHE, &[], 0).map(drop));
                if done.is_ok() {
                    return Ok(());
                }
            }
            self.session = None;
            self.at = 1 - self.at;
            if start.elapsed() > deadline {
                return Err(format!(
                    "no node took the write of block {lba} in {deadline:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Every block reads back through `n` at least at the version
/// acknowledged (a later one may have landed since).
fn check_blocks(n: &Node, acked: &[u32]) {
    // Another initiator name: a second login of the writer's would
    // replace the writer's session (same name and ISID).
    let params = LoginParams::normal("iqn.2026-11.org.openarray.test:checker", IQN);
    let mut s = Session::login(n.daemon.addr(), &params, Duration::from_secs(10)).unwrap();
    for (lba, version) in acked.iter().enumerate() {
        // As a multipath host does, a read answered NOT READY is retried
        // for a moment: a group can still report standby just after the
        // promotion (seen rarely under load; the cause is not found yet).
        let start = Instant::now();
        let got = loop {
            match s.read10(0, lba as u32, 1, BS) {
                Ok(got) => break got,
                Err(e) if start.elapsed() > Duration::from_secs(2) => {
                    panic!("block {lba}: {e}\n{}", n.daemon.log())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        if got.iter().all(|b| *b == 0) && *version == 0 {
            continue; // never written
        }
        let v = u32::from_le_bytes(got[4..8].try_into().unwrap());
        assert!(
            v >= *version && got == versioned(lba as u32, v),
            "block {lba}: version {v}, acknowledged {version}"
        );
    }
}

#[test]
fn failovers_alternating_between_the_nodes_lose_no_acknowledged_write() {
    // 20 rounds for the acceptance run; fewer keep CI fast.
    let rounds: usize = std::env::var("OPENARRAY_HA_FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let witness = Witness::start();
    let (a, b, _proxy) = start_pair(&witness);
    let mut nodes = [a, b];
    let portals = [nodes[0].daemon.addr(), nodes[1].daemon.addr()];
    let acked: Arc<Mutex<Vec<u32>>> = Arc::new(Mutex::new(vec![0; 128]));
    let stop = Arc::new(AtomicBool::new(false));
    // The writer: versioned blocks, each flushed; the longest wait for
    // a write is the I/O pause of a failover.
    let writer = {
        let (acked, stop) = (acked.clone(), stop.clone());
        std::thread::spawn(move || -> Result<Vec<Duration>, String> {
            let mut init = PairInitiator {
                portals,
                at: 0,
                session: None,
            };
            let mut pauses = Vec::new();
            let mut version = 0u32;
            while !stop.load(Ordering::SeqCst) {
                version += 1;
                let lba = version % 128;
                let began = Instant::now();
                init.write(lba, &versioned(lba, version), Duration::from_secs(15))?;
                pauses.push(began.elapsed());
                acked.lock().unwrap()[lba as usize] = version;
            }
            Ok(pauses)
        })
    };
    let mut owner = 0;
    for round in 0..rounds {
        std::thread::sleep(Duration::from_millis(300));
        nodes[owner].kill();
        // Acknowledged before the kill: the new owner must have them all.
        let before = acked.lock().unwrap().clone();
        let other = 1 - owner;
        wait_until("the standby taking over", Duration::from_secs(10), || {
            role(&nodes[other]) == "primary"
        });
        check_blocks(&nodes[other], &before);
        nodes[owner].restart();
        wait_until(
            &format!("round {round}: the pair in sync again"),
            Duration::from_secs(20),
            || connected(&nodes[0]) && connected(&nodes[1]),
        );
        owner = other;
    }
    stop.store(true, Ordering::SeqCst);
    let mut pauses = writer.join().unwrap().unwrap();
    check_blocks(&nodes[owner], &acked.lock().unwrap().clone());
    pauses.sort();
    let worst: Vec<_> = pauses.iter().rev().take(rounds).collect();
    println!("{rounds} failovers: the longest pauses of writes {worst:?}");
    assert!(
        *pauses.last().unwrap() < Duration::from_secs(10),
        "{worst:?}"
    );
}

#[test]
fn a_secondary_that_loses_a_secondary_peer_stays_secondary() {
    let witness = Witness::start();
    let (a, b, _proxy) = start_pair(&witness);
    // The operator left both standing by: losing a is no owner's loss.
    a.daemon.ok(&["ha", "demote", "vm"]);
    wait_until("b hearing a's demotion", Duration::from_secs(10), || {
        mirror(&b)["status"]["peer_role"] == "secondary"
    });
    drop(a);
    std::thread::sleep(LEASE + Duration::from_secs(1));
    assert_eq!(role(&b), "secondary", "{}", b.daemon.log());
}
