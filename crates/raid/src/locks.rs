//! Stripe locks: a write holds its stripe from the first read of old
//! data to the last member write, so parity always matches the data of
//! the writer that finished last, and a rebuild or resync of the stripe
//! sees no half-done write.

use std::collections::HashSet;

use parking_lot::{Condvar, Mutex};

const SHARDS: usize = 64;

#[derive(Default)]
struct Shard {
    held: Mutex<HashSet<u64>>,
    released: Condvar,
}

pub struct StripeLocks {
    shards: Vec<Shard>,
}

/// A held stripe; released on drop.
pub struct StripeGuard<'a> {
    locks: &'a StripeLocks,
    stripe: u64,
}

impl StripeLocks {
    pub fn new() -> StripeLocks {
        StripeLocks {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }

    fn shard(&self, stripe: u64) -> &Shard {
        &self.shards[(stripe % SHARDS as u64) as usize]
    }

    pub fn lock(&self, stripe: u64) -> StripeGuard<'_> {
        let shard = self.shard(stripe);
        let mut held = shard.held.lock();
        while held.contains(&stripe) {
            shard.released.wait(&mut held);
        }
        held.insert(stripe);
        StripeGuard {
            locks: self,
            stripe,
        }
    }
}

impl Drop for StripeGuard<'_> {
    fn drop(&mut self) {
        let shard = self.locks.shard(self.stripe);
        shard.held.lock().remove(&self.stripe);
        shard.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn one_holder_per_stripe() {
        let locks = StripeLocks::new();
        let inside = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..500 {
                        let _g = locks.lock(7);
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        // Different stripes do not wait for each other.
        let _a = locks.lock(1);
        let _b = locks.lock(1 + SHARDS as u64);
    }
}
