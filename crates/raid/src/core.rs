//! The state an array's I/O paths and its background worker share:
//! members by slot, spares, the event counter, stripe locks, the bitmap.

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::bitmap::{write_image_to, Bitmap, RegionSet};
use crate::geometry::Geometry;
use crate::journal::Journal;
use crate::locks::StripeLocks;
use crate::log::Log;
use crate::member::{Member, SyncState};
use crate::recent::Clock;
use crate::superblock::{Superblock, SPARE_SLOT};

/// Tunables of a running array.
#[derive(Clone, Debug)]
pub struct RaidOptions {
    /// Bytes per chunk (stripe unit); a multiple of 4096.
    pub chunk: u64,
    /// Bytes of each member covered by one write-intent bitmap bit (at
    /// least; grown until the bitmap fits its area).
    pub bitmap_region: u64,
    /// Rebuild and resync speed, bytes per second of member data: never
    /// slower than `min` (even under foreground load), never faster than
    /// `max`; in between only while no foreground I/O arrives.
    pub sync_speed_min: u64,
    pub sync_speed_max: u64,
    /// At create: the members already agree (all zeros), skip the initial
    /// resync.
    pub assume_clean: bool,
    /// A member I/O slower than this fails the member (`None`: no limit).
    pub member_timeout: Option<std::time::Duration>,
    /// At create, RAID5/6: slots of the partial parity log that closes
    /// the write hole (0: no log, the hole stays open).
    pub log_slots: u32,
    /// A check scrub this long after assembly or the last scrub (`None`:
    /// only by hand).
    pub scrub_every: Option<std::time::Duration>,
}

impl Default for RaidOptions {
    fn default() -> Self {
        RaidOptions {
            chunk: 64 << 10,
            bitmap_region: 4 << 20,
            sync_speed_min: 1 << 20,
            sync_speed_max: 200 << 20,
            assume_clean: false,
            log_slots: 64,
            member_timeout: None,
            scrub_every: None,
        }
    }
}

/// What the worker is doing, for status.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    pub kind: &'static str,
    pub slot: Option<usize>,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub bytes_per_sec: u64,
}

/// Sizes of the last bitmap-driven resyncs, for status.
#[derive(Clone, Debug, Default)]
pub struct SyncReport {
    /// After an unclean stop: bytes per member resynced (dirty regions).
    pub last_resync_bytes: Option<u64>,
    /// A member re-added after an absence: bytes it caught up.
    pub last_catch_up_bytes: Option<u64>,
    pub last_scrub: Option<crate::scrub::ScrubReport>,
}

pub struct Core {
    pub geo: Geometry,
    pub array_id: u128,
    pub options: RaidOptions,
    pub slots: RwLock<Vec<Option<Arc<Member>>>>,
    pub spares: Mutex<Vec<Arc<Member>>>,
    /// The event counter, and the events value when the bitmap began
    /// keeping bits for an absent member; its lock orders superblock
    /// writes.
    pub events: Mutex<(u64, u64)>,
    /// The id of the device owning each slot (0: none known). A slot
    /// emptied by `raid remove` keeps its last owner, which may come
    /// back; a spare rebuilt into a slot takes it over.
    pub roster: Mutex<Vec<u128>>,
    pub locks: StripeLocks,
    pub bitmap: Bitmap,
    /// The partial parity log (RAID5/6 unless disabled).
    pub log: Option<Log>,
    /// The atomic write journal (none on arrays made before it).
    pub journal: Option<Journal>,
    /// Where the journal starts on each member.
    pub journal_offset: u64,
    /// Where member data starts.
    pub data_offset: u64,
    pub log_slots: u32,
    /// Regions that must be resynced (after an unclean stop or create).
    pub resync: Mutex<RegionSet>,
    pub read_turn: AtomicUsize,
    /// Foreground requests served, for the sync throttle.
    pub foreground_ops: AtomicU64,
    /// Time for the members' recent I/O figures.
    pub clock: Arc<Clock>,
    pub failures: AtomicU64,
    pub progress: Mutex<Option<Progress>>,
    /// `sync_speed_min` and `sync_speed_max` as they are now: options at
    /// first, changeable while the array runs.
    pub sync_speed: Mutex<(u64, u64)>,
    /// When the last scrub ended, as the superblocks record it (at
    /// creation, or assembly of an array with none recorded, the start).
    pub last_scrub_at: Mutex<std::time::SystemTime>,
    /// When the last scrub ended, for the superblocks (milliseconds since
    /// the epoch; 0 before any, which keeps an older superblock version).
    pub last_scrub_ms: AtomicU64,
    pub report: Mutex<SyncReport>,
    /// Wakes the worker: something changed.
    pub wake: Condvar,
    pub wake_lock: Mutex<bool>,
    pub stop: std::sync::atomic::AtomicBool,
}

impl Core {
    pub fn members(&self) -> Vec<Option<Arc<Member>>> {
        self.slots.read().clone()
    }

    pub fn region_rows(&self) -> u64 {
        self.bitmap.region_rows
    }

    /// Whether the in-sync members still hold all the data.
    pub fn survives(&self) -> bool {
        let lost: Vec<bool> = self
            .members()
            .iter()
            .map(|m| m.as_ref().is_none_or(|m| !m.is_in_sync()))
            .collect();
        self.geo.survives(&lost)
    }

    /// Every slot holds an in-sync member.
    pub fn whole(&self) -> bool {
        self.members()
            .iter()
            .all(|m| m.as_ref().is_some_and(|m| m.is_in_sync()))
    }

    /// Applies the array's member settings to a member joining it.
    pub fn adopt(&self, m: &Member) {
        let nanos = self
            .options
            .member_timeout
            .map_or(0, |t| t.as_nanos() as u64);
        m.timeout_nanos.store(nanos, Ordering::Relaxed);
        m.stats.recent.set_clock(&self.clock);
    }

    pub fn kick(&self) {
        *self.wake_lock.lock() = true;
        self.wake.notify_all();
    }

    /// Marks `who`, the member in `slot` when its I/O began, failed after
    /// `err`, records the change on the others, and lets the worker look
    /// for a spare. A member that has left the slot meanwhile (a spare
    /// took it) changes nothing but itself.
    pub fn fail_member(&self, slot: usize, who: &Member, err: &io::Error) {
        if who.released.load(Ordering::SeqCst) {
            // The I/O of a released member that failed was its
            // replacement's, which holds the slot now.
            if let Some(r) = who.replacement() {
                return self.fail_member(slot, &r, err);
            }
        }
        {
            let mut st = who.state.write();
            if matches!(*st, SyncState::Failed) {
                return;
            }
            *st = SyncState::Failed;
        }
        let current = self.slots.read()[slot].clone();
        if !current.is_some_and(|c| std::ptr::eq(Arc::as_ptr(&c), who)) {
            return;
        }
        self.failures.fetch_add(1, Ordering::Relaxed);
        tracing::error!(member = %who.name(), slot, error = %err, "RAID member failed");
        self.promote_replacement(slot, who);
        self.membership_changed();
    }

    /// After any change of membership: bitmap bits are kept while some
    /// slot misses writes, and every live member records the new events.
    pub fn membership_changed(&self) {
        if !self.survives() {
            // Failed beyond redundancy: the members keep the superblocks
            // of the last state that served, so the array reassembles
            // from them (the last failures were most likely not the
            // disks' but a power cut's or a controller's).
            tracing::error!("RAID array failed: more members lost than its redundancy");
            self.kick();
            return;
        }
        let whole = self.whole();
        {
            let mut ev = self.events.lock();
            if !whole && !self.bitmap_keeping() {
                ev.1 = ev.0;
            } else if whole {
                // The bits are cleared from now on: no device absent
                // before this change can catch up from them.
                ev.1 = ev.0 + 1;
            }
        }
        self.bitmap.set_keep(!whole);
        self.write_superblocks();
        self.kick();
    }

    fn bitmap_keeping(&self) -> bool {
        self.bitmap.keeping()
    }

    /// The superblock of `member` in `slot`.
    pub fn superblock_for(
        &self,
        member: &Member,
        slot: u32,
        recovering: bool,
        events: (u64, u64),
    ) -> Superblock {
        Superblock {
            array_id: self.array_id,
            level: self.geo.level,
            members: self.geo.members as u32,
            chunk: self.geo.chunk,
            rows: self.geo.rows,
            region_rows: self.region_rows(),
            slot,
            recovering,
            replacement: false,
            released: false,
            events: events.0,
            keep_since: events.1,
            log_slots: self.log_slots,
            journal_slots: self.journal.as_ref().map_or(0, |j| j.slots),
            journal_max: self.journal.as_ref().map_or(0, |j| j.max_bytes),
            journal_floor: self.journal.as_ref().map_or(0, |j| j.floor()),
            last_scrub: self.last_scrub_ms.load(Ordering::Relaxed),
            member_id: member.id,
            roster: self.roster.lock().clone(),
        }
    }

    /// Bumps the event counter and writes every live member's and spare's
    /// superblock; a member that cannot take it fails.
    pub fn write_superblocks(&self) {
        loop {
            let mut newly_failed = Vec::new();
            {
                let mut ev = self.events.lock();
                ev.0 += 1;
                let events = *ev;
                {
                    // Whoever holds a slot owns it, failed or not.
                    let mut roster = self.roster.lock();
                    for (slot, m) in self.members().iter().enumerate() {
                        if let Some(m) = m {
                            roster[slot] = m.id;
                        }
                    }
                }
                for (slot, m) in self.members().iter().enumerate() {
                    let Some(m) = m else { continue };
                    let recovering = match &*m.state.read() {
                        SyncState::Failed => continue,
                        SyncState::Recovering { .. } => true,
                        SyncState::InSync => false,
                    };
                    let sb = self.superblock_for(m, slot as u32, recovering, events);
                    if let Err(e) = sb.write_to(&*m.dev) {
                        newly_failed.push((slot, e));
                    }
                    if let Some(r) = m.replacement().filter(|r| !r.is_failed()) {
                        let sb = Superblock {
                            recovering: true,
                            replacement: true,
                            ..self.superblock_for(&r, slot as u32, true, events)
                        };
                        if let Err(e) = sb.write_to(&*r.dev) {
                            tracing::error!(replacement = %r.name(), error = %e, "RAID replacement failed");
                            *r.state.write() = SyncState::Failed;
                        }
                    }
                }
                for s in self.spares.lock().iter() {
                    let sb = self.superblock_for(s, SPARE_SLOT, false, events);
                    if let Err(e) = sb.write_to(&*s.dev) {
                        tracing::warn!(spare = %s.name(), error = %e, "spare superblock write failed");
                    }
                }
            }
            if newly_failed.is_empty() {
                return;
            }
            for (slot, e) in newly_failed {
                let m = self.slots.read()[slot].clone();
                if let Some(m) = m {
                    *m.state.write() = SyncState::Failed;
                    self.failures.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(member = %m.name(), slot, error = %e, "RAID member failed");
                }
            }
            self.bitmap.set_keep(true);
            if !self.survives() {
                return;
            }
        }
    }

    /// Writes a bitmap image to every live member; members that fail are
    /// returned, to be failed once the bitmap lock is released.
    pub fn write_bitmap(
        &self,
        image: &[u8],
        fua: bool,
        failed: &Mutex<Vec<(usize, Arc<Member>, io::Error)>>,
    ) -> io::Result<()> {
        let mut written = 0;
        for (slot, m) in self.members().iter().enumerate() {
            let Some(m) = m else { continue };
            if m.is_failed() {
                continue;
            }
            match write_image_to(std::slice::from_ref(&m.dev), image, fua) {
                Ok(()) => written += 1,
                Err(e) => failed.lock().push((slot, m.clone(), e)),
            }
            // A replacement carries the bits too, ready for its swap.
            if let Some(r) = m.replacement().filter(|r| !r.is_failed()) {
                if let Err(e) = write_image_to(std::slice::from_ref(&r.dev), image, fua) {
                    tracing::error!(replacement = %r.name(), error = %e, "RAID replacement failed");
                    *r.state.write() = SyncState::Failed;
                }
            }
        }
        if written == 0 {
            return Err(io::Error::other(
                "no RAID member took the write-intent bitmap",
            ));
        }
        Ok(())
    }

    /// Runs `f` with a bitmap writer, then fails the members it could not
    /// write to.
    pub fn with_bitmap_writer<T>(
        &self,
        f: impl FnOnce(&dyn Fn(&[u8], bool) -> io::Result<()>) -> io::Result<T>,
    ) -> io::Result<T> {
        let failed = Mutex::new(Vec::new());
        let writer = |image: &[u8], fua: bool| self.write_bitmap(image, fua, &failed);
        let r = f(&writer);
        for (slot, m, e) in failed.into_inner() {
            self.fail_member(slot, &m, &e);
        }
        r
    }
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn unix_millis(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The error of I/O the array can no longer serve.
pub fn array_failed() -> io::Error {
    io::Error::other("RAID array has lost more members than its redundancy")
}
