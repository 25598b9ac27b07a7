//! Whether the connection's reader polls its socket for a moment before it
//! sleeps on it.
//!
//! An initiator that waits for each answer before it sends its next
//! command (queue depth 1) pays, on every command, for the connection's
//! thread being woken from sleep. Where an idle CPU halts, as the vCPUs of
//! a virtual machine do, that wake-up is dear: on the benchmark machine a
//! 4K read at QD1 took 73 µs from submission to completion when the target
//! slept between commands and 24 µs when it polled (docs/bench/techniques.md,
//! section 25). So while the initiator works in lockstep and its commands
//! come back quickly, the reader polls for up to [`SPIN`], giving the
//! thread's other connections their turn between polls, before it sleeps.
//!
//! Polling does not pay at higher depths: the wake-up's delay is what lets
//! a burst of commands gather into one read, and a reader that polls takes
//! them one by one (always polling cost 28 % of the IOPS at QD32). The
//! initiator's ExpStatSN tells the two apart. In lockstep, each command
//! acknowledges a status that the one before it did not: the initiator saw
//! an answer between sending them. The commands of a burst all carry the
//! same ExpStatSN.
//!
//! The reader also polls through the one command of such an initiator
//! while it runs (an O_DIRECT read on the disk): the thread then does not
//! sleep, so the disk's interrupt finds its vCPU awake and the answer
//! leaves without a wake-up. On an AMD EPYC host that took QD1 reads of an
//! O_DIRECT LUN from about 5,700 to 7,200 a second (docs/bench/techniques.md,
//! section 47). A command that outlasts a poll (a slow disk, a long
//! transfer) stops that for the next [`THROUGH_RETRY`] commands, so a slow
//! device costs one vain poll in that many.

use std::time::Duration;

use crate::pdu::{Bhs, Opcode};

/// How long the reader polls before it sleeps: long enough for an
/// initiator that does work of its own between commands. At 50 µs one
/// QD1 read of qemu-io in ten still paid the wake-up (a p90 of 64–86 µs
/// against a median of 27–30; docs/bench/techniques.md section 34).
pub(crate) const SPIN: Duration = Duration::from_micros(200);

/// A sleep shorter than this one suggests that polling would have caught
/// the next command: the initiator turns answers around quickly.
const QUICK_TURNAROUND: Duration = Duration::from_micros(200);

/// Commands after a vain poll through a running one before the reader
/// polls through one again.
const THROUGH_RETRY: u32 = 64;

/// What the reader has learnt of the initiator's pace.
#[derive(Debug, Default)]
pub(crate) struct SpinPolicy {
    /// ExpStatSN of the last SCSI Command.
    last_exp_statsn: Option<u32>,
    /// The last SCSI Command acknowledged a status its predecessor did not.
    lockstep: bool,
    /// The last wait ended soon: a poll caught the data, or a sleep was
    /// shorter than [`QUICK_TURNAROUND`].
    quick: bool,
    /// Commands received and not yet answered. With none, the next move is
    /// the initiator's; with one, the reader may poll through it; with
    /// more, the initiator is not in lockstep with this connection.
    pub running: usize,
    /// Commands to see before polling through a running one again, after
    /// one outlasted a poll; 0: poll through.
    through_wait: u32,
}

impl SpinPolicy {
    /// Note a PDU taken off the stream.
    pub fn saw(&mut self, bhs: &Bhs) {
        if bhs.opcode() != Some(Opcode::ScsiCommand) {
            return;
        }
        let exp_statsn = bhs.u32_at(28);
        self.lockstep = self.last_exp_statsn.is_some_and(|last| last != exp_statsn);
        self.last_exp_statsn = Some(exp_statsn);
        self.through_wait = self.through_wait.saturating_sub(1);
    }

    /// How long to poll before sleeping; `None`: sleep at once.
    pub fn budget(&self) -> Option<Duration> {
        let waits_on = match self.running {
            0 => true,
            1 => self.through_wait == 0,
            _ => false,
        };
        (self.lockstep && self.quick && waits_on).then_some(SPIN)
    }

    /// A poll ended, with bytes (`caught`) or without. One through a
    /// running command that caught nothing says the command was slow, not
    /// the initiator (its end cuts the poll short).
    pub fn polled(&mut self, caught: bool) {
        if self.running > 0 && !caught {
            self.through_wait = THROUGH_RETRY;
        } else {
            self.quick = caught;
        }
    }

    /// The reader slept for `slept` (without polling first).
    pub fn slept(&mut self, slept: Duration) {
        self.quick = slept < QUICK_TURNAROUND;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(exp_statsn: u32) -> Bhs {
        let mut bhs = Bhs::new(Opcode::ScsiCommand, 0x80);
        bhs.set_u32(28, exp_statsn);
        bhs
    }

    /// Every command answered: the next move is the initiator's.
    fn waiting_on_initiator() -> SpinPolicy {
        SpinPolicy::default()
    }

    /// Two commands in lockstep after a short sleep.
    fn in_lockstep() -> SpinPolicy {
        let mut p = waiting_on_initiator();
        p.slept(Duration::ZERO);
        p.saw(&command(1));
        p.saw(&command(2));
        p
    }

    #[test]
    fn polls_for_an_initiator_in_lockstep_that_answers_quickly() {
        let mut p = waiting_on_initiator();
        p.slept(Duration::from_micros(60));
        p.saw(&command(7));
        assert_eq!(p.budget(), None, "one command tells nothing of the pace");
        p.saw(&command(8));
        assert_eq!(p.budget(), Some(SPIN));
        p.polled(true);
        p.saw(&command(9));
        assert_eq!(p.budget(), Some(SPIN), "caught: poll again");
    }

    #[test]
    fn sleeps_through_a_burst() {
        let mut p = waiting_on_initiator();
        p.slept(Duration::ZERO);
        for exp_statsn in [40, 41, 41, 41] {
            p.saw(&command(exp_statsn));
        }
        assert_eq!(p.budget(), None, "the burst's commands share ExpStatSN");
        p.saw(&command(73));
        assert_eq!(p.budget(), Some(SPIN), "a burst's first command alone");
    }

    #[test]
    fn polls_through_one_running_command_not_two() {
        let mut p = in_lockstep();
        p.running = 1;
        assert_eq!(p.budget(), Some(SPIN));
        p.running = 2;
        assert_eq!(p.budget(), None);
    }

    #[test]
    fn a_command_that_outlasts_a_poll_stops_polling_through_for_a_while() {
        let mut p = in_lockstep();
        p.running = 1;
        p.polled(false);
        assert_eq!(p.budget(), None, "the command outlasted the poll");
        p.running = 0;
        assert_eq!(
            p.budget(),
            Some(SPIN),
            "the initiator was not the slow one: still polled for"
        );
        for exp_statsn in 3..3 + THROUGH_RETRY - 1 {
            p.saw(&command(exp_statsn));
        }
        p.running = 1;
        assert_eq!(p.budget(), None);
        p.saw(&command(3 + THROUGH_RETRY));
        assert_eq!(p.budget(), Some(SPIN), "tried again");
    }

    #[test]
    fn a_slow_initiator_is_not_polled_for() {
        let mut p = waiting_on_initiator();
        p.saw(&command(1));
        p.saw(&command(2));
        p.slept(Duration::from_millis(2));
        assert_eq!(p.budget(), None, "a long sleep");
        p.slept(Duration::from_micros(30));
        assert_eq!(p.budget(), Some(SPIN));
        p.polled(false);
        assert_eq!(p.budget(), None, "a poll that caught nothing");
    }

    #[test]
    fn other_pdus_leave_the_pace_alone() {
        let mut p = in_lockstep();
        let mut nop = Bhs::new(Opcode::NopOut, 0x80);
        nop.set_u32(28, 2);
        p.saw(&nop);
        assert_eq!(p.budget(), Some(SPIN));
    }
}
