//! Write data lands at its offsets whatever PDUs carry it: immediate data
//! followed by hundreds of tiny solicited Data-Out PDUs, and a large write
//! in the segments the target advertises. Each is read back through a
//! second command on the real daemon.

mod common;

use std::time::Duration;

use common::iscsi::{LoginParams, Session};
use common::Daemon;

const INITIATOR: &str = "iqn.2026-11.org.test:writer";

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

fn session(daemon: &Daemon) -> Session {
    Session::login(
        daemon.addr(),
        &LoginParams::normal(INITIATOR, &daemon.first_target()),
        Duration::from_secs(10),
    )
    .expect("login")
}

#[test]
fn tiny_data_out_segments_are_placed_at_their_offsets() {
    let daemon = Daemon::start();
    let mut s = session(&daemon);
    // 512-byte PDUs: 512 segments for one 256 KiB write, more than the
    // target keeps apart before copying them together.
    s.target_max_recv = 512;
    for (lba, seed) in [(0u32, 1u32), (1000, 2)] {
        let data = pattern(256 << 10, seed);
        s.write10(0, lba, &data, 512).unwrap();
        assert_eq!(s.read10(0, lba, 512, 512).unwrap(), data, "LBA {lba}");
    }
    s.logout().unwrap();
}

#[test]
fn a_large_write_in_full_segments_reads_back() {
    let daemon = Daemon::start();
    let mut s = session(&daemon);
    let data = pattern(1 << 20, 3);
    s.write10(0, 64, &data, 512).unwrap();
    // Read back in one long READ (the path that leaves the connection's
    // thread) and in short ones.
    assert_eq!(s.read10(0, 64, 2048, 512).unwrap(), data);
    for (i, chunk) in data.chunks(64 << 10).enumerate() {
        let lba = 64 + (i as u32) * 128;
        assert_eq!(s.read10(0, lba, 128, 512).unwrap(), chunk, "LBA {lba}");
    }
    s.logout().unwrap();
}
