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
//!
//! A fresh mapping has no page table entries: the first write into each
//! 4 KiB page takes a page fault inside `recv`, which here cost more than
//! the copy itself (a first pass over a 1 GiB LUN took 2.4 times as long
//! as the next). So a thread maps the pages the file already has, in
//! large steps with `MADV_POPULATE_READ`: on tmpfs that maps them writable
//! at once, 16 pages per fault, without dirtying them. Holes are left
//! alone (populating one would allocate it); their first write faults as
//! before. The mapped entries count in the daemon's resident memory as
//! shared memory, as they would after one write pass.

use crate::sys;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

pub struct MemoryMap {
    base: NonNull<u8>,
    len: usize,
    populating: Option<Populating>,
}

/// The thread mapping the file's allocated pages; stopped and joined
/// before the mapping goes, so it never touches an address no longer ours.
struct Populating {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// How much one `madvise` maps, so that a stop waits little.
const POPULATE_STEP: u64 = 64 << 20;

// The mapping is plain shared memory of a file; every access goes through
// the kernel (see the module comment), which is safe from any thread.
unsafe impl Send for MemoryMap {}
unsafe impl Sync for MemoryMap {}

impl MemoryMap {
    /// Maps the first `len` bytes of `file`, read and write, shared, and
    /// starts mapping the pages it already has (see the module comment).
    pub fn of(file: &Arc<File>, len: u64) -> io::Result<MemoryMap> {
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
        let mut map = MemoryMap {
            base,
            len,
            populating: None,
        };
        map.populating = map.start_populating(file);
        Ok(map)
    }

    fn start_populating(&self, file: &Arc<File>) -> Option<Populating> {
        let stop = Arc::new(AtomicBool::new(false));
        let (file, flag, base, len) = (
            file.clone(),
            stop.clone(),
            self.base.as_ptr() as usize,
            self.len,
        );
        let thread = std::thread::Builder::new()
            .name("oa-map-populate".into())
            .spawn(move || populate_allocated(&file, base, len, &flag))
            // Without the thread the mapping still works, only its first
            // writes fault page by page.
            .ok()?;
        Some(Populating { stop, thread })
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

#[cfg(test)]
impl MemoryMap {
    fn wait_populated(&mut self) {
        if let Some(populating) = self.populating.take() {
            populating.thread.join().unwrap();
        }
    }
}

/// Maps the page table entries of every allocated range of `file` within
/// the mapping at `base`, until done, stopped, or refused (a kernel before
/// 5.14 knows no `MADV_POPULATE_READ`; a failure only leaves faults to do
/// the work).
fn populate_allocated(file: &File, base: usize, len: usize, stop: &AtomicBool) {
    let fd = file.as_fd();
    // SAFETY: sysconf only reads a system constant.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    };
    let end = len as u64;
    let mut at = 0;
    while at < end && !stop.load(Ordering::Relaxed) {
        let Ok(Some(data)) = sys::seek_data(fd, at) else {
            return;
        };
        if data >= end {
            return;
        }
        let hole = sys::seek_hole(fd, data).ok().flatten().unwrap_or(end);
        let start = data - data % page;
        let stop_at = hole.min(end).min(start + POPULATE_STEP);
        // SAFETY: [start, stop_at) lies inside the mapping, which outlives
        // this thread (Drop joins it before unmapping); populating only
        // maps pages, it changes no memory.
        let ret = unsafe {
            libc::madvise(
                (base + start as usize) as *mut libc::c_void,
                (stop_at - start) as usize,
                libc::MADV_POPULATE_READ,
            )
        };
        if ret != 0 {
            return;
        }
        at = stop_at.max(at + 1);
    }
}

fn out_of_range() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "range outside the mapping")
}

impl Drop for MemoryMap {
    fn drop(&mut self) {
        if let Some(populating) = self.populating.take() {
            populating.stop.store(true, Ordering::Relaxed);
            let _ = populating.thread.join();
        }
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
        let file = Arc::new(tempfile::tempfile().unwrap());
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
        let file = Arc::new(tempfile::tempfile().unwrap());
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

    /// Resident bytes of the mapping starting at `base`, from smaps.
    fn resident(base: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{base:x}-");
        let vma = smaps
            .split_inclusive('\n')
            .skip_while(|line| !line.starts_with(&start))
            .take_while(|line| line.starts_with(&start) || !line.contains('-'))
            .collect::<String>();
        let kib = vma
            .lines()
            .find_map(|line| line.strip_prefix("Rss:"))
            .unwrap()
            .trim()
            .trim_end_matches(" kB")
            .parse::<u64>()
            .unwrap();
        kib << 10
    }

    #[test]
    fn allocated_pages_are_mapped_and_holes_left_alone() {
        use std::os::unix::fs::MetadataExt;
        // Only a file in memory has its pages populated without reading a disk.
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            return;
        };
        let file = Arc::new(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(dir.path().join("m.img"))
                .unwrap(),
        );
        file.set_len(16 << 20).unwrap();
        let data = vec![7u8; 1 << 20];
        file.write_all_at(&data, 0).unwrap();
        file.write_all_at(&data, 9 << 20).unwrap();
        let allocated = file.metadata().unwrap().blocks();
        assert_eq!(allocated * 512, 2 << 20);

        let mut map = MemoryMap::of(&file, 16 << 20).unwrap();
        map.wait_populated();
        assert_eq!(resident(map.base.as_ptr() as usize), 2 << 20);
        assert_eq!(file.metadata().unwrap().blocks(), allocated);

        // Populated entries are writable: the kernel writes through them.
        assert_eq!(map.fill(9 << 20, 4, &mut kernel_copy(b"abcd")).unwrap(), 4);
        let mut back = [0; 4];
        file.read_exact_at(&mut back, 9 << 20).unwrap();
        assert_eq!(&back, b"abcd");
    }
}
