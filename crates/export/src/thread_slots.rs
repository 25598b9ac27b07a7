//! Counters kept per thread slot, each on its own cache line: a thread
//! adds to its own slot, so two CPUs serving requests of one device never
//! pass a cache line back and forth per request (on two busy vCPUs that
//! cost more than the rest of a 4K read's user-space work). Readers sum
//! the slots.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Slots per set: threads beyond this share slots, which stays correct.
pub const SLOTS: usize = 32;

/// A value alone on its cache line (two lines: adjacent-line prefetch).
#[derive(Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// This thread's slot, assigned round-robin at its first use.
pub fn slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SLOTS;
    }
    SLOT.with(|s| *s)
}

/// One `T` per slot.
pub struct PerSlot<T>(Box<[Padded<T>]>);

impl<T: Default> Default for PerSlot<T> {
    fn default() -> Self {
        PerSlot((0..SLOTS).map(|_| Padded::default()).collect())
    }
}

impl<T> PerSlot<T> {
    /// The calling thread's.
    pub fn mine(&self) -> &T {
        &self.0[slot()]
    }

    pub fn get(&self, slot: usize) -> &T {
        &self.0[slot]
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|p| &p.0)
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for PerSlot<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn each_thread_adds_to_its_slot_and_the_sum_sees_all() {
        let set: PerSlot<AtomicU64> = PerSlot::default();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        set.mine().fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(
            set.iter().map(|c| c.load(Ordering::Relaxed)).sum::<u64>(),
            8000
        );
        assert_eq!(std::mem::align_of::<Padded<AtomicU64>>(), 128);
        assert_eq!(slot(), slot(), "a thread keeps its slot");
    }
}
