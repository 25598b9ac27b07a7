//! System calls on a connection's socket made beside the runtime, on its
//! raw descriptor: receives that do not wait (polling, gathering, placing
//! a write's payload), sends while it blocks, and socket options
//! (timeouts, the receive low-water mark).

use std::io::{self, IoSlice};
use std::os::fd::RawFd;

/// Sets the socket-level option `option` of `fd` to `value` (a plain C
/// value: an int, a timeval).
pub(crate) fn set_socket_option<T: Copy>(
    fd: RawFd,
    option: libc::c_int,
    value: T,
) -> io::Result<()> {
    // SAFETY: `value` lives through the call and its size is given.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One `recv` from `fd` that does not wait, into `buf`.
pub(crate) fn recv_now(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable memory of `buf.len()` bytes.
    unsafe { recv_now_into(fd, buf.as_mut_ptr(), buf.len()) }
}

/// One `recv` from `fd` that does not wait, into `len` bytes at `to`.
///
/// # Safety
/// `to` must be valid for writes of `len` bytes.
pub(crate) unsafe fn recv_now_into(fd: RawFd, to: *mut u8, len: usize) -> io::Result<usize> {
    let got = libc::recv(fd, to.cast(), len, libc::MSG_DONTWAIT);
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(got as usize)
}

/// One `writev` of `slices` to `fd`, waiting as the socket's mode and
/// send timeout say.
pub(crate) fn writev(fd: RawFd, slices: &[IoSlice<'_>]) -> io::Result<usize> {
    let count = slices.len().min(libc::c_int::MAX as usize) as libc::c_int;
    // SAFETY: an `IoSlice` is an `iovec` (std guarantees its layout on
    // Unix), and each points at live memory of its length.
    let sent = unsafe { libc::writev(fd, slices.as_ptr().cast(), count) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sent as usize)
}
