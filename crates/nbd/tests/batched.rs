//! Many requests sent at once to a device that never blocks (a file on
//! tmpfs): each is answered with its own data, whether its reply comes
//! from the file's pages (written ranges) or from a read (holes), in
//! every reply framing, with requests split across socket reads.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use block::{BlockDevice, FileDevice, FileOptions};
use common::raw::{Raw, Reply};
use common::{export, random_bytes, Running};
use nbd::proto::*;

const MIB: u64 = 1 << 20;

/// A 16 MiB file on tmpfs whose first 8 MiB hold `data`; the rest is a hole.
fn tmpfs_device() -> (tempfile::TempDir, Arc<FileDevice>, Vec<u8>) {
    let dir = tempfile::tempdir_in("/dev/shm").expect("/dev/shm is tmpfs");
    let opts = FileOptions {
        create_size: Some(16 * MIB),
        ..FileOptions::default()
    };
    let dev = Arc::new(FileDevice::open(&dir.path().join("d.img"), opts).unwrap());
    assert!(!dev.capabilities().may_block && dev.memory_file().is_some());
    let data = random_bytes(8 * MIB as usize, 21);
    dev.write_at(&data, 0, false).unwrap();
    (dir, dev, data)
}

/// The bytes of one request.
fn request(
    extended: bool,
    kind: u16,
    cookie: u64,
    offset: u64,
    len: u64,
    payload: &[u8],
) -> Vec<u8> {
    let mut b = Vec::new();
    let (magic, flags) = match extended {
        true if !payload.is_empty() => (EXTENDED_REQUEST_MAGIC, CMD_FLAG_PAYLOAD_LEN),
        true => (EXTENDED_REQUEST_MAGIC, 0),
        false => (REQUEST_MAGIC, 0),
    };
    b.extend_from_slice(&magic.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    if extended {
        b.extend_from_slice(&len.to_be_bytes());
    } else {
        b.extend_from_slice(&(len as u32).to_be_bytes());
    }
    b.extend_from_slice(payload);
    b
}

/// Sends a batch of reads over data and holes, a large write and a flush
/// in two socket writes (the cut falls inside a request), and checks
/// every reply.
fn batch_of_requests(c: &mut Raw, data: &[u8]) {
    let ext = c.extended;
    let written = random_bytes(2 * MIB as usize, 22);
    // cookie -> (offset, expected bytes) of each read.
    let mut reads: HashMap<u64, (u64, Vec<u8>)> = HashMap::new();
    let mut bytes = Vec::new();
    for i in 0..48u64 {
        let (offset, len) = match i % 4 {
            0 => ((i * 37 % 2000) * 4096, 4096),
            1 => (12 * MIB + i * 4096, 4096), // in the hole
            2 => ((i % 6) * MIB, MIB),
            _ => (8 * MIB - 2048, 4096), // half data, half hole
        };
        let mut expected = vec![0; len as usize];
        let end = (offset + len).min(8 * MIB);
        if offset < end {
            expected[..(end - offset) as usize]
                .copy_from_slice(&data[offset as usize..end as usize]);
        }
        reads.insert(i, (offset, expected));
        bytes.extend(request(ext, CMD_READ, i, offset, len, &[]));
    }
    bytes.extend(request(ext, CMD_WRITE, 100, 10 * MIB, 2 * MIB, &written));
    bytes.extend(request(ext, CMD_FLUSH, 101, 0, 0, &[]));
    let cut = bytes.len() - 1000;
    c.s.write_all(&bytes[..cut]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    c.s.write_all(&bytes[cut..]).unwrap();
    let total = reads.len() + 2;
    let mut answered = 0;
    while answered < total {
        let r = c.reply(0).unwrap();
        assert!(r.done(), "one chunk per reply here");
        assert_eq!(r.error(), 0, "{r:?}");
        answered += 1;
        // A write's success is a simple reply, which structured replies
        // allow for any request but a READ; extended headers allow none.
        if let Reply::Simple { cookie, .. } = r {
            assert!(!ext && cookie >= 100, "a simple reply to {cookie}");
            continue;
        }
        let Reply::Chunk {
            kind,
            cookie,
            payload,
            ..
        } = r
        else {
            unreachable!()
        };
        if cookie >= 100 {
            assert!(ext, "write {cookie} answered with a chunk");
            assert_eq!(kind, REPLY_TYPE_NONE);
            continue;
        }
        let (offset, expected) = reads.remove(&cookie).expect("one reply per read");
        assert_eq!(kind, REPLY_TYPE_OFFSET_DATA);
        assert_eq!(u64::from_be_bytes(payload[..8].try_into().unwrap()), offset);
        assert!(payload[8..] == expected[..], "read {cookie} at {offset}");
    }
    assert!(reads.is_empty());
    assert_eq!(c.read(200, 10 * MIB, 2 * MIB as usize).unwrap(), written);
}

#[test]
fn a_batch_of_requests_to_a_tmpfs_file_gets_each_its_own_reply() {
    let (_dir, dev, data) = tmpfs_device();
    let srv = Running::start(vec![("t", export(dev))]);
    for extended in [false, true] {
        let mut c = Raw::connect(srv.addr).unwrap();
        c.go("t", true, extended, false).unwrap();
        batch_of_requests(&mut c, &data);
    }
    // Simple replies carry the data as it is, holes as zeros.
    let mut c = Raw::connect(srv.addr).unwrap();
    c.go("t", false, false, false).unwrap();
    assert_eq!(c.read(1, 4096, 8192).unwrap(), data[4096..12288]);
    let mut across = data[8 * MIB as usize - 100..].to_vec();
    across.extend([0; 100]);
    assert_eq!(c.read(2, 8 * MIB - 100, 200).unwrap(), across);
    // A disconnect has no reply: the server closes.
    c.request(CMD_DISC, 0, 3, 0, 0, &[]);
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut c.s, &mut rest).unwrap();
    assert!(rest.is_empty());
}

/// The file's bytes at `offset`, read past the server.
fn file_bytes(dev: &FileDevice, offset: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0; len];
    dev.read_at(&mut b, offset).unwrap();
    b
}

#[test]
fn large_writes_go_into_the_file_as_their_payload_arrives() {
    let (_dir, dev, data) = tmpfs_device();
    let srv = Running::start(vec![("t", export(dev.clone()))]);
    for extended in [false, true] {
        let mut c = Raw::connect(srv.addr).unwrap();
        c.go("t", true, extended, false).unwrap();
        // A 2 MiB write over data and into the hole, its header first and
        // then its payload in two halves: the first half is in the file
        // before the second is sent, and the reply waits for all of it.
        let seed = if extended { 31 } else { 32 };
        let written = random_bytes(2 * MIB as usize, seed);
        let at = 7 * MIB + 4096;
        let mut bytes = request(extended, CMD_WRITE, 1, at, 2 * MIB, &written);
        let header = bytes.len() - written.len();
        let half = header + MIB as usize;
        c.s.write_all(&bytes[..header]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        c.s.write_all(&bytes[header..half]).unwrap();
        common::eventually("the first half in the file", || {
            file_bytes(&dev, at, MIB as usize) == written[..MIB as usize]
        });
        c.s.set_nonblocking(true).unwrap();
        let mut early = [0; 1];
        assert!(
            std::io::Read::read(&mut c.s, &mut early).is_err(),
            "no reply before the whole payload"
        );
        c.s.set_nonblocking(false).unwrap();
        c.s.write_all(&bytes[half..]).unwrap();
        let r = c.reply(0).unwrap();
        assert_eq!((r.cookie(), r.error()), (1, 0));
        assert_eq!(file_bytes(&dev, at, written.len()), written);
        assert_eq!(
            file_bytes(&dev, at - 4096, 4096),
            data[(at - 4096) as usize..at as usize],
            "the bytes before are untouched"
        );

        // Large writes back to back with FUA, a refused one (past the
        // end) and a read, sent at once: each answered, in order of the
        // bytes they leave.
        bytes.clear();
        let mut expected = Vec::new();
        for i in 0..4u64 {
            let payload = random_bytes(MIB as usize + 512, seed * 10 + i);
            let offset = i * (MIB + 512);
            let mut req = request(
                extended,
                CMD_WRITE,
                10 + i,
                offset,
                payload.len() as u64,
                &payload,
            );
            if i == 1 {
                req[5] |= CMD_FLAG_FUA as u8; // the low byte of the flags
            }
            bytes.extend(req);
            expected.push((offset, payload));
        }
        let beyond = random_bytes(128 << 10, 9);
        bytes.extend(request(
            extended,
            CMD_WRITE,
            20,
            16 * MIB - 4096,
            beyond.len() as u64,
            &beyond,
        ));
        bytes.extend(request(extended, CMD_READ, 21, MIB + 512, 4096, &[]));
        c.s.write_all(&bytes).unwrap();
        for cookie in 10..14 {
            let r = c.reply(0).unwrap();
            assert_eq!((r.cookie(), r.error()), (cookie, 0));
        }
        let r = c.reply(0).unwrap();
        assert_eq!((r.cookie(), r.error()), (20, EINVAL));
        let mut all = c.whole_reply();
        let Some(Reply::Chunk {
            cookie: 21,
            payload,
            ..
        }) = all.pop()
        else {
            panic!("the read's reply")
        };
        assert_eq!(payload[8..], expected[1].1[..4096]);
        for (offset, payload) in &expected {
            assert_eq!(&file_bytes(&dev, *offset, payload.len()), payload);
        }
    }
}

#[test]
fn large_writes_over_a_unix_socket_land_in_the_file() {
    let (_dir, dev, data) = tmpfs_device();
    let srv = Running::start(vec![("t", export(dev.clone()))]);
    let sockets = tempfile::tempdir().unwrap();
    let path = sockets.path().join("nbd.sock");
    let addr = nbd::parse_listen(&format!("unix:{}", path.display())).unwrap();
    let _serving = srv.runtime().block_on(srv.server.listen(&addr)).unwrap();
    let uri = format!("nbd+unix:///t?socket={}", path.display());
    // 4 MiB writes cross many socket reads: received into the pages.
    let out = common::run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x5a 1M 4M",
            "-c",
            "write -P 0xa5 10M 4M",
            "-c",
            "read -P 0x5a 1M 4M",
            "-c",
            "read -P 0xa5 10M 4M",
            &uri,
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("fail"), "qemu-io: {text}");
    assert_eq!(text.matches("read 4194304/4194304").count(), 2, "{text}");
    assert!(file_bytes(&dev, MIB, 4 * MIB as usize)
        .iter()
        .all(|&b| b == 0x5a));
    assert!(file_bytes(&dev, 10 * MIB, 4 * MIB as usize)
        .iter()
        .all(|&b| b == 0xa5));
    assert_eq!(file_bytes(&dev, 0, MIB as usize), data[..MIB as usize]);
    assert_eq!(
        file_bytes(&dev, 5 * MIB, 3 * MIB as usize),
        data[5 * MIB as usize..]
    );
}

#[test]
fn a_large_write_behind_replies_that_back_up_is_answered_after_them() {
    let (_dir, dev, data) = tmpfs_device();
    let srv = Running::start(vec![("t", export(dev.clone()))]);
    let mut c = Raw::connect(srv.addr).unwrap();
    c.go("t", true, false, false).unwrap();
    // 24 MiB of reads whose replies the client does not take yet, then a
    // large write: taken once the replies drain, received in place, and
    // answered after them.
    let mut bytes = Vec::new();
    for i in 0..24u64 {
        bytes.extend(request(false, CMD_READ, i, (i % 8) * MIB, MIB, &[]));
    }
    let written = random_bytes(2 * MIB as usize, 41);
    bytes.extend(request(false, CMD_WRITE, 100, 12 * MIB, 2 * MIB, &written));
    c.s.write_all(&bytes).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    for i in 0..24u64 {
        let Reply::Chunk {
            cookie, payload, ..
        } = c.reply(0).unwrap()
        else {
            panic!("a structured reply")
        };
        assert_eq!(cookie, i);
        let at = ((i % 8) * MIB) as usize;
        assert!(payload[8..] == data[at..at + MIB as usize], "read {i}");
    }
    let r = c.reply(0).unwrap();
    assert_eq!((r.cookie(), r.error()), (100, 0));
    assert_eq!(file_bytes(&dev, 12 * MIB, written.len()), written);
}

/// A connection alone on its runtime's thread waits for each request in
/// a blocking receive: it answers every request, through pauses longer
/// than one such wait, and it still ends soon when the server shuts down
/// while its client keeps sending (the runtime gets its thread back).
#[test]
fn a_connection_alone_on_its_runtime_answers_each_request_and_ends_on_shutdown() {
    use std::time::{Duration, Instant};
    let (_dir, dev, data) = tmpfs_device();
    let srv = Running::start(vec![("t", export(dev))]);
    let thread = OneThread::serving(&srv);
    let mut c = Raw::connect(srv.addr).unwrap();
    c.go("t", false, false, false).unwrap();
    for i in 0..2000u64 {
        let offset = (i * 7919 % 2048) * 4096;
        let expected = &data[offset as usize..offset as usize + 4096];
        assert!(c.read(i, offset, 4096).unwrap() == expected, "read {i}");
        if i % 500 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let fresh = random_bytes(4096, 23);
    c.request(CMD_WRITE, 0, 5000, 4096, 4096, &fresh);
    assert_eq!(c.reply(0).unwrap().error(), 0);
    assert_eq!(c.read(5001, 4096, 4096).unwrap(), fresh);
    let hammer = std::thread::spawn(move || {
        let mut served = 0u64;
        loop {
            let read = request(false, CMD_READ, served, 0, 4096, &[]);
            if c.s.write_all(&read).is_err() {
                return served;
            }
            match c.reply(4096) {
                Ok(r) if r.error() == 0 => served += 1,
                _ => return served,
            }
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let asked = Instant::now();
    srv.server.shutdown();
    let served = hammer.join().unwrap();
    let took = asked.elapsed();
    assert!(served > 100, "{served} reads before the shutdown");
    assert!(
        took < Duration::from_millis(200),
        "the connection ended {took:?} after"
    );
    thread.stop();
}

/// A runtime of its own thread for the server's connections, as the
/// daemon gives one per core.
struct OneThread {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl OneThread {
    fn serving(srv: &Running) -> OneThread {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        srv.server
            .set_connection_runtimes(vec![runtime.handle().clone()]);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async {
                let _ = stopped.await;
            });
        });
        OneThread { stop, thread }
    }

    fn stop(self) {
        let _ = self.stop.send(());
        self.thread.join().unwrap();
    }
}

/// A client that sends one request at a time, alone on its thread: its
/// small writes, received one header at a time with the payload straight
/// into the file's pages, land where they belong, with FUA, with the
/// payload sent after a pause, and when the client turns to sending many
/// requests at once.
#[test]
fn one_request_at_a_time_small_writes_land_in_the_file() {
    use std::time::Duration;
    let (_dir, dev, data) = tmpfs_device();
    let srv = Running::start(vec![("t", export(dev.clone()))]);
    let thread = OneThread::serving(&srv);
    let mut c = Raw::connect(srv.addr).unwrap();
    c.go("t", false, false, false).unwrap();
    // (Header and payload are sent apart: without this, the payload
    // would wait for the header's acknowledgement.)
    c.s.set_nodelay(true).unwrap();
    let mut model = data;
    model.resize(16 * MIB as usize, 0);
    let write = |c: &mut Raw, model: &mut Vec<u8>, i: u64, pause: bool| {
        let len = [4096, 8192, 512, 12288][i as usize % 4];
        // Over the data and the hole.
        let offset = (i * 7919 % 4000) * 4096;
        let payload = random_bytes(len, 1000 + i);
        let mut req = request(false, CMD_WRITE, i, offset, len as u64, &payload);
        if i % 100 == 7 {
            req[5] |= CMD_FLAG_FUA as u8;
        }
        let header = req.len() - len;
        c.s.write_all(&req[..header]).unwrap();
        if pause {
            std::thread::sleep(Duration::from_millis(3));
        }
        c.s.write_all(&req[header..]).unwrap();
        model[offset as usize..offset as usize + len].copy_from_slice(&payload);
        (offset, len)
    };
    for i in 0..3000u64 {
        let (offset, len) = write(&mut c, &mut model, i, i % 250 == 13);
        let r = c.reply(0).unwrap();
        assert_eq!((r.cookie(), r.error()), (i, 0));
        if i % 10 == 0 {
            let back = c.read(100_000 + i, offset, len).unwrap();
            assert!(back == model[offset as usize..][..len], "write {i}");
        }
    }
    // Many at once, after a long run of one at a time.
    for i in 3000..3064u64 {
        write(&mut c, &mut model, i, false);
    }
    for i in 3000..3064u64 {
        let r = c.reply(0).unwrap();
        assert_eq!((r.cookie(), r.error()), (i, 0));
    }
    assert!(
        file_bytes(&dev, 0, model.len()) == model,
        "the file holds every write"
    );
    thread.stop();
}
