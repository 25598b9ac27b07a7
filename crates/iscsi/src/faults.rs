//! Faults the crate's own tests ask for, in builds with the
//! `fault-injection` feature: kernel refusals that no test can provoke
//! from outside, so that the paths recovering from them are exercised.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static RING_REFUSALS_LEFT: AtomicUsize = AtomicUsize::new(0);
static RING_REFUSALS_MADE: AtomicUsize = AtomicUsize::new(0);
static RING_REAPER_HELD: AtomicBool = AtomicBool::new(false);

/// The next `n` submits of the connections' read rings fail with EAGAIN,
/// as when the kernel is short of memory for requests.
pub fn refuse_ring_submits(n: usize) {
    RING_REFUSALS_LEFT.store(n, Ordering::SeqCst);
}

/// How many ring submits were refused so far.
pub fn ring_submits_refused() -> usize {
    RING_REFUSALS_MADE.load(Ordering::SeqCst)
}

/// Whether this submit is to be refused (and counted).
pub(crate) fn take_ring_refusal() -> bool {
    let take = RING_REFUSALS_LEFT
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if take {
        RING_REFUSALS_MADE.fetch_add(1, Ordering::SeqCst);
    }
    take
}

/// While held, the rings' reaping tasks take no completions, so that only
/// a connection's next burst of commands can answer reads that ended.
pub fn hold_ring_reaper(held: bool) {
    RING_REAPER_HELD.store(held, Ordering::SeqCst);
}

pub(crate) fn ring_reaper_held() -> bool {
    RING_REAPER_HELD.load(Ordering::SeqCst)
}
