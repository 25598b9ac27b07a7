//! End-to-end sessions against the server over loopback TCP.

mod support;

use std::time::Duration;

use bytes::Bytes;
use iscsi::pdu::{Bhs, Opcode, Pdu};
use iscsi::ServerOptions;
use support::*;

fn options() -> ServerOptions {
    ServerOptions {
        nop_interval: None,
        ..Default::default()
    }
}

#[tokio::test]
async fn login_read_write_logout() {
    for blocking in [false, true] {
        let ram = RamTarget::new(4096, blocking);
        let (_server, addr) = start(options(), ram.clone()).await;
        let mut c = Client::connect(addr).await;
        let keys = c
            .login_normal("MaxRecvDataSegmentLength=8192;InitialR2T=No;ImmediateData=Yes;FirstBurstLength=65536;MaxBurstLength=131072;MaxOutstandingR2T=2")
            .await;
        assert_eq!(key(&keys, "MaxRecvDataSegmentLength"), Some("262144"));
        assert_eq!(key(&keys, "TargetPortalGroupTag"), Some("1"));
        assert_eq!(key(&keys, "TargetAlias"), Some("test disk"));
        assert_eq!(key(&keys, "MaxOutstandingR2T"), Some("2"));

        // TEST UNIT READY.
        let cmd = c.command(&[0; 6], 0, false, false, true, &[]);
        c.send(&cmd).await;
        let r = c.recv().await;
        assert_eq!(r.bhs.opcode(), Some(Opcode::ScsiResponse));
        assert_eq!(r.bhs.byte(3), 0);

        // 1 MiB write: 8 KiB immediate, unsolicited up to 64 KiB, rest by R2T.
        let payload = pattern(1 << 20, 7);
        let r = c
            .write(&write10(8, 2048), &payload, 8192, 65536 - 8192, 8192)
            .await;
        assert_eq!((r.bhs.byte(2), r.bhs.byte(3)), (0, 0));
        assert_eq!(r.bhs.flags() & 0x06, 0, "no residual");
        assert_eq!(
            &ram.data.lock()[8 * BLOCK..8 * BLOCK + payload.len()],
            &payload[..]
        );

        // Read it back: Data-In segmented by our 8 KiB MaxRecvDataSegmentLength.
        let cmd = c.command(&read10(8, 2048), 1 << 20, true, false, true, &[]);
        let itt = cmd.bhs.itt();
        c.send(&cmd).await;
        let (data, last) = c.collect_read(itt).await;
        assert_eq!(data, payload);
        assert_eq!(
            last.bhs.opcode(),
            Some(Opcode::DataIn),
            "status collapsed into the last Data-In"
        );
        assert_eq!(last.bhs.u32_at(36), 127, "DataSN of the 128th PDU");

        let r = c.logout().await;
        assert_eq!(r.bhs.opcode(), Some(Opcode::LogoutResponse));
        assert_eq!(r.bhs.byte(2), 0);
        // The nexus is gone (its reservations released) before the
        // initiator reads the Logout Response.
        let ev = ram.events();
        assert!(ev.iter().any(|e| e.starts_with("lost ")), "{ev:?}");
        assert!(c.closed_within(Duration::from_secs(5)).await);
        assert!(
            ev[0].starts_with("added iqn.2024-01.test:client,i,0x801234560001"),
            "{ev:?}"
        );
        assert!(ev.iter().any(|e| e.starts_with("lost ")), "{ev:?}");
    }
}

#[tokio::test]
async fn write_with_initial_r2t_and_small_segments() {
    let ram = RamTarget::new(1024, false);
    let (_server, addr) = start(options(), ram.clone()).await;
    let mut c = Client::connect(addr).await;
    let keys = c
        .login_normal("InitialR2T=Yes;ImmediateData=No;MaxBurstLength=4096")
        .await;
    assert_eq!(key(&keys, "InitialR2T"), Some("Yes"));
    assert_eq!(key(&keys, "ImmediateData"), Some("No"));
    let payload = pattern(20 * BLOCK, 3);
    let r = c.write(&write10(0, 20), &payload, 0, 0, BLOCK).await;
    assert_eq!(r.bhs.byte(3), 0);
    assert_eq!(
        r.bhs.u32_at(36),
        3,
        "ExpDataSN counts the R2Ts (4096+4096+2048)"
    );
    assert_eq!(&ram.data.lock()[..payload.len()], &payload[..]);
}

#[tokio::test]
async fn residuals() {
    let ram = RamTarget::new(64, false);
    let (_server, addr) = start(options(), ram).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;

    // READ10 of one block, EDTL 10000: underflow.
    let cmd = c.command(&read10(0, 1), 10000, true, false, true, &[]);
    let itt = cmd.bhs.itt();
    c.send(&cmd).await;
    let (data, st) = c.collect_read(itt).await;
    assert_eq!(data.len(), BLOCK);
    assert_eq!(st.bhs.flags() & 0x06, 0x02);
    assert_eq!(st.bhs.u32_at(44), 10000 - BLOCK as u32);

    // READ10 of one block, EDTL 0: overflow, no data.
    let cmd = c.command(&read10(0, 1), 0, true, false, true, &[]);
    let itt = cmd.bhs.itt();
    c.send(&cmd).await;
    let (data, st) = c.collect_read(itt).await;
    assert!(data.is_empty());
    assert_eq!(st.bhs.opcode(), Some(Opcode::ScsiResponse));
    assert_eq!(st.bhs.flags() & 0x06, 0x04);
    assert_eq!(st.bhs.u32_at(44), BLOCK as u32);

    // WRITE10 of one block with EDTL 10000: underflow.
    let payload = pattern(10000, 1);
    let r = c.write(&write10(0, 1), &payload, 8192, 0, 8192).await;
    assert_eq!(
        (r.bhs.byte(3), r.bhs.flags() & 0x06, r.bhs.u32_at(44)),
        (0, 0x02, 10000 - BLOCK as u32)
    );

    // WRITE10 of one block with EDTL 200: overflow.
    let r = c.write(&write10(0, 1), &payload[..200], 200, 0, 8192).await;
    assert_eq!(
        (r.bhs.flags() & 0x06, r.bhs.u32_at(44)),
        (0x04, BLOCK as u32 - 200)
    );
}

#[tokio::test]
async fn sense_goes_in_a_scsi_response() {
    let ram = RamTarget::new(8, false);
    let (_server, addr) = start(options(), ram).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    let cmd = c.command(&read10(100, 1), 512, true, false, true, &[]);
    c.send(&cmd).await;
    let r = c.recv().await;
    assert_eq!(r.bhs.opcode(), Some(Opcode::ScsiResponse));
    assert_eq!(r.bhs.byte(3), 0x02);
    assert_eq!(&r.data[..2], &[0, 18]);
    assert_eq!(r.data[2 + 2], 0x05, "sense key");
}

#[tokio::test]
async fn discovery_send_targets() {
    let ram = RamTarget::new(8, false);
    let mut targets = Vec::new();
    for i in 0..40 {
        let mut t = target(
            &format!("iqn.2024-01.org.openarray:disk{i:02}"),
            ram.clone(),
        );
        t.portals = vec![
            "10.0.0.1:3260".parse().unwrap(),
            "[2001:db8::1]:3260".parse().unwrap(),
        ];
        t.portal_group = 3;
        targets.push(t);
    }
    let (_server, addr) = start_with(options(), targets).await;
    let mut c = Client::connect(addr).await;
    // Security stage first, then operational; ask for tiny Text PDUs.
    let p = c.login_pdu(
        0,
        1,
        true,
        "InitiatorName=iqn.2024-01.test:client;SessionType=Discovery;AuthMethod=None",
    );
    c.send(&p).await;
    let r = c.recv().await;
    assert_eq!(r.bhs.byte(36), 0);
    assert_eq!(key(&kv(&r.data), "AuthMethod"), Some("None"));
    assert_eq!(
        key(&kv(&r.data), "TargetPortalGroupTag"),
        None,
        "not for discovery"
    );
    let r = c
        .login("MaxRecvDataSegmentLength=512;MaxBurstLength=4096")
        .await;
    assert_eq!(r.bhs.byte(36), 0);
    assert_eq!(key(&kv(&r.data), "MaxBurstLength"), Some("Irrelevant"));

    let mut b = Bhs::new(Opcode::TextRequest, 0x80);
    b.set_immediate(true);
    b.set_itt(77);
    b.set_u32(20, 0xffff_ffff);
    b.set_u32(24, c.cmdsn);
    c.send(&Pdu::new(b, Bytes::from_static(b"SendTargets=All\0")))
        .await;
    let mut text = Vec::new();
    let mut pdus = 0;
    loop {
        let r = c.recv().await;
        assert_eq!(r.bhs.opcode(), Some(Opcode::TextResponse));
        assert!(r.data.len() <= 512);
        pdus += 1;
        text.extend_from_slice(&r.data);
        let ttt = r.bhs.u32_at(20);
        if r.bhs.flags() & 0x80 != 0 {
            assert_eq!(ttt, 0xffff_ffff);
            break;
        }
        assert_eq!(r.bhs.flags() & 0x40, 0x40, "C bit while more follows");
        let mut b = Bhs::new(Opcode::TextRequest, 0x80);
        b.set_immediate(true);
        b.set_itt(77);
        b.set_u32(20, ttt);
        b.set_u32(24, c.cmdsn);
        c.send(&Pdu::new(b, Bytes::new())).await;
    }
    assert!(pdus > 5);
    let pairs = kv(&text);
    assert_eq!(pairs.iter().filter(|(k, _)| k == "TargetName").count(), 40);
    assert!(pairs.contains(&("TargetAddress".into(), "10.0.0.1:3260,3".into())));
    assert!(pairs.contains(&("TargetAddress".into(), "[2001:db8::1]:3260,3".into())));

    // SCSI commands are not for discovery sessions.
    let cmd = c.command(&[0; 6], 0, false, false, true, &[]);
    c.send(&cmd).await;
    let r = c.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.byte(2)),
        (Some(Opcode::Reject), 0x04)
    );
    let r = c.logout().await;
    assert_eq!(r.bhs.opcode(), Some(Opcode::LogoutResponse));
}

#[tokio::test]
async fn login_refusals() {
    let ram = RamTarget::new(8, false);
    let (_server, addr) = start(options(), ram).await;
    let mut c = Client::connect(addr).await;
    let r = c.login("InitiatorName=iqn.x;TargetName=iqn.nope").await;
    assert_eq!((r.bhs.byte(36), r.bhs.byte(37)), (2, 3));
    assert!(c.closed_within(Duration::from_secs(5)).await);

    let mut c = Client::connect(addr).await;
    let r = c.login(&format!("TargetName={TARGET}")).await;
    assert_eq!((r.bhs.byte(36), r.bhs.byte(37)), (2, 7));

    let mut c = Client::connect(addr).await;
    let mut p = c.login_pdu(
        1,
        3,
        true,
        &format!("InitiatorName=iqn.x;TargetName={TARGET}"),
    );
    p.bhs.set_byte(3, 1); // VersionMin
    p.bhs.set_byte(2, 1);
    c.send(&p).await;
    let r = c.recv().await;
    assert_eq!((r.bhs.byte(36), r.bhs.byte(37)), (2, 5));

    // TSIH of a session that does not exist.
    let mut c = Client::connect(addr).await;
    c.tsih = 999;
    let r = c
        .login(&format!("InitiatorName=iqn.x;TargetName={TARGET}"))
        .await;
    assert_eq!((r.bhs.byte(36), r.bhs.byte(37)), (2, 0x0a));
}

#[tokio::test]
async fn cmdsn_outside_window_is_dropped() {
    let ram = RamTarget::new(8, false);
    let (_server, addr) = start(options(), ram).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    let cmd = c.command(&[0; 6], 0, false, false, true, &[]);
    c.send(&cmd).await;
    let r = c.recv().await;
    let exp = r.bhs.u32_at(28);
    let max = r.bhs.u32_at(32);
    assert_eq!(exp, c.cmdsn);
    assert_eq!(max.wrapping_sub(exp), 127, "window of 128");

    for bad in [max.wrapping_add(1), exp.wrapping_sub(1)] {
        c.cmdsn = bad;
        let cmd = c.command(&[0; 6], 0, false, false, true, &[]);
        c.send(&cmd).await;
        assert!(
            c.recv_within(Duration::from_millis(300)).await.is_none(),
            "silently ignored"
        );
    }
    c.cmdsn = exp;
    let cmd = c.command(&[0; 6], 0, false, false, true, &[]);
    c.send(&cmd).await;
    let r = c.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.byte(3)),
        (Some(Opcode::ScsiResponse), 0)
    );
}

#[tokio::test]
async fn command_ahead_of_a_gap_waits_for_it() {
    let ram = RamTarget::new(8, false);
    let (_server, addr) = start(options(), ram).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    let first = c.command(&[0; 6], 0, false, false, true, &[]);
    let second = c.command(&[0; 6], 0, false, false, true, &[]);
    c.send(&second).await;
    assert!(
        c.recv_within(Duration::from_millis(300)).await.is_none(),
        "held until the gap is filled"
    );
    c.send(&first).await;
    let a = c.recv().await;
    let b = c.recv().await;
    assert_eq!(a.bhs.itt(), first.bhs.itt());
    assert_eq!(b.bhs.itt(), second.bhs.itt());
    assert_eq!(b.bhs.u32_at(28), c.cmdsn);
}

#[tokio::test]
async fn bad_datasn_fails_the_command_not_the_connection() {
    let ram = RamTarget::new(8, false);
    let (_server, addr) = start(options(), ram).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("InitialR2T=No;ImmediateData=No").await;
    // Two unsolicited Data-Out with DataSN 0: failed once the F bit is in.
    let cmd = c.command(&write10(0, 2), 1024, false, true, false, &[]);
    let itt = cmd.bhs.itt();
    c.send(&cmd).await;
    c.send(&c.data_out(itt, 0xffff_ffff, 0, 0, false, &[1; 512]))
        .await;
    c.send(&c.data_out(itt, 0xffff_ffff, 0, 512, true, &[1; 512]))
        .await;
    let r = c.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.itt(), r.bhs.byte(3)),
        (Some(Opcode::ScsiResponse), itt, 0x02)
    );
    assert_eq!(
        (r.data[2 + 2], r.data[2 + 12], r.data[2 + 13]),
        (0x0b, 0x47, 0x05),
        "protocol service CRC error"
    );

    // Solicited data with a wrong DataSN: the target waits for the F bit
    // of the sequence before answering.
    let cmd = c.command(&write10(0, 2), 1024, false, true, true, &[]);
    let itt = cmd.bhs.itt();
    c.send(&cmd).await;
    let r2t = c.recv().await;
    assert_eq!(r2t.bhs.opcode(), Some(Opcode::R2t));
    let ttt = r2t.bhs.u32_at(20);
    c.send(&c.data_out(itt, ttt, 27, 0, false, &[1; 256])).await;
    assert!(c.recv_within(Duration::from_millis(200)).await.is_none());
    c.send(&c.data_out(itt, ttt, 28, 256, true, &[1; 256]))
        .await;
    let r = c.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.byte(3)),
        (Some(Opcode::ScsiResponse), 0x02)
    );

    // The connection and its CmdSN window are still fine.
    let payload = pattern(1024, 4);
    let r = c.write(&write10(0, 2), &payload, 0, 1024, 512).await;
    assert_eq!(r.bhs.byte(3), 0);
}

#[tokio::test]
async fn pings_both_ways() {
    let ram = RamTarget::new(8, false);
    let opts = ServerOptions {
        nop_interval: Some(Duration::from_secs(1)),
        nop_timeout: Duration::from_secs(2),
        ..options()
    };
    let (_server, addr) = start(opts, ram).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    c.nop_out(0x55, 0xffff_ffff, b"hello").await;
    let r = c.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.itt(), &r.data[..]),
        (Some(Opcode::NopIn), 0x55, &b"hello"[..])
    );

    // The target pings an idle initiator; answering keeps the connection.
    // Generous bounds: pings follow a 1 s housekeeping tick, and a loaded
    // machine may run it late.
    let ping = c.recv_within(Duration::from_secs(10)).await.expect("ping");
    assert_eq!(
        (ping.bhs.opcode(), ping.bhs.itt()),
        (Some(Opcode::NopIn), 0xffff_ffff)
    );
    let ttt = ping.bhs.u32_at(20);
    assert_ne!(ttt, 0xffff_ffff);
    c.nop_out(0xffff_ffff, ttt, b"").await;
    // Not answering the next one ends it.
    let ping = c
        .recv_within(Duration::from_secs(10))
        .await
        .expect("second ping");
    assert_eq!(ping.bhs.opcode(), Some(Opcode::NopIn));
    assert!(c.closed_within(Duration::from_secs(15)).await);
}

#[tokio::test]
async fn unknown_opcode_is_rejected() {
    let ram = RamTarget::new(8, false);
    let (_server, addr) = start(options(), ram).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    let mut b = Bhs::default();
    b.0[0] = 0x1c;
    b.set_itt(3);
    c.send(&Pdu::new(b, Bytes::new())).await;
    let r = c.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.byte(2)),
        (Some(Opcode::Reject), 0x05)
    );
    assert_eq!(&r.data[..], &b.0[..]);
    // Still usable.
    let cmd = c.command(&[0; 6], 0, false, false, true, &[]);
    c.send(&cmd).await;
    assert_eq!(c.recv().await.bhs.opcode(), Some(Opcode::ScsiResponse));
}

fn tmf(c: &mut Client, function: u8, rtt: u32, ref_cmdsn: u32) -> Pdu {
    let mut b = Bhs::new(Opcode::TaskMgmtRequest, 0x80 | function);
    b.set_immediate(true);
    let itt = c.next_itt();
    b.set_itt(itt);
    b.set_u32(20, rtt);
    b.set_u32(24, c.cmdsn);
    b.set_u32(32, ref_cmdsn);
    Pdu::new(b, Bytes::new())
}

#[tokio::test]
async fn abort_task_waiting_for_data() {
    let ram = RamTarget::new(8, false);
    let (_server, addr) = start(options(), ram.clone()).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("InitialR2T=Yes").await;
    let cmd = c.command(&write10(0, 2), 1024, false, true, true, &[]);
    let (itt, cmdsn) = (cmd.bhs.itt(), cmd.bhs.u32_at(24));
    c.send(&cmd).await;
    let r2t = c.recv().await;
    assert_eq!(r2t.bhs.opcode(), Some(Opcode::R2t));
    let abort = tmf(&mut c, 1, itt, cmdsn);
    c.send(&abort).await;
    let r = c.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.byte(2)),
        (Some(Opcode::TaskMgmtResponse), 0),
        "function complete"
    );
    // A second abort finds nothing.
    let abort = tmf(&mut c, 1, itt, cmdsn);
    c.send(&abort).await;
    let r = c.recv().await;
    assert_eq!(r.bhs.byte(2), 1, "task does not exist");
    // The window slot came back: the next command runs.
    let cmd = c.command(&[0; 6], 0, false, false, true, &[]);
    c.send(&cmd).await;
    let r = c.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.itt()),
        (Some(Opcode::ScsiResponse), cmd.bhs.itt())
    );
    assert!(ram.events().iter().any(|e| e.contains("AbortTask")));
}

#[tokio::test]
async fn abort_of_a_running_task_suppresses_its_response() {
    let ram = RamTarget::new(8, true);
    *ram.delay.lock() = Duration::from_millis(500);
    let (_server, addr) = start(options(), ram.clone()).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    let cmd = c.command(&[0; 6], 0, false, false, true, &[]);
    let (itt, cmdsn) = (cmd.bhs.itt(), cmd.bhs.u32_at(24));
    c.send(&cmd).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let abort = tmf(&mut c, 1, itt, cmdsn);
    c.send(&abort).await;
    let r = c.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.byte(2)),
        (Some(Opcode::TaskMgmtResponse), 0)
    );
    assert!(
        c.recv_within(Duration::from_millis(700)).await.is_none(),
        "no response for the aborted task"
    );
    *ram.delay.lock() = Duration::ZERO;
    // The ITT is free again.
    c.itt = itt - 1;
    let cmd = c.command(&[0; 6], 0, false, false, true, &[]);
    assert_eq!(cmd.bhs.itt(), itt);
    c.send(&cmd).await;
    assert_eq!(c.recv().await.bhs.opcode(), Some(Opcode::ScsiResponse));
}

#[tokio::test]
async fn abort_of_a_finished_task_does_not_exist() {
    let ram = RamTarget::new(8, false);
    let (_server, addr) = start(options(), ram).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    let payload = pattern(4096, 9);
    let cmd = c.command(&write10(0, 8), 4096, false, true, true, &payload);
    let (itt, cmdsn) = (cmd.bhs.itt(), cmd.bhs.u32_at(24));
    c.send(&cmd).await;
    let abort = tmf(&mut c, 1, itt, cmdsn);
    c.send(&abort).await;
    let a = c.recv().await;
    let b = c.recv().await;
    assert_eq!(
        (a.bhs.opcode(), a.bhs.byte(3)),
        (Some(Opcode::ScsiResponse), 0)
    );
    assert_eq!(
        (b.bhs.opcode(), b.bhs.byte(2)),
        (Some(Opcode::TaskMgmtResponse), 1)
    );
}

#[tokio::test]
async fn lun_reset_and_unknown_lun() {
    let ram = RamTarget::new(8, true);
    *ram.delay.lock() = Duration::from_millis(300);
    let (_server, addr) = start(options(), ram.clone()).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    let cmd = c.command(&[0; 6], 0, false, false, true, &[]);
    c.send(&cmd).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let reset = tmf(&mut c, 5, 0xffff_ffff, 0);
    c.send(&reset).await;
    let r = c.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.byte(2)),
        (Some(Opcode::TaskMgmtResponse), 0)
    );
    assert!(ram.events().iter().any(|e| e.contains("LogicalUnitReset")));
    let mut reset = tmf(&mut c, 5, 0xffff_ffff, 0);
    reset.bhs.set_lun_bytes([0, 9, 0, 0, 0, 0, 0, 0]);
    c.send(&reset).await;
    assert_eq!(c.recv().await.bhs.byte(2), 2, "LUN does not exist");
    let reassign = tmf(&mut c, 8, 1, 0);
    c.send(&reassign).await;
    assert_eq!(c.recv().await.bhs.byte(2), 4);
}

#[tokio::test]
async fn cold_reset_drops_connections_after_responding() {
    let ram = RamTarget::new(8, false);
    let (_server, addr) = start(options(), ram).await;
    let mut a = Client::connect(addr).await;
    a.login_normal("").await;
    let mut b = Client::connect(addr).await;
    b.isid[5] = 2;
    b.login_normal("").await;
    let reset = tmf(&mut a, 7, 0xffff_ffff, 0);
    a.send(&reset).await;
    let r = a.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.byte(2)),
        (Some(Opcode::TaskMgmtResponse), 0)
    );
    assert!(a.closed_within(Duration::from_secs(5)).await);
    assert!(b.closed_within(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn reinstatement_replaces_the_old_session() {
    let ram = RamTarget::new(8, false);
    let (_server, addr) = start(options(), ram.clone()).await;
    let mut old = Client::connect(addr).await;
    old.login_normal("").await;
    let mut new = Client::connect(addr).await;
    new.login_normal("").await;
    assert!(old.closed_within(Duration::from_secs(5)).await);
    let ev = ram.events();
    let names: Vec<&str> = ev
        .iter()
        .map(|e| e.split(' ').next().unwrap_or(""))
        .collect();
    assert_eq!(
        names,
        vec!["added", "lost", "added"],
        "old nexus lost before the new one is added"
    );
    let cmd = new.command(&[0; 6], 0, false, false, true, &[]);
    new.send(&cmd).await;
    assert_eq!(new.recv().await.bhs.opcode(), Some(Opcode::ScsiResponse));
}

#[tokio::test]
async fn header_and_data_digests() {
    let ram = RamTarget::new(64, false);
    let (_server, addr) = start(options(), ram.clone()).await;
    let mut c = Client::connect(addr).await;
    let keys = c
        .login_normal("HeaderDigest=CRC32C,None;DataDigest=CRC32C")
        .await;
    assert_eq!(key(&keys, "HeaderDigest"), Some("CRC32C"));
    assert_eq!(key(&keys, "DataDigest"), Some("CRC32C"));
    let payload = pattern(3 * BLOCK + 100, 5);
    let r = c.write(&write10(0, 4), &payload, 1000, 0, 512).await;
    assert_eq!(r.bhs.byte(3), 0);
    let cmd = c.command(&read10(0, 3), 3 * BLOCK as u32, true, false, true, &[]);
    let itt = cmd.bhs.itt();
    c.send(&cmd).await;
    let (data, _) = c.collect_read(itt).await;
    assert_eq!(&data[..], &payload[..3 * BLOCK]);
    // A corrupted header digest ends the connection.
    let cmd = c.command(&[0; 6], 0, false, false, true, &[]);
    let mut wire = iscsi::pdu::encode(&cmd, &c.framing);
    wire[50] ^= 0xff;
    c.send_raw(&wire).await;
    assert!(c.closed_within(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn oversized_data_segment_is_refused() {
    let ram = RamTarget::new(8, false);
    let base = options();
    let opts = ServerOptions {
        negotiation: iscsi::negotiation::TargetLimits {
            max_recv_data_segment_length: 4096,
            ..base.negotiation.clone()
        },
        ..base
    };
    let (_server, addr) = start(opts, ram).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    c.nop_out(1, 0xffff_ffff, &[0u8; 8192]).await;
    let r = c.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.byte(2)),
        (Some(Opcode::Reject), 0x04)
    );
    assert!(c.closed_within(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn shutdown_asks_initiators_to_log_out() {
    let ram = RamTarget::new(8, false);
    let (server, addr) = start(options(), ram.clone()).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    let stopper = tokio::spawn(async move { server.shutdown().await });
    let msg = c.recv().await;
    assert_eq!(
        (msg.bhs.opcode(), msg.bhs.byte(36)),
        (Some(Opcode::AsyncMessage), 1)
    );
    let r = c.logout().await;
    assert_eq!(r.bhs.opcode(), Some(Opcode::LogoutResponse));
    tokio::time::timeout(Duration::from_secs(5), stopper)
        .await
        .expect("shutdown finishes")
        .unwrap();
    assert!(ram.wait_event("lost").await);
    // The listener is gone: no more connections.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn many_sessions_at_once() {
    let ram = RamTarget::new(256, true);
    let (_server, addr) = start(options(), ram.clone()).await;
    let mut handles = Vec::new();
    for i in 0..16u8 {
        handles.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            c.isid[5] = i;
            c.login_normal("").await;
            let payload = pattern(8 * BLOCK, i);
            let lba = u32::from(i) * 8;
            for _ in 0..5 {
                let r = c.write(&write10(lba, 8), &payload, 4096, 0, 4096).await;
                assert_eq!(r.bhs.byte(3), 0);
                let cmd = c.command(&read10(lba, 8), 4096, true, false, true, &[]);
                let itt = cmd.bhs.itt();
                c.send(&cmd).await;
                let (data, _) = c.collect_read(itt).await;
                assert_eq!(data, payload);
            }
            c.logout().await;
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
}

#[tokio::test]
async fn replace_targets_keeps_existing_sessions() {
    let ram = RamTarget::new(8, false);
    let (server, addr) = start(options(), ram.clone()).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    server.replace_targets(vec![target("iqn.2024-01.org.openarray:other", ram.clone())]);

    // The old session still works on the target it logged in to.
    let cmd = c.command(&[0; 6], 0, false, false, true, &[]);
    c.send(&cmd).await;
    assert_eq!(c.recv().await.bhs.opcode(), Some(Opcode::ScsiResponse));
    // SendTargets in a normal session reports the session's own target.
    let mut b = Bhs::new(Opcode::TextRequest, 0x80);
    b.set_immediate(true);
    b.set_itt(c.next_itt());
    b.set_u32(20, 0xffff_ffff);
    b.set_u32(24, c.cmdsn);
    c.send(&Pdu::new(b, Bytes::from_static(b"SendTargets=All\0")))
        .await;
    let r = c.recv().await;
    assert_eq!(key(&kv(&r.data), "TargetName"), Some(TARGET));

    // New logins see the new list.
    let mut d = Client::connect(addr).await;
    d.isid[5] = 9;
    let r = d
        .login(&format!("InitiatorName=iqn.x;TargetName={TARGET}"))
        .await;
    assert_eq!((r.bhs.byte(36), r.bhs.byte(37)), (2, 3));
    let mut e = Client::connect(addr).await;
    let r = e
        .login("InitiatorName=iqn.x;TargetName=iqn.2024-01.org.openarray:other")
        .await;
    assert_eq!(r.bhs.byte(36), 0);
}

#[tokio::test]
async fn lun_reset_reaches_other_sessions() {
    let ram = RamTarget::new(8, true);
    let (_server, addr) = start(options(), ram.clone()).await;
    let mut a = Client::connect(addr).await;
    a.login_normal("").await;
    let mut b = Client::connect(addr).await;
    b.isid[5] = 2;
    b.login_normal("").await;
    *ram.delay.lock() = Duration::from_millis(400);
    let cmd = b.command(&[0; 6], 0, false, false, true, &[]);
    b.send(&cmd).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let reset = tmf(&mut a, 5, 0xffff_ffff, 0);
    a.send(&reset).await;
    let r = a.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.byte(2)),
        (Some(Opcode::TaskMgmtResponse), 0)
    );
    *ram.delay.lock() = Duration::ZERO;
    assert!(
        b.recv_within(Duration::from_millis(500)).await.is_none(),
        "the reset aborted b's command"
    );
    // Session b goes on.
    let cmd = b.command(&[0; 6], 0, false, false, true, &[]);
    b.send(&cmd).await;
    let r = b.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.itt()),
        (Some(Opcode::ScsiResponse), cmd.bhs.itt())
    );
}

#[tokio::test]
async fn text_request_spanning_pdus() {
    let ram = RamTarget::new(8, false);
    let (_server, addr) = start(options(), ram).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    let itt = c.next_itt();
    let text_pdu = |c: &Client, flags: u8, ttt: u32, data: &'static [u8]| {
        let mut b = Bhs::new(Opcode::TextRequest, flags);
        b.set_immediate(true);
        b.set_itt(itt);
        b.set_u32(20, ttt);
        b.set_u32(24, c.cmdsn);
        Pdu::new(b, Bytes::from_static(data))
    };
    // First half with C set: the target acknowledges with an empty response.
    let first = text_pdu(&c, 0x40, 0xffff_ffff, b"SendTarg");
    c.send(&first).await;
    let r = c.recv().await;
    assert_eq!(r.bhs.opcode(), Some(Opcode::TextResponse));
    assert!(r.data.is_empty());
    assert_eq!(r.bhs.flags() & 0xc0, 0, "neither F nor C");
    let ttt = r.bhs.u32_at(20);
    assert_ne!(ttt, 0xffff_ffff);
    let second = text_pdu(&c, 0x80, ttt, b"ets=All\0X-private=1\0");
    c.send(&second).await;
    let r = c.recv().await;
    assert_eq!(r.bhs.flags() & 0xc0, 0x80);
    let pairs = kv(&r.data);
    assert_eq!(key(&pairs, "TargetName"), Some(TARGET));
    assert_eq!(key(&pairs, "X-private"), Some("NotUnderstood"));
    // A TTT the target never handed out is refused.
    let bogus = text_pdu(&c, 0x80, 0x1234, b"");
    c.send(&bogus).await;
    let r = c.recv().await;
    assert_eq!(
        (r.bhs.opcode(), r.bhs.byte(2)),
        (Some(Opcode::Reject), 0x09)
    );
}

/// Many writes at once, larger together than the connection's write
/// budget and each longer than one burst: every one of them completes.
/// (Budget reserved burst by burst let each command hold part of its data
/// and wait for budget the others held: no R2T was ever sent again.)
#[tokio::test]
async fn writes_beyond_the_write_budget_all_complete() {
    let ram = RamTarget::new(1024, false);
    let opts = ServerOptions {
        max_write_buffer: 16 * BLOCK as u64,
        ..options()
    };
    let (_server, addr) = start(opts, ram.clone()).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("InitialR2T=Yes;ImmediateData=No;MaxOutstandingR2T=1;MaxBurstLength=2048")
        .await;
    // Eight writes of 16 blocks (8 KiB, the whole budget each), fetched in
    // bursts of 2 KiB.
    let mut payloads = std::collections::HashMap::new();
    for i in 0..8u32 {
        let payload = pattern(16 * BLOCK, i as u8 + 1);
        let cmd = c.command(
            &write10(i * 16, 16),
            payload.len() as u32,
            false,
            true,
            true,
            &[],
        );
        payloads.insert(cmd.bhs.itt(), (i, payload));
        c.send(&cmd).await;
    }
    let mut done = 0;
    while done < payloads.len() {
        let p = c.recv_within(Duration::from_secs(10)).await.expect(
            "the target stopped soliciting data: writes wait for budget held by other writes",
        );
        match p.bhs.opcode() {
            Some(Opcode::R2t) => {
                let (_, payload) = &payloads[&p.bhs.itt()];
                let (offset, len) = (p.bhs.u32_at(40) as usize, p.bhs.u32_at(44) as usize);
                let d = c.data_out(
                    p.bhs.itt(),
                    p.bhs.u32_at(20),
                    0,
                    offset as u32,
                    true,
                    &payload[offset..offset + len],
                );
                c.send(&d).await;
            }
            Some(Opcode::ScsiResponse) => {
                assert_eq!(p.bhs.byte(3), 0, "status of a write");
                done += 1;
            }
            Some(Opcode::NopIn) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let data = ram.data.lock();
    for (i, payload) in payloads.values() {
        let at = *i as usize * 16 * BLOCK;
        assert_eq!(&data[at..at + payload.len()], &payload[..], "write {i}");
    }
}

#[tokio::test]
async fn reads_run_on_the_connections_ring() {
    let (ram, content) = RamTarget::reading_through_ring(3);
    let (_server, addr) = start(options(), ram.clone()).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("MaxRecvDataSegmentLength=65536").await;

    // A burst the connection decodes together: reads for the ring (more
    // than it puts on the device at once, so some wait for the first
    // ones to end), one it declines (run by the pool instead) and one
    // answered without a read.
    let mut asked = std::collections::HashMap::new();
    let mut lbas: Vec<u32> = (0..24).map(|i| i * 37).collect();
    lbas.push(support::DECLINED_LBA);
    lbas.push(4095);
    let mut burst = Vec::new();
    for &lba in &lbas {
        let cmd = c.command(&read10(lba, 8), 8 * BLOCK as u32, true, false, true, &[]);
        asked.insert(cmd.bhs.itt(), lba);
        burst.extend_from_slice(&cmd.bhs.0);
        burst.extend_from_slice(&cmd.data);
    }
    c.send_raw(&burst).await;

    let mut answered = 0;
    while answered < lbas.len() {
        let p = c.recv().await;
        let lba = asked[&p.bhs.itt()] as usize;
        match p.bhs.opcode() {
            Some(Opcode::DataIn) => {
                assert_ne!(lba, 4095, "a read past the end has no data");
                assert_eq!(&p.data[..], &content[lba * BLOCK..(lba + 8) * BLOCK]);
                assert_ne!(p.bhs.flags() & 0x01, 0, "status with the one Data-In");
                assert_eq!(p.bhs.byte(3), 0, "GOOD");
            }
            Some(Opcode::ScsiResponse) => {
                assert_eq!(lba, 4095, "only the read past the end fails");
                assert_eq!(p.bhs.byte(3), 0x02, "CHECK CONDITION");
            }
            other => panic!("unexpected {other:?}"),
        }
        answered += 1;
    }
    assert_eq!(
        ram.ring_finished.load(std::sync::atomic::Ordering::SeqCst),
        24,
        "every read but the declined and the failed one ran on the ring"
    );
}

#[tokio::test]
async fn an_initiator_in_lockstep_is_served_while_the_reader_polls() {
    // Commands run inline, and each one acknowledges the last status
    // (ExpStatSN), as an initiator at queue depth 1 does: the reader then
    // polls its socket between commands before it sleeps. WRITEs reach it
    // in pieces 10 µs apart (header, then their data in two sends), so
    // polls also end inside a PDU. Whether a given wait is caught by a
    // poll depends on how fast this thread answers; every answer is
    // checked either way.
    let ram = RamTarget::new(4096, false);
    let (_server, addr) = start(options(), ram.clone()).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("ImmediateData=Yes;FirstBurstLength=65536;MaxRecvDataSegmentLength=65536")
        .await;
    let mut exp_statsn = 0u32;
    for i in 0..100u32 {
        let lba = (i * 23) % 4000;
        let data = pattern(8 * BLOCK, i as u8);
        let mut write = c.command(
            &write10(lba, 8),
            data.len() as u32,
            false,
            true,
            true,
            &data,
        );
        write.bhs.set_u32(28, exp_statsn);
        let wire = iscsi::pdu::encode(&write, &c.framing);
        let (header, rest) = wire.split_at(48);
        let (first, second) = rest.split_at(rest.len() / 3);
        for piece in [header, first, second] {
            c.send_raw(piece).await;
            // Busy: a sleep this short would last the timer's slack.
            let t = std::time::Instant::now();
            while t.elapsed() < Duration::from_micros(10) {
                std::hint::spin_loop();
            }
        }
        let r = c.recv().await;
        assert_eq!(r.bhs.opcode(), Some(Opcode::ScsiResponse), "write {i}");
        assert_eq!(r.bhs.byte(3), 0, "write {i} GOOD");
        exp_statsn = r.bhs.u32_at(24).wrapping_add(1);

        let mut read = c.command(&read10(lba, 8), data.len() as u32, true, false, true, &[]);
        read.bhs.set_u32(28, exp_statsn);
        c.send(&read).await;
        let r = c.recv().await;
        assert_eq!(r.bhs.opcode(), Some(Opcode::DataIn), "read {i}");
        assert_ne!(r.bhs.flags() & 0x01, 0, "read {i}: status with its data");
        assert_eq!(&r.data[..], &data[..], "read {i}");
        exp_statsn = r.bhs.u32_at(24).wrapping_add(1);
    }
    let ram = ram.data.lock();
    for i in 0..100u32 {
        let at = ((i * 23) % 4000) as usize * BLOCK;
        let data = pattern(8 * BLOCK, i as u8);
        assert_eq!(&ram[at..at + 8 * BLOCK], &data[..], "write {i} in place");
    }
}
