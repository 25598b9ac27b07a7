//! Protocol details no installed client exercises, through a raw-socket
//! client: extended headers, durability of FUA and FLUSH, access control,
//! listing, out-of-order replies, live export replacement, unix sockets.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use block::{BlockDevice, Faults, FaultyDevice, MemDevice, Wrapped};
use common::raw::{string, Raw, Reply};
use common::{export, random_bytes, Running};
use nbd::proto::*;
use nbd::{Allow, Export};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

#[test]
fn extended_headers_carry_64_bit_lengths() {
    // 8 GiB, sparse: one written MiB at 5 GiB.
    let dev = Arc::new(MemDevice::new(8 * GIB));
    let srv = Running::start(vec![("big", export(dev.clone()))]);
    let mut c = Raw::connect(srv.addr).unwrap();
    c.go("big", true, true, true).unwrap();
    assert_eq!(c.size, 8 * GIB);
    let data = random_bytes(MIB as usize, 3);
    assert_eq!(c.command(CMD_WRITE, 0, 1, 5 * GIB, MIB, &data), 0);
    assert_eq!(
        c.read(2, 5 * GIB - 4096, MIB as usize + 8192).unwrap()[4096..4096 + MIB as usize],
        data[..]
    );
    // One block status over 6 GiB: extents longer than 32 bits.
    let extents = c.block_status(3, 0, 6 * GIB);
    assert_eq!(extents[0], (5 * GIB, STATE_HOLE | STATE_ZERO));
    assert_eq!(extents[1], (MIB, 0));
    // A 64-bit effect length: trim 4 GiB + 1 MiB at once.
    assert_eq!(c.command(CMD_TRIM, 0, 4, 2 * GIB, 4 * GIB + MIB, &[]), 0);
    assert_eq!(c.read(5, 5 * GIB, 4096).unwrap(), vec![0; 4096]);
    // Every reply is an extended one carrying the request's offset.
    c.request(CMD_FLUSH, 0, 6, 0, 0, &[]);
    match c.reply(0).unwrap() {
        Reply::Chunk {
            kind,
            cookie: 6,
            flags,
            ..
        } => {
            assert_eq!((kind, flags), (REPLY_TYPE_NONE, REPLY_FLAG_DONE))
        }
        r => panic!("{r:?}"),
    }
    c.request(CMD_READ, 0, 7, 4096, 4096, &[]);
    match c.reply(0).unwrap() {
        Reply::Chunk { offset, .. } => assert_eq!(offset, 4096),
        r => panic!("{r:?}"),
    }
}

#[test]
fn compact_structured_reads_send_holes_and_block_status() {
    let dev = Arc::new(MemDevice::new(16 * MIB));
    dev.write_at(&[9; 4096], 8 * MIB, false).unwrap();
    let srv = Running::start(vec![("v", export(dev))]);
    let mut c = Raw::connect(srv.addr).unwrap();
    c.go("v", true, false, true).unwrap();
    assert!(c.flags & FLAG_CAN_MULTI_CONN != 0 && c.flags & FLAG_SEND_DF != 0);
    c.request(CMD_READ, 0, 1, 0, 16 * MIB, &[]);
    let chunks = c.whole_reply();
    let kinds: Vec<u16> = chunks
        .iter()
        .map(|r| match r {
            Reply::Chunk { kind, .. } => *kind,
            _ => panic!(),
        })
        .collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == REPLY_TYPE_OFFSET_HOLE)
            .count(),
        2,
        "{kinds:?}"
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == REPLY_TYPE_OFFSET_DATA)
            .count(),
        1
    );
    // With DF the same read is one data chunk.
    c.request(CMD_READ, CMD_FLAG_DF, 2, 0, 16 * MIB, &[]);
    let chunks = c.whole_reply();
    assert_eq!(chunks.len(), 1);
    let ext = c.block_status(3, 0, 16 * MIB);
    assert_eq!(ext.iter().map(|e| e.0).sum::<u64>(), 16 * MIB);
    assert_eq!(ext.iter().filter(|e| e.1 == 0).count(), 1);
}

#[test]
fn replies_come_out_of_order_when_the_device_takes_its_time() {
    // A slow device: the first request is still running when the flush
    // behind it is answered.
    let faulty = Arc::new(FaultyDevice::new(Arc::new(MemDevice::new(16 * MIB))));
    let srv = Running::start(vec![("slow", export(faulty.clone()))]);
    let mut c = Raw::connect(srv.addr).unwrap();
    c.go("slow", true, false, false).unwrap();
    faulty.set_delay(Some(Duration::from_millis(300)));
    c.request(CMD_WRITE, 0, 1, 0, 4096, &[1; 4096]);
    std::thread::sleep(Duration::from_millis(100));
    faulty.set_delay(None);
    c.request(CMD_WRITE, 0, 2, 8192, 4096, &[2; 4096]);
    let first = c.reply(0).unwrap();
    let second = c.reply(0).unwrap();
    assert_eq!((first.cookie(), second.cookie()), (2, 1));
}

fn faulty_export() -> (Arc<Wrapped<Faults>>, Running) {
    let faulty = Arc::new(FaultyDevice::new(Arc::new(MemDevice::new(16 * MIB))));
    let srv = Running::start(vec![("f", export(faulty.clone()))]);
    (faulty, srv)
}

#[test]
fn fua_and_flush_survive_a_power_cut_and_nothing_else_does() {
    let (faulty, srv) = faulty_export();
    let mut c = Raw::connect(srv.addr).unwrap();
    c.go("f", true, false, false).unwrap();
    assert!(c.flags & FLAG_SEND_FUA != 0 && c.flags & FLAG_SEND_FLUSH != 0);
    assert_eq!(c.command(CMD_WRITE, 0, 1, 0, 4096, &[1; 4096]), 0);
    assert_eq!(
        c.command(CMD_WRITE, CMD_FLAG_FUA, 2, 4096, 4096, &[2; 4096]),
        0
    );
    assert_eq!(
        c.command(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 3, 8192, 4096, &[]),
        0
    );
    faulty.drop_unflushed();
    assert_eq!(
        c.read(4, 0, 4096).unwrap(),
        vec![0; 4096],
        "an unflushed write survived"
    );
    assert_eq!(
        c.read(5, 4096, 4096).unwrap(),
        vec![2; 4096],
        "a FUA write was lost"
    );

    // Writes on two connections, one flush on a third: all are stable.
    let mut a = Raw::connect(srv.addr).unwrap();
    a.go("f", false, false, false).unwrap();
    let mut b = Raw::connect(srv.addr).unwrap();
    b.go("f", false, false, false).unwrap();
    assert_eq!(a.command(CMD_WRITE, 0, 1, MIB, 4096, &[3; 4096]), 0);
    assert_eq!(b.command(CMD_WRITE, 0, 1, 2 * MIB, 4096, &[4; 4096]), 0);
    assert!(faulty.unflushed_bytes() >= 8192);
    assert_eq!(c.command(CMD_FLUSH, 0, 6, 0, 0, &[]), 0);
    faulty.drop_unflushed();
    assert_eq!(a.read(2, MIB, 4096).unwrap(), vec![3; 4096]);
    assert_eq!(a.read(3, 2 * MIB, 4096).unwrap(), vec![4; 4096]);
    // A failing device answers with an error, and the session goes on.
    faulty.set_fail_writes(true);
    assert_eq!(c.command(CMD_WRITE, 0, 7, 0, 4096, &[5; 4096]), EIO);
    faulty.set_fail_writes(false);
    assert_eq!(
        c.command(CMD_WRITE, CMD_FLAG_FUA, 8, 0, 4096, &[5; 4096]),
        0
    );
    assert_eq!(srv.server.stats().exports[0].errors, 1);
}

#[test]
fn an_export_a_client_may_not_use_answers_as_an_unknown_name() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(MIB));
    let mut closed = Export::new(dev.clone());
    closed.allow = Allow::parse(&["10.0.0.0/8"]).unwrap();
    let mut open = Export::new(dev.clone());
    open.allow = Allow::parse(&["127.0.0.0/8"]).unwrap();
    open.description = "the open one".into();
    let srv = Running::start(vec![("closed", closed), ("open", open)]);
    let mut c = Raw::connect(srv.addr).unwrap();
    // Listing shows only what this client may use.
    let list = c.option(OPT_LIST, &[]).unwrap();
    assert_eq!(list.len(), 2, "{list:?}");
    assert_eq!(list[0].1, [&string("open")[..], b"the open one"].concat());
    // A hidden export's existence cannot be probed.
    assert_eq!(c.go("closed", false, false, false), Err(REP_ERR_UNKNOWN));
    assert_eq!(c.go("nothere", false, false, false), Err(REP_ERR_UNKNOWN));
    // Options the server does not know, or data where none belongs.
    assert_eq!(c.option(99, &[]).unwrap()[0].0, REP_ERR_UNSUP);
    assert_eq!(
        c.option(OPT_STRUCTURED_REPLY, &[1]).unwrap()[0].0,
        REP_ERR_INVALID
    );
    assert_eq!(
        c.option(OPT_GO, &[0, 0, 0, 9]).unwrap()[0].0,
        REP_ERR_INVALID
    );
    // Metadata contexts need structured replies first.
    let mut meta = string("open");
    meta.extend_from_slice(&0u32.to_be_bytes());
    assert_eq!(
        c.option(OPT_LIST_META_CONTEXT, &meta).unwrap()[0].0,
        REP_ERR_INVALID
    );
    c.go("open", true, false, false).unwrap();
    // Block status was not negotiated.
    assert_eq!(c.command(CMD_BLOCK_STATUS, 0, 1, 0, 4096, &[]), EINVAL);
    let stats = srv.server.stats();
    let closed = stats.exports.iter().find(|e| e.name == "closed").unwrap();
    assert_eq!(closed.refused, 1);
}

#[test]
fn meta_contexts_are_listed_and_export_name_works() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(MIB));
    let srv = Running::start(vec![("default", Export::new(dev))]);
    let mut c = Raw::connect(srv.addr).unwrap();
    assert_eq!(c.option(OPT_STRUCTURED_REPLY, &[]).unwrap()[0].0, REP_ACK);
    let mut q = string("");
    q.extend_from_slice(&1u32.to_be_bytes());
    q.extend_from_slice(&string("base:"));
    let r = c.option(OPT_LIST_META_CONTEXT, &q).unwrap();
    assert_eq!(r[0].0, REP_META_CONTEXT);
    assert_eq!(&r[0].1[4..], BASE_ALLOCATION.as_bytes());
    let mut q = string("");
    q.extend_from_slice(&1u32.to_be_bytes());
    q.extend_from_slice(&string("qemu:dirty-bitmap:x"));
    let r = c.option(OPT_SET_META_CONTEXT, &q).unwrap();
    assert_eq!(r.len(), 1, "nothing selected");
    // NBD_OPT_EXPORT_NAME with the default export's empty name.
    c.send_option(OPT_EXPORT_NAME, &[]).unwrap();
    let mut answer = [0; 10];
    std::io::Read::read_exact(&mut c.s, &mut answer).unwrap();
    assert_eq!(u64::from_be_bytes(answer[..8].try_into().unwrap()), MIB);
    c.structured = true;
    assert_eq!(c.command(CMD_WRITE, 0, 1, 0, 512, &[7; 512]), 0);
    assert_eq!(c.read(2, 0, 512).unwrap(), vec![7; 512]);
    c.request(CMD_DISC, 0, 3, 0, 0, &[]);
}

#[test]
fn read_only_exports_refuse_writes() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(MIB));
    let mut ro = Export::new(dev);
    ro.read_only = true;
    let srv = Running::start(vec![("ro", ro)]);
    let mut c = Raw::connect(srv.addr).unwrap();
    c.go("ro", true, false, false).unwrap();
    assert!(c.flags & FLAG_READ_ONLY != 0);
    assert_eq!(c.command(CMD_WRITE, 0, 1, 0, 512, &[7; 512]), EPERM);
    assert_eq!(c.command(CMD_WRITE_ZEROES, 0, 2, 0, 512, &[]), EPERM);
    assert_eq!(c.read(3, 0, 512).unwrap(), vec![0; 512]);
}

#[test]
fn replaced_exports_end_the_sessions_of_removed_ones_only() {
    let first: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(MIB));
    let kept: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(MIB));
    let srv = Running::start(vec![
        ("a", Export::new(first.clone())),
        ("k", Export::new(kept.clone())),
    ]);
    let mut on_a = Raw::connect(srv.addr).unwrap();
    on_a.go("a", true, false, false).unwrap();
    let mut on_k = Raw::connect(srv.addr).unwrap();
    on_k.go("k", true, false, false).unwrap();
    common::eventually("two sessions", || srv.server.sessions().len() == 2);
    let second: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(2 * MIB));
    let mut k = Export::new(kept);
    k.description = "a new description changes nothing".into();
    srv.server.replace_exports(BTreeMap::from([
        ("b".to_string(), Export::new(second)),
        ("k".to_string(), k),
    ]));
    // New clients see the new table.
    let mut c = Raw::connect(srv.addr).unwrap();
    assert_eq!(c.go("a", false, false, false), Err(REP_ERR_UNKNOWN));
    c.go("b", false, false, false).unwrap();
    assert_eq!(c.size, 2 * MIB);
    // The session on the removed export is closed; the other goes on.
    let mut byte = [0; 1];
    assert!(matches!(
        std::io::Read::read(&mut on_a.s, &mut byte),
        Ok(0) | Err(_)
    ));
    assert_eq!(on_k.command(CMD_WRITE, 0, 1, 0, 512, &[1; 512]), 0);
    let exports = || -> Vec<String> {
        let sessions = srv.server.sessions();
        sessions.iter().map(|s| s.export.clone()).collect()
    };
    common::eventually("sessions on k and b", || exports() == ["k", "b"]);
    let sessions = srv.server.sessions();
    assert!(sessions[0].structured_replies && !sessions[0].tls);
}

#[test]
fn unix_socket_clients_and_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nbd.sock");
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(MIB));
    let srv = Running::start(vec![]);
    let mut unix_only = Export::new(dev);
    unix_only.allow = Allow::parse(&["unix"]).unwrap();
    srv.server
        .replace_exports(BTreeMap::from([("u".to_string(), unix_only)]));
    // A socket file left by a process that is gone is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let addr = nbd::parse_listen(&format!("unix:{}", path.display())).unwrap();
    let serving = srv.runtime().block_on(srv.server.listen(&addr)).unwrap();
    // Over TCP the export is refused; over the socket it is served.
    let mut tcp = Raw::connect(srv.addr).unwrap();
    assert_eq!(tcp.go("u", false, false, false), Err(REP_ERR_UNKNOWN));
    let out = common::run(
        "nbdinfo",
        &[
            "--size",
            &format!("nbd+unix:///u?socket={}", path.display()),
        ],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), MIB.to_string());
    srv.server.shutdown();
    srv.runtime().block_on(async {
        tokio::time::timeout(Duration::from_secs(5), serving)
            .await
            .expect("the unix listener stops at shutdown")
            .unwrap()
            .unwrap()
    });
    assert!(!path.exists(), "the socket file is left behind");
    // An open session ends too.
    let mut buf = [0u8; 1];
    let _ = tcp.s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = tcp.s.write_all(&[0; 28]);
    assert!(matches!(
        std::io::Read::read(&mut tcp.s, &mut buf),
        Ok(0) | Err(_)
    ));
}

/// A new connection to `addr` is closed without a greeting.
fn assert_closed_before_greeting(addr: std::net::SocketAddr) {
    let mut refused = std::net::TcpStream::connect(addr).unwrap();
    refused
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0; 8];
    assert!(matches!(
        std::io::Read::read(&mut refused, &mut buf),
        Ok(0) | Err(_)
    ));
}

#[test]
fn connections_beyond_the_maximum_are_refused() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(MIB));
    let limits = nbd::Limits {
        max_connections: 2,
        ..nbd::Limits::default()
    };
    let srv = common::Running::with_limits(vec![("v", Export::new(dev))], limits);
    let mut a = Raw::connect(srv.addr).unwrap();
    a.go("v", false, false, false).unwrap();
    let _b = Raw::connect(srv.addr).unwrap();
    // The third is closed before its greeting.
    assert_closed_before_greeting(srv.addr);
    assert_eq!(srv.server.stats().refused_full, 1);
    // A session leaving frees its place.
    a.request(CMD_DISC, 0, 1, 0, 0, &[]);
    drop(a);
    std::thread::sleep(Duration::from_millis(200));
    assert!(Raw::connect(srv.addr).is_ok());
}

#[test]
fn one_source_holds_at_most_its_share_after_the_handshake_too() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(MIB));
    let limits = nbd::Limits {
        connections_per_source: 2,
        ..nbd::Limits::default()
    };
    let srv = common::Running::with_limits(vec![("v", Export::new(dev))], limits);
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = Raw::connect(srv.addr).unwrap();
        c.go("v", false, false, false).unwrap();
        held.push(c);
    }
    assert_closed_before_greeting(srv.addr);
    assert_eq!(srv.server.stats().refused_source, 1);
    held.pop();
    std::thread::sleep(Duration::from_millis(200));
    let mut again = Raw::connect(srv.addr).unwrap();
    again.go("v", false, false, false).unwrap();
}

#[test]
fn a_client_that_stops_reading_is_dropped_and_pins_bounded_memory() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(64 * MIB));
    dev.write_at(&random_bytes(64 * MIB as usize, 9), 0, false)
        .unwrap();
    let limits = nbd::Limits {
        write_deadline: Duration::from_secs(1),
        in_flight_bytes: 8 << 20,
        ..nbd::Limits::default()
    };
    let srv = common::Running::with_limits(vec![("v", Export::new(dev))], limits);
    let mut silent = Raw::connect(srv.addr).unwrap();
    silent.go("v", true, false, false).unwrap();
    silent
        .s
        .set_write_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // Ask for 256 MiB of reads and read none of it.
    for i in 0..256u64 {
        let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&CMD_READ.to_be_bytes());
        b.extend_from_slice(&i.to_be_bytes());
        b.extend_from_slice(&((i % 64) * MIB).to_be_bytes());
        b.extend_from_slice(&(MIB as u32).to_be_bytes());
        if silent.s.write_all(&b).is_err() {
            break; // the server stopped reading requests: its budget is full
        }
    }
    // Meanwhile another session is served as usual.
    let mut other = Raw::connect(srv.addr).unwrap();
    other.go("v", true, false, false).unwrap();
    assert_eq!(other.read(1, 0, 4096).unwrap().len(), 4096);
    // The silent one is closed once a write makes no progress for 1 s.
    let started = std::time::Instant::now();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while srv.server.stats().open_connections > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the silent client is still connected"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(srv.server.stats().stalled, 1);
    assert_eq!(other.command(CMD_FLUSH, 0, 2, 0, 0, &[]), 0);
}

/// A device whose reads at offset 0 panic, as a bug below would.
struct PanickyDevice(MemDevice);

impl BlockDevice for PanickyDevice {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        assert!(offset != 0, "a device bug");
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> std::io::Result<()> {
        self.0.write_at(buf, offset, fua)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
    fn capabilities(&self) -> block::Capabilities {
        block::Capabilities {
            may_block: true,
            ..self.0.capabilities()
        }
    }
    fn describe(&self) -> String {
        "panicky".into()
    }
}

#[test]
fn a_panic_in_the_device_fails_that_request_only() {
    let dev: Arc<dyn BlockDevice> = Arc::new(PanickyDevice(MemDevice::new(MIB)));
    let srv = Running::start(vec![("p", Export::new(dev))]);
    let mut c = Raw::connect(srv.addr).unwrap();
    c.go("p", true, false, false).unwrap();
    assert_eq!(c.read(1, 0, 4096), Err(EIO));
    assert_eq!(c.command(CMD_WRITE, 0, 2, 4096, 512, &[3; 512]), 0);
    assert_eq!(c.read(3, 4096, 512).unwrap(), vec![3; 512]);
}

#[test]
fn export_name_that_is_not_served_closes_the_connection() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(MIB));
    let srv = Running::start(vec![("default", Export::new(dev))]);
    for name in [&b"nothere"[..], &[0xff, 0xfe][..]] {
        let mut c = Raw::connect(srv.addr).unwrap();
        c.send_option(OPT_EXPORT_NAME, name).unwrap();
        let mut byte = [0; 1];
        assert!(matches!(
            std::io::Read::read(&mut c.s, &mut byte),
            Ok(0) | Err(_)
        ));
    }
    common::eventually("two protocol errors", || {
        srv.server.stats().protocol_errors == 2
    });
}
