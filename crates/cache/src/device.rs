//! The cache device: its options and shared state, the admin operations,
//! and the `BlockDevice` face. Opening (or formatting) the cache is in
//! `open.rs`, the I/O paths in `io.rs`, write-back in `writeback.rs`.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use block::{BlockDevice, Capabilities};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use crate::commit::MetaWriter;
use crate::geometry::Geometry;
use crate::label::{self, Label};
use crate::locks::LineLocks;
use crate::mode::Mode;
use crate::policy::PolicyKind;
use crate::state::State;
use crate::status::Counters;
use crate::stream::Streams;
use crate::writeback::{FlushProgress, Worker, WritebackSettings};

/// The default cache line: 64 KiB. Large enough that the table stays
/// small (24 bytes a line: 0.04% of the cache) and a line read from a
/// spinning disk costs about what a 4 KiB read does; validity is tracked
/// per 1 KiB sub-block, so small writes never read the rest of a line.
pub const DEFAULT_LINE: u64 = 64 << 10;
/// Streams longer than this bypass the cache (bcache's default too).
pub const DEFAULT_SEQUENTIAL_CUTOFF: u64 = 4 << 20;

/// When an existing cache device may be formatted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FormatPolicy {
    /// Only a cache of this backing is opened.
    Never,
    /// A device that is all zeros where the superblocks go is formatted;
    /// anything else that is not a cache of this backing is refused.
    #[default]
    IfBlank,
    /// Whatever the device holds is discarded, even the dirty data of a
    /// cache of this backing: for a one-off administrative format, never
    /// for a configuration read at every start.
    Always,
}

#[derive(Clone, Debug)]
pub struct CacheOptions {
    /// The backing's configured name, recorded in the superblock: a cache
    /// device is only ever opened again over the same backing.
    pub backing_id: String,
    pub mode: Mode,
    pub line_size: u64,
    /// 0 turns stream detection off.
    pub sequential_cutoff: u64,
    pub format: FormatPolicy,
    pub writeback: WritebackSettings,
    /// Run write-back in a thread of its own (off for deterministic tests,
    /// which call `write_back` themselves).
    pub background: bool,
    pub policy: PolicyKind,
    /// Give up the writes that only a lost cache device held: open even
    /// though the backing is marked as depending on a cache device that is
    /// not there (see `label.rs`), formatting the one that is.
    pub accept_lost_writes: bool,
}

impl CacheOptions {
    pub fn new(backing_id: &str) -> CacheOptions {
        CacheOptions {
            backing_id: backing_id.into(),
            mode: Mode::WriteThrough,
            line_size: DEFAULT_LINE,
            sequential_cutoff: DEFAULT_SEQUENTIAL_CUTOFF,
            format: FormatPolicy::IfBlank,
            writeback: WritebackSettings::default(),
            background: true,
            policy: PolicyKind::TwoQ,
            accept_lost_writes: false,
        }
    }
}

/// Everything the I/O paths and the write-back thread share.
pub(crate) struct Inner {
    pub cache: Arc<dyn BlockDevice>,
    pub backing: Arc<dyn BlockDevice>,
    pub geo: Geometry,
    /// I/O holds it shared for its whole duration, so a mode change waits
    /// for the I/O issued under the old mode.
    pub mode: RwLock<Mode>,
    /// Detached: every I/O goes to the backing alone.
    pub detached: AtomicBool,
    /// The cache device failed: nothing more is read from or written to it.
    pub failed: AtomicBool,
    /// Shut down: the table is marked clean, so no I/O may change it.
    pub closed: AtomicBool,
    pub state: Mutex<State>,
    pub locks: LineLocks,
    /// Taken before `state` by whoever writes metadata.
    pub meta: Mutex<MetaWriter>,
    pub streams: Mutex<Streams>,
    pub counters: Counters,
    pub events: Mutex<VecDeque<String>>,
    pub writeback: Mutex<WritebackSettings>,
    /// Where the next write-back pass starts, so passes sweep the backing.
    pub writeback_cursor: AtomicU64,
    /// Held by a write-back pass from start to end.
    pub writeback_pass: Mutex<()>,
    pub flushing: Mutex<Option<FlushProgress>>,
    pub started: Instant,
    /// Milliseconds since `started` of the last I/O.
    pub last_io: AtomicU64,
    /// The backing is marked as holding writes only this cache device has
    /// (`label.rs`); a write that lands dirty holds it shared.
    pub backing_mark: RwLock<bool>,
    /// This cache device's format instance, which the mark names.
    pub instance: u64,
}

const EVENTS_KEPT: usize = 32;

impl Inner {
    pub fn event(&self, what: String) {
        // When, as an administrator reads a time: UTC to the second.
        let at = jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M:%S UTC");
        tracing::warn!(cache = %self.cache.describe(), "{what}");
        let mut events = self.events.lock();
        if events.len() == EVENTS_KEPT {
            events.pop_front();
        }
        events.push_back(format!("{at}: {what}"));
    }

    /// The cache device failed: serve from the backing from now on, and
    /// mark the device so that its table, which the backing will outgrow,
    /// is not trusted by a later open (if it still takes that write).
    pub fn fail(&self, during: &str, err: &io::Error) {
        if !self.failed.swap(true, Ordering::SeqCst) {
            let at_risk = self.state.lock().dirty_subs * self.geo.sub;
            self.event(format!(
                "cache device failed during {during}: {err}; serving from the backing, \
                 {at_risk} bytes not yet written back answer with an error"
            ));
            if let Some(mut meta) = self.meta.try_lock() {
                let _ = self.write_superblock(&mut meta, false);
            }
            // On the backing too, which outlives the cache device: a
            // restart must not trust its table should it come back.
            let marked = *self.backing_mark.read_recursive();
            if let Err(e) = label::write(&*self.backing, &self.label(marked)) {
                tracing::warn!("cache: recording the failure on the backing: {e}");
            }
        }
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    pub fn is_detached(&self) -> bool {
        self.detached.load(Ordering::SeqCst)
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.state.lock().dirty_subs * self.geo.sub
    }

    /// Holds the backing marked as depending on this cache device, marking
    /// it first (on stable storage) if it is not: a write that lands dirty
    /// holds the guard until it is recorded dirty.
    pub fn dirty_mark(&self) -> io::Result<RwLockReadGuard<'_, bool>> {
        loop {
            let marked = self.backing_mark.read();
            if *marked {
                return Ok(marked);
            }
            drop(marked);
            let mut mark = self.backing_mark.write();
            if !*mark {
                label::write(&*self.backing, &self.label(true))?;
                *mark = true;
            }
        }
    }

    /// Clears the backing's mark once nothing is left to write back.
    pub fn unmark_if_clean(&self) -> io::Result<()> {
        let mut mark = self.backing_mark.write();
        if *mark && !self.is_failed() && self.dirty_bytes() == 0 {
            label::write(&*self.backing, &self.label(false))?;
            *mark = false;
        }
        Ok(())
    }

    pub(crate) fn label(&self, dirty: bool) -> Label {
        Label {
            dirty,
            failed: self.is_failed(),
            instance: self.instance,
            cache: self.cache.describe(),
        }
    }

    pub fn touch(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        // Written once a millisecond at most: every I/O shares this line.
        if self.last_io.load(Ordering::Relaxed) != ms {
            self.last_io.store(ms, Ordering::Relaxed);
        }
    }
}

/// A fast device caching a slow one. See the crate docs.
pub struct CacheDevice {
    pub(crate) inner: Arc<Inner>,
    pub(crate) worker: Mutex<Option<Worker>>,
}

impl CacheDevice {
    /// Stops cleanly: the table is committed and marked clean, so the next
    /// open trusts which lines are clean. Dirty data stays on the cache.
    pub fn close(self) -> io::Result<()> {
        self.shut_down()
    }

    /// [`CacheDevice::close`] for a device others still hold: waits for the
    /// I/O under way, then closes; I/O after it fails. Closing twice does
    /// nothing the second time.
    pub fn shut_down(&self) -> io::Result<()> {
        self.stop_worker();
        let inner = &self.inner;
        {
            // No I/O runs while the mode is held exclusively; any after
            // it sees `closed`.
            let _mode = inner.mode.write();
            if inner.closed.swap(true, Ordering::SeqCst) {
                return Ok(());
            }
        }
        inner.backing.flush()?;
        if inner.is_failed() {
            return inner.stranded_check();
        }
        inner.commit()?;
        inner.unmark_if_clean()?;
        inner.write_superblock(&mut inner.meta.lock(), true)
    }

    fn stop_worker(&self) {
        if let Some((stop, handle)) = self.worker.lock().take() {
            *stop.0.lock() = true;
            stop.1.notify_all();
            let _ = handle.join();
        }
    }

    pub fn mode(&self) -> Mode {
        *self.inner.mode.read()
    }

    /// Switches the mode live. Leaving write-back writes back every dirty
    /// block first, calling `progress` as it goes.
    pub fn set_mode(&self, mode: Mode, progress: &mut dyn FnMut(FlushProgress)) -> io::Result<()> {
        let old = std::mem::replace(&mut *self.inner.mode.write(), mode);
        if old != mode {
            self.inner.event(format!("mode {old} -> {mode}"));
        }
        if mode != Mode::WriteBack {
            self.inner.flush_dirty(progress)?;
        }
        Ok(())
    }

    pub fn set_sequential_cutoff(&self, cutoff: u64) {
        self.inner.streams.lock().set_cutoff(cutoff);
    }

    pub fn set_writeback(&self, settings: WritebackSettings) {
        *self.inner.writeback.lock() = settings;
    }

    /// Writes back every dirty block, calling `progress` as it goes.
    pub fn flush_dirty(&self, progress: &mut dyn FnMut(FlushProgress)) -> io::Result<()> {
        self.inner.flush_dirty(progress)
    }

    /// One write-back pass of at most `budget` bytes; what it wrote.
    pub fn write_back(&self, budget: u64) -> io::Result<u64> {
        self.inner.write_back(budget)
    }

    /// Writes back everything, then serves from the backing alone; the
    /// cache is emptied (what it held would go stale meanwhile).
    pub fn detach(&self, progress: &mut dyn FnMut(FlushProgress)) -> io::Result<()> {
        let inner = &self.inner;
        if inner.is_detached() {
            return Ok(());
        }
        // New writes no longer dirty anything while the old dirt drains.
        let mode = std::mem::replace(&mut *inner.mode.write(), Mode::WriteAround);
        let drained = inner.flush_dirty(progress);
        let held = inner.locks.lock_all();
        let result = drained.and_then(|()| {
            let mut st = inner.state.lock();
            if st.dirty_subs > 0 {
                return Err(io::Error::other("dirty data is left; not detached"));
            }
            let mapped: Vec<u32> = st.map.values().copied().collect();
            for slot in mapped {
                st.release(slot, false);
            }
            inner.detached.store(true, Ordering::SeqCst);
            Ok(())
        });
        drop(held);
        *inner.mode.write() = mode;
        result?;
        inner.event("detached: serving from the backing alone".into());
        if !inner.is_failed() {
            // Best effort: a failed commit only marks the cache failed.
            let _ = inner.commit();
        }
        Ok(())
    }

    /// Puts the cache back in front of the backing after `detach`, or
    /// after the cache device failed and was repaired; what it held while
    /// failed (dirty blocks included) is served again.
    pub fn attach(&self) -> io::Result<()> {
        let inner = &self.inner;
        if !inner.is_detached() && !inner.is_failed() {
            return Ok(());
        }
        let held = inner.locks.lock_all();
        inner.failed.store(false, Ordering::SeqCst);
        inner.detached.store(false, Ordering::SeqCst);
        drop(held);
        let written = inner.write_superblock(&mut inner.meta.lock(), false);
        if let Err(e) = written.and_then(|()| inner.commit()) {
            inner.fail("attach", &e);
            return Err(e);
        }
        let marked = *inner.backing_mark.read();
        label::write(&*inner.backing, &inner.label(marked))?;
        inner.event("attached".into());
        Ok(())
    }

    /// A read on behalf of `stream` (an initiator, a session), whose
    /// sequential runs the cutoff follows separately.
    pub fn read_stream(&self, stream: Option<u64>, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read(buf, offset, stream)
    }

    pub fn write_stream(
        &self,
        stream: Option<u64>,
        buf: &[u8],
        offset: u64,
        fua: bool,
    ) -> io::Result<()> {
        self.inner.write(buf, offset, fua, stream)
    }

    pub fn cache_device(&self) -> &Arc<dyn BlockDevice> {
        &self.inner.cache
    }

    pub fn backing_device(&self) -> &Arc<dyn BlockDevice> {
        &self.inner.backing
    }

    pub fn line_size(&self) -> u64 {
        self.inner.geo.line
    }

    /// Number of lines the cache holds.
    pub fn capacity_lines(&self) -> u32 {
        self.inner.geo.slots
    }
}

impl Drop for CacheDevice {
    /// Stops write-back; writes no metadata (a drop without `close` is what
    /// a crash looks like).
    fn drop(&mut self) {
        self.stop_worker();
    }
}

impl BlockDevice for CacheDevice {
    fn size(&self) -> u64 {
        self.inner.geo.backing_size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read(buf, offset, None)
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.inner.write(buf, offset, fua, None)
    }

    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.discard(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.write_zeroes(offset, len)
    }

    fn atomic_writes(&self) -> Option<block::AtomicWrites> {
        self.inner.atomic_limits()
    }

    fn write_atomic(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.inner.write_atomic(buf, offset, fua)
    }

    fn granularity(&self) -> u64 {
        self.inner.backing.granularity()
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<(block::Allocation, u64)> {
        self.inner.allocation(offset, len)
    }

    fn capabilities(&self) -> Capabilities {
        let backing = self.inner.backing.capabilities();
        Capabilities {
            // Discards pass down; blocks not yet written back count as
            // mapped (`allocation`).
            thin: backing.thin,
            // Writes may sit on the cache device (or in its own cache)
            // until a flush commits them.
            volatile_cache: true,
            may_block: true,
            // A discard leaves a partly covered dirty sub-block as it was.
            discard_zeroes: false,
            discard: backing.discard,
            read_only: backing.read_only,
        }
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn describe(&self) -> String {
        format!(
            "cache({} over {})",
            self.inner.cache.describe(),
            self.inner.backing.describe()
        )
    }
}

/// How long the write-back thread waits between passes.
pub(crate) const TICK: Duration = Duration::from_millis(100);
