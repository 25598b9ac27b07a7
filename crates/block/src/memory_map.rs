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
//!
//! Short READs are sent from the mapping too ([`MemoryMap::bytes`]): the
//! transport hands those addresses to `writev`, so the kernel copies the
//! pages into the socket once, where `pread` into a buffer first copied
//! them and looked each one up. Reading a hole through the mapping would
//! allocate it, so only pages known to exist are read that way: the
//! populating thread marks those it finds, writes through the device
//! mark theirs, and discards unmark theirs before the hole is made
//! ([`PageBits`]). A mark may be missing (the read then uses `pread`); a
//! stale one, from a race with a discard, at worst allocates one page of
//! zeros, which is what the hole reads as anyway.

use crate::{sys, DeviceError, ErrorClass};
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

pub struct MemoryMap {
    base: NonNull<u8>,
    len: usize,
    populating: Option<Populating>,
    allocated: Arc<PageBits>,
}

/// One bit per page of the file: set when the page is known to exist.
///
/// A random read over a large file finds its word of these bits out of
/// the CPU's caches, which a request's own page copy and the kernel's
/// socket work keep churning (one miss was most of this check's time,
/// under 1 % of a 4K read's). So a summary holds one bit per word, set
/// while all its 64 pages are marked: 1/64 the size, it stays cached, and
/// a file written through is answered from it alone.
pub(crate) struct PageBits {
    words: Box<[AtomicU64]>,
    /// Bit `w % 64` of `full[w / 64]`: `words[w]` is all ones.
    full: Box<[AtomicU64]>,
    page_shift: u32,
    len: u64,
}

impl PageBits {
    /// For a file of `len` bytes in pages of `page` bytes (a power of two).
    pub(crate) fn new(len: u64, page: u64) -> PageBits {
        assert!(page.is_power_of_two(), "a page of {page} bytes");
        let pages = len.div_ceil(page);
        let words = pages.div_ceil(64);
        let zeros = |n: u64| (0..n).map(|_| AtomicU64::new(0)).collect();
        PageBits {
            words: zeros(words),
            full: zeros(words.div_ceil(64)),
            page_shift: page.trailing_zeros(),
            len,
        }
    }

    /// The pages `[offset, offset + len)` touches, if it is inside.
    fn pages(&self, offset: u64, len: u64) -> Option<Range<u64>> {
        let end = offset
            .checked_add(len)
            .filter(|&end| len > 0 && end <= self.len)?;
        Some(offset >> self.page_shift..((end - 1) >> self.page_shift) + 1)
    }

    /// Each word of `pages` with the mask of its bits among them.
    fn masks(pages: Range<u64>) -> impl Iterator<Item = (usize, u64)> {
        let (first, last) = (pages.start / 64, (pages.end - 1) / 64);
        (first..=last).map(move |w| {
            let lo = if w == first { pages.start % 64 } else { 0 };
            let hi = if w == last { (pages.end - 1) % 64 } else { 63 };
            let mask = (u64::MAX >> (63 - hi)) & (u64::MAX << lo);
            (w as usize, mask)
        })
    }

    /// The summary word and bit of word `w`.
    fn summary(&self, w: usize) -> (&AtomicU64, u64) {
        (&self.full[w / 64], 1 << (w % 64))
    }

    pub(crate) fn mark(&self, offset: u64, len: u64) {
        for (w, mask) in self.pages(offset, len).into_iter().flat_map(Self::masks) {
            if self.words[w].fetch_or(mask, Ordering::Release) | mask == u64::MAX {
                let (summary, bit) = self.summary(w);
                summary.fetch_or(bit, Ordering::Release);
            }
        }
    }

    pub(crate) fn unmark(&self, offset: u64, len: u64) {
        for (w, mask) in self.pages(offset, len).into_iter().flat_map(Self::masks) {
            // (The summary first: no reader finds it set once a page's
            // bit is clear.)
            let (summary, bit) = self.summary(w);
            summary.fetch_and(!bit, Ordering::Release);
            self.words[w].fetch_and(!mask, Ordering::Release);
        }
    }

    pub(crate) fn all_marked(&self, offset: u64, len: u64) -> bool {
        self.pages(offset, len).is_some_and(|pages| {
            Self::masks(pages).all(|(w, mask)| {
                let (summary, bit) = self.summary(w);
                summary.load(Ordering::Acquire) & bit != 0
                    || self.words[w].load(Ordering::Acquire) & mask == mask
            })
        })
    }
}

/// Bytes of a file in memory, read through its mapping when the kernel
/// copies them: hand them to a system call (`writev`) only. A read from
/// user space of a page the file no longer has (truncated behind our
/// back) raises SIGBUS, where the system call fails with EFAULT.
pub struct MappedBytes {
    map: Arc<MemoryMap>,
    offset: usize,
    len: usize,
    /// Kept until the bytes are dropped, i.e. sent: what a device stacked
    /// on the file needs held meanwhile (a pool's unit, which must not be
    /// reused while its pages wait to go out).
    _hold: Option<Box<dyn Send + Sync>>,
}

impl MappedBytes {
    /// The same bytes, keeping `hold` alive as long as they are.
    pub fn holding(mut self, hold: Box<dyn Send + Sync>) -> MappedBytes {
        self._hold = Some(hold);
        self
    }
}

/// [`MappedBytes`] borrowed from a mapping its holder keeps alive, for a
/// transport that holds the device: no reference count is touched per
/// request, which on several CPUs serving one device passes a cache line
/// between them. The same rule: hand them to a system call only.
#[derive(Clone, Copy)]
pub struct LentBytes<'a>(&'a [u8]);

impl AsRef<[u8]> for LentBytes<'_> {
    fn as_ref(&self) -> &[u8] {
        self.0
    }
}

impl AsRef<[u8]> for MappedBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `bytes` checked the range against the mapping, which the
        // Arc keeps alive; the memory is plain shared file memory.
        unsafe { std::slice::from_raw_parts(self.map.base.as_ptr().add(self.offset), self.len) }
    }
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
            allocated: Arc::new(PageBits::new(len as u64, page_size())),
        };
        map.populating = map.start_populating(file);
        Ok(map)
    }

    fn start_populating(&self, file: &Arc<File>) -> Option<Populating> {
        let stop = Arc::new(AtomicBool::new(false));
        let (file, flag, base, len, allocated) = (
            file.clone(),
            stop.clone(),
            self.base.as_ptr() as usize,
            self.len,
            self.allocated.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("oa-map-populate".into())
            .spawn(move || populate_allocated(&file, base, len, &flag, &allocated))
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
        self.allocated.mark(offset, n as u64);
        Ok(n)
    }

    /// `len` bytes at `offset` for a transport to send from the file's
    /// pages, when every page they touch is known to exist; `None`
    /// otherwise (the caller reads them with `pread`).
    pub fn bytes(self: &Arc<Self>, offset: u64, len: usize) -> Option<MappedBytes> {
        if !self.allocated.all_marked(offset, len as u64) {
            return None;
        }
        Some(MappedBytes {
            map: self.clone(),
            offset: usize::try_from(offset).ok()?,
            len,
            _hold: None,
        })
    }

    /// [`MemoryMap::bytes`] borrowed for as long as the mapping is.
    pub fn lend(&self, offset: u64, len: usize) -> Option<LentBytes<'_>> {
        if !self.allocated.all_marked(offset, len as u64) {
            return None;
        }
        let start = usize::try_from(offset).ok()?;
        if start.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: within the mapping, which lives as long as `self`; the
        // memory is plain shared file memory.
        let bytes = unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(start), len) };
        Some(LentBytes(bytes))
    }

    /// The file's pages in `[offset, offset + len)` were written.
    pub fn mark_allocated(&self, offset: u64, len: u64) {
        self.allocated.mark(offset, len);
    }

    /// The file's pages in `[offset, offset + len)` are about to become
    /// holes: reads of them no longer go through the mapping.
    pub fn forget_allocated(&self, offset: u64, len: u64) {
        self.allocated.unmark(offset, len);
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
fn populate_allocated(
    file: &File,
    base: usize,
    len: usize,
    stop: &AtomicBool,
    allocated: &PageBits,
) {
    let fd = file.as_fd();
    let page = page_size();
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
        allocated.mark(start, stop_at - start);
        at = stop_at.max(at + 1);
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    }
}

fn out_of_range() -> io::Error {
    DeviceError::new(ErrorClass::OutOfRange, "range outside the mapping").into()
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

        // Found pages may be read through the mapping, holes not.
        let map = Arc::new(map);
        let bytes = map.bytes((9 << 20) - 4096 + 10, 8192);
        assert!(bytes.is_none(), "it starts in a hole");
        let bytes = map.bytes(9 << 20, 8192).expect("written pages");
        assert_eq!(&bytes.as_ref()[..6], b"abcd\x07\x07");
        assert!(map.bytes(0, 1 << 20).is_some());
        map.forget_allocated(4096, 1);
        assert!(map.bytes(0, 8192).is_none(), "forgotten before a discard");
        assert!(map.bytes(8192, 4096).is_some());
        assert!(map.bytes(16 << 20, 1).is_none(), "outside");
        assert_eq!(file.metadata().unwrap().blocks(), allocated);
    }

    #[test]
    fn filled_pages_are_marked() {
        let file = Arc::new(tempfile::tempfile().unwrap());
        file.set_len(64 << 10).unwrap();
        let map = Arc::new(MemoryMap::of(&file, 64 << 10).unwrap());
        assert!(map.bytes(8192, 100).is_none());
        map.fill(8192 + 100, 200, &mut kernel_copy(&[9; 200]))
            .unwrap();
        assert_eq!(map.bytes(8192, 4096).unwrap().as_ref()[100..300], [9; 200]);
        assert!(map.bytes(8192, 4097).is_none());
        map.mark_allocated(12288, 1);
        assert!(map.bytes(8192, 8192).is_some());
    }

    #[test]
    fn page_bits_across_words() {
        let bits = PageBits::new(200 * 4096 + 1, 4096);
        assert_eq!(bits.words.len(), 4, "201 pages");
        bits.mark(60 * 4096, 10 * 4096);
        assert!(bits.all_marked(60 * 4096, 10 * 4096));
        assert!(!bits.all_marked(59 * 4096, 2 * 4096));
        assert!(!bits.all_marked(69 * 4096, 4097));
        bits.unmark(64 * 4096 + 5, 1);
        assert!(!bits.all_marked(60 * 4096, 10 * 4096));
        assert!(bits.all_marked(65 * 4096, 5 * 4096));
        assert!(bits.all_marked(60 * 4096 + 7, 4 * 4096 - 7));
        // Partial pages count whole; the last page is a partial one.
        bits.mark(200 * 4096, 1);
        assert!(bits.all_marked(200 * 4096, 1));
        assert!(!bits.all_marked(200 * 4096, 2), "past the end");
        assert!(!bits.all_marked(60 * 4096, 0), "nothing is not a read");
        bits.mark(0, 200 * 4096 + 1);
        assert!(bits
            .words
            .iter()
            .take(3)
            .all(|w| w.load(Ordering::Relaxed) == u64::MAX));
        assert_eq!(bits.words[3].load(Ordering::Relaxed), 0b1_1111_1111);
        bits.unmark(1, 200 * 4096);
        assert!(bits.words.iter().all(|w| w.load(Ordering::Relaxed) == 0));
    }

    #[test]
    fn page_bits_summary_follows_whole_words() {
        // 64 * 70 pages: two summary words.
        let bits = PageBits::new(64 * 70 * 4096, 4096);
        let word = 64 * 4096;
        let summary = |w: usize| bits.full[w / 64].load(Ordering::Relaxed) >> (w % 64) & 1;
        bits.mark(66 * word, word - 4096);
        assert_eq!(summary(66), 0, "one page short");
        assert!(!bits.all_marked(66 * word, word));
        bits.mark(67 * word - 4096, 4096);
        assert_eq!(summary(66), 1, "all 64 pages");
        assert!(bits.all_marked(66 * word, word));
        bits.mark(0, 70 * word);
        assert!((0..70).all(|w| summary(w) == 1));
        assert!(bits.all_marked(0, 70 * word));
        // A page unmarked clears its word's summary, and only its own.
        bits.unmark(66 * word + 3 * 4096, 1);
        assert_eq!((summary(65), summary(66), summary(67)), (1, 0, 1));
        assert!(!bits.all_marked(66 * word, word));
        assert!(bits.all_marked(66 * word, 3 * 4096));
        assert!(bits.all_marked(66 * word + 4 * 4096, 60 * 4096));
        assert!(!bits.all_marked(65 * word, 3 * word), "across it");
        bits.unmark(0, 70 * word);
        assert!((0..70).all(|w| summary(w) == 0));
        assert!(!bits.all_marked(5 * word, 1));
    }
}
