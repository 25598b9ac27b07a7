//! The counters of one (target, LUN, initiator): per kind of command, the
//! number of commands, bytes, failures, summed latency and a latency
//! histogram; and the commands in flight.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::histogram::{HistogramSnapshot, LatencyHistogram};

/// How a command counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    /// Everything else: TEST UNIT READY, INQUIRY, SYNCHRONIZE CACHE, ...
    Other,
}

#[derive(Debug, Default)]
struct OpStats {
    commands: AtomicU64,
    /// Bytes of the commands that succeeded.
    bytes: AtomicU64,
    /// Commands that ended with a status other than GOOD.
    errors: AtomicU64,
    /// Sum of latencies; its growth over an interval divided by the
    /// interval is the mean number of commands in flight (Little's law).
    latency_ns: AtomicU64,
    latency: LatencyHistogram,
}

impl OpStats {
    fn record(&self, bytes: u64, nanos: u64, ok: bool) {
        self.commands.fetch_add(1, Ordering::Relaxed);
        // A failed command moved no data the initiator can count on.
        if ok {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.latency_ns.fetch_add(nanos, Ordering::Relaxed);
        self.latency.record(nanos);
    }

    fn snapshot(&self) -> OpSnapshot {
        OpSnapshot {
            commands: self.commands.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            latency_ns: self.latency_ns.load(Ordering::Relaxed),
            latency: self.latency.snapshot(),
        }
    }
}

/// Live counters of one LUN as seen by one initiator.
#[derive(Debug, Default)]
pub struct LunStats {
    read: OpStats,
    write: OpStats,
    other: OpStats,
    in_flight: AtomicU64,
}

impl LunStats {
    /// A command started.
    pub fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// A command that [`LunStats::begin`] counted was not taken after all.
    pub fn cancel(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// A command that [`LunStats::begin`] counted ended.
    pub fn end(&self, kind: OpKind, bytes: u64, nanos: u64, ok: bool) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.ops(kind).record(bytes, nanos, ok);
    }

    fn ops(&self, kind: OpKind) -> &OpStats {
        match kind {
            OpKind::Read => &self.read,
            OpKind::Write => &self.write,
            OpKind::Other => &self.other,
        }
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self, target: &str, lun: u64, initiator: &str) -> EntrySnapshot {
        EntrySnapshot {
            target: target.to_string(),
            lun,
            initiator: initiator.to_string(),
            in_flight: self.in_flight(),
            read: self.read.snapshot(),
            write: self.write.snapshot(),
            other: self.other.snapshot(),
        }
    }
}

/// One kind of command's totals since the daemon started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpSnapshot {
    pub commands: u64,
    pub bytes: u64,
    pub errors: u64,
    pub latency_ns: u64,
    pub latency: HistogramSnapshot,
}

impl OpSnapshot {
    /// What happened after `earlier` (of the same entry) was taken.
    pub fn since(&self, earlier: &OpSnapshot) -> OpSnapshot {
        OpSnapshot {
            commands: self.commands.saturating_sub(earlier.commands),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            errors: self.errors.saturating_sub(earlier.errors),
            latency_ns: self.latency_ns.saturating_sub(earlier.latency_ns),
            latency: self.latency.since(&earlier.latency),
        }
    }
}

/// Everything known about one (target, LUN, initiator).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntrySnapshot {
    pub target: String,
    pub lun: u64,
    pub initiator: String,
    /// Commands being executed at this moment.
    pub in_flight: u64,
    pub read: OpSnapshot,
    pub write: OpSnapshot,
    pub other: OpSnapshot,
}

impl EntrySnapshot {
    /// The same entry's activity after `earlier`; `in_flight` stays current.
    pub fn since(&self, earlier: &EntrySnapshot) -> EntrySnapshot {
        EntrySnapshot {
            target: self.target.clone(),
            lun: self.lun,
            initiator: self.initiator.clone(),
            in_flight: self.in_flight,
            read: self.read.since(&earlier.read),
            write: self.write.since(&earlier.write),
            other: self.other.since(&earlier.other),
        }
    }

    /// Mean commands in flight over `seconds` of activity (`since` first):
    /// the summed latency divided by the time.
    pub fn mean_queue_depth(&self, seconds: f64) -> f64 {
        if seconds <= 0.0 {
            return 0.0;
        }
        let busy = self.read.latency_ns + self.write.latency_ns + self.other.latency_ns;
        busy as f64 / 1e9 / seconds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_count_by_kind() {
        let s = LunStats::default();
        s.begin();
        s.begin();
        assert_eq!(s.in_flight(), 2);
        s.end(OpKind::Read, 4096, 1_000, true);
        s.end(OpKind::Write, 512, 3_000, false);
        s.begin();
        s.end(OpKind::Other, 0, 10, true);
        let snap = s.snapshot("t", 3, "i");
        assert_eq!(snap.in_flight, 0);
        assert_eq!(
            (snap.read.commands, snap.read.bytes, snap.read.errors),
            (1, 4096, 0)
        );
        assert_eq!(
            (snap.write.commands, snap.write.bytes, snap.write.errors),
            (1, 0, 1)
        );
        assert_eq!(snap.other.commands, 1);
        assert_eq!(snap.read.latency.count(), 1);
        assert_eq!(snap.write.latency_ns, 3_000);
    }

    #[test]
    fn since_and_queue_depth() {
        let s = LunStats::default();
        s.begin();
        s.end(OpKind::Read, 100, 1_000_000, true);
        let first = s.snapshot("t", 0, "i");
        for _ in 0..4 {
            s.begin();
            s.end(OpKind::Read, 100, 500_000_000, true);
        }
        let delta = s.snapshot("t", 0, "i").since(&first);
        assert_eq!(delta.read.commands, 4);
        assert_eq!(delta.read.bytes, 400);
        assert_eq!(delta.read.latency.count(), 4);
        // Four commands of half a second each over one second: two at a time.
        assert!((delta.mean_queue_depth(1.0) - 2.0).abs() < 1e-9);
        assert_eq!(delta.mean_queue_depth(0.0), 0.0);
    }
}
