//! Units whose pages a transport holds to send later
//! ([`crate::VolumeDevice`]'s `mapped_bytes`). The pages go into the socket
//! only when the answer is written, and by then the unit could have been
//! freed (a discard, a deleted volume) and filled with another volume's
//! data, which this READ would then carry. So a unit held for sending is
//! neither released to its device nor reused until its last hold is
//! dropped: a commit that frees it leaves it held (as units freed since
//! the last commit are, see space.rs), and the last hold frees it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::pool::Pool;

#[derive(Default)]
pub(crate) struct SendHolds {
    inner: Mutex<Holds>,
}

#[derive(Default)]
struct Holds {
    /// Pages held per unit.
    count: HashMap<u64, u32, foldhash::fast::RandomState>,
    /// Freed by a commit while held: free once the last hold goes.
    freed: HashSet<u64>,
}

impl SendHolds {
    /// One hold more on `unit`. The caller holds the pool's state lock and
    /// found the unit mapped, so no commit frees it meanwhile.
    pub fn hold(&self, unit: u64) {
        *self.inner.lock().count.entry(unit).or_insert(0) += 1;
    }

    /// One hold less; true when it was the last of a unit a commit freed
    /// meanwhile, which the caller then frees.
    fn release(&self, unit: u64) -> bool {
        let mut holds = self.inner.lock();
        let Some(count) = holds.count.get_mut(&unit) else {
            return false;
        };
        *count -= 1;
        if *count > 0 {
            return false;
        }
        holds.count.remove(&unit);
        holds.freed.remove(&unit)
    }

    /// Of the units a commit frees, those free now; the held ones are kept
    /// back until their last hold goes.
    pub fn free_now(&self, freed: &[u64]) -> Vec<u64> {
        let mut holds = self.inner.lock();
        let mut now = Vec::with_capacity(freed.len());
        for &unit in freed {
            if holds.count.contains_key(&unit) {
                holds.freed.insert(unit);
            } else {
                now.push(unit);
            }
        }
        now
    }

    #[cfg(test)]
    pub fn kept_back(&self) -> usize {
        self.inner.lock().freed.len()
    }
}

/// A hold on one unit for as long as its pages wait to be sent.
pub(crate) struct SendHold {
    pool: Arc<Pool>,
    unit: u64,
}

impl SendHold {
    /// Takes a hold on `unit` (see [`SendHolds::hold`] for when).
    pub fn new(pool: Arc<Pool>, unit: u64) -> SendHold {
        pool.send_holds.hold(unit);
        SendHold { pool, unit }
    }
}

impl Drop for SendHold {
    fn drop(&mut self) {
        if self.pool.send_holds.release(self.unit) {
            self.pool.free_kept_back(self.unit);
        }
    }
}
