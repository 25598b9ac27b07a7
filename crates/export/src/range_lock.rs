//! Range locks over a device: shared holders never wait for one another,
//! an exclusive holder waits for and excludes every overlapping one. The
//! ranges are in bytes when the lock belongs to a [`crate::Backing`], so
//! every transport and logical unit over it locks the same thing.
//!
//! Shared holds are nearly all there is (reads and writes; exclusive ones
//! are COMPARE AND WRITE, ORWRITE, WRITE ATOMIC and SANITIZE), so while no exclusive holder or
//! waiter exists a shared holder only counts itself in its thread's slot
//! ([`crate::thread_slots`]): connections served on two CPUs then touch no
//! common cache line per request. An exclusive locker first turns that
//! off, so later shared holders register their ranges, and waits for the
//! counted ones to end, whatever their ranges.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::thread_slots::{self, PerSlot};

/// Set in the id of a hold counted in a thread slot (the slot below it).
const COUNTED: u64 = 1 << 63;

#[derive(Debug)]
struct Held {
    id: u64,
    start: u64,
    end: u64,
    exclusive: bool,
}

#[derive(Default)]
pub struct RangeLock {
    state: Mutex<State>,
    released: Condvar,
    /// Exclusive holders and waiters: while any, shared holders register.
    exclusive: AtomicUsize,
    /// Shared holders counted per thread slot, not registered.
    counted: PerSlot<AtomicUsize>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    held: Vec<Held>,
}

pub struct RangeGuard<'a> {
    lock: &'a RangeLock,
    id: u64,
    /// The range, for a counted hold to register if it is detached.
    start: u64,
    end: u64,
}

impl RangeLock {
    /// Locks `[start, start + len)` (in any unit the caller uses
    /// consistently). A zero length locks nothing but still orders against
    /// exclusive holders of the same start.
    pub fn lock(&self, start: u64, len: u64, exclusive: bool) -> RangeGuard<'_> {
        let end = start.saturating_add(len.max(1));
        if exclusive {
            self.exclusive.fetch_add(1, SeqCst);
            self.wait_counted_out();
        } else if let Some(counted) = self.count_shared(start, end) {
            return counted;
        }
        let mut state = self.state.lock();
        while state.conflicts(start, end, exclusive) {
            self.released.wait(&mut state);
        }
        self.hold(state, start, end, exclusive)
    }

    /// [`RangeLock::lock`] for a caller that must not wait: `None` while
    /// another holder is in the way.
    pub fn try_lock(&self, start: u64, len: u64, exclusive: bool) -> Option<RangeGuard<'_>> {
        let end = start.saturating_add(len.max(1));
        if exclusive {
            self.exclusive.fetch_add(1, SeqCst);
            if self.any_counted() {
                self.exclusive.fetch_sub(1, SeqCst);
                return None;
            }
        } else if let Some(counted) = self.count_shared(start, end) {
            return Some(counted);
        }
        let state = self.state.lock();
        if state.conflicts(start, end, exclusive) {
            drop(state);
            if exclusive {
                self.exclusive.fetch_sub(1, SeqCst);
            }
            return None;
        }
        Some(self.hold(state, start, end, exclusive))
    }

    /// A shared hold counted in this thread's slot, while no exclusive
    /// holder or waiter exists. The slot is raised before `exclusive` is
    /// read, and an exclusive locker raises `exclusive` before reading the
    /// slots, so at least one of the two sees the other.
    fn count_shared(&self, start: u64, end: u64) -> Option<RangeGuard<'_>> {
        if self.exclusive.load(SeqCst) != 0 {
            return None;
        }
        let slot = thread_slots::slot();
        let count = self.counted.get(slot);
        count.fetch_add(1, SeqCst);
        if self.exclusive.load(SeqCst) == 0 {
            return Some(RangeGuard {
                lock: self,
                id: COUNTED | slot as u64,
                start,
                end,
            });
        }
        count.fetch_sub(1, SeqCst);
        None
    }

    fn any_counted(&self) -> bool {
        self.counted.iter().any(|c| c.load(SeqCst) != 0)
    }

    /// Waits for the counted shared holds to end: they last one device
    /// call, so polling with a growing pause serves.
    fn wait_counted_out(&self) {
        let mut pause = Duration::from_micros(1);
        while self.any_counted() {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_micros(200));
        }
    }

    fn hold(
        &self,
        state: parking_lot::MutexGuard<'_, State>,
        start: u64,
        end: u64,
        exclusive: bool,
    ) -> RangeGuard<'_> {
        let id = register(state, start, end, exclusive);
        RangeGuard {
            lock: self,
            id,
            start,
            end,
        }
    }

    /// Turns counted hold `id` into a registered one, for a holder that
    /// keeps it past the call (an exclusive locker waits for counted holds
    /// whatever their ranges, so only short ones may stay counted).
    fn register_counted(&self, id: u64, start: u64, end: u64) -> u64 {
        let registered = register(self.state.lock(), start, end, false);
        self.release(id);
        registered
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        let counted: usize = self.counted.iter().map(|c| c.load(SeqCst)).sum();
        self.state.lock().held.len() + counted
    }
}

impl RangeLock {
    /// Ends the hold `id` ([`RangeGuard::detach`]).
    pub fn release(&self, id: u64) {
        if id & COUNTED != 0 {
            let slot = (id & !COUNTED) as usize;
            self.counted.get(slot).fetch_sub(1, SeqCst);
            return;
        }
        let mut state = self.state.lock();
        if let Some(pos) = state.held.iter().position(|h| h.id == id) {
            if state.held.swap_remove(pos).exclusive {
                self.exclusive.fetch_sub(1, SeqCst);
            }
        }
        drop(state);
        self.released.notify_all();
    }
}

/// Records a hold of `[start, end)` in `state`; returns its id.
fn register(
    mut state: parking_lot::MutexGuard<'_, State>,
    start: u64,
    end: u64,
    exclusive: bool,
) -> u64 {
    let id = state.next_id;
    state.next_id = state.next_id.wrapping_add(1) & !COUNTED;
    state.held.push(Held {
        id,
        start,
        end,
        exclusive,
    });
    id
}

impl RangeGuard<'_> {
    /// The hold, kept past this guard's borrow: whoever keeps the lock
    /// alive ends it with [`RangeLock::release`].
    pub fn detach(self) -> u64 {
        let id = if self.id & COUNTED != 0 {
            self.lock.register_counted(self.id, self.start, self.end)
        } else {
            self.id
        };
        std::mem::forget(self);
        id
    }
}

impl State {
    fn conflicts(&self, start: u64, end: u64, exclusive: bool) -> bool {
        self.held
            .iter()
            .any(|h| h.start < end && start < h.end && (exclusive || h.exclusive))
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        self.lock.release(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn shared_holders_coexist_and_release() {
        let l = RangeLock::default();
        let a = l.lock(0, 10, false);
        let b = l.lock(5, 10, false);
        assert_eq!(l.held(), 2);
        drop(a);
        drop(b);
        assert_eq!(l.held(), 0);
    }

    #[test]
    fn exclusive_waits_for_overlapping_shared() {
        let l = Arc::new(RangeLock::default());
        let shared = l.lock(0, 8, false);
        let done = Arc::new(AtomicBool::new(false));
        let t = {
            let (l, done) = (l.clone(), done.clone());
            std::thread::spawn(move || {
                let _g = l.lock(4, 1, true);
                done.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!done.load(Ordering::SeqCst));
        drop(shared);
        t.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }

    #[test]
    fn try_lock_refuses_only_what_would_wait() {
        let l = RangeLock::default();
        let exclusive = l.lock(0, 8, true);
        assert!(l.try_lock(4, 1, false).is_none());
        let apart = l.try_lock(8, 8, false).expect("a disjoint range is free");
        let id = apart.detach();
        assert_eq!(l.held(), 2);
        assert!(
            l.try_lock(10, 1, true).is_none(),
            "a detached hold still holds"
        );
        l.release(id);
        drop(exclusive);
        assert_eq!(l.held(), 0);
        assert!(l.try_lock(0, 16, true).is_some());
    }

    #[test]
    fn a_disjoint_exclusive_does_not_wait_for_registered_holds() {
        let l = RangeLock::default();
        let first = l.lock(0, 8, true);
        // With an exclusive holder, shared holds register their ranges...
        let shared = l.lock(100, 1, false);
        assert_eq!(shared.id & COUNTED, 0);
        // ...so another exclusive one waits for overlapping ones only.
        drop(l.lock(200, 1, true));
        drop((first, shared));
        assert_eq!(l.held(), 0);
        assert_eq!(l.exclusive.load(SeqCst), 0);
    }

    #[test]
    fn a_counted_hold_registers_when_detached() {
        let l = RangeLock::default();
        let counted = l.lock(0, 8, false);
        assert_ne!(counted.id & COUNTED, 0, "no exclusive holder: counted");
        assert!(
            l.try_lock(100, 1, true).is_none(),
            "an exclusive holder waits for counted holds whatever their range"
        );
        let id = counted.detach();
        assert_eq!(id & COUNTED, 0);
        assert!(l.try_lock(100, 1, true).is_some());
        assert!(l.try_lock(4, 1, true).is_none());
        l.release(id);
        assert!(l.try_lock(4, 1, true).is_some());
        assert_eq!(l.held(), 0);
    }
}
