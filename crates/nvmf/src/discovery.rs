//! The discovery controller (Fabrics 2.0, 3.1.3 and 5.3): hosts connect
//! to the well-known discovery NQN and read the discovery log page,
//! one entry for each subsystem they may connect to on each address
//! the target serves it on. The log's generation counter moves when
//! what it lists changes, and hosts that asked are told.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::admin::{self, Reply};
use crate::capsule::Sqe;
use crate::config::DISCOVERY_NQN;
use crate::controller::{Controller, AER_LIMIT, ERROR_LOG_ENTRIES, LOG_DISCOVERY, VERSION};
use crate::identify::{Offer, CNS_CONTROLLER, PAGE};
use crate::status::Status;
use crate::subsystem::Table;
use crate::wire::{put16, put32, put64};

/// Transport type TCP, subsystem type NVM (Fabrics 2.0, figure 38).
const TRTYPE_TCP: u8 = 3;
const ADRFAM_IPV4: u8 = 1;
const ADRFAM_IPV6: u8 = 2;
const SUBTYPE_NVM: u8 = 2;
/// TREQ: secure channel not required; SQ flow control may be disabled.
const TREQ: u8 = 0b10 | 1 << 2;
/// ASQSZ: the admin queue size entries report (the target takes more).
const ASQSZ: u16 = 32;
const HEADER_LEN: usize = 1024;
const ENTRY_LEN: usize = 1024;

/// What the discovery log lists, as last published.
type View = (Vec<SocketAddr>, Vec<(String, Vec<String>)>);

/// The discovery log's state, shared by the server's connections.
#[derive(Default)]
pub struct Discovery {
    genctr: AtomicU64,
    view: Mutex<View>,
}

impl Discovery {
    /// Publishes the subsystems of `table` on the I/O listeners
    /// `listeners` (bound addresses); true when that changed what a
    /// host may read, and so the generation counter.
    pub fn update(&self, listeners: &[SocketAddr], table: &Table) -> bool {
        let view: View = (
            listeners.to_vec(),
            table
                .values()
                .map(|s| (s.nqn.clone(), s.allow_hosts.clone()))
                .collect(),
        );
        let mut old = self.view.lock();
        if *old == view {
            return false;
        }
        *old = view;
        self.genctr.fetch_add(1, Ordering::Relaxed);
        true
    }

    pub fn genctr(&self) -> u64 {
        self.genctr.load(Ordering::Relaxed)
    }

    fn listeners(&self) -> Vec<SocketAddr> {
        self.view.lock().0.clone()
    }

    /// The discovery log page (figure 39 and 40) as host `host_nqn`,
    /// connected to `local`, sees it.
    pub fn log(&self, table: &Table, host_nqn: &str, local: Option<SocketAddr>) -> Vec<u8> {
        let listeners = self.listeners();
        let subsystems: Vec<_> = table.values().filter(|s| s.admits(host_nqn)).collect();
        let numrec = subsystems.len() * listeners.len();
        let mut b = vec![0u8; HEADER_LEN + ENTRY_LEN * numrec];
        put64(&mut b, 0, self.genctr());
        put64(&mut b, 8, numrec as u64);
        // RECFMT 0.
        let mut at = HEADER_LEN;
        for sub in subsystems {
            for (i, addr) in listeners.iter().enumerate() {
                entry(
                    &mut b[at..at + ENTRY_LEN],
                    i as u16 + 1,
                    *addr,
                    local,
                    &sub.nqn,
                );
                at += ENTRY_LEN;
            }
        }
        b
    }
}

fn ascii(field: &mut [u8], s: &str) {
    field.fill(b' ');
    let n = s.len().min(field.len());
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// One entry. A listener on a wildcard address is reported with the
/// address the host reached the target on, as the host cannot connect
/// to the wildcard.
fn entry(e: &mut [u8], portid: u16, addr: SocketAddr, local: Option<SocketAddr>, nqn: &str) {
    // Listeners on IPv6 take IPv6 only: a wildcard is given the
    // address reached when it is of the wildcard's family.
    let ip = match local {
        Some(l) if addr.ip().is_unspecified() && l.is_ipv4() == addr.is_ipv4() => l.ip(),
        _ => addr.ip(),
    };
    e[0] = TRTYPE_TCP;
    e[1] = if ip.is_ipv4() {
        ADRFAM_IPV4
    } else {
        ADRFAM_IPV6
    };
    e[2] = SUBTYPE_NVM;
    e[3] = TREQ;
    put16(e, 4, portid);
    put16(e, 6, 0xFFFF); // dynamic controllers
    put16(e, 8, ASQSZ);
    ascii(&mut e[32..64], &addr.port().to_string());
    let nqn = nqn.as_bytes();
    e[256..256 + nqn.len().min(256)].copy_from_slice(&nqn[..nqn.len().min(256)]);
    ascii(&mut e[512..768], &ip.to_string());
    // TSAS: security type none (byte 0 zero).
}

/// Identify Controller of a discovery controller (figure 275; the
/// fields Fabrics 2.0, 5.3 asks of one).
pub fn identify(ctrl: &Controller, offer: &Offer) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    let sub = ctrl.subsystem();
    ascii(&mut b[4..24], &sub.serial());
    ascii(&mut b[24..64], "openarray");
    ascii(&mut b[64..72], env!("CARGO_PKG_VERSION"));
    b[77] = offer.mdts;
    put16(&mut b, 78, ctrl.cntlid);
    put32(&mut b, 80, VERSION);
    put32(&mut b, 92, 1 << 31); // OAES: discovery log page change notices
    b[111] = 2; // CNTRLTYPE: a discovery controller
    b[259] = (AER_LIMIT - 1) as u8;
    b[261] = 1 << 2; // LPA: log page offsets
    b[262] = (ERROR_LOG_ENTRIES - 1) as u8;
    put16(&mut b, 320, 1); // KAS: 100 ms units
    put16(&mut b, 514, offer.queue_entries as u16); // MAXCMD
    put32(&mut b, 536, 1 | 1 << 20); // SGLS
    let nqn = DISCOVERY_NQN.as_bytes();
    b[768..768 + nqn.len()].copy_from_slice(nqn);
    // Capsule sizes as an I/O controller's: Linux's host checks them on
    // every fabrics controller.
    put32(&mut b, 1792, (64 + offer.in_capsule) / 16);
    put32(&mut b, 1796, 1);
    b[1803] = 1; // MSDBD
    b
}

/// An admin command on a discovery controller: Identify (controller),
/// Get Log Page (discovery), the features and events it has, Keep
/// Alive.
pub fn admin(
    disc: &Discovery,
    table: &Table,
    ctrl: &Controller,
    sqe: &Sqe,
    offer: &Offer,
) -> Reply {
    let refuse = |status| Reply::Done {
        status,
        result: 0,
        data: Vec::new(),
    };
    match sqe.opcode() {
        admin::OP_IDENTIFY | admin::OP_GET_LOG_PAGE if !ctrl.ready() => {
            refuse(Status::COMMAND_SEQUENCE)
        }
        admin::OP_IDENTIFY if sqe.cdw(10) as u8 == CNS_CONTROLLER => {
            let mut data = identify(ctrl, offer);
            data.truncate(sqe.sgl().len as usize);
            Reply::Done {
                status: Status::SUCCESS,
                result: 0,
                data,
            }
        }
        admin::OP_IDENTIFY => refuse(Status::INVALID_FIELD),
        admin::OP_GET_LOG_PAGE => admin::log_reply(ctrl, sqe, 4096 << offer.mdts, |lid, _, _| {
            (lid == LOG_DISCOVERY).then(|| disc.log(table, &ctrl.host_nqn, ctrl.local()))
        }),
        admin::OP_SET_FEATURES | admin::OP_GET_FEATURES => match sqe.cdw(10) as u8 {
            admin::FEAT_ASYNC_EVENT_CONFIG | admin::FEAT_KEEP_ALIVE_TIMER => {
                admin::run(ctrl, sqe, offer)
            }
            _ => refuse(Status::INVALID_FIELD),
        },
        admin::OP_ASYNC_EVENT | admin::OP_KEEP_ALIVE => admin::run(ctrl, sqe, offer),
        _ => refuse(Status::INVALID_OPCODE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use crate::subsystem::Subsystem;

    fn table(hosts: &[(&str, &str)]) -> Table {
        hosts
            .iter()
            .map(|(nqn, allow)| {
                let s = Subsystem {
                    nqn: nqn.to_string(),
                    allow_hosts: vec![allow.to_string()],
                    namespaces: BTreeMap::new(),
                    hosts: BTreeMap::new(),
                };
                (nqn.to_string(), Arc::new(s))
            })
            .collect()
    }

    #[test]
    fn entries_per_subsystem_and_listener_the_host_may_see() {
        let d = Discovery::default();
        let t = table(&[
            ("nqn.2026-11.org.openarray:a", "*"),
            ("nqn.2026-11.org.openarray:b", "nqn.2026-11.org.h:only"),
        ]);
        let listeners: Vec<SocketAddr> = vec![
            "0.0.0.0:4420".parse().unwrap(),
            "[::1]:4421".parse().unwrap(),
        ];
        assert!(d.update(&listeners, &t));
        assert!(!d.update(&listeners, &t), "nothing changed");
        assert_eq!(d.genctr(), 1);
        let local = Some("192.0.2.7:8009".parse().unwrap());
        let log = d.log(&t, "nqn.2026-11.org.h:other", local);
        assert_eq!(crate::wire::le64(&log, 8), 2);
        assert_eq!(log.len(), 1024 * 3);
        let e = &log[1024..2048];
        assert_eq!((e[0], e[1], e[2], e[3]), (3, 1, 2, 0b110));
        assert_eq!(crate::wire::le16(e, 4), 1);
        assert_eq!(&e[32..37], b"4420 ");
        assert_eq!(
            &e[512..522],
            b"192.0.2.7 ",
            "the wildcard is the address reached"
        );
        assert!(e[256..].starts_with(b"nqn.2026-11.org.openarray:a\0"));
        let e = &log[2048..];
        assert_eq!((e[1], crate::wire::le16(e, 4)), (2, 2));
        assert_eq!(&e[512..516], b"::1 ");
        let log = d.log(&t, "nqn.2026-11.org.h:only", local);
        assert_eq!(crate::wire::le64(&log, 8), 4);
        assert!(d.update(&listeners[..1], &t));
        assert_eq!(d.genctr(), 2);
        // A host that reached an IPv6 address is not given it for the
        // IPv4 wildcard, nor an IPv4 one for the IPv6 wildcard.
        let v6 = Some("[2001:db8::1]:8009".parse().unwrap());
        let e = &d.log(&t, "x", v6)[1024..2048];
        assert_eq!((e[1], &e[512..520]), (1, &b"0.0.0.0 "[..]));
        let only_v6: Vec<SocketAddr> = vec!["[::]:4420".parse().unwrap()];
        d.update(&only_v6, &t);
        let e = &d.log(&t, "x", local)[1024..2048];
        assert_eq!((e[1], &e[512..515]), (2, &b":: "[..]));
        let e = &d.log(&t, "x", v6)[1024..2048];
        assert_eq!((e[1], &e[512..524]), (2, &b"2001:db8::1 "[..]));
    }
}
