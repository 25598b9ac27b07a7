//! One LU on two heads, over iSCSI: two servers, one per head, each its
//! own target port group, serving logical units over one device whose
//! ALUA states the test moves as the HA pair would. What a multipath
//! initiator sends (TEST UNIT READY, REPORT TARGET PORT GROUPS, READ)
//! gets what it expects on each path.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use export::{AccessState, Backing, Cause, PortGroup, PAIR_SUPPORTED};
use iscsi::pdu::Opcode;
use iscsi::{Server, ServerOptions};
use support::*;

use AccessState::*;

const GOOD: Answer = (0, None);
const STATE_CHANGED: Answer = (2, Some((0x6, 0x2A, 0x06)));
const STANDBY: Answer = (2, Some((0x2, 0x04, 0x0B)));
const TRANSITIONING: Answer = (2, Some((0x2, 0x04, 0x0A)));
const POWER_ON: Answer = (2, Some((0x6, 0x29, 0x00)));

/// Status, and (key, ASC, ASCQ) of its fixed-format sense if any.
type Answer = (u8, Option<(u8, u8, u8)>);

/// A head serving the device as `TARGET` through portal group `tpgt`.
async fn head(backing: &Arc<Backing>, tpgt: u16) -> (Arc<Server>, SocketAddr) {
    let config = scsi::LuConfig {
        serial: "alua-pair".into(),
        ..Default::default()
    };
    let lu = scsi::LogicalUnit::over(backing.clone(), config).unwrap();
    let registry = scsi::LuRegistry::new();
    registry.add(lu.clone());
    let target = iscsi::Target {
        name: TARGET.into(),
        alias: None,
        portal_group: tpgt,
        portals: vec![],
        scsi: scsi::Target::new(TARGET, BTreeMap::from([(0, lu)]), registry),
    };
    let options = ServerOptions {
        nop_interval: None,
        ..Default::default()
    };
    start_with(options, vec![target]).await
}

async fn session(addr: SocketAddr) -> Client {
    let mut c = Client::connect(addr).await;
    c.login_normal("").await;
    c
}

/// Runs a command without Data-Out; its answer and Data-In.
async fn ask(c: &mut Client, cdb: &[u8], read_len: u32) -> (Answer, Vec<u8>) {
    let cmd = c.command(cdb, read_len, read_len > 0, false, true, &[]);
    let itt = cmd.bhs.itt();
    c.send(&cmd).await;
    let (data, last) = c.collect_read(itt).await;
    let status = last.bhs.byte(3);
    let sense =
        (last.bhs.opcode() == Some(Opcode::ScsiResponse) && last.data.len() > 16).then(|| {
            let s = &last.data[2..];
            (s[2] & 0x0F, s[12], s[13])
        });
    ((status, sense), data)
}

async fn tur(c: &mut Client) -> Answer {
    ask(c, &[0; 6], 0).await.0
}

async fn read(c: &mut Client) -> Answer {
    ask(c, &read10(0, 1), BLOCK as u32).await.0
}

/// REPORT TARGET PORT GROUPS (extended header): (group, state, status
/// code, ports) of each descriptor.
async fn port_groups(c: &mut Client) -> Vec<(u16, u8, u8, Vec<u16>)> {
    let (answer, d) = ask(c, &[0xA3, 0x2A, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0], 1024).await;
    assert_eq!(answer, GOOD);
    assert_eq!(d[4], 0x10, "extended header");
    let mut groups = Vec::new();
    let mut at = 8;
    while at < d.len() {
        let count = usize::from(d[at + 7]);
        let ports = (0..count)
            .map(|i| u16::from_be_bytes([d[at + 10 + 4 * i], d[at + 11 + 4 * i]]))
            .collect();
        groups.push((
            u16::from_be_bytes([d[at + 2], d[at + 3]]),
            d[at] & 0x0F,
            d[at + 5],
            ports,
        ));
        at += 8 + 4 * count;
    }
    groups
}

#[tokio::test]
async fn each_path_follows_the_pair() {
    let backing = Backing::new(Arc::new(block::MemDevice::new(1 << 20)), true);
    let states = backing.access_states().clone();
    states.configure(
        vec![
            PortGroup::new(1, ActiveOptimized, true).with_ports(&[1]),
            PortGroup::new(2, Standby, false).with_ports(&[2]),
        ],
        Unavailable,
        PAIR_SUPPORTED,
    );
    let (_a, addr_a) = head(&backing, 1).await;
    let (_b, addr_b) = head(&backing, 2).await;
    let mut a = session(addr_a).await;
    let mut b = session(addr_b).await;
    assert_eq!(tur(&mut a).await, POWER_ON);
    assert_eq!(tur(&mut b).await, POWER_ON);

    // Both heads say implicit ALUA and name their own port and group.
    let (_, inq) = ask(&mut b, &[0x12, 0, 0, 0, 96, 0], 96).await;
    assert_eq!(inq[5] & 0x30, 0x10);
    let (_, vpd) = ask(&mut b, &[0x12, 1, 0x83, 1, 0, 0], 256).await;
    let mut at = 4;
    let mut port = Vec::new();
    while at + 4 <= vpd.len() {
        if vpd[at + 1] & 0x30 == 0x10 && matches!(vpd[at + 1] & 0x0F, 4 | 5) {
            port.push(u16::from_be_bytes([vpd[at + 6], vpd[at + 7]]));
        }
        at += 4 + usize::from(vpd[at + 3]);
    }
    assert_eq!(port, [2, 2], "relative port 2 of group 2");

    // The owner serves; the standby path is a ghost to multipathd's TUR
    // checker and refuses media access.
    assert_eq!(tur(&mut a).await, GOOD);
    assert_eq!(read(&mut a).await, GOOD);
    assert_eq!(tur(&mut b).await, STANDBY);
    assert_eq!(read(&mut b).await, STANDBY);
    let groups = port_groups(&mut b).await;
    assert_eq!(groups, [(1, 0x0, 0, vec![1]), (2, 0x2, 0, vec![2])]);

    // Failover: both groups transitioning, then the other way round.
    states.begin_transition(&[1, 2], Cause::Implicit);
    assert_eq!(tur(&mut b).await, STATE_CHANGED);
    assert_eq!(read(&mut b).await, TRANSITIONING);
    states.set(&[(1, Standby), (2, ActiveOptimized)], Cause::Implicit);
    assert_eq!(read(&mut b).await, STATE_CHANGED);
    assert_eq!(read(&mut b).await, GOOD);
    assert_eq!(read(&mut a).await, STATE_CHANGED);
    assert_eq!(read(&mut a).await, STANDBY);
    let groups = port_groups(&mut a).await;
    assert_eq!(groups, [(1, 0x2, 2, vec![1]), (2, 0x0, 2, vec![2])]);
}
