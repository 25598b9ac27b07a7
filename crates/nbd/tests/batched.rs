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
        let Reply::Chunk {
            kind,
            cookie,
            payload,
            ..
        } = r
        else {
            panic!("a simple reply with structured replies agreed")
        };
        if cookie >= 100 {
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
