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

use std::future::{poll_fn, Future};
use std::io;
use std::os::fd::RawFd;
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::alone::{self, Alone, Lockstep, Waited};
use crate::exports::ExportCounters;
use crate::gather::Gather;
use crate::handshake::Negotiated;
use crate::outbox::Outbox;
use crate::placed::{PlacedWrite, Received, RecvInto};
use crate::socket::recv_now;
use crate::spin::{self, Polled, SpinPolicy, Way};
use crate::transmission::{gone, protocol_error, stalled, Ended};
use crate::wire::{self};

mod answer;
mod socket_io;
use answer::Answerer;
use socket_io::{poll_io, write_blocking, write_now, Input, Read};

/// Replies waiting beyond this stop the taking of requests until the
/// client reads them.
const OUT_HIGH: usize = 8 << 20;

/// How often a connection whose waits all end at once asks whether its
/// session is to end.
const END_ASKED: Duration = Duration::from_millis(1);

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

/// How a connection paces its waits: spinning, gathering requests in the
/// socket, blocking alone on its thread, taking one header at a time.
struct Pace {
    spin: SpinPolicy,
    gather: Gather,
    alone: Alone,
    lockstep: Lockstep,
}

impl Pace {
    fn new(answerer: &Answerer<'_>) -> Pace {
        Pace {
            spin: SpinPolicy::default(),
            gather: Gather::default(),
            alone: Alone::default(),
            // (Where writes cannot go into the file's pages, receiving one
            // header at a time would only add a receive per write.)
            lockstep: Lockstep::new(answerer.places_writes()),
        }
    }
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
    let answerer = Answerer::new(&served, &agreed, zero_copy);
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
    let mut pace = Pace::new(&answerer);
    let mut end_asked = Instant::now();
    // Whether the last replies were few bytes.
    let mut small_replies = true;
    // A plain socket's, for system calls made past the runtime.
    let fd = reader.raw_fd();
    loop {
        if closing.is_none() {
            closing = take_requests(
                &answerer,
                header_len,
                &mut input,
                &mut out,
                &mut placing,
                &mut header_only,
                &pace.lockstep,
            );
        }
        let backing = answerer.backing;
        let sent = send_first(&mut pace, fd, &mut out, &mut small_replies, |out| {
            write_now(&mut reader, &mut writer, out, &mut input, backing)
        });
        match sent {
            Err(e) => return Err(write_failed(closing, e)),
            Ok(true) => continue,
            Ok(false) => {}
        }
        if closing.is_some() && out.queued() == 0 && !out.unflushed() {
            break;
        }
        pace.lockstep
            .judge(answerer.requests.get(), input.pending().is_empty());
        let mut read = if closing.is_some() {
            Read::Nothing
        } else {
            next_read(
                &mut placing,
                &input,
                &pace.lockstep,
                header_only,
                header_len,
            )
        };
        let writing = out.queued() > 0;
        // Waiting for the client alone: every reply is out.
        let idle = !writing && !out.unflushed() && matches!(read, Read::Upto(_));
        // One clock read per wait serves the trial and the sleep's start,
        // unless a poll came between them.
        let mut started = Instant::now();
        if pace
            .spin
            .served(answerer.requests.get(), started.into_std())
        {
            pace.gather.restart();
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
        let budget = pace.spin.budget().filter(|_| idle);
        match spin_first(&mut pace.spin, budget, &read, fd, &mut input).await {
            Some(true) => continue,
            Some(false) => started = Instant::now(),
            None => {}
        }
        let gathering = prepare_gathering(&mut pace, fd, &mut read, idle, &answerer, &input);
        // Sleeping, alone on the thread: in a blocking receive.
        let alone = AloneWait {
            idle: idle && !gathering && small_replies,
            started,
            polled: budget.is_some(),
        };
        if let Then::Again = wait_alone(&mut pace, &mut read, fd, &mut input, alone, &answerer)? {
            continue;
        }
        pace.lockstep.end();
        let stalled_at = started + write_deadline;
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
            _ = pace.gather.expired(), if gathering => Event::Gathered,
        };
        // (Only polling asks how long sleeps last: a clock read saved.)
        if idle && budget.is_none() && pace.spin.way() == Way::Poll {
            pace.spin.slept(started.elapsed());
        }
        pace.gather
            .after_wait(gathering, matches!(event, Event::Gathered));
        let event = take_gathered(event, &read, fd, &mut input);
        settle(event, &mut closing, write_deadline)?;
    }
    closing.unwrap_or(Ok(()))
}

/// Takes the complete requests in `input`, and the payload of a write
/// arriving into the file's pages, while the replies have room; why the
/// connection is to close, once it is.
fn take_requests<'a>(
    answerer: &Answerer<'a>,
    header_len: usize,
    input: &mut Input,
    out: &mut Outbox<'a>,
    placing: &mut Option<PlacedWrite>,
    header_only: &mut bool,
    lockstep: &Lockstep,
) -> Option<Result<(), Ended>> {
    while out.queued() < OUT_HIGH {
        if let Some(p) = placing {
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
                answerer.finish_placed(p, out);
            }
            *header_only = true;
            continue;
        }
        let pending = input.pending();
        if pending.len() < header_len {
            input.make_room(header_len);
            break;
        }
        let h = match wire::decode_request(
            &pending[..header_len],
            answerer.agreed.extended,
            answerer.agreed.max_payload,
        ) {
            Ok(h) => h,
            Err(e) => {
                return Some(Err(protocol_error(format!("malformed request: {e}"))));
            }
        };
        let whole = header_len + h.payload_len(answerer.agreed.extended) as usize;
        if pending.len() < whole {
            if let Some(p) = answerer.place(&h, whole - header_len, lockstep.on()) {
                answerer.taking(whole);
                input.consume(header_len);
                *placing = Some(p);
                continue;
            }
            input.make_room(whole);
            break;
        }
        *header_only = false;
        answerer.taking(whole);
        let disconnect = answerer.answer(&h, &pending[header_len..whole], out);
        input.consume(whole);
        if disconnect {
            return Some(Ok(()));
        }
    }
    None
}

/// What the next wait reads: the rest of a payload into the file's
/// pages, or into the input buffer up to where it should stop.
fn next_read<'p>(
    placing: &'p mut Option<PlacedWrite>,
    input: &Input,
    lockstep: &Lockstep,
    header_only: bool,
    header_len: usize,
) -> Read<'p> {
    match placing {
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
    }
}

/// A gathering wait that ran out takes what came as it is.
fn take_gathered(event: Event, read: &Read<'_>, fd: Option<RawFd>, input: &mut Input) -> Event {
    match (event, read, fd) {
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
    }
}

/// What a wait's event means for the connection: go on, close once the
/// replies are out, or end now and why.
fn settle(
    event: Event,
    closing: &mut Option<Result<(), Ended>>,
    write_deadline: Duration,
) -> Result<(), Ended> {
    match event {
        Event::Progress | Event::Gathered => Ok(()),
        Event::Stop => {
            *closing = Some(Ok(()));
            Ok(())
        }
        Event::Eof => Err(closed_without_disc()),
        Event::ReadFailed(e) => Err(gone(format!("reading a request: {e}"))),
        Event::WriteFailed(e) => Err(write_failed(closing.take(), e)),
        Event::Stalled => Err(stalled(write_deadline)),
    }
}

/// Whether the next wait gathers requests in the socket (and, if it
/// does, it takes the whole batch: one header of it, as in lockstep,
/// would look to the gathering like a batch cut short).
fn prepare_gathering(
    pace: &mut Pace,
    fd: Option<RawFd>,
    read: &mut Read<'_>,
    idle: bool,
    answerer: &Answerer<'_>,
    input: &Input,
) -> bool {
    let gathering = match (fd, &*read) {
        (Some(fd), Read::Upto(_)) if pace.spin.way() == Way::Gather => {
            let gathering = pace.gather.prepare(fd, idle, answerer.taken());
            if idle && gathering {
                ExportCounters::add(&answerer.counters.requests().gathered_waits, 1);
            }
            gathering
        }
        (Some(fd), _) => {
            pace.gather.stand_down(fd);
            false
        }
        (None, _) => false,
    };
    if let (true, Read::Upto(upto)) = (gathering, read) {
        *upto = input.buf.len();
    }
    gathering
}

/// A wait that may block alone on the thread, outside the runtime.
#[derive(Clone, Copy)]
struct AloneWait {
    /// Waiting for the client alone (every reply out, not gathering,
    /// small replies): a blocking receive.
    idle: bool,
    started: Instant,
    /// The wait began with a spin, which timed it already.
    polled: bool,
}

/// What is left after a wait outside the runtime.
enum Then {
    /// It brought bytes: take them.
    Again,
    /// Wait in the runtime.
    Wait,
}

/// Receives outside the runtime where the thread may block alone: the
/// next requests of an idle connection, or a payload behind its header.
fn wait_alone(
    pace: &mut Pace,
    read: &mut Read<'_>,
    fd: Option<RawFd>,
    input: &mut Input,
    wait: AloneWait,
    answerer: &Answerer<'_>,
) -> Result<Then, Ended> {
    match (read, fd) {
        (Read::Upto(upto), Some(fd)) if wait.idle => {
            let whole = *upto == input.buf.len();
            let space = &mut input.buf[input.end..*upto];
            match pace.alone.recv(fd, space, wait.started.into_std()) {
                Waited::Bytes(0) => return Err(closed_without_disc()),
                Waited::Bytes(n) => {
                    pace.lockstep.received(whole, answerer.requests.get());
                    if !wait.polled && pace.spin.way() == Way::Poll {
                        pace.spin.slept(wait.started.elapsed());
                    }
                    input.end += n;
                    return Ok(Then::Again);
                }
                Waited::Failed(e) => return Err(gone(format!("reading a request: {e}"))),
                Waited::InRuntime => {}
            }
        }
        // A payload behind its header, there already as a rule: taken
        // without the runtime's wait (and the socket's mode changes).
        (Read::Placed(p), Some(fd)) if pace.alone.blocking() => {
            match p.receive_now(fd, answerer.backing) {
                Some(Received::Bytes(0)) => return Err(closed_without_disc()),
                Some(Received::Failed(e)) => return Err(gone(format!("reading a request: {e}"))),
                Some(Received::Bytes(_) | Received::Declined) => return Ok(Then::Again),
                None => pace.alone.leave(),
            }
        }
        _ => pace.alone.leave(),
    }
    Ok(Then::Wait)
}

/// Sends the replies before the wait, where that is the way: the client
/// gets them now, and the wait is for its next requests alone (one per
/// request at QD1, not one to write and one to read). Gathering writes
/// them in the wait, whose read then takes what came meanwhile, unless it
/// did not gather last time and waits alone. True when requests wait in
/// the buffer to be taken before any wait.
fn send_first<'a>(
    pace: &mut Pace,
    fd: Option<RawFd>,
    out: &mut Outbox<'a>,
    small_replies: &mut bool,
    write_now: impl FnOnce(&mut Outbox<'a>) -> Poll<Event>,
) -> io::Result<bool> {
    // A blocking send of large replies would keep the thread from the
    // requests that come meanwhile.
    if out.queued() > 0 {
        *small_replies = out.queued() <= alone::REPLIES_MOST;
    }
    if !*small_replies {
        pace.alone.leave();
    }
    let write_first = pace.spin.way() != Way::Gather || pace.alone.blocking();
    if !(out.queued() > 0 || out.unflushed()) || !write_first {
        return Ok(false);
    }
    let held_back = out.queued() >= OUT_HIGH;
    let io = match fd.filter(|_| pace.alone.blocking()) {
        Some(fd) => write_blocking(fd, out),
        None => write_now(out),
    };
    if let Poll::Ready(Event::WriteFailed(e)) = io {
        return Err(e);
    }
    // Room for replies again: the requests waiting in the buffer are
    // taken before any wait (which, the buffer full and every reply out,
    // would wait for nothing).
    Ok(held_back && out.queued() < OUT_HIGH)
}

/// Polls the socket for a while before sleeping, where the spin policy
/// gives a budget: none when it did not, else whether bytes came.
async fn spin_first(
    spin: &mut SpinPolicy,
    budget: Option<Duration>,
    read: &Read<'_>,
    fd: Option<RawFd>,
    input: &mut Input,
) -> Option<bool> {
    let (Some(budget), Read::Upto(upto), Some(fd)) = (budget, read, fd) else {
        return None;
    };
    let polled = spin::poll(fd, &mut input.buf[input.end..*upto], budget).await;
    spin.polled(&polled);
    if let Polled::Bytes(n @ 1..) = polled {
        input.end += n;
        return Some(true);
    }
    Some(false)
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
