//! Devices that wrap one child: test kinds (delay, faulty) today, and the
//! same shape for every data service that changes what passes through.
//!
//! A wrapper implements [`Wrapper`]: each hook gets the child and does by
//! default what the child does. [`Wrapped`] makes it a [`BlockDevice`].
//! What the hooks cannot forward by accident are the fast paths that hand
//! a transport the child's bytes directly (its O_DIRECT file, its pages in
//! memory, its copy offload): a write placed straight into a child's pages
//! would skip the wrapper. `Wrapped` passes them only where the wrapper's
//! type says so in [`Wrapper::PASSES`], which is [`FastPaths::NONE`]
//! unless it is set.

use std::any::Any;
use std::fs::File;
use std::io;
use std::sync::Arc;

use crate::{
    atomic_unsupported, write_joined, Allocation, AtomicWrites, BatchRead, BlockDevice,
    Capabilities, DirectRead, MappedBytes, MemoryMap,
};

/// Which of its child's fast paths a wrapper lets a transport use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastPaths {
    /// The child's reads put in flight on the caller's own io_uring.
    pub direct_read: bool,
    /// The child's pages in memory: READs sent from them, WRITEs received
    /// into them.
    pub memory: bool,
    /// The child's copy offload (EXTENDED COPY inside a pool).
    pub copy_offload: bool,
}

impl FastPaths {
    pub const NONE: FastPaths = FastPaths {
        direct_read: false,
        memory: false,
        copy_offload: false,
    };
    /// For a wrapper that changes neither the bytes nor when they are
    /// stable, only, say, what it reports.
    pub const ALL: FastPaths = FastPaths {
        direct_read: true,
        memory: true,
        copy_offload: true,
    };
}

/// What a wrapper changes of its child. Every hook but `describe` does by
/// default what the child does.
pub trait Wrapper: Send + Sync + 'static {
    /// The child's fast paths this wrapper lets through.
    const PASSES: FastPaths = FastPaths::NONE;

    fn describe(&self, child: &dyn BlockDevice) -> String;

    fn size(&self, child: &dyn BlockDevice) -> u64 {
        child.size()
    }

    fn read_at(&self, child: &dyn BlockDevice, buf: &mut [u8], offset: u64) -> io::Result<()> {
        child.read_at(buf, offset)
    }

    /// Whether `read_batch` does better than one read after another. The
    /// default batch goes through this wrapper's `read_at`, not the
    /// child's batch, so it says no.
    fn reads_in_batches(&self, child: &dyn BlockDevice) -> bool {
        let _ = child;
        false
    }

    fn read_batch(
        &self,
        child: &dyn BlockDevice,
        reads: &mut [BatchRead],
        done: &mut dyn FnMut(usize, &mut BatchRead),
    ) {
        for (i, r) in reads.iter_mut().enumerate() {
            r.result = self.read_at(child, &mut r.buf, r.offset);
            done(i, r);
        }
    }

    fn write_at(
        &self,
        child: &dyn BlockDevice,
        buf: &[u8],
        offset: u64,
        fua: bool,
    ) -> io::Result<()> {
        child.write_at(buf, offset, fua)
    }

    fn flush(&self, child: &dyn BlockDevice) -> io::Result<()> {
        child.flush()
    }

    /// Atomic writes: none unless the wrapper says it keeps them so. The
    /// child's alone would let a write skip whatever this wrapper does to
    /// writes, so forwarding is a choice each wrapper makes.
    fn atomic_writes(&self, child: &dyn BlockDevice) -> Option<AtomicWrites> {
        let _ = child;
        None
    }

    fn write_atomic(
        &self,
        child: &dyn BlockDevice,
        buf: &[u8],
        offset: u64,
        fua: bool,
    ) -> io::Result<()> {
        let _ = (child, buf, offset, fua);
        Err(atomic_unsupported())
    }

    fn discard(&self, child: &dyn BlockDevice, offset: u64, len: u64) -> io::Result<()> {
        child.discard(offset, len)
    }

    fn write_zeroes(&self, child: &dyn BlockDevice, offset: u64, len: u64) -> io::Result<()> {
        child.write_zeroes(offset, len)
    }

    fn allocate_zeroes(&self, child: &dyn BlockDevice, offset: u64, len: u64) -> io::Result<()> {
        child.allocate_zeroes(offset, len)
    }

    fn allocation(
        &self,
        child: &dyn BlockDevice,
        offset: u64,
        len: u64,
    ) -> io::Result<(Allocation, u64)> {
        child.allocation(offset, len)
    }

    fn granularity(&self, child: &dyn BlockDevice) -> u64 {
        child.granularity()
    }

    /// Copy offload: the child's only if [`Wrapper::PASSES`] says so.
    fn copy_from(
        &self,
        child: &dyn BlockDevice,
        src: &dyn BlockDevice,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> Option<io::Result<()>> {
        Self::PASSES
            .copy_offload
            .then(|| child.copy_from(src, src_offset, dst_offset, len))
            .flatten()
    }

    fn capabilities(&self, child: &dyn BlockDevice) -> Capabilities {
        child.capabilities()
    }
}

/// A [`Wrapper`] over its child, as a device. Derefs to the wrapper, for
/// its own controls (a fault to inject, a limit to change).
pub struct Wrapped<W> {
    child: Arc<dyn BlockDevice>,
    wrapper: W,
}

impl<W: Wrapper> Wrapped<W> {
    pub fn over(child: Arc<dyn BlockDevice>, wrapper: W) -> Self {
        Wrapped { child, wrapper }
    }

    pub fn child(&self) -> &Arc<dyn BlockDevice> {
        &self.child
    }
}

impl<W> std::ops::Deref for Wrapped<W> {
    type Target = W;

    fn deref(&self) -> &W {
        &self.wrapper
    }
}

impl<W: Wrapper> BlockDevice for Wrapped<W> {
    fn size(&self) -> u64 {
        self.wrapper.size(&*self.child)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.wrapper.read_at(&*self.child, buf, offset)
    }

    fn reads_in_batches(&self) -> bool {
        self.wrapper.reads_in_batches(&*self.child)
    }

    fn read_batch(&self, reads: &mut [BatchRead], done: &mut dyn FnMut(usize, &mut BatchRead)) {
        self.wrapper.read_batch(&*self.child, reads, done)
    }

    fn direct_read(&self, offset: u64, len: usize) -> Option<io::Result<DirectRead>> {
        W::PASSES
            .direct_read
            .then(|| self.child.direct_read(offset, len))
            .flatten()
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.wrapper.write_at(&*self.child, buf, offset, fua)
    }

    fn write_parts_at(&self, parts: &[&[u8]], offset: u64, fua: bool) -> io::Result<()> {
        // Joined and through the wrapper's write_at: the child's own
        // write_parts_at would skip it.
        write_joined(self, parts, offset, fua)
    }

    fn flush(&self) -> io::Result<()> {
        self.wrapper.flush(&*self.child)
    }

    fn atomic_writes(&self) -> Option<AtomicWrites> {
        self.wrapper.atomic_writes(&*self.child)
    }

    fn write_atomic(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.wrapper.write_atomic(&*self.child, buf, offset, fua)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.wrapper.discard(&*self.child, offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.wrapper.write_zeroes(&*self.child, offset, len)
    }

    fn allocate_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.wrapper.allocate_zeroes(&*self.child, offset, len)
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<(Allocation, u64)> {
        self.wrapper.allocation(&*self.child, offset, len)
    }

    fn granularity(&self) -> u64 {
        self.wrapper.granularity(&*self.child)
    }

    fn copy_from(
        &self,
        src: &dyn BlockDevice,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> Option<io::Result<()>> {
        self.wrapper
            .copy_from(&*self.child, src, src_offset, dst_offset, len)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }

    fn memory_file(&self) -> Option<&Arc<File>> {
        W::PASSES.memory.then(|| self.child.memory_file()).flatten()
    }

    fn memory_map(&self) -> Option<&MemoryMap> {
        W::PASSES.memory.then(|| self.child.memory_map()).flatten()
    }

    fn mapped_bytes(&self, offset: u64, len: usize) -> Option<MappedBytes> {
        W::PASSES
            .memory
            .then(|| self.child.mapped_bytes(offset, len))
            .flatten()
    }

    fn capabilities(&self) -> Capabilities {
        self.wrapper.capabilities(&*self.child)
    }

    fn describe(&self) -> String {
        self.wrapper.describe(&*self.child)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FileDevice, FileOptions};

    /// Counts writes; changes nothing else.
    #[derive(Default)]
    struct Counting(std::sync::atomic::AtomicU64);

    impl Wrapper for Counting {
        fn describe(&self, child: &dyn BlockDevice) -> String {
            format!("counting({})", child.describe())
        }
        fn write_at(
            &self,
            child: &dyn BlockDevice,
            buf: &[u8],
            o: u64,
            fua: bool,
        ) -> io::Result<()> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            child.write_at(buf, o, fua)
        }
    }

    struct Transparent;

    impl Wrapper for Transparent {
        const PASSES: FastPaths = FastPaths::ALL;
        fn describe(&self, child: &dyn BlockDevice) -> String {
            child.describe()
        }
    }

    /// A file on tmpfs, which offers its pages to transports.
    fn memory_file() -> (tempfile::TempDir, Arc<dyn BlockDevice>) {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let dev = FileDevice::open(&path, FileOptions::default()).unwrap();
        (dir, Arc::new(dev))
    }

    #[test]
    fn a_wrapper_hides_its_childs_pages_unless_its_type_passes_them() {
        let (_dir, file) = memory_file();
        assert!(file.memory_file().is_some(), "the child offers its pages");
        let counting = Wrapped::over(file.clone(), Counting::default());
        assert!(counting.memory_file().is_none());
        assert!(counting.memory_map().is_none());
        assert!(counting.mapped_bytes(0, 4096).is_none());
        assert!(counting.direct_read(0, 4096).is_none());
        let transparent = Wrapped::over(file, Transparent);
        assert!(transparent.memory_file().is_some());
    }

    #[test]
    fn a_wrapper_offers_no_atomic_writes_unless_it_says_so() {
        let mem: Arc<dyn BlockDevice> = Arc::new(crate::MemDevice::new(1 << 20));
        assert!(mem.atomic_writes().is_some());
        let counting = Wrapped::over(mem, Counting::default());
        assert_eq!(counting.atomic_writes(), None);
        let err = counting.write_atomic(b"ab", 0, false).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::Unsupported);
        assert_eq!(counting.0.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    #[test]
    fn writes_in_parts_go_through_the_wrapper() {
        let (_dir, file) = memory_file();
        let dev = Wrapped::over(file.clone(), Counting::default());
        dev.write_parts_at(&[b"ab", b"cd"], 10, false).unwrap();
        dev.write_at(b"ef", 14, false).unwrap();
        assert_eq!(dev.0.load(std::sync::atomic::Ordering::Relaxed), 2);
        let mut buf = [0u8; 6];
        file.read_at(&mut buf, 10).unwrap();
        assert_eq!(&buf, b"abcdef");
        assert_eq!(dev.describe(), format!("counting({})", file.describe()));
        // Reachable as itself from a plain device handle.
        let plain: Arc<dyn BlockDevice> = Arc::new(dev);
        let any = plain.as_any().unwrap();
        assert!(any.downcast_ref::<Wrapped<Counting>>().is_some());
    }
}
