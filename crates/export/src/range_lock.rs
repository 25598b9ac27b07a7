//! Range locks over a device: shared holders never wait for one another,
//! an exclusive holder waits for and excludes every overlapping one. The
//! ranges are in bytes when the lock belongs to a [`crate::Backing`], so
//! every transport and logical unit over it locks the same thing.

use parking_lot::{Condvar, Mutex};

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
}

#[derive(Default)]
struct State {
    next_id: u64,
    held: Vec<Held>,
}

pub struct RangeGuard<'a> {
    lock: &'a RangeLock,
    id: u64,
}

impl RangeLock {
    /// Locks `[start, start + len)` (in any unit the caller uses
    /// consistently). A zero length locks nothing but still orders against
    /// exclusive holders of the same start.
    pub fn lock(&self, start: u64, len: u64, exclusive: bool) -> RangeGuard<'_> {
        let end = start.saturating_add(len.max(1));
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
        let state = self.state.lock();
        if state.conflicts(start, end, exclusive) {
            return None;
        }
        Some(self.hold(state, start, end, exclusive))
    }

    fn hold(
        &self,
        mut state: parking_lot::MutexGuard<'_, State>,
        start: u64,
        end: u64,
        exclusive: bool,
    ) -> RangeGuard<'_> {
        let id = state.next_id;
        state.next_id = state.next_id.wrapping_add(1);
        state.held.push(Held {
            id,
            start,
            end,
            exclusive,
        });
        RangeGuard { lock: self, id }
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.state.lock().held.len()
    }
}

impl RangeLock {
    /// Ends the hold `id` ([`RangeGuard::detach`]).
    pub fn release(&self, id: u64) {
        let mut state = self.state.lock();
        if let Some(pos) = state.held.iter().position(|h| h.id == id) {
            state.held.swap_remove(pos);
        }
        drop(state);
        self.released.notify_all();
    }
}

impl RangeGuard<'_> {
    /// The hold, kept past this guard's borrow: whoever keeps the lock
    /// alive ends it with [`RangeLock::release`].
    pub fn detach(self) -> u64 {
        let id = self.id;
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
        // A disjoint exclusive lock does not wait.
        drop(l.lock(100, 1, true));
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
}
