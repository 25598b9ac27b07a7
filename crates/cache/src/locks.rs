//! Line locks: every I/O holds the locks of the lines it touches for its
//! whole duration, so a fill from the backing can never overwrite a newer
//! write, and a line is never evicted while someone reads its slot.
//!
//! Lines share a fixed set of mutexes by line number; a request takes its
//! stripes in ascending order, which keeps concurrent requests free of
//! deadlock.

use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

const STRIPES: usize = 1024;

pub struct LineLocks {
    stripes: Box<[Mutex<()>]>,
}

/// The stripes held by one request.
pub struct Held<'a> {
    /// Inline for the common request of a few lines: no allocation.
    stripes: SmallVec<[usize; 4]>,
    _guards: SmallVec<[MutexGuard<'a, ()>; 4]>,
}

impl Held<'_> {
    /// Whether this request already holds `line`'s lock.
    pub fn holds(&self, line: u64) -> bool {
        self.stripes.binary_search(&stripe(line)).is_ok()
    }
}

fn stripe(line: u64) -> usize {
    (line % STRIPES as u64) as usize
}

impl Default for LineLocks {
    fn default() -> Self {
        LineLocks {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }
}

impl LineLocks {
    /// Locks lines `first..=last`.
    pub fn lock(&self, first: u64, last: u64) -> Held<'_> {
        let mut stripes: SmallVec<[usize; 4]> = if last - first + 1 >= STRIPES as u64 {
            (0..STRIPES).collect()
        } else {
            (first..=last).map(stripe).collect()
        };
        stripes.sort_unstable();
        stripes.dedup();
        let guards = stripes.iter().map(|&s| self.stripes[s].lock()).collect();
        Held {
            stripes,
            _guards: guards,
        }
    }

    /// Every line.
    pub fn lock_all(&self) -> Held<'_> {
        self.lock(0, STRIPES as u64 - 1)
    }

    /// `line`'s lock if it is free now.
    pub fn try_lock(&self, line: u64) -> Option<MutexGuard<'_, ()>> {
        self.stripes[stripe(line)].try_lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_holds_its_lines_and_others_wait() {
        let locks = LineLocks::default();
        let held = locks.lock(5, 7);
        assert!(held.holds(6));
        assert!(held.holds(6 + STRIPES as u64), "shares a stripe");
        assert!(!held.holds(8));
        assert!(locks.try_lock(5).is_none());
        assert!(locks.try_lock(8).is_some());
        drop(held);
        assert!(locks.try_lock(5).is_some());
        assert!(locks.lock(0, 5000).holds(4000));
    }
}
