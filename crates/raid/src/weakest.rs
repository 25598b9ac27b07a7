//! The weakest link: a member markedly slower than its peers holds every
//! stripe back to its own pace, so the array names it and says what it
//! costs. Judged from the foreground I/O of the last few minutes of
//! in-sync members only (see [`crate::recent`]): a member is not slow for
//! its rebuild's batches, nor for what it did long ago.

use std::sync::Arc;
use std::time::Duration;

use block::BlockDevice;
use serde::Serialize;

use crate::array::RaidArray;
use crate::geometry::Level;
use crate::member::Member;
use crate::recent::{Figures, WINDOW};

/// Ratio of a member's mean time per I/O to its peers' median above which
/// it is reported.
const SLOWER: f64 = 1.5;
/// Nor is a difference below this many nanoseconds per I/O (noise on
/// memory-fast members, where a few preemptions on a busy host move a
/// mean by tens of microseconds).
const MIN_GAP_NS: u64 = 50_000;
/// I/Os a member needs within the window before its figures count.
const MIN_OPS: u64 = 32;

#[derive(Clone, Debug, Serialize)]
pub struct WeakLink {
    pub slot: usize,
    pub name: String,
    /// Mean nanoseconds per I/O of this member and the median of its peers'.
    pub mean_ns: u64,
    pub peers_mean_ns: u64,
    /// How many times slower than its peers.
    pub slower: f64,
    /// Members whose I/O one full stripe waits on together.
    pub stripe_width: usize,
    /// The sample: this member's foreground I/Os and its peers' (all of
    /// them together) over the last `window_secs`.
    pub ops: u64,
    pub peers_ops: u64,
    pub window_secs: u64,
    pub finding: String,
}

fn mean_ns(f: &Figures) -> u64 {
    f.nanos / f.ops.max(1)
}

fn ms(ns: u64) -> String {
    format!("{:.2} ms", ns as f64 / 1e6)
}

impl RaidArray {
    /// Gives members their names from the configuration (for status and
    /// findings), matched by device.
    pub fn name_members(&self, names: &[(Arc<dyn BlockDevice>, String)]) {
        let core = &self.core;
        let spares: Vec<Arc<Member>> = core.spares.lock().clone();
        let replacements: Vec<Arc<Member>> = core
            .members()
            .iter()
            .flatten()
            .filter_map(|m| m.replacement())
            .collect();
        for m in core
            .members()
            .into_iter()
            .flatten()
            .chain(spares)
            .chain(replacements)
        {
            if let Some((_, n)) = names.iter().find(|(d, _)| Arc::ptr_eq(d, &m.dev)) {
                m.set_name(n);
            }
        }
    }

    /// Moves the clock of the members' recent I/O figures on, as if `by`
    /// had passed: tests see figures age out without waiting.
    pub fn advance_clock(&self, by: Duration) {
        self.core.clock.advance(by);
    }

    /// The in-sync member markedly slower than its peers, if one is; none
    /// on a failed array.
    pub fn weakest_link(&self) -> Option<WeakLink> {
        let core = &self.core;
        let g = core.geo;
        if !core.survives() {
            return None;
        }
        let timed: Vec<(usize, Arc<Member>, Figures)> = core
            .members()
            .into_iter()
            .enumerate()
            .filter_map(|(slot, m)| {
                let m = m.filter(|m| m.is_in_sync())?;
                let f = m.stats.recent.figures();
                (f.ops >= MIN_OPS).then_some((slot, m, f))
            })
            .collect();
        if timed.len() < 2 {
            return None;
        }
        let (slot, m, figures) = timed.iter().max_by_key(|t| mean_ns(&t.2))?.clone();
        let slowest = mean_ns(&figures);
        let others = || timed.iter().filter(|t| t.0 != slot);
        let mut peers: Vec<u64> = others().map(|t| mean_ns(&t.2)).collect();
        let peers_ops = others().map(|t| t.2.ops).sum();
        peers.sort_unstable();
        let median = peers[peers.len() / 2].max(1);
        let slower = slowest as f64 / median as f64;
        if slower < SLOWER || slowest - median < MIN_GAP_NS {
            return None;
        }
        let width = match g.level {
            Level::Raid0 => g.members,
            Level::Raid1 => 1,
            Level::Raid10 => (g.members / 2).max(1),
            Level::Raid5 | Level::Raid6 => g.data_columns(),
        };
        let name = m.name();
        let consequence = match g.level {
            Level::Raid1 => {
                format!("every write waits for {name}: the mirror writes at {name}'s speed")
            }
            _ => format!("the stripe runs at {width} x {name}'s speed"),
        };
        Some(WeakLink {
            slot,
            name: name.clone(),
            mean_ns: slowest,
            peers_mean_ns: median,
            slower,
            stripe_width: width,
            ops: figures.ops,
            peers_ops,
            window_secs: WINDOW.as_secs(),
            finding: format!(
                "{name} is {slower:.1}x slower than its peers ({} vs {} per I/O, \
                 over {} of its I/Os and {peers_ops} of theirs in the last {} s): {consequence}",
                ms(slowest),
                ms(median),
                figures.ops,
                WINDOW.as_secs()
            ),
        })
    }
}
