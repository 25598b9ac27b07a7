//! Letting a client's requests gather in the socket before the connection
//! wakes for them.
//!
//! A client with many requests in flight that is itself the slower side
//! (fio's nbd engine: one libnbd thread at a whole CPU) sends them one at
//! a time, and a connection that answers each as it comes pays a wake-up
//! of its thread for every request: most of the 7-8 µs of CPU it spent per
//! 4K request at QD32 (docs/bench/nbd-history.md). Raising the socket's
//! receive low-water mark (`SO_RCVLOWAT`) to a few requests' bytes keeps
//! the kernel from waking the connection, and the client's `send` from
//! paying for that wake-up, until they are all there; one wake-up, one
//! `recv` and one `writev` then serve the lot.
//!
//! The batch asked for follows the client: it grows by one each time its
//! requests came within [`FILL`] and shrinks by one when they took longer,
//! so no request waits much longer than that for the others. A timer ends
//! a wait after [`BACKSTOP`] whatever came (the client may have fewer in
//! flight than the batch, or have paused). The batch is then capped at what
//! had come, or at half the batch if more (a client that stalled for a
//! moment has not fewer in flight); the cap rises again by one after
//! [`PATIENCE`] batches filled quickly at it, and that patience doubles
//! with each such timeout, so a client that keeps fewer in flight meets
//! the timer ever more rarely. A batch that fills quickly at a raised cap
//! shows the timeouts were stalls (a few a second from fio on a busy
//! machine, which had driven the patience into the thousands): the
//! patience is as at first again, and a client that merely paused soon
//! gathers as before. A batch fallen to one gathers nothing, so waits
//! count toward the patience there. Whether to gather at all is the
//! trial's call (`crate::spin`): it gathers only where that served nearly
//! as many requests as sleeping on each one.
//!
//! A unix socket reports itself readable at its first byte whatever the
//! mark, so there every wait "runs out" at once and the batch falls to
//! one: it sleeps as before.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

use crate::socket::set_socket_option;

/// About the longest a request waits for others to join it.
const FILL: Duration = Duration::from_micros(150);

/// A wait ends after this, however few requests came.
const BACKSTOP: Duration = Duration::from_micros(300);

/// The most requests one wait asks for.
const MOST: u64 = 16;

/// Batches filled quickly at the cap before it rises, after the first
/// timeout.
const PATIENCE: u32 = 16;

/// The low-water mark stays below this: requests this large gain nothing
/// from gathering, and a mark near the socket's buffer could never be met.
const MARK_MAX: u64 = 64 << 10;

/// A connection's gathering: its timer, the batch it asks for and the mark
/// its socket has.
#[derive(Debug)]
pub(crate) struct Gather {
    /// Made on first use.
    timer: Option<AsyncFd<OwnedFd>>,
    armed: bool,
    /// Requests the next wait asks for.
    batch: u64,
    /// The most a wait may ask for now.
    cap: u64,
    /// Batches filled quickly at the cap since it last moved (at a batch
    /// of one, waits), and how many raise it.
    at_cap: u32,
    patience: u32,
    /// The cap rose and no batch has filled at it yet.
    raised: bool,
    /// Bytes of one request, as the last batch averaged them.
    request_bytes: u64,
    /// The low-water mark the socket has now.
    mark: u64,
    /// The last idle wait.
    at_wait: Option<Wait>,
}

/// Requests and their bytes taken by a moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Taken {
    pub requests: u64,
    pub bytes: u64,
}

impl Taken {
    pub fn new(requests: u64, bytes: u64) -> Taken {
        Taken { requests, bytes }
    }
}

/// An idle wait: what was taken when it began, and for one that gathered,
/// when it began and how long its requests took to come.
#[derive(Debug, Clone, Copy)]
struct Wait {
    taken: Taken,
    gathered: Option<Instant>,
    filled: Option<Duration>,
}

impl Default for Gather {
    fn default() -> Gather {
        Gather {
            timer: None,
            armed: false,
            batch: 2,
            cap: MOST,
            at_cap: 0,
            patience: PATIENCE,
            raised: false,
            request_bytes: 0,
            mark: 1,
            at_wait: None,
        }
    }
}

impl Gather {
    /// Starts learning the client over: a trial's gathering half begins.
    pub fn restart(&mut self) {
        self.batch = 2;
        self.cap = MOST;
        self.patience = PATIENCE;
        self.at_wait = None;
    }

    /// Before waiting on the socket `fd` while gathering: `idle` when
    /// every reply is out. Returns whether the wait is to end by the
    /// timer ([`Gather::expired`]) as well: the mark is above one byte.
    /// Any failure of the socket option or the timer turns gathering off
    /// for the wait, which then sleeps as usual.
    pub fn prepare(&mut self, fd: RawFd, idle: bool, taken: Taken) -> bool {
        let ready =
            if idle {
                self.learn(taken);
                let mark = self.mark_wanted();
                self.at_wait = Some(Wait {
                    taken,
                    gathered: (mark > 1).then(Instant::now),
                    filled: None,
                });
                set_mark(fd, &mut self.mark, mark).and_then(|()| {
                    if mark > 1 {
                        self.arm()
                    } else {
                        Ok(())
                    }
                })
            } else if self.mark > 1 && !self.armed {
                // Replies still going out: the mark stays, and so must a timer.
                self.arm()
            } else {
                Ok(())
            };
        if ready.is_err() {
            self.stand_down(fd);
        }
        self.mark > 1
    }

    /// A gathering wait ended: the first end of the last idle one tells
    /// how long its requests took to come.
    pub fn woke(&mut self) {
        if let Some(Wait {
            gathered: Some(began),
            filled: filled @ None,
            ..
        }) = &mut self.at_wait
        {
            *filled = Some(began.elapsed());
        }
    }

    /// Back to waking at the first byte, as a wait that does not gather
    /// needs: its end comes from the socket alone.
    pub fn stand_down(&mut self, fd: RawFd) {
        self.at_wait = None;
        if self.mark > 1 {
            let _ = set_mark(fd, &mut self.mark, 1);
        }
        if self.armed {
            if let Some(timer) = &self.timer {
                let _ = set_timer(timer.get_ref().as_raw_fd(), Duration::ZERO);
            }
            self.armed = false;
        }
    }

    /// Ready when the timer ran out; pending forever if it is not set.
    pub async fn expired(&self) {
        let Some(timer) = self.timer.as_ref().filter(|_| self.armed) else {
            return std::future::pending().await;
        };
        loop {
            let Ok(mut guard) = timer.readable().await else {
                return std::future::pending().await;
            };
            let mut ticks = [0u8; 8];
            // (A timer set again since its readiness came reads nothing:
            // `try_io` then clears the readiness and the wait goes on.)
            if guard
                .try_io(|t| read_now(t.get_ref().as_raw_fd(), &mut ticks))
                .is_ok()
            {
                return;
            }
        }
    }

    /// The timer's expiry was taken.
    pub fn timer_taken(&mut self) {
        self.armed = false;
    }

    /// A wait of the connection ended: whether it was gathering, and
    /// whether the gathering's timer ended it.
    pub fn after_wait(&mut self, gathering: bool, timer_ended_it: bool) {
        if gathering {
            self.woke();
        }
        if timer_ended_it {
            self.timer_taken();
        }
    }

    /// Judges the last gathering wait by the requests taken since it began.
    fn learn(&mut self, now: Taken) {
        let Some(then) = self.at_wait.take() else {
            return;
        };
        let requests = now.requests.saturating_sub(then.taken.requests);
        if let Some(each) = now
            .bytes
            .saturating_sub(then.taken.bytes)
            .checked_div(requests)
        {
            self.request_bytes = each;
        }
        if then.gathered.is_none() {
            if self.batch < 2 {
                self.waited_at_one();
            }
            return;
        }
        if requests == 0 {
            // The client paused: start small when it comes back.
            self.batch = 2.min(self.cap);
        } else if requests < self.batch {
            // Ended by the timer: the client has no more in flight, or
            // stalled for a moment; halving at most tells them apart
            // within a few timeouts.
            self.cap = requests.max(self.batch / 2);
            self.batch = self.cap;
            self.at_cap = 0;
            self.patience = self.patience.saturating_mul(2);
            self.raised = false;
        } else if then.filled.is_some_and(|f| f <= FILL) {
            if self.batch == self.cap {
                if std::mem::take(&mut self.raised) {
                    self.patience = PATIENCE;
                }
                if self.cap < MOST && self.patience_spent() {
                    self.cap += 1;
                    self.raised = true;
                }
            }
            self.batch = (self.batch + 1).min(self.cap);
        } else {
            self.batch = (self.batch - 1).max(1);
        }
    }

    /// A wait at a batch of one, which does not gather, so no batch
    /// filled quickly can raise it: after as many such waits as the cap's
    /// patience, the next wait asks for two again. (Without it a batch
    /// fallen to one, by a timeout or slow fills, stayed there until the
    /// next trial, answering each request as it came.)
    fn waited_at_one(&mut self) {
        if self.patience_spent() {
            self.raised |= self.cap < 2;
            self.cap = self.cap.max(2);
            self.batch = 2;
        }
    }

    /// Counts one more wait at the cap; true when that spends the
    /// patience, and the count starts over.
    fn patience_spent(&mut self) -> bool {
        self.at_cap += 1;
        let spent = self.at_cap >= self.patience;
        if spent {
            self.at_cap = 0;
        }
        spent
    }

    /// The mark for the batch, or one byte where gathering cannot pay.
    fn mark_wanted(&self) -> u64 {
        let batch = match self.request_bytes {
            0 => 1,
            bytes => self.batch.min(MARK_MAX / bytes),
        };
        if batch < 2 {
            1
        } else {
            batch * self.request_bytes
        }
    }

    fn arm(&mut self) -> io::Result<()> {
        if self.timer.is_none() {
            // SAFETY: plain call; the result is checked.
            let fd = unsafe {
                libc::timerfd_create(
                    libc::CLOCK_MONOTONIC,
                    libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `fd` was just created and is owned by nothing else.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: the `OwnedFd` keeps the descriptor open, and the
            // same, for as long as the `AsyncFd` holds it.
            let registered =
                unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) };
            self.timer = Some(registered.map_err(|e| e.into_parts().1)?);
        }
        if let Some(timer) = &self.timer {
            set_timer(timer.get_ref().as_raw_fd(), BACKSTOP)?;
            self.armed = true;
        }
        Ok(())
    }
}

/// Sets the socket's receive low-water mark to `want` bytes, unless it
/// has it (`mark`) already.
fn set_mark(fd: RawFd, mark: &mut u64, want: u64) -> io::Result<()> {
    if *mark == want {
        return Ok(());
    }
    set_socket_option(fd, libc::SO_RCVLOWAT, want as libc::c_int)?;
    *mark = want;
    Ok(())
}

/// Sets a one-shot timer `after` from now; zero disarms it.
fn set_timer(fd: RawFd, after: Duration) -> io::Result<()> {
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: after.as_secs() as libc::time_t,
            tv_nsec: after.subsec_nanos() as libc::c_long,
        },
    };
    // SAFETY: `spec` lives through the call; no old value is asked for.
    if unsafe { libc::timerfd_settime(fd, 0, &spec, std::ptr::null_mut()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One `read` that does not wait, of a descriptor opened non-blocking.
fn read_now(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable memory of `buf.len()` bytes.
    let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(got as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(requests: u64, bytes: u64) -> Taken {
        Taken::new(requests, bytes)
    }

    /// A gather that has seen 28-byte requests come one per wait.
    fn learnt() -> Gather {
        let mut g = Gather {
            at_wait: Some(Wait {
                taken: taken(0, 0),
                gathered: None,
                filled: None,
            }),
            ..Gather::default()
        };
        g.learn(taken(1, 28));
        assert_eq!(g.request_bytes, 28);
        g
    }

    /// The gathering wait that began with `at` took `filled`.
    fn gathered_wait(g: &mut Gather, at: Taken, filled: Duration) {
        g.at_wait = Some(Wait {
            taken: at,
            gathered: Some(Instant::now()),
            filled: Some(filled),
        });
    }

    /// A gathering wait that took `filled` and in which `came` requests
    /// came, learnt from.
    fn one_wait(g: &mut Gather, requests: &mut u64, filled: Duration, came: u64) {
        gathered_wait(g, taken(*requests, *requests * 28), filled);
        *requests += came;
        g.learn(taken(*requests, *requests * 28));
    }

    const QUICKLY: Duration = Duration::from_micros(40);

    #[test]
    fn the_batch_grows_while_it_fills_quickly_and_is_capped_by_the_timer() {
        let mut g = learnt();
        assert_eq!(g.mark_wanted(), 56, "two requests' bytes");
        gathered_wait(&mut g, taken(1, 28), QUICKLY);
        g.learn(taken(3, 84));
        assert_eq!(g.batch, 3);
        gathered_wait(&mut g, taken(3, 84), QUICKLY);
        g.learn(taken(6, 168));
        assert_eq!(g.batch, 4);
        // Only three came before the timer.
        gathered_wait(&mut g, taken(6, 168), BACKSTOP);
        g.learn(taken(9, 252));
        assert_eq!((g.batch, g.cap), (3, 3));
        gathered_wait(&mut g, taken(9, 252), QUICKLY);
        g.learn(taken(12, 336));
        assert_eq!(g.batch, 3, "held at the cap");
        g.restart();
        assert_eq!((g.batch, g.cap), (2, MOST));
    }

    /// Runs waits as the batch asks, each filled quickly (at a batch of
    /// one, a wait that does not gather); returns how many ran before the
    /// batch grew.
    fn quick_waits_until_it_grows(g: &mut Gather, requests: &mut u64) -> u32 {
        let before = g.batch;
        for n in 1..10_000 {
            let at = taken(*requests, *requests * 28);
            if g.batch < 2 {
                g.at_wait = Some(Wait {
                    taken: at,
                    gathered: None,
                    filled: None,
                });
            } else {
                gathered_wait(g, at, QUICKLY);
            }
            *requests += g.batch;
            g.learn(taken(*requests, *requests * 28));
            if g.batch > before {
                return n;
            }
        }
        panic!("the batch never grew past {before}");
    }

    #[test]
    fn the_cap_rises_again_with_a_patience_that_doubles_at_each_timeout() {
        let mut g = learnt();
        let mut requests = 1;
        g.batch = 5;
        // A timeout with three in caps the batch at three; the cap then
        // rises to four, which a client with three in flight cuts short
        // again: twice the patience.
        for patience in [2 * PATIENCE, 4 * PATIENCE] {
            one_wait(&mut g, &mut requests, BACKSTOP, 3);
            assert_eq!((g.batch, g.cap), (3, 3));
            assert_eq!(quick_waits_until_it_grows(&mut g, &mut requests), patience);
        }
    }

    #[test]
    fn a_batch_that_fills_at_a_raised_cap_restores_the_patience() {
        let mut g = learnt();
        let mut requests = 1;
        g.batch = 8;
        // Two stalls in a row, each cutting the batch short.
        for _ in 0..2 {
            one_wait(&mut g, &mut requests, BACKSTOP, 1);
        }
        assert_eq!((g.batch, g.cap, g.patience), (2, 2, 4 * PATIENCE));
        assert_eq!(
            quick_waits_until_it_grows(&mut g, &mut requests),
            4 * PATIENCE
        );
        assert_eq!((g.batch, g.cap), (3, 3));
        // The client had more in flight: filled quickly at the new cap.
        assert_eq!(quick_waits_until_it_grows(&mut g, &mut requests), PATIENCE);
        assert_eq!(g.patience, PATIENCE);
    }

    /// A wait the timer ended, by the batch it asked for and the requests
    /// that came: a pause (none) starts small and keeps the cap; a stall
    /// halves the batch at most; fewer in flight cap it at what came.
    #[test]
    fn a_timeout_sets_the_batch_by_what_came() {
        for (batch, came, after) in [(9, 0, (2, MOST)), (14, 1, (7, 7)), (4, 3, (3, 3))] {
            let mut g = learnt();
            g.batch = batch;
            gathered_wait(&mut g, taken(1, 28), BACKSTOP);
            g.learn(taken(1 + came, 28 * (1 + came)));
            assert_eq!((g.batch, g.cap), after, "batch {batch}, {came} came");
        }
    }

    #[test]
    fn a_batch_slow_to_fill_shrinks() {
        let mut g = learnt();
        g.batch = 8;
        gathered_wait(&mut g, taken(1, 28), FILL * 2);
        g.learn(taken(9, 252));
        assert_eq!((g.batch, g.cap), (7, MOST));
    }

    #[test]
    fn a_client_that_waits_for_each_reply_stops_the_gathering() {
        let mut g = learnt();
        gathered_wait(&mut g, taken(1, 28), BACKSTOP);
        g.learn(taken(2, 56));
        assert_eq!((g.batch, g.cap), (1, 1));
        assert_eq!(g.mark_wanted(), 1);
    }

    #[test]
    fn a_batch_fallen_to_one_tries_two_again_ever_more_rarely() {
        let mut g = learnt();
        let mut requests = 1;
        one_wait(&mut g, &mut requests, BACKSTOP, 1);
        assert_eq!((g.batch, g.cap), (1, 1));
        assert_eq!(
            quick_waits_until_it_grows(&mut g, &mut requests),
            2 * PATIENCE
        );
        assert_eq!((g.batch, g.cap, g.mark_wanted()), (2, 2, 56));
        // One in flight: the timer again, and twice the waits before the
        // next try.
        one_wait(&mut g, &mut requests, BACKSTOP, 1);
        assert_eq!((g.batch, g.cap), (1, 1));
        assert_eq!(
            quick_waits_until_it_grows(&mut g, &mut requests),
            4 * PATIENCE
        );
        // Two after all: it gathers on, as patient as at first.
        one_wait(&mut g, &mut requests, QUICKLY, 2);
        assert_eq!((g.batch, g.patience), (2, PATIENCE));
        // A batch shrunk to one by slow fills tries two as well.
        let mut g = learnt();
        g.batch = 2;
        one_wait(&mut g, &mut requests, FILL * 2, 2);
        assert_eq!((g.batch, g.cap), (1, MOST));
        assert_eq!(quick_waits_until_it_grows(&mut g, &mut requests), PATIENCE);
    }

    #[test]
    fn large_requests_are_not_gathered() {
        let mut g = learnt();
        g.batch = 8;
        g.request_bytes = 40 << 10;
        assert_eq!(g.mark_wanted(), 1);
        g.request_bytes = 4 << 10;
        assert_eq!(g.mark_wanted(), 8 << 12, "eight 4 KiB writes");
        g.batch = MOST;
        assert_eq!(g.mark_wanted(), MARK_MAX, "no more than the mark allows");
    }

    #[test]
    fn the_batch_never_passes_most() {
        let mut g = learnt();
        for i in 0..40 {
            gathered_wait(&mut g, taken(i * MOST, i * MOST * 28), QUICKLY);
            g.learn(taken((i + 1) * MOST, (i + 1) * MOST * 28));
        }
        assert_eq!(g.batch, MOST);
    }

    /// The mark holds the wake-up back until it is met, and the timer ends
    /// a wait it does not meet.
    #[tokio::test]
    async fn a_tcp_socket_wakes_at_the_mark_or_when_the_timer_runs_out() {
        use std::io::Write;
        use tokio::io::{AsyncReadExt, Interest};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let mut server = tokio::net::TcpStream::from_std(server).unwrap();
        let fd = server.as_raw_fd();
        let mut g = learnt();
        let started = Instant::now();
        assert!(g.prepare(fd, true, taken(1, 28)));
        assert_eq!(g.mark, 56);

        client.write_all(&[1; 28]).unwrap();
        tokio::select! {
            _ = server.ready(Interest::READABLE) => panic!("woken below the mark"),
            _ = g.expired() => {}
        }
        assert!(started.elapsed() >= BACKSTOP);
        g.timer_taken();

        // Below the mark the runtime sees no readiness: what came is
        // taken with a `recv` of its own, as the connection does.
        let mut buf = [0u8; 64];
        assert_eq!(crate::socket::recv_now(fd, &mut buf).unwrap(), 28);
        g.restart();
        assert!(g.prepare(fd, true, taken(2, 56)));
        client.write_all(&[2; 56]).unwrap();
        let mut got = 0;
        while got < 56 {
            got += server.read(&mut buf[got..]).await.unwrap();
        }
        g.stand_down(fd);
        assert_eq!(g.mark, 1);
        client.write_all(&[3]).unwrap();
        assert_eq!(server.read(&mut buf).await.unwrap(), 1);
    }
}
