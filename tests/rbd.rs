//! RBD images served by the real daemon, against a real one-node Ceph
//! cluster: the one named by OPENARRAY_CEPH_CONF, or else one started here
//! with scripts/ceph-fixture.sh (and stopped at exit). Without a cluster
//! every test fails with the script's error; none is skipped.
//!
//! - libiscsi's conformance suite on an RBD LUN;
//! - flushed writes survive SIGKILL, read back with `rbd export`;
//! - with the OSD stopped no SYNCHRONIZE CACHE or FUA write completes GOOD;
//! - two daemons on one image: the second refuses writes while the first
//!   holds the exclusive lock, and writes once the first has stopped;
//! - a broken lock fences the daemon that held it: nothing it makes
//!   stable afterwards succeeds, and none of its writes reach the image;
//! - a resize by another client raises CAPACITY DATA HAS CHANGED, and its
//!   snapshots hold every write the daemon acknowledged;
//! - the NBD export of an image passes the NBD clients: qemu-img convert
//!   to and from it byte-identical (and equal to `rbd export`), nbdinfo
//!   --map, nbdcopy, fio's nbd engine verified writes;
//! - `openarray device rbd` and `openarray volume snapshot|clone|resize`
//!   snapshot, clone and grow a served image;
//! - EXTENDED COPY between two images of one pool (through the gateway);
//! - a cluster that does not answer fails the start, naming the device.

mod common;
#[allow(dead_code)] // the crate's tests use more of it
#[path = "../crates/rbd/tests/fixture/mod.rs"]
mod fixture;
#[path = "conformance/outcome.rs"]
mod outcome;

use std::path::Path;
use std::time::{Duration, Instant};

use common::admin::AdminDaemon;
use common::iscsi::{rw10_cdb, Completion, LoginParams, Session};
use common::nbd_clients;
use common::rng::Rng;
use common::xcopy;
use common::Daemon;
use fixture::Fixture;
use outcome::Outcome;

const IQN: &str = "iqn.2026-11.org.openarray:rbd";
const BLOCK: usize = 512;
/// The tests of libiscsi's suite that must really pass on an RBD LUN; it
/// only rises. Of the 230, the rest skip as on a file LUN (removable
/// media, write-protect, WRITE ATOMIC, crypto erase, multipath, LBPPB).
const SUITE_FLOOR: usize = 202;
const SUITE_TESTS: usize = 230;

/// A daemon serving `image` of the test cluster as LUN 0 of [`IQN`],
/// created with `size` when missing; the config and its directory live as
/// long as the daemon.
fn rbd_daemon(f: &Fixture, image: &str, size: &str) -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("openarray.toml");
    std::fs::write(&path, rbd_config(f, image, size)).expect("write config");
    (Daemon::start_portals(Some(&path), 1), dir)
}

/// Like [`rbd_daemon`], with an administration socket in `dir`.
fn rbd_admin_daemon(f: &Fixture, image: &str, dir: &Path) -> AdminDaemon {
    let path = dir.join("openarray.toml");
    std::fs::write(&path, rbd_config(f, image, "64M")).expect("write config");
    AdminDaemon::start_listening(&path, dir, common::free_port())
}

fn rbd_config(f: &Fixture, image: &str, size: &str) -> String {
    format!(
        r#"
[[device]]
name = "vm"
kind = "rbd"
pool = "{pool}"
image = "{image}"
size = "{size}"
create = true
ceph_conf = "{conf}"
client = "{client}"
keyring = "{keyring}"
timeout = "20s"

[[target]]
name = "{IQN}"

[[target.lun]]
lun = 0
device = "vm"
"#,
        pool = f.pool,
        conf = f.conf.display(),
        client = f.client,
        keyring = f.keyring.display(),
    )
}

fn login(daemon: &Daemon, initiator: &str) -> Session {
    login_at(daemon.addr(), initiator)
}

fn login_at(addr: std::net::SocketAddr, initiator: &str) -> Session {
    let params = LoginParams::normal(initiator, IQN);
    Session::login(addr, &params, Duration::from_secs(60)).expect("login")
}

/// One command, past the unit attentions a new session gets.
fn command(s: &mut Session, cdb: &[u8], data: &[u8], read_len: usize) -> Completion {
    for _ in 0..8 {
        let c = s.command(0, cdb, data, read_len).expect("command");
        if c.sense_key() != Some(0x06) {
            return c;
        }
    }
    panic!("unit attentions kept coming");
}

fn asc(c: &Completion) -> (u8, u8) {
    common::verified_io::asc(c)
}

fn good(c: &Completion, what: &str) {
    assert_eq!(
        c.status,
        0,
        "{what}: status {:#x}, sense key {:?}, asc {:02x?}",
        c.status,
        c.sense_key(),
        asc(c)
    );
}

fn write(s: &mut Session, lba: u32, data: &[u8]) -> Completion {
    let blocks = (data.len() / BLOCK) as u16;
    command(s, &rw10_cdb(0x2a, lba, blocks), data, 0)
}

fn synchronize_cache(s: &mut Session) -> Completion {
    command(s, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0)
}

fn read(s: &mut Session, lba: u32, blocks: u16) -> Vec<u8> {
    let c = command(
        s,
        &rw10_cdb(0x28, lba, blocks),
        &[],
        blocks as usize * BLOCK,
    );
    good(&c, "READ(10)");
    c.data
}

/// The NAA designator (page 0x83) of LUN 0, as hex.
fn naa(s: &mut Session) -> String {
    let c = command(s, &[0x12, 1, 0x83, 0, 255, 0], &[], 255);
    good(&c, "INQUIRY VPD 0x83");
    let page = &c.data;
    let mut at = 4;
    while at + 4 <= page.len() {
        let (kind, len) = (page[at + 1] & 0x0f, page[at + 3] as usize);
        if kind == 3 {
            let id = &page[at + 4..(at + 4 + len).min(page.len())];
            return id.iter().map(|b| format!("{b:02x}")).collect();
        }
        at += 4 + len;
    }
    panic!("no NAA designator in {page:02x?}");
}

/// libiscsi's whole suite, with data loss and SANITIZE allowed, on a 1 GiB
/// RBD LUN: nothing fails and at least [`SUITE_FLOOR`] tests pass.
#[test]
fn conformance_suite_on_an_rbd_lun() {
    common::require_tool("iscsi-test-cu");
    let f = fixture::cluster();
    let image = f.image_name("conformance");
    let (daemon, _dir) = rbd_daemon(f, &image, "1G");
    let began = Instant::now();
    let results = outcome::run_suite("rbd", "ALL", &[daemon.url(IQN, 0)]);
    println!(
        "conformance rbd: {} in {:.0}s",
        results.summary_line(),
        began.elapsed().as_secs_f64()
    );
    let failed = results.names(Outcome::Failed);
    for name in &failed {
        println!("  failed  {name}");
        for line in results.failure_details.get(*name).into_iter().flatten() {
            println!("          {line}");
        }
    }
    assert!(
        results.outcomes.len() >= SUITE_TESTS,
        "only {} of {SUITE_TESTS} tests reported",
        results.outcomes.len()
    );
    assert!(failed.is_empty(), "failed on an RBD LUN: {failed:?}");
    let passed = results.count(Outcome::Passed);
    assert!(
        passed >= SUITE_FLOOR,
        "{passed} tests passed on an RBD LUN, below the floor of {SUITE_FLOOR}\n{}",
        daemon.log()
    );
    assert!(daemon.terminate().success());
    f.rbd(&["rm", "--no-progress", &format!("{}/{image}", f.pool)]);
}

/// Rounds of writes, each ended by SYNCHRONIZE CACHE, then writes no flush
/// covers, then SIGKILL: every block reads back through `rbd export` with
/// what it held at the last completed flush, or with a later write.
#[test]
fn flushed_writes_survive_sigkill() {
    let f = fixture::cluster();
    let image = f.image_name("durability");
    let (daemon, _dir) = rbd_daemon(f, &image, "64M");
    let mut s = login(&daemon, "iqn.2026-11.org.openarray:durability");
    const BLOCKS: u32 = 2048; // the first 1 MiB
    const CHUNK: u32 = 8;
    let mut rng = Rng::new(0x5eed_0b0d);
    // Per block: what it held at the last flush, and what was written
    // since (any of which may have reached the cluster).
    let mut flushed = vec![vec![0u8; BLOCK]; BLOCKS as usize];
    let mut since: Vec<Vec<Vec<u8>>> = vec![Vec::new(); BLOCKS as usize];
    let write_chunk = |s: &mut Session, since: &mut Vec<Vec<Vec<u8>>>, rng: &mut Rng| {
        let lba = rng.below((BLOCKS / CHUNK) as u64) as u32 * CHUNK;
        let mut data = vec![0u8; (CHUNK as usize) * BLOCK];
        rng.fill(&mut data);
        good(&write(s, lba, &data), "WRITE(10)");
        for (i, block) in data.chunks(BLOCK).enumerate() {
            since[lba as usize + i].push(block.to_vec());
        }
    };
    for _round in 0..6 {
        for _ in 0..40 {
            write_chunk(&mut s, &mut since, &mut rng);
        }
        good(&synchronize_cache(&mut s), "SYNCHRONIZE CACHE");
        for (block, writes) in since.iter_mut().enumerate() {
            if let Some(last) = writes.pop() {
                flushed[block] = last;
            }
            writes.clear();
        }
    }
    // Acknowledged, but no flush covers them.
    for _ in 0..40 {
        write_chunk(&mut s, &mut since, &mut rng);
    }
    // SAFETY: plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(daemon.pid() as i32, libc::SIGKILL) }, 0);
    drop(daemon);

    let export = f.export(&image);
    let mut lost = Vec::new();
    for block in 0..BLOCKS as usize {
        let got = &export[block * BLOCK..(block + 1) * BLOCK];
        if got != flushed[block].as_slice() && !since[block].iter().any(|w| w == got) {
            lost.push(block);
        }
    }
    assert!(
        lost.is_empty(),
        "{} blocks read back through rbd export with neither their flushed content nor a later write, first {:?}",
        lost.len(),
        &lost[..lost.len().min(8)]
    );
    // The image stays: the killed daemon's watch holds it for another
    // 30 s, and the test cluster goes away with its directory.
}

/// librbd's write-back cache may take a plain WRITE while the OSD is
/// stopped, but neither SYNCHRONIZE CACHE nor a WRITE with FUA completes
/// GOOD then. Once the OSD is back, SYNCHRONIZE CACHE succeeds, and after
/// SIGKILL every write acknowledged before it reads back via `rbd export`.
#[test]
fn no_flush_completes_with_the_osd_stopped() {
    let f = fixture::cluster();
    let image = f.image_name("osd-stopped");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("openarray.toml");
    let config = rbd_config(f, &image, "64M").replace("timeout = \"20s\"", "timeout = \"3s\"");
    std::fs::write(&path, config).expect("write config");
    let daemon = Daemon::start_portals(Some(&path), 1);
    let mut s = login(&daemon, "iqn.2026-11.org.openarray:osd-stopped");
    let mut rng = Rng::new(0x05d0);
    let first = rng.bytes(8 * BLOCK);
    good(&write(&mut s, 0, &first), "WRITE(10)");

    let osd = fixture::Paused::osd(f);
    let cached = rng.bytes(8 * BLOCK);
    let cached_ok = write(&mut s, 8, &cached).status == 0;
    let c = synchronize_cache(&mut s);
    assert_ne!(
        c.status, 0,
        "SYNCHRONIZE CACHE completed with the OSD stopped"
    );
    assert_eq!(c.sense_key(), Some(0x02), "NOT READY, got {:02x?}", asc(&c));
    let mut fua = rw10_cdb(0x2a, 16, 8);
    fua[1] = 0x08;
    let c = command(&mut s, &fua, &rng.bytes(8 * BLOCK), 0);
    assert_ne!(
        c.status, 0,
        "a WRITE with FUA completed with the OSD stopped"
    );
    drop(osd);

    good(
        &synchronize_cache(&mut s),
        "SYNCHRONIZE CACHE, the OSD back",
    );
    // SAFETY: plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(daemon.pid() as i32, libc::SIGKILL) }, 0);
    drop(daemon);
    let export = f.export(&image);
    assert_eq!(&export[..8 * BLOCK], first.as_slice());
    if cached_ok {
        assert_eq!(&export[8 * BLOCK..16 * BLOCK], cached.as_slice());
    }
}

/// Two daemons configured on one image: the second starts on standby and
/// its writes fail with DATA PROTECT / WRITE PROTECTED (reads work) while
/// the first holds the exclusive lock; once the first stops, the second's
/// writes take the lock and land.
#[test]
fn second_daemon_writes_only_after_the_first_stops() {
    let f = fixture::cluster();
    let image = f.image_name("two-gateways");
    let (first, _first_dir) = rbd_daemon(f, &image, "64M");
    let mut a = login(&first, "iqn.2026-11.org.openarray:first");
    let from_first = vec![0xa1; 8 * BLOCK];
    good(&write(&mut a, 0, &from_first), "first daemon's WRITE");
    good(
        &synchronize_cache(&mut a),
        "first daemon's SYNCHRONIZE CACHE",
    );

    let second_dir = tempfile::tempdir().expect("tempdir");
    let second = rbd_admin_daemon(f, &image, second_dir.path());
    let mut b = login_at(second.addr(), "iqn.2026-11.org.openarray:second");
    let shown = second.ok(&["device", "show", "vm"]);
    assert!(shown.contains("standby"), "device show:\n{shown}");
    assert_eq!(naa(&mut a), naa(&mut b), "one image, one NAA on both");
    assert_eq!(read(&mut b, 0, 8), from_first, "the second reads the image");
    let from_second = vec![0xb2; 8 * BLOCK];
    for _ in 0..3 {
        let refused = write(&mut b, 8, &from_second);
        assert_eq!(refused.status, 0x02, "the second daemon's write must fail");
        assert_eq!(refused.sense_key(), Some(0x07), "DATA PROTECT");
        assert_eq!(asc(&refused), (0x27, 0x00), "WRITE PROTECTED");
        std::thread::sleep(Duration::from_millis(600));
    }
    // The first still writes.
    good(&write(&mut a, 16, &from_first), "first daemon's WRITE");

    let status = first.terminate();
    assert!(status.success(), "first daemon: {status}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = write(&mut b, 8, &from_second);
        if c.status == 0 {
            break;
        }
        assert_eq!(asc(&c), (0x27, 0x00), "only the lock may refuse it");
        assert!(
            Instant::now() < deadline,
            "the second daemon never got the lock:\n{}",
            second.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    good(
        &synchronize_cache(&mut b),
        "second daemon's SYNCHRONIZE CACHE",
    );
    let shown = second.ok(&["device", "show", "vm"]);
    assert!(shown.contains("owner"), "device show:\n{shown}");
    drop(b);
    assert!(second.terminate().success());
    let export = f.export(&image);
    assert_eq!(&export[..8 * BLOCK], from_first.as_slice());
    assert_eq!(&export[8 * BLOCK..16 * BLOCK], from_second.as_slice());
    assert_eq!(&export[16 * BLOCK..24 * BLOCK], from_first.as_slice());
    f.rbd(&["rm", "--no-progress", &format!("{}/{image}", f.pool)]);
}

/// A failover: another client breaks the first daemon's lock (`rbd lock
/// rm`, which blocklists it) and a second daemon takes over and writes.
/// From then on nothing the first daemon is asked to make stable reports
/// success (a plain write may still be taken by librbd's cache, but its
/// SYNCHRONIZE CACHE fails), its writes never reach the image (`rbd
/// export`), and it refuses writes as DATA PROTECT and shows the lock lost.
#[test]
fn a_broken_lock_fences_the_first_daemon() {
    let f = fixture::cluster();
    let image = f.image_name("fenced");
    let spec = format!("{}/{image}", f.pool);
    let first_dir = tempfile::tempdir().expect("tempdir");
    let first = rbd_admin_daemon(f, &image, first_dir.path());
    let mut a = login_at(first.addr(), "iqn.2026-11.org.openarray:first");
    let before = vec![0xa1; 8 * BLOCK];
    good(&write(&mut a, 0, &before), "first daemon's WRITE");
    good(
        &synchronize_cache(&mut a),
        "first daemon's SYNCHRONIZE CACHE",
    );
    let second_dir = tempfile::tempdir().expect("tempdir");
    let second = rbd_admin_daemon(f, &image, second_dir.path());
    let mut b = login_at(second.addr(), "iqn.2026-11.org.openarray:second");

    let locks: serde_json::Value =
        serde_json::from_str(&f.rbd(&["lock", "ls", "--format", "json", &spec])).expect("json");
    let lock = &locks[0];
    let (id, locker) = (lock["id"].as_str(), lock["locker"].as_str());
    f.rbd(&[
        "lock",
        "rm",
        &spec,
        id.expect("id"),
        locker.expect("locker"),
    ]);

    // The second daemon's writes take the free lock.
    let from_second = vec![0xb2; 8 * BLOCK];
    let deadline = Instant::now() + Duration::from_secs(30);
    while write(&mut b, 8, &from_second).status != 0 {
        assert!(Instant::now() < deadline, "no takeover:\n{}", second.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    good(
        &synchronize_cache(&mut b),
        "second daemon's SYNCHRONIZE CACHE",
    );

    // The first one, fenced: a write over the second's, one elsewhere,
    // one with FUA. None may be made stable.
    let stale = vec![0xa3; 8 * BLOCK];
    let plain = write(&mut a, 8, &stale).status == 0 && write(&mut a, 16, &stale).status == 0;
    let flushed = synchronize_cache(&mut a);
    assert!(
        !plain || flushed.status != 0,
        "the fenced daemon's writes and flush all succeeded"
    );
    let mut fua = rw10_cdb(0x2a, 24, 8);
    fua[1] = 0x08;
    let c = command(&mut a, &fua, &stale, 0);
    assert_ne!(
        c.status, 0,
        "a FUA write succeeded after the lock was broken"
    );
    for c in [write(&mut a, 32, &stale), synchronize_cache(&mut a)] {
        assert_eq!(
            c.sense_key(),
            Some(0x07),
            "DATA PROTECT, got {:02x?}",
            asc(&c)
        );
    }
    let shown = first.ok(&["device", "show", "vm"]);
    assert!(shown.contains("lost"), "device show:\n{shown}");

    drop(b);
    assert!(second.terminate().success());
    let export = f.export(&image);
    assert_eq!(&export[..8 * BLOCK], before.as_slice());
    assert_eq!(&export[8 * BLOCK..16 * BLOCK], from_second.as_slice());
    assert!(
        export[16 * BLOCK..40 * BLOCK].iter().all(|&b| b == 0),
        "a write of the fenced daemon reached the image"
    );
    drop(a);
    // Fenced, it cannot flush at exit either, and says so by its status.
    assert!(!first.terminate().success());
}

/// `rbd resize` by another client while the daemon serves the image: the
/// next command gets CAPACITY DATA HAS CHANGED and READ CAPACITY the new size.
#[test]
fn an_outside_resize_raises_capacity_data_has_changed() {
    let f = fixture::cluster();
    let image = f.image_name("resize");
    let (daemon, _dir) = rbd_daemon(f, &image, "64M");
    let mut s = login(&daemon, "iqn.2026-11.org.openarray:resize");
    assert_eq!(
        s.read_capacity(0).expect("READ CAPACITY").0,
        (64 << 20) / 512
    );
    let spec = format!("{}/{image}", f.pool);
    f.rbd(&["resize", "--no-progress", "--size", "96M", &spec]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let c = s
            .command(0, &[0x00, 0, 0, 0, 0, 0], &[], 0)
            .expect("TEST UNIT READY");
        if c.sense_key() == Some(0x06) && asc(&c) == (0x2a, 0x09) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no CAPACITY DATA HAS CHANGED; last answer {:#x} {:02x?}",
            c.status,
            asc(&c)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        s.read_capacity(0).expect("READ CAPACITY").0,
        (96 << 20) / 512
    );
    drop(s);
    assert!(daemon.terminate().success());
    f.rbd(&["rm", "--no-progress", &spec]);
}

/// `rbd snap create` and `rbd clone` by another client while the daemon
/// holds the lock: librbd hands them to the daemon's connection, which
/// flushes first, so the snapshot holds every acknowledged write (no
/// SYNCHRONIZE CACHE needed), and the clone reads the same.
#[test]
fn snapshots_taken_while_serving_hold_every_acknowledged_write() {
    let f = fixture::cluster();
    let image = f.image_name("snapshot");
    let (daemon, _dir) = rbd_daemon(f, &image, "64M");
    let mut s = login(&daemon, "iqn.2026-11.org.openarray:snapshot");
    let mut rng = Rng::new(0x5a4b);
    let data = rng.bytes(64 * BLOCK);
    good(&write(&mut s, 128, &data), "WRITE(10)");
    let spec = format!("{}/{image}", f.pool);
    let snap = format!("{spec}@before");
    f.rbd(&["snap", "create", "--no-progress", &snap]);
    // Written after the snapshot: not in it.
    good(&write(&mut s, 128, &vec![0xee; 64 * BLOCK]), "WRITE(10)");
    let in_snap = f.export(&format!("{image}@before"));
    assert_eq!(&in_snap[128 * BLOCK..192 * BLOCK], data.as_slice());
    f.rbd(&["snap", "protect", &snap]);
    let clone = format!("{image}-clone");
    f.rbd(&["clone", &snap, &format!("{}/{clone}", f.pool)]);
    let cloned = f.export(&clone);
    assert_eq!(&cloned[128 * BLOCK..192 * BLOCK], data.as_slice());
    good(&synchronize_cache(&mut s), "SYNCHRONIZE CACHE");
    assert_eq!(
        &f.export(&image)[128 * BLOCK..192 * BLOCK],
        vec![0xee; 64 * BLOCK].as_slice()
    );
}

/// `openarray device rbd NAME snapshot|clone|resize` on a served image:
/// `rbd snap ls`, `rbd children` and `rbd info` see the results, and the
/// LUN reports the new capacity.
#[test]
fn cli_snapshot_clone_and_resize_are_seen_by_the_rbd_tool() {
    let f = fixture::cluster();
    let image = f.image_name("cli");
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = rbd_admin_daemon(f, &image, dir.path());
    let mut s = login_at(daemon.addr(), "iqn.2026-11.org.openarray:cli");
    let data = Rng::new(0xc11).bytes(16 * BLOCK);
    good(&write(&mut s, 0, &data), "WRITE(10)");
    let spec = format!("{}/{image}", f.pool);
    let clone = format!("{image}-child");

    daemon.ok(&["device", "rbd", "vm", "snapshot", "gold"]);
    let snaps = f.rbd(&["snap", "ls", &spec]);
    assert!(snaps.contains("gold"), "rbd snap ls:\n{snaps}");
    daemon.ok(&["device", "rbd", "vm", "clone", "gold", &clone]);
    let children = f.rbd(&["children", &format!("{spec}@gold")]);
    assert!(children.contains(&clone), "rbd children:\n{children}");
    assert_eq!(&f.export(&clone)[..16 * BLOCK], data.as_slice());
    daemon.ok(&["device", "rbd", "vm", "resize", "80M"]);
    let info = f.rbd(&["info", &spec]);
    assert!(info.contains("80 MiB"), "rbd info:\n{info}");
    assert_eq!(
        s.read_capacity(0).expect("READ CAPACITY").0,
        (80 << 20) / 512
    );

    // Refused, with the reason: shrinking, and a device of another kind.
    let out = daemon.cli(&["device", "rbd", "vm", "resize", "16M"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("would lose data"));
    let out = daemon.cli(&["device", "rbd", "nope", "snapshot", "x"]);
    assert!(!out.status.success());
}

/// EXTENDED COPY from one RBD LUN to another of the same Ceph pool: librbd
/// has no server-side copy of a range, so the gateway reads and writes;
/// what the cluster holds afterwards is the source's data.
#[test]
fn extended_copy_between_two_rbd_images_of_one_pool() {
    let f = fixture::cluster();
    let (from, to) = (f.image_name("xcopy-from"), f.image_name("xcopy-to"));
    let device = |name: &str, image: &str| {
        rbd_config(f, image, "16M")
            .split("[[target]]")
            .next()
            .expect("the device part")
            .replace("name = \"vm\"", &format!("name = \"{name}\""))
    };
    let config = format!(
        "{}{}[[target]]\nname = \"{IQN}\"\n\n[[target.lun]]\nlun = 0\ndevice = \"a\"\n\n\
         [[target.lun]]\nlun = 1\ndevice = \"b\"\n",
        device("a", &from),
        device("b", &to)
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("openarray.toml");
    std::fs::write(&path, config).expect("write config");
    let daemon = Daemon::start_portals(Some(&path), 1);
    let mut s = login(&daemon, "iqn.2026-11.org.openarray:xcopy");
    const BLOCKS: u16 = 2048; // 1 MiB a segment
    let data = Rng::new(0x00c0_b1e5).bytes(4 * BLOCKS as usize * BLOCK);
    for (i, chunk) in data.chunks(BLOCKS as usize * BLOCK).enumerate() {
        good(
            &write(&mut s, i as u32 * u32::from(BLOCKS), chunk),
            "WRITE(10)",
        );
    }
    for _ in 0..4 {
        // TEST UNIT READY past LUN 1's unit attentions.
        let _ = s.command(1, &[0x00; 6], &[], 0);
    }
    let targets = [
        xcopy::target_descriptor(&xcopy::naa(&mut s, 0), BLOCK as u32),
        xcopy::target_descriptor(&xcopy::naa(&mut s, 1), BLOCK as u32),
    ]
    .concat();
    // The first 4 MiB of `from` to 2 MiB on in `to`.
    for i in 0..4u64 {
        let lba = i * u64::from(BLOCKS);
        xcopy::block_to_block(&mut s, 1, &targets, lba, 4096 + lba, BLOCKS);
    }
    s.command_good(1, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0)
        .expect("SYNCHRONIZE CACHE");
    let export = f.export(&to);
    assert!(export[..2 << 20].iter().all(|&b| b == 0), "before the copy");
    assert!(export[2 << 20..6 << 20] == data[..], "the copy differs");
}

/// `openarray volume snapshot|clone|resize`, the pools' verbs, with the
/// Ceph pool as `--pool`: RBD snapshots and layered clones.
#[test]
fn volume_verbs_snapshot_and_clone_an_rbd_image() {
    let f = fixture::cluster();
    let image = f.image_name("verbs");
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = rbd_admin_daemon(f, &image, dir.path());
    let mut s = login_at(daemon.addr(), "iqn.2026-11.org.openarray:verbs");
    let data = Rng::new(0x7e4b).bytes(8 * BLOCK);
    good(&write(&mut s, 0, &data), "WRITE(10)");
    let spec = format!("{}/{image}", f.pool);
    let clone = format!("{image}-clone");
    let pool = ["--pool", f.pool.as_str()];

    daemon.ok(&[&["volume", "snapshot"][..], &pool, &[&image, "silver"]].concat());
    let snaps = f.rbd(&["snap", "ls", &spec]);
    assert!(snaps.contains("silver"), "rbd snap ls:\n{snaps}");
    let snapshot = format!("{image}@silver");
    daemon.ok(&[&["volume", "clone"][..], &pool, &[&snapshot, &clone]].concat());
    let children = f.rbd(&["children", &format!("{spec}@silver")]);
    assert!(children.contains(&clone), "rbd children:\n{children}");
    assert_eq!(&f.export(&clone)[..8 * BLOCK], data.as_slice());
    daemon.ok(&[&["volume", "resize"][..], &pool, &[&image, "72M"]].concat());
    assert!(f.rbd(&["info", &spec]).contains("72 MiB"));

    // Refused with the reason: a clone of an image rather than of a
    // snapshot, a verb RBD images do not take, an image nothing serves.
    for (args, why) in [
        (vec!["clone", image.as_str(), "x"], "IMAGE@SNAPSHOT"),
        (vec!["promote", image.as_str()], "RBD images take"),
        (
            vec!["snapshot", "nothing-serves-this", "x"],
            "no rbd device",
        ),
    ] {
        let out = daemon.cli(&[&["volume", args[0]][..], &pool, &args[1..]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(why),
            "{args:?}: {err}"
        );
    }
    // The device verbs still work beside them.
    daemon.ok(&["device", "rbd", "vm", "snapshot", "bronze"]);
    assert!(f.rbd(&["snap", "ls", &spec]).contains("bronze"));
}

/// A cluster whose monitor does not answer: `serve` fails within the
/// configured timeout, naming the device and the cluster.
#[test]
fn an_unreachable_cluster_fails_the_start_naming_the_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("ceph.conf");
    let port = common::free_port();
    std::fs::write(
        &conf,
        format!("[global]\nmon_host = v2:127.0.0.1:{port}\nauth_client_required = none\n"),
    )
    .expect("write ceph.conf");
    let config = dir.path().join("openarray.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[device]]
name = "vm"
kind = "rbd"
pool = "rbd"
image = "nowhere"
ceph_conf = "{}"
timeout = "3s"

[[target]]
name = "{IQN}"

[[target.lun]]
lun = 0
device = "vm"
"#,
            conf.display()
        ),
    )
    .expect("write config");
    let began = Instant::now();
    let mut cmd = common::serve_command();
    cmd.arg("--config")
        .arg(&config)
        .arg("--admin-socket")
        .arg("none")
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", common::free_port()));
    let out = common::run_with_timeout(cmd, Duration::from_secs(60));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve started without a cluster");
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "took {:?}",
        began.elapsed()
    );
    assert!(text.contains("device[0]"), "no device named in:\n{text}");
    assert!(text.contains("rbd/nowhere"), "no image named in:\n{text}");
    assert!(
        text.contains("no monitor answered"),
        "no reason given in:\n{text}"
    );
}

/// The same RBD image exported over NBD: the NBD clients' tests.
#[test]
fn nbd_clients_on_an_rbd_export() {
    const MIB: u64 = 1 << 20;
    let f = fixture::cluster();
    let image = f.image_name("nbd");
    let nbd_port = common::free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = rbd_config(f, &image, "64M")
        + &format!(
            "\n[nbd]\nlisten = [\"127.0.0.1:{nbd_port}\"]\n\n[[nbd.export]]\nname = \"vm\"\ndevice = \"vm\"\n"
        );
    let path = dir.path().join("openarray.toml");
    std::fs::write(&path, config).expect("write config");
    let _daemon = Daemon::start_portals(Some(&path), 1);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], nbd_port));
    nbd_clients::wait_for_listener(addr, Duration::from_secs(30));
    let uri = format!("nbd://{addr}/vm");
    let file = |name: &str| dir.path().join(name).display().to_string();

    // Data in two RBD objects (4 MiB each) only: the rest stays holes.
    let mut rng = Rng::new(0x0b0d_5eed);
    let mut data = vec![0u8; 64 * MIB as usize];
    for object in [1usize, 5] {
        let at = object * 4 * MIB as usize;
        rng.fill(&mut data[at..at + 4 * MIB as usize]);
    }
    std::fs::write(file("src.img"), &data).expect("write source");
    // qemu-img skips the zeros of the source and flushes before it exits.
    nbd_clients::run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            &file("src.img"),
            &uri,
        ],
    );
    assert!(
        f.export(&image) == data,
        "rbd export differs from what qemu-img wrote"
    );
    nbd_clients::run(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &uri, &file("back.img")],
    );
    assert!(
        std::fs::read(file("back.img")).expect("read back") == data,
        "qemu-img read back something else"
    );

    // Allocation is by object: exactly the two written ones are data.
    let want = vec![
        (0, 4 * MIB, false),
        (4 * MIB, 4 * MIB, true),
        (8 * MIB, 12 * MIB, false),
        (20 * MIB, 4 * MIB, true),
        (24 * MIB, 40 * MIB, false),
    ];
    let (got, text) = nbd_clients::nbdinfo_map(&uri);
    assert_eq!(got, want, "nbdinfo --map:\n{text}");

    // nbdcopy skips the holes and copies the rest.
    std::fs::File::create(file("copy.img"))
        .and_then(|c| c.set_len(64 * MIB))
        .expect("create copy");
    nbd_clients::run("nbdcopy", &[&uri, &file("copy.img")]);
    assert!(
        std::fs::read(file("copy.img")).expect("read copy") == data,
        "nbdcopy's copy differs"
    );

    // Verified random writes through fio's nbd engine, then the image as
    // the cluster holds it matches what NBD reads.
    nbd_clients::fio_verified_writes(&uri, "16M", 16);
    nbd_clients::run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &uri,
            &file("after.img"),
        ],
    );
    assert!(
        std::fs::read(file("after.img")).expect("read after") == f.export(&image),
        "NBD and rbd export disagree after fio's writes"
    );
}
