//! The array's side of the atomic write journal ([`crate::journal`]):
//! an atomic write (record, write in place, retire), and the scan and
//! replay of live records at assembly.

use std::io;
use std::sync::Arc;

use block::{AtomicWrites, BlockDevice};

use crate::array::RaidArray;
use crate::core::{array_failed, Core};
use crate::journal::{self, decode_head, slot_bytes, Head, Kind, HEAD};
use crate::member::Member;
use crate::spread::spread;

/// What assembly found in the journal.
pub struct Scan {
    /// Records to replay, oldest first: (sequence number, offset, data).
    pub replay: Vec<(u64, u64, Vec<u8>)>,
    /// The highest sequence number seen, or the floor if higher.
    pub top: u64,
    /// Some member holds a record (live, void or torn): the slots are
    /// rewritten as retired once the replay is durable.
    pub dirty: bool,
}

impl Core {
    fn journal_slot_at(&self, slot: u32) -> u64 {
        let max = self.journal.as_ref().map_or(0, |j| j.max_bytes);
        self.journal_offset + slot as u64 * slot_bytes(max)
    }

    /// Writes `bytes` at `at` with FUA on every live member: a record
    /// there survives the loss of any member the level tolerates. A
    /// member that fails the write is failed.
    fn journal_write(&self, bytes: &[u8], at: u64) -> io::Result<()> {
        let live: Vec<(usize, Arc<Member>)> = self
            .members()
            .into_iter()
            .enumerate()
            .filter_map(|(slot, m)| Some((slot, m.filter(|m| !m.is_failed())?)))
            .collect();
        // Members that wait on their calls are written all at once, so
        // the record costs one FUA's wait, not one per member; members
        // that never wait are written in turn, cheaper than threads.
        let waits = live.iter().any(|(_, m)| m.dev.capabilities().may_block);
        let threads = if waits { live.len() } else { 1 };
        spread(live, threads, |(slot, m)| {
            if let Err(e) = m.dev.write_at(bytes, at, true) {
                self.fail_member(slot, &m, &e);
            }
            Ok(())
        })?;
        if !self.survives() {
            return Err(array_failed());
        }
        Ok(())
    }

    /// The newest valid copy of journal slot `slot` across the members,
    /// with its data if it is a record, and whether any copy is a record.
    fn newest_copy(&self, slot: u32, max: u64) -> (Option<(Head, Vec<u8>)>, bool) {
        let at = self.journal_slot_at(slot);
        let mut best: Option<(Head, Vec<u8>)> = None;
        let mut any_record = false;
        for m in self.members().iter().flatten().filter(|m| !m.is_failed()) {
            let mut block = vec![0u8; HEAD as usize];
            if let Err(e) = m.dev.read_at(&mut block, at) {
                tracing::warn!(member = %m.name(), error = %e, "unreadable journal slot");
                continue;
            }
            let Some(head) = decode_head(&block, self.array_id) else {
                continue;
            };
            let mut data = Vec::new();
            if head.kind == Kind::Record {
                any_record = true;
                if head.len as u64 > max {
                    continue;
                }
                data = vec![0u8; (head.len as usize).next_multiple_of(4096)];
                if m.dev.read_at(&mut data, at + HEAD).is_err() {
                    continue;
                }
                data.truncate(head.len as usize);
                if !head.verify(&block, &data) {
                    continue; // torn: the write never started in place
                }
            }
            if best.as_ref().is_none_or(|(b, _)| head.newer_than(b)) {
                best = Some((head, data));
            }
        }
        (best, any_record)
    }

    /// At assembly: the records a cut left live, newest copy of each
    /// slot across the members, those below `floor` void.
    pub fn scan_journal(&self, floor: u64) -> Scan {
        let Some(j) = &self.journal else {
            return Scan {
                replay: Vec::new(),
                top: floor,
                dirty: false,
            };
        };
        let mut live = Vec::new();
        let (mut top, mut dirty) = (floor, false);
        for slot in 0..j.slots {
            let (best, any_record) = self.newest_copy(slot, j.max_bytes);
            dirty |= any_record;
            let Some((head, data)) = best else { continue };
            top = top.max(head.seq);
            let inside = head
                .offset
                .checked_add(head.len as u64)
                .is_some_and(|e| e <= self.geo.size());
            if head.kind == Kind::Record && head.seq >= floor && inside {
                live.push((head.seq, head.offset, data));
            }
        }
        live.sort_by_key(|r| r.0);
        Scan {
            replay: live,
            top,
            dirty,
        }
    }
}

impl RaidArray {
    pub(crate) fn atomic_limits(&self) -> Option<AtomicWrites> {
        let j = self.core.journal.as_ref()?;
        Some(AtomicWrites::up_to(j.max_bytes))
    }

    /// Record, write in place, retire: see [`crate::journal`]. The write
    /// is stable when this returns, FUA or not (the record may only be
    /// retired once it is).
    pub(crate) fn write_atomic_journaled(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let core = &self.core;
        let (Some(journal), Some(limits)) = (&core.journal, self.atomic_limits()) else {
            return Err(block::atomic_unsupported());
        };
        self.check(offset, buf.len() as u64)?;
        if !limits.allows(offset, buf.len() as u64) {
            return Err(limits.refusal(offset, buf.len() as u64));
        }
        if buf.is_empty() {
            return Ok(());
        }
        if !core.survives() {
            return Err(array_failed());
        }
        let (slot, seq) = journal.take();
        let at = core.journal_slot_at(slot);
        // On an error below the slot stays taken: its record may be live
        // on some member, for the next assembly to replay.
        core.journal_write(&journal::encode(core.array_id, seq, offset, Some(buf)), at)?;
        self.write_at(buf, offset, true)?;
        core.journal_write(&journal::encode(core.array_id, seq, 0, None), at)?;
        journal.give_back(slot, seq);
        Ok(())
    }

    /// At assembly, before the array serves: writes the live records of
    /// `scan` in place again (idempotent), then retires every slot.
    pub(crate) fn replay_journal(&self, scan: Scan) -> io::Result<()> {
        let n = scan.replay.len();
        for (_, offset, data) in &scan.replay {
            self.write_at(data, *offset, true)?;
        }
        if n > 0 {
            tracing::info!(records = n, "RAID atomic write journal replayed");
        }
        if !scan.dirty {
            return Ok(());
        }
        let core = &self.core;
        let slots = core.journal.as_ref().map_or(0, |j| j.slots);
        let marker = journal::encode(core.array_id, scan.top + 1, 0, None);
        for slot in 0..slots {
            core.journal_write(&marker, core.journal_slot_at(slot))?;
        }
        if let Some(j) = &core.journal {
            for (seq, _, _) in &scan.replay {
                j.release(*seq);
            }
        }
        Ok(())
    }
}
