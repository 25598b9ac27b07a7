//! Large WRITEs received from the socket straight into the pages of the
//! device's file (`block::MemoryMap`), as the iSCSI transport receives
//! its Data-Out: each byte is copied once, socket to page, instead of
//! into the connection's buffer and from there into the page with
//! `pwrite`. Used by [`crate::batched`] for a write of at least
//! [`PLACED_WRITE_MIN`] bytes whose payload is not all in its buffer yet,
//! and for smaller ones from a client that sends one request at a time
//! ([`crate::alone::Lockstep`]).
//!
//! The same rules as iSCSI's (docs/design.md, "WRITEs received into the
//! file's pages"): no range lock while the data travels, each `recv` or
//! `pwrite` holds the bytes it touches shared; only the kernel writes the
//! mapping (`recv`), and an EFAULT (a page tmpfs cannot back) turns the
//! rest of the write to `pwrite` from the buffer, which reports the real
//! cause; the reply goes out once the last byte is in, after a flush
//! where FUA or a disabled write cache ask for one.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::task::{ready, Context, Poll};

use export::Backing;
use tokio::io::Interest;

use crate::ops::{self, Outcome};
use crate::socket::recv_now_into;
use crate::wire::Command;

/// Writes of at least this many bytes are received into the file's pages;
/// for shorter ones the extra `recv` costs more than the copy it saves.
pub(crate) const PLACED_WRITE_MIN: usize = 64 << 10;

/// A stream that may receive bytes into memory given by the caller with a
/// system call of its own: plain sockets, not TLS (which decrypts in user
/// space).
pub(crate) trait RecvInto {
    /// Waits until the socket is readable and calls `recv` with its
    /// descriptor; `recv` returns `WouldBlock` when nothing was there.
    /// `None` for a stream that cannot.
    fn poll_recv_with(
        &self,
        cx: &mut Context<'_>,
        recv: &mut dyn FnMut(RawFd) -> io::Result<usize>,
    ) -> Option<Poll<io::Result<usize>>>;

    /// The socket's descriptor, for receiving without waiting on it
    /// ([`crate::spin`]); `None` for a stream that cannot.
    fn raw_fd(&self) -> Option<RawFd>;
}

macro_rules! recv_into_socket {
    ($half:ty, $stream:ty) => {
        impl RecvInto for $half {
            fn poll_recv_with(
                &self,
                cx: &mut Context<'_>,
                recv: &mut dyn FnMut(RawFd) -> io::Result<usize>,
            ) -> Option<Poll<io::Result<usize>>> {
                let socket: &$stream = self.as_ref();
                Some(loop {
                    match socket.poll_read_ready(cx) {
                        Poll::Pending => break Poll::Pending,
                        Poll::Ready(Err(e)) => break Poll::Ready(Err(e)),
                        Poll::Ready(Ok(())) => {}
                    }
                    // A WouldBlock clears the readiness, so the next poll
                    // waits for the socket.
                    match socket.try_io(Interest::READABLE, || recv(socket.as_raw_fd())) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        r => break Poll::Ready(r),
                    }
                })
            }

            fn raw_fd(&self) -> Option<RawFd> {
                let socket: &$stream = self.as_ref();
                Some(socket.as_raw_fd())
            }
        }
    };
}

recv_into_socket!(tokio::net::tcp::OwnedReadHalf, tokio::net::TcpStream);
recv_into_socket!(tokio::net::unix::OwnedReadHalf, tokio::net::UnixStream);

impl<S> RecvInto for tokio::io::ReadHalf<S> {
    fn poll_recv_with(
        &self,
        _: &mut Context<'_>,
        _: &mut dyn FnMut(RawFd) -> io::Result<usize>,
    ) -> Option<Poll<io::Result<usize>>> {
        None
    }

    fn raw_fd(&self) -> Option<RawFd> {
        None
    }
}

/// What one receive into the pages did.
pub(crate) enum Received {
    /// This many bytes went in (0: the client closed the connection).
    Bytes(usize),
    /// The socket failed: the connection is over.
    Failed(io::Error),
    /// Receiving into the pages failed; the rest of the write comes
    /// through the buffer.
    Declined,
}

/// A write whose payload is arriving.
pub(crate) struct PlacedWrite {
    pub cookie: u64,
    pub offset: u64,
    len: usize,
    fua: bool,
    /// Payload bytes in place (or dropped after a failure).
    done: usize,
    /// Whether the rest still goes straight into the pages.
    pub direct: bool,
    /// The first failure to write, after which no byte goes in.
    failed: Option<io::Error>,
}

impl PlacedWrite {
    pub fn new(cookie: u64, offset: u64, len: usize, fua: bool) -> PlacedWrite {
        PlacedWrite {
            cookie,
            offset,
            len,
            fua,
            done: 0,
            direct: true,
            failed: None,
        }
    }

    /// The command, for the export's counters.
    pub fn command(&self) -> Command {
        Command::Write {
            offset: self.offset,
            len: self.len as u64,
            fua: self.fua,
        }
    }

    /// Payload bytes still to come.
    pub fn remaining(&self) -> usize {
        self.len - self.done
    }

    /// Writes payload bytes that arrived in the buffer, in order.
    pub fn write_buffered(&mut self, backing: &Backing, bytes: &[u8]) {
        let bytes = &bytes[..bytes.len().min(self.remaining())];
        if self.failed.is_none() {
            let at = self.offset + self.done as u64;
            let _held = backing.locks.lock(at, bytes.len() as u64, false);
            if let Err(e) = backing.device().write_at(bytes, at, false) {
                self.failed = Some(e);
            }
        }
        self.done += bytes.len();
    }

    /// Receives what the socket has of the rest straight into the pages.
    pub fn poll_receive<R: RecvInto>(
        &mut self,
        cx: &mut Context<'_>,
        reader: &R,
        backing: &Backing,
    ) -> Poll<Received> {
        self.receive(backing, |recv| reader.poll_recv_with(cx, recv))
    }

    /// Receives what `fd` has of the rest straight into the pages, without
    /// waiting: `None` when nothing was there.
    pub fn receive_now(&mut self, fd: RawFd, backing: &Backing) -> Option<Received> {
        let polled = self.receive(backing, |recv| {
            Some(match recv(fd) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
                r => Poll::Ready(r),
            })
        });
        match polled {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        }
    }

    /// One receive into the pages through `with`, which hands the socket's
    /// descriptor to the `recv` it is given (`None`: it cannot).
    fn receive(
        &mut self,
        backing: &Backing,
        with: impl FnOnce(&mut dyn FnMut(RawFd) -> io::Result<usize>) -> Option<Poll<io::Result<usize>>>,
    ) -> Poll<Received> {
        let Some(map) = backing.device().memory_map() else {
            return Poll::Ready(Received::Declined);
        };
        let (at, len) = (self.offset + self.done as u64, self.remaining());
        // Whether a failure came from the socket (the connection's
        // problem) or from placing the bytes (the write's).
        let mut from_socket = false;
        let mut recv = |fd: RawFd| {
            from_socket = false;
            let _held = backing.locks.lock(at, len as u64, false);
            map.fill(at, len, &mut |to, n| {
                // SAFETY: `to` is `n` writable bytes of the mapping, lent
                // for this call; only the kernel writes them.
                unsafe { recv_now_into(fd, to, n) }.inspect_err(|e| {
                    from_socket = e.raw_os_error() != Some(libc::EFAULT);
                })
            })
        };
        let Some(polled) = with(&mut recv) else {
            return Poll::Ready(Received::Declined);
        };
        Poll::Ready(match ready!(polled) {
            Ok(n) => {
                self.done += n;
                Received::Bytes(n)
            }
            Err(e) if from_socket => Received::Failed(e),
            Err(e) => {
                tracing::debug!(error = %e, "nbd: receiving a write into the file's pages failed");
                self.direct = false;
                Received::Declined
            }
        })
    }

    /// The write's outcome once every byte is in.
    pub fn finish(self, backing: &Backing) -> Outcome {
        if let Some(e) = self.failed {
            return Outcome::Failed {
                error: ops::errno(&e),
                message: e.to_string(),
            };
        }
        // Bytes in the pages are where a buffered write puts them; what
        // FUA or a disabled write cache ask for on top is a flush.
        if backing.force_unit_access(self.fua) {
            if let Err(e) = backing.device().flush() {
                return Outcome::Failed {
                    error: ops::errno(&e),
                    message: e.to_string(),
                };
            }
        }
        Outcome::Done
    }
}
