//! Block devices: the storage side of every LUN.
//!
//! Every data service (RAID, cache, thin pool, mirror) is a [`BlockDevice`]
//! that owns its children, so a volume is a tree built from config. The
//! trait is synchronous and byte-addressed: the SCSI layer converts LBAs,
//! and transports run calls that may block off their reactor
//! ([`Capabilities::may_block`]).

use std::fs::File;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

mod aligned;
mod atomic;
mod delay;
mod error;
mod faulty;
mod file;
mod mem;
mod memory_map;
mod null;
mod overlay;
mod sys;
mod threshold;
#[cfg(feature = "testing")]
mod torn;
mod uring;
mod wrapper;

pub use aligned::AlignedBuf;
pub use atomic::{atomic_unsupported, AtomicWrites};
pub use delay::{Delay, DelayDevice, DelayLimits};
pub use error::{classify, DeviceError, ErrorClass};
pub use faulty::{Faults, FaultyDevice};
pub use file::{FileDevice, FileOptions};
pub use mem::MemDevice;
pub use memory_map::{LentBytes, MappedBytes, MemoryMap};
pub use null::NullDevice;
pub use sys::path_on_memory_file_system as on_memory_file_system;
pub use threshold::SpaceThreshold;
#[cfg(feature = "testing")]
pub use torn::Torn;
pub use wrapper::{FastPaths, Wrapped, Wrapper};

/// What an asynchronous request ([`BlockDevice::read_async`]) ends with,
/// called once on the thread it ended on.
pub type Done<T> = Box<dyn FnOnce(io::Result<T>) + Send>;

/// What a device can do; the SCSI layer reports these to initiators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Space is allocated on write; discard returns it (LBPME).
    pub thin: bool,
    /// Writes may sit in a volatile cache until `flush` (the LUN reports WCE=1).
    pub volatile_cache: bool,
    /// Calls may block the thread on real I/O.
    pub may_block: bool,
    /// After `discard`, reads return zeros (LBPRZ).
    pub discard_zeroes: bool,
    /// `discard` does anything at all.
    pub discard: bool,
    /// Read-only media.
    pub read_only: bool,
}

/// Allocation state of a byte range, for GET LBA STATUS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocation {
    Mapped,
    Deallocated,
}

/// One read of a batch ([`BlockDevice::read_batch`]): `buf.len()` bytes
/// at `offset`.
pub struct BatchRead {
    pub buf: Vec<u8>,
    pub offset: u64,
    pub result: io::Result<()>,
}

/// A read its caller puts in flight itself, on its own io_uring
/// ([`BlockDevice::direct_read`]): `window.len()` bytes of the file `fd`
/// at `start`, of which the `len` bytes from `skip` were asked for.
pub struct DirectRead {
    /// Open while the device lives; a submitted read holds its own
    /// reference to the file.
    pub fd: RawFd,
    pub start: u64,
    /// Aligned as O_DIRECT wants; it does not move with the value.
    pub window: AlignedBuf,
    skip: usize,
    len: usize,
}

impl DirectRead {
    pub(crate) fn new(fd: RawFd, start: u64, window: AlignedBuf, skip: usize, len: usize) -> Self {
        DirectRead {
            fd,
            start,
            window,
            skip,
            len,
        }
    }

    /// Device offset of the bytes asked for.
    pub fn offset(&self) -> u64 {
        self.start + self.skip as u64
    }

    /// The bytes asked for, once the whole window has been read.
    pub fn data(&self) -> &[u8] {
        &self.window[self.skip..self.skip + self.len]
    }
}

impl BatchRead {
    pub fn new(buf: Vec<u8>, offset: u64) -> Self {
        BatchRead {
            buf,
            offset,
            result: Ok(()),
        }
    }
}

/// Zeros written over a range, a MiB at a time, from memory aligned for
/// O_DIRECT.
pub(crate) fn write_zeros_by_writing<D: BlockDevice + ?Sized>(
    device: &D,
    offset: u64,
    len: u64,
) -> io::Result<()> {
    const CHUNK: u64 = 1 << 20;
    let Some(zeros) = aligned::AlignedBuf::zeroed(CHUNK.min(len) as usize, 4096) else {
        return Ok(()); // nothing to write
    };
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done);
        device.write_at(&zeros[..n as usize], offset + done, false)?;
        done += n;
    }
    Ok(())
}

pub trait BlockDevice: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;

    /// Read `buf.len()` bytes at `offset`. The range is inside the device.
    /// On success every byte of `buf` is written (holes as zeros): callers
    /// hand in recycled buffers that still hold an earlier read.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Whether [`BlockDevice::read_batch`] does better than one `read_at`
    /// after another: it has the device work on the reads at once.
    fn reads_in_batches(&self) -> bool {
        false
    }

    /// Run every read of `reads` as `read_at` would, and as each one ends,
    /// with its outcome in `result`, call `done` with its index: a caller
    /// can answer it while the others are still on the device.
    fn read_batch(&self, reads: &mut [BatchRead], done: &mut dyn FnMut(usize, &mut BatchRead)) {
        read_each(self, reads, done);
    }

    /// For a device whose reads a caller may put in flight on its own
    /// io_uring (an O_DIRECT file): what to read for `len` bytes at
    /// `offset`. `None` for every other device, and `Some(Err)` for a
    /// range outside the device.
    fn direct_read(&self, offset: u64, len: usize) -> Option<io::Result<DirectRead>> {
        let _ = (offset, len);
        None
    }

    /// Whether the device ends requests on threads of its own (a network
    /// device such as an RBD image): [`BlockDevice::read_async`] and
    /// [`BlockDevice::write_async`] then return at once, and a caller
    /// keeps many requests in flight without a thread waiting for each.
    fn completes_async(&self) -> bool {
        false
    }

    /// Read `len` bytes at `offset` and call `done` with them, once, on
    /// whichever thread the read ended on (maybe before this returns).
    /// `done` must not block. Without [`BlockDevice::completes_async`],
    /// this reads in place.
    fn read_async(&self, offset: u64, len: usize, done: Done<Vec<u8>>) {
        let mut buf = vec![0; len];
        done(self.read_at(&mut buf, offset).map(|()| buf));
    }

    /// Write `data` at `offset` (stable first with `fua`) and call `done`
    /// once, as [`BlockDevice::read_async`] does.
    fn write_async(&self, data: Vec<u8>, offset: u64, fua: bool, done: Done<()>) {
        done(self.write_at(&data, offset, fua));
    }

    /// Write `buf` at `offset`. With `fua`, returns only once the data is on
    /// stable storage.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()>;

    /// Write `parts`, one after another, from `offset`, as one `write_at`
    /// of them joined would. A device that can take them as they are
    /// (`pwritev`) saves the copy that joins them.
    fn write_parts_at(&self, parts: &[&[u8]], offset: u64, fua: bool) -> io::Result<()> {
        write_joined(self, parts, offset, fua)
    }

    /// Make every completed write stable.
    fn flush(&self) -> io::Result<()>;

    /// The writes this device makes all or nothing across a crash: after
    /// a power cut during [`BlockDevice::write_atomic`] (or before the
    /// next flush, without FUA) the range reads entirely as before or
    /// entirely as written. `None`: it cannot.
    fn atomic_writes(&self) -> Option<AtomicWrites> {
        None
    }

    /// Write `buf` at `offset` all or nothing across a crash, within
    /// [`BlockDevice::atomic_writes`]. Like `write_at` otherwise: with
    /// `fua`, stable before it returns; without, as stable as other
    /// writes after the next flush. Concurrent I/O to the range is the
    /// caller's to keep out.
    fn write_atomic(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        let _ = (buf, offset, fua);
        Err(atomic_unsupported())
    }

    /// Give back the space of a range; content afterwards is zeros when
    /// `discard_zeroes`, otherwise unspecified.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }

    /// Make a range read as zeros.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        write_zeros_by_writing(self, offset, len)
    }

    /// Make a range read as zeros with its space set aside, as a thick
    /// volume wants it: unlike `write_zeroes`, never by deallocating.
    fn allocate_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        write_zeros_by_writing(self, offset, len)
    }

    /// Allocation state of the extent starting at `offset`, and its length
    /// in bytes (at most `len`). Fully provisioned devices say Mapped.
    fn allocation(&self, offset: u64, len: u64) -> io::Result<(Allocation, u64)> {
        let _ = offset;
        Ok((Allocation::Mapped, len))
    }

    /// Preferred allocation and discard granularity in bytes (0 = none):
    /// I/O and discards aligned to it avoid partial-unit work, e.g. the
    /// allocation unit of a thin volume.
    fn granularity(&self) -> u64 {
        0
    }

    /// Copies `len` bytes at `src_offset` of `src` to `dst_offset` of this
    /// device without passing the data through the caller, where the device
    /// can do better than a read and a write (a thin volume shares the
    /// units of another volume of its pool). `None`: not offloadable here,
    /// nothing was done, the caller copies. Both ranges are inside their
    /// devices; the caller keeps other I/O off them meanwhile.
    fn copy_from(
        &self,
        src: &dyn BlockDevice,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> Option<io::Result<()>> {
        let _ = (src, src_offset, dst_offset, len);
        None
    }

    /// This device as `Any`, so that `copy_from` can recognise a source of
    /// its own kind. `None` for devices that take no part in that.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// The file whose pages hold this device's bytes at the same offsets,
    /// when those pages are memory (tmpfs, ramfs; no O_DIRECT): a
    /// transport may hand them to a socket instead of reading them first.
    /// `None` for every other device, and for any device that maps or
    /// transforms offsets.
    fn memory_file(&self) -> Option<&Arc<File>> {
        None
    }

    /// The same file as [`BlockDevice::memory_file`], mapped for writing,
    /// so a transport can receive a write's data straight into its pages.
    /// `None` where there is no such file, the device is read-only, or the
    /// mapping failed.
    fn memory_map(&self) -> Option<&MemoryMap> {
        None
    }

    /// `len` bytes at `offset` of [`BlockDevice::memory_map`]'s file, for a
    /// transport to hand to the socket as they are when it sends them,
    /// when every page they touch is known to exist. `None` otherwise, and
    /// for every other device.
    fn mapped_bytes(&self, offset: u64, len: usize) -> Option<MappedBytes> {
        let _ = (offset, len);
        None
    }

    /// The soft threshold on the space this thin device allocates from,
    /// shared with the other devices allocating there; `None` for devices
    /// without one.
    fn space_threshold(&self) -> Option<Arc<SpaceThreshold>> {
        None
    }

    fn capabilities(&self) -> Capabilities;

    /// A short human description, e.g. `file:/srv/lun0.img`.
    fn describe(&self) -> String;
}

/// `parts` joined into one buffer and written with `write_at`: what
/// [`BlockDevice::write_parts_at`] does unless a device does better.
pub fn write_joined<D: BlockDevice + ?Sized>(
    device: &D,
    parts: &[&[u8]],
    offset: u64,
    fua: bool,
) -> io::Result<()> {
    if let [only] = parts {
        return device.write_at(only, offset, fua);
    }
    let mut joined = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        joined.extend_from_slice(part);
    }
    device.write_at(&joined, offset, fua)
}

/// A batch read one `read_at` after another: what every device does that
/// has nothing better.
pub fn read_each<D: BlockDevice + ?Sized>(
    dev: &D,
    reads: &mut [BatchRead],
    done: &mut dyn FnMut(usize, &mut BatchRead),
) {
    for (i, r) in reads.iter_mut().enumerate() {
        r.result = dev.read_at(&mut r.buf, r.offset);
        done(i, r);
    }
}

/// Checks that `len` bytes at `offset` lie inside a device of `size` bytes.
///
/// Callers are expected to stay in range; this turns a caller bug into an
/// error instead of a panic or an out-of-bounds access.
pub(crate) fn check_range(size: u64, offset: u64, len: u64) -> io::Result<()> {
    check_range_of("device", size, offset, len)
}

/// [`check_range`] for a device that calls itself `what` ("volume",
/// "array") in the error, an [`ErrorClass::OutOfRange`].
pub fn check_range_of(what: &str, size: u64, offset: u64, len: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DeviceError::new(
            ErrorClass::OutOfRange,
            format!("range {offset}+{len} is beyond the {what} size {size}"),
        )
        .into()),
    }
}

/// The error returned for writes to a read-only device.
pub(crate) fn read_only_error() -> io::Error {
    io::Error::from_raw_os_error(libc::EROFS)
}
