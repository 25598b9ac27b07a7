//! A file in memory mapped shared, so that a transport can receive a
//! write's data from its socket straight into the file's pages: one copy
//! (socket to page) instead of two (socket to buffer, buffer to page).
//!
//! Only the kernel ever writes through the mapping. A store from user
//! space into a page the file system cannot back (a full tmpfs, a file
//! truncated behind our back) raises SIGBUS; the same fault inside a system
//! call such as `recv` makes the call fail with EFAULT instead. So the
//! mapping's address is handed out only to a closure that passes it to a
//! system call, and nothing here reads or writes it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

pub struct MemoryMap {
    base: NonNull<u8>,
    len: usize,
}

// The mapping is plain shared memory of a file; every access goes through
// the kernel (see the module comment), which is safe from any thread.
unsafe impl Send for MemoryMap {}
unsafe impl Sync for MemoryMap {}

impl MemoryMap {
    /// Maps the first `len` bytes of `file`, read and write, shared.
    pub fn of(file: &File, len: u64) -> io::Result<MemoryMap> {
        let len = usize::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        if len == 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: a fresh shared mapping of a file we hold open; the kernel
        // chooses the address, so nothing else is replaced.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or(io::ErrorKind::InvalidData)?;
        Ok(MemoryMap { base, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Lets `fill` put up to `len` bytes at file offset `offset`: it gets
    /// the address and the length, must write that memory only through a
    /// system call (`recv` and the like), and returns how many bytes it
    /// put there. Fails without calling `fill` when the range is not
    /// inside the mapping, and when `fill` claims more than it was given.
    pub fn fill(
        &self,
        offset: u64,
        len: usize,
        fill: &mut dyn FnMut(*mut u8, usize) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let start = usize::try_from(offset).map_err(|_| out_of_range())?;
        if start.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(out_of_range());
        }
        // SAFETY: start + len <= self.len, checked above, so the pointer
        // stays inside the mapping.
        let at = unsafe { self.base.as_ptr().add(start) };
        let n = fill(at, len)?;
        if n > len {
            return Err(io::Error::other("more bytes claimed than were given"));
        }
        Ok(n)
    }
}

fn out_of_range() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "range outside the mapping")
}

impl Drop for MemoryMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `of` mapped; no reference into the
        // mapping outlives it (only raw addresses lent to `fill`'s caller
        // for the duration of one call).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// Stands in for `recv`: the kernel copies `src` into the address.
    fn kernel_copy(src: &[u8]) -> impl FnMut(*mut u8, usize) -> io::Result<usize> + '_ {
        move |at, len| {
            let (r, w) = {
                let mut fds = [0; 2];
                assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
                (fds[0], fds[1])
            };
            let n = src.len().min(len);
            let wrote = unsafe { libc::write(w, src.as_ptr().cast(), n) };
            let read = unsafe { libc::read(r, at.cast(), n) };
            unsafe {
                libc::close(r);
                libc::close(w);
            }
            if read < 0 {
                return Err(io::Error::last_os_error());
            }
            assert_eq!(wrote, read);
            Ok(read as usize)
        }
    }

    #[test]
    fn bytes_filled_in_are_the_files() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(64 << 10).unwrap();
        let map = MemoryMap::of(&file, 64 << 10).unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(
            map.fill(10_000, 8192, &mut kernel_copy(&data)).unwrap(),
            5000
        );
        let mut back = vec![0; 5000];
        file.read_exact_at(&mut back, 10_000).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn ranges_outside_are_refused_before_filling() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(8192).unwrap();
        let map = MemoryMap::of(&file, 8192).unwrap();
        let mut called = false;
        let mut fill = |_: *mut u8, _: usize| {
            called = true;
            Ok(0)
        };
        assert!(map.fill(4096, 4097, &mut fill).is_err());
        assert!(map.fill(u64::MAX, 1, &mut fill).is_err());
        assert!(!called);
        let mut greedy = |_: *mut u8, len: usize| Ok(len + 1);
        assert!(map.fill(0, 10, &mut greedy).is_err());
        assert!(MemoryMap::of(&file, 0).is_err());
    }
}
