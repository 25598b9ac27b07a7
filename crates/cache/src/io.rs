//! Reads, writes, flushes and discards through the cache.
//!
//! Every request takes the locks of its lines first and keeps them to the
//! end. Cache device errors mark the cache failed and the request is
//! redone on the backing alone (`degraded`), where blocks whose newest data
//! only the cache holds answer with an error rather than stale data.

use std::io;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use crate::device::Inner;
use crate::geometry::runs;
use crate::locks::Held;
use crate::mode::Mode;
use crate::state::State;

/// Which device an error came from.
pub(crate) enum Fault {
    Cache(io::Error),
    Backing(io::Error),
}

pub(crate) type Res<T> = Result<T, Fault>;

pub(crate) fn on_cache<T>(r: io::Result<T>) -> Res<T> {
    r.map_err(Fault::Cache)
}

pub(crate) fn on_backing<T>(r: io::Result<T>) -> Res<T> {
    r.map_err(Fault::Backing)
}

/// The error for a block whose data is on a failed cache device only.
pub fn stranded() -> io::Error {
    io::Error::other("cache device failed before this block was written back")
}

/// Part of a read: `len` bytes at request position `at` (device offset
/// `offset`), from the cache at `cached` or else from the backing.
struct Piece {
    at: usize,
    offset: u64,
    len: usize,
    cached: Option<u64>,
}

impl Inner {
    /// The lines of `[offset, offset + len)`: `(line, from, to)` with
    /// offsets inside the line.
    pub(crate) fn segments(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let end = offset + len;
        let mut cur = offset;
        std::iter::from_fn(move || {
            (cur < end).then(|| {
                let line = self.geo.line_of(cur);
                let start = self.geo.line_start(line);
                let to = (end - start).min(self.geo.line);
                let seg = (line, cur - start, to);
                cur = start + to;
                seg
            })
        })
    }

    pub(crate) fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        block::check_range_of("device", self.geo.backing_size, offset, len)
    }

    /// Error once the device is shut down; called with the mode held, so
    /// that no I/O slips past a shutdown.
    pub(crate) fn open_check(&self) -> io::Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the cache is shut down",
            ));
        }
        Ok(())
    }

    pub(crate) fn lock_lines(&self, offset: u64, len: u64) -> Held<'_> {
        let first = self.geo.line_of(offset);
        let last = self.geo.line_of(offset + len - 1);
        self.locks.lock(first, last)
    }

    pub fn read(&self, buf: &mut [u8], offset: u64, stream: Option<u64>) -> io::Result<()> {
        let len = buf.len() as u64;
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.touch();
        let bypass = self.streams.lock().observe(stream, offset, len);
        let mode = self.mode.read();
        self.open_check()?;
        if self.is_detached() {
            return self.backing.read_at(buf, offset);
        }
        let held = self.lock_lines(offset, len);
        if self.is_failed() {
            return self.read_degraded(buf, offset);
        }
        if bypass {
            self.counters.bypassed(len);
        }
        let result = if mode.admits_reads() && !bypass {
            self.read_filling(buf, offset, &held)
        } else {
            self.read_cached(buf, offset)
        };
        match result {
            Ok(()) => Ok(()),
            Err(Fault::Backing(e)) => Err(e),
            Err(Fault::Cache(e)) => {
                self.fail("read", &e);
                self.read_degraded(buf, offset)
            }
        }
    }

    /// A read that caches nothing it misses.
    fn read_cached(&self, buf: &mut [u8], offset: u64) -> Res<()> {
        let mut pieces: SmallVec<[Piece; 4]> = SmallVec::new();
        let (mut hit, mut miss) = (0, 0);
        {
            let mut st = self.state.lock();
            for (line, from, to) in self.segments(offset, buf.len() as u64) {
                let base = self.geo.line_start(line);
                let mut push = |from: u64, to: u64, cached: Option<u64>| {
                    let piece = Piece {
                        at: (base + from - offset) as usize,
                        offset: base + from,
                        len: (to - from) as usize,
                        cached,
                    };
                    match pieces.last_mut() {
                        // Neighbouring backing reads become one.
                        Some(last) if last.cached.is_none() && cached.is_none() => {
                            last.len += piece.len
                        }
                        _ => pieces.push(piece),
                    }
                };
                let Some(slot) = st.lookup(line) else {
                    push(from, to, None);
                    miss += to - from;
                    continue;
                };
                st.policy.hit(slot);
                let valid = st.slots[slot as usize].valid;
                let sub = self.geo.sub;
                let first = (from / sub) as u32;
                let end = ((to - 1) / sub + 1) as u32;
                for (r0, r1, set) in runs(valid, first, end) {
                    let x = from.max(r0 as u64 * sub);
                    let y = to.min(r1 as u64 * sub);
                    if set {
                        push(x, y, Some(self.geo.slot_offset(slot) + x));
                        hit += y - x;
                    } else {
                        push(x, y, None);
                        miss += y - x;
                    }
                }
            }
        }
        for p in &pieces {
            let out = &mut buf[p.at..p.at + p.len];
            match p.cached {
                Some(at) => self.read_from_cache_device(out, at)?,
                None => on_backing(self.backing.read_at(out, p.offset))?,
            }
        }
        self.counters.read(hit, miss);
        Ok(())
    }

    /// Reads `out` from the cache device at `at`: copied out of the
    /// device's mapped file where it offers one (no system call per hit),
    /// else read. Callers hold the line, so nothing writes there meanwhile.
    pub(crate) fn read_from_cache_device(&self, out: &mut [u8], at: u64) -> Res<()> {
        match self.cache.mapped_bytes(at, out.len()) {
            Some(bytes) => {
                out.copy_from_slice(bytes.as_ref());
                Ok(())
            }
            None => on_cache(self.cache.read_at(out, at)),
        }
    }

    /// Frees `victim` if it holds a clean line that nobody is using (its
    /// line lock is ours already, or free now); whether it did.
    pub(crate) fn evict_clean(&self, st: &mut State, victim: u32, held: &Held) -> bool {
        let s = st.slots[victim as usize];
        let Some(line) = s.line else { return false };
        if s.dirty != 0 {
            return false;
        }
        let _guard = if held.holds(line) {
            None
        } else {
            match self.locks.try_lock(line) {
                Some(guard) => Some(guard),
                None => return false,
            }
        };
        st.release(victim, true);
        true
    }

    /// The slot holding `line`, or a new one for it (evicting clean lines
    /// if need be); `None` when the cache has no room to spare.
    pub(crate) fn slot_for(&self, line: u64, held: &Held) -> Res<Option<u32>> {
        for _ in 0..2 {
            {
                let mut st = self.state.lock();
                if let Some(slot) = st.lookup(line) {
                    return Ok(Some(slot));
                }
                if let Some(slot) = st.take_free(line) {
                    return Ok(Some(slot));
                }
                // Evict a batch at once: freed slots wait for a commit,
                // which is then paid once for many.
                let batch = (self.geo.slots as usize / 32).clamp(1, 256);
                let mut evicted = 0;
                for victim in st.policy.victims(batch * 4 + 16) {
                    if !self.evict_clean(&mut st, victim, held) {
                        continue;
                    }
                    evicted += 1;
                    if evicted == batch {
                        break;
                    }
                }
                self.counters
                    .evictions
                    .fetch_add(evicted as u64, Ordering::Relaxed);
                if st.quarantine.is_empty() {
                    return Ok(None);
                }
            }
            on_cache(self.commit())?;
        }
        Ok(None)
    }

    pub fn write(&self, buf: &[u8], offset: u64, fua: bool, stream: Option<u64>) -> io::Result<()> {
        let len = buf.len() as u64;
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.touch();
        let bypass = self.streams.lock().observe(stream, offset, len);
        let mode = self.mode.read();
        self.open_check()?;
        if self.is_detached() {
            return self.backing.write_at(buf, offset, fua);
        }
        let held = self.lock_lines(offset, len);
        if self.is_failed() {
            return self.write_degraded(buf, offset, fua);
        }
        if bypass {
            self.counters.bypassed(len);
        }
        let result = match *mode {
            Mode::WriteBack if !bypass => self.write_cache_first(buf, offset, fua, &held),
            Mode::WriteThrough if !bypass => {
                self.write_backing_first(buf, offset, fua, true, &held)
            }
            _ => self.write_backing_first(buf, offset, fua, false, &held),
        };
        match result {
            Ok(()) => Ok(()),
            Err(Fault::Backing(e)) => Err(e),
            Err(Fault::Cache(e)) => {
                self.fail("write", &e);
                self.write_degraded(buf, offset, fua)
            }
        }
    }

    /// Write-back: the data lands on the cache, dirty.
    fn write_cache_first(&self, buf: &[u8], offset: u64, fua: bool, held: &Held) -> Res<()> {
        // The backing says it depends on this cache device before any
        // write lands on it alone.
        let _mark = on_backing(self.dirty_mark())?;
        for (line, from, to) in self.segments(offset, buf.len() as u64) {
            let at = (self.geo.line_start(line) + from - offset) as usize;
            let data = &buf[at..at + (to - from) as usize];
            let was_cached = self.state.lock().lookup(line).is_some();
            match self.slot_for(line, held)? {
                Some(slot) => {
                    self.write_into_slot(slot, line, from, to, data, true)?;
                    self.counters.write(was_cached, to - from);
                }
                None => {
                    // No clean line to give up: this part goes around.
                    let dev = self.geo.line_start(line) + from;
                    on_backing(self.backing.write_at(data, dev, fua))?;
                    self.counters.bypassed(to - from);
                    self.counters.write(false, to - from);
                }
            }
        }
        if fua {
            on_cache(self.commit())?;
        }
        Ok(())
    }

    /// Write-through (`cache_it`) and write-around: the backing first,
    /// then the cache updated or invalidated.
    fn write_backing_first(
        &self,
        buf: &[u8],
        offset: u64,
        fua: bool,
        cache_it: bool,
        held: &Held,
    ) -> Res<()> {
        if let Err(e) = self.backing.write_at(buf, offset, fua) {
            // The backing may hold part of the write: clean copies of it
            // may no longer match.
            self.invalidate_clean(offset, buf.len() as u64);
            return Err(Fault::Backing(e));
        }
        let mut changed = false;
        for (line, from, to) in self.segments(offset, buf.len() as u64) {
            let at = (self.geo.line_start(line) + from - offset) as usize;
            let data = &buf[at..at + (to - from) as usize];
            let touched = self.geo.touched(from, to);
            let slot = {
                let mut st = self.state.lock();
                match st.lookup(line) {
                    // Dirty data of the line is kept whole: updated, not
                    // dropped, whatever the mode.
                    Some(slot) if !cache_it && st.slots[slot as usize].dirty & touched == 0 => {
                        st.invalidate(slot, touched);
                        changed = true;
                        self.counters.write(true, to - from);
                        continue;
                    }
                    Some(slot) => Some(slot),
                    None => None,
                }
            };
            self.counters.write(slot.is_some(), to - from);
            let slot = match slot {
                Some(slot) => slot,
                None if cache_it => match self.slot_for(line, held)? {
                    Some(slot) => slot,
                    None => continue,
                },
                None => continue,
            };
            self.write_into_slot(slot, line, from, to, data, false)?;
            changed = true;
        }
        // A FUA write must not be undone by a crash: no table entry on disk
        // may still offer an older copy of its blocks, including copies
        // dropped by earlier writes that no commit has recorded yet.
        if fua && (changed || !self.state.lock().changed.is_empty()) {
            on_cache(self.commit())?;
        }
        Ok(())
    }

    /// Writes `data` at `[from, to)` of the line in `slot`, completing
    /// partly written sub-blocks from the cache or the backing, and marks
    /// those sub-blocks valid (and dirty with `dirty`).
    fn write_into_slot(
        &self,
        slot: u32,
        line: u64,
        from: u64,
        to: u64,
        data: &[u8],
        dirty: bool,
    ) -> Res<()> {
        let (wfrom, wto) = self.geo.widen(line, from, to);
        let base = self.geo.slot_offset(slot);
        if (wfrom, wto) == (from, to) {
            on_cache(self.cache.write_at(data, base + from, false))?;
        } else {
            let valid = self.state.lock().slots[slot as usize].valid;
            let mut whole = vec![0u8; (wto - wfrom) as usize];
            for (x, y) in [(wfrom, from), (to, wto)] {
                if x >= y {
                    continue;
                }
                let out = &mut whole[(x - wfrom) as usize..(y - wfrom) as usize];
                if valid >> (x / self.geo.sub) & 1 == 1 {
                    self.read_from_cache_device(out, base + x)?;
                } else {
                    let dev = self.geo.line_start(line) + x;
                    on_backing(self.backing.read_at(out, dev))?;
                }
            }
            whole[(from - wfrom) as usize..(to - wfrom) as usize].copy_from_slice(data);
            on_cache(self.cache.write_at(&whole, base + wfrom, false))?;
        }
        let bits = self.geo.touched(from, to);
        self.state
            .lock()
            .written(slot, bits, if dirty { bits } else { 0 });
        Ok(())
    }

    /// Drops the clean cached sub-blocks of a range.
    pub(crate) fn invalidate_clean(&self, offset: u64, len: u64) {
        let mut st = self.state.lock();
        for (line, from, to) in self.segments(offset, len) {
            if let Some(slot) = st.lookup(line) {
                let clean = self.geo.touched(from, to) & !st.slots[slot as usize].dirty;
                st.invalidate(slot, clean);
            }
        }
    }

    /// Whether any block of the range has data only the cache holds.
    pub(crate) fn has_dirty(&self, offset: u64, len: u64) -> bool {
        let st = self.state.lock();
        self.segments(offset, len).any(|(line, from, to)| {
            st.lookup(line)
                .is_some_and(|slot| st.slots[slot as usize].dirty & self.geo.touched(from, to) != 0)
        })
    }

    /// The backing's allocation, except that blocks holding data not yet
    /// written back are mapped whatever the backing says.
    pub fn allocation(&self, offset: u64, len: u64) -> io::Result<(block::Allocation, u64)> {
        self.check(offset, len)?;
        let (state, n) = self.backing.allocation(offset, len)?;
        if state == block::Allocation::Mapped || self.is_detached() {
            return Ok((state, n));
        }
        let st = self.state.lock();
        for (line, from, to) in self.segments(offset, n) {
            let dirty = st.lookup(line).is_some_and(|slot| {
                st.slots[slot as usize].dirty & self.geo.touched(from, to) != 0
            });
            if dirty {
                let at = self.geo.line_start(line) + from;
                return Ok(if at == offset {
                    (block::Allocation::Mapped, to - from)
                } else {
                    (state, at - offset)
                });
            }
        }
        Ok((state, n))
    }

    fn read_degraded(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.has_dirty(offset, buf.len() as u64) {
            return Err(stranded());
        }
        self.backing.read_at(buf, offset)
    }

    pub(crate) fn write_degraded(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        if self.has_dirty(offset, buf.len() as u64) {
            return Err(stranded());
        }
        // Cached copies are stale now, should the cache come back.
        self.invalidate_clean(offset, buf.len() as u64);
        self.backing.write_at(buf, offset, fua)
    }

    /// Error unless no dirty data is stranded on a failed cache.
    pub fn stranded_check(&self) -> io::Result<()> {
        if self.dirty_bytes() > 0 {
            Err(stranded())
        } else {
            Ok(())
        }
    }

    pub fn flush(&self) -> io::Result<()> {
        self.backing.flush()?;
        if self.is_detached() {
            return Ok(());
        }
        if self.is_failed() {
            return self.stranded_check();
        }
        if self.commit().is_err() {
            return self.stranded_check();
        }
        Ok(())
    }

    pub fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.drop_then(offset, len, || self.backing.discard(offset, len))
    }

    /// Zeros: whole sub-blocks leave the cache and are zeroed on the
    /// backing (which may deallocate them); partial ones at the edges are
    /// written like any data.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)?;
        let sub = self.geo.sub;
        let end = offset + len;
        let (first, last) = (offset.div_ceil(sub) * sub, end / sub * sub);
        if first >= last {
            return self.write(&vec![0; len as usize], offset, false, None);
        }
        if first > offset {
            self.write(&vec![0; (first - offset) as usize], offset, false, None)?;
        }
        if end > last {
            self.write(&vec![0; (end - last) as usize], last, false, None)?;
        }
        self.drop_then(first, last - first, || {
            self.backing.write_zeroes(first, last - first)
        })
    }

    /// Drops what the cache holds of the range (whole sub-blocks, dirty or
    /// not), then runs `then` on the backing with the lines still locked,
    /// so that no read brings the old data back in between.
    fn drop_then(
        &self,
        offset: u64,
        len: u64,
        then: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let _mode = self.mode.read();
        self.open_check()?;
        if self.is_detached() {
            return then();
        }
        let mut held = self.lock_lines(offset, len);
        let dirty = self.has_dirty(offset, len);
        if self.is_failed() && dirty {
            return Err(stranded());
        }
        // Dropping dirty blocks while a write-back pass may still write an
        // old copy of them to the backing would let that copy land over a
        // later write-around: wait for the pass (taking its lock before the
        // line locks, in the order passes take them).
        let _pass = if dirty {
            drop(held);
            let pass = self.writeback_pass.lock();
            held = self.lock_lines(offset, len);
            Some(pass)
        } else {
            None
        };
        let _held = held;
        {
            let mut st = self.state.lock();
            for (line, from, to) in self.segments(offset, len) {
                if let Some(slot) = st.lookup(line) {
                    // Whole sub-blocks go, dirty or not; a dirty one only
                    // partly discarded keeps its data (a discard need not
                    // zero).
                    let dirty = st.slots[slot as usize].dirty;
                    let bits =
                        self.geo.covered(line, from, to) | (self.geo.touched(from, to) & !dirty);
                    st.invalidate(slot, bits);
                }
            }
        }
        then()
    }
}
