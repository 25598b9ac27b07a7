//! What the server tells about its sessions: the snapshot of each, the
//! counts for metrics, logins by outcome, and ending one session on
//! request.

mod support;

use std::time::{Duration, Instant};

use iscsi::pdu::Opcode;
use iscsi::{Digest, Refusal, ServerOptions};
use support::*;

fn refused(server: &iscsi::Server, r: Refusal) -> u64 {
    server
        .logins()
        .refused()
        .into_iter()
        .find(|(x, _)| *x == r)
        .map_or(0, |(_, n)| n)
}

#[tokio::test]
async fn sessions_are_listed_counted_and_ended_on_request() {
    let options = ServerOptions {
        nop_interval: None,
        logout_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let ram = RamTarget::new(64, false);
    let (server, addr) = start(options, ram).await;
    assert_eq!(server.session_counts().by_target, vec![(TARGET.into(), 0)]);

    let mut a = Client::connect(addr).await;
    a.login_normal("InitiatorAlias=host a;MaxRecvDataSegmentLength=65536;HeaderDigest=CRC32C,None")
        .await;
    // A command to LUN 0 marks it used.
    let cmd = a.command(&read10(0, 1), 512, true, false, true, &[]);
    let itt = cmd.bhs.itt();
    a.send(&cmd).await;
    a.collect_read(itt).await;

    let mut b = Client::connect(addr).await;
    b.isid[5] = 7;
    let r = b
        .login(&format!(
            "InitiatorName=iqn.2024-01.test:other;TargetName={TARGET};"
        ))
        .await;
    assert_eq!((r.bhs.byte(36), r.bhs.byte(37)), (0, 0));
    b.tsih = r.bhs.u16_at(14);

    // Refused: an unknown target.
    let mut c = Client::connect(addr).await;
    let r = c
        .login("InitiatorName=iqn.2024-01.test:third;TargetName=iqn.2024-01.nowhere:x;")
        .await;
    assert_eq!((r.bhs.byte(36), r.bhs.byte(37)), (2, 3));

    let list = server.sessions();
    assert_eq!(list.len(), 2, "{list:?}");
    let sa = &list[0];
    assert_eq!(sa.initiator, "iqn.2024-01.test:client");
    assert_eq!(sa.initiator_alias.as_deref(), Some("host a"));
    assert_eq!(sa.target.as_deref(), Some(TARGET));
    assert_eq!(sa.tsih, a.tsih);
    assert_eq!(sa.isid, a.isid);
    assert_eq!(sa.connections.len(), 1);
    assert_eq!(sa.connections[0].portal, addr);
    assert_eq!(sa.connections[0].peer, a.stream.local_addr().unwrap());
    assert_eq!(sa.params.header_digest, Digest::Crc32c);
    assert_eq!(sa.params.initiator_mrdsl, 65536);
    assert_eq!(sa.luns_used, vec![0]);
    assert!(!sa.logout_requested);
    let sb = &list[1];
    assert_eq!(sb.initiator, "iqn.2024-01.test:other");
    assert_eq!(sb.initiator_alias, None);
    assert!(sb.luns_used.is_empty());
    assert_eq!(sb.params.header_digest, Digest::None);
    assert!(sa.id < sb.id);
    assert_eq!(server.session(sb.id).as_ref(), Some(sb));

    let counts = server.session_counts();
    assert_eq!(counts.by_target, vec![(TARGET.into(), 2)]);
    assert_eq!((counts.discovery, counts.connections), (0, 2));
    assert_eq!(server.logins().accepted(), 2);
    assert_eq!(refused(&server, Refusal::TargetUnknown), 1);
    assert_eq!(refused(&server, Refusal::NotAllowed), 0);

    // Ending b: a logout request, then the connection is closed when b
    // does not answer it; a goes on.
    assert!(!server.request_logout(sb.id + 100));
    let asked = Instant::now();
    assert!(server.request_logout(sb.id));
    let p = b.recv().await;
    assert_eq!(p.bhs.opcode(), Some(Opcode::AsyncMessage));
    assert_eq!(p.bhs.byte(36), 1, "logout request");
    assert!(server.session(sb.id).unwrap().logout_requested);
    assert!(!server.session(sa.id).unwrap().logout_requested);
    assert!(b.closed_within(Duration::from_secs(5)).await);
    assert!(
        asked.elapsed() >= Duration::from_millis(900),
        "closed before the logout timeout"
    );
    let start = Instant::now();
    while server.sessions().len() != 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "b is still listed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(server.sessions()[0].id, sa.id);
    assert!(server.session(sb.id).is_none());
    assert_eq!(server.session_counts().by_target, vec![(TARGET.into(), 1)]);
    let cmd = a.command(&read10(1, 1), 512, true, false, true, &[]);
    let itt = cmd.bhs.itt();
    a.send(&cmd).await;
    a.collect_read(itt).await;
}
