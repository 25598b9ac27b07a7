//! Recycled data buffers for large reads.
//!
//! A read needs a buffer the device fills; a fresh `vec![0; len]` of a
//! megabyte costs a memset as large as the copy that fills it (a quarter of
//! the target's CPU in 1 MiB sequential reads). Buffers of 64 KiB and more
//! come back here when the transport has sent them, and are handed out
//! again without zeroing: every `BlockDevice::read_at` writes the whole
//! buffer it is given, so no byte of an earlier read can leak.

use std::sync::Mutex;

/// Smaller reads are cheaper to zero than to recycle.
const SMALLEST: usize = 64 << 10;
/// Larger buffers are not kept.
const LARGEST: usize = 16 << 20;
/// At most this many bytes wait for reuse in all.
const KEPT_BYTES: usize = 64 << 20;

/// Free buffers per power-of-two size class, each of length == capacity ==
/// its class, so every byte is initialized.
struct Free {
    classes: Vec<Vec<Vec<u8>>>,
    bytes: usize,
}

static FREE: Mutex<Free> = Mutex::new(Free {
    classes: Vec::new(),
    bytes: 0,
});

fn class_of(size: usize) -> usize {
    (size.trailing_zeros() - SMALLEST.trailing_zeros()) as usize
}

/// A buffer of `len` bytes with unspecified contents, for the caller to
/// overwrite completely.
pub fn take(len: usize) -> Vec<u8> {
    if !(SMALLEST..=LARGEST).contains(&len) {
        return vec![0; len];
    }
    let size = len.next_power_of_two();
    let reused = {
        let mut free = FREE.lock().unwrap_or_else(|p| p.into_inner());
        let popped = free.classes.get_mut(class_of(size)).and_then(Vec::pop);
        if popped.is_some() {
            free.bytes -= size;
        }
        popped
    };
    let mut buf = reused.unwrap_or_else(|| vec![0; size]);
    buf.truncate(len);
    buf
}

/// An empty buffer with room for at least `capacity` bytes, for the caller
/// to append to.
pub fn take_empty(capacity: usize) -> Vec<u8> {
    if !(SMALLEST..=LARGEST).contains(&capacity) {
        return Vec::with_capacity(capacity);
    }
    let mut buf = take(capacity);
    buf.clear();
    buf
}

/// Return a buffer once nothing refers to it any more.
pub fn give_back(mut buf: Vec<u8>) {
    let size = buf.capacity();
    if !(SMALLEST..=LARGEST).contains(&size) || !size.is_power_of_two() {
        return;
    }
    // Only the tail past `len` may be uninitialized; zero just that.
    buf.resize(size, 0);
    let mut free = FREE.lock().unwrap_or_else(|p| p.into_inner());
    if free.bytes + size > KEPT_BYTES {
        return;
    }
    let class = class_of(size);
    if free.classes.len() <= class {
        free.classes.resize_with(class + 1, Vec::new);
    }
    free.classes[class].push(buf);
    free.bytes += size;
}

/// Owns a buffer and gives it back when dropped (e.g. as the owner of a
/// `bytes::Bytes` that PDUs slice).
pub struct Recycled(pub Vec<u8>);

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_come_back_small_ones_are_fresh() {
        let small = take(4096);
        assert_eq!(small, vec![0; 4096]);

        let mut big = take(1 << 20);
        assert_eq!(big.len(), 1 << 20);
        big.fill(0xAB);
        let ptr = big.as_ptr();
        give_back(big);
        // The same class hands the same memory out again (other tests may
        // race for it, so look for it among a few).
        let again: Vec<Vec<u8>> = (0..4).map(|_| take((1 << 20) - 512)).collect();
        assert!(again.iter().all(|b| b.len() == (1 << 20) - 512));
        assert!(again.iter().any(|b| b.as_ptr() == ptr));
    }

    #[test]
    fn foreign_vectors_are_completed_before_reuse() {
        let mut v = Vec::with_capacity(128 << 10);
        v.extend_from_slice(&[1, 2, 3]);
        let cap = v.capacity();
        give_back(v);
        if cap == 128 << 10 {
            // Any buffer of that class now has every byte initialized.
            let b = take(128 << 10);
            assert_eq!(b.len(), 128 << 10);
        }
    }

    #[test]
    fn odd_sizes_are_not_kept() {
        give_back(vec![0; 100_000]);
        let b = take(100_000);
        assert_eq!(b.len(), 100_000);
    }
}
