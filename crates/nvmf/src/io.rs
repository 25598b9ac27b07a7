//! NVM commands (NVM Command Set 1.0, 3) on a namespace's device, as
//! every transport over it runs them: each medium access holds its byte
//! range in the shared [`export::Backing`]'s locks, a write is forced to
//! stable storage when FUA asks or the shared write cache is off, and a
//! device error is translated once ([`crate::status::device_status`]).

use std::io;

use crate::capsule::Sqe;
use crate::controller::Counters;
use crate::status::{device_status, Status};
use crate::subsystem::Namespace;

pub const OP_FLUSH: u8 = 0x00;
pub const OP_WRITE: u8 = 0x01;
pub const OP_READ: u8 = 0x02;
pub const OP_COMPARE: u8 = 0x05;
pub const OP_WRITE_ZEROES: u8 = 0x08;
pub const OP_DSM: u8 = 0x09;

const FUA: u32 = 1 << 30;
const DEALLOCATE: u32 = 1 << 25;
const DSM_DEALLOCATE: u32 = 1 << 2;
const DSM_RANGE: usize = 16;

/// Data a command moves, known before any is moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    None,
    /// Bytes from the host.
    ToTarget(usize),
    /// Bytes to the host.
    ToHost(usize),
}

/// How a command ended: its status, the data for the host, and the
/// first block it failed at (for the error log).
#[derive(Debug, PartialEq, Eq)]
pub struct Done {
    pub status: Status,
    pub data: Vec<u8>,
    pub lba: u64,
}

fn status(status: Status) -> Done {
    Done {
        status,
        data: Vec::new(),
        lba: 0,
    }
}

/// The blocks a Read, Write, Compare or Write Zeroes names, in bytes,
/// checked against the namespace.
fn extent(ns: &Namespace, sqe: &Sqe) -> Result<(u64, u64), Status> {
    let slba = sqe.cdw10_11();
    let blocks = u64::from(sqe.cdw(12) & 0xFFFF) + 1;
    match slba.checked_add(blocks) {
        Some(end) if end <= ns.blocks() => {}
        _ => return Err(Status::LBA_OUT_OF_RANGE),
    }
    let bs = u64::from(ns.block_size);
    Ok((slba * bs, blocks * bs))
}

/// Whether `sqe` can run now without waiting: a plain read, write or
/// write zeroes whose bytes no one holds (nor a flush). A command that
/// would wait for another transport's exclusive holder must not wait in
/// the connection's task, whose runtime the holder may need.
pub fn runs_without_waiting(ns: &Namespace, sqe: &Sqe) -> bool {
    if sqe.fuse() != crate::capsule::Fuse::Normal {
        return false;
    }
    match sqe.opcode() {
        OP_FLUSH => true,
        OP_READ | OP_WRITE | OP_WRITE_ZEROES => extent(ns, sqe)
            .is_ok_and(|(offset, len)| ns.backing.locks.try_lock(offset, len, false).is_some()),
        _ => false,
    }
}

fn writable(ns: &Namespace) -> Result<(), Status> {
    if ns.backing.device().capabilities().read_only {
        return Err(Status::WRITE_PROTECTED);
    }
    Ok(())
}

/// What command `sqe` transfers, before it moves any data: refusals
/// that need no data come here (bad namespace, range, length).
pub fn transfer(ns: Option<&Namespace>, sqe: &Sqe, max: usize) -> Result<Transfer, Status> {
    let op = sqe.opcode();
    if !matches!(
        op,
        OP_FLUSH | OP_WRITE | OP_READ | OP_COMPARE | OP_WRITE_ZEROES | OP_DSM
    ) {
        return Err(Status::INVALID_OPCODE);
    }
    let Some(ns) = ns else {
        return Err(Status::INVALID_NAMESPACE);
    };
    let sgl_len = sqe.sgl().len as usize;
    let moved = match op {
        OP_READ | OP_WRITE | OP_COMPARE => {
            let (_, len) = extent(ns, sqe)?;
            if len as usize > max {
                return Err(Status::INVALID_FIELD);
            }
            if sgl_len != len as usize {
                return Err(Status::SGL_LENGTH_INVALID);
            }
            len as usize
        }
        OP_DSM => {
            let len = ((sqe.cdw(10) & 0xFF) as usize + 1) * DSM_RANGE;
            if sgl_len < len || sgl_len > 256 * DSM_RANGE {
                return Err(Status::SGL_LENGTH_INVALID);
            }
            sgl_len
        }
        OP_WRITE_ZEROES => {
            extent(ns, sqe)?;
            0
        }
        _ => 0,
    };
    if matches!(op, OP_WRITE | OP_WRITE_ZEROES) || op == OP_DSM && sqe.cdw(11) & DSM_DEALLOCATE != 0
    {
        writable(ns)?;
    }
    Ok(match op {
        OP_READ => Transfer::ToHost(moved),
        OP_WRITE | OP_COMPARE | OP_DSM => Transfer::ToTarget(moved),
        _ => Transfer::None,
    })
}

fn failed(e: io::Error, writing: bool, lba: u64, counters: &Counters) -> Done {
    let status = device_status(&e, writing);
    if matches!(status, Status::WRITE_FAULT | Status::UNRECOVERED_READ) {
        Counters::add(&counters.media_errors, 1);
    }
    tracing::debug!("nvmf: device call failed: {e}");
    Done {
        status,
        data: Vec::new(),
        lba,
    }
}

/// Runs NVM command `sqe` (checked by [`transfer`]) with `data` from the
/// host.
pub fn run(ns: &Namespace, sqe: &Sqe, data: &[u8], counters: &Counters) -> Done {
    let r = match sqe.opcode() {
        OP_READ => read(ns, sqe, counters),
        OP_WRITE => write(ns, sqe, data, counters),
        OP_COMPARE => compare(ns, sqe, data, false).map(|()| Vec::new()),
        OP_FLUSH => ns
            .backing
            .device()
            .flush()
            .map(|()| Vec::new())
            .map_err(|e| failed(e, true, 0, counters)),
        OP_WRITE_ZEROES => write_zeroes(ns, sqe, counters),
        OP_DSM => deallocate(ns, sqe, data, counters),
        _ => Err(status(Status::INVALID_OPCODE)),
    };
    match r {
        Ok(data) => Done {
            status: Status::SUCCESS,
            data,
            lba: 0,
        },
        Err(done) => done,
    }
}

fn read(ns: &Namespace, sqe: &Sqe, counters: &Counters) -> Result<Vec<u8>, Done> {
    let (offset, len) = extent(ns, sqe).map_err(status)?;
    let mut buf = vec![0; len as usize];
    let _held = ns.backing.locks.lock(offset, len, false);
    ns.backing
        .device()
        .read_at(&mut buf, offset)
        .map_err(|e| failed(e, false, sqe.cdw10_11(), counters))?;
    Counters::add(&counters.reads, 1);
    Counters::add(&counters.bytes_read, len);
    Ok(buf)
}

fn write(ns: &Namespace, sqe: &Sqe, data: &[u8], counters: &Counters) -> Result<Vec<u8>, Done> {
    let (offset, len) = extent(ns, sqe).map_err(status)?;
    let fua = ns.backing.force_unit_access(sqe.cdw(12) & FUA != 0);
    let _held = ns.backing.locks.lock(offset, len, false);
    ns.backing
        .device()
        .write_at(&data[..len as usize], offset, fua)
        .map_err(|e| failed(e, true, sqe.cdw10_11(), counters))?;
    Counters::add(&counters.writes, 1);
    Counters::add(&counters.bytes_written, len);
    Ok(Vec::new())
}

/// Compare: the blocks equal `data`. The caller of a fused Compare and
/// Write holds the range exclusively already (`held`).
fn compare(ns: &Namespace, sqe: &Sqe, data: &[u8], held: bool) -> Result<(), Done> {
    let (offset, len) = extent(ns, sqe).map_err(status)?;
    let mut buf = vec![0; len as usize];
    let _held = (!held).then(|| ns.backing.locks.lock(offset, len, false));
    ns.backing
        .device()
        .read_at(&mut buf, offset)
        .map_err(|e| failed(e, false, sqe.cdw10_11(), &Counters::default()))?;
    if buf[..] != data[..len as usize] {
        return Err(Done {
            status: Status::COMPARE_FAILURE,
            data: Vec::new(),
            lba: sqe.cdw10_11(),
        });
    }
    Ok(())
}

/// Whether deallocated blocks of the namespace's device read as zeros.
fn deallocated_reads_zero(ns: &Namespace) -> bool {
    let caps = ns.backing.device().capabilities();
    caps.discard && (caps.discard_zeroes || caps.thin)
}

fn write_zeroes(ns: &Namespace, sqe: &Sqe, counters: &Counters) -> Result<Vec<u8>, Done> {
    let (offset, len) = extent(ns, sqe).map_err(status)?;
    let fua = ns.backing.force_unit_access(sqe.cdw(12) & FUA != 0);
    let device = ns.backing.device();
    let _held = ns.backing.locks.lock(offset, len, false);
    let r = if sqe.cdw(12) & DEALLOCATE != 0 && deallocated_reads_zero(ns) {
        device.discard(offset, len)
    } else {
        device.write_zeroes(offset, len)
    };
    r.and_then(|()| if fua { device.flush() } else { Ok(()) })
        .map_err(|e| failed(e, true, sqe.cdw10_11(), counters))?;
    Ok(Vec::new())
}

/// Dataset Management: ranges with the deallocate attribute go to the
/// device's discard; other attributes are hints this target takes.
fn deallocate(
    ns: &Namespace,
    sqe: &Sqe,
    data: &[u8],
    counters: &Counters,
) -> Result<Vec<u8>, Done> {
    if sqe.cdw(11) & DSM_DEALLOCATE == 0 {
        return Ok(Vec::new());
    }
    let count = (sqe.cdw(10) & 0xFF) as usize + 1;
    let bs = u64::from(ns.block_size);
    let mut ranges = Vec::with_capacity(count);
    for r in data.chunks_exact(DSM_RANGE).take(count) {
        let blocks = u64::from(crate::wire::le32(r, 4));
        let slba = crate::wire::le64(r, 8);
        match slba.checked_add(blocks) {
            Some(end) if end <= ns.blocks() => ranges.push((slba * bs, blocks * bs)),
            _ => {
                return Err(Done {
                    status: Status::LBA_OUT_OF_RANGE,
                    data: Vec::new(),
                    lba: slba,
                })
            }
        }
    }
    let device = ns.backing.device();
    if !device.capabilities().discard {
        return Ok(Vec::new()); // a hint the device cannot take
    }
    for (offset, len) in ranges.into_iter().filter(|r| r.1 > 0) {
        let _held = ns.backing.locks.lock(offset, len, false);
        device
            .discard(offset, len)
            .map_err(|e| failed(e, true, offset / bs, counters))?;
    }
    Ok(Vec::new())
}

/// A fused Compare (`first`) and Write (`second`): the write happens
/// only if the compare matches, both under one exclusive hold of the
/// range (NVM Command Set 1.0, 3.2.1; Base 2.0, 3.4.2). The statuses
/// of the two commands.
pub fn compare_and_write(
    ns: &Namespace,
    first: (&Sqe, &[u8]),
    second: (&Sqe, &[u8]),
    counters: &Counters,
) -> (Status, Status) {
    let (cmp, wr) = (first.0, second.0);
    let same = cmp.cdw10_11() == wr.cdw10_11() && cmp.cdw(12) & 0xFFFF == wr.cdw(12) & 0xFFFF;
    if cmp.opcode() != OP_COMPARE || wr.opcode() != OP_WRITE || !same || cmp.nsid() != wr.nsid() {
        return (Status::INVALID_FIELD, Status::INVALID_FIELD);
    }
    let (offset, len) = match extent(ns, wr) {
        Ok(e) => e,
        Err(s) => return (s, Status::FUSED_FAILED),
    };
    let _held = ns.backing.locks.lock(offset, len, true);
    if let Err(d) = compare(ns, cmp, first.1, true) {
        return (d.status, Status::FUSED_FAILED);
    }
    let fua = ns.backing.force_unit_access(wr.cdw(12) & FUA != 0);
    match ns
        .backing
        .device()
        .write_at(&second.1[..len as usize], offset, fua)
    {
        Ok(()) => {
            Counters::add(&counters.writes, 1);
            Counters::add(&counters.bytes_written, len);
            (Status::SUCCESS, Status::SUCCESS)
        }
        Err(e) => (
            Status::SUCCESS,
            failed(e, true, wr.cdw10_11(), counters).status,
        ),
    }
}

#[cfg(test)]
#[path = "io_tests.rs"]
mod tests;
