//! Identify data structures (NVMe Base 2.0, 5.17.2): the controller,
//! a namespace, the active namespace list and a namespace's
//! identification descriptors.

use crate::config::MAX_NSID;
use crate::controller::{Controller, AER_LIMIT, ERROR_LOG_ENTRIES, VERSION};
use crate::subsystem::{Namespace, Subsystem};
use crate::wire::{put16, put32, put64};

pub const CNS_NAMESPACE: u8 = 0x00;
pub const CNS_CONTROLLER: u8 = 0x01;
pub const CNS_ACTIVE_LIST: u8 = 0x02;
pub const CNS_DESCRIPTORS: u8 = 0x03;
pub const CNS_CSI_CONTROLLER: u8 = 0x06;
pub const CNS_INDEPENDENT: u8 = 0x08;

pub const PAGE: usize = 4096;

/// What the target offers every controller.
#[derive(Clone, Copy, Debug)]
pub struct Offer {
    /// MDTS: the longest transfer is 2^mdts pages of 4 KiB.
    pub mdts: u8,
    /// Entries of the longest queue.
    pub queue_entries: u32,
    /// In-capsule data an I/O command may carry, in bytes.
    pub in_capsule: u32,
}

/// The ANA group every namespace is in.
pub const ANA_GROUP: u32 = 1;

fn text(b: &mut [u8], at: usize, len: usize, s: &str) {
    let field = &mut b[at..at + len];
    field.fill(b' ');
    let n = s.len().min(len);
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Identify Controller (figure 275).
pub fn controller(ctrl: &Controller, sub: &Subsystem, offer: &Offer) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    text(&mut b, 4, 20, &sub.serial());
    text(&mut b, 24, 40, "openarray");
    text(&mut b, 64, 8, env!("CARGO_PKG_VERSION"));
    b[72] = 6; // recommended arbitration burst
               // CMIC: more than one controller may serve the subsystem, with ANA.
    b[76] = 1 << 1 | 1 << 3;
    b[77] = offer.mdts;
    put16(&mut b, 78, ctrl.cntlid);
    put32(&mut b, 80, VERSION);
    // OAES: namespace attribute and ANA change notices.
    put32(&mut b, 92, 1 << 8 | 1 << 11);
    // CTRATT: 128-bit host identifier.
    put32(&mut b, 96, 1);
    b[111] = 1; // an I/O controller
    put16(&mut b, 256, 0); // OACS: no optional admin commands
    b[258] = 3; // abort limit, 0-based
    b[259] = (AER_LIMIT - 1) as u8;
    b[260] = 1 << 1 | 1; // firmware slot 1, read only
    b[261] = 1 << 2; // LPA: log page offsets
    b[262] = (ERROR_LOG_ENTRIES - 1) as u8;
    put16(&mut b, 266, 0x0157); // warning composite temperature: 343 K
    put16(&mut b, 268, 0x0175); // critical: 373 K
    put16(&mut b, 320, 1); // KAS: keep alive in units of 100 ms
    b[343] = 10; // ANATT: seconds
    b[344] = 1 << 0 | 1 << 6; // ANACAP: optimized state, group ids do not change
    put32(&mut b, 345, ANA_GROUP); // ANAGRPMAX
    put32(&mut b, 349, ANA_GROUP); // NANAGRPID
    b[512] = 0x66; // SQES: 64 bytes
    b[513] = 0x44; // CQES: 16 bytes
    put16(&mut b, 514, offer.queue_entries as u16);
    put32(&mut b, 516, MAX_NSID);
    // ONCS: Compare, Dataset Management, Write Zeroes.
    put16(&mut b, 520, 1 | 1 << 2 | 1 << 3);
    put16(&mut b, 522, 1); // FUSES: Compare and Write
                           // VWC: a volatile write cache; Flush of every namespace not supported.
    b[525] = 1 | 0b10 << 1;
    put16(&mut b, 532, 0); // ACWU: one block
    put32(&mut b, 536, 1 | 1 << 20); // SGLS: SGLs, offsets in data blocks
    put32(&mut b, 540, MAX_NSID); // MNAN
    let nqn = sub.nqn.as_bytes();
    b[768..768 + nqn.len().min(255)].copy_from_slice(&nqn[..nqn.len().min(255)]);
    // Fabrics: capsule sizes in 16 bytes, no in-capsule data offset.
    put32(&mut b, 1792, (64 + offer.in_capsule) / 16);
    put32(&mut b, 1796, 1);
    b[1803] = 1; // MSDBD
                 // Power state 0: 10 W.
    put16(&mut b, 2048, 1000);
    b
}

/// Identify Namespace (NVM command set, figure 97 of the NVM spec).
pub fn namespace(ns: &Namespace) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    let blocks = ns.blocks();
    let caps = ns.backing.device().capabilities();
    put64(&mut b, 0, blocks);
    put64(&mut b, 8, blocks);
    put64(&mut b, 16, blocks);
    // NSFEAT: thin provisioning, deallocated blocks reported.
    b[24] = u8::from(caps.thin) | u8::from(caps.thin) << 2;
    b[25] = 0; // one LBA format
    b[26] = 0;
    b[30] = 1; // NMIC: may be attached to more than one controller
               // DLFEAT: deallocated blocks read as zeros; Write Zeroes may deallocate.
    if caps.discard && (caps.discard_zeroes || caps.thin) {
        b[33] = 0b001 | 1 << 3;
    }
    put32(&mut b, 92, ANA_GROUP);
    b[99] = u8::from(caps.read_only); // NSATTR: write protected
    b[104..120].copy_from_slice(&ns.ids.nguid);
    b[120..128].copy_from_slice(&ns.ids.eui64);
    // LBA format 0: no metadata, the block size, best performance.
    b[130] = ns.block_size.trailing_zeros() as u8;
    b
}

/// I/O command set independent Identify Namespace (figure 280), which
/// hosts of NVMe 2.0 controllers ask for first.
pub fn independent(ns: &Namespace) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    let caps = ns.backing.device().capabilities();
    b[0] = u8::from(caps.thin); // NSFEAT: thin provisioning
    b[1] = 1; // NMIC: shared
    put32(&mut b, 4, ANA_GROUP);
    b[8] = u8::from(caps.read_only); // NSATTR: write protected
    b[13] = 1; // NSTAT: ready
    b
}

/// The NVM command set's Identify Controller (NVM Command Set 1.0,
/// figure 93): zeros, as this target sets no verify, write zeroes,
/// write uncorrectable or dataset management limits of its own.
pub fn nvm_controller() -> Vec<u8> {
    vec![0u8; PAGE]
}

/// Active namespace ids above `after`, at most 1024.
pub fn active_list(sub: &Subsystem, after: u32) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    for (i, id) in sub
        .namespaces
        .range(after.saturating_add(1)..)
        .map(|(id, _)| *id)
        .take(1024)
        .enumerate()
    {
        put32(&mut b, i * 4, id);
    }
    b
}

/// Namespace identification descriptors (figure 278).
pub fn descriptors(ns: &Namespace) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    let mut at = 0;
    let mut add = |kind: u8, id: &[u8]| {
        b[at] = kind;
        b[at + 1] = id.len() as u8;
        b[at + 4..at + 4 + id.len()].copy_from_slice(id);
        at += 4 + id.len();
    };
    add(1, &ns.ids.eui64);
    add(2, &ns.ids.nguid);
    add(3, &ns.ids.uuid);
    add(4, &[0]); // command set: NVM
    b
}
