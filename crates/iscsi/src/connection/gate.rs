//! Task attribute ordering (SAM-5 8.6): SIMPLE tasks run concurrently, an
//! ORDERED task waits for everything before it and holds back everything
//! after it, HEAD OF QUEUE runs at once.
//!
//! Data-In sent from a file's pages is copied by the initiator only when it
//! reads it, so a write started before then could still change what it
//! gets. An ORDERED task therefore also waits until the initiator has
//! answered a ping sent after such data: it reads the socket in order, so
//! by then it has read everything before the ping.

use std::time::{Duration, Instant};

use std::collections::VecDeque;

use scsi_api::TaskAttr;

#[derive(Debug, Default)]
pub(crate) struct Gate {
    running: usize,
    running_ordered: usize,
    /// Tasks (by ITT) whose data is complete but which must wait, in order.
    pub blocked: VecDeque<u32>,
    /// Data-In went out from file pages since the last barrier ping.
    pub pages_unconfirmed: bool,
    /// The barrier ping an ORDERED task waits on: its TTT and when it left.
    barrier: Option<(u32, Instant)>,
}

impl Gate {
    /// May a newly ready task start now?
    pub fn admits(&self, attr: TaskAttr) -> bool {
        attr == TaskAttr::HeadOfQueue || (self.blocked.is_empty() && self.admits_next(attr))
    }

    /// May the task at the front of the blocked queue start now?
    pub fn admits_next(&self, attr: TaskAttr) -> bool {
        match attr {
            TaskAttr::HeadOfQueue => true,
            TaskAttr::Ordered => {
                self.running == 0 && !self.pages_unconfirmed && self.barrier.is_none()
            }
            _ => self.running_ordered == 0,
        }
    }

    /// Whether a waiting task of `attr` waits only for the initiator to
    /// confirm file pages, and no ping asks it yet.
    pub fn needs_barrier(&self, attr: TaskAttr) -> bool {
        attr == TaskAttr::Ordered
            && self.running == 0
            && self.pages_unconfirmed
            && self.barrier.is_none()
    }

    pub fn barrier_sent(&mut self, ttt: u32, now: Instant) {
        self.pages_unconfirmed = false;
        self.barrier = Some((ttt, now));
    }

    /// A NOP-Out answered ping `ttt`; true when it was the barrier.
    pub fn barrier_answered(&mut self, ttt: u32) -> bool {
        let answered = self.barrier.is_some_and(|(t, _)| t == ttt);
        if answered {
            self.barrier = None;
        }
        answered
    }

    /// The barrier ping has gone unanswered for `timeout`.
    pub fn barrier_overdue(&self, now: Instant, timeout: Duration) -> bool {
        self.barrier
            .is_some_and(|(_, sent)| now.duration_since(sent) >= timeout)
    }

    /// A task started running off the connection loop.
    pub fn started(&mut self, attr: TaskAttr) {
        self.running += 1;
        if attr == TaskAttr::Ordered {
            self.running_ordered += 1;
        }
    }

    pub fn finished(&mut self, attr: TaskAttr) {
        self.running = self.running.saturating_sub(1);
        if attr == TaskAttr::Ordered {
            self.running_ordered = self.running_ordered.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_tasks_run_together() {
        let mut g = Gate::default();
        assert!(g.admits(TaskAttr::Simple));
        g.started(TaskAttr::Simple);
        assert!(g.admits(TaskAttr::Simple));
        assert!(
            !g.admits(TaskAttr::Ordered),
            "ordered waits for earlier tasks"
        );
    }

    #[test]
    fn ordered_holds_back_later_tasks() {
        let mut g = Gate::default();
        g.started(TaskAttr::Ordered);
        assert!(!g.admits(TaskAttr::Simple));
        assert!(g.admits(TaskAttr::HeadOfQueue));
        g.finished(TaskAttr::Ordered);
        assert!(g.admits(TaskAttr::Simple));
    }

    #[test]
    fn queue_keeps_order() {
        let mut g = Gate::default();
        g.started(TaskAttr::Simple);
        g.blocked.push_back(1); // an ORDERED task waiting
        assert!(
            !g.admits(TaskAttr::Simple),
            "simple behind a waiting ordered task"
        );
        assert!(!g.admits_next(TaskAttr::Ordered));
        g.finished(TaskAttr::Simple);
        assert!(g.admits_next(TaskAttr::Ordered));
    }

    #[test]
    fn ordered_waits_for_pages_to_be_confirmed() {
        let mut g = Gate::default();
        g.started(TaskAttr::Simple);
        g.pages_unconfirmed = true;
        assert!(
            !g.needs_barrier(TaskAttr::Ordered),
            "no ping while earlier tasks still run"
        );
        g.finished(TaskAttr::Simple);
        assert!(!g.admits(TaskAttr::Ordered));
        assert!(!g.needs_barrier(TaskAttr::Simple));
        assert!(g.needs_barrier(TaskAttr::Ordered));
        let now = Instant::now();
        g.barrier_sent(7, now);
        assert!(!g.needs_barrier(TaskAttr::Ordered), "one ping at a time");
        assert!(!g.admits(TaskAttr::Ordered));
        assert!(g.admits(TaskAttr::Simple), "only ORDERED tasks wait");
        assert!(!g.barrier_answered(8), "another ping's answer");
        assert!(!g.barrier_overdue(now, Duration::from_secs(5)));
        assert!(g.barrier_overdue(now + Duration::from_secs(5), Duration::from_secs(5)));
        assert!(g.barrier_answered(7));
        assert!(g.admits(TaskAttr::Ordered));
    }
}
