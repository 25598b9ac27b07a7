//! A device backed by a regular file or a block device node.
//!
//! I/O is positional (pread/pwrite), so one descriptor serves concurrent
//! callers. FUA writes go through a second descriptor opened with O_DSYNC,
//! which makes just that write stable instead of syncing the whole file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::aligned::AlignedBuf;
use crate::{
    check_range, read_each, read_only_error, sys, uring, Allocation, BatchRead, BlockDevice,
    Capabilities, DirectRead, MappedBytes, MemoryMap,
};

/// How to open a [`FileDevice`].
#[derive(Clone, Debug, Default)]
pub struct FileOptions {
    /// Bypass the page cache (O_DIRECT).
    pub direct: bool,
    pub read_only: bool,
    /// For a regular file: create it with this size when missing, extend it
    /// to this size when shorter. Never shrinks a file.
    pub create_size: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Media {
    Regular,
    Block,
}

/// O_DIRECT constraints and the lock that serialises read-modify-write of
/// partially covered alignment units.
struct Direct {
    mem_align: usize,
    offset_align: u64,
    rmw: Mutex<()>,
}

impl Direct {
    fn covers(&self, ptr: *const u8, offset: u64, len: usize) -> bool {
        self.offset_aligned(offset, len) && (ptr as usize).is_multiple_of(self.mem_align)
    }

    fn offset_aligned(&self, offset: u64, len: usize) -> bool {
        offset.is_multiple_of(self.offset_align) && (len as u64).is_multiple_of(self.offset_align)
    }

    /// The smallest aligned window holding `[offset, offset + len)`.
    fn window(&self, offset: u64, len: usize) -> (u64, usize) {
        let start = offset - offset % self.offset_align;
        let end = (offset + len as u64).div_ceil(self.offset_align) * self.offset_align;
        (start, (end - start) as usize)
    }

    /// A buffer every use of which fills it whole before reading it (a
    /// read that ends short fails, or is done again elsewhere).
    fn bounce(&self, len: usize) -> io::Result<AlignedBuf> {
        AlignedBuf::reused(len, self.mem_align)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "bad O_DIRECT alignment"))
    }
}

pub struct FileDevice {
    path: PathBuf,
    /// Shared with transports that send from its pages (`memory_file`).
    file: Arc<File>,
    /// The same file opened with O_DSYNC, for FUA writes; `None` when
    /// read-only.
    sync_file: Option<File>,
    size: u64,
    media: Media,
    direct: Option<Direct>,
    read_only: bool,
    /// On tmpfs or ramfs without O_DIRECT: calls copy memory and never
    /// wait, so transports may run them inline like a RAM LUN's.
    in_memory: bool,
    /// The file mapped for writes received straight into its pages and
    /// for short reads sent from them; made at the first such write or
    /// read, `None` inside if mapping failed.
    map: OnceLock<Option<Arc<MemoryMap>>>,
}

/// Prefixes an error with the path it concerns, so configuration errors
/// say which file failed.
fn with_path(path: &Path, what: &str, err: io::Error) -> io::Error {
    io::Error::new(err.kind(), format!("{what} {}: {err}", path.display()))
}

impl FileDevice {
    pub fn open(path: &Path, opts: FileOptions) -> io::Result<FileDevice> {
        let flags = if opts.direct { libc::O_DIRECT } else { 0 };
        let mut oo = OpenOptions::new();
        oo.read(true).write(!opts.read_only).custom_flags(flags);
        if opts.create_size.is_some() && !opts.read_only {
            oo.create(true);
        }
        let file = oo
            .open(path)
            .map_err(|e| with_path(path, "cannot open", e))?;
        let meta = file
            .metadata()
            .map_err(|e| with_path(path, "cannot stat", e))?;
        let media = if meta.file_type().is_block_device() {
            Media::Block
        } else if meta.is_file() {
            Media::Regular
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is neither a regular file nor a block device",
                    path.display()
                ),
            ));
        };

        let size = match media {
            Media::Block => sys::block_device_size(file.as_fd())
                .map_err(|e| with_path(path, "cannot size", e))?,
            Media::Regular => match opts.create_size {
                Some(want) if want > meta.len() && !opts.read_only => {
                    file.set_len(want)
                        .map_err(|e| with_path(path, "cannot extend", e))?;
                    want
                }
                _ => meta.len(),
            },
        };

        let direct = if opts.direct {
            let (mem_align, offset_align) =
                sys::direct_io_alignment(file.as_fd()).unwrap_or_else(|| {
                    match media {
                        Media::Block => {
                            let sector =
                                sys::block_logical_sector_size(file.as_fd()).unwrap_or(4096);
                            (sector, sector)
                        }
                        // 4 KiB satisfies every common device and file system.
                        Media::Regular => (4096, 4096),
                    }
                });
            let (mem_align, offset_align) = (mem_align.max(1) as usize, offset_align.max(1) as u64);
            if !mem_align.is_power_of_two() || size % offset_align != 0 {
                // An unaligned tail could only be written by growing the file.
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{}: size {size} is not a multiple of the O_DIRECT alignment {offset_align}",
                        path.display()
                    ),
                ));
            }
            Some(Direct {
                mem_align,
                offset_align,
                rmw: Mutex::new(()),
            })
        } else {
            None
        };

        let sync_file = if opts.read_only {
            None
        } else {
            let f = OpenOptions::new()
                .write(true)
                .custom_flags(flags | libc::O_DSYNC)
                .open(path)
                .map_err(|e| with_path(path, "cannot open (O_DSYNC)", e))?;
            Some(f)
        };

        let in_memory =
            media == Media::Regular && direct.is_none() && sys::on_memory_file_system(file.as_fd());
        Ok(FileDevice {
            in_memory,
            path: path.to_path_buf(),
            file: Arc::new(file),
            sync_file,
            size,
            media,
            direct,
            read_only: opts.read_only,
            map: OnceLock::new(),
        })
    }

    /// The mapping of a file in memory, made on first use.
    fn mapping(&self) -> Option<&Arc<MemoryMap>> {
        if !self.in_memory || self.read_only {
            return None;
        }
        self.map
            .get_or_init(|| MemoryMap::of(&self.file, self.size).ok().map(Arc::new))
            .as_ref()
    }

    /// Written pages may be read through the mapping, if there is one.
    fn mark_written(&self, offset: u64, len: u64) {
        if let Some(Some(map)) = self.map.get() {
            map.mark_allocated(offset, len);
        }
    }

    /// Whether zeroing or discarding `[offset, offset + len)` has anything
    /// to do; an error for a range beyond the file or a read-only file.
    fn changes(&self, offset: u64, len: u64) -> io::Result<bool> {
        check_range(self.size, offset, len)?;
        if self.read_only {
            return Err(read_only_error());
        }
        Ok(len > 0)
    }

    /// Pages about to become holes must not be read through the mapping.
    fn forget_written(&self, offset: u64, len: u64) {
        if let Some(Some(map)) = self.map.get() {
            map.forget_allocated(offset, len);
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the path it was opened by still names this file. When not
    /// (deleted, or replaced by another file), I/O goes on to the open
    /// file, which nothing will find again after a restart.
    pub fn path_names_it(&self) -> io::Result<bool> {
        use std::os::unix::fs::MetadataExt;
        let open = self.file.metadata()?;
        match std::fs::metadata(&self.path) {
            Ok(now) => Ok(now.dev() == open.dev() && now.ino() == open.ino()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn writer(&self, fua: bool) -> io::Result<&File> {
        match (&self.sync_file, fua) {
            (None, _) => Err(read_only_error()),
            (Some(sync), true) => Ok(sync),
            (Some(_), false) => Ok(self.file.as_ref()),
        }
    }

    fn direct_read(&self, d: &Direct, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if d.covers(buf.as_ptr(), offset, buf.len()) {
            return self.file.read_exact_at(buf, offset);
        }
        let (start, len) = d.window(offset, buf.len());
        let mut bounce = d.bounce(len)?;
        self.file.read_exact_at(&mut bounce, start)?;
        let skip = (offset - start) as usize;
        buf.copy_from_slice(&bounce[skip..skip + buf.len()]);
        Ok(())
    }

    fn direct_write(&self, d: &Direct, out: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        if d.covers(buf.as_ptr(), offset, buf.len()) {
            return out.write_all_at(buf, offset);
        }
        if d.offset_aligned(offset, buf.len()) {
            let mut bounce = d.bounce(buf.len())?;
            bounce.copy_from_slice(buf);
            return out.write_all_at(&bounce, offset);
        }
        // Partial alignment units: read them, patch, write back. Two such
        // writes to different bytes of one unit must not undo each other.
        let _guard = d.rmw.lock();
        let (start, len) = d.window(offset, buf.len());
        let mut bounce = d.bounce(len)?;
        self.file.read_exact_at(&mut bounce, start)?;
        let skip = (offset - start) as usize;
        bounce[skip..skip + buf.len()].copy_from_slice(buf);
        out.write_all_at(&bounce, start)
    }
}

/// Errors meaning "this file or device cannot do that operation".
fn unsupported(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::ENOSYS)
    )
}

impl BlockDevice for FileDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        match &self.direct {
            Some(d) => self.direct_read(d, buf, offset),
            None => self.file.read_exact_at(buf, offset),
        }
    }

    fn reads_in_batches(&self) -> bool {
        self.direct.is_some()
    }

    fn read_batch(&self, reads: &mut [BatchRead], done: &mut dyn FnMut(usize, &mut BatchRead)) {
        let Some(d) = &self.direct else {
            return read_each(self, reads, done);
        };
        // Each submitted read lands in the caller's buffer when the kernel
        // can take it as it is, otherwise in an aligned window copied out
        // afterwards.
        let mut slots = Vec::with_capacity(reads.len());
        let mut owners: Vec<(usize, Option<(AlignedBuf, usize)>)> = Vec::with_capacity(reads.len());
        for (i, r) in reads.iter_mut().enumerate() {
            r.result = check_range(self.size, r.offset, r.buf.len() as u64);
            if r.result.is_err() || r.buf.is_empty() {
                done(i, r);
                continue;
            }
            if d.covers(r.buf.as_ptr(), r.offset, r.buf.len()) {
                slots.push(uring::Slot::new(&mut r.buf, r.offset));
                owners.push((i, None));
                continue;
            }
            let (start, len) = d.window(r.offset, r.buf.len());
            match d.bounce(len) {
                Ok(mut bounce) => {
                    slots.push(uring::Slot::new(&mut bounce, start));
                    owners.push((i, Some((bounce, (r.offset - start) as usize))));
                }
                Err(e) => {
                    r.result = Err(e);
                    done(i, r);
                }
            }
        }
        let submitted = uring::read_all(
            &self.file,
            self.file.as_raw_fd(),
            &mut slots,
            &mut |k, slot| {
                let (i, bounce) = &owners[k];
                let r = &mut reads[*i];
                r.result = std::mem::replace(&mut slot.got, Ok(0)).map(|_| ());
                if let (Ok(()), Some((window, skip))) = (&r.result, bounce) {
                    let n = r.buf.len();
                    r.buf.copy_from_slice(&window[*skip..*skip + n]);
                }
                done(*i, r);
            },
        );
        if !submitted {
            for (i, _) in owners {
                let r = &mut reads[i];
                r.result = self.direct_read(d, &mut r.buf, r.offset);
                done(i, r);
            }
        }
    }

    fn direct_read(&self, offset: u64, len: usize) -> Option<io::Result<DirectRead>> {
        let d = self.direct.as_ref()?;
        let planned = check_range(self.size, offset, len as u64).and_then(|()| {
            let (start, window_len) = d.window(offset, len);
            Ok(DirectRead::new(
                self.file.as_raw_fd(),
                start,
                d.bounce(window_len)?,
                (offset - start) as usize,
                len,
            ))
        });
        Some(planned)
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        let out = self.writer(fua)?;
        if buf.is_empty() {
            return Ok(());
        }
        match &self.direct {
            Some(d) => self.direct_write(d, out, buf, offset),
            None => out
                .write_all_at(buf, offset)
                .map(|()| self.mark_written(offset, buf.len() as u64)),
        }
    }

    fn write_parts_at(&self, parts: &[&[u8]], offset: u64, fua: bool) -> io::Result<()> {
        if self.direct.is_some() {
            // O_DIRECT wants aligned memory, which received parts are not.
            return crate::write_joined(self, parts, offset, fua);
        }
        let len = parts.iter().map(|p| p.len() as u64).sum();
        check_range(self.size, offset, len)?;
        sys::pwritev_all(self.writer(fua)?.as_fd(), parts, offset)
            .map(|()| self.mark_written(offset, len))
    }

    fn flush(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.file.sync_data()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.changes(offset, len)? {
            return Ok(());
        }
        self.forget_written(offset, len);
        match self.media {
            Media::Regular => match sys::punch_hole(self.file.as_fd(), offset, len) {
                // We promise zeros after discard; keep it without holes.
                Err(e) if unsupported(&e) => crate::write_zeros_by_writing(self, offset, len),
                r => r,
            },
            // Discard is advisory on devices that don't do it.
            Media::Block => match sys::block_discard(self.file.as_fd(), offset, len) {
                Err(e) if unsupported(&e) => Ok(()),
                r => r,
            },
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.changes(offset, len)? {
            return Ok(());
        }
        self.forget_written(offset, len);
        let fd = self.file.as_fd();
        let fast = match self.media {
            Media::Regular => match sys::punch_hole(fd, offset, len) {
                Err(e) if unsupported(&e) => sys::zero_range(fd, offset, len),
                r => r,
            },
            Media::Block => sys::block_zero_out(fd, offset, len),
        };
        match fast {
            Err(e) if unsupported(&e) => crate::write_zeros_by_writing(self, offset, len),
            r => r,
        }
    }

    /// Extents allocated as unwritten (`FALLOC_FL_ZERO_RANGE`) where the
    /// file system has them, so that nothing is written; zeros written
    /// where it has not (tmpfs).
    fn allocate_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.changes(offset, len)? {
            return Ok(());
        }
        let fast = match self.media {
            Media::Regular => sys::zero_range(self.file.as_fd(), offset, len),
            Media::Block => sys::block_zero_out(self.file.as_fd(), offset, len),
        };
        match fast {
            Err(e) if unsupported(&e) => crate::write_zeros_by_writing(self, offset, len),
            r => r,
        }
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<(Allocation, u64)> {
        check_range(self.size, offset, len)?;
        if self.media == Media::Block || len == 0 {
            return Ok((Allocation::Mapped, len));
        }
        let fd = self.file.as_fd();
        match sys::seek_data(fd, offset)? {
            None => Ok((Allocation::Deallocated, len)),
            Some(data) if data > offset => Ok((Allocation::Deallocated, (data - offset).min(len))),
            Some(_) => {
                let hole = sys::seek_hole(fd, offset)?.unwrap_or(self.size);
                Ok((
                    Allocation::Mapped,
                    hole.saturating_sub(offset).clamp(1, len),
                ))
            }
        }
    }

    /// Between two regular files opened without O_DIRECT: copied inside
    /// the kernel, through the page cache (shared extents where the file
    /// system reflinks), so the bytes never pass through this process.
    fn copy_from(
        &self,
        src: &dyn BlockDevice,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> Option<io::Result<()>> {
        let src = src.as_any()?.downcast_ref::<FileDevice>()?;
        let plain = |d: &FileDevice| d.media == Media::Regular && d.direct.is_none();
        if self.read_only || !plain(self) || !plain(src) {
            return None;
        }
        if let Err(e) = check_range(src.size, src_offset, len)
            .and_then(|()| check_range(self.size, dst_offset, len))
        {
            return Some(Err(e));
        }
        let mut done = 0;
        let copied = loop {
            if done == len {
                break Ok(());
            }
            let (from, to) = (src.file.as_fd(), self.file.as_fd());
            match sys::copy_file_range(from, src_offset + done, to, dst_offset + done, len - done) {
                Ok(0) => {
                    break Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("{} ended before its size", src.path.display()),
                    ))
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Not between these two (other file systems, ranges of one
                // file that overlap): nothing is copied yet, the caller does.
                Err(e)
                    if done == 0
                        && (unsupported(&e)
                            || matches!(e.raw_os_error(), Some(libc::EXDEV | libc::EINVAL))) =>
                {
                    return None;
                }
                Err(e) => break Err(e),
            }
        };
        self.mark_written(dst_offset, done);
        Some(copied)
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn memory_file(&self) -> Option<&Arc<File>> {
        self.in_memory.then_some(&self.file)
    }

    fn memory_map(&self) -> Option<&MemoryMap> {
        self.mapping().map(|map| &**map)
    }

    fn mapped_bytes(&self, offset: u64, len: usize) -> Option<MappedBytes> {
        // The mapping is the device's size: its own range check is ours.
        self.mapping()?.bytes(offset, len)
    }

    fn capabilities(&self) -> Capabilities {
        let regular = self.media == Media::Regular;
        Capabilities {
            thin: regular,
            // Even with O_DIRECT, allocating writes to a sparse file and
            // the disk's own cache need fdatasync to become stable, so the
            // LUN always reports a volatile cache and initiators flush.
            volatile_cache: true,
            may_block: !self.in_memory,
            discard_zeroes: regular,
            discard: true,
            read_only: self.read_only,
        }
    }

    fn describe(&self) -> String {
        let direct = if self.direct.is_some() { ",direct" } else { "" };
        format!("file:{}{direct}", self.path.display())
    }
}

#[cfg(test)]
mod tests;
