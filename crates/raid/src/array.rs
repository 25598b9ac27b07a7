//! [`RaidArray`]: the array as a [`BlockDevice`], and how it is created
//! on blank members (assembly from members that carry its superblock is
//! in `assemble.rs`).

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use block::{Allocation, BlockDevice, Capabilities};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::bitmap::{bitmap_bytes, write_image_to, Bitmap, RegionSet};
use crate::core::{array_failed, Core, RaidOptions};
use crate::force::ForcedMember;
use crate::geometry::{Geometry, Level};
use crate::io_stripes::RUN_BYTES;
use crate::journal::{Journal, JOURNAL_SLOTS, MAX_ATOMIC_BYTES};
use crate::locks::StripeLocks;
use crate::log::Log;
use crate::member::{Member, SyncState, Zeroing};
use crate::provision::reads_as_zeros;
use crate::spread::{spread, SPREAD_MIN_BYTES};
use crate::superblock::{data_offset, layout, BITMAP_OFFSET, LOG_OFFSET, MAX_MEMBERS};

/// Why members do not make an array.
#[derive(Debug, thiserror::Error)]
pub enum AssembleError {
    #[error("{0}: no RAID superblock")]
    NoSuperblock(String),
    #[error("{0}: unreadable RAID superblock: {1}")]
    BadSuperblock(String, String),
    #[error("{0} belongs to another array ({1:032x}, not {2:032x})")]
    Foreign(String, u128, u128),
    #[error("{0} is stale: it saw {1} events, the array {2}; re-add it to catch up")]
    Stale(String, u64, u64),
    #[error("{0} claims slot {1}, which {2} holds")]
    DuplicateSlot(String, u32, String),
    #[error("{0}'s geometry differs from the array's")]
    Geometry(String),
    #[error("too few members to serve the data: slots {0:?} are missing")]
    TooFew(Vec<usize>),
    #[error("{0} was replaced and released from the array")]
    Released(String),
    #[error("{0} no longer owns slot {1}: another device was rebuilt into it{}; \
             add it again as a spare to have it rebuilt in full", .2.as_ref().map(|h| format!(" (now {h})")).unwrap_or_default())]
    Superseded(String, u32, Option<String>),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A RAID array over member devices.
pub struct RaidArray {
    pub(crate) core: Arc<Core>,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Stale members a forced assembly took as in sync.
    pub(crate) forced: Vec<ForcedMember>,
}

pub(crate) fn name_of(dev: &dyn BlockDevice) -> String {
    dev.describe()
}

/// Chunk rows per bitmap bit: at least `region` bytes, and few enough
/// bits to fit the bitmap area.
fn region_rows_for(chunk: u64, rows: u64, region: u64) -> u64 {
    let mut rr = (region / chunk).max(1);
    while bitmap_bytes(rows.div_ceil(rr)) as u64 > LOG_OFFSET - BITMAP_OFFSET {
        rr *= 2;
    }
    rr
}

impl RaidArray {
    /// Makes a new array on `members` (in slot order) with hot `spares`,
    /// writing their superblocks and a clean bitmap. Unless
    /// `assume_clean`, the members are resynced in the background.
    pub fn create(
        level: Level,
        members: Vec<Arc<dyn BlockDevice>>,
        spares: Vec<Arc<dyn BlockDevice>>,
        options: RaidOptions,
    ) -> Result<RaidArray, AssembleError> {
        if members.len() < level.min_members() {
            return Err(AssembleError::Invalid(format!(
                "RAID{} needs at least {} members, got {}",
                level.number(),
                level.min_members(),
                members.len()
            )));
        }
        if members.len() > MAX_MEMBERS {
            return Err(AssembleError::Invalid(format!(
                "an array has at most {MAX_MEMBERS} members, got {}",
                members.len()
            )));
        }
        if options.chunk == 0 || !options.chunk.is_multiple_of(4096) {
            return Err(AssembleError::Invalid(
                "chunk must be a multiple of 4096".into(),
            ));
        }
        if options.chunk > 1 << 20 {
            return Err(AssembleError::Invalid("chunk must be at most 1 MiB".into()));
        }
        let log_slots = if level.parity() > 0 {
            options.log_slots
        } else {
            0
        };
        let data_offset = data_offset(options.chunk, log_slots);
        let smallest = members.iter().map(|m| m.size()).min().unwrap_or(0);
        let rows = smallest.saturating_sub(data_offset) / options.chunk;
        if rows == 0 {
            return Err(AssembleError::Invalid(
                "members are too small for one chunk".into(),
            ));
        }
        if let Some(s) = spares
            .iter()
            .find(|s| s.size() < data_offset + rows * options.chunk)
        {
            return Err(AssembleError::Invalid(format!(
                "spare {} is too small",
                s.describe()
            )));
        }
        let geo = Geometry {
            level,
            members: members.len(),
            chunk: options.chunk,
            rows,
        };
        let region_rows = region_rows_for(options.chunk, rows, options.bitmap_region);
        let bitmap = Bitmap::new(
            region_rows,
            rows,
            RegionSet::new(rows.div_ceil(region_rows)),
        );
        let mut resync = RegionSet::new(bitmap.regions);
        // Members never written (sparse files, thin volumes) already agree:
        // zeros everywhere, whose parity is zeros. Writing parity over them
        // would only allocate every member in full.
        let data = rows * options.chunk;
        let unwritten = members
            .iter()
            .all(|m| reads_as_zeros(&**m, data_offset, data));
        if unwritten && level != Level::Raid0 && !options.assume_clean {
            tracing::info!("RAID members are unwritten (they read as zeros): no initial resync");
        }
        if !options.assume_clean && level != Level::Raid0 && !unwritten {
            for r in 0..bitmap.regions {
                resync.set(r, true);
            }
        }
        let slots = members
            .into_iter()
            .map(|d| {
                Some(Arc::new(Member::new(
                    d.clone(),
                    name_of(&*d),
                    SyncState::InSync,
                    data_offset,
                )))
            })
            .collect();
        let spares = spares
            .into_iter()
            .map(|d| {
                Arc::new(Member::new(
                    d.clone(),
                    name_of(&*d),
                    SyncState::InSync,
                    data_offset,
                ))
            })
            .collect();
        let mut core = Core::new(
            geo,
            rand::random(),
            options,
            (slots, spares),
            bitmap,
            resync,
            (0, log_slots, JOURNAL_SLOTS, MAX_ATOMIC_BYTES),
        );
        core.log = (log_slots > 0).then(|| Log::new(log_slots, 0, 0));
        let core = Arc::new(core);
        let image = core.bitmap.image();
        for m in core.members().into_iter().flatten() {
            write_image_to(std::slice::from_ref(&m.dev), &image, true)?;
        }
        core.init_log()?;
        core.write_superblocks();
        Ok(RaidArray::start(core))
    }

    pub(crate) fn start(core: Arc<Core>) -> RaidArray {
        for m in core.members().iter().flatten() {
            core.adopt(m);
            if let Some(r) = m.replacement() {
                core.adopt(&r);
            }
        }
        for m in core.spares.lock().iter() {
            core.adopt(m);
        }
        let worker_core = core.clone();
        let worker = std::thread::Builder::new()
            .name("raid-sync".into())
            .spawn(move || worker_core.run_worker())
            .expect("spawn the RAID sync thread");
        RaidArray {
            core,
            worker: Mutex::new(Some(worker)),
            forced: Vec::new(),
        }
    }

    pub fn level(&self) -> Level {
        self.core.geo.level
    }

    pub fn geometry(&self) -> Geometry {
        self.core.geo
    }

    pub fn array_id(&self) -> u128 {
        self.core.array_id
    }

    pub(crate) fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        block::check_range_of("array", self.size(), offset, len)
    }

    /// Splits `[offset, offset+len)` into the pieces one stripe holds:
    /// `(stripe, first logical byte, end)`.
    pub(crate) fn pieces(&self, offset: u64, len: u64) -> Vec<(u64, u64, u64)> {
        let g = &self.core.geo;
        let unit = if g.is_parity() {
            g.chunk * g.data_columns() as u64
        } else {
            g.chunk
        };
        let mut out = Vec::new();
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let stripe = at / unit;
            let to = ((stripe + 1) * unit).min(end);
            out.push((stripe, at, to));
            at = to;
        }
        out
    }

    /// [`RaidArray::pieces`] of a parity array with runs of whole rows
    /// joined (up to [`RUN_BYTES`] of each member): `(rows, first logical
    /// byte, end)`, a partial row on its own.
    pub(crate) fn row_runs(&self, offset: u64, len: u64) -> Vec<(Range<u64>, u64, u64)> {
        let g = &self.core.geo;
        let unit = g.chunk * g.data_columns() as u64;
        let most = (RUN_BYTES / g.chunk).max(1);
        let mut out: Vec<(Range<u64>, u64, u64)> = Vec::new();
        for (row, s, e) in self.pieces(offset, len) {
            let whole = e - s == unit;
            match out.last_mut() {
                // Only onto a run of whole rows.
                Some((rows, start, end))
                    if whole
                        && *start == rows.start * unit
                        && *end == rows.end * unit
                        && rows.end == row
                        && rows.end - rows.start < most =>
                {
                    rows.end = row + 1;
                    *end = e;
                }
                _ => out.push((row..row + 1, s, e)),
            }
        }
        out
    }

    /// Threads a request of `len` bytes runs on: one per member for a
    /// large one (stripe `i` on thread `i % members`).
    fn threads_for(&self, len: usize) -> usize {
        if len >= SPREAD_MIN_BYTES {
            self.core.geo.members
        } else {
            1
        }
    }

    /// Member rows a write of `[offset, offset+len)` touches.
    pub(crate) fn member_rows(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        let g = &self.core.geo;
        let (first, last) = (offset / g.chunk, (offset + len - 1) / g.chunk);
        if g.is_parity() {
            g.stripe_of_chunk(first)..g.stripe_of_chunk(last) + 1
        } else {
            let lo = g.copies_of(first).iter().map(|p| p.row).min().unwrap_or(0);
            let hi = g.copies_of(last).iter().map(|p| p.row).max().unwrap_or(0);
            lo..hi + 1
        }
    }
}

impl Drop for RaidArray {
    fn drop(&mut self) {
        self.core.stop.store(true, Ordering::SeqCst);
        self.core.kick();
        if let Some(w) = self.worker.lock().take() {
            let _ = w.join();
        }
    }
}

impl Core {
    /// `members`: by slot, and spares; `counts`: events, log slots,
    /// journal slots and the journal's longest write.
    pub(crate) fn new(
        geo: Geometry,
        array_id: u128,
        options: RaidOptions,
        members: (Vec<Option<Arc<Member>>>, Vec<Arc<Member>>),
        bitmap: Bitmap,
        resync: RegionSet,
        counts: (u64, u32, u32, u64),
    ) -> Core {
        let (slots, spares) = members;
        let roster = slots
            .iter()
            .map(|m| m.as_ref().map_or(0, |m| m.id))
            .collect();
        let (events, log_slots, journal_slots, journal_max) = counts;
        let (journal_offset, data_offset) =
            layout(geo.chunk, log_slots, journal_slots, journal_max);
        Core {
            geo,
            array_id,
            sync_speed: Mutex::new((options.sync_speed_min, options.sync_speed_max)),
            last_scrub_at: Mutex::new(std::time::SystemTime::now()),
            last_scrub_ms: AtomicU64::new(0),
            options,
            slots: RwLock::new(slots),
            spares: Mutex::new(spares),
            events: Mutex::new((events, 0)),
            roster: Mutex::new(roster),
            locks: StripeLocks::new(),
            bitmap,
            resync: Mutex::new(resync),
            read_turn: AtomicUsize::new(0),
            foreground_ops: AtomicU64::new(0),
            clock: Arc::default(),
            failures: AtomicU64::new(0),
            progress: Mutex::new(None),
            report: Mutex::new(Default::default()),
            wake: Condvar::new(),
            wake_lock: Mutex::new(false),
            stop: AtomicBool::new(false),
            log: None,
            log_slots,
            journal: (journal_slots > 0).then(|| Journal::new(journal_slots, journal_max, 1)),
            journal_offset,
            data_offset,
        }
    }
}

impl BlockDevice for RaidArray {
    fn size(&self) -> u64 {
        self.core.geo.size()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        let core = &self.core;
        core.foreground_ops.fetch_add(1, Ordering::Relaxed);
        let g = core.geo;
        let threads = self.threads_for(buf.len());
        let mut rest = buf;
        let mut items = Vec::new();
        for (stripe, s, e) in self.pieces(offset, rest.len() as u64) {
            let (out, tail) = std::mem::take(&mut rest).split_at_mut((e - s) as usize);
            rest = tail;
            items.push((stripe, s, e, out));
        }
        spread(items, threads, |(stripe, s, e, out)| {
            if g.is_parity() {
                let base = stripe * g.chunk * g.data_columns() as u64;
                core.read_row(stripe, s - base, e - base, out)
            } else {
                core.read_chunk_copies(stripe, s - stripe * g.chunk, out)
            }
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let core = &self.core;
        if !core.survives() {
            return Err(array_failed());
        }
        core.foreground_ops.fetch_add(1, Ordering::Relaxed);
        let g = core.geo;
        let rows = self.member_rows(offset, buf.len() as u64);
        let tracked = g.level != Level::Raid0;
        if tracked {
            core.with_bitmap_writer(|w| core.bitmap.begin_write(rows.clone(), w))?;
        }
        let result = if g.is_parity() {
            let unit = g.chunk * g.data_columns() as u64;
            let runs = self.row_runs(offset, buf.len() as u64);
            spread(runs, self.threads_for(buf.len()), |(rows, s, e)| {
                let data = &buf[(s - offset) as usize..(e - offset) as usize];
                if rows.end - rows.start > 1 || e - s == unit {
                    core.write_full_rows(rows, data, fua)
                } else {
                    let base = rows.start * unit;
                    core.write_row(rows.start, s - base, e - base, data, fua)
                }
            })
        } else {
            spread(
                self.pieces(offset, buf.len() as u64),
                self.threads_for(buf.len()),
                |(stripe, s, e)| {
                    let data = &buf[(s - offset) as usize..(e - offset) as usize];
                    let _guard = core.locks.lock(stripe);
                    core.write_chunk_copies(stripe, s - stripe * g.chunk, data, fua)
                },
            )
        };
        if tracked {
            core.bitmap.end_write(rows);
        }
        result
    }

    fn flush(&self) -> io::Result<()> {
        self.core.flush_all()
    }

    fn atomic_writes(&self) -> Option<block::AtomicWrites> {
        self.atomic_limits()
    }

    fn write_atomic(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        self.write_atomic_journaled(buf, offset)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.member_provisioning().0 {
            return Ok(()); // the content may stay as it is
        }
        self.zero_range(offset, len, Zeroing::Discard)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero_range(offset, len, Zeroing::WriteZeroes)
    }

    fn allocate_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero_range(offset, len, Zeroing::Allocate)
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<(Allocation, u64)> {
        self.allocation_at(offset, len)
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities {
            volatile_cache: false,
            may_block: true,
            ..Capabilities::default()
        };
        for m in self.core.members().iter().flatten() {
            let c = m.dev.capabilities();
            caps.volatile_cache |= c.volatile_cache;
            caps.read_only |= c.read_only;
        }
        let (zeroes, thin) = self.member_provisioning();
        caps.discard = zeroes;
        caps.discard_zeroes = zeroes;
        caps.thin = thin;
        caps
    }

    fn granularity(&self) -> u64 {
        let g = &self.core.geo;
        if g.is_parity() {
            g.chunk * g.data_columns() as u64
        } else {
            0
        }
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn describe(&self) -> String {
        let names: Vec<String> = self
            .core
            .members()
            .iter()
            .map(|m| m.as_ref().map_or("-".into(), |m| m.name()))
            .collect();
        format!("raid{}({})", self.core.geo.level.number(), names.join(","))
    }
}
