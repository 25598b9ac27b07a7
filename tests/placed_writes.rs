//! WRITEs of 64 KiB and more to a file LUN on tmpfs start before their
//! data arrives, and their Data-Out goes from the socket straight into the
//! file's pages. The data must land at its offsets whatever PDUs carry
//! it; an aborted write must take no data after the abort; an ORDERED
//! task must wait for such a write like for any running task.

mod common;

use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::iscsi::{lun_field, op, rw10_cdb, LoginParams, Pdu, Session, FINAL, IMMEDIATE};
use common::Daemon;

const INITIATOR: &str = "iqn.2026-11.org.test:placed";
const TARGET: &str = "iqn.2026-11.org.test:placed";
const WRITE10: u8 = 0x2a;

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 9) as u8)
        .collect()
}

/// A daemon serving one 16 MiB file LUN on /dev/shm (tmpfs), and that file.
fn daemon_on_tmpfs() -> (Daemon, tempfile::TempDir, std::fs::File) {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir on /dev/shm");
    let path = dir.path().join("lun.img");
    let config = format!(
        "[[device]]\nname = \"shm\"\nkind = \"file\"\npath = \"{}\"\nsize = \"16M\"\nblock_size = 512\n\n\
         [[target]]\nname = \"{TARGET}\"\n[[target.lun]]\nlun = 0\ndevice = \"shm\"\n",
        path.display()
    );
    let daemon = Daemon::start_with_config(&config);
    let file = std::fs::File::open(&path).expect("the LUN's file");
    (daemon, dir, file)
}

fn session(daemon: &Daemon) -> Session {
    let params = LoginParams::normal(INITIATOR, TARGET);
    let mut s = Session::login(daemon.addr(), &params, Duration::from_secs(10)).expect("login");
    // The unit attention of a new nexus.
    let _ = s.command(0, &[0, 0, 0, 0, 0, 0], &[], 0);
    s
}

fn file_bytes(file: &std::fs::File, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    file.read_exact_at(&mut buf, offset).unwrap();
    buf
}

#[test]
fn data_lands_at_its_offsets_whatever_pdus_carry_it() {
    let (daemon, _dir, file) = daemon_on_tmpfs();
    let mut s = session(&daemon);
    let default_segment = s.target_max_recv;
    let mut lba = 3u32;
    // Segments too short to place, just long enough, and the longest; with
    // and without immediate data; below and at the size that starts early.
    for (segment, immediate, len) in [
        (512, true, 256 << 10),
        (16 << 10, true, 1 << 20),
        (20 << 10, false, 1 << 20),
        (default_segment, true, 1 << 20),
        (default_segment, false, (1 << 20) + 3 * 512),
        (default_segment, true, (64 << 10) - 512),
        (default_segment, true, 64 << 10),
    ] {
        s.target_max_recv = segment;
        s.immediate_data = immediate;
        let data = pattern(len, lba);
        s.write10(0, lba, &data, 512).unwrap();
        let at = u64::from(lba) * 512;
        assert!(
            file_bytes(&file, at, len) == data,
            "{len} bytes at LBA {lba} in {segment}-byte segments"
        );
        assert!(s.read10(0, lba, (len / 512) as u16, 512).unwrap() == data);
        lba += (len / 512) as u32 + 7;
    }
    s.logout().unwrap();
}

/// Sends a 1 MiB WRITE at LBA 0 with its immediate data and returns it
/// and the R2T that asks for the rest.
fn start_long_write(s: &mut Session, data: &[u8]) -> (Pdu, Pdu) {
    let cdb = rw10_cdb(WRITE10, 0, (data.len() / 512) as u16);
    let mut write = s.command_pdu(0, &cdb, data.len(), 0);
    assert!(s.immediate_data, "the target takes immediate data");
    write.data = data[..s.first_burst.min(s.target_max_recv)].to_vec();
    s.send(&write).unwrap();
    s.cmd_sn = s.cmd_sn.wrapping_add(1);
    let r2t = s.recv().unwrap();
    assert_eq!(r2t.opcode(), op::R2T);
    assert_eq!(r2t.itt(), write.itt());
    (write, r2t)
}

/// The Data-Out PDUs answering `r2t`, in segments the target accepts.
fn data_outs(s: &Session, r2t: &Pdu, data: &[u8]) -> Vec<Pdu> {
    let (offset, len) = (r2t.u32_at(40) as usize, r2t.u32_at(44) as usize);
    let mut pdus = Vec::new();
    let mut at = offset;
    while at < offset + len {
        let n = (offset + len - at).min(s.target_max_recv);
        let mut pdu = Pdu::new(op::DATA_OUT);
        if at + n == offset + len {
            pdu.bhs[1] = FINAL;
        }
        pdu.bhs[8..16].copy_from_slice(&lun_field(0));
        pdu.set_u32(16, r2t.itt());
        pdu.set_u32(20, r2t.u32_at(20));
        pdu.set_u32(28, s.exp_stat_sn);
        pdu.set_u32(36, pdus.len() as u32);
        pdu.set_u32(40, at as u32);
        pdu.data = data[at..at + n].to_vec();
        pdus.push(pdu);
        at += n;
    }
    pdus
}

/// Sends an immediate task management request of `function` for LUN 0
/// and checks that it completes.
fn task_management(s: &mut Session, function: u8, referenced_itt: u32, ref_cmd_sn: u32) {
    let mut pdu = Pdu::new(op::TASK_MGMT | IMMEDIATE);
    pdu.bhs[1] = FINAL | function;
    pdu.bhs[8..16].copy_from_slice(&lun_field(0));
    pdu.set_u32(16, 0x7000_0000 | u32::from(function));
    pdu.set_u32(20, referenced_itt);
    pdu.set_u32(24, s.cmd_sn);
    pdu.set_u32(28, s.exp_stat_sn);
    pdu.set_u32(32, ref_cmd_sn);
    s.send(&pdu).unwrap();
    let answer = s.recv().unwrap();
    assert_eq!(answer.opcode(), 0x22, "a task management response");
    assert_eq!(answer.bhs[2], 0, "function complete");
    s.exp_stat_sn = answer.u32_at(24).wrapping_add(1);
}

#[test]
fn an_aborted_write_takes_no_data_after_the_abort() {
    let (daemon, _dir, file) = daemon_on_tmpfs();
    let mut s = session(&daemon);
    // Segments short enough that the R2T takes several.
    s.target_max_recv = 64 << 10;
    let old = pattern(1 << 20, 1);
    s.write10(0, 0, &old, 512).unwrap();
    let new = pattern(1 << 20, 2);
    let (write, r2t) = start_long_write(&mut s, &new);
    let outs = data_outs(&s, &r2t, &new);
    assert!(outs.len() > 1, "the R2T takes several segments");
    s.send(&outs[0]).unwrap();

    // ABORT TASK
    task_management(&mut s, 1, write.itt(), write.u32_at(24));

    // The rest of its data comes anyway; it belongs to no task now.
    for pdu in &outs[1..] {
        s.send(pdu).unwrap();
    }
    let placed_until = r2t.u32_at(40) as usize + outs[0].data.len();
    let after = s.read10(0, 0, 2048, 512).unwrap();
    assert!(
        after[..placed_until] == new[..placed_until],
        "data that came before the abort went in"
    );
    assert!(
        after[placed_until..] == old[placed_until..],
        "no data went in after the abort"
    );
    assert!(file_bytes(&file, 0, 1 << 20) == after);
    s.logout().unwrap();
}

#[test]
fn an_ordered_task_waits_for_a_write_still_receiving() {
    let (daemon, _dir, _file) = daemon_on_tmpfs();
    let mut s = session(&daemon);
    let first = pattern(1 << 20, 3);
    let (write, r2t) = start_long_write(&mut s, &first);

    let second = pattern(4096, 4);
    let mut ordered = s.command_pdu(0, &rw10_cdb(WRITE10, 0, 8), second.len(), 0);
    ordered.bhs[1] = FINAL | 0x20 | 2; // W, ORDERED
    ordered.data = second.clone();
    s.send(&ordered).unwrap();
    s.cmd_sn = s.cmd_sn.wrapping_add(1);
    // Room for a target that does not make it wait to answer it now.
    s.stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    match s.recv() {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("the ORDERED write answered before the write ahead: {other:?}"),
    }
    s.stream.set_read_timeout(None).unwrap();

    for pdu in data_outs(&s, &r2t, &first) {
        s.send(&pdu).unwrap();
    }
    let mut order = Vec::new();
    while order.len() < 2 {
        let pdu = s.recv().unwrap();
        match pdu.opcode() {
            op::SCSI_RSP => {
                assert_eq!(pdu.bhs[3], 0, "status of ITT {:#x}", pdu.itt());
                s.exp_stat_sn = pdu.u32_at(24).wrapping_add(1);
                order.push(pdu.itt());
            }
            op::R2T => {
                for out in data_outs(&s, &pdu, &first) {
                    s.send(&out).unwrap();
                }
            }
            op::NOP_IN => s.answer_nop_in(&pdu).unwrap(),
            other => panic!("unexpected PDU opcode {other:#x}"),
        }
    }
    assert_eq!(order, [write.itt(), ordered.itt()]);
    let mut expected = first;
    expected[..second.len()].copy_from_slice(&second);
    assert!(s.read10(0, 0, 2048, 512).unwrap() == expected);
    s.logout().unwrap();
}

#[test]
fn a_reset_from_another_session_stops_a_segment_half_received() {
    let (daemon, _dir, file) = daemon_on_tmpfs();
    let mut a = session(&daemon);
    a.target_max_recv = 256 << 10;
    let old = pattern(1 << 20, 5);
    a.write10(0, 0, &old, 512).unwrap();
    let new = pattern(1 << 20, 6);
    let (_write, r2t) = start_long_write(&mut a, &new);
    let first = &data_outs(&a, &r2t, &new)[0];
    let wire = first.encode(a.digests);
    let half = wire.len() - first.data.len() / 2;
    a.stream.write_all(&wire[..half]).unwrap();
    // Room for the target to take the header and start placing the data.
    std::thread::sleep(Duration::from_millis(200));

    let b = reset_from_second_session(&daemon);

    // The rest of the segment arrives after the reset ended the write.
    a.stream.write_all(&wire[half..]).unwrap();
    let stopped_at = r2t.u32_at(40) as usize + first.data.len() / 2;
    // Each nexus has a unit attention from the reset to take first.
    let _ = a.command(0, &[0, 0, 0, 0, 0, 0], &[], 0);
    untouched_from(a, b, &file, &old, stopped_at);
}

/// Logs in a second session (another ISID) and resets LUN 0 from it.
fn reset_from_second_session(daemon: &Daemon) -> Session {
    let mut params = LoginParams::normal(INITIATOR, TARGET);
    params.isid[5] ^= 1;
    let mut b = Session::login(daemon.addr(), &params, Duration::from_secs(10)).expect("login");
    let cmd_sn = b.cmd_sn;
    task_management(&mut b, 5, 0xffff_ffff, cmd_sn); // LOGICAL UNIT RESET
    b
}

/// Checks through `a` that the first MiB still holds `old` from
/// `stopped_at` on, and that the file holds what `a` reads; then ends both
/// sessions (`b` after taking its unit attention).
fn untouched_from(
    mut a: Session,
    mut b: Session,
    file: &std::fs::File,
    old: &[u8],
    stopped_at: usize,
) {
    let _ = b.command(0, &[0, 0, 0, 0, 0, 0], &[], 0);
    let after = a.read10(0, 0, 2048, 512).unwrap();
    assert!(
        after[stopped_at..] == old[stopped_at..],
        "no data went in after the reset"
    );
    assert!(file_bytes(file, 0, 1 << 20) == after);
    a.logout().unwrap();
    b.logout().unwrap();
}

#[test]
fn a_reset_while_a_commands_immediate_data_arrives_drops_the_command() {
    let (daemon, _dir, file) = daemon_on_tmpfs();
    let mut a = session(&daemon);
    let old = pattern(1 << 20, 7);
    a.write10(0, 0, &old, 512).unwrap();
    let new = pattern(1 << 20, 8);
    let mut write = a.command_pdu(0, &rw10_cdb(WRITE10, 0, 2048), new.len(), 0);
    let immediate = a.first_burst.min(a.target_max_recv);
    assert!(immediate >= 64 << 10, "immediate data long enough to place");
    write.data = new[..immediate].to_vec();
    let wire = write.encode(a.digests);
    let half = wire.len() - immediate / 2;
    a.stream.write_all(&wire[..half]).unwrap();
    a.cmd_sn = a.cmd_sn.wrapping_add(1);
    // Room for the target to take the header and start placing the data.
    std::thread::sleep(Duration::from_millis(200));

    let b = reset_from_second_session(&daemon);

    a.stream.write_all(&wire[half..]).unwrap();
    // The write is dropped unanswered; its CmdSN counts as received, so
    // the next command runs (and reports the reset).
    a.stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let tur = a.command(0, &[0, 0, 0, 0, 0, 0], &[], 0).unwrap();
    assert_eq!(tur.status, 2, "the reset's unit attention");
    untouched_from(a, b, &file, &old, immediate / 2);
}
