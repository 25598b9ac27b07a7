//! Transmission for devices that never block (memory, a file on tmpfs):
//! one task per connection reads what the client sent, runs every
//! complete request in it on the spot, and sends all their replies with
//! one `writev`. With many requests in flight that is a few system calls
//! per batch instead of several per request, and no task, channel or
//! thread hop per request. A read of a device that offers its file's
//! pages is sent from them, without copying it into a buffer first, and a
//! large write is received straight into them ([`crate::placed`]).
//!
//! Memory stays bounded: the input buffer holds at most [`INPUT_KEPT`]
//! bytes, or one largest request, and requests are taken only while less
//! than [`OUT_HIGH`] bytes of replies wait to be written.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::io;
use std::os::fd::RawFd;
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use export::Backing;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::alone::{self, Alone, Lockstep, Waited, LOCKSTEP_PLACED_MIN};
use crate::exports::ExportCounters;
use crate::gather::{Gather, Taken};
use crate::handshake::Negotiated;
use crate::ops::{self, Outcome, ReadShape};
use crate::outbox::Outbox;
use crate::placed::{PlacedWrite, Received, RecvInto, PLACED_WRITE_MIN};
use crate::proto::*;
use crate::reply::{self, Answering};
use crate::socket::{self, recv_now};
use crate::spin::{self, Polled, SpinPolicy, Way};
use crate::transmission::{count, gone, protocol_error, run_guarded, stalled, Ended};
use crate::wire::{self, Agreed, Command, Framing, RequestHeader};

/// What the input buffer holds when no request needs more.
const READ_BUFFER: usize = 256 * 1024;

/// Up to this size, an input buffer grown for large requests is kept for
/// the next ones: allocating and faulting in a MiB per 1 MiB write would
/// cost more than the write, and a buffer of several requests seldom has
/// to move a partial one to its start.
const INPUT_KEPT: usize = 8 << 20;

/// Replies waiting beyond this stop the taking of requests until the
/// client reads them.
const OUT_HIGH: usize = 8 << 20;

/// How often a connection whose waits all end at once asks whether its
/// session is to end.
const END_ASKED: Duration = Duration::from_millis(1);

/// Bytes received and not yet taken as requests.
struct Input {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Input {
    fn new() -> Input {
        Input {
            buf: vec![0; READ_BUFFER],
            start: 0,
            end: 0,
        }
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
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
    fn make_room(&mut self, need: usize) {
        if self.start > 0 && (self.buf.len() - self.start < need || self.end == self.buf.len()) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() < need {
            self.buf.resize(need.max((4 * need).min(INPUT_KEPT)), 0);
        }
    }

    fn has_space(&self) -> bool {
        self.end < self.buf.len()
    }
}

/// What one wait for the socket brought.
enum Event {
    Progress,
    /// Gathering requests in the socket ran out of time.
    Gathered,
    Eof,
    ReadFailed(io::Error),
    WriteFailed(io::Error),
    /// Shutdown, or the session is to end.
    Stop,
    /// No reply bytes could be written for the write deadline.
    Stalled,
}

/// How requests are answered on this connection.
struct Answerer<'a> {
    backing: &'a Backing,
    counters: &'a ExportCounters,
    agreed: &'a Agreed,
    framing: Framing,
    /// Whether reply bytes may come from the device file's pages: only
    /// where the kernel reads them (a plain socket), as a page gone from
    /// under the mapping faults in user space (TLS would encrypt there).
    zero_copy: bool,
    /// Requests taken so far, for the spin policy's trials.
    requests: Cell<u64>,
    /// Their bytes on the wire, for gathering.
    request_bytes: Cell<u64>,
}

pub(crate) async fn transmit<R, W>(
    mut reader: R,
    mut writer: W,
    negotiated: Negotiated,
    write_deadline: Duration,
    zero_copy: bool,
    mut shutdown: watch::Receiver<bool>,
    end: &Notify,
) -> Result<(), Ended>
where
    R: AsyncRead + RecvInto + Unpin,
    W: AsyncWrite + Unpin,
{
    let Negotiated { served, agreed } = negotiated;
    let answerer = Answerer {
        backing: &served.export.backing,
        counters: &served.counters,
        agreed: &agreed,
        framing: Framing::of(&agreed),
        zero_copy,
        requests: Cell::new(0),
        request_bytes: Cell::new(0),
    };
    let header_len = wire::request_header_len(agreed.extended);
    let mut input = Input::new();
    let mut out = Outbox::default();
    let mut stop = pin!(async move {
        let _ = shutdown.wait_for(|s| *s).await;
    });
    let mut ending = pin!(end.notified());
    // Set once no more requests are taken: how the connection ends.
    let mut closing: Option<Result<(), Ended>> = None;
    // The write whose payload is arriving into the file's pages.
    let mut placing: Option<PlacedWrite> = None;
    // After a placed write, the next header is read alone, so that the
    // payload of a next large write is not pulled into the buffer with it.
    let mut header_only = false;
    let mut spin = SpinPolicy::default();
    let mut gather = Gather::default();
    let mut alone = Alone::default();
    // (Where writes cannot go into the file's pages, receiving one header
    // at a time would only add a receive per write.)
    let mut lockstep = Lockstep::new(answerer.places_writes());
    let mut end_asked = Instant::now();
    // Whether the last replies were few bytes.
    let mut small_replies = true;
    // A plain socket's, for system calls made past the runtime.
    let fd = reader.raw_fd();
    loop {
        while closing.is_none() && out.queued() < OUT_HIGH {
            if let Some(p) = &mut placing {
                let pending = input.pending();
                let n = pending.len().min(p.remaining());
                if n > 0 {
                    p.write_buffered(answerer.backing, &pending[..n]);
                    input.consume(n);
                }
                if p.remaining() > 0 {
                    break;
                }
                if let Some(p) = placing.take() {
                    answerer.finish_placed(p, &mut out);
                }
                header_only = true;
                continue;
            }
            let pending = input.pending();
            if pending.len() < header_len {
                input.make_room(header_len);
                break;
            }
            let h = match wire::decode_request(
                &pending[..header_len],
                agreed.extended,
                agreed.max_payload,
            ) {
                Ok(h) => h,
                Err(e) => {
                    closing = Some(Err(protocol_error(format!("malformed request: {e}"))));
                    break;
                }
            };
            let whole = header_len + h.payload_len(agreed.extended) as usize;
            if pending.len() < whole {
                if let Some(p) = answerer.place(&h, whole - header_len, lockstep.on()) {
                    answerer.taking(whole);
                    input.consume(header_len);
                    placing = Some(p);
                    continue;
                }
                input.make_room(whole);
                break;
            }
            header_only = false;
            answerer.taking(whole);
            let disconnect = answerer.answer(&h, &pending[header_len..whole], &mut out);
            input.consume(whole);
            if disconnect {
                closing = Some(Ok(()));
            }
        }
        // A blocking send of large replies would keep the thread from the
        // requests that come meanwhile.
        if out.queued() > 0 {
            small_replies = out.queued() <= alone::REPLIES_MOST;
        }
        if !small_replies {
            alone.leave();
        }
        let write_first = spin.way() != Way::Gather || alone.blocking();
        let held_back = out.queued() >= OUT_HIGH;
        if (out.queued() > 0 || out.unflushed()) && write_first {
            // Replies go out before the wait: the client gets them now, and
            // the wait is for its next requests alone (one per request at
            // QD1, not one to write and one to read). Gathering writes
            // them in the wait, whose read then takes what came meanwhile,
            // unless it did not gather last time and waits alone.
            let io = match fd.filter(|_| alone.blocking()) {
                Some(fd) => write_blocking(fd, &mut out),
                None => {
                    let mut cx = Context::from_waker(Waker::noop());
                    let nothing = &mut Read::Nothing;
                    poll_io(
                        &mut cx,
                        &mut reader,
                        &mut writer,
                        &mut out,
                        &mut input,
                        nothing,
                        answerer.backing,
                    )
                }
            };
            if let Poll::Ready(Event::WriteFailed(e)) = io {
                return Err(write_failed(closing, e));
            }
            // Room for replies again: the requests waiting in the buffer
            // are taken before any wait (which, the buffer full and every
            // reply out, would wait for nothing).
            if held_back && out.queued() < OUT_HIGH {
                continue;
            }
        }
        if closing.is_some() && out.queued() == 0 && !out.unflushed() {
            break;
        }
        lockstep.judge(answerer.requests.get(), input.pending().is_empty());
        let mut read = match &mut placing {
            _ if closing.is_some() => Read::Nothing,
            // (A payload all in is answered above before anything is read.)
            Some(p) if p.direct && p.remaining() > 0 => Read::Placed(p),
            _ if !input.has_space() => Read::Nothing,
            // Up to the end of the next header: in lockstep
            // (`alone::Lockstep`), and after a placed write.
            _ if lockstep.on() && input.pending().is_empty() => Read::Upto(input.end + header_len),
            _ if header_only && !lockstep.probing() && input.pending().len() < header_len => {
                Read::Upto(input.end + header_len - input.pending().len())
            }
            _ => Read::Upto(input.buf.len()),
        };
        let writing = out.queued() > 0;
        // Waiting for the client alone: every reply is out.
        let idle = !writing && !out.unflushed() && matches!(read, Read::Upto(_));
        // One clock read per wait serves the trial and the sleep's start,
        // unless a poll came between them.
        let mut started = Instant::now();
        if spin.served(answerer.requests.get(), started.into_std()) {
            gather.restart();
        }
        // A wait whose bytes are there at once (polling, a blocking
        // receive, a ready socket) does not ask whether the session is to
        // end: a client that always has its next request there would keep
        // it going.
        if closing.is_none() && started >= end_asked + END_ASKED {
            end_asked = started;
            if ready(stop.as_mut()) || ready(ending.as_mut()) {
                closing = Some(Ok(()));
                continue;
            }
        }
        let budget = spin.budget().filter(|_| idle);
        if let (Some(budget), Read::Upto(upto), Some(fd)) = (budget, &read, fd) {
            let polled = spin::poll(fd, &mut input.buf[input.end..*upto], budget).await;
            spin.polled(&polled);
            if let Polled::Bytes(n @ 1..) = polled {
                input.end += n;
                continue;
            }
            started = Instant::now();
        }
        let gathering = match (fd, &read) {
            (Some(fd), Read::Upto(_)) if spin.way() == Way::Gather => {
                let gathering = gather.prepare(fd, idle, answerer.taken());
                if idle && gathering {
                    ExportCounters::add(&answerer.counters.requests().gathered_waits, 1);
                }
                gathering
            }
            (Some(fd), _) => {
                gather.stand_down(fd);
                false
            }
            (None, _) => false,
        };
        // A gathering wait takes the whole batch: one header of it (as in
        // lockstep) would look to the gathering like a batch cut short.
        if let (true, Read::Upto(upto)) = (gathering, &mut read) {
            *upto = input.buf.len();
        }
        // Sleeping, alone on the thread: in a blocking receive.
        match (&mut read, fd) {
            (Read::Upto(upto), Some(fd)) if idle && !gathering && small_replies => {
                let whole = *upto == input.buf.len();
                let space = &mut input.buf[input.end..*upto];
                match alone.recv(fd, space, started.into_std()) {
                    Waited::Bytes(0) => return Err(closed_without_disc()),
                    Waited::Bytes(n) => {
                        lockstep.received(whole, answerer.requests.get());
                        if budget.is_none() && spin.way() == Way::Poll {
                            spin.slept(started.elapsed());
                        }
                        input.end += n;
                        continue;
                    }
                    Waited::Failed(e) => return Err(gone(format!("reading a request: {e}"))),
                    Waited::InRuntime => {}
                }
            }
            // A payload behind its header, there already as a rule: taken
            // without the runtime's wait (and the socket's mode changes).
            (Read::Placed(p), Some(fd)) if alone.blocking() => {
                match p.receive_now(fd, answerer.backing) {
                    Some(Received::Bytes(0)) => return Err(closed_without_disc()),
                    Some(Received::Failed(e)) => {
                        return Err(gone(format!("reading a request: {e}")))
                    }
                    Some(Received::Bytes(_) | Received::Declined) => continue,
                    None => alone.leave(),
                }
            }
            _ => alone.leave(),
        }
        lockstep.end();
        let stalled_at = started + write_deadline;
        let backing = answerer.backing;
        let io = poll_fn(|cx| {
            poll_io(
                cx,
                &mut reader,
                &mut writer,
                &mut out,
                &mut input,
                &mut read,
                backing,
            )
        });
        let event = tokio::select! {
            biased;
            e = io => e,
            _ = &mut stop, if closing.is_none() => Event::Stop,
            _ = &mut ending, if closing.is_none() => Event::Stop,
            _ = tokio::time::sleep_until(stalled_at), if writing => Event::Stalled,
            _ = gather.expired(), if gathering => Event::Gathered,
        };
        // (Only polling asks how long sleeps last: a clock read saved.)
        if idle && budget.is_none() && spin.way() == Way::Poll {
            spin.slept(started.elapsed());
        }
        if gathering {
            gather.woke();
        }
        if matches!(event, Event::Gathered) {
            gather.timer_taken();
        }
        let event = match (event, &read, fd) {
            // The wait ran out: what came is taken as it is.
            (Event::Gathered, Read::Upto(upto), Some(fd)) => {
                match recv_now(fd, &mut input.buf[input.end..*upto]) {
                    Ok(0) => Event::Eof,
                    Ok(n) => {
                        input.end += n;
                        Event::Progress
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Event::Progress,
                    Err(e) => Event::ReadFailed(e),
                }
            }
            (event, ..) => event,
        };
        match event {
            Event::Progress | Event::Gathered => {}
            Event::Stop => closing = Some(Ok(())),
            Event::Eof => return Err(closed_without_disc()),
            Event::ReadFailed(e) => return Err(gone(format!("reading a request: {e}"))),
            Event::WriteFailed(e) => return Err(write_failed(closing, e)),
            Event::Stalled => return Err(stalled(write_deadline)),
        }
    }
    closing.unwrap_or(Ok(()))
}

/// Whether `f` is done, asked without waiting for it.
fn ready(f: Pin<&mut impl Future>) -> bool {
    f.poll(&mut Context::from_waker(Waker::noop())).is_ready()
}

fn closed_without_disc() -> Ended {
    gone("the client closed the connection without NBD_CMD_DISC".into())
}

/// Why a connection whose replies could not be written ended: the
/// protocol error that was closing it, if one was.
fn write_failed(closing: Option<Result<(), Ended>>, e: io::Error) -> Ended {
    match closing {
        Some(Err(why)) => why,
        _ => gone(format!("writing replies: {e}")),
    }
}

/// Writes what it can of `out` to `fd`, a plain socket blocking alone on
/// its thread (`alone::Alone`), straight to the kernel rather than
/// through the runtime's readiness bookkeeping; ready once that made
/// progress. (A blocked send ends within the socket's timeout.)
fn write_blocking(fd: RawFd, out: &mut Outbox<'_>) -> Poll<Event> {
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
fn count_written(out: &mut Outbox<'_>, wrote: Poll<io::Result<usize>>) -> io::Result<bool> {
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
enum Read<'a> {
    Nothing,
    /// Into the input buffer, up to this index of it.
    Upto(usize),
    /// The rest of a write's payload, into the file's pages.
    Placed(&'a mut PlacedWrite),
}

/// Writes what it can of `out`, flushes the stream once all of it is
/// written, and reads what it can as `read` says: ready once any of that
/// made progress.
fn poll_io<R, W>(
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

impl<'a> Answerer<'a> {
    /// A request of `bytes` on the wire is taken.
    fn taking(&self, bytes: usize) {
        self.request_bytes
            .set(self.request_bytes.get() + bytes as u64);
    }

    /// What was taken so far.
    fn taken(&self) -> Taken {
        Taken::new(self.requests.get(), self.request_bytes.get())
    }

    /// Runs request `h` with its `payload` and queues its reply; true for
    /// NBD_CMD_DISC, which has none.
    fn answer(&self, h: &RequestHeader, payload: &[u8], out: &mut Outbox<'a>) -> bool {
        self.requests.set(self.requests.get() + 1);
        let req = Answering {
            cookie: h.cookie,
            offset: h.offset,
        };
        let cmd = match wire::check_request(h, self.agreed) {
            Ok(Command::Disconnect) => return true,
            Ok(cmd) => cmd,
            Err(refused) => {
                ExportCounters::add(&self.counters.requests().errors, 1);
                let outcome = Outcome::Failed {
                    error: refused.error,
                    message: refused.why.to_string(),
                };
                self.queue(req, outcome, out);
                return false;
            }
        };
        let shape = match (self.framing, cmd) {
            (Framing::Simple, _) | (_, Command::Read { df: true, .. }) => ReadShape::Whole,
            _ => ReadShape::Sparse,
        };
        if let Command::Read { offset, len, .. } = cmd {
            let len = len as usize;
            if len > 0 && ops::reads_whole(&**self.backing.device(), len, shape) {
                let outcome = self.read_whole(req, offset, len, out);
                count(self.counters, cmd, &outcome);
                if !matches!(outcome, Outcome::Done) {
                    self.queue(req, outcome, out);
                }
                return false;
            }
        }
        let outcome = run_guarded(self.backing, cmd, payload, shape);
        count(self.counters, cmd, &outcome);
        self.queue(req, outcome, out);
        false
    }

    /// Whether write payloads can be received into the file's pages: a
    /// device with a memory map, on a plain socket.
    fn places_writes(&self) -> bool {
        self.zero_copy && self.backing.device().memory_map().is_some()
    }

    /// A write of `payload_len` bytes, not all of them in the buffer yet,
    /// to receive straight into the file's pages; `None` where it is
    /// refused (answered once its payload is in), too short to gain from
    /// it, or the device or the stream cannot.
    fn place(&self, h: &RequestHeader, payload_len: usize, lockstep: bool) -> Option<PlacedWrite> {
        let least = if lockstep {
            LOCKSTEP_PLACED_MIN
        } else {
            PLACED_WRITE_MIN
        };
        if payload_len < least || !self.places_writes() {
            return None;
        }
        let Ok(Command::Write { offset, len, fua }) = wire::check_request(h, self.agreed) else {
            return None;
        };
        Some(PlacedWrite::new(h.cookie, offset, len as usize, fua))
    }

    /// Answers a placed write whose payload is all in.
    fn finish_placed(&self, p: PlacedWrite, out: &mut Outbox<'a>) {
        self.requests.set(self.requests.get() + 1);
        let req = Answering {
            cookie: p.cookie,
            offset: p.offset,
        };
        let cmd = p.command();
        let outcome = p.finish(self.backing);
        count(self.counters, cmd, &outcome);
        self.queue(req, outcome, out);
    }

    /// Queues the reply of `outcome`; `Done` straight into the scratch
    /// buffer, the rest as the reply module frames it.
    fn queue(&self, req: Answering, outcome: Outcome, out: &mut Outbox<'a>) {
        if let Outcome::Done = outcome {
            let mark = out.mark();
            reply::put_done(self.framing, req, out.scratch());
            out.commit(mark);
            return;
        }
        for part in reply::encode(self.framing, req, outcome) {
            out.push_owned(part);
        }
    }

    /// A read answered as one run of data, from the file's pages where
    /// the device offers them, otherwise read into the scratch buffer.
    /// `Done` once its reply is queued.
    fn read_whole(&self, req: Answering, offset: u64, len: usize, out: &mut Outbox<'a>) -> Outcome {
        let device = self.backing.device();
        // Held like every transport's read (a COMPARE AND WRITE of these
        // bytes cannot interleave with taking them).
        let _held = self.backing.locks.lock(offset, len as u64, false);
        let mark = out.mark();
        let b = out.scratch();
        match self.framing {
            Framing::Simple => wire::put_simple_reply(b, 0, req.cookie),
            f => {
                wire::put_chunk_header(
                    b,
                    f == Framing::Extended,
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_OFFSET_DATA,
                    req.cookie,
                    req.offset,
                    8 + len as u64,
                );
                b.extend_from_slice(&offset.to_be_bytes());
            }
        }
        if self.zero_copy {
            if let Some(bytes) = device.memory_map().and_then(|m| m.lend(offset, len)) {
                out.commit(mark);
                out.push_lent(bytes);
                return Outcome::Done;
            }
            if let Some(bytes) = device.mapped_bytes(offset, len) {
                out.commit(mark);
                out.push_mapped(bytes);
                return Outcome::Done;
            }
        }
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            device.read_at(out.scratch_space(len), offset)
        }));
        match read {
            Ok(Ok(())) => {
                out.commit(mark);
                Outcome::Done
            }
            Ok(Err(e)) => {
                out.undo(mark);
                Outcome::Failed {
                    error: ops::errno(&e),
                    message: e.to_string(),
                }
            }
            Err(_) => {
                out.undo(mark);
                Outcome::Failed {
                    error: EIO,
                    message: "the device call failed".into(),
                }
            }
        }
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
