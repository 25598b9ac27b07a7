//! System calls on a connection's socket made beside the runtime, on its
//! raw descriptor: receives that do not wait (polling, gathering, placing
//! a write's payload), sends while it blocks, and socket options
//! (timeouts, the receive low-water mark, the receive buffer).

use std::io::{self, IoSlice};
use std::os::fd::RawFd;
use std::time::Duration;

/// Sets the socket-level option `option` of `fd` to `value` (a plain C
/// value: an int, a timeval).
pub(crate) fn set_socket_option<T: Copy>(
    fd: RawFd,
    option: libc::c_int,
    value: T,
) -> io::Result<()> {
    set_option(fd, libc::SOL_SOCKET, option, value)
}

fn set_option<T: Copy>(
    fd: RawFd,
    level: libc::c_int,
    option: libc::c_int,
    value: T,
) -> io::Result<()> {
    // SAFETY: `value` lives through the call and its size is given.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
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

/// Probes a TCP peer silent for `idle`, and has the kernel drop the
/// connection when three probes over `timeout` go unanswered: NBD has no
/// ping of its own, and a client idle for hours is normal, but a dead one
/// must not hold its slot.
pub(crate) fn keep_alive(fd: RawFd, idle: Duration, timeout: Duration) -> io::Result<()> {
    let secs = |d: Duration| d.as_secs().clamp(1, i32::MAX as u64) as libc::c_int;
    set_socket_option(fd, libc::SO_KEEPALIVE, 1 as libc::c_int)?;
    set_option(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, secs(idle))?;
    set_option(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_KEEPINTVL,
        secs(timeout / 3),
    )?;
    set_option(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3 as libc::c_int)
}

/// The receive buffer a TCP connection asks for: the kernel doubles it for
/// its own bookkeeping, and 8 MiB holds twice the 4 MiB a Linux client
/// sends ahead at most by default (`net.ipv4.tcp_wmem`), so its window
/// never closes while the server takes what came.
const RECEIVE_BUFFER: libc::c_int = 4 << 20;

/// Gives a TCP connection a receive buffer of [`RECEIVE_BUFFER`] from the
/// start, not one the kernel sizes from what the server reads per round
/// trip: on loopback, with round trips of tens of µs, that misjudges it.
/// Of two connections taking 1M writes at once, one's buffer had grown to
/// 25 MB and the other's stayed at 4.7 MB, full, so that client waited for
/// each window update and the server's receives did its sending too: 200
/// µs of the server's CPU a write against 80 (docs/bench/nbd.md).
///
/// Beyond `net.core.rmem_max` only with CAP_NET_ADMIN; without it, where
/// that limit is lower, the kernel keeps sizing the buffer: a fixed
/// smaller one would be worse.
pub(crate) fn fix_receive_buffer(fd: RawFd) -> io::Result<()> {
    match set_socket_option(fd, libc::SO_RCVBUFFORCE, RECEIVE_BUFFER) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
        done => return done,
    }
    if rmem_max()? >= RECEIVE_BUFFER {
        set_socket_option(fd, libc::SO_RCVBUF, RECEIVE_BUFFER)?;
    }
    Ok(())
}

/// The most `SO_RCVBUF` may ask for without CAP_NET_ADMIN.
fn rmem_max() -> io::Result<libc::c_int> {
    let limit = std::fs::read_to_string("/proc/sys/net/core/rmem_max")?;
    limit.trim().parse().map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("net.core.rmem_max: {e}"),
        )
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    fn receive_buffer(fd: RawFd) -> libc::c_int {
        let mut size: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `size` and `len` are valid for the call.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&mut size as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        size
    }

    #[test]
    fn a_connection_gets_its_whole_receive_buffer_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (served, _) = listener.accept().unwrap();
        let fd = served.as_raw_fd();
        let before = receive_buffer(fd);
        fix_receive_buffer(fd).unwrap();
        let after = receive_buffer(fd);
        // SAFETY: geteuid has no preconditions.
        let privileged = unsafe { libc::geteuid() } == 0;
        if privileged || rmem_max().unwrap() >= RECEIVE_BUFFER {
            assert!(before < 2 * RECEIVE_BUFFER, "{before}");
            assert_eq!(after, 2 * RECEIVE_BUFFER);
        } else {
            assert_eq!(after, before, "left to the kernel");
        }
    }
}
