//! A member's recent foreground I/O, for the weakest link: I/Os and their
//! time in each interval of the last few minutes, in a small ring. Totals
//! since start would keep a member slow long ago named for hours.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The span of one sample.
pub const INTERVAL: Duration = Duration::from_secs(15);
/// Samples kept: the current interval and the ones before it.
const INTERVALS: usize = 12;
/// How far back the figures reach.
pub const WINDOW: Duration = Duration::from_secs(INTERVAL.as_secs() * INTERVALS as u64);

/// Whom a member I/O serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A read or write the array serves for its users.
    Foreground,
    /// Rebuild, resync, catch-up, replacement copy, scrub or log replay:
    /// larger batches, and I/O queued behind them, say nothing of how
    /// fast the member serves users.
    Background,
}

/// An array's clock for the samples: monotonic, and movable on so that
/// tests see figures age out without waiting.
pub struct Clock {
    base: Instant,
    ahead_ms: AtomicU64,
}

impl Default for Clock {
    fn default() -> Clock {
        Clock {
            base: Instant::now(),
            ahead_ms: AtomicU64::new(0),
        }
    }
}

impl Clock {
    /// The interval now falls in.
    fn interval(&self) -> u64 {
        let ms = self.base.elapsed().as_millis() as u64 + self.ahead_ms.load(Ordering::Relaxed);
        ms / INTERVAL.as_millis() as u64
    }

    pub fn advance(&self, by: Duration) {
        self.ahead_ms
            .fetch_add(by.as_millis() as u64, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy)]
struct Sample {
    interval: u64,
    ops: u64,
    nanos: u64,
    /// The member did background I/O in this interval too: its foreground
    /// I/O queued behind that, so the interval does not count.
    background: bool,
}

/// Foreground I/Os over the window and the nanoseconds they took.
#[derive(Clone, Copy, Debug, Default)]
pub struct Figures {
    pub ops: u64,
    pub nanos: u64,
}

/// The samples of one member, one per interval, by interval number
/// modulo their count.
#[derive(Default)]
pub struct Recent {
    /// The array's, set when the member joins it; nothing is sampled
    /// before.
    clock: OnceLock<Arc<Clock>>,
    ring: Mutex<[Option<Sample>; INTERVALS]>,
}

impl Recent {
    pub fn set_clock(&self, clock: &Arc<Clock>) {
        // A member joins one array: a second call brings the same clock.
        let _ = self.clock.set(clock.clone());
    }

    /// Counts one read or write that took `nanos`.
    pub fn record(&self, origin: Origin, nanos: u64) {
        let Some(clock) = self.clock.get() else {
            return;
        };
        let now = clock.interval();
        let mut ring = self.ring.lock();
        let slot = &mut ring[(now % INTERVALS as u64) as usize];
        let s = match slot {
            Some(s) if s.interval == now => s,
            _ => slot.insert(Sample {
                interval: now,
                ops: 0,
                nanos: 0,
                background: false,
            }),
        };
        match origin {
            Origin::Foreground => {
                s.ops += 1;
                s.nanos += nanos;
            }
            Origin::Background => s.background = true,
        }
    }

    /// Foreground I/O over the window, leaving out intervals with
    /// background I/O.
    pub fn figures(&self) -> Figures {
        let Some(clock) = self.clock.get() else {
            return Figures::default();
        };
        let now = clock.interval();
        self.ring
            .lock()
            .iter()
            .flatten()
            .filter(|s| now.saturating_sub(s.interval) < INTERVALS as u64 && !s.background)
            .fold(Figures::default(), |f, s| Figures {
                ops: f.ops + s.ops,
                nanos: f.nanos + s.nanos,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recent() -> (Recent, Arc<Clock>) {
        let clock = Arc::new(Clock::default());
        let r = Recent::default();
        r.set_clock(&clock);
        (r, clock)
    }

    #[test]
    fn samples_age_out_of_the_window() {
        let (r, clock) = recent();
        r.record(Origin::Foreground, 100);
        clock.advance(INTERVAL);
        r.record(Origin::Foreground, 10);
        let f = r.figures();
        assert_eq!((f.ops, f.nanos), (2, 110));
        clock.advance(WINDOW - INTERVAL);
        let f = r.figures();
        assert_eq!((f.ops, f.nanos), (1, 10));
        clock.advance(INTERVAL);
        assert_eq!(r.figures().ops, 0);
    }

    #[test]
    fn an_interval_with_background_io_does_not_count() {
        let (r, clock) = recent();
        r.record(Origin::Foreground, 100);
        r.record(Origin::Background, 5);
        clock.advance(INTERVAL);
        r.record(Origin::Foreground, 10);
        let f = r.figures();
        assert_eq!((f.ops, f.nanos), (1, 10));
    }

    #[test]
    fn a_member_outside_an_array_has_no_figures() {
        let r = Recent::default();
        r.record(Origin::Foreground, 100);
        assert_eq!(r.figures().ops, 0);
    }
}
