//! The socket side of a connection: the input buffer, and one wait's
//! writes and reads, through the runtime or straight to the kernel.

use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use export::Backing;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::outbox::Outbox;
use crate::placed::{PlacedWrite, Received, RecvInto};
use crate::socket::{self};

use super::Event;

/// What the input buffer holds when no request needs more.
pub(super) const READ_BUFFER: usize = 256 * 1024;

/// Up to this size, an input buffer grown for large requests is kept for
/// the next ones: allocating and faulting in a MiB per 1 MiB write would
/// cost more than the write, and a buffer of several requests seldom has
/// to move a partial one to its start.
pub(super) const INPUT_KEPT: usize = 8 << 20;

/// Bytes received and not yet taken as requests.
pub(super) struct Input {
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
}

impl Input {
    pub(super) fn new() -> Input {
        Input {
            buf: vec![0; READ_BUFFER],
            start: 0,
            end: 0,
        }
    }

    pub(super) fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub(super) fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > INPUT_KEPT {
                self.buf.truncate(READ_BUFFER);
                self.buf.shrink_to_fit();
            }
        }
    }

    /// Makes room for a request of `need` bytes from the first pending one.
    pub(super) fn make_room(&mut self, need: usize) {
        if self.start > 0 && (self.buf.len() - self.start < need || self.end == self.buf.len()) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() < need {
            self.buf.resize(need.max((4 * need).min(INPUT_KEPT)), 0);
        }
    }

    pub(super) fn has_space(&self) -> bool {
        self.end < self.buf.len()
    }
}

/// Writes what the socket takes now, without waiting.
pub(super) fn write_now<R, W>(
    reader: &mut R,
    writer: &mut W,
    out: &mut Outbox<'_>,
    input: &mut Input,
    backing: &Backing,
) -> Poll<Event>
where
    R: AsyncRead + RecvInto + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut cx = Context::from_waker(Waker::noop());
    poll_io(
        &mut cx,
        reader,
        writer,
        out,
        input,
        &mut Read::Nothing,
        backing,
    )
}

/// Writes what it can of `out` to `fd`, a plain socket blocking alone on
/// its thread (`alone::Alone`), straight to the kernel rather than
/// through the runtime's readiness bookkeeping; ready once that made
/// progress. (A blocked send ends within the socket's timeout.)
pub(super) fn write_blocking(fd: RawFd, out: &mut Outbox<'_>) -> Poll<Event> {
    if out.queued() > 0 {
        let wrote = match out.with_slices(|slots| socket::writev(fd, slots)) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                Poll::Pending
            }
            wrote => Poll::Ready(wrote),
        };
        match count_written(out, wrote) {
            Ok(true) => {}
            Ok(false) => return Poll::Pending,
            Err(e) => return Poll::Ready(Event::WriteFailed(e)),
        }
    }
    if out.queued() == 0 {
        // (Nothing is buffered above a plain socket.)
        out.flushed();
    }
    Poll::Ready(Event::Progress)
}

/// Counts a write of `out`'s bytes against it: whether it wrote any, or
/// why the replies cannot go out (a write of none fails).
pub(super) fn count_written(
    out: &mut Outbox<'_>,
    wrote: Poll<io::Result<usize>>,
) -> io::Result<bool> {
    match wrote {
        Poll::Ready(Ok(0)) => Err(io::ErrorKind::WriteZero.into()),
        Poll::Ready(Ok(written)) => {
            out.advance(written);
            Ok(true)
        }
        Poll::Ready(Err(e)) => Err(e),
        Poll::Pending => Ok(false),
    }
}

/// What one wait for the socket reads.
pub(super) enum Read<'a> {
    Nothing,
    /// Into the input buffer, up to this index of it.
    Upto(usize),
    /// The rest of a write's payload, into the file's pages.
    Placed(&'a mut PlacedWrite),
}

/// Writes what it can of `out`, flushes the stream once all of it is
/// written, and reads what it can as `read` says: ready once any of that
/// made progress.
pub(super) fn poll_io<R, W>(
    cx: &mut Context<'_>,
    reader: &mut R,
    writer: &mut W,
    out: &mut Outbox<'_>,
    input: &mut Input,
    read: &mut Read<'_>,
    backing: &Backing,
) -> Poll<Event>
where
    R: AsyncRead + RecvInto + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut progress = false;
    if out.queued() > 0 {
        let wrote = out.with_slices(|slots| Pin::new(&mut *writer).poll_write_vectored(cx, slots));
        match count_written(out, wrote) {
            Ok(wrote) => progress = wrote,
            Err(e) => return Poll::Ready(Event::WriteFailed(e)),
        }
    }
    if out.queued() == 0 && out.unflushed() {
        match Pin::new(&mut *writer).poll_flush(cx) {
            Poll::Ready(Ok(())) => {
                out.flushed();
                progress = true;
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Event::WriteFailed(e)),
            Poll::Pending => {}
        }
    }
    match read {
        Read::Nothing => {}
        Read::Placed(p) => match p.poll_receive(cx, &*reader, backing) {
            Poll::Ready(Received::Bytes(0)) => return Poll::Ready(Event::Eof),
            Poll::Ready(Received::Bytes(_) | Received::Declined) => progress = true,
            Poll::Ready(Received::Failed(e)) => return Poll::Ready(Event::ReadFailed(e)),
            Poll::Pending => {}
        },
        Read::Upto(upto) => {
            let mut space = ReadBuf::new(&mut input.buf[input.end..*upto]);
            match Pin::new(&mut *reader).poll_read(cx, &mut space) {
                Poll::Ready(Ok(())) => {
                    let n = space.filled().len();
                    if n == 0 {
                        return Poll::Ready(Event::Eof);
                    }
                    input.end += n;
                    progress = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Event::ReadFailed(e)),
                Poll::Pending => {}
            }
        }
    }
    if progress {
        Poll::Ready(Event::Progress)
    } else {
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(input: &mut Input, bytes: &[u8]) {
        input.buf[input.end..input.end + bytes.len()].copy_from_slice(bytes);
        input.end += bytes.len();
    }

    #[test]
    fn the_input_keeps_a_partial_request_and_grows_for_a_large_one() {
        let mut input = Input::new();
        receive(&mut input, &[1; 100]);
        input.consume(60);
        // A request of 1 MiB whose first 40 bytes are here: they move to
        // the start and the buffer grows past what it needs.
        input.make_room(1 << 20);
        assert_eq!(input.pending(), &[1; 40]);
        assert_eq!(input.start, 0);
        assert!(input.buf.len() >= 4 << 20);
        input.consume(40);
        assert!(
            input.buf.len() >= 4 << 20,
            "kept for the next large request"
        );
        // One beyond what is kept is given back once taken.
        input.make_room(INPUT_KEPT + 1);
        receive(&mut input, &[2; 10]);
        input.consume(10);
        assert_eq!(input.buf.len(), READ_BUFFER);
    }
}
