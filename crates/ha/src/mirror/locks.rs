//! Keeps a resync's copy of a region apart from foreground writes to it:
//! a copy read before a write and sent after it would overwrite the
//! write on the peer.

use std::collections::HashMap;
use std::ops::RangeInclusive;

use parking_lot::{Condvar, Mutex};

/// Per region: foreground writes in it (> 0) or a copy (-1).
#[derive(Default)]
pub struct RegionLocks {
    held: Mutex<HashMap<u64, i64>>,
    freed: Condvar,
}

pub struct Foreground<'a> {
    locks: &'a RegionLocks,
    regions: RangeInclusive<u64>,
}

pub struct Copy<'a> {
    locks: &'a RegionLocks,
    region: u64,
}

impl RegionLocks {
    /// Waits until no copy runs in `regions`, then holds them shared.
    pub fn foreground(&self, regions: RangeInclusive<u64>) -> Foreground<'_> {
        let mut held = self.held.lock();
        while regions
            .clone()
            .any(|r| held.get(&r).is_some_and(|n| *n < 0))
        {
            self.freed.wait(&mut held);
        }
        for r in regions.clone() {
            *held.entry(r).or_insert(0) += 1;
        }
        Foreground {
            locks: self,
            regions,
        }
    }

    /// Waits until no write runs in `region`, then holds it alone.
    pub fn copy(&self, region: u64) -> Copy<'_> {
        let mut held = self.held.lock();
        while held.contains_key(&region) {
            self.freed.wait(&mut held);
        }
        held.insert(region, -1);
        Copy {
            locks: self,
            region,
        }
    }
}

impl Drop for Foreground<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock();
        for r in self.regions.clone() {
            if let Some(n) = held.get_mut(&r) {
                *n -= 1;
                if *n == 0 {
                    held.remove(&r);
                }
            }
        }
        self.locks.freed.notify_all();
    }
}

impl Drop for Copy<'_> {
    fn drop(&mut self) {
        self.locks.held.lock().remove(&self.region);
        self.locks.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_copy_waits_for_writes_and_writes_for_a_copy() {
        let locks = Arc::new(RegionLocks::default());
        let w = locks.foreground(0..=1);
        let l = locks.clone();
        let copier = std::thread::spawn(move || {
            let _c = l.copy(1);
            std::thread::sleep(Duration::from_millis(50));
        });
        std::thread::sleep(Duration::from_millis(20));
        assert!(!copier.is_finished(), "the copy waits for the write");
        let _other = locks.foreground(2..=2);
        drop(w);
        std::thread::sleep(Duration::from_millis(10));
        let start = std::time::Instant::now();
        drop(locks.foreground(1..=1));
        assert!(
            start.elapsed() >= Duration::from_millis(20),
            "the write waited for the copy"
        );
        copier.join().unwrap();
    }
}
