//! The background copy of a member's rows (a rebuild, a catch-up, a
//! replacement's copy) by a few workers at once, each reading a batch,
//! building its chunks and writing them. With one batch at a time the
//! members sit idle while a batch is computed, and the member written
//! while the next batch is read; with several in flight each member
//! always has a request queued. Batches finish out of order: the rows
//! counted done only ever advance over a contiguous prefix.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use crate::core::{Core, Progress};
use crate::rebuild::Batch;
use crate::worker::Throttle;

/// Batches in flight at once.
pub const WORKERS: usize = 3;

/// What to copy and how it shows in status.
pub struct Plan<'p> {
    pub kind: &'static str,
    pub slot: usize,
    /// Member rows to go through, from where the copy stands.
    pub rows: Range<u64>,
    /// Rows a batch covers at most.
    pub step: u64,
    /// Bytes the whole copy covers, for progress.
    pub total: u64,
    /// Whether a row needs copying at all (a catch-up skips clean
    /// regions, a region at a time).
    pub needed: &'p (dyn Fn(u64) -> bool + Sync),
    /// Whether to go on (the array not stopping, the target alive).
    pub go_on: &'p (dyn Fn() -> bool + Sync),
}

/// Where the workers stand.
struct Cursor {
    next: u64,
    /// Rows done from the start, without a gap.
    done_to: u64,
    /// Batches done beyond a gap: start -> end.
    finished: BTreeMap<u64, u64>,
    stopped: bool,
}

impl Cursor {
    /// Counts `rows` done; returns the contiguous end.
    fn finish(&mut self, rows: Range<u64>) -> u64 {
        self.finished.insert(rows.start, rows.end);
        while let Some(end) = self.finished.remove(&self.done_to) {
            self.done_to = end;
        }
        self.done_to
    }
}

impl Core {
    /// Runs `plan`: `read` locks and reads a batch (`None`: a member
    /// failed), `write` writes it and unlocks it (false: it failed),
    /// `advance` is told each new contiguous end. True when every row
    /// was done.
    pub fn run_copy<'s>(
        &'s self,
        plan: &Plan<'_>,
        read: &(dyn Fn(Range<u64>) -> Option<Batch<'s>> + Sync),
        write: &(dyn Fn(Batch<'s>) -> bool + Sync),
        advance: &(dyn Fn(u64) + Sync),
    ) -> bool {
        let rr = self.region_rows();
        let end = plan.rows.end;
        let cursor = Mutex::new(Cursor {
            next: plan.rows.start,
            done_to: plan.rows.start,
            finished: BTreeMap::new(),
            stopped: false,
        });
        let throttle = Mutex::new(Throttle::new(self));
        self.show(plan, 0, &throttle.lock());
        // The next batch to take, skipping rows not needed.
        let take = || -> Option<Range<u64>> {
            let mut c = cursor.lock();
            if c.stopped || !(plan.go_on)() || self.stop.load(Ordering::SeqCst) {
                c.stopped = true;
                return None;
            }
            while c.next < end && !(plan.needed)(c.next) {
                let skip_to = ((c.next / rr + 1) * rr).min(end);
                let from = c.next;
                let to = c.finish(from..skip_to);
                advance(to);
                c.next = skip_to;
            }
            if c.next >= end {
                return None;
            }
            let start = c.next;
            let mut stop = start + 1;
            while stop < end && stop - start < plan.step && (plan.needed)(stop) {
                stop += 1;
            }
            c.next = stop;
            Some(start..stop)
        };
        let work = || {
            while let Some(rows) = take() {
                let ok = match read(rows.clone()) {
                    Some(batch) => write(batch),
                    None => false,
                };
                if !ok {
                    cursor.lock().stopped = true;
                    return;
                }
                let to = cursor.lock().finish(rows.clone());
                advance(to);
                let bytes = (rows.end - rows.start) * self.geo.chunk;
                let mut t = throttle.lock();
                t.done(self, bytes);
                self.show(plan, t.total, &t);
            }
        };
        std::thread::scope(|scope| {
            for _ in 1..WORKERS {
                scope.spawn(work);
            }
            work();
        });
        let c = cursor.into_inner();
        !c.stopped && c.done_to >= end
    }

    fn show(&self, plan: &Plan<'_>, done: u64, throttle: &Throttle) {
        *self.progress.lock() = Some(Progress {
            kind: plan.kind,
            slot: Some(plan.slot),
            done_bytes: done,
            total_bytes: plan.total,
            bytes_per_sec: throttle.rate(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_done_rows_advance_only_over_a_contiguous_prefix() {
        let mut c = Cursor {
            next: 0,
            done_to: 0,
            finished: BTreeMap::new(),
            stopped: false,
        };
        assert_eq!(c.finish(16..32), 0);
        assert_eq!(c.finish(32..48), 0);
        assert_eq!(c.finish(0..16), 48);
        assert_eq!(c.finish(64..80), 48);
        assert_eq!(c.finish(48..64), 80);
    }
}
