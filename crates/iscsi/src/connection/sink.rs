//! Where the writer's bytes go, and how file pages get there.
//!
//! A READ of a file in memory (tmpfs) arrives as a file region. Sent with
//! `sendfile`, the kernel hands the file's pages to the socket: over
//! loopback the initiator copies straight from them, so the target copies
//! nothing at all, where `pread` + `write` copied every byte twice.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use peer_limits::write_deadline;

use scsi_api::FileRegion;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::io::{DuplexStream, Interest};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;

/// The write side of a connection.
pub(crate) trait Sink: AsyncWrite + Unpin + Send {
    /// The socket underneath, for `sendfile` and corking; `None` when the
    /// sink is not one (tests), and file regions are then copied.
    fn socket(&self) -> Option<&TcpStream> {
        None
    }
}

impl Sink for OwnedWriteHalf {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl Sink for DuplexStream {}

/// Send `region` to the sink: from the file's pages when it is a socket,
/// otherwise read into memory first. Bytes past the end of the file (it
/// was shortened behind our back) go out as zeros, so the PDU stream keeps
/// the length its header announced.
/// `deadline` bounds each wait for the socket to take more.
pub(crate) async fn send_region<S: Sink>(
    sink: &mut S,
    region: &FileRegion,
    deadline: Duration,
) -> io::Result<()> {
    let Some(socket) = sink.socket() else {
        return write_deadline(deadline, sink.write_all(&region.read()?)).await;
    };
    let mut offset = region.offset as libc::off_t;
    let mut left = region.len;
    while left > 0 {
        write_deadline(deadline, socket.writable()).await?;
        let sent = socket.try_io(Interest::WRITABLE, || {
            // SAFETY: both descriptors are open for the call (the socket
            // is borrowed, the file is held by the region's Arc), and
            // `offset` is a valid off_t the kernel updates in place.
            let n = unsafe {
                libc::sendfile(
                    socket.as_raw_fd(),
                    region.file.as_raw_fd(),
                    &mut offset,
                    left,
                )
            };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match sent {
            Ok(0) => return write_deadline(deadline, sink.write_all(&vec![0; left])).await,
            Ok(n) => left -= n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Hold back partial TCP segments while a batch mixes headers and file
/// pages, so a header leaves in the same segment as the data after it;
/// uncorking sends whatever is left.
pub(crate) fn cork<S: Sink>(sink: &S, on: bool) {
    if let Some(socket) = sink.socket() {
        let value: libc::c_int = on.into();
        // SAFETY: a plain setsockopt on a socket we borrow, with a c_int
        // option value of the right size. A failure only costs segments.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_CORK,
                std::ptr::from_ref(&value).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}
