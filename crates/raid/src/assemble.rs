//! Assembling a [`RaidArray`] from devices that carry its superblock:
//! read the superblocks, place each device in its slot, check that the
//! members can serve, build the core from what they recorded, and replay
//! the logs before any I/O.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use block::BlockDevice;

use crate::array::{name_of, AssembleError, RaidArray};
use crate::bitmap::{read_bitmap, Bitmap, RegionSet};
use crate::core::{Core, RaidOptions};
use crate::force::{force_in, forceable, Forced, ForcedMember, Stale};
use crate::geometry::Geometry;
use crate::io_atomic::Scan;
use crate::journal::Journal;
use crate::member::{Member, SyncState};
use crate::replace::place_replacements;
use crate::superblock::Superblock;

/// A device given for assembly and the superblock read from it.
struct Found {
    dev: Arc<dyn BlockDevice>,
    name: String,
    sb: Superblock,
}

/// What the members at the newest events agree on. Every device is
/// judged against it, so a stale member cannot speak for the array.
struct Newest {
    /// The first member's superblock: the geometry every device shares.
    reference: Superblock,
    events: u64,
    keep_since: u64,
    /// Who owns each slot.
    roster: Vec<u128>,
    /// Journal records below it are void.
    journal_floor: u64,
}

/// The devices sorted by what their superblocks say they are.
struct Placed {
    slots: Vec<Option<Arc<Member>>>,
    spares: Vec<Arc<Member>>,
    /// Unfinished replacements: (slot, device, name).
    replacements: Vec<(usize, Arc<dyn BlockDevice>, String)>,
    /// Stale members a forced assembly may take as in sync.
    stale: Vec<Stale>,
    /// Stale members it may not.
    left_out: Vec<Arc<dyn BlockDevice>>,
}

impl RaidArray {
    /// Puts an array together from devices carrying its superblock, in
    /// any order: members by their slot, spares as spares. Refuses a
    /// device of another array, one that missed events, or too few.
    pub fn assemble(
        devices: Vec<Arc<dyn BlockDevice>>,
        options: RaidOptions,
    ) -> Result<RaidArray, AssembleError> {
        Self::assemble_with(devices, options, false).map(|f| f.array)
    }

    /// [`RaidArray::assemble`] that, when the members at the newest
    /// events are too few, takes the freshest stale members as in sync
    /// until the array can serve (see [`crate::force`]). Stale members not
    /// needed (or not forceable) are left out, for the caller to re-add.
    pub fn assemble_forced(
        devices: Vec<Arc<dyn BlockDevice>>,
        options: RaidOptions,
    ) -> Result<Forced, AssembleError> {
        Self::assemble_with(devices, options, true)
    }

    fn assemble_with(
        devices: Vec<Arc<dyn BlockDevice>>,
        options: RaidOptions,
        force: bool,
    ) -> Result<Forced, AssembleError> {
        let found = read_superblocks(devices)?;
        let newest = Newest::of(&found)?;
        let geo = newest.reference.geometry();
        let data_offset = newest.reference.data_offset();
        let Placed {
            mut slots,
            spares,
            replacements,
            stale,
            mut left_out,
        } = place(&found, &newest, force)?;
        // Forced members go in before the replacements are placed, which
        // then copy beside them as beside any in-sync member.
        let forced = force_in(
            &geo,
            &mut slots,
            stale,
            (newest.events, data_offset),
            &mut left_out,
        );
        let replacements = place_replacements(&mut slots, replacements, data_offset)?;
        check_survives(&geo, &slots)?;
        let mut core = build_core(&found, &newest, options, (slots, spares))?;
        let scan = replay_logs(&mut core, &newest)?;
        let core = Arc::new(core);
        resume_replacements(&core, replacements);
        record_assembly(&core, &forced);
        let mut array = RaidArray::start(core);
        array.forced = forced;
        array.replay_journal(scan)?;
        Ok(Forced { array, left_out })
    }
}

/// Every device's superblock, before any is judged: a device without
/// one refuses the whole assembly.
fn read_superblocks(devices: Vec<Arc<dyn BlockDevice>>) -> Result<Vec<Found>, AssembleError> {
    let mut found = Vec::new();
    for dev in devices {
        let name = name_of(&*dev);
        match Superblock::read_from(&*dev)? {
            Ok(Some(sb)) => found.push(Found { dev, name, sb }),
            Ok(None) => return Err(AssembleError::NoSuperblock(name)),
            Err(e) => return Err(AssembleError::BadSuperblock(name, e)),
        }
    }
    Ok(found)
}

impl Newest {
    fn of(found: &[Found]) -> Result<Newest, AssembleError> {
        let Some(first) = found.iter().find(|f| !f.sb.is_spare()) else {
            return Err(AssembleError::Invalid("no member devices given".into()));
        };
        let reference = first.sb.clone();
        let events = found
            .iter()
            .filter(|f| !f.sb.is_spare())
            .map(|f| f.sb.events)
            .max()
            .unwrap_or(0);
        let keep_since = found
            .iter()
            .filter(|f| f.sb.events == events)
            .map(|f| f.sb.keep_since)
            .max()
            .unwrap_or(0);
        let current = || {
            found
                .iter()
                .filter(move |f| !f.sb.is_spare() && f.sb.events == events)
        };
        let roster = current()
            .filter(|f| f.sb.array_id == reference.array_id)
            .map(|f| f.sb.roster.clone())
            .max_by_key(|r| r.iter().filter(|id| **id != 0).count())
            .unwrap_or_default();
        let journal_floor = current().map(|f| f.sb.journal_floor).max().unwrap_or(0);
        Ok(Newest {
            reference,
            events,
            keep_since,
            roster,
            journal_floor,
        })
    }
}

/// Puts each device where its superblock says: a member in its slot, a
/// spare among the spares, a replacement beside its slot, a stale member
/// aside for forcing. Refuses a device that does not belong.
fn place(found: &[Found], newest: &Newest, force: bool) -> Result<Placed, AssembleError> {
    let reference = &newest.reference;
    let geo = reference.geometry();
    let data_offset = reference.data_offset();
    let mut placed = Placed {
        slots: vec![None; geo.members],
        spares: Vec::new(),
        replacements: Vec::new(),
        stale: Vec::new(),
        left_out: Vec::new(),
    };
    for Found { dev, name, sb } in found {
        if sb.array_id != reference.array_id {
            return Err(AssembleError::Foreign(
                name.clone(),
                sb.array_id,
                reference.array_id,
            ));
        }
        if !same_layout(sb, reference) {
            return Err(AssembleError::Geometry(name.clone()));
        }
        if sb.is_spare() {
            placed.spares.push(Arc::new(
                Member::new(dev.clone(), name.clone(), SyncState::InSync, data_offset)
                    .with_id(sb.member_id),
            ));
            continue;
        }
        if sb.released {
            return Err(AssembleError::Released(name.clone()));
        }
        if sb.events < newest.events {
            if !force {
                return Err(AssembleError::Stale(name.clone(), sb.events, newest.events));
            }
            if forceable(sb, &geo) && sb.owns_slot(&newest.roster) {
                let stale = (dev.clone(), name.clone(), sb.slot as usize, sb.events);
                placed.stale.push(stale);
            } else {
                placed.left_out.push(dev.clone());
            }
            continue;
        }
        let slot = sb.slot as usize;
        if slot >= geo.members {
            return Err(AssembleError::Invalid(format!(
                "{name} has slot {slot} of {}",
                geo.members
            )));
        }
        if sb.replacement {
            placed.replacements.push((slot, dev.clone(), name.clone()));
            continue;
        }
        if !sb.owns_slot(&newest.roster) {
            return Err(AssembleError::Superseded(name.clone(), sb.slot, None));
        }
        if let Some(other) = &placed.slots[slot] {
            return Err(AssembleError::DuplicateSlot(
                name.clone(),
                sb.slot,
                other.name(),
            ));
        }
        let state = if sb.recovering {
            SyncState::Recovering {
                done_rows: 0,
                stale: None,
            }
        } else {
            SyncState::InSync
        };
        placed.slots[slot] = Some(Arc::new(
            Member::new(dev.clone(), name.clone(), state, data_offset).with_id(sb.member_id),
        ));
    }
    Ok(placed)
}

/// Whether `sb` lays out the array as `reference` does.
fn same_layout(sb: &Superblock, reference: &Superblock) -> bool {
    sb.geometry() == reference.geometry()
        && sb.region_rows == reference.region_rows
        && sb.log_slots == reference.log_slots
        && sb.journal_slots == reference.journal_slots
        && sb.journal_max == reference.journal_max
}

/// Refuses members too few to serve the data, naming the missing slots.
fn check_survives(geo: &Geometry, slots: &[Option<Arc<Member>>]) -> Result<(), AssembleError> {
    let lost: Vec<bool> = slots
        .iter()
        .map(|s| s.as_ref().is_none_or(|m| !m.is_in_sync()))
        .collect();
    if geo.survives(&lost) {
        return Ok(());
    }
    let missing = lost
        .iter()
        .enumerate()
        .filter(|(_, l)| **l)
        .map(|(i, _)| i)
        .collect();
    Err(AssembleError::TooFew(missing))
}

/// The core, with what the members recorded before the stop: dirty
/// regions, events, slot owners and when the last scrub ended.
fn build_core(
    found: &[Found],
    newest: &Newest,
    options: RaidOptions,
    members: (Vec<Option<Arc<Member>>>, Vec<Arc<Member>>),
) -> Result<Core, AssembleError> {
    let reference = &newest.reference;
    let geo = reference.geometry();
    // The bits of every in-sync member: any of them may have been the
    // one written last before the stop.
    let regions = geo.rows.div_ceil(reference.region_rows);
    let mut dirty = RegionSet::new(regions);
    for m in members.0.iter().flatten().filter(|m| m.is_in_sync()) {
        dirty.union(&read_bitmap(&*m.dev, regions)?);
    }
    let resync = dirty.clone();
    let bitmap = Bitmap::new(reference.region_rows, geo.rows, dirty);
    let core = Core::new(
        geo,
        reference.array_id,
        options,
        members,
        bitmap,
        resync,
        (
            newest.events,
            reference.log_slots,
            reference.journal_slots,
            reference.journal_max,
        ),
    );
    core.events.lock().1 = newest.keep_since;
    {
        let mut owners = core.roster.lock();
        for (slot, id) in newest.roster.iter().enumerate().take(owners.len()) {
            if owners[slot] == 0 {
                owners[slot] = *id;
            }
        }
    }
    // The scrub schedule goes on from the last scrub any member saw.
    if let Some(last) = found
        .iter()
        .map(|f| f.sb.last_scrub)
        .max()
        .filter(|t| *t > 0)
    {
        *core.last_scrub_at.lock() = std::time::UNIX_EPOCH + std::time::Duration::from_millis(last);
        core.last_scrub_ms.store(last, Ordering::Relaxed);
    }
    Ok(core)
}

/// Before any I/O: rows a cut left half-written are made whole from the
/// partial parity log, and the atomic write journal is read back. Its
/// live records are held and returned, to be replayed through the
/// running array.
fn replay_logs(core: &mut Core, newest: &Newest) -> Result<Scan, AssembleError> {
    let log_slots = newest.reference.log_slots;
    if log_slots > 0 {
        let (log, sectors) = core.replay_log(log_slots)?;
        if sectors > 0 {
            tracing::info!(sectors, "RAID partial parity log replayed");
        }
        core.log = Some(log);
    }
    let scan = core.scan_journal(newest.journal_floor);
    if let Some(j) = &mut core.journal {
        *j = Journal::new(j.slots, j.max_bytes, scan.top + 2);
        for (seq, _, _) in &scan.replay {
            j.hold(*seq);
        }
    }
    Ok(scan)
}

/// An unfinished replacement copies again from the start, beside the
/// member it replaces.
fn resume_replacements(core: &Core, replacements: Vec<(usize, Arc<Member>)>) {
    for (slot, new) in replacements {
        tracing::info!(replacement = %new.name(), slot, "RAID member replacement starts over");
        let old = core.slots.read()[slot]
            .clone()
            .expect("placed beside a member");
        *old.replacement.write() = Some(new);
    }
}

/// Records on the members who is in the array now.
fn record_assembly(core: &Core, forced: &[ForcedMember]) {
    let whole = core.whole();
    core.bitmap.set_keep(!whole);
    if !whole || !forced.is_empty() {
        // Whoever is missing now must come back as stale; a forced
        // member is current from now on.
        core.write_superblocks();
    }
    for f in forced {
        tracing::warn!(member = %f.name, slot = f.slot, events_behind = f.gap,
            "RAID member forced into the array: writes it missed are lost");
    }
}
