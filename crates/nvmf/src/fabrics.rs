//! Fabrics commands (NVMe over Fabrics 2.0, 6): Connect, which makes a
//! queue part of a controller (the admin queue creates it), and Property
//! Get and Set, how a host reaches the controller's registers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::HostKeys;
use crate::config::DISCOVERY_NQN;
use crate::subsystem::Subsystem;

use crate::capsule::Sqe;
use crate::controller::{Controller, PROP_CAP, PROP_CC};
use crate::registry::Registry;
use crate::status::Status;
use crate::wire::{le16, le32, le64};

pub const OPCODE: u8 = 0x7F;
pub const PROPERTY_SET: u8 = 0x00;
pub const CONNECT: u8 = 0x01;
pub const PROPERTY_GET: u8 = 0x04;
pub const DISCONNECT: u8 = 0x08;

/// Connect data: host id, controller id, subsystem and host NQNs.
pub const CONNECT_DATA_LEN: usize = 1024;
const DATA_CNTLID: u32 = 16;
const DATA_SUBNQN: u32 = 256;
const DATA_HOSTNQN: u32 = 512;
/// Offsets of Connect's fields in the submission entry.
const SQE_RECFMT: u32 = 40;
const SQE_QID: u32 = 42;
const SQE_SQSIZE: u32 = 44;

/// What the target lets a queue be.
#[derive(Clone, Copy, Debug)]
pub struct QueueLimits {
    /// Entries of the longest queue.
    pub entries: u32,
    /// Most I/O queues per controller.
    pub io_queues: u16,
}

/// How a connection reached the target.
#[derive(Clone, Copy, Debug)]
pub struct Via {
    /// The target address the host connected to.
    pub local: Option<SocketAddr>,
    /// A discovery-only listener: no I/O controllers.
    pub discovery_only: bool,
}

/// A discovery controller's keep alive timeout when its host gives
/// none, so that controllers of hosts gone away end (as Linux's target
/// does).
const DISCOVERY_KATO: Duration = Duration::from_secs(120);

/// A queue made part of a controller.
pub struct Connected {
    pub ctrl: Arc<Controller>,
    pub qid: u16,
    pub entries: u32,
    pub flow_off: bool,
    /// The secrets the queue's host must prove it knows first.
    pub auth: Option<Arc<HostKeys>>,
}

/// Why a Connect failed: the status, and dword 0 naming the field.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused {
    pub status: Status,
    pub result: u64,
}

fn in_data(offset: u32) -> Refused {
    Refused {
        status: Status::CONNECT_INVALID_PARAMETERS,
        result: u64::from(1 << 16 | offset),
    }
}

fn in_sqe(offset: u32) -> Refused {
    Refused {
        status: Status::CONNECT_INVALID_PARAMETERS,
        result: u64::from(offset),
    }
}

/// A NUL-terminated string field of the Connect data.
fn nqn_field(data: &[u8], at: usize) -> String {
    let field = &data[at..at + 256];
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// Connect (Fabrics 2.0, 6.3).
pub fn connect(
    reg: &Registry,
    limits: QueueLimits,
    peer: &str,
    via: Via,
    sqe: &Sqe,
    data: &[u8],
) -> Result<Connected, Refused> {
    if le16(&sqe.0, SQE_RECFMT as usize) != 0 {
        return Err(Refused {
            status: Status::CONNECT_INCOMPATIBLE,
            result: 0,
        });
    }
    if data.len() < CONNECT_DATA_LEN {
        return Err(Refused {
            status: Status::SGL_LENGTH_INVALID,
            result: 0,
        });
    }
    let qid = le16(&sqe.0, SQE_QID as usize);
    let entries = u32::from(le16(&sqe.0, SQE_SQSIZE as usize)) + 1;
    let flow_off = sqe.0[46] & 1 << 2 != 0;
    let kato = Duration::from_millis(u64::from(sqe.cdw(12)));
    let mut host_id = [0u8; 16];
    host_id.copy_from_slice(&data[..16]);
    let cntlid = le16(data, DATA_CNTLID as usize);
    let subnqn = nqn_field(data, DATA_SUBNQN as usize);
    let hostnqn = nqn_field(data, DATA_HOSTNQN as usize);
    let discovery = subnqn == DISCOVERY_NQN;
    if discovery && qid != 0 {
        return Err(in_sqe(SQE_QID)); // a discovery controller has no I/O queues
    }
    let sub = match reg.subsystem(&subnqn) {
        Some(s) if !via.discovery_only => s,
        None if discovery => Arc::new(Subsystem::discovery()),
        _ => return Err(in_data(DATA_SUBNQN)),
    };
    let kato = match kato {
        d if d.is_zero() && discovery => DISCOVERY_KATO,
        d => d,
    };
    if !sub.admits(&hostnqn) {
        return Err(Refused {
            status: Status::CONNECT_INVALID_HOST,
            result: u64::from(1 << 16 | DATA_HOSTNQN),
        });
    }
    if entries > limits.entries || entries < if qid == 0 { 32 } else { 2 } {
        return Err(in_sqe(SQE_SQSIZE));
    }
    if qid == 0 {
        let io_queues = limits.io_queues;
        let peer = peer.to_string();
        let auth = sub.keys(&hostnqn);
        let ctrl = reg
            .create(|id| Controller::new(id, sub, hostnqn, host_id, peer, kato, io_queues))
            .ok_or(Refused {
                status: Status::CONNECT_BUSY,
                result: 0,
            })?;
        if let Some(local) = via.local {
            ctrl.set_local(local);
        }
        return Ok(Connected {
            ctrl,
            qid,
            entries,
            flow_off,
            auth,
        });
    }
    let ctrl = reg.get(cntlid).ok_or(in_data(DATA_CNTLID))?;
    let same =
        ctrl.subsystem().nqn == subnqn && ctrl.host_nqn == hostnqn && ctrl.host_id == host_id;
    if !same || ctrl.is_ended() || !ctrl.ready() {
        return Err(in_data(DATA_CNTLID));
    }
    let granted = ctrl.queues_granted() & 0xFFFF;
    if u32::from(qid) > granted + 1 || !ctrl.claim_qid(qid) {
        return Err(in_sqe(SQE_QID));
    }
    let auth = ctrl.subsystem().keys(&ctrl.host_nqn);
    Ok(Connected {
        ctrl,
        qid,
        entries,
        flow_off,
        auth,
    })
}

/// CAP (Base 2.0, 3.1.4.1): queue size, contiguous queues, a timeout,
/// the NVM command set, 4 KiB memory pages.
pub fn cap(limits: QueueLimits) -> u64 {
    let mqes = u64::from(limits.entries - 1);
    let timeout = 20; // 10 s, in 500 ms units
    mqes | 1 << 16 | timeout << 24 | 1 << 37
}

/// Property Get and Set (Fabrics 2.0, 6.5 and 6.6): dword 0 (and 1) of
/// the completion.
pub fn property(ctrl: &Controller, limits: QueueLimits, sqe: &Sqe) -> Result<u64, Status> {
    let wide = sqe.0[40] & 7 == 1;
    let offset = le32(&sqe.0, 44);
    if wide != (offset == PROP_CAP) {
        return Err(Status::INVALID_FIELD);
    }
    if sqe.fctype() == PROPERTY_GET {
        return ctrl
            .property(offset, cap(limits))
            .ok_or(Status::INVALID_FIELD);
    }
    match offset {
        PROP_CC => ctrl.set_cc(le64(&sqe.0, 48) as u32).map(|()| 0),
        _ => Err(Status::INVALID_FIELD),
    }
}
