//! Heap buffers with a chosen alignment, for O_DIRECT bounce copies.
//!
//! Every O_DIRECT read gets one, so small ones are kept when dropped and
//! handed out again on the same thread: an aligned allocation split the
//! heap's chunks and was zeroed each time, which a profile of 4K reads
//! put at about a tenth of the target's time.

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Buffers up to this size are kept for reuse when dropped.
const KEEP_MAX_LEN: usize = 64 << 10;
/// How many bytes of dropped buffers each thread keeps: a QD32 load of
/// 4K reads needs about 64 buffers, of 64K reads 16 (more get allocated).
const KEEP_PER_THREAD: usize = 1 << 20;

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes aligned to `align` (a power of two).
    /// `None` for a zero length or an invalid alignment.
    pub fn zeroed(len: usize, align: usize) -> Option<AlignedBuf> {
        let layout = Layout::from_size_align(len, align).ok()?;
        if len == 0 {
            return None;
        }
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })
            .unwrap_or_else(|| alloc::handle_alloc_error(layout));
        Some(AlignedBuf { ptr, layout })
    }

    /// A buffer like [`AlignedBuf::zeroed`], taken from those this thread
    /// dropped when one of the same size and alignment is kept. Its bytes
    /// are then an earlier use's: only for reads that fill it whole.
    pub fn reused(len: usize, align: usize) -> Option<AlignedBuf> {
        let layout = Layout::from_size_align(len, align).ok()?;
        let kept = KEPT
            .try_with(|kept| {
                let mut kept = kept.borrow_mut();
                let at = kept.list.iter().rposition(|b| b.layout == layout)?;
                kept.bytes -= layout.size();
                Some(kept.list.swap_remove(at))
            })
            .ok()
            .flatten();
        match kept {
            Some(Kept { ptr, layout }) => Some(AlignedBuf { ptr, layout }),
            None => AlignedBuf::zeroed(len, align),
        }
    }
}

/// A dropped buffer's allocation, kept for [`AlignedBuf::reused`].
struct Kept {
    ptr: NonNull<u8>,
    layout: Layout,
}

/// This thread's kept allocations, freed with the thread.
struct KeptList {
    list: Vec<Kept>,
    bytes: usize,
}

impl Drop for KeptList {
    fn drop(&mut self) {
        for b in self.list.drain(..) {
            // SAFETY: allocated in `AlignedBuf::zeroed` with this layout,
            // and owned by nobody else since its buffer was dropped.
            unsafe { alloc::dealloc(b.ptr.as_ptr(), b.layout) }
        }
    }
}

thread_local! {
    static KEPT: RefCell<KeptList> = const {
        RefCell::new(KeptList {
            list: Vec::new(),
            bytes: 0,
        })
    };
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr points at layout.size() initialised bytes we own.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let (ptr, layout) = (self.ptr, self.layout);
        let kept = layout.size() <= KEEP_MAX_LEN
            && KEPT
                .try_with(|kept| {
                    let mut kept = kept.borrow_mut();
                    let room = kept.bytes + layout.size() <= KEEP_PER_THREAD;
                    if room {
                        kept.bytes += layout.size();
                        kept.list.push(Kept { ptr, layout });
                    }
                    room
                })
                .unwrap_or(false);
        if !kept {
            // SAFETY: allocated in `zeroed` with this very layout.
            unsafe { alloc::dealloc(ptr.as_ptr(), layout) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_aligned_and_zeroed() {
        let buf = AlignedBuf::zeroed(12288, 4096).unwrap();
        assert_eq!(buf.as_ptr() as usize % 4096, 0);
        assert_eq!(buf.len(), 12288);
        assert!(buf.iter().all(|&b| b == 0));
        assert!(AlignedBuf::zeroed(0, 4096).is_none());
        assert!(AlignedBuf::zeroed(10, 3).is_none());
    }

    #[test]
    fn dropped_buffers_are_reused_by_size_and_alignment() {
        let mut first = AlignedBuf::reused(8192, 4096).unwrap();
        first[0] = 7;
        let at = first.as_ptr();
        drop(first);
        let other = AlignedBuf::reused(4096, 4096).unwrap();
        assert_ne!(other.as_ptr(), at, "a different size is not reused");
        let again = AlignedBuf::reused(8192, 4096).unwrap();
        assert_eq!((again.as_ptr(), again[0]), (at, 7));
        assert_eq!(again.as_ptr() as usize % 4096, 0);

        let big = AlignedBuf::reused(KEEP_MAX_LEN * 2, 4096).unwrap();
        let big_at = big.as_ptr();
        drop(big);
        let kept_big = KEPT.with(|k| {
            k.borrow()
                .list
                .iter()
                .any(|b| std::ptr::eq(b.ptr.as_ptr(), big_at))
        });
        assert!(!kept_big, "large buffers are freed");
    }

    #[test]
    fn a_thread_keeps_a_bounded_number_of_bytes() {
        let count = KEEP_PER_THREAD / 4096;
        let bufs: Vec<_> = (0..count + 10)
            .map(|_| AlignedBuf::reused(4096, 4096).unwrap())
            .collect();
        drop(bufs);
        let kept = KEPT.with(|k| (k.borrow().list.len(), k.borrow().bytes));
        assert_eq!(kept, (count, KEEP_PER_THREAD));
        let taken = AlignedBuf::reused(4096, 4096).unwrap();
        assert_eq!(KEPT.with(|k| k.borrow().bytes), KEEP_PER_THREAD - 4096);
        drop(taken);
    }
}
