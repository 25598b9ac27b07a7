//! Command numbering: serial arithmetic and the CmdSN window.

/// `a < b` in 32-bit serial number arithmetic (RFC 1982).
pub fn sn_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `a <= b` in serial arithmetic.
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// Where a non-immediate command's CmdSN falls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// The next expected command.
    InOrder,
    /// Inside the window but ahead of a missing command: hold it.
    Ahead,
    /// Outside the window (too old or too far ahead): drop silently.
    Outside,
}

/// ExpCmdSN / MaxCmdSN bookkeeping of one session.
///
/// MaxCmdSN is `ExpCmdSN + window - 1 - inflight`, where `inflight` counts
/// accepted commands whose final response has not gone out yet. The window
/// therefore bounds how many commands run at once, and never shrinks:
/// accepting a command raises ExpCmdSN and inflight together, finishing one
/// lowers inflight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmdWindow {
    exp_cmdsn: u32,
    window: u32,
    inflight: u32,
    max_cmdsn: u32,
}

impl CmdWindow {
    pub fn new(exp_cmdsn: u32, window: u32) -> CmdWindow {
        let window = window.max(1);
        CmdWindow {
            exp_cmdsn,
            window,
            inflight: 0,
            max_cmdsn: exp_cmdsn.wrapping_add(window - 1),
        }
    }

    pub fn exp_cmdsn(&self) -> u32 {
        self.exp_cmdsn
    }

    pub fn max_cmdsn(&self) -> u32 {
        self.max_cmdsn
    }

    pub fn inflight(&self) -> u32 {
        self.inflight
    }

    pub fn classify(&self, cmdsn: u32) -> Arrival {
        // A closed window (MaxCmdSN = ExpCmdSN - 1) admits nothing.
        let open = sn_le(cmdsn, self.max_cmdsn);
        if cmdsn == self.exp_cmdsn && open {
            Arrival::InOrder
        } else if sn_lt(self.exp_cmdsn, cmdsn) && open {
            Arrival::Ahead
        } else {
            Arrival::Outside
        }
    }

    /// The command numbered ExpCmdSN was accepted. `tracked` commands keep
    /// a window slot until [`CmdWindow::finished`].
    pub fn accept(&mut self, tracked: bool) {
        self.exp_cmdsn = self.exp_cmdsn.wrapping_add(1);
        if tracked {
            self.inflight += 1;
        }
        self.recompute();
    }

    /// A tracked command's final response went out (or it was aborted).
    pub fn finished(&mut self) {
        self.inflight = self.inflight.saturating_sub(1);
        self.recompute();
    }

    fn recompute(&mut self) {
        let free = self.window.saturating_sub(self.inflight);
        // With no free slot MaxCmdSN = ExpCmdSN - 1: the window is closed.
        let candidate = self.exp_cmdsn.wrapping_add(free).wrapping_sub(1);
        if sn_lt(self.max_cmdsn, candidate) {
            self.max_cmdsn = candidate;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_comparison_wraps() {
        assert!(sn_lt(1, 2));
        assert!(!sn_lt(2, 1));
        assert!(sn_lt(u32::MAX, 0));
        assert!(sn_lt(u32::MAX - 5, 3));
        assert!(sn_le(7, 7));
    }

    #[test]
    fn classify_edges() {
        let w = CmdWindow::new(10, 4); // window 10..=13
        assert_eq!(w.max_cmdsn(), 13);
        assert_eq!(w.classify(10), Arrival::InOrder);
        assert_eq!(w.classify(13), Arrival::Ahead);
        assert_eq!(w.classify(14), Arrival::Outside, "MaxCmdSN + 1");
        assert_eq!(w.classify(9), Arrival::Outside, "ExpCmdSN - 1");
    }

    #[test]
    fn window_slides_with_completion() {
        let mut w = CmdWindow::new(u32::MAX - 1, 3);
        for _ in 0..3 {
            assert_eq!(w.classify(w.exp_cmdsn()), Arrival::InOrder);
            w.accept(true);
        }
        assert_eq!(w.exp_cmdsn(), 1);
        assert_eq!(
            w.max_cmdsn(),
            u32::MAX.wrapping_add(1),
            "closed: MaxCmdSN = ExpCmdSN - 1"
        );
        assert_eq!(w.classify(1), Arrival::Outside);
        w.finished();
        assert_eq!(w.max_cmdsn(), 1);
        assert_eq!(w.classify(1), Arrival::InOrder);
    }

    #[test]
    fn untracked_commands_do_not_hold_slots() {
        let mut w = CmdWindow::new(0, 2);
        w.accept(false);
        w.accept(false);
        assert_eq!((w.exp_cmdsn(), w.max_cmdsn(), w.inflight()), (2, 3, 0));
    }

    #[test]
    fn max_cmdsn_never_decreases() {
        let mut w = CmdWindow::new(0, 128);
        let mut last = w.max_cmdsn();
        for i in 0..1000u32 {
            if i % 3 == 0 {
                w.finished();
            } else {
                w.accept(true);
            }
            assert!(sn_le(last, w.max_cmdsn()));
            last = w.max_cmdsn();
        }
    }
}
