//! LBA range locks.
//!
//! Every medium access holds its LBA range for the duration of the device
//! call. Plain reads and writes hold it shared, so they never wait for one
//! another; COMPARE AND WRITE, ORWRITE, WRITE ATOMIC and SANITIZE hold it
//! exclusive, so no other access to those LBAs (from any nexus, any target
//! or EXTENDED COPY) can interleave with them. VMware ATS relies on this.

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
        while state
            .held
            .iter()
            .any(|h| h.start < end && start < h.end && (exclusive || h.exclusive))
        {
            self.released.wait(&mut state);
        }
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

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.lock.state.lock();
        if let Some(pos) = state.held.iter().position(|h| h.id == self.id) {
            state.held.swap_remove(pos);
        }
        drop(state);
        self.lock.released.notify_all();
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
}
