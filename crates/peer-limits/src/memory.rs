//! How the daemon's allocator keeps freed memory, and how a dropped peer
//! gives back what it pinned.
//!
//! Large I/O buffers are freed and allocated again all the time. By
//! default glibc gives the top of each thread's heap back to the kernel on
//! free, and the next buffer then takes a page fault per page: a tenth of
//! the daemon's CPU in 1 MiB writes. Keeping up to 32 MiB per heap, and
//! serving buffers below 8 MiB from the heap, measured 13% less CPU per
//! write and 15-40% more throughput (docs/bench/techniques.md).
//!
//! A peer that stops reading pins its whole outgoing queue, read on
//! device threads whose heaps earlier peers may not have used. Once it is
//! dropped those buffers are free but stay resident in each heap's kept
//! top, which `malloc_trim` returns only for the main heap: the resident
//! size grew 8-10 MB with every such peer. So while a dropped peer's
//! buffers are freed, heaps keep nothing, and a trim afterwards returns
//! the free pages inside them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Freed memory a heap keeps at its top for the next buffers.
const KEPT_PER_HEAP: usize = 32 << 20;

/// How long heaps keep nothing after a drop: requests the peer had
/// running on device threads free their buffers only as they finish.
const SETTLE: Duration = Duration::from_millis(200);

/// A release is under way; drops meanwhile are covered by it, so a flood
/// of dropped peers makes at most one trim per [`SETTLE`].
static PENDING: AtomicBool = AtomicBool::new(false);

/// Sets the allocator up as the daemon wants it; call before any thread
/// starts.
pub fn keep_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 8 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEPT_PER_HEAP as libc::c_int);
    }
}

fn keep_at_most(bytes: usize) {
    // SAFETY: as above; mallopt takes the allocator's lock.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, bytes as libc::c_int);
    }
    #[cfg(not(target_env = "gnu"))]
    let _ = bytes;
}

/// A peer that pinned memory is being dropped: until its buffers are
/// freed, heaps give their free tops back, and then the free pages inside
/// every heap are returned. Call before the peer's buffers are dropped.
pub fn release_freed_memory() {
    if PENDING.swap(true, Ordering::AcqRel) {
        return;
    }
    keep_at_most(0);
    let finish = || {
        trim();
        keep_at_most(KEPT_PER_HEAP);
        PENDING.store(false, Ordering::Release);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move {
                tokio::time::sleep(SETTLE).await;
                let _ = tokio::task::spawn_blocking(finish).await;
            });
        }
        Err(_) => finish(),
    }
}

fn trim() {
    // SAFETY: malloc_trim only walks the allocator's own heaps.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drops_in_a_burst_share_one_release() {
        release_freed_memory();
        assert!(PENDING.load(Ordering::Acquire));
        // Covered by the release under way.
        release_freed_memory();
        tokio::time::sleep(SETTLE + Duration::from_millis(200)).await;
        assert!(!PENDING.load(Ordering::Acquire));
    }
}
