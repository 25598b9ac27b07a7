//! Manual membership changes: fail, remove, add, re-add (replace is in
//! `replace.rs`).

use std::io;
use std::sync::Arc;

use block::BlockDevice;

use crate::array::{AssembleError, RaidArray};
use crate::bitmap::write_image_to;
use crate::geometry::Level;
use crate::member::{Member, SyncState};
use crate::superblock::{Superblock, SPARE_SLOT};

impl RaidArray {
    /// Marks the member in `slot` failed, as an I/O error would.
    pub fn fail(&self, slot: usize) -> io::Result<()> {
        let m = self.slot_member(slot)?;
        self.core
            .fail_member(slot, &m, &io::Error::other("failed by the administrator"));
        Ok(())
    }

    /// Why failing the member in `slot` would take the array past its
    /// redundancy (its data unreadable), or `None` when it survives it
    /// (or has failed already). md refuses that without `--force` too.
    pub fn loss_if_failed(&self, slot: usize) -> Option<String> {
        let g = self.core.geo;
        let mut lost: Vec<bool> = self
            .core
            .members()
            .iter()
            .map(|m| m.as_ref().is_none_or(|m| !m.is_in_sync()))
            .collect();
        if !g.survives(&lost) || lost.get(slot).is_none_or(|l| *l) {
            return None;
        }
        lost[slot] = true;
        if g.survives(&lost) {
            return None;
        }
        let what = match g.level {
            Level::Raid0 => "its share of every stripe (RAID0 has no redundancy)".to_string(),
            Level::Raid1 | Level::Raid10 => {
                "the last in-sync copy of the chunks it holds".to_string()
            }
            Level::Raid5 | Level::Raid6 => format!(
                "a member the array cannot spare ({} of {} lost already)",
                lost.iter().filter(|l| **l).count() - 1,
                g.level.parity()
            ),
        };
        Some(format!(
            "slot {slot} holds {what}: failing it fails the array, whose data becomes \
             unreadable (its LUNs and exports answer MEDIUM ERROR / EIO)"
        ))
    }

    /// Takes the failed member out of `slot` and returns its device.
    pub fn remove(&self, slot: usize) -> io::Result<Arc<dyn BlockDevice>> {
        let m = self.slot_member(slot)?;
        if !m.is_failed() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot {slot} ({}) is active: fail it first", m.name()),
            ));
        }
        self.core.slots.write()[slot] = None;
        self.core.membership_changed();
        Ok(m.dev.clone())
    }

    /// Adds `dev` as a hot spare: it fills a failed or empty slot at once
    /// (a full rebuild), or waits for one.
    pub fn add(&self, dev: Arc<dyn BlockDevice>) -> io::Result<()> {
        self.can_add(&dev)?;
        let name = dev.describe();
        // A new id: whatever slot it held before, it comes in as a spare
        // with nothing the array trusts, and is rebuilt in full.
        let member = Member::new(dev, name, SyncState::InSync, self.core.data_offset);
        let events = *self.core.events.lock();
        self.core
            .superblock_for(&member, SPARE_SLOT, false, events)
            .write_to(&*member.dev)?;
        self.core.adopt(&member);
        self.core.spares.lock().push(Arc::new(member));
        self.core.kick();
        Ok(())
    }

    /// Whether `dev` could be added: not in the array yet, and large
    /// enough.
    pub fn can_add(&self, dev: &Arc<dyn BlockDevice>) -> io::Result<()> {
        let g = self.core.geo;
        if let Some(name) = self.core.holder_of(dev) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name} is already in this array"),
            ));
        }
        if dev.size() < self.core.data_offset + g.rows * g.chunk {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is too small for this array", dev.describe()),
            ));
        }
        Ok(())
    }

    /// Puts back a member that was absent or failed: if it was in sync
    /// when the bitmap began keeping bits, it catches up only the regions
    /// written since; otherwise it is rebuilt whole.
    pub fn re_add(&self, dev: Arc<dyn BlockDevice>) -> Result<(), AssembleError> {
        let name = dev.describe();
        let sb = match Superblock::read_from(&*dev)? {
            Ok(Some(sb)) => sb,
            Ok(None) => return Err(AssembleError::NoSuperblock(name)),
            Err(e) => return Err(AssembleError::BadSuperblock(name, e)),
        };
        let core = &self.core;
        if sb.array_id != core.array_id {
            return Err(AssembleError::Foreign(name, sb.array_id, core.array_id));
        }
        if sb.released {
            return Err(AssembleError::Released(name));
        }
        if sb.replacement {
            return Err(AssembleError::Invalid(format!(
                "{name} was a replacement that did not finish; add it as a spare"
            )));
        }
        let slot = sb.slot as usize;
        if sb.is_spare() || slot >= core.geo.members {
            return Err(AssembleError::Invalid(format!(
                "{name} was not a member; add it"
            )));
        }
        if !sb.owns_slot(&core.roster.lock()) {
            let holder = core.slots.read()[slot].as_ref().map(|m| m.name());
            return Err(AssembleError::Superseded(name, sb.slot, holder));
        }
        if let Some(m) = &core.slots.read()[slot] {
            if !m.is_failed() {
                return Err(AssembleError::DuplicateSlot(name, sb.slot, m.name()));
            }
        }
        let keep_since = core.events.lock().1;
        let stale = (!sb.recovering && core.bitmap.keeping() && sb.events >= keep_since)
            .then(|| core.bitmap.dirty());
        tracing::info!(member = %name, slot, bitmap = stale.is_some(), "re-adding RAID member");
        // Its bitmap must say what the others say before it takes writes.
        write_image_to(std::slice::from_ref(&dev), &core.bitmap.image(), true)?;
        let member = Member::new(
            dev,
            name,
            SyncState::Recovering {
                done_rows: 0,
                stale,
            },
            core.data_offset,
        )
        .with_id(sb.member_id);
        core.adopt(&member);
        core.slots.write()[slot] = Some(Arc::new(member));
        core.membership_changed();
        Ok(())
    }

    /// Blocks until no resync or rebuild is pending or running (or
    /// `timeout` passes); true when idle.
    /// Changes the resync and rebuild speed limits of the running array
    /// (bytes a second; see [`crate::RaidOptions`]), from the next step on.
    pub fn set_sync_speed(&self, min: u64, max: u64) -> io::Result<()> {
        if max == 0 || min > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("sync speed minimum {min} must be at most the maximum {max}, which must not be 0"),
            ));
        }
        *self.core.sync_speed.lock() = (min, max);
        self.core.kick();
        Ok(())
    }

    /// The resync and rebuild speed limits now: `(min, max)`.
    pub fn sync_speed(&self) -> (u64, u64) {
        *self.core.sync_speed.lock()
    }

    pub fn wait_idle(&self, timeout: std::time::Duration) -> bool {
        let until = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < until {
            if self.core.idle() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        self.core.idle()
    }

    pub(crate) fn slot_member(&self, slot: usize) -> io::Result<Arc<Member>> {
        self.core
            .slots
            .read()
            .get(slot)
            .cloned()
            .flatten()
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("slot {slot} is empty"))
            })
    }
}
