//! Thin wrappers over the Linux calls the file device needs: block device
//! ioctls, fallocate, SEEK_DATA/SEEK_HOLE and statx DIO alignment.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `_IOC` encoding of the architectures whose ioctl numbers differ from
/// the generic layout.
#[cfg(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
mod ioc {
    pub const NONE: u64 = 1;
    pub const READ: u64 = 2;
    pub const DIR_SHIFT: u64 = 29;
}
#[cfg(not(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
mod ioc {
    pub const NONE: u64 = 0;
    pub const READ: u64 = 2;
    pub const DIR_SHIFT: u64 = 30;
}

const fn ioc(dir: u64, ty: u64, nr: u64, size: u64) -> libc::Ioctl {
    ((dir << ioc::DIR_SHIFT) | (size << 16) | (ty << 8) | nr) as libc::Ioctl
}

/// `_IOR(0x12, 114, size_t)`: device size in bytes.
const BLKGETSIZE64: libc::Ioctl = ioc(ioc::READ, 0x12, 114, std::mem::size_of::<usize>() as u64);
/// `_IO(0x12, 119)`: discard a byte range.
const BLKDISCARD: libc::Ioctl = ioc(ioc::NONE, 0x12, 119, 0);
/// `_IO(0x12, 127)`: zero a byte range.
const BLKZEROOUT: libc::Ioctl = ioc(ioc::NONE, 0x12, 127, 0);

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub fn block_device_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) })?;
    Ok(size)
}

pub fn block_logical_sector_size(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer.
    check(unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::BLKSSZGET,
            &mut size as *mut libc::c_int,
        )
    })?;
    Ok(size.max(512) as u32)
}

fn block_range_ioctl(
    fd: BorrowedFd<'_>,
    request: libc::Ioctl,
    offset: u64,
    len: u64,
) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: both ioctls read two u64 (start, length) through the pointer.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), request, range.as_ptr()) })
}

pub fn block_discard(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    block_range_ioctl(fd, BLKDISCARD, offset, len)
}

pub fn block_zero_out(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    block_range_ioctl(fd, BLKZEROOUT, offset, len)
}

fn fallocate(fd: BorrowedFd<'_>, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: plain syscall on a valid descriptor.
    check(unsafe { libc::fallocate(fd.as_raw_fd(), mode, offset, len) })
}

/// Deallocates a range of a regular file; it reads back as zeros.
pub fn punch_hole(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    fallocate(
        fd,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        offset,
        len,
    )
}

/// Zeros a range of a regular file, keeping it allocated.
pub fn zero_range(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    fallocate(
        fd,
        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        offset,
        len,
    )
}

/// Copies up to `len` bytes from one file to another (or within one)
/// inside the kernel, which shares the extents where the file system can
/// (a reflink); returns how many it copied.
pub fn copy_file_range(
    src: BorrowedFd<'_>,
    src_offset: u64,
    dst: BorrowedFd<'_>,
    dst_offset: u64,
    len: u64,
) -> io::Result<u64> {
    let (Ok(mut from), Ok(mut to), Ok(len)) = (
        libc::loff_t::try_from(src_offset),
        libc::loff_t::try_from(dst_offset),
        usize::try_from(len),
    ) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: plain syscall on valid descriptors; the kernel updates only
    // the two offsets, which live on this stack.
    let copied = unsafe {
        libc::copy_file_range(src.as_raw_fd(), &mut from, dst.as_raw_fd(), &mut to, len, 0)
    };
    if copied < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(copied as u64)
    }
}

fn lseek(fd: BorrowedFd<'_>, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let Ok(offset) = libc::off_t::try_from(offset) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: plain syscall on a valid descriptor. The file position it
    // moves is never used: all I/O is positional.
    let ret = unsafe { libc::lseek(fd.as_raw_fd(), offset, whence) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(err);
    }
    Ok(Some(ret as u64))
}

/// Start of the first data at or after `offset`; `None` when only a hole
/// follows.
pub fn seek_data(fd: BorrowedFd<'_>, offset: u64) -> io::Result<Option<u64>> {
    lseek(fd, offset, libc::SEEK_DATA)
}

/// Start of the first hole at or after `offset` (end of file counts).
pub fn seek_hole(fd: BorrowedFd<'_>, offset: u64) -> io::Result<Option<u64>> {
    lseek(fd, offset, libc::SEEK_HOLE)
}

/// Memory and file-offset alignment O_DIRECT needs on this file, when the
/// kernel and file system report it.
pub fn direct_io_alignment(fd: BorrowedFd<'_>) -> Option<(u32, u32)> {
    // SAFETY: statx fills the zeroed struct; an empty path with
    // AT_EMPTY_PATH refers to the descriptor itself.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let ret = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if ret < 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    if stx.stx_dio_mem_align == 0 || stx.stx_dio_offset_align == 0 {
        return None;
    }
    Some((stx.stx_dio_mem_align, stx.stx_dio_offset_align))
}

const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

// `f_type` is i64 here but another integer type on other architectures.
#[allow(clippy::unnecessary_cast)]
fn is_memory_file_system(st: &libc::statfs) -> bool {
    matches!(st.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC)
}

/// Whether the file lives in memory (tmpfs, ramfs): its reads and writes
/// copy pages and never wait for a device.
pub fn on_memory_file_system(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: fstatfs fills the zeroed struct for a valid descriptor.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } < 0 {
        return false;
    }
    is_memory_file_system(&st)
}

/// The same for a path, which need not be open (false when it cannot be
/// looked up).
pub fn path_on_memory_file_system(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs(2) with a NUL-terminated path and a zeroed struct of
    // the right type to fill.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c_path.as_ptr(), &mut st) } != 0 {
        return false;
    }
    is_memory_file_system(&st)
}

/// Write `parts` one after another from `offset` with `pwritev`, however
/// many calls it takes.
pub fn pwritev_all(fd: BorrowedFd<'_>, parts: &[&[u8]], mut offset: u64) -> io::Result<()> {
    // At most IOV_MAX (1024 on Linux) vectors per call.
    const MAX_VECTORS: usize = 1024;
    // A write has a few parts: their vectors are held in place.
    let mut vectors: smallvec::SmallVec<[io::IoSlice<'_>; 8]> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| io::IoSlice::new(p))
        .collect();
    let mut left = &mut vectors[..];
    while !left.is_empty() {
        let count = left.len().min(MAX_VECTORS);
        // SAFETY: IoSlice is ABI-compatible with iovec, and the `count`
        // vectors it points at stay borrowed for the call.
        let written = unsafe {
            libc::pwritev(
                fd.as_raw_fd(),
                left.as_ptr().cast::<libc::iovec>(),
                count as libc::c_int,
                offset as libc::off_t,
            )
        };
        if written < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        offset += written as u64;
        io::IoSlice::advance_slices(&mut left, written as usize);
    }
    Ok(())
}
