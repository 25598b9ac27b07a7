//! Member replacement the way md's `want_replacement` does it: the new
//! device is copied beside the member it replaces, which stays an active,
//! in-sync member serving reads and taking writes (its writes go to the
//! replacement too, see [`Member::write`]). Only when the copy is complete
//! and stable does the replacement take the slot and the old member leave,
//! its superblock marked released so that it never assembles again.
//! Redundancy is never lowered on the way. If the old member fails during
//! the copy, the replacement carries on in its slot as an ordinary
//! rebuild of what it has not got yet.
//!
//! The replacement's superblock names the slot it is copied into, so a
//! restart finds it and starts the copy again.

use std::io;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use block::BlockDevice;

use crate::array::{AssembleError, RaidArray};
use crate::bitmap::write_image_to;
use crate::core::Core;
use crate::member::{Member, SyncState};
use crate::pipeline::Plan;
use crate::rebuild::Batch;
use crate::recent::Origin;
use crate::superblock::Superblock;

impl RaidArray {
    /// Copies `dev` (a new device, or one of the array's hot spares) in
    /// beside the member in `slot`, to take its place when complete.
    pub fn replace(&self, slot: usize, dev: Arc<dyn BlockDevice>) -> io::Result<()> {
        let core = &self.core;
        let old = self.slot_member(slot)?;
        if !old.is_in_sync() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "slot {slot} ({}) is not in sync: fail it and let a spare rebuild it instead",
                    old.name()
                ),
            ));
        }
        if let Some(r) = old.replacement().filter(|r| !r.is_failed()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "slot {slot} ({}) is already being replaced by {}",
                    old.name(),
                    r.name()
                ),
            ));
        }
        // One of the spares, or a new device made a spare first.
        let spare = {
            let mut spares = core.spares.lock();
            spares
                .iter()
                .position(|s| Arc::ptr_eq(&s.dev, &dev))
                .map(|i| spares.remove(i))
        };
        let new = match spare {
            Some(s) => s,
            None if core.holder_of(&dev).is_some() => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is already in this array", dev.describe()),
                ))
            }
            None => {
                self.add(dev.clone())?;
                let mut spares = core.spares.lock();
                let i = spares
                    .iter()
                    .position(|s| Arc::ptr_eq(&s.dev, &dev))
                    .expect("just added");
                spares.remove(i)
            }
        };
        core.start_replacement(slot, &old, new)
    }

    /// The device of the hot spare named `name`, if there is one.
    pub fn spare_named(&self, name: &str) -> Option<Arc<dyn BlockDevice>> {
        self.core
            .spares
            .lock()
            .iter()
            .find(|s| s.name() == name)
            .map(|s| s.dev.clone())
    }
}

impl Core {
    /// Makes `new` the replacement of `old`, the member in `slot`: its
    /// bitmap and superblock say so before it takes any write.
    pub fn start_replacement(
        &self,
        slot: usize,
        old: &Arc<Member>,
        new: Arc<Member>,
    ) -> io::Result<()> {
        *new.state.write() = SyncState::Recovering {
            done_rows: 0,
            stale: None,
        };
        self.adopt(&new);
        if let Err(e) = write_image_to(std::slice::from_ref(&new.dev), &self.bitmap.image(), true) {
            return Err(io::Error::new(
                e.kind(),
                format!("{}: the bitmap write failed: {e}", new.name()),
            ));
        }
        tracing::info!(member = %old.name(), replacement = %new.name(), slot, "RAID member replacement started");
        *old.replacement.write() = Some(new);
        self.membership_changed();
        Ok(())
    }

    /// The slot and members of a replacement under way, if any.
    pub fn replacement_under_way(&self) -> Option<(usize, Arc<Member>, Arc<Member>)> {
        self.members()
            .into_iter()
            .enumerate()
            .find_map(|(slot, m)| {
                let m = m.filter(|m| !m.is_failed())?;
                let r = m.replacement()?;
                Some((slot, m, r))
            })
    }

    /// One step of the worker for replacements: drops one that failed, or
    /// copies one to the end and swaps it in. False when there is none.
    pub fn replace_step(&self) -> bool {
        let Some((slot, old, new)) = self.replacement_under_way() else {
            return false;
        };
        if new.is_failed() {
            // Waits for writes still going to it.
            *old.replacement.write() = None;
            tracing::warn!(member = %old.name(), replacement = %new.name(), slot, "RAID replacement dropped");
            *self.progress.lock() = None;
            self.membership_changed();
            return true;
        }
        if self.copy_replacement(slot, &old, &new) {
            self.swap_in(slot, &old, &new);
        }
        true
    }

    /// Copies `old`'s rows to `new` in batches, from where it stands,
    /// several batches in flight; true when every row is copied.
    fn copy_replacement(&self, slot: usize, old: &Arc<Member>, new: &Arc<Member>) -> bool {
        let start = match &*new.state.read() {
            SyncState::Recovering { done_rows, .. } => *done_rows,
            _ => return false,
        };
        let carry_on = || {
            !old.is_failed()
                && !new.is_failed()
                && old.replacement().is_some_and(|r| Arc::ptr_eq(&r, new))
        };
        let plan = Plan {
            kind: "replace",
            slot,
            rows: start..self.geo.rows,
            step: self.step_rows(),
            total: (self.geo.rows - start) * self.geo.chunk,
            needed: &|_| true,
            go_on: &carry_on,
        };
        let read = |rows: Range<u64>| self.read_own_rows(slot, old, rows);
        let write = |batch: Batch<'_>| self.write_copied(new, batch);
        // Not once `old` failed: `new` was promoted, and a rebuild of
        // what it has not got counts from then on.
        let advance = |to: u64| {
            let mut st = new.state.write();
            if !old.is_failed() {
                if let SyncState::Recovering { done_rows, .. } = &mut *st {
                    *done_rows = (*done_rows).max(to);
                }
            }
        };
        self.run_copy(&plan, &read, &write, &advance) && carry_on()
    }

    /// The name of the member, replacement or spare that is `dev`, if one
    /// is: a device is never put into the array twice.
    pub fn holder_of(&self, dev: &Arc<dyn BlockDevice>) -> Option<String> {
        let members: Vec<Arc<Member>> = self.members().into_iter().flatten().collect();
        let replacements = members.iter().filter_map(|m| m.replacement());
        let spares = self.spares.lock().clone();
        members
            .iter()
            .cloned()
            .chain(replacements)
            .chain(spares)
            .find(|m| Arc::ptr_eq(&m.dev, dev))
            .map(|m| m.name())
    }

    /// Locks the stripes with a chunk on `slot`'s rows `rows` and reads
    /// them from `old`; `None` if it failed (then the replacement carries
    /// on as a rebuild in its place).
    fn read_own_rows<'a>(
        &'a self,
        slot: usize,
        old: &Arc<Member>,
        rows: Range<u64>,
    ) -> Option<Batch<'a>> {
        let guards = self.lock_member_rows(slot, rows.clone());
        let mut chunks = vec![0u8; ((rows.end - rows.start) * self.geo.chunk) as usize];
        if let Err(e) = old.read_for(Origin::Background, &mut chunks, rows.start * self.geo.chunk) {
            drop(guards);
            self.fail_member(slot, old, &e);
            return None;
        }
        Some(Batch {
            rows,
            chunks,
            guards,
        })
    }

    /// Writes a copied batch to the replacement, then unlocks it; false
    /// if the replacement failed.
    fn write_copied(&self, new: &Member, batch: Batch<'_>) -> bool {
        if new.is_failed() {
            return false;
        }
        if let Err(e) = self.write_chunks(new, &batch) {
            tracing::error!(replacement = %new.name(), error = %e, "RAID replacement failed");
            *new.state.write() = SyncState::Failed;
            return false;
        }
        drop(batch.guards);
        true
    }

    /// The copy is complete: made stable (a flush of `old` flushes its
    /// replacement too), the replacement takes the slot, and `old` is
    /// released.
    fn swap_in(&self, slot: usize, old: &Arc<Member>, new: &Arc<Member>) {
        if self.flush_all().is_err() {
            return;
        }
        {
            // Under the slots' lock: a failure of `old` either came first
            // (and promoted `new` as a rebuild) or finds `new` in the slot.
            let mut slots = self.slots.write();
            if old.is_failed() || new.is_failed() {
                return;
            }
            if !slots[slot].as_ref().is_some_and(|m| Arc::ptr_eq(m, old)) {
                return;
            }
            *new.state.write() = SyncState::InSync;
            old.released.store(true, Ordering::SeqCst);
            slots[slot] = Some(new.clone());
        }
        *self.progress.lock() = None;
        tracing::info!(member = %old.name(), replacement = %new.name(), slot, "RAID member replaced");
        self.membership_changed();
        // After the others record the swap: a cut in between leaves `old`
        // stale, never a second in-sync member of the slot.
        let events = *self.events.lock();
        let sb = Superblock {
            released: true,
            ..self.superblock_for(old, slot as u32, false, events)
        };
        if let Err(e) = sb.write_to(&*old.dev) {
            tracing::warn!(member = %old.name(), error = %e, "released member's superblock write failed");
        }
        // Partial parity log entries written between the flush above and
        // the swap are on `old`'s log area only: a flush retires them.
        let _ = self.flush_all();
    }

    /// `old`, the member in `slot`, failed: its live replacement takes the
    /// slot and rebuilds what it has not got: the rows not yet copied,
    /// and the regions with writes in flight (a writer that found `old`
    /// in the slot a moment ago skips it now that it failed, and so
    /// misses the replacement too; the bitmap bit of its region is set).
    pub fn promote_replacement(&self, slot: usize, old: &Member) {
        let Some(new) = old.replacement().filter(|r| !r.is_failed()) else {
            return;
        };
        let rr = self.region_rows();
        let mut stale = self.bitmap.dirty();
        {
            let mut st = new.state.write();
            let done = match &*st {
                SyncState::Recovering { done_rows, .. } => *done_rows,
                _ => 0,
            };
            for region in done / rr..self.bitmap.regions {
                stale.set(region, true);
            }
            *st = SyncState::Recovering {
                done_rows: 0,
                stale: Some(stale),
            };
        }
        tracing::warn!(member = %old.name(), replacement = %new.name(), slot,
            "RAID member failed during its replacement: the replacement rebuilds in its place");
        *self.progress.lock() = None;
        self.slots.write()[slot] = Some(new);
    }

    /// Locks, in order, the stripes that have a chunk in `slot`'s member
    /// rows `rows`.
    pub fn lock_member_rows(
        &self,
        slot: usize,
        rows: Range<u64>,
    ) -> Vec<crate::locks::StripeGuard<'_>> {
        let g = &self.geo;
        let mut stripes: Vec<u64> = if g.is_parity() {
            rows.collect()
        } else {
            rows.map(|row| g.stripe_of_place(crate::geometry::Place { member: slot, row }))
                .filter(|k| *k < g.logical_chunks())
                .collect()
        };
        stripes.sort_unstable();
        stripes.dedup();
        stripes.into_iter().map(|s| self.locks.lock(s)).collect()
    }

    /// Rows a background step covers: 1 MiB of each member, less when
    /// the speed limit is low, so that the throttle paces smoothly.
    pub fn step_rows(&self) -> u64 {
        let bytes = crate::rebuild::STEP_BYTES.min(self.sync_speed.lock().1 / 8);
        (bytes / self.geo.chunk).max(1)
    }
}

/// Puts each replacement found at assembly back beside the in-sync
/// member of its slot (its copy starts over: what it holds is not
/// trusted), or into the slot when that member is gone, as a rebuild.
/// Returns the replacements to attach, by slot.
pub(crate) fn place_replacements(
    slots: &mut [Option<Arc<Member>>],
    found: Vec<(usize, Arc<dyn BlockDevice>, String)>,
    data_offset: u64,
) -> Result<Vec<(usize, Arc<Member>)>, AssembleError> {
    let mut attach: Vec<(usize, Arc<Member>)> = Vec::new();
    for (slot, dev, name) in found {
        if let Some((_, other)) = attach.iter().find(|(s, _)| *s == slot) {
            return Err(AssembleError::DuplicateSlot(
                name,
                slot as u32,
                other.name(),
            ));
        }
        let member = Arc::new(Member::new(
            dev,
            name,
            SyncState::Recovering {
                done_rows: 0,
                stale: None,
            },
            data_offset,
        ));
        match &slots[slot] {
            Some(m) if m.is_in_sync() => attach.push((slot, member)),
            Some(m) => {
                return Err(AssembleError::DuplicateSlot(
                    member.name(),
                    slot as u32,
                    m.name(),
                ))
            }
            None => slots[slot] = Some(member),
        }
    }
    Ok(attach)
}
