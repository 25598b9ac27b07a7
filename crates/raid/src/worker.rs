//! The array's background thread: resync of dirty bitmap regions after
//! an unclean stop, rebuild of a recovering member, and promotion of a hot
//! spare into a failed slot; throttled between the sync speed limits.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bitmap::{write_image_to, RegionSet};
use crate::core::{Core, Progress};
use crate::geometry::Place;
use crate::member::{Member, SyncState};
use crate::pipeline::Plan;
use crate::rebuild::Batch;
use std::ops::Range;

/// Keeps a sync between `sync_speed_min` and `sync_speed_max`, at the
/// minimum while foreground I/O is arriving.
pub(crate) struct Throttle {
    window_start: Instant,
    window_bytes: u64,
    foreground_seen: u64,
    started: Instant,
    pub(crate) total: u64,
}

impl Throttle {
    pub(crate) fn new(core: &Core) -> Throttle {
        Throttle {
            window_start: Instant::now(),
            window_bytes: 0,
            foreground_seen: core.foreground_ops.load(Ordering::Relaxed),
            started: Instant::now(),
            total: 0,
        }
    }

    pub(crate) fn done(&mut self, core: &Core, bytes: u64) {
        self.window_bytes += bytes;
        self.total += bytes;
        let fg = core.foreground_ops.load(Ordering::Relaxed);
        let busy = fg != self.foreground_seen;
        self.foreground_seen = fg;
        let (min, max) = *core.sync_speed.lock();
        let limit = if busy { min } else { max }.max(1);
        let due = Duration::from_secs_f64(self.window_bytes as f64 / limit as f64);
        // In short sleeps, so that a stop is not kept waiting.
        loop {
            let elapsed = self.window_start.elapsed();
            if due <= elapsed || core.stop.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep((due - elapsed).min(Duration::from_millis(200)));
        }
        if self.window_start.elapsed() > Duration::from_secs(1) {
            self.window_start = Instant::now();
            self.window_bytes = 0;
        }
    }

    pub(crate) fn rate(&self) -> u64 {
        (self.total as f64 / self.started.elapsed().as_secs_f64().max(1e-6)) as u64
    }
}

impl Core {
    pub fn run_worker(self: Arc<Self>) {
        while !self.stop.load(Ordering::SeqCst) {
            if self.work_step() {
                continue;
            }
            let mut woken = self.wake_lock.lock();
            if !*woken {
                self.wake.wait_for(&mut woken, Duration::from_millis(200));
            }
            *woken = false;
        }
    }

    /// Whether there is nothing left to resync or rebuild.
    pub fn idle(&self) -> bool {
        // Held throughout: a spare moves into its slot under it.
        let spares = self.spares.lock();
        let members = self.members();
        let resync_pending = self.resync.lock().count() > 0 && self.can_resync();
        let recovering = members
            .iter()
            .flatten()
            .any(|m| matches!(*m.state.read(), SyncState::Recovering { .. }));
        let promotable = !spares.is_empty()
            && self.survives()
            && members
                .iter()
                .any(|m| m.as_ref().is_none_or(|m| m.is_failed()));
        let replacing = self.replacement_under_way().is_some();
        !resync_pending && !recovering && !promotable && !replacing
    }

    /// Mirrors resync among the copies left; parity needs every member
    /// (with one missing, a row whose parity disagrees with its data has
    /// nothing to be repaired from).
    fn can_resync(&self) -> bool {
        if self.geo.is_parity() {
            self.whole()
        } else {
            self.survives()
        }
    }

    /// Does one piece of work; false when there was none.
    fn work_step(&self) -> bool {
        if self.can_resync() && self.resync.lock().count() > 0 {
            self.resync_dirty();
            return true;
        }
        let members = self.members();
        for (slot, m) in members.iter().enumerate() {
            if !self.survives() {
                break; // nothing left to rebuild from
            }
            if let Some(m) = m {
                if matches!(*m.state.read(), SyncState::Recovering { .. }) {
                    self.recover(slot);
                    return true;
                }
            }
        }
        if self.survives() {
            if let Some(slot) = members
                .iter()
                .position(|m| m.as_ref().is_none_or(|m| m.is_failed()))
            {
                let mut spares = self.spares.lock();
                if !spares.is_empty() {
                    let spare = spares.remove(0);
                    tracing::info!(spare = %spare.name(), slot, "rebuilding onto hot spare");
                    // It carries the bits from now on, like every member.
                    let image = self.bitmap.image();
                    if let Err(e) = write_image_to(std::slice::from_ref(&spare.dev), &image, true) {
                        tracing::error!(spare = %spare.name(), error = %e, "spare failed");
                        return true;
                    }
                    *spare.state.write() = SyncState::Recovering {
                        done_rows: 0,
                        stale: None,
                    };
                    self.slots.write()[slot] = Some(spare);
                    drop(spares);
                    self.membership_changed();
                    return true;
                }
            }
        }
        if self.replace_step() {
            return true;
        }
        self.scheduled_scrub()
    }

    /// Runs a check scrub when `scrub_every` has passed since the last
    /// one, on a whole array; false if none was due.
    fn scheduled_scrub(&self) -> bool {
        let Some(every) = self.options.scrub_every else {
            return false;
        };
        // A clock set back counts as no time passed.
        let since = self.last_scrub_at.lock().elapsed().unwrap_or_default();
        if since < every || !self.whole() {
            return false;
        }
        tracing::info!("scheduled RAID scrub");
        match self.scrub(false) {
            Ok(r) if r.mismatches > 0 => {
                tracing::warn!(
                    mismatches = r.mismatches,
                    "scheduled RAID scrub found mismatches"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "scheduled RAID scrub failed"),
        }
        // Failed or not, not again before the next period.
        *self.last_scrub_at.lock() = std::time::SystemTime::now();
        true
    }

    /// Stripes (lock units) with a chunk at member row `row`.
    fn stripes_of_row(&self, row: u64) -> Vec<u64> {
        let g = &self.geo;
        if g.is_parity() {
            return vec![row];
        }
        let mut s: Vec<u64> = (0..g.members)
            .map(|member| g.stripe_of_place(Place { member, row }))
            .filter(|k| *k < g.logical_chunks())
            .collect();
        s.dedup();
        s
    }

    fn resync_dirty(&self) {
        let regions = self.resync.lock().clone();
        let rr = self.region_rows();
        let total = regions.count() * rr * self.geo.chunk;
        let mut throttle = Throttle::new(self);
        let mut synced = RegionSet::new(self.bitmap.regions);
        for region in regions.iter() {
            for row in region * rr..((region + 1) * rr).min(self.geo.rows) {
                if self.stop.load(Ordering::SeqCst) || !self.can_resync() {
                    return;
                }
                for stripe in self.stripes_of_row(row) {
                    let _g = self.locks.lock(stripe);
                    let r = if self.geo.is_parity() {
                        self.repair_row(row, None)
                    } else {
                        self.resync_copies(stripe)
                    };
                    if r.is_err() {
                        return; // a member failed: the worker starts over
                    }
                }
                throttle.done(self, self.geo.chunk);
                *self.progress.lock() = Some(Progress {
                    kind: "resync",
                    slot: None,
                    done_bytes: throttle.total,
                    total_bytes: total,
                    bytes_per_sec: throttle.rate(),
                });
            }
            synced.set(region, true);
            self.resync.lock().set(region, false);
        }
        // The repaired rows stable before their bits are cleared.
        for (slot, m) in self.members().iter().enumerate() {
            if let Some(m) = m.as_ref().filter(|m| !m.is_failed()) {
                if let Err(e) = m.flush() {
                    self.fail_member(slot, m, &e);
                    return;
                }
            }
        }
        *self.progress.lock() = None;
        self.report.lock().last_resync_bytes = Some(total);
        tracing::info!(bytes = total, "RAID resync of dirty regions done");
        let _ = self.with_bitmap_writer(|w| self.bitmap.clear_synced(&synced, w));
    }

    fn recover(&self, slot: usize) {
        let Some(target) = self.slots.read()[slot].clone() else {
            return;
        };
        let (start, stale) = match &*target.state.read() {
            SyncState::Recovering { done_rows, stale } => (*done_rows, stale.clone()),
            _ => return,
        };
        let rr = self.region_rows();
        let rows_to_do = match &stale {
            Some(s) => s.count() * rr,
            None => self.geo.rows,
        }
        .min(self.geo.rows);
        let total = rows_to_do * self.geo.chunk;
        let needed = |row: u64| stale.as_ref().is_none_or(|s| s.get(row / rr));
        let kind = if stale.is_some() {
            "catch-up"
        } else {
            "rebuild"
        };
        let target = &target;
        let go_on = || !target.is_failed();
        let plan = Plan {
            kind,
            slot,
            rows: start..self.geo.rows,
            step: self.step_rows(),
            total,
            needed: &needed,
            go_on: &go_on,
        };
        let complete = if self.rebuilds_in_batches(slot) {
            // Batches of rows, several in flight.
            let read = |rows: Range<u64>| match self.read_batch(slot, rows) {
                Ok(batch) => batch,
                Err(e) => {
                    tracing::warn!(slot, error = %e, "RAID rebuild failed");
                    None
                }
            };
            let write = |batch: Batch<'_>| self.write_batch(slot, target, batch);
            let advance = |to: u64| {
                if let SyncState::Recovering { done_rows, .. } = &mut *target.state.write() {
                    *done_rows = (*done_rows).max(to);
                }
            };
            self.run_copy(&plan, &read, &write, &advance)
        } else {
            self.recover_rows(&plan, target)
        };
        if !complete {
            return;
        }
        // Stable before its superblock says it is in sync, and so is what
        // it was rebuilt from: the other members' caches may still hold
        // data the rebuilt chunks already count on.
        if self.flush_all().is_err() || target.is_failed() {
            return;
        }
        {
            let mut st = target.state.write();
            if matches!(*st, SyncState::Failed) {
                return;
            }
            *st = SyncState::InSync;
        }
        *self.progress.lock() = None;
        if stale.is_some() {
            self.report.lock().last_catch_up_bytes = Some(total);
        }
        tracing::info!(member = %target.name(), slot, bytes = total, "RAID member in sync");
        self.membership_changed();
    }

    /// A row at a time, while another member is being brought up to date
    /// too (its rows are readable or not one by one); true when done.
    fn recover_rows(&self, plan: &Plan<'_>, target: &Member) -> bool {
        let mut throttle = Throttle::new(self);
        let mut row = plan.rows.start;
        while row < plan.rows.end {
            if self.stop.load(Ordering::SeqCst) || !(plan.go_on)() {
                return false;
            }
            if !(plan.needed)(row) {
                row = (row / self.region_rows() + 1) * self.region_rows();
                continue;
            }
            if !self.recover_row(plan.slot, target, row) {
                return false;
            }
            throttle.done(self, self.geo.chunk);
            *self.progress.lock() = Some(Progress {
                kind: plan.kind,
                slot: Some(plan.slot),
                done_bytes: throttle.total,
                total_bytes: plan.total,
                bytes_per_sec: throttle.rate(),
            });
            row += 1;
        }
        true
    }

    /// Brings one member row of the member in `slot` up to date and counts
    /// it done; false if that failed.
    fn recover_row(&self, slot: usize, target: &Member, row: u64) -> bool {
        let stripe = if self.geo.is_parity() {
            row
        } else {
            self.geo.stripe_of_place(Place { member: slot, row })
        };
        let _g = self.locks.lock(stripe);
        let r = if self.geo.is_parity() {
            self.repair_row(row, Some(slot))
        } else {
            self.recover_copy(slot, row)
        };
        match r {
            // Still under the lock: no write slips in between.
            Ok(()) => {
                if let SyncState::Recovering { done_rows, .. } = &mut *target.state.write() {
                    *done_rows = row + 1;
                }
                true
            }
            Err(e) => {
                if !target.is_failed() {
                    tracing::warn!(slot, error = %e, "RAID rebuild failed");
                }
                false
            }
        }
    }
}
