//! Limits that keep one initiator from taking every session, and sessions
//! that lose their access.

mod support;

use iscsi::pdu::Opcode;
use iscsi::ServerOptions;
use support::*;

#[tokio::test]
async fn sessions_per_initiator_are_limited() {
    let options = ServerOptions {
        nop_interval: None,
        max_sessions_per_initiator: 2,
        ..Default::default()
    };
    let ram = RamTarget::new(64, false);
    let (_server, addr) = start(options, ram).await;
    let mut held = Vec::new();
    for isid in 1..=2u8 {
        let mut c = Client::connect(addr).await;
        c.isid[5] = isid;
        c.login_normal("").await;
        held.push(c);
    }
    // A third session of the same initiator is refused: out of resources.
    let mut third = Client::connect(addr).await;
    third.isid[5] = 3;
    let text = format!("InitiatorName=iqn.2024-01.test:client;TargetName={TARGET};");
    let r = third.login(&text).await;
    assert_eq!(r.bhs.opcode(), Some(Opcode::LoginResponse));
    assert_eq!((r.bhs.byte(36), r.bhs.byte(37)), (3, 2));

    // Another initiator is not affected.
    let mut other = Client::connect(addr).await;
    let r = other
        .login(&format!(
            "InitiatorName=iqn.2024-01.test:other;TargetName={TARGET};"
        ))
        .await;
    assert_eq!((r.bhs.byte(36), r.bhs.byte(37)), (0, 0));

    // Once a session ends, the initiator may log in again.
    let mut first = held.remove(0);
    first.logout().await;
    drop(first);
    let mut again = Client::connect(addr).await;
    again.isid[5] = 4;
    let mut ok = false;
    for _ in 0..50 {
        let r = again.login(&text).await;
        if (r.bhs.byte(36), r.bhs.byte(37)) == (0, 0) {
            ok = true;
            break;
        }
        // The ended session may still be tearing down.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        again = Client::connect(addr).await;
        again.isid[5] = 4;
    }
    assert!(ok, "login after a logout");
}

/// Access withdrawn while a session runs: the session is asked to log out.
#[tokio::test]
async fn withdrawn_access_ends_the_session() {
    use iscsi::access::{AccessList, Group, InitiatorPattern, SharedAccess, TargetAccess};

    let ram = RamTarget::new(64, false);
    let rules = |members: &[&str]| {
        let mut list = AccessList::new();
        list.set_target(
            TARGET,
            TargetAccess {
                groups: vec![Group {
                    name: "g".into(),
                    members: members.iter().map(|m| InitiatorPattern::new(m)).collect(),
                    view: ram.clone(),
                    chap: None,
                }],
                default_view: None,
                chap: None,
            },
        );
        list
    };
    let access = SharedAccess::new(rules(&[
        "iqn.2024-01.test:client",
        "iqn.2024-01.test:other",
    ]));
    let options = ServerOptions {
        nop_interval: None,
        access: access.clone(),
        ..Default::default()
    };
    let (server, addr) = start(options, ram.clone()).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    let mut other = Client::connect(addr).await;
    other.isid[5] = 9;
    let r = other
        .login(&format!(
            "InitiatorName=iqn.2024-01.test:other;TargetName={TARGET};"
        ))
        .await;
    assert_eq!((r.bhs.byte(36), r.bhs.byte(37)), (0, 0));

    access.replace(rules(&["iqn.2024-01.test:other"]));
    assert_eq!(server.end_refused_sessions(), 1);
    let p = c.recv().await;
    assert_eq!(p.bhs.opcode(), Some(Opcode::AsyncMessage));
    assert_eq!(p.bhs.byte(36), 1, "logout request");
    // The session that keeps its access hears nothing.
    assert!(other
        .recv_within(std::time::Duration::from_millis(300))
        .await
        .is_none());
}

#[tokio::test]
async fn connections_per_portal_are_limited() {
    let options = ServerOptions {
        nop_interval: None,
        max_connections_per_portal: 2,
        ..Default::default()
    };
    let (_server, addr) = start(options, RamTarget::new(64, false)).await;
    let mut first = Client::connect(addr).await;
    first.login_normal("").await;
    let mut second = Client::connect(addr).await;
    second.isid[5] = 2;
    second.login_normal("").await;
    // The third login is refused as out of resources, and its connection
    // closed: the limit counts logged-in connections.
    let mut third = Client::connect(addr).await;
    third.isid[5] = 4;
    let r = third
        .login(&format!(
            "InitiatorName=iqn.2024-01.test:client;TargetName={TARGET};"
        ))
        .await;
    assert_eq!((r.bhs.byte(36), r.bhs.byte(37)), (3, 2));
    assert!(third.closed_within(std::time::Duration::from_secs(5)).await);
    // Once one ends, there is room again.
    first.logout().await;
    drop(first);
    let mut ok = false;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut c = Client::connect(addr).await;
        c.isid[5] = 3;
        let p = c.login_pdu(
            1,
            3,
            true,
            &format!("InitiatorName=iqn.2024-01.test:client;TargetName={TARGET};"),
        );
        c.send(&p).await;
        if let Some(r) = c.recv_within(std::time::Duration::from_secs(2)).await {
            assert_eq!((r.bhs.byte(36), r.bhs.byte(37)), (0, 0));
            ok = true;
            break;
        }
    }
    assert!(ok, "a connection after one ended");
}
