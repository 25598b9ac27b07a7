//! A connection alone on its runtime's thread waits for its client in a
//! blocking `recv`. The thread has nothing else to run, and the runtime's
//! wait costs up to three system calls per request at QD1 (a read that
//! finds nothing, `epoll_wait`, the read) and a task wake-up; the
//! blocking receive costs one. The socket blocks only between such waits: it is
//! non-blocking again before the connection waits in the runtime, so
//! nothing else ever blocks on it. Each blocking wait is bounded, and the
//! runtime gets the thread back at least every [`SLICE`], for a
//! connection placed beside this one, a timer or the end of the session.

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::socket::set_socket_option;

/// The longest a blocking wait lasts, and how long the runtime may be
/// kept from its thread.
pub(crate) const SLICE: Duration = Duration::from_millis(1);

/// Replies up to this many bytes are sent on the blocking socket; more
/// make the connection wait in the runtime, which sends what fits and
/// meanwhile takes the next requests.
pub(crate) const REPLIES_MOST: usize = 64 << 10;

/// How [`Alone::recv`] ended.
#[derive(Debug)]
pub(crate) enum Waited {
    /// This many bytes came (0: the client closed the connection).
    Bytes(usize),
    Failed(io::Error),
    /// The connection is to wait in the runtime.
    InRuntime,
}

#[derive(Default)]
pub(crate) struct Alone {
    /// The socket, while it blocks.
    blocking: Option<RawFd>,
    /// Sockets whose timeouts are set (one per connection).
    timed: Option<RawFd>,
    /// Since when the runtime has not had the thread.
    since: Option<Instant>,
}

impl Alone {
    /// Receives into `buf` from `fd`, waiting up to [`SLICE`], where this
    /// connection is the only task of its runtime and its slice is not
    /// used up; otherwise, or where nothing came, the connection is to
    /// wait in the runtime, and the socket is non-blocking again.
    pub fn recv(&mut self, fd: RawFd, buf: &mut [u8], now: Instant) -> Waited {
        // (Whether another task came is asked as a slice begins: one that
        // comes in its course waits for its end, as it would for a poll.)
        let begins = self.since.is_none();
        let since = *self.since.get_or_insert(now);
        let beside = begins && !alone_on_runtime();
        if beside || now.duration_since(since) >= SLICE || self.block(fd).is_err() {
            self.leave();
            return Waited::InRuntime;
        }
        // SAFETY: `buf` is writable memory of `buf.len()` bytes.
        let got = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if got >= 0 {
            return Waited::Bytes(got as usize);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            // The slice's time ran out with nothing come, or a signal.
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => {
                self.leave();
                Waited::InRuntime
            }
            _ => Waited::Failed(e),
        }
    }

    /// Whether the last wait was a blocking receive.
    pub fn blocking(&self) -> bool {
        self.blocking.is_some()
    }

    /// Makes the socket non-blocking again, before a wait in the runtime.
    pub fn leave(&mut self) {
        self.since = None;
        if let Some(fd) = self.blocking.take() {
            // (Failing, the socket stays blocking, with timeouts: reads and
            // writes through the runtime then last up to SLICE.)
            let _ = set_nonblocking(fd, true);
        }
    }

    fn block(&mut self, fd: RawFd) -> io::Result<()> {
        if self.blocking == Some(fd) {
            return Ok(());
        }
        if self.timed != Some(fd) {
            // A blocked send too gives the thread back (a client that
            // stopped reading is then timed by the runtime).
            set_timeout(fd, libc::SO_RCVTIMEO)?;
            set_timeout(fd, libc::SO_SNDTIMEO)?;
            self.timed = Some(fd);
        }
        set_nonblocking(fd, false)?;
        self.blocking = Some(fd);
        Ok(())
    }
}

impl Drop for Alone {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Whether the calling task is the only one of its runtime.
fn alone_on_runtime() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|h| h.metrics().num_alive_tasks() == 1)
}

fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    let mut value = libc::c_int::from(on);
    // SAFETY: FIONBIO reads one c_int from the pointer given.
    if unsafe { libc::ioctl(fd, libc::FIONBIO, &mut value) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the socket's receive or send timeout (`option`) to [`SLICE`].
fn set_timeout(fd: RawFd, option: libc::c_int) -> io::Result<()> {
    let value = libc::timeval {
        tv_sec: SLICE.as_secs() as libc::time_t,
        tv_usec: SLICE.subsec_micros() as libc::suseconds_t,
    };
    set_socket_option(fd, option, value)
}

/// Writes of at least this many bytes are received into the file's pages
/// when the client sends one request at a time.
pub(crate) const LOCKSTEP_PLACED_MIN: usize = 4096;

/// Header-only receives in lockstep before a whole receive checks again
/// that the client still sends one request at a time.
const LOCKSTEP_RUN: u32 = 64;

/// Whether the client sends one request and waits for its reply before
/// the next (QD1), as the blocking receives see it. A connection in
/// lockstep receives one header at a time, so that a write's payload can
/// go from the socket straight into the file's pages: a second receive in
/// place of `pwrite`, with one copy fewer and none of tmpfs's per-write
/// locking (2-job QD1 4K writes: 1.2 µs less server CPU each, as
/// docs/design.md measures it). A client that sends several requests at
/// once would pay a receive per request instead of one per batch; every
/// [`LOCKSTEP_RUN`] requests a whole receive checks, and one that brings
/// more than one request (or part of one) ends lockstep.
pub(crate) struct Lockstep {
    /// Whether lockstep may begin: writes can go into the file's pages.
    allowed: bool,
    /// Header-only receives left; `Some(0)`: the next is a whole receive.
    left: Option<u32>,
    /// Requests answered before the last whole receive.
    probe: Option<u64>,
}

impl Lockstep {
    pub fn new(allowed: bool) -> Lockstep {
        Lockstep {
            allowed,
            left: None,
            probe: None,
        }
    }

    /// The connection waits in the runtime: lockstep ends.
    pub fn end(&mut self) {
        self.left = None;
        self.probe = None;
    }

    /// Whether the next receive is of one header.
    pub fn on(&self) -> bool {
        self.left.is_some_and(|n| n > 0)
    }

    /// Whether the next receive is a whole one, to check.
    pub fn probing(&self) -> bool {
        self.left == Some(0)
    }

    /// A blocking receive brought bytes: a whole one (up to the buffer's
    /// end) after `requests` requests answered, or one header.
    pub fn received(&mut self, whole: bool, requests: u64) {
        if whole {
            self.probe = Some(requests);
        } else if let Some(n) = &mut self.left {
            *n = n.saturating_sub(1);
        }
    }

    /// Before the next wait, with `requests` answered and whether nothing
    /// received is left over: a whole receive that brought exactly one
    /// request puts the connection in lockstep, any other ends it.
    pub fn judge(&mut self, requests: u64, drained: bool) {
        if let Some(before) = self.probe.take() {
            let one = self.allowed && requests == before + 1 && drained;
            self.left = one.then_some(LOCKSTEP_RUN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn one_request_per_whole_receive_is_lockstep_until_a_check_finds_more() {
        let mut l = Lockstep::new(true);
        assert!(!l.on() && !l.probing(), "a new connection is not");
        l.received(true, 10);
        l.judge(12, true);
        assert!(!l.on(), "two requests came in one receive");
        l.received(true, 12);
        l.judge(12, false);
        assert!(!l.on(), "part of one came");
        l.received(true, 12);
        l.judge(13, true);
        assert!(l.on(), "exactly one came");
        for i in 0..LOCKSTEP_RUN {
            assert!(l.on() && !l.probing(), "header {i}");
            l.received(false, 13 + u64::from(i));
            l.judge(14 + u64::from(i), true);
        }
        assert!(!l.on() && l.probing(), "a whole receive checks");
        l.received(true, 200);
        l.judge(203, true);
        assert!(
            !l.on() && !l.probing(),
            "the client sends several at once now"
        );
        l.received(true, 203);
        l.judge(204, true);
        assert!(l.on());
        l.end();
        assert!(!l.on() && !l.probing(), "a wait in the runtime ends it");

        let mut never = Lockstep::new(false);
        never.received(true, 0);
        never.judge(1, true);
        assert!(!never.on(), "writes cannot go into the file's pages");
    }

    #[test]
    fn alone_it_blocks_for_bytes_and_gives_the_socket_back_non_blocking() {
        let (client, server) = std::os::unix::net::UnixStream::pair().unwrap();
        server.set_nonblocking(true).unwrap();
        let fd = server.as_raw_fd();
        let runtime = current_thread();
        runtime.block_on(async {
            tokio::spawn(async move {
                let mut alone = Alone::default();
                let mut buf = [0u8; 16];
                // A writer thread scheduled late (a loaded machine) misses
                // the slice; then the wait must have lasted it, and the
                // bytes are taken from the runtime's side before a retry.
                let mut client = client;
                let mut tries = 0;
                let _client = loop {
                    tries += 1;
                    let writer = std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_micros(300));
                        client.write_all(b"abc").unwrap();
                        client
                    });
                    let t = Instant::now();
                    let got = alone.recv(fd, &mut buf, Instant::now());
                    let back = writer.join().unwrap();
                    if matches!(got, Waited::Bytes(3)) {
                        assert_eq!(&buf[..3], b"abc");
                        break back;
                    }
                    assert!(matches!(got, Waited::InRuntime), "waited for the bytes");
                    assert!(t.elapsed() >= SLICE, "gave up before its slice");
                    assert!(tries < 50, "the bytes never came within a slice");
                    let mut late = [0u8; 3];
                    (&server).read_exact(&mut late).unwrap();
                    client = back;
                };
                // Nothing more comes: the wait ends within its slice and
                // the socket does not block any more.
                let t = Instant::now();
                let got = alone.recv(fd, &mut buf, Instant::now());
                assert!(matches!(got, Waited::InRuntime));
                assert!(t.elapsed() < 50 * SLICE);
                let e = (&server).read(&mut buf).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
            })
            .await
            .unwrap();
        });
    }

    #[test]
    fn beside_another_task_or_past_its_slice_it_does_not_block() {
        let (_client, server) = std::os::unix::net::UnixStream::pair().unwrap();
        server.set_nonblocking(true).unwrap();
        let fd = server.as_raw_fd();
        let runtime = current_thread();
        runtime.block_on(async {
            let other = tokio::spawn(std::future::pending::<()>());
            let mut buf = [0u8; 4];
            let beside = tokio::spawn(async move {
                let mut alone = Alone::default();
                let got = alone.recv(fd, &mut buf, Instant::now());
                matches!(got, Waited::InRuntime)
            });
            assert!(beside.await.unwrap(), "another task runs here");
            other.abort();
            let _ = other.await;
            let past = tokio::spawn(async move {
                let mut alone = Alone::default();
                let start = Instant::now();
                alone.since = Some(start);
                let got = alone.recv(fd, &mut buf, start + SLICE);
                matches!(got, Waited::InRuntime)
            });
            assert!(past.await.unwrap(), "the slice is used up");
        });
    }
}
