//! Admin commands (NVMe Base 2.0, 5): Identify, Get Log Page, features,
//! asynchronous events, Keep Alive and Abort, on a controller.

use std::time::Duration;

use crate::capsule::Sqe;
use crate::controller::{Controller, LOG_ANA, LOG_CHANGED_NS, LOG_ERROR, LOG_SMART};
use crate::identify::{self, Offer};
use crate::logs;
use crate::status::Status;

pub const OP_GET_LOG_PAGE: u8 = 0x02;
pub const OP_IDENTIFY: u8 = 0x06;
pub const OP_ABORT: u8 = 0x08;
pub const OP_SET_FEATURES: u8 = 0x09;
pub const OP_GET_FEATURES: u8 = 0x0A;
pub const OP_ASYNC_EVENT: u8 = 0x0C;
pub const OP_KEEP_ALIVE: u8 = 0x18;

pub const FEAT_VOLATILE_WRITE_CACHE: u8 = 0x06;
pub const FEAT_NUMBER_OF_QUEUES: u8 = 0x07;
pub const FEAT_ASYNC_EVENT_CONFIG: u8 = 0x0B;
pub const FEAT_KEEP_ALIVE_TIMER: u8 = 0x0F;

/// How an admin command ends.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Done {
        status: Status,
        result: u64,
        data: Vec<u8>,
    },
    /// Completed later (an Asynchronous Event Request held).
    Held,
}

fn done(status: Status) -> Reply {
    Reply::Done {
        status,
        result: 0,
        data: Vec::new(),
    }
}

fn result(result: u64) -> Reply {
    Reply::Done {
        status: Status::SUCCESS,
        result,
        data: Vec::new(),
    }
}

fn data(data: Vec<u8>) -> Reply {
    Reply::Done {
        status: Status::SUCCESS,
        result: 0,
        data,
    }
}

/// Runs admin command `sqe` (not a fabrics command) on `ctrl`; `max_len`
/// is the data length the host's SGL allows.
pub fn run(ctrl: &Controller, sqe: &Sqe, offer: &Offer) -> Reply {
    if !ctrl.ready() && sqe.opcode() != OP_KEEP_ALIVE {
        return done(Status::COMMAND_SEQUENCE); // CC.EN is not set yet
    }
    let out = match sqe.opcode() {
        OP_IDENTIFY => identify(ctrl, sqe, offer),
        OP_GET_LOG_PAGE => get_log_page(ctrl, sqe, 4096 << offer.mdts),
        OP_SET_FEATURES => set_features(ctrl, sqe),
        OP_GET_FEATURES => get_features(ctrl, sqe),
        OP_ASYNC_EVENT => match ctrl.add_aer(sqe.cid()) {
            Ok(Some(e)) => result(u64::from(e.0)),
            Ok(None) => Reply::Held,
            Err(s) => done(s),
        },
        OP_KEEP_ALIVE => {
            ctrl.keep_alive();
            done(Status::SUCCESS)
        }
        OP_ABORT => abort(ctrl, sqe),
        _ => done(Status::INVALID_OPCODE),
    };
    fit(out, sqe.sgl().len as usize)
}

/// Data longer than the host's buffer is cut to it.
fn fit(reply: Reply, len: usize) -> Reply {
    match reply {
        Reply::Done {
            status,
            result,
            mut data,
        } => {
            data.truncate(len);
            Reply::Done {
                status,
                result,
                data,
            }
        }
        held => held,
    }
}

fn identify(ctrl: &Controller, sqe: &Sqe, offer: &Offer) -> Reply {
    let sub = ctrl.subsystem();
    let nsid = sqe.nsid();
    let cns = sqe.cdw(10) as u8;
    let namespace = || sub.namespaces.get(&nsid).cloned();
    match cns {
        identify::CNS_CONTROLLER => data(identify::controller(ctrl, &sub, offer)),
        identify::CNS_ACTIVE_LIST if nsid >= 0xFFFF_FFFE => done(Status::INVALID_NAMESPACE),
        identify::CNS_ACTIVE_LIST => data(identify::active_list(&sub, nsid)),
        // An inactive id in range reads as zeros (Base 2.0, 5.17.2.1).
        identify::CNS_NAMESPACE => match namespace() {
            Some(ns) => data(identify::namespace(&ns)),
            None if (1..=crate::config::MAX_NSID).contains(&nsid) => data(vec![0; identify::PAGE]),
            None => done(Status::INVALID_NAMESPACE),
        },
        // Command set 0 (NVM) is the only one.
        identify::CNS_CSI_CONTROLLER if sqe.cdw(11) >> 24 == 0 => data(identify::nvm_controller()),
        identify::CNS_INDEPENDENT => match namespace() {
            Some(ns) => data(identify::independent(&ns)),
            None if (1..=crate::config::MAX_NSID).contains(&nsid) => data(vec![0; identify::PAGE]),
            None => done(Status::INVALID_NAMESPACE),
        },
        identify::CNS_DESCRIPTORS => match namespace() {
            Some(ns) => data(identify::descriptors(&ns)),
            None => done(Status::INVALID_NAMESPACE),
        },
        _ => done(Status::INVALID_FIELD),
    }
}

fn get_log_page(ctrl: &Controller, sqe: &Sqe, max: usize) -> Reply {
    log_reply(ctrl, sqe, max, |lid, lsp, retain| {
        let sub = ctrl.subsystem();
        Some(match lid {
            LOG_ERROR => logs::errors(ctrl),
            LOG_SMART => logs::smart(ctrl, &sub),
            LOG_CHANGED_NS => logs::changed_namespaces(ctrl, retain),
            LOG_ANA => logs::ana(ctrl, &sub, lsp & 1 != 0),
            _ => return None,
        })
    })
}

/// Get Log Page with the page `page` makes of (log id, log specific
/// field, retain asynchronous event); `None` for a page not kept.
pub(crate) fn log_reply(
    ctrl: &Controller,
    sqe: &Sqe,
    max: usize,
    page: impl FnOnce(u8, u8, bool) -> Option<Vec<u8>>,
) -> Reply {
    let cdw10 = sqe.cdw(10);
    let lid = cdw10 as u8;
    let lsp = (cdw10 >> 8 & 0x7F) as u8;
    let retain = cdw10 & 1 << 15 != 0;
    let dwords = u64::from(cdw10 >> 16) | u64::from(sqe.cdw(11) & 0xFFFF) << 16;
    let len = ((dwords + 1) * 4) as usize;
    let offset = u64::from(sqe.cdw(12)) | u64::from(sqe.cdw(13)) << 32;
    if offset % 4 != 0 {
        return done(Status::INVALID_FIELD);
    }
    let Some(page) = page(lid, lsp, retain) else {
        return done(Status::INVALID_LOG_PAGE);
    };
    if !retain {
        ctrl.log_read(lid);
    }
    if offset > page.len() as u64 {
        return done(Status::INVALID_FIELD);
    }
    // Past the page the host reads zeros, up to what its buffer holds.
    let len = len.min(sqe.sgl().len as usize).min(max);
    let mut out = page[offset as usize..].to_vec();
    out.resize(len, 0);
    data(out)
}

fn set_features(ctrl: &Controller, sqe: &Sqe) -> Reply {
    let cdw10 = sqe.cdw(10);
    if cdw10 & 1 << 31 != 0 {
        return done(Status::NOT_SAVEABLE);
    }
    let value = sqe.cdw(11);
    match cdw10 as u8 {
        FEAT_NUMBER_OF_QUEUES => {
            if value & 0xFFFF == 0xFFFF || value >> 16 == 0xFFFF {
                return done(Status::INVALID_FIELD);
            }
            result(u64::from(ctrl.grant_queues(value)))
        }
        FEAT_VOLATILE_WRITE_CACHE => {
            // The cache is the devices', shared with every transport.
            for ns in ctrl.subsystem().namespaces.values() {
                ns.backing.set_write_cache(value & 1 != 0);
            }
            done(Status::SUCCESS)
        }
        FEAT_ASYNC_EVENT_CONFIG => {
            ctrl.set_aec(value);
            done(Status::SUCCESS)
        }
        FEAT_KEEP_ALIVE_TIMER => {
            ctrl.set_kato(Duration::from_millis(u64::from(value)));
            done(Status::SUCCESS)
        }
        _ => done(Status::INVALID_FIELD),
    }
}

fn get_features(ctrl: &Controller, sqe: &Sqe) -> Reply {
    let cdw10 = sqe.cdw(10);
    let select = cdw10 >> 8 & 7;
    let fid = cdw10 as u8;
    if select == 3 {
        // Supported capabilities: changeable, not saveable.
        return match fid {
            FEAT_NUMBER_OF_QUEUES
            | FEAT_VOLATILE_WRITE_CACHE
            | FEAT_ASYNC_EVENT_CONFIG
            | FEAT_KEEP_ALIVE_TIMER => result(1 << 2),
            _ => done(Status::INVALID_FIELD),
        };
    }
    let current = select != 1;
    let v = match fid {
        FEAT_NUMBER_OF_QUEUES => u64::from(ctrl.queues_granted()),
        FEAT_VOLATILE_WRITE_CACHE => {
            let sub = ctrl.subsystem();
            let on = match sub
                .namespaces
                .get(&sqe.nsid())
                .or_else(|| sub.namespaces.values().next())
            {
                Some(ns) if current => ns.backing.write_cache(),
                Some(ns) => ns.backing.device().capabilities().volatile_cache,
                None => false,
            };
            u64::from(on)
        }
        FEAT_ASYNC_EVENT_CONFIG if current => u64::from(ctrl.aec()),
        FEAT_ASYNC_EVENT_CONFIG => 0,
        FEAT_KEEP_ALIVE_TIMER if current => ctrl.kato().as_millis() as u64,
        FEAT_KEEP_ALIVE_TIMER => 0,
        _ => return done(Status::INVALID_FIELD),
    };
    result(v)
}

/// Abort (Base 2.0, 5.1): a held Asynchronous Event Request is aborted;
/// a command already on the device is not (dword 0 bit 0 says so).
fn abort(ctrl: &Controller, sqe: &Sqe) -> Reply {
    let cdw10 = sqe.cdw(10);
    let sqid = cdw10 as u16;
    let cid = (cdw10 >> 16) as u16;
    if sqid == 0 && ctrl.abort_aer(cid) {
        if let Some(admin) = ctrl.admin() {
            admin.complete_now(cid, Status::ABORT_REQUESTED, 0);
        }
        return result(0);
    }
    result(1)
}

#[cfg(test)]
#[path = "admin_tests.rs"]
mod tests;
