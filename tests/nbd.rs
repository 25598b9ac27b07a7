//! The daemon's NBD transport with real clients (qemu-img, nbdinfo,
//! nbdcopy, qemu-io, fio), over the configured device graph: a thin volume
//! of a pool shows its allocation, FUA and FLUSH survive a power cut of a
//! `faulty` device, a device served over iSCSI and NBD at once is one
//! device, exports change live through `openarray export`, and hostile
//! NBD input disturbs neither an NBD nor an iSCSI session beside it.

mod common;
#[path = "../crates/nbd/tests/common/hostile_packets.rs"]
mod hostile_packets;
// The nbd crate's raw client; this file uses part of it.
#[allow(dead_code)]
#[path = "../crates/nbd/tests/common/raw.rs"]
mod raw;

use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::admin::{http_exchange, AdminDaemon};
use common::iscsi::{LoginParams, Session};
use common::nbd_clients::{self, run};
use common::{free_port, retrying_taken_ports};
use nbd::proto::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use raw::Raw;

const MIB: u64 = 1 << 20;
const IQN: &str = "iqn.2026-11.org.openarray.test:nbd";
const HOST: &str = "iqn.2026-11.org.openarray.test:host";

/// A daemon with a portal and NBD on free loopback ports, serving
/// `body` (`{d}` is its directory).
struct Served {
    daemon: AdminDaemon,
    nbd: SocketAddr,
    dir: tempfile::TempDir,
}

impl Served {
    fn start(body: &str) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let body = body.replace("{d}", &dir.path().display().to_string());
        let (daemon, nbd_port) = retrying_taken_ports(|| {
            let (port, nbd_port) = (free_port(), free_port());
            let text = format!(
                "[[portal]]\nlisten = \"127.0.0.1:{port}\"\n\n[nbd]\nlisten = [\"127.0.0.1:{nbd_port}\"]\n{body}"
            );
            let cfg = dir.path().join("openarray.toml");
            std::fs::write(&cfg, text).unwrap();
            AdminDaemon::try_start(&cfg, dir.path(), port).map(|d| (d, nbd_port))
        });
        Served {
            daemon,
            nbd: SocketAddr::from(([127, 0, 0, 1], nbd_port)),
            dir,
        }
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.nbd)
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn raw(&self, export: &str) -> Raw {
        let mut c = Raw::connect(self.nbd).unwrap();
        c.go(export, true, false, false).unwrap();
        c
    }

    /// `GET PATH` through the administration socket: the body.
    fn get(&self, path: &str) -> String {
        let stream = std::os::unix::net::UnixStream::connect(&self.daemon.socket).unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (status, body) = http_exchange(stream, &request);
        assert_eq!(status, 200, "{body}");
        body
    }

    fn metrics(&self) -> String {
        self.get("/metrics")
    }
}

fn random_file(path: &str, len: u64) -> Vec<u8> {
    let mut data = vec![0; len as usize];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut data)
        .unwrap();
    std::fs::write(path, &data).unwrap();
    data
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ seed)
        .collect()
}

#[test]
fn qemu_img_converts_to_and_from_an_export_byte_identical() {
    let s = Served::start(
        r#"
[[device]]
name = "disk"
kind = "file"
path = "{d}/disk.img"
size = "256M"

[[nbd.export]]
name = "vm"
device = "disk"
"#,
    );
    let src = s.path("src.img");
    let back = s.path("back.img");
    let data = random_file(&src, 256 * MIB);
    let uri = s.uri("vm");
    run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", &src, &uri],
    );
    // qemu-img flushes before it exits: the file under the device has it.
    assert!(
        std::fs::read(s.path("disk.img")).unwrap() == data,
        "the device's file differs from the image written to it"
    );
    run(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &uri, &back],
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the image read back differs"
    );
    let metrics = s.metrics();
    let written = metrics
        .lines()
        .find(|l| {
            l.starts_with("openarray_nbd_bytes_total")
                && l.contains("export=\"vm\"")
                && l.contains("op=\"write\"")
        })
        .unwrap_or_else(|| panic!("no NBD write bytes in:\n{metrics}"));
    assert!(written.contains("transport=\"nbd\""), "{written}");
    assert!(written.ends_with(&format!(" {}", 256 * MIB)), "{written}");
}

/// (offset, length, data?) runs of `size` bytes with data at `data`.
fn expected_runs(data: &[(u64, u64)], size: u64) -> Vec<(u64, u64, bool)> {
    let mut runs = Vec::new();
    let mut at = 0;
    for (off, len) in data {
        if *off > at {
            runs.push((at, off - at, false));
        }
        runs.push((*off, *len, true));
        at = off + len;
    }
    if at < size {
        runs.push((at, size - at, false));
    }
    runs
}

#[test]
fn a_thin_volume_maps_and_copies_as_exactly_its_allocated_extents() {
    let size = 64 * MIB;
    let s = Served::start(
        r#"
[[pool]]
name = "tank"
devices = ["{d}/tank0.img"]
device_size = "256M"
unit_size = "64K"

[[device]]
name = "thin0"
kind = "volume"
pool = "tank"
volume = "thin0"
size = "64M"

[[nbd.export]]
name = "thin"
device = "thin0"
"#,
    );
    let uri = s.uri("thin");
    // Data in whole allocation units, written through NBD itself.
    let data = [
        (0, 64 * 1024),
        (10 * MIB, 128 * 1024),
        (40 * MIB, 64 * 1024),
    ];
    let mut c = s.raw("thin");
    for (i, (off, len)) in data.iter().enumerate() {
        let bytes = pattern(i as u8 + 1, *len as usize);
        assert_eq!(c.command(CMD_WRITE, 0, i as u64, *off, *len, &bytes), 0);
    }
    assert_eq!(c.command(CMD_FLUSH, 0, 9, 0, 0, &[]), 0);
    c.request(CMD_DISC, 0, 10, 0, 0, &[]);
    let want = expected_runs(&data, size);

    let (got, text) = nbd_clients::nbdinfo_map(&uri);
    assert_eq!(got, want, "nbdinfo --map:\n{text}");
    assert!(text.contains("hole,zero"), "{text}");
    let (got, text) = nbd_clients::qemu_img_map(&uri);
    assert_eq!(got, want, "qemu-img map:\n{text}");

    // nbdcopy skips the holes: the copy is the volume and as sparse.
    let copy = s.path("copy.img");
    std::fs::File::create(&copy).unwrap().set_len(size).unwrap();
    run("nbdcopy", &[&uri, &copy]);
    let mut expected = vec![0; size as usize];
    for (i, (off, len)) in data.iter().enumerate() {
        expected[*off as usize..(*off + *len) as usize]
            .copy_from_slice(&pattern(i as u8 + 1, *len as usize));
    }
    assert!(
        std::fs::read(&copy).unwrap() == expected,
        "the copy differs from the volume"
    );
    let allocated = std::fs::metadata(&copy).unwrap().blocks() * 512;
    assert!(
        allocated <= 256 * 1024 + MIB,
        "the copy allocates {allocated} bytes for 256 KiB of data"
    );
}

#[test]
fn qemu_io_on_two_connections_and_fio_verified_writes() {
    let s = Served::start(
        r#"
[[device]]
name = "m"
kind = "mem"
size = "64M"

[[device]]
name = "f"
kind = "mem"
size = "64M"

[[nbd.export]]
name = "vm"
device = "m"

[[nbd.export]]
name = "fio"
device = "f"
"#,
    );
    let uri = s.uri("vm");
    client_tools::qemu_io_two_connections(&uri);
    // What one connection wrote, another reads.
    let mut c = s.raw("vm");
    assert_eq!(
        c.read(1, 33 * MIB, MIB as usize).unwrap(),
        vec![0x21; MIB as usize]
    );

    // Long enough for the connection's trial to let fio's 32 requests in
    // flight gather in the socket (nbd::gather) for a while.
    assert_eq!(
        nbd_clients::fio_verified_writes(&s.uri("fio"), "64M", 32),
        64 * 1024
    );
    let metrics = s.metrics();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("openarray_nbd_errors_total")
                && l.contains("export=\"fio\"")
                && l.ends_with(" 0")),
        "{metrics}"
    );
    let gathered: u64 = metrics
        .lines()
        .find(|l| {
            l.starts_with("openarray_nbd_gathered_waits_total") && l.contains("export=\"fio\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no gathered waits for export fio in:\n{metrics}"));
    assert!(gathered > 0, "{metrics}");
}

#[test]
fn fua_and_flush_survive_a_power_cut_of_a_faulty_device() {
    let s = Served::start(
        r#"
[[device]]
name = "disk"
kind = "file"
path = "{d}/disk.img"
size = "16M"

[[device]]
name = "flaky"
kind = "faulty"
over = "disk"

[[device]]
name = "disk2"
kind = "file"
path = "{d}/disk2.img"
size = "16M"

[[device]]
name = "stable"
kind = "faulty"
over = "disk2"
write_cache = false

[[nbd.export]]
name = "f"
device = "flaky"

[[nbd.export]]
name = "wt"
device = "stable"
"#,
    );
    let len = 64 * 1024;
    let (a, b, c2) = (pattern(1, len), pattern(2, len), pattern(3, len));
    let mut c = s.raw("f");
    assert_eq!(c.command(CMD_WRITE, 0, 1, 0, len as u64, &a), 0);
    assert_eq!(
        c.command(CMD_WRITE, CMD_FLAG_FUA, 2, MIB, len as u64, &b),
        0
    );
    s.daemon.ok(&["device", "fault", "flaky", "drop-unflushed"]);
    // The write without FUA was in the volatile cache: the cut lost it
    // (so this test can tell); the FUA write was stable.
    assert_eq!(c.read(3, 0, len).unwrap(), vec![0; len]);
    assert_eq!(c.read(4, MIB, len).unwrap(), b);
    assert_eq!(c.command(CMD_WRITE, 0, 5, 2 * MIB, len as u64, &c2), 0);
    assert_eq!(c.command(CMD_FLUSH, 0, 6, 0, 0, &[]), 0);
    s.daemon.ok(&["device", "fault", "flaky", "drop-unflushed"]);
    assert_eq!(c.read(7, 2 * MIB, len).unwrap(), c2);

    // With the device's write cache off, every write is stable when it
    // completes, FUA or not.
    let mut w = s.raw("wt");
    assert_eq!(w.command(CMD_WRITE, 0, 1, 0, len as u64, &a), 0);
    s.daemon
        .ok(&["device", "fault", "stable", "drop-unflushed"]);
    assert_eq!(w.read(2, 0, len).unwrap(), a);
}

#[test]
fn one_device_on_iscsi_and_nbd_is_one_device_and_both_sessions_are_listed() {
    let s = Served::start(&format!(
        r#"
[[device]]
name = "shared"
kind = "mem"
size = "16M"
block_size = 512

[[target]]
name = "{IQN}"
[[target.lun]]
lun = 0
device = "shared"

[[nbd.export]]
name = "shared"
device = "shared"
"#
    ));
    let params = LoginParams::normal(HOST, IQN);
    let mut iscsi = Session::login(s.daemon.addr(), &params, Duration::from_secs(10)).unwrap();
    let mut nbd = s.raw("shared");
    let via_iscsi = pattern(5, 8 * 512);
    iscsi.write10(0, 100, &via_iscsi, 512).unwrap();
    assert_eq!(nbd.read(1, 100 * 512, via_iscsi.len()).unwrap(), via_iscsi);
    let via_nbd = pattern(6, 16 * 512);
    assert_eq!(
        nbd.command(CMD_WRITE, 0, 2, 200 * 512, via_nbd.len() as u64, &via_nbd),
        0
    );
    assert_eq!(iscsi.read10(0, 200, 16, 512).unwrap(), via_nbd);

    // Both sessions are listed, each with its transport.
    let listed: serde_json::Value = serde_json::from_str(&s.get("/v1/sessions")).unwrap();
    let sessions = listed["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2, "{listed}");
    assert_eq!(sessions[0]["transport"], "iscsi");
    assert_eq!(sessions[0]["target"], IQN);
    let on_nbd = &sessions[1];
    assert_eq!(on_nbd["transport"], "nbd", "{listed}");
    assert_eq!(on_nbd["export"], "shared");
    assert_eq!(on_nbd["peer"], "127.0.0.1");
    assert_eq!(on_nbd["structured_replies"], true);
    let id = on_nbd["id"].as_str().unwrap();
    let shown: serde_json::Value =
        serde_json::from_str(&s.get(&format!("/v1/sessions/{id}"))).unwrap();
    assert_eq!(shown["export"], "shared");
    let table = s.daemon.ok(&["session", "list"]);
    let row = table.lines().find(|l| l.contains(" nbd ")).expect(&table);
    assert!(
        row.contains(id) && row.contains("shared") && row.contains("127.0.0.1"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.contains(" iscsi ") && l.contains(IQN)),
        "{table}"
    );
    let details = s.daemon.ok(&["session", "show", id]);
    assert!(
        details.contains("export:") && details.contains("shared"),
        "{details}"
    );
    // `session kill` closes an NBD session by its id; the others go on.
    let mut doomed = s.raw("shared");
    assert_eq!(doomed.read(1, 0, 512).unwrap().len(), 512);
    let listed: serde_json::Value = serde_json::from_str(&s.get("/v1/sessions")).unwrap();
    let other = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["id"].as_str())
        .find(|x| x.starts_with("nbd-") && *x != id)
        .expect("the second NBD session")
        .to_string();
    let out = s.daemon.ok(&["session", "kill", &other]);
    assert!(out.contains("closed"), "{out}");
    // The server closes it: the client reads the end of the stream (an
    // error within its 30 s read timeout, not a reply).
    let started = Instant::now();
    assert!(doomed.reply(0).is_err(), "the killed session still serves");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "not closed at once"
    );
    let out = s.daemon.cli(&["session", "kill", "nbd-999"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("no session nbd-999"),
        "{said}"
    );
    assert_eq!(nbd.read(3, 100 * 512, 512).unwrap(), via_iscsi[..512]);
    // Once the NBD client leaves, only the iSCSI session is listed.
    nbd.request(CMD_DISC, 0, 3, 0, 0, &[]);
    drop(nbd);
    let mut left = 0;
    for _ in 0..100 {
        let listed: serde_json::Value = serde_json::from_str(&s.get("/v1/sessions")).unwrap();
        left = listed["sessions"].as_array().unwrap().len();
        if left == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(left, 1);
    iscsi.logout().unwrap();
}

#[test]
fn exports_change_live_through_the_command_line() {
    let s = Served::start(
        r#"
[[device]]
name = "a"
kind = "mem"
size = "4M"

[[device]]
name = "b"
kind = "mem"
size = "8M"

[[nbd.export]]
name = "first"
device = "a"
"#,
    );
    let listed = s.daemon.ok(&["export", "list"]);
    assert_eq!(listed.trim(), "first -> a allow every client");
    // A session on an export that stays is not disturbed by the change.
    let mut first = s.raw("first");
    let data = pattern(9, 4096);
    assert_eq!(first.command(CMD_WRITE, 0, 1, 0, 4096, &data), 0);

    s.daemon.ok(&[
        "export",
        "add",
        "second",
        "--device",
        "b",
        "--read-only",
        "--allow",
        "127.0.0.0/8",
    ]);
    let listed = s.daemon.ok(&["export", "list"]);
    assert!(
        listed.contains("second -> b (read-only) allow 127.0.0.0/8"),
        "{listed}"
    );
    let out = run("nbdinfo", &[&s.uri("second")]);
    let info = String::from_utf8_lossy(&out.stdout);
    assert!(info.contains("export-size: 8388608"), "{info}");
    assert!(info.contains("is_read_only: true"), "{info}");
    assert_eq!(first.read(2, 0, 4096).unwrap(), data);
    // The status page lists the exports with their sessions.
    let status: serde_json::Value = serde_json::from_str(&s.get("/v1/status")).unwrap();
    let exports = status["nbd_exports"].as_array().unwrap();
    assert_eq!(exports.len(), 2, "{status}");
    assert_eq!(exports[0]["name"], "first");
    assert_eq!(exports[0]["sessions"], 1, "{status}");
    assert_eq!(exports[1]["read_only"], true);
    assert_eq!(status["healthy"], true);
    let shown = s.daemon.ok(&["status"]);
    assert!(
        shown.contains("nbd exports:\n  first -> a (1 session(s))"),
        "{shown}"
    );

    // A device still exported cannot be removed; the refusal names it.
    let out = s.daemon.cli(&["device", "remove", "b"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("still mapped as NBD export second"), "{err}");
    // A bad allow entry is refused with its field.
    let out = s.daemon.cli(&[
        "export",
        "add",
        "bad",
        "--device",
        "a",
        "--allow",
        "10.0.0.0/99",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nbd.export[2].allow[0]"), "{err}");

    // Nothing else serves the RAM device: its data would go with it.
    let out = s.daemon.cli(&["export", "remove", "second"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no LUN or NBD export serves RAM device `b` any more"),
        "{err}"
    );
    s.daemon.ok(&["export", "remove", "second", "--force"]);
    s.daemon.ok(&["device", "remove", "b"]);
    let mut c = Raw::connect(s.nbd).unwrap();
    assert!(c.go("second", true, false, false).is_err());
    assert_eq!(first.read(3, 0, 4096).unwrap(), data);
    // The file kept the edits.
    let text = std::fs::read_to_string(s.path("openarray.toml")).unwrap();
    assert!(
        text.contains("name = \"first\"") && !text.contains("second"),
        "{text}"
    );
}

#[test]
fn where_nbd_listens_changes_live() {
    let s = Served::start(
        r#"
[[device]]
name = "a"
kind = "mem"
size = "4M"

[[nbd.export]]
name = "first"
device = "a"
"#,
    );
    let mut before = s.raw("first");
    let data = pattern(4, 4096);
    assert_eq!(before.command(CMD_WRITE, 0, 1, 0, 4096, &data), 0);
    let cfg = s.path("openarray.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let old = format!("listen = [\"{}\"]", s.nbd);
    let moved = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let socket = s.path("nbd.sock");
    let apply = |listen: &str| {
        std::fs::write(&cfg, text.replace(&old, listen)).unwrap();
        s.daemon.config_cli(&["apply", &cfg])
    };
    let out = apply(&format!("listen = [\"{moved}\", \"unix:{socket}\"]"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The new addresses serve at once; the old one no longer accepts, and
    // the session that came through it goes on.
    let mut c = Raw::connect(moved).unwrap();
    c.go("first", true, false, false).unwrap();
    assert_eq!(c.read(1, 0, 4096).unwrap(), data);
    let out = run("nbdinfo", &[&format!("nbd+unix:///first?socket={socket}")]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("export-size: 4194304"));
    assert!(Raw::connect(s.nbd).is_err());
    assert_eq!(before.read(2, 0, 4096).unwrap(), data);

    // An address that is taken refuses the whole change, naming it.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().map(|a| (a, taken)).unwrap();
    let out = apply(&format!("listen = [\"{}\"]", taken.0));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("nbd.listen: cannot listen on {}", taken.0)),
        "{err}"
    );
    assert!(Raw::connect(moved).is_ok());
    assert!(std::path::Path::new(&socket).exists());
    let listing = s.get("/v1/config");
    assert!(listing.contains(&moved.to_string()), "{listing}");
}

/// Resident memory of a process in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// Writes, reads back and compares through NBD until told to stop.
fn verified_nbd(addr: SocketAddr, stop: Arc<AtomicBool>, ops: Arc<AtomicU64>) {
    let mut c = Raw::connect(addr).unwrap();
    c.go("v", true, false, false).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut cookie = 0;
    while !stop.load(Ordering::Relaxed) {
        // The lower half: the hostile requests land in the upper.
        let offset = rng.gen_range(0..(16 * MIB / 4096)) * 4096;
        let len = rng.gen_range(1..=16) * 4096;
        let mut data = vec![0; len as usize];
        rng.fill(&mut data[..]);
        cookie += 2;
        let fua = if cookie % 7 == 0 { CMD_FLAG_FUA } else { 0 };
        assert_eq!(c.command(CMD_WRITE, fua, cookie, offset, len, &data), 0);
        assert!(
            c.read(cookie + 1, offset, len as usize).unwrap() == data,
            "the verified NBD session read back other data"
        );
        ops.fetch_add(1, Ordering::Relaxed);
    }
    c.request(CMD_DISC, 0, cookie + 2, 0, 0, &[]);
}

/// Writes, reads back and compares through iSCSI until told to stop.
fn verified_iscsi(addr: SocketAddr, stop: Arc<AtomicBool>, ops: Arc<AtomicU64>) {
    let params = LoginParams::normal(HOST, IQN);
    let mut s = Session::login(addr, &params, Duration::from_secs(10)).unwrap();
    let mut rng = StdRng::seed_from_u64(8);
    while !stop.load(Ordering::Relaxed) {
        let lba = rng.gen_range(0..30_000u32);
        let blocks = rng.gen_range(1..=32u16);
        let mut data = vec![0; blocks as usize * 512];
        rng.fill(&mut data[..]);
        s.write10(0, lba, &data, 512).unwrap();
        assert!(
            s.read10(0, lba, blocks, 512).unwrap() == data,
            "the verified iSCSI session read back other data"
        );
        ops.fetch_add(1, Ordering::Relaxed);
    }
    s.logout().unwrap();
}

#[test]
fn hostile_nbd_input_disturbs_neither_an_nbd_nor_an_iscsi_session() {
    const PACKETS: u64 = 100_000;
    let s = Served::start(&format!(
        r#"
[[device]]
name = "v"
kind = "mem"
size = "64M"

[[device]]
name = "lun"
kind = "mem"
size = "16M"

[[target]]
name = "{IQN}"
[[target.lun]]
lun = 0
device = "lun"

[[nbd.export]]
name = "v"
device = "v"
"#
    ));
    assert_eq!(hostile_packets::SIZE, 64 * MIB);
    let pid = s.daemon.pid();
    let stop = Arc::new(AtomicBool::new(false));
    let (nbd_ops, iscsi_ops) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let nbd_session = {
        let (stop, ops, addr) = (stop.clone(), nbd_ops.clone(), s.nbd);
        std::thread::spawn(move || verified_nbd(addr, stop, ops))
    };
    let iscsi_session = {
        let (stop, ops, addr) = (stop.clone(), iscsi_ops.clone(), s.daemon.addr());
        std::thread::spawn(move || verified_iscsi(addr, stop, ops))
    };
    let rss_start = rss_bytes(pid);
    let peak = Arc::new(AtomicU64::new(rss_start));
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..2u64)
        .map(|w| {
            let (sent, peak, addr) = (sent.clone(), peak.clone(), s.nbd);
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(2000 + w);
                while sent.load(Ordering::Relaxed) < PACKETS {
                    let n = hostile_packets::send_one(addr, &mut rng);
                    sent.fetch_add(n, Ordering::Relaxed);
                    peak.fetch_max(rss_bytes(pid), Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    nbd_session.join().expect("the verified NBD session failed");
    iscsi_session
        .join()
        .expect("the verified iSCSI session failed");
    let peak = peak.load(Ordering::Relaxed);
    eprintln!(
        "{} packets in {:?}; verified NBD {} and iSCSI {} write+read pairs; rss {} -> peak {} MiB",
        sent.load(Ordering::Relaxed),
        started.elapsed(),
        nbd_ops.load(Ordering::Relaxed),
        iscsi_ops.load(Ordering::Relaxed),
        rss_start >> 20,
        peak >> 20
    );
    assert!(sent.load(Ordering::Relaxed) >= PACKETS);
    assert!(nbd_ops.load(Ordering::Relaxed) > 100);
    assert!(iscsi_ops.load(Ordering::Relaxed) > 100);
    let log = s.daemon.log();
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        peak - rss_start < 512 * MIB,
        "memory grew by {} MiB",
        (peak - rss_start) >> 20
    );
    let metrics = s.metrics();
    let errors = metrics
        .lines()
        .find(|l| l.starts_with("openarray_nbd_protocol_errors_total"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(errors.contains("transport=\"nbd\""), "{errors}");
    let count: u64 = errors.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count > 100, "malformed input was not noticed: {errors}");
}

#[test]
fn the_default_configuration_exports_its_ram_disk_where_nbd_listen_says() {
    let (port, nbd_port) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut child = common::serve_command()
        .args(["--admin-socket", "none", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--nbd-listen")
        .arg(format!("127.0.0.1:{nbd_port}"))
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let nbd = SocketAddr::from(([127, 0, 0, 1], nbd_port));
    let started = Instant::now();
    let line = format!("NBD listening addr={nbd}");
    while !std::fs::read_to_string(&log).unwrap().contains(&line) {
        assert!(child.try_wait().unwrap().is_none(), "serve exited");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = run("nbdinfo", &[&format!("nbd://{nbd}/default")]);
    let info = String::from_utf8_lossy(&out.stdout).to_string();
    // SAFETY: kill(2) on our own child, still unreaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    assert!(info.contains("export-size: 1073741824"), "{info}");
    assert!(info.contains("can_multi_conn: true"), "{info}");
}
