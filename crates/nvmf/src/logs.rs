//! Log pages (NVMe Base 2.0, 5.16.1): error information, SMART / health,
//! the changed namespace list, and asymmetric namespace access.

use std::sync::atomic::Ordering;

use crate::controller::Controller;
use crate::identify::ANA_GROUP;
use crate::subsystem::Subsystem;
use crate::wire::{put16, put32, put64};

/// Error information: 64 bytes an entry, newest first (figure 205).
pub fn errors(ctrl: &Controller) -> Vec<u8> {
    let entries = ctrl.errors();
    let mut b = vec![0u8; 64 * crate::controller::ERROR_LOG_ENTRIES];
    for (i, e) in entries.iter().enumerate() {
        let at = i * 64;
        put64(&mut b, at, e.count);
        put16(&mut b, at + 8, e.sqid);
        put16(&mut b, at + 10, e.cid);
        put16(&mut b, at + 12, e.status.0 << 1);
        put16(&mut b, at + 14, 0xFFFF); // parameter error location: none
        put64(&mut b, at + 16, e.lba);
        put32(&mut b, at + 24, e.nsid);
    }
    b
}

fn put128(b: &mut [u8], at: usize, v: u64) {
    put64(b, at, v);
}

/// SMART / health information for the controller (figure 207).
pub fn smart(ctrl: &Controller, sub: &Subsystem) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    let c = &ctrl.counters;
    let read_only = sub
        .namespaces
        .values()
        .any(|n| n.backing.device().capabilities().read_only);
    b[0] = u8::from(read_only) << 3; // critical warning: read-only media
    put16(&mut b, 1, 0); // composite temperature: not reported
    b[3] = 100; // available spare
    b[4] = 10;
    // Data units are thousands of 512-byte units, rounded up.
    let units = |bytes: u64| (bytes / 512).div_ceil(1000);
    put128(&mut b, 32, units(c.bytes_read.load(Ordering::Relaxed)));
    put128(&mut b, 48, units(c.bytes_written.load(Ordering::Relaxed)));
    put128(&mut b, 64, c.reads.load(Ordering::Relaxed));
    put128(&mut b, 80, c.writes.load(Ordering::Relaxed));
    let hours = ctrl.since.elapsed().map_or(0, |d| d.as_secs() / 3600);
    put128(&mut b, 128, hours);
    put128(&mut b, 160, c.media_errors.load(Ordering::Relaxed));
    put128(&mut b, 176, ctrl.errors().first().map_or(0, |e| e.count));
    b
}

/// The changed namespace list: 1024 ids (figure 209).
pub fn changed_namespaces(ctrl: &Controller, retain: bool) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for (i, id) in ctrl.changed_namespaces(retain).iter().enumerate() {
        put32(&mut b, i * 4, *id);
    }
    b
}

/// ANA state: optimized, the one state this target reports for now.
const ANA_OPTIMIZED: u8 = 0x01;

/// Asymmetric namespace access (figure 218): one group holding every
/// namespace; `groups_only` leaves the namespace lists out.
pub fn ana(ctrl: &Controller, sub: &Subsystem, groups_only: bool) -> Vec<u8> {
    let ids: Vec<u32> = if groups_only {
        Vec::new()
    } else {
        sub.namespaces.keys().copied().collect()
    };
    let mut b = vec![0u8; 16 + 32 + 4 * ids.len()];
    put64(&mut b, 0, ctrl.ana_changes());
    put16(&mut b, 8, 1);
    put32(&mut b, 16, ANA_GROUP);
    put32(&mut b, 20, ids.len() as u32);
    put64(&mut b, 24, ctrl.ana_changes());
    b[32] = ANA_OPTIMIZED;
    for (i, id) in ids.iter().enumerate() {
        put32(&mut b, 48 + 4 * i, *id);
    }
    b
}
