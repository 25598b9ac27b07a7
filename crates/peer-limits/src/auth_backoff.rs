//! A back-off per key after failed attempts, in bounded memory.
//!
//! Every failure of a key doubles the time its next attempt must wait,
//! from `base` up to `max`. Attempts are serialised into slots: each one
//! waits for the key's next allowed time and moves that time on by the
//! current delay, so attempts made in parallel are spaced out like ones
//! made in turn. A success forgets the key; a quiet key's count halves
//! every `decay`. At most `capacity` keys are remembered; past that the
//! one touched longest ago is dropped. Nothing here knows about time
//! sources or locks: callers pass `now` and serialise access themselves.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Failures counted beyond this add nothing: the delay is long capped.
const MAX_COUNT: u32 = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Delay after the first failure.
    pub base: Duration,
    /// Longest delay.
    pub max: Duration,
    /// A key without failures for this long has its count halved.
    pub decay: Duration,
    /// Most keys remembered.
    pub capacity: usize,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    failures: u32,
    /// When the next attempt may go ahead.
    next: Instant,
    /// Start of the current decay period.
    since: Instant,
    /// Last use, for eviction.
    touched: Instant,
}

impl Entry {
    fn decay(&mut self, now: Instant, period: Duration) {
        if period.is_zero() {
            return;
        }
        let quiet = now.saturating_duration_since(self.since);
        let periods = quiet.as_nanos() / period.as_nanos();
        if periods == 0 {
            return;
        }
        self.failures = self
            .failures
            .checked_shr(periods.min(32) as u32)
            .unwrap_or(0);
        self.since = now;
    }

    /// Whether the entry still means anything at `now`.
    fn live(&self, now: Instant) -> bool {
        self.failures > 0 || self.next > now
    }
}

/// Back-off state for keys of type `K`.
#[derive(Debug)]
pub struct KeyedBackoff<K> {
    settings: Settings,
    entries: HashMap<K, Entry>,
}

impl<K: Hash + Eq + Clone> KeyedBackoff<K> {
    pub fn new(settings: Settings) -> Self {
        KeyedBackoff {
            settings: Settings {
                capacity: settings.capacity.max(1),
                ..settings
            },
            entries: HashMap::new(),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The wait after `failures` failures: none, then `base` doubling up
    /// to `max`.
    pub fn delay(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let factor = 1u32 << (failures - 1).min(31);
        self.settings
            .base
            .saturating_mul(factor)
            .min(self.settings.max)
    }

    /// Takes the next slot for an attempt concerning all of `keys`: the
    /// instant it may go ahead, the latest of the keys' next allowed
    /// times. `None`, and nothing taken, when that is after `latest`.
    pub fn reserve(&mut self, keys: &[K], now: Instant, latest: Instant) -> Option<Instant> {
        let decay = self.settings.decay;
        let mut start = now;
        for key in keys {
            if let Some(e) = self.entries.get_mut(key) {
                e.decay(now, decay);
                if e.failures > 0 {
                    start = start.max(e.next);
                }
            }
        }
        if start > latest {
            return None;
        }
        for key in keys {
            let delay = match self.entries.get(key) {
                Some(e) if e.failures > 0 => self.delay(e.failures),
                _ => continue,
            };
            if let Some(e) = self.entries.get_mut(key) {
                e.next = e.next.max(start + delay);
                e.touched = now;
            }
        }
        Some(start)
    }

    /// Counts a failed attempt against each of `keys` (distinct keys);
    /// the highest count among them.
    pub fn failed(&mut self, keys: &[K], now: Instant) -> u32 {
        let decay = self.settings.decay;
        let mut highest = 0;
        for key in keys {
            if !self.entries.contains_key(key) {
                self.make_room(now);
                self.entries.insert(
                    key.clone(),
                    Entry {
                        failures: 0,
                        next: now,
                        since: now,
                        touched: now,
                    },
                );
            }
            let Some(e) = self.entries.get_mut(key) else {
                continue;
            };
            e.decay(now, decay);
            e.failures = (e.failures + 1).min(MAX_COUNT);
            e.since = now;
            e.touched = now;
            let failures = e.failures;
            let next = now + self.delay(failures);
            if let Some(e) = self.entries.get_mut(key) {
                e.next = e.next.max(next);
            }
            highest = highest.max(failures);
        }
        highest
    }

    /// A success: `keys` start over.
    pub fn succeeded(&mut self, keys: &[K]) {
        for key in keys {
            self.entries.remove(key);
        }
    }

    /// The failures counted for `key` as of `now`.
    pub fn failures(&mut self, key: &K, now: Instant) -> u32 {
        let decay = self.settings.decay;
        self.entries.get_mut(key).map_or(0, |e| {
            e.decay(now, decay);
            e.failures
        })
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Below capacity: first without keys that no longer delay anything,
    /// then without the one touched longest ago.
    fn make_room(&mut self, now: Instant) {
        if self.entries.len() < self.settings.capacity {
            return;
        }
        let decay = self.settings.decay;
        self.entries.retain(|_, e| {
            e.decay(now, decay);
            e.live(now)
        });
        while self.entries.len() >= self.settings.capacity {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.touched)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.entries.remove(&k),
                None => break,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn backoff(capacity: usize) -> KeyedBackoff<&'static str> {
        KeyedBackoff::new(Settings {
            base: 10 * MS,
            max: 100 * MS,
            decay: Duration::from_secs(60),
            capacity,
        })
    }

    fn far(now: Instant) -> Instant {
        now + Duration::from_secs(3600)
    }

    #[test]
    fn delays_double_up_to_the_cap() {
        let b = backoff(8);
        let delays: Vec<_> = (0..7).map(|n| b.delay(n)).collect();
        assert_eq!(
            delays,
            [0, 10, 20, 40, 80, 100, 100].map(|m| m * MS).to_vec()
        );
        assert_eq!(b.delay(u32::MAX), 100 * MS);
    }

    #[test]
    fn a_key_without_failures_goes_ahead_at_once() {
        let mut b = backoff(8);
        let now = Instant::now();
        assert_eq!(b.reserve(&["a"], now, now), Some(now));
        assert_eq!(b.reserve(&["a"], now, now), Some(now));
        assert!(b.is_empty(), "successes cost no memory");
    }

    #[test]
    fn failures_delay_the_next_attempt_and_success_resets() {
        let mut b = backoff(8);
        let t0 = Instant::now();
        assert_eq!(b.failed(&["a"], t0), 1);
        assert_eq!(b.reserve(&["a"], t0, far(t0)), Some(t0 + 10 * MS));
        let t1 = t0 + 10 * MS;
        assert_eq!(b.failed(&["a"], t1), 2);
        assert_eq!(b.reserve(&["a"], t1, far(t1)), Some(t1 + 20 * MS));
        // Another key is not affected.
        assert_eq!(b.reserve(&["b"], t1, far(t1)), Some(t1));
        b.succeeded(&["a"]);
        assert_eq!(b.reserve(&["a"], t1, t1), Some(t1));
        assert_eq!(b.failures(&"a", t1), 0);
    }

    #[test]
    fn parallel_attempts_are_spaced_into_slots() {
        let mut b = backoff(8);
        let t0 = Instant::now();
        for _ in 0..5 {
            b.failed(&["a"], t0);
        }
        // Five failures: 100 ms a slot. Ten attempts at once get ten slots.
        let starts: Vec<_> = (0..10)
            .map(|_| b.reserve(&["a"], t0, far(t0)).unwrap())
            .collect();
        for (i, start) in starts.iter().enumerate() {
            assert_eq!(*start, t0 + 100 * MS * (i as u32 + 1));
        }
    }

    #[test]
    fn the_latest_of_several_keys_counts_and_all_move_on() {
        let mut b = backoff(8);
        let t0 = Instant::now();
        b.failed(&["name"], t0);
        b.failed(&["addr"], t0);
        b.failed(&["addr"], t0);
        let start = b.reserve(&["name", "addr"], t0, far(t0)).unwrap();
        assert_eq!(start, t0 + 20 * MS);
        // Both keys' next slots are after this one.
        assert_eq!(b.reserve(&["name"], t0, far(t0)), Some(start + 10 * MS));
        assert_eq!(b.reserve(&["addr"], t0, far(t0)), Some(start + 20 * MS));
    }

    #[test]
    fn a_slot_past_the_latest_is_not_taken() {
        let mut b = backoff(8);
        let t0 = Instant::now();
        b.failed(&["a"], t0);
        assert_eq!(b.reserve(&["a"], t0, t0 + 5 * MS), None);
        // Refusing took nothing: the slot is still the first one.
        assert_eq!(b.reserve(&["a"], t0, far(t0)), Some(t0 + 10 * MS));
    }

    #[test]
    fn quiet_keys_decay() {
        let mut b = backoff(8);
        let t0 = Instant::now();
        for _ in 0..4 {
            b.failed(&["a"], t0);
        }
        let minute = Duration::from_secs(60);
        assert_eq!(b.failures(&"a", t0 + minute - MS), 4);
        assert_eq!(b.failures(&"a", t0 + minute), 2);
        assert_eq!(b.failures(&"a", t0 + 3 * minute), 0);
        let later = t0 + 3 * minute;
        assert_eq!(b.reserve(&["a"], later, later), Some(later));
    }

    #[test]
    fn memory_is_bounded_and_the_oldest_key_goes() {
        let mut b: KeyedBackoff<u32> = KeyedBackoff::new(Settings {
            capacity: 100,
            ..*backoff(1).settings()
        });
        let t0 = Instant::now();
        b.failed(&[0], t0);
        for k in 1..1000u32 {
            b.failed(&[k], t0 + MS * k);
            // The first key is kept alive by its owner's attempts.
            if k % 10 == 0 {
                b.failed(&[0], t0 + MS * k);
            }
            assert!(b.len() <= 100);
        }
        assert_eq!(b.failures(&0, t0 + 1000 * MS), MAX_COUNT);
        assert_eq!(b.failures(&1, t0 + 1000 * MS), 0, "evicted");
        assert_eq!(b.failures(&999, t0 + 1000 * MS), 1);
    }

    #[test]
    fn counts_saturate() {
        let mut b = backoff(8);
        let t0 = Instant::now();
        for _ in 0..1000 {
            b.failed(&["a"], t0);
        }
        assert_eq!(b.failures(&"a", t0), MAX_COUNT);
        assert_eq!(b.delay(MAX_COUNT), 100 * MS);
    }
}
