//! Write-back: copying dirty blocks from the cache to the backing, in
//! backing order, with neighbouring dirty blocks (across lines) joined
//! into one large write; the background thread that does it when the
//! dirty data passes a threshold or the device is idle; and `flush_dirty`,
//! which writes everything back for a mode change or a detach.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::Serialize;

use crate::device::{Inner, TICK};
use crate::geometry::runs;
use crate::mode::Mode;

/// When and how fast the background thread writes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WritebackSettings {
    /// Write back while dirty data is above this share of the cache.
    pub dirty_threshold_percent: u8,
    /// Most bytes a second written back in the background.
    pub rate: u64,
    /// With no I/O for this long, write back whatever is dirty.
    pub idle_after: Duration,
}

impl Default for WritebackSettings {
    fn default() -> Self {
        WritebackSettings {
            dirty_threshold_percent: 10,
            rate: 64 << 20,
            idle_after: Duration::from_secs(2),
        }
    }
}

/// How far a full write-back has got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FlushProgress {
    /// Dirty bytes when it started.
    pub total_bytes: u64,
    pub written_bytes: u64,
    pub dirty_bytes_left: u64,
}

/// Most bytes joined into one backing write.
const MAX_RUN: u64 = 8 << 20;

/// A line whose dirty sub-blocks were copied, as they were when copied.
struct Copied {
    line: u64,
    slot: u32,
    gen: u64,
    bits: u64,
}

impl Inner {
    /// One pass over at most about `budget` dirty bytes, from where the
    /// last pass stopped; returns the bytes written.
    pub fn write_back(&self, budget: u64) -> io::Result<u64> {
        if self.is_failed() {
            return Err(io::Error::other(
                "cache device failed: nothing to write back from",
            ));
        }
        let _one_pass_at_a_time = self.writeback_pass.lock();
        let lines = self.pick_dirty(budget);
        if lines.is_empty() {
            return Ok(0);
        }
        let mut copied = Vec::new();
        let mut written = 0;
        // Consecutive lines are locked and written together.
        let mut group_start = 0;
        for i in 1..=lines.len() {
            let breaks = i == lines.len()
                || lines[i] != lines[i - 1] + 1
                || (i - group_start) as u64 * self.geo.line >= MAX_RUN;
            if breaks {
                written += self.write_back_lines(&lines[group_start..i], &mut copied)?;
                group_start = i;
            }
        }
        self.backing.flush()?;
        let mut st = self.state.lock();
        for c in copied {
            st.cleaned(c.slot, c.line, c.gen, c.bits);
        }
        drop(st);
        let next = lines.last().map_or(0, |l| l + 1);
        self.writeback_cursor.store(next, Ordering::Relaxed);
        self.counters.written_back(written);
        Ok(written)
    }

    /// Dirty lines from the cursor on, wrapping, up to `budget` bytes.
    fn pick_dirty(&self, budget: u64) -> Vec<u64> {
        let st = self.state.lock();
        let cursor = self.writeback_cursor.load(Ordering::Relaxed);
        let mut lines = Vec::new();
        let mut bytes = 0;
        let after = st
            .dirty_lines
            .range(cursor..)
            .chain(st.dirty_lines.range(..cursor));
        for (&line, &slot) in after {
            if bytes >= budget.max(1) {
                break;
            }
            bytes += st.slots[slot as usize].dirty.count_ones() as u64 * self.geo.sub;
            lines.push(line);
        }
        // Backing order within the pass, wrapped part included.
        lines.sort_unstable();
        lines
    }

    /// Writes back consecutive `lines`: their dirty sub-blocks are copied
    /// under the line locks, and written to the backing after the locks
    /// are released, so I/O to those lines waits for a copy, not for the
    /// slow disk. A line written meanwhile stays dirty (its generation
    /// moved), and passes never overlap, so a late write of an old copy is
    /// always followed by a newer one before the line can be clean.
    fn write_back_lines(&self, lines: &[u64], copied: &mut Vec<Copied>) -> io::Result<u64> {
        let held = self.locks.lock(lines[0], *lines.last().unwrap());
        let now: Vec<Copied> = {
            let st = self.state.lock();
            lines
                .iter()
                .filter_map(|&line| {
                    let slot = st.lookup(line)?;
                    let s = st.slots[slot as usize];
                    (s.dirty != 0).then_some(Copied {
                        line,
                        slot,
                        gen: s.gen,
                        bits: s.dirty,
                    })
                })
                .collect()
        };
        // Backing offset and bytes of each run of neighbouring dirty
        // sub-blocks.
        let mut runs_out: Vec<(u64, Vec<u8>)> = Vec::new();
        for c in &now {
            for (r0, r1, set) in runs(c.bits, 0, self.geo.sub_bits()) {
                let (x, y) = self.geo.sub_range(c.line, r0, r1);
                if !set || x >= y {
                    continue;
                }
                let dev = self.geo.line_start(c.line) + x;
                let joins = matches!(runs_out.last(), Some((start, data)) if start + data.len() as u64 == dev);
                if !joins {
                    runs_out.push((dev, Vec::new()));
                }
                let data = &mut runs_out.last_mut().unwrap().1;
                let at = data.len();
                data.resize(at + (y - x) as usize, 0);
                if let Err(e) = self
                    .cache
                    .read_at(&mut data[at..], self.geo.slot_offset(c.slot) + x)
                {
                    drop(held);
                    self.fail("write-back", &e);
                    return Err(e);
                }
            }
        }
        drop(held);
        let mut written = 0;
        for (start, data) in runs_out {
            self.backing.write_at(&data, start, false)?;
            written += data.len() as u64;
        }
        copied.extend(now);
        Ok(written)
    }

    /// Writes back until nothing is dirty.
    pub fn flush_dirty(&self, progress: &mut dyn FnMut(FlushProgress)) -> io::Result<()> {
        let total = self.dirty_bytes();
        let mut p = FlushProgress {
            total_bytes: total,
            written_bytes: 0,
            dirty_bytes_left: total,
        };
        let mut stalled = 0;
        let result = loop {
            *self.flushing.lock() = Some(p);
            progress(p);
            if p.dirty_bytes_left == 0 {
                break Ok(());
            }
            match self.write_back(MAX_RUN) {
                Ok(0) => {
                    stalled += 1;
                    if stalled > 3 {
                        break Err(io::Error::other("write-back makes no progress"));
                    }
                }
                Ok(n) => {
                    stalled = 0;
                    p.written_bytes += n;
                }
                Err(e) => break Err(e),
            }
            p.dirty_bytes_left = self.dirty_bytes();
        };
        *self.flushing.lock() = None;
        if result.is_ok() && total > 0 {
            self.event(format!("wrote back {} bytes", p.written_bytes));
        }
        result.and_then(|()| self.unmark_if_clean())
    }

    /// Whether no I/O came for the write-back settings' `idle_after`.
    pub(crate) fn idle(&self) -> bool {
        let idle_after = self.writeback.lock().idle_after;
        let idle_ms =
            self.started.elapsed().as_millis() as u64 - self.last_io.load(Ordering::Relaxed);
        idle_ms >= idle_after.as_millis() as u64
    }

    /// Whether the background thread should write back now, and how much.
    fn background_budget(&self) -> Option<u64> {
        if self.is_failed() || self.is_detached() {
            return None;
        }
        let settings = *self.writeback.lock();
        let dirty = self.dirty_bytes();
        if dirty == 0 {
            return None;
        }
        let capacity = self.geo.slots as u64 * self.geo.line;
        let threshold = capacity / 100 * settings.dirty_threshold_percent as u64;
        let idle = self.idle();
        let draining = *self.mode.read() != Mode::WriteBack;
        let per_tick = (settings.rate as f64 * TICK.as_secs_f64()) as u64;
        if idle || draining {
            Some(per_tick)
        } else if dirty > threshold {
            // Down to the threshold, not below: dirty data that stays is
            // what makes rewrites of hot blocks cheap.
            Some(per_tick.min(dirty - threshold))
        } else {
            None
        }
    }
}

pub(crate) type Worker = (Arc<(Mutex<bool>, Condvar)>, JoinHandle<()>);

/// Starts the background write-back thread; it ends when the flag in the
/// pair is set.
pub(crate) fn spawn(inner: Arc<Inner>) -> Worker {
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let flag = stop.clone();
    let handle = std::thread::Builder::new()
        .name("cache-writeback".into())
        .spawn(move || {
            let mut next = Instant::now();
            loop {
                {
                    let mut stopped = flag.0.lock();
                    next += TICK;
                    if !*stopped {
                        flag.1.wait_until(&mut stopped, next);
                    }
                    if *stopped {
                        return;
                    }
                }
                next = next.max(Instant::now());
                if let Some(budget) = inner.background_budget() {
                    if let Err(e) = inner.write_back(budget) {
                        tracing::warn!("cache write-back: {e}");
                    }
                } else if inner.idle() && *inner.backing_mark.read() {
                    // All written back and quiet: the backing stands alone
                    // again, should the cache device be lost.
                    if let Err(e) = inner.unmark_if_clean() {
                        tracing::warn!("cache: clearing the backing's mark: {e}");
                    }
                }
            }
        })
        .expect("spawn the write-back thread");
    (stop, handle)
}
