//! Task attribute ordering (SAM-5 8.6): SIMPLE tasks run concurrently, an
//! ORDERED task waits for everything before it and holds back everything
//! after it, HEAD OF QUEUE runs at once.

use std::collections::VecDeque;

use scsi_api::TaskAttr;

#[derive(Debug, Default)]
pub(crate) struct Gate {
    running: usize,
    running_ordered: usize,
    /// Tasks (by ITT) whose data is complete but which must wait, in order.
    pub blocked: VecDeque<u32>,
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
            TaskAttr::Ordered => self.running == 0,
            _ => self.running_ordered == 0,
        }
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
}
