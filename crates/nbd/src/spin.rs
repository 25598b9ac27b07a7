//! Whether a connection polls its socket for a moment before it sleeps on
//! it, and the polling itself.
//!
//! A client that waits for each reply before it sends its next request
//! (queue depth 1) pays, on every request, for the server's thread being
//! woken from sleep. Where an idle CPU halts, as the vCPUs of a virtual
//! machine do, that is most of the request's time: fio's nbd engine at QD1
//! did 17K 4K reads a second against a sleeping server, and 56K with
//! server and client on one CPU, where nobody sleeps
//! (docs/bench/nbd-history.md). So while requests follow each other
//! quickly, the connection polls for up to [`SPIN`] before it sleeps, as
//! the iSCSI reader does.
//!
//! Polling must not take a CPU that someone else wants: two clients and
//! two polling connections on two CPUs would each wait for the other's
//! poll to end. Each try gives the CPU away (`sched_yield`), and a try
//! that took long says something else ran: the CPU is wanted, and the
//! connection sleeps for the next [`BACKOFF`] waits.
//!
//! Nor does polling pay wherever requests come quickly: a client with
//! many requests in flight sends them as fast as it can whether or not
//! the server sleeps, and there polling only burns the CPU (fio at QD32
//! did 5-10 % fewer I/Os against a polling server). What tells the two
//! apart is the outcome, so the connection measures it: every
//! [`HOLD`] it serves for a [`TRIAL`] sleeping, one polling and one
//! letting requests gather in the socket ([`crate::gather`]), and until
//! the next trial it polls where polling served at least [`PAYS`] times
//! the requests of either other way, or [`LEANS`] times on the average of
//! the trials so far (two clients on two busy CPUs gained 8-27 % from
//! polling, less than one 20 ms trial can tell from noise, but they gain
//! it trial after trial), or else gathers where gathering
//! served at least [`GATHER_KEEPS`] times what sleeping did, in this trial
//! or the one before: it costs the server far less CPU per request, and
//! the client no more. A new connection's first trials come sooner
//! ([`FIRST_HOLD`], twice as long each time up to [`HOLD`]): a trial as
//! a client starts up can misjudge it (one at fio's start found sleeping
//! as fast as polling, and the second after it served at half the
//! rate of the next trials, which polled).

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::socket::recv_now;

/// How long a connection polls before it sleeps: several times what a
/// client takes to turn a reply into its next request.
pub(crate) const SPIN: Duration = Duration::from_micros(100);

/// A wait shorter than this suggests polling would have caught the next
/// request.
const QUICK_TURNAROUND: Duration = Duration::from_micros(100);

/// A `sched_yield` longer than this ran another thread on our CPU.
const CONTENDED: Duration = Duration::from_micros(20);

/// Waits to sleep through after the CPU was found wanted.
const BACKOFF: u32 = 16;

/// Trials are this far apart.
const HOLD: Duration = Duration::from_secs(1);

/// How long the first trial's choice holds; each next one holds twice
/// as long, up to [`HOLD`].
const FIRST_HOLD: Duration = Duration::from_millis(125);

/// How long each half of a trial lasts.
const TRIAL: Duration = Duration::from_millis(20);

/// Polling is kept where it served this many times the requests that
/// sleeping or gathering did.
const PAYS: f64 = 1.25;

/// Polling is kept where it served this many times the requests of the
/// better other way on the running average of the trials (each trial
/// weighs half of it): steady gains too small for one trial to show.
/// Where polling costs the client (a client with many requests in flight,
/// 5-10 % fewer of them), the average stays below one.
const LEANS: f64 = 1.06;

/// Gathering is kept where it served this share of the requests that
/// sleeping did, or more: 20 ms of a client's requests vary by nearly as
/// much, and gathering costs the server a fraction of the CPU.
const GATHER_KEEPS: f64 = 0.85;

/// How a connection waits for its client between trials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    Sleep,
    Poll,
    Gather,
}

/// What a connection has learnt of its client's pace and its CPU.
#[derive(Debug)]
pub(crate) struct SpinPolicy {
    /// The last wait ended soon: a poll caught bytes, or a sleep was
    /// shorter than [`QUICK_TURNAROUND`].
    quick: bool,
    /// Waits left to sleep through before polling again.
    backoff: u32,
    /// What the last trial found.
    chosen: Way,
    /// Whether gathering served enough in the last trial: one trial that
    /// finds it short (a hiccup of the client in 20 ms) does not end it.
    gathering_held: bool,
    /// Polling's requests against the better other way's, averaged over
    /// the trials so far.
    polling_gain: Option<f64>,
    phase: Phase,
    /// How long the choice of the trial before holds.
    hold: Duration,
    /// When the phase began, and the requests served by then.
    phase_start: Instant,
    requests_at_start: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Polling as the last trial found, until the next.
    Hold,
    /// The first part of a trial.
    Sleeping,
    /// The second part, with the requests a second the first served.
    Polling { sleeping_rate: f64 },
    /// The third, with the requests a second of the first two.
    Gathering {
        sleeping_rate: f64,
        polling_rate: f64,
    },
}

impl Default for SpinPolicy {
    fn default() -> SpinPolicy {
        SpinPolicy {
            quick: false,
            backoff: 0,
            chosen: Way::Sleep,
            gathering_held: false,
            polling_gain: None,
            phase: Phase::Sleeping,
            hold: FIRST_HOLD,
            phase_start: Instant::now(),
            requests_at_start: 0,
        }
    }
}

/// How one poll ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Polled {
    /// This many bytes came (0: the client closed the connection).
    Bytes(usize),
    /// Nothing came within the budget.
    Nothing,
    /// Another thread wanted the CPU.
    Contended,
    /// The socket failed; the sleeping read that follows reports it.
    Failed,
}

impl SpinPolicy {
    /// How long to poll before sleeping; `None`: sleep at once.
    pub fn budget(&self) -> Option<Duration> {
        (self.way() == Way::Poll && self.quick && self.backoff == 0).then_some(SPIN)
    }

    /// The way of waiting now: the trial's, or the one it tries.
    pub fn way(&self) -> Way {
        match self.phase {
            Phase::Hold => self.chosen,
            Phase::Sleeping => Way::Sleep,
            Phase::Polling { .. } => Way::Poll,
            Phase::Gathering { .. } => Way::Gather,
        }
    }

    /// Before a wait: `requests` served on the connection so far, at
    /// `now`. Moves the trial on; true when its gathering part begins.
    pub fn served(&mut self, requests: u64, now: Instant) -> bool {
        let took = now.saturating_duration_since(self.phase_start);
        let rate = || (requests - self.requests_at_start) as f64 / took.as_secs_f64();
        let next = match self.phase {
            Phase::Hold if took >= self.hold => {
                self.hold = (2 * self.hold).min(HOLD);
                Phase::Sleeping
            }
            Phase::Sleeping if took >= TRIAL => Phase::Polling {
                sleeping_rate: rate(),
            },
            Phase::Polling { sleeping_rate } if took >= TRIAL => Phase::Gathering {
                sleeping_rate,
                polling_rate: rate(),
            },
            Phase::Gathering {
                sleeping_rate,
                polling_rate,
            } if took >= TRIAL => {
                let gathering_rate = rate();
                let holds = gathering_rate > 0.0 && gathering_rate >= GATHER_KEEPS * sleeping_rate;
                let rates = Rates {
                    sleeping: sleeping_rate,
                    polling: polling_rate,
                    gathering: gathering_rate,
                };
                if let Some(gain) = rates.polling_gain() {
                    let average = self
                        .polling_gain
                        .map_or(gain, |before| (before + gain) / 2.0);
                    self.polling_gain = Some(average);
                }
                self.chosen = choose(rates, self.polling_gain, holds || self.gathering_held);
                self.gathering_held = holds;
                Phase::Hold
            }
            _ => return false,
        };
        self.phase = next;
        self.phase_start = now;
        self.requests_at_start = requests;
        matches!(next, Phase::Gathering { .. })
    }

    /// A poll ended.
    pub fn polled(&mut self, how: &Polled) {
        self.quick = matches!(how, Polled::Bytes(_));
        if *how == Polled::Contended {
            self.backoff = BACKOFF;
        }
    }

    /// The connection slept for `slept` (without polling first).
    pub fn slept(&mut self, slept: Duration) {
        self.quick = slept < QUICK_TURNAROUND;
        self.backoff = self.backoff.saturating_sub(1);
    }
}

/// Requests a second served each way in one trial.
#[derive(Debug, Clone, Copy)]
struct Rates {
    sleeping: f64,
    polling: f64,
    gathering: f64,
}

impl Rates {
    /// Polling's requests against the better other way's; `None` where
    /// either served none (an idle client tells nothing).
    fn polling_gain(&self) -> Option<f64> {
        let other = self.sleeping.max(self.gathering);
        (self.polling > 0.0 && other > 0.0).then(|| self.polling / other)
    }
}

/// The way that served best, from one trial's rates, polling's average
/// gain over the trials and whether gathering held up in this trial or
/// the one before.
fn choose(rates: Rates, average_gain: Option<f64>, gathering_holds: bool) -> Way {
    let Rates {
        sleeping,
        polling,
        gathering,
    } = rates;
    let pays_now = polling > 0.0 && polling >= PAYS * sleeping.max(gathering);
    if pays_now || average_gain.is_some_and(|g| g >= LEANS) {
        Way::Poll
    } else if gathering_holds {
        Way::Gather
    } else {
        Way::Sleep
    }
}

/// Receives from `fd` into `buf` without sleeping on it, until `budget`
/// has passed, giving the CPU away between tries and the runtime's other
/// tasks their turn.
pub(crate) async fn poll(fd: RawFd, buf: &mut [u8], budget: Duration) -> Polled {
    let until = Instant::now() + budget;
    let mut contended = false;
    loop {
        match recv_now(fd, buf) {
            Ok(got) => return Polled::Bytes(got),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return Polled::Failed,
        }
        // (Tried once more after the other thread ran: it may have been
        // the client, sending.)
        if contended {
            return Polled::Contended;
        }
        let before = Instant::now();
        if before >= until {
            return Polled::Nothing;
        }
        std::thread::yield_now();
        contended = before.elapsed() > CONTENDED;
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_connection_sleeps_first() {
        assert_eq!(SpinPolicy::default().budget(), None);
    }

    /// A policy whose trial found that polling pays.
    fn polling_pays() -> SpinPolicy {
        let mut p = SpinPolicy::default();
        let t = p.phase_start;
        p.served(100, t + TRIAL);
        assert!(p.served(400, t + 2 * TRIAL), "the gathering part begins");
        p.served(450, t + 3 * TRIAL);
        assert_eq!(p.way(), Way::Poll);
        p
    }

    #[test]
    fn a_trial_keeps_polling_only_where_it_serves_more() {
        let mut p = SpinPolicy::default();
        p.slept(Duration::from_micros(30));
        assert_eq!(p.budget(), None, "the trial sleeps first");
        let t = p.phase_start;
        p.served(100, t + TRIAL);
        assert_eq!(p.budget(), Some(SPIN), "then polls");
        p.served(200, t + 2 * TRIAL);
        assert_eq!((p.budget(), p.way()), (None, Way::Gather), "then gathers");
        p.served(280, t + 3 * TRIAL);
        assert_eq!(p.way(), Way::Sleep, "gathering served 20 % less");
        p.served(5000, t + 3 * TRIAL + FIRST_HOLD / 2);
        assert_eq!(p.way(), Way::Sleep, "held until the next trial");
        let t = t + FIRST_HOLD;
        p.served(5000, t + 3 * TRIAL);
        p.served(5100, t + 4 * TRIAL);
        p.served(5300, t + 5 * TRIAL);
        p.served(5400, t + 6 * TRIAL);
        assert_eq!(p.budget(), Some(SPIN), "twice the requests");
        p.served(9000, t + 6 * TRIAL + FIRST_HOLD + FIRST_HOLD / 2);
        assert_eq!(p.budget(), Some(SPIN), "held twice as long");
    }

    #[test]
    fn trials_come_sooner_while_the_connection_is_new() {
        let mut p = SpinPolicy::default();
        let mut t = p.phase_start;
        let mut holds = Vec::new();
        for _ in 0..6 {
            p.served(0, t + TRIAL);
            p.served(0, t + 2 * TRIAL);
            p.served(0, t + 3 * TRIAL);
            t += 3 * TRIAL;
            // The hold ends on the first wait past it: found in steps of
            // a millisecond.
            let mut held = Duration::ZERO;
            while !matches!(p.phase, Phase::Sleeping) {
                held += Duration::from_millis(1);
                p.served(0, t + held);
            }
            holds.push(held);
            t += held;
        }
        let ms = |n| Duration::from_millis(n);
        assert_eq!(
            holds,
            [ms(125), ms(250), ms(500), ms(1000), ms(1000), ms(1000)]
        );
    }

    /// Runs one whole trial from `requests` at `t` with these counts in
    /// each part; returns the requests and time at its end.
    fn trial(p: &mut SpinPolicy, t: Instant, requests: u64, parts: [u64; 3]) -> (u64, Instant) {
        p.served(requests, t);
        let mut r = requests;
        for (i, n) in parts.iter().enumerate() {
            r += n;
            p.served(r, t + (i as u32 + 1) * TRIAL);
        }
        (r, t + 3 * TRIAL + HOLD)
    }

    #[test]
    fn gathering_is_kept_where_it_serves_nearly_as_many_as_sleeping() {
        let mut p = SpinPolicy::default();
        let t = p.phase_start;
        let (r, t) = trial(&mut p, t, 0, [1000, 900, 860]);
        assert_eq!(p.way(), Way::Gather);
        // One trial that finds it short does not end it; two do.
        let (r, t) = trial(&mut p, t, r, [1000, 900, 700]);
        assert_eq!(p.way(), Way::Gather);
        let (r, t) = trial(&mut p, t, r, [1000, 900, 700]);
        assert_eq!(p.way(), Way::Sleep);
        // Polling that serves 25 % more than either wins.
        trial(&mut p, t, r, [1000, 1300, 1000]);
        assert_eq!(p.way(), Way::Poll);
        let rates = Rates {
            sleeping: 1000.0,
            polling: 1300.0,
            gathering: 1100.0,
        };
        assert_eq!(choose(rates, Some(1.0), true), Way::Gather);
    }

    #[test]
    fn a_small_steady_gain_polls_once_the_average_shows_it() {
        let mut p = SpinPolicy::default();
        let t = p.phase_start;
        // 10 % more each time: not enough for one trial, enough on average
        // of steady ones.
        let (r, t) = trial(&mut p, t, 0, [1000, 1100, 700]);
        assert_eq!(p.way(), Way::Poll);
        // A trial that finds polling worse halves the average down.
        let (r, t) = trial(&mut p, t, r, [1000, 900, 700]);
        assert_eq!(p.way(), Way::Sleep, "average (1.10 + 0.90) / 2");
        trial(&mut p, t, r, [1000, 1150, 700]);
        assert_eq!(p.way(), Way::Poll, "average (1.00 + 1.15) / 2");
    }

    #[test]
    fn a_client_that_loses_by_polling_is_not_polled_by_noise() {
        let mut p = SpinPolicy::default();
        let (mut r, mut t) = (0, p.phase_start);
        for polled in [950, 1040, 920, 1050, 970, 1030] {
            (r, t) = trial(&mut p, t, r, [1000, polled, 700]);
            assert_eq!(p.way(), Way::Sleep, "polled {polled}");
        }
    }

    #[test]
    fn an_idle_connection_never_polls_or_gathers() {
        let mut p = SpinPolicy::default();
        let t = p.phase_start;
        p.served(0, t + TRIAL);
        p.served(0, t + 2 * TRIAL);
        p.served(0, t + 3 * TRIAL);
        assert_eq!(p.way(), Way::Sleep);
    }

    #[test]
    fn quick_turnarounds_poll_and_slow_ones_sleep() {
        let mut p = polling_pays();
        p.slept(Duration::from_micros(30));
        assert_eq!(p.budget(), Some(SPIN));
        p.polled(&Polled::Bytes(28));
        assert_eq!(p.budget(), Some(SPIN), "caught: poll again");
        p.polled(&Polled::Nothing);
        assert_eq!(p.budget(), None, "a vain poll");
        p.slept(Duration::from_millis(5));
        assert_eq!(p.budget(), None, "a long sleep");
    }

    #[test]
    fn a_wanted_cpu_stops_polling_for_a_while() {
        let mut p = polling_pays();
        p.slept(Duration::from_micros(30));
        p.polled(&Polled::Contended);
        for _ in 0..BACKOFF {
            assert_eq!(p.budget(), None);
            p.slept(Duration::from_micros(30));
        }
        assert_eq!(p.budget(), Some(SPIN));
    }

    #[tokio::test]
    async fn a_poll_catches_bytes_and_gives_up_on_silence() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut buf = [0u8; 16];
        let fd = b.as_raw_fd();
        let started = Instant::now();
        let how = poll(fd, &mut buf, Duration::from_micros(300)).await;
        assert!(
            matches!(how, Polled::Nothing | Polled::Contended),
            "{how:?}"
        );
        assert!(started.elapsed() >= Duration::from_micros(300) || how == Polled::Contended);
        a.write_all(b"hello").unwrap();
        assert_eq!(poll(fd, &mut buf, SPIN).await, Polled::Bytes(5));
        assert_eq!(&buf[..5], b"hello");
        drop(a);
        assert_eq!(poll(fd, &mut buf, SPIN).await, Polled::Bytes(0));
    }
}
