//! Heap buffers with a chosen alignment, for O_DIRECT bounce copies.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

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
        // SAFETY: allocated in `zeroed` with this very layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
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
}
