//! I/O statistics per (target, LUN, initiator).
//!
//! [`StatsTarget`] wraps the SCSI target a transport talks to, classifies
//! each command as read, write or other by its opcode, and times it. The
//! data path touches only the entry of its own LUN and initiator: a few
//! relaxed atomic additions and one histogram bucket, found through a
//! sharded map under a read lock, so commands of different LUNs or sessions
//! never wait for each other.
//!
//! [`Registry::snapshot`] reads every entry for the administration API;
//! [`prometheus::Metrics`] encodes the same numbers for a Prometheus scrape.

mod counters;
mod histogram;
pub mod prometheus;
mod registry;
mod samples;
mod target;

pub use counters::{EntrySnapshot, LunStats, OpKind, OpSnapshot};
pub use histogram::{HistogramSnapshot, LatencyHistogram};
pub use registry::{Registry, TargetStats};
pub use samples::{Sample, SampleKind, SampleSource};
pub use target::{classify, StatsTarget};
