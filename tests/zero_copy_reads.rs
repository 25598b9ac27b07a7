//! READs of a file LUN on tmpfs leave from the file's pages (sendfile):
//! the data must be what was written, at every size and offset, with and
//! without data digests; and an ORDERED write after such a READ must not
//! change the READ's data before the initiator has read it.

mod common;

use std::time::Duration;

use common::iscsi::{op, rw10_cdb, Digests, LoginParams, Pdu, Session, FINAL};
use common::Daemon;

const INITIATOR: &str = "iqn.2026-11.org.test:pages";
const TARGET: &str = "iqn.2026-11.org.test:pages";
const WRITE10: u8 = 0x2a;
const READ10: u8 = 0x28;

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 11) as u8)
        .collect()
}

/// A daemon serving one file LUN on /dev/shm (tmpfs), and the directory
/// that holds the file.
fn daemon_on_tmpfs() -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir on /dev/shm");
    let config = format!(
        "[[device]]\nname = \"shm\"\nkind = \"file\"\npath = \"{}\"\nsize = \"16M\"\nblock_size = 512\n\n\
         [[target]]\nname = \"{TARGET}\"\n[[target.lun]]\nlun = 0\ndevice = \"shm\"\n",
        dir.path().join("lun.img").display()
    );
    (Daemon::start_with_config(&config), dir)
}

fn session(daemon: &Daemon, digests: Digests) -> Session {
    let mut params = LoginParams::normal(INITIATOR, TARGET);
    params.digests = digests;
    let mut s = Session::login(daemon.addr(), &params, Duration::from_secs(10)).expect("login");
    // The unit attention of a new nexus.
    let _ = s.command(0, &[0, 0, 0, 0, 0, 0], &[], 0);
    s
}

#[test]
fn reads_from_file_pages_return_what_was_written() {
    let (daemon, _dir) = daemon_on_tmpfs();
    let data = pattern(4 << 20, 5);
    let mut s = session(&daemon, Digests::default());
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        s.write10(0, 100 + (i as u32) * 2048, chunk, 512).unwrap();
    }
    // The sessions below reuse its ISID, which would end it.
    s.logout().unwrap();
    // Below, at and above the size from which pages are sent, at odd
    // offsets, up to the largest transfer.
    for (lba, blocks) in [
        (100u32, 8u16),
        (101, 64),
        (163, 65),
        (777, 2047),
        (100, 8192),
    ] {
        let start = (lba - 100) as usize * 512;
        let want = &data[start..start + blocks as usize * 512];
        // Pages with and without a header digest; copies with a data digest.
        for (header, data) in [(false, false), (true, false), (true, true)] {
            let digests = Digests { header, data };
            let mut s = session(&daemon, digests);
            let got = s.read10(0, lba, blocks, 512).unwrap();
            assert!(got == want, "LBA {lba} x {blocks} with {digests:?}");
            s.logout().unwrap();
        }
    }
}

/// Sends a READ and then an ORDERED WRITE of the same blocks without
/// reading anything, waits, and only then reads the socket: the READ's
/// data must be the old contents, so the target must not have written
/// into the pages the READ's data still sits in.
#[test]
fn an_ordered_write_waits_until_the_initiator_has_read_earlier_pages() {
    ordered_write_after_read(512);
}

/// The same with a READ short enough to be sent through the file's
/// mapping rather than with `sendfile`.
#[test]
fn an_ordered_write_waits_for_mapped_pages_too() {
    ordered_write_after_read(8);
}

fn ordered_write_after_read(read_blocks: u16) {
    let (daemon, _dir) = daemon_on_tmpfs();
    let mut s = session(&daemon, Digests::default());
    let old = pattern(usize::from(read_blocks) * 512, 1);
    let written = read_blocks.min(16);
    let new = pattern(usize::from(written) * 512, 2);
    // A first write of 64 KiB is received into the file's pages, which
    // maps the file: from then on written pages are read through it.
    s.write10(0, 0, &pattern(64 << 10, 3), 512).unwrap();
    s.write10(0, 0, &old, 512).unwrap();

    let read = s.command_pdu(0, &rw10_cdb(READ10, 0, read_blocks), 0, old.len());
    s.send(&read).unwrap();
    s.cmd_sn = s.cmd_sn.wrapping_add(1);
    let mut write = s.command_pdu(0, &rw10_cdb(WRITE10, 0, written), new.len(), 0);
    write.bhs[1] = FINAL | 0x20 | 2; // ORDERED
    write.data = new.clone();
    s.send(&write).unwrap();
    s.cmd_sn = s.cmd_sn.wrapping_add(1);
    // Room for a target that does not wait to run the write now.
    std::thread::sleep(Duration::from_millis(300));

    let mut got = vec![0u8; old.len()];
    let mut pinged = false;
    let mut write_status = None;
    while write_status.is_none() {
        let pdu: Pdu = s.recv().unwrap();
        match pdu.opcode() {
            op::DATA_IN if pdu.itt() == read.itt() => {
                let at = pdu.u32_at(40) as usize;
                got[at..at + pdu.data.len()].copy_from_slice(&pdu.data);
                if pdu.flags() & 0x01 != 0 {
                    s.exp_stat_sn = pdu.u32_at(24).wrapping_add(1);
                }
            }
            op::NOP_IN => {
                pinged = true;
                s.answer_nop_in(&pdu).unwrap();
            }
            op::SCSI_RSP if pdu.itt() == write.itt() => {
                s.exp_stat_sn = pdu.u32_at(24).wrapping_add(1);
                write_status = Some(pdu.bhs[3]);
            }
            other => panic!("unexpected PDU opcode {other:#x}"),
        }
    }
    assert_eq!(write_status, Some(0), "the ORDERED write succeeds");
    assert!(got == old, "the READ returned data written after it");
    assert!(pinged, "the write waited for a ping's answer");
    let mut after = old.clone();
    after[..new.len()].copy_from_slice(&new);
    assert!(s.read10(0, 0, read_blocks, 512).unwrap() == after);
    s.logout().unwrap();
}

/// A daemon serving two 4 MiB thin volumes (LUNs 0 and 1) of a pool on
/// /dev/shm whose one data file holds exactly 64 units of 64 KiB: once
/// LUN 0 is written whole, LUN 1 can only write into units LUN 0 gave up.
fn thin_daemon_on_tmpfs() -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir on /dev/shm");
    let config = format!(
        "[[pool]]\nname = \"p\"\ndevices = [\"{}\"]\ndevice_size = \"4160K\"\nunit_size = \"64K\"\n\n\
         [[device]]\nname = \"a\"\nkind = \"volume\"\npool = \"p\"\nsize = \"4M\"\n\n\
         [[device]]\nname = \"b\"\nkind = \"volume\"\npool = \"p\"\nsize = \"4M\"\n\n\
         [[target]]\nname = \"{TARGET}\"\n[[target.lun]]\nlun = 0\ndevice = \"a\"\n\
         [[target.lun]]\nlun = 1\ndevice = \"b\"\n",
        dir.path().join("pool.img").display()
    );
    (Daemon::start_with_config(&config), dir)
}

/// READs of a thin volume on tmpfs within one unit leave from the pool
/// file's pages: they return what was written, and a unit given up
/// (UNMAP) and then taken by another volume reads as zeros in the first.
#[test]
fn thin_volume_reads_from_pool_pages_return_what_was_written() {
    let (daemon, _dir) = thin_daemon_on_tmpfs();
    let data = pattern(4 << 20, 9);
    let mut s = session(&daemon, Digests::default());
    // The pool file's mapping is made by the first READ of a mapped unit;
    // pages written after that are read through it at once.
    s.write10(0, 0, &[1; 512], 512).unwrap();
    s.read10(0, 0, 1, 512).unwrap();
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        s.write10(0, (i as u32) * 2048, chunk, 512).unwrap();
    }
    // Within a unit (128 blocks), ending at its end, across two, and long.
    for (lba, blocks) in [
        (0u32, 8u16),
        (300, 1),
        (120, 8),
        (127, 2),
        (130, 64),
        (0, 8192),
    ] {
        let start = lba as usize * 512;
        let want = &data[start..start + blocks as usize * 512];
        assert!(
            s.read10(0, lba, blocks, 512).unwrap() == want,
            "LBA {lba} x {blocks}"
        );
    }

    // UNMAP the first unit of LUN 0 and commit it.
    let mut unmap = vec![0u8, 22, 0, 16, 0, 0, 0, 0];
    unmap.extend_from_slice(&0u64.to_be_bytes());
    unmap.extend_from_slice(&128u32.to_be_bytes());
    unmap.extend_from_slice(&[0; 4]);
    s.command_good(0, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &unmap, 0)
        .unwrap();
    s.command_good(0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0)
        .unwrap();
    // The pool's one free unit is the one LUN 0 gave up.
    let other = pattern(64 << 10, 10);
    s.write10(1, 0, &other, 512).unwrap();
    assert!(
        s.read10(0, 0, 8, 512).unwrap() == vec![0; 4096],
        "the unmapped unit"
    );
    assert!(
        s.read10(0, 128, 8, 512).unwrap() == data[65536..69632],
        "the next unit"
    );
    assert!(
        s.read10(1, 0, 8, 512).unwrap() == other[..4096],
        "LUN 1's unit"
    );
    s.logout().unwrap();
}
