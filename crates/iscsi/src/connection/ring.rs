//! READs of O_DIRECT files run on an io_uring of the connection's own
//! thread ([`ScsiTarget::start_read`]): the thread that decoded a burst of
//! commands puts all their reads in flight with one system call, and the
//! ring's eventfd wakes that thread's reactor when they end. No other
//! thread is woken on the way: those wake-ups were what a read cost most
//! on the I/O pool (docs/bench/techniques.md, section 19).
//!
//! One ring per thread that runs connections, made on first use; a
//! command the ring cannot take (no io_uring here, a range another
//! command holds) goes to the I/O pool as before.
//!
//! Once a wave of reads is on the device, up to a wave more wait in the
//! ring and go with the next completion. A device that answers
//! everything it holds in one batch (a virtio disk on this kind of machine
//! does) would otherwise sit idle while the initiator turns the whole
//! batch around; with a second batch ready it works through that
//! turnaround. A device that answers reads one by one gets the waiting
//! ones with its next answer (docs/bench/techniques.md, section 20).
//! A wave is half the reads the initiators keep going, as the ring has
//! lately seen them, and at most [`WAVE`]: at depth 16 two waves of 8
//! take turns on the device instead of one batch of 16 that the device
//! and the initiator each wait for (section 48).
//!
//! A submit the kernel refuses for now (EAGAIN, EBUSY) leaves its entries
//! queued. When nothing the ring holds is sure to complete and bring the
//! next submit, a timer tries again, backing off, so those reads never
//! wait for the initiator's next command.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};
use parking_lot::Mutex;
use scsi_api::{ReadStart, StartedRead};
use tokio::io::unix::AsyncFd;

use super::exec::{Command, Deliveries};
use super::pool::Job as _;

/// Submission queue entries; a longer burst is submitted in several goes.
/// Completions beyond the completion queue wait in the kernel's overflow
/// list (IORING_FEAT_NODROP), so reads in flight are not bounded by it.
const ENTRIES: u32 = 256;

/// The largest wave: reads on the device beyond which the next ones wait
/// for a batch to come back, as long as fewer than a wave wait.
const WAVE: usize = 16;

/// Completed batches over which the ring keeps the most reads it held;
/// the wave follows the larger of this span's peak and the last one's.
const PEAK_SPAN: u32 = 64;

/// The first and the longest wait before a refused submit is tried again.
const RETRY_FIRST: Duration = Duration::from_millis(1);
const RETRY_MAX: Duration = Duration::from_millis(100);

/// Whether the first waiting read goes to the device now.
fn admits(on_device: usize, waiting: usize, wave: usize) -> bool {
    on_device < wave || waiting > wave
}

/// The most reads the ring held lately, on the device and waiting: what
/// the initiators keep going, since they send a read again soon after
/// its answer.
#[derive(Default)]
struct Peak {
    span: usize,
    last_span: usize,
    batches: u32,
}

impl Peak {
    fn saw(&mut self, held: usize) {
        self.span = self.span.max(held);
    }

    /// A batch came back; `held` reads are still in the ring.
    fn batch(&mut self, held: usize) {
        self.batches += 1;
        if self.batches == PEAK_SPAN {
            self.batches = 0;
            self.last_span = std::mem::replace(&mut self.span, held);
        }
    }

    /// Half of what is kept going, so that two waves take turns.
    fn wave(&self) -> usize {
        (self.span.max(self.last_span) / 2).clamp(1, WAVE)
    }
}

thread_local! {
    static RING: RefCell<Option<Arc<ReadRing>>> = const { RefCell::new(None) };
}

/// Start the READs among `commands` on this thread's ring, answer those
/// that need no device, and return the rest for the I/O pool.
pub(super) fn start(commands: impl Iterator<Item = Command>) -> Vec<Command> {
    let Some(ring) = ReadRing::current() else {
        return commands.collect();
    };
    // Reads that ended since the reaping task last ran, taken now: the
    // reads waiting for them go to the device with this burst's submit
    // rather than once this thread gets round to that task, which comes
    // after the whole burst is decoded (docs/bench/techniques.md, 42).
    let ended = ring.take_ended();
    let mut declined = Vec::new();
    let mut answered = Deliveries::default();
    for command in commands {
        let started = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let parts = command.job.parts();
            let cmd = command.job.command(&parts);
            command.conn.scsi.start_read(&command.conn.nexus, &cmd)
        }));
        match started {
            Ok(ReadStart::Declined) => declined.push(command),
            Ok(ReadStart::Answered(response)) => command.deliver(Some(response), &mut answered),
            Ok(ReadStart::Started(read)) => ring.push(command, read),
            Err(_) => {
                tracing::error!(
                    tag = command.job.tag,
                    "starting a READ panicked in the target"
                );
                command.deliver(None, &mut answered);
            }
        }
    }
    ring.submit();
    answer(ended, &mut answered);
    Command::flush(&mut answered);
    declined
}

/// A read on the ring and the command it answers.
struct InFlight {
    command: Command,
    read: Box<dyn StartedRead>,
}

pub(super) struct ReadRing {
    state: Mutex<RingState>,
    /// Signalled by the kernel for every completion.
    ready: AsyncFd<OwnedFd>,
    /// Cleared when the task that reaps completions is gone (its runtime
    /// shut down): the thread then needs a new ring.
    reaped: AtomicBool,
}

struct RingState {
    ring: IoUring,
    /// Reads in flight or waiting, by the index their entry carries as
    /// user data.
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    /// Reads submitted and not yet reaped.
    on_device: usize,
    /// Reads whose slot is taken but which are not submitted yet.
    waiting: VecDeque<squeue::Entry>,
    peak: Peak,
    /// A task is about to try a refused submit again.
    retrying: bool,
}

impl ReadRing {
    /// This thread's ring, made (with its reaping task on the current
    /// runtime) on first use; `None` where io_uring or eventfd is refused.
    fn current() -> Option<Arc<ReadRing>> {
        RING.with(|cell| {
            let mut cell = cell.borrow_mut();
            if let Some(ring) = cell.as_ref().filter(|r| r.reaped.load(Ordering::Acquire)) {
                return Some(ring.clone());
            }
            let ring = match ReadRing::new() {
                Ok(ring) => Arc::new(ring),
                Err(e) => {
                    tracing::debug!(error = %e, "no io_uring for reads on this thread");
                    return None;
                }
            };
            tokio::spawn(reap(ring.clone()));
            *cell = Some(ring.clone());
            Some(ring)
        })
    }

    fn new() -> io::Result<ReadRing> {
        let ring = IoUring::new(ENTRIES)?;
        // SAFETY: eventfd has no memory preconditions; the result is
        // checked before it is owned.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(fd) };
        ring.submitter().register_eventfd(eventfd.as_raw_fd())?;
        // SAFETY: the AsyncFd owns the descriptor, which stays open and the
        // same until it is dropped.
        let ready = unsafe { AsyncFd::register(eventfd) }.map_err(|e| e.into_parts().1)?;
        Ok(ReadRing {
            state: Mutex::new(RingState {
                ring,
                slots: Vec::new(),
                free: Vec::new(),
                on_device: 0,
                waiting: VecDeque::new(),
                peak: Peak::default(),
                retrying: false,
            }),
            ready,
            reaped: AtomicBool::new(true),
        })
    }

    /// Queue `read` for the next [`ReadRing::submit`].
    fn push(&self, command: Command, mut read: Box<dyn StartedRead>) {
        let (fd, offset) = (read.fd(), read.offset());
        let buf = read.buf();
        // A window is at most one transfer, far below 4 GiB.
        let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let entry = opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), len).offset(offset);
        let mut st = self.state.lock();
        let slot = match st.free.pop() {
            Some(slot) => slot,
            None => {
                st.slots.push(None);
                st.slots.len() - 1
            }
        };
        // The buffer belongs to `read`, which stays in its slot until the
        // read's completion has been reaped (or the ring has been dropped,
        // which waits for it).
        st.slots[slot] = Some(InFlight { command, read });
        st.waiting.push_back(entry.build().user_data(slot as u64));
        let held = st.held();
        st.peak.saw(held);
        let unplaced = st.place(false);
        drop(st);
        finish_unread(unplaced);
    }

    /// Put every queued read in flight.
    fn submit(self: &Arc<Self>) {
        self.submit_or_retry(&mut self.state.lock());
    }

    /// Submit what is queued; if the kernel refuses, try again on a timer
    /// unless a task already does. Completions also submit, but the
    /// refused entries may be all the ring holds, and then none will come.
    fn submit_or_retry(self: &Arc<Self>, st: &mut RingState) {
        if st.submit_queued().is_ok() || std::mem::replace(&mut st.retrying, true) {
            return;
        }
        let ring = self.clone();
        tokio::spawn(async move {
            let mut wait = RETRY_FIRST;
            loop {
                tokio::time::sleep(wait).await;
                let mut st = ring.state.lock();
                if st.submit_queued().is_ok() {
                    // Cleared under the lock: a submit refused after this
                    // finds no task and starts one.
                    st.retrying = false;
                    return;
                }
                wait = (wait * 2).min(RETRY_MAX);
            }
        });
    }

    /// Take the reads that have ended off the ring, and let the waiting
    /// ones through: all of them if a batch came back.
    fn take_ended(&self) -> Vec<(InFlight, i32)> {
        let mut st = self.state.lock();
        let mut ended = Vec::new();
        let RingState {
            ring,
            slots,
            free,
            on_device,
            ..
        } = &mut *st;
        for cqe in ring.completion() {
            let slot = cqe.user_data() as usize;
            if let Some(flight) = slots.get_mut(slot).and_then(Option::take) {
                free.push(slot);
                *on_device -= 1;
                ended.push((flight, cqe.result()));
            }
        }
        let came_back = !ended.is_empty();
        if came_back {
            let held = st.held();
            st.peak.batch(held);
        }
        let unplaced = st.place(came_back);
        drop(st);
        finish_unread(unplaced);
        ended
    }

    /// Answer every read that has ended. The waiting batch goes before
    /// the ended one is answered, and with it entries left queued by a
    /// failed submit.
    fn complete(self: &Arc<Self>) {
        let ended = self.take_ended();
        self.submit();
        let mut batch = Deliveries::default();
        answer(ended, &mut batch);
        Command::flush(&mut batch);
    }
}

impl RingState {
    /// Reads in the ring: on the device and waiting.
    fn held(&self) -> usize {
        self.on_device + self.waiting.len()
    }

    /// Submit what the submission queue holds, if anything. An error means
    /// the kernel refused it for now and the entries are still queued.
    fn submit_queued(&mut self) -> io::Result<()> {
        while !self.ring.submission().is_empty() {
            let submitted = refused_by_fault().map_or_else(|| self.ring.submit(), Err);
            match submitted {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // Nothing taken is a refusal too, not a reason to spin.
                Ok(0) => return Err(io::Error::from_raw_os_error(libc::EAGAIN)),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "io_uring submit refused; tried again later");
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Move waiting reads to the submission queue: all of them when a
    /// batch has just come back, else those [`admits`] lets through. A
    /// read that finds no room even after a submit, with nothing on the
    /// device to bring another chance, is returned unread.
    fn place(&mut self, all: bool) -> Vec<InFlight> {
        let mut unplaced = Vec::new();
        let wave = self.peak.wave();
        while all || admits(self.on_device, self.waiting.len(), wave) {
            let Some(entry) = self.waiting.pop_front() else {
                break;
            };
            // SAFETY: the entry's buffer is owned by its slot (see `push`).
            let mut placed = unsafe { self.ring.submission().push(&entry) }.is_ok();
            if !placed {
                // The queue is full: put what it holds in flight and retry.
                // A refusal leaves it full, and the caller's
                // `submit_or_retry`, which follows, starts the timer.
                let _ = self.submit_queued();
                // SAFETY: as above.
                placed = unsafe { self.ring.submission().push(&entry) }.is_ok();
            }
            if placed {
                self.on_device += 1;
                continue;
            }
            if self.on_device > 0 {
                // A completion will place it.
                self.waiting.push_front(entry);
                break;
            }
            let slot = entry.get_user_data() as usize;
            if let Some(flight) = self.slots.get_mut(slot).and_then(Option::take) {
                self.free.push(slot);
                unplaced.push(flight);
            }
        }
        unplaced
    }
}

/// A refusal a test asked for, in builds with fault injection.
#[cfg(feature = "fault-injection")]
fn refused_by_fault() -> Option<io::Error> {
    crate::faults::take_ring_refusal().then(|| io::Error::from_raw_os_error(libc::EAGAIN))
}

#[cfg(not(feature = "fault-injection"))]
fn refused_by_fault() -> Option<io::Error> {
    None
}

/// Whether a test keeps the reaping task from reaping.
#[cfg(feature = "fault-injection")]
fn reaper_held() -> bool {
    crate::faults::ring_reaper_held()
}

#[cfg(not(feature = "fault-injection"))]
fn reaper_held() -> bool {
    false
}

/// Answer reads the ring could not take: `finish` reads them itself.
fn finish_unread(unplaced: Vec<InFlight>) {
    if unplaced.is_empty() {
        return;
    }
    let mut batch = Deliveries::default();
    for flight in unplaced {
        finish(flight, Ok(0), &mut batch);
    }
    Command::flush(&mut batch);
}

/// Answer reads the kernel has given back, each with its result.
fn answer(ended: Vec<(InFlight, i32)>, batch: &mut Deliveries) {
    for (flight, res) in ended {
        let got = if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            Ok(res as usize)
        };
        finish(flight, got, batch);
    }
}

fn finish(flight: InFlight, got: io::Result<usize>, batch: &mut Deliveries) {
    let InFlight { command, read } = flight;
    let response = std::panic::catch_unwind(AssertUnwindSafe(|| read.finish(got)));
    if response.is_err() {
        tracing::error!(
            tag = command.job.tag,
            "finishing a READ panicked in the target"
        );
    }
    command.deliver(response.ok(), batch);
}

/// Marks the ring as unreaped when the reaping task goes away.
struct Reaper(Arc<ReadRing>);

impl Drop for Reaper {
    fn drop(&mut self) {
        self.0.reaped.store(false, Ordering::Release);
    }
}

async fn reap(ring: Arc<ReadRing>) {
    let reaper = Reaper(ring);
    let ring = &reaper.0;
    loop {
        let Ok(mut guard) = ring.ready.readable().await else {
            return;
        };
        // Reset the count first: a completion after this signals again.
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into a u64 from our own nonblocking eventfd.
        let _ = unsafe {
            libc::read(
                ring.ready.get_ref().as_raw_fd(),
                (&mut count as *mut u64).cast(),
                8,
            )
        };
        guard.clear_ready();
        if reaper_held() {
            continue;
        }
        ring.complete();
    }
}

impl Drop for RingState {
    /// The kernel may still write into the buffers of reads in flight:
    /// they are freed only once it has given each one back.
    fn drop(&mut self) {
        // Reads never submitted are not the kernel's: drop them first.
        for entry in std::mem::take(&mut self.waiting) {
            if let Some(slot) = self.slots.get_mut(entry.get_user_data() as usize) {
                *slot = None;
            }
        }
        let _ = self.ring.submit();
        while self.slots.iter().any(Option::is_some) {
            if self.ring.submit_and_wait(1).is_err() {
                std::thread::yield_now();
            }
            for cqe in self.ring.completion() {
                if let Some(slot) = self.slots.get_mut(cqe.user_data() as usize) {
                    *slot = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where reads arriving one by one settle: (on the device, waiting).
    fn settle(burst: usize, wave: usize) -> (usize, usize) {
        let (mut on_device, mut waiting) = (0, 0);
        for _ in 0..burst {
            waiting += 1;
            while waiting > 0 && admits(on_device, waiting, wave) {
                waiting -= 1;
                on_device += 1;
            }
        }
        (on_device, waiting)
    }

    #[test]
    fn a_second_wave_waits_only_beside_a_full_first_one() {
        assert_eq!(settle(1, WAVE), (1, 0));
        assert_eq!(settle(WAVE, WAVE), (WAVE, 0), "a small burst goes at once");
        assert_eq!(settle(WAVE + 1, WAVE), (WAVE, 1));
        assert_eq!(
            settle(2 * WAVE, WAVE),
            (WAVE, WAVE),
            "QD32: two batches of 16"
        );
        assert_eq!(
            settle(128, WAVE),
            (128 - WAVE, WAVE),
            "never more than a wave waits"
        );
        assert_eq!(settle(16, 8), (8, 8), "QD16: two batches of 8");
    }

    /// The wave after `held` reads were in the ring at once, then `batches`
    /// batches came back with `after` reads left in it each time.
    fn wave_after(held: usize, batches: u32, after: usize) -> usize {
        let mut peak = Peak::default();
        peak.saw(held);
        for _ in 0..batches {
            peak.saw(after);
            peak.batch(after);
        }
        peak.wave()
    }

    #[test]
    fn a_wave_is_half_of_what_the_initiators_keep_going() {
        assert_eq!(Peak::default().wave(), 1, "a first read goes at once");
        assert_eq!(wave_after(1, 0, 0), 1);
        assert_eq!(wave_after(4, 0, 0), 2);
        assert_eq!(wave_after(16, 0, 0), 8);
        assert_eq!(wave_after(32, 0, 0), WAVE);
        assert_eq!(wave_after(128, 0, 0), WAVE, "never above the largest wave");
    }

    #[test]
    fn a_lower_depth_lowers_the_wave_after_two_spans() {
        assert_eq!(
            wave_after(32, PEAK_SPAN, 16),
            WAVE,
            "the last span still counts"
        );
        assert_eq!(wave_after(32, 2 * PEAK_SPAN - 1, 16), WAVE);
        assert_eq!(wave_after(32, 2 * PEAK_SPAN, 16), 8);
        assert_eq!(wave_after(32, 2 * PEAK_SPAN, 0), 1);
    }
}
