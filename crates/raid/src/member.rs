//! One member device of an array: its sync state and its I/O figures.
//!
//! Offsets given to a member's I/O methods are relative to its data area;
//! the superblock and bitmap in front of it are the array's business.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use block::{Allocation, BlockDevice};
use parking_lot::RwLock;
use stats::LatencyHistogram;

use crate::bitmap::RegionSet;
use crate::recent::{Origin, Recent};

/// How far a member's data can be trusted.
#[derive(Clone, Debug)]
pub enum SyncState {
    /// Every row holds what the array wrote.
    InSync,
    /// Being brought up to date: rows below `done_rows` are, and so are
    /// rows of regions not in `stale` (`None`: every region is stale).
    /// Every write still goes to it.
    Recovering {
        done_rows: u64,
        stale: Option<RegionSet>,
    },
    /// Neither read nor written.
    Failed,
}

/// A new member id: random, never 0 (which means "unknown").
pub fn new_member_id() -> u128 {
    rand::random::<u128>().max(1)
}

#[derive(Default)]
pub struct MemberStats {
    pub read_ops: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_ops: AtomicU64,
    pub write_bytes: AtomicU64,
    pub errors: AtomicU64,
    /// Nanoseconds spent in reads and writes, for throughput while busy.
    pub busy_nanos: AtomicU64,
    pub read_latency: LatencyHistogram,
    pub write_latency: LatencyHistogram,
    /// Foreground I/O of the last few minutes, for the weakest link.
    pub recent: Recent,
}

pub struct Member {
    pub dev: Arc<dyn BlockDevice>,
    /// This device's id in the array, kept in its superblock: the roster
    /// names slots' owners by it.
    pub id: u128,
    /// The device's name in the configuration, or its description.
    name: RwLock<String>,
    /// Where the data area starts on the device.
    pub data_offset: u64,
    pub state: RwLock<SyncState>,
    pub stats: MemberStats,
    /// An I/O slower than this many nanoseconds counts as failed (0: no
    /// limit): a member that hangs must not hold the array with it.
    pub timeout_nanos: AtomicU64,
    /// The member being copied to take this one's place (`raid
    /// replace`): every write, zeroing and flush of this member goes to
    /// it too, so that it stays current behind the copy. Reads do not.
    pub replacement: RwLock<Option<Arc<Member>>>,
    /// Set once a completed replacement has taken this member's slot: a
    /// write that found this member in the slot just before still
    /// reaches the replacement, and only its outcome counts.
    pub released: AtomicBool,
}

impl Member {
    pub fn new(
        dev: Arc<dyn BlockDevice>,
        name: String,
        state: SyncState,
        data_offset: u64,
    ) -> Member {
        Member {
            dev,
            id: new_member_id(),
            name: RwLock::new(name),
            data_offset,
            state: RwLock::new(state),
            stats: MemberStats::default(),
            timeout_nanos: AtomicU64::new(0),
            replacement: RwLock::new(None),
            released: AtomicBool::new(false),
        }
    }

    /// The member with the id its superblock gave it (0, from a
    /// superblock written before ids, keeps the new one).
    pub fn with_id(mut self, id: u128) -> Member {
        if id != 0 {
            self.id = id;
        }
        self
    }

    /// The replacement being copied beside this member, if any.
    pub fn replacement(&self) -> Option<Arc<Member>> {
        self.replacement.read().clone()
    }

    /// Runs `op` on this member and on its replacement, if it has a live
    /// one. A replacement that fails is marked failed (the array's
    /// worker then drops it) and does not fail this member, whose own
    /// outcome is the answer; once this member is released the
    /// replacement's outcome is.
    fn with_replacement(&self, op: impl Fn(&Member) -> io::Result<()>) -> io::Result<()> {
        let replacement = self.replacement.read();
        let own = op(self);
        let Some(r) = replacement.as_ref().filter(|r| !r.is_failed()) else {
            return own;
        };
        let theirs = op(r);
        if self.released.load(Ordering::SeqCst) {
            return theirs;
        }
        if let Err(e) = theirs {
            tracing::error!(replacement = %r.name(), error = %e, "RAID replacement failed");
            *r.state.write() = SyncState::Failed;
        }
        own
    }

    pub fn name(&self) -> String {
        self.name.read().clone()
    }

    pub fn set_name(&self, name: &str) {
        *self.name.write() = name.to_string();
    }

    pub fn is_failed(&self) -> bool {
        matches!(*self.state.read(), SyncState::Failed)
    }

    pub fn is_in_sync(&self) -> bool {
        matches!(*self.state.read(), SyncState::InSync)
    }

    /// Whether `row` of this member holds current data.
    pub fn readable(&self, row: u64, region_rows: u64) -> bool {
        match &*self.state.read() {
            SyncState::InSync => true,
            SyncState::Recovering { done_rows, stale } => {
                row < *done_rows || stale.as_ref().is_some_and(|s| !s.get(row / region_rows))
            }
            SyncState::Failed => false,
        }
    }

    fn timed<T>(&self, f: impl FnOnce() -> io::Result<T>) -> (io::Result<T>, u64) {
        let start = Instant::now();
        let r = f();
        let nanos = start.elapsed().as_nanos() as u64;
        self.stats.busy_nanos.fetch_add(nanos, Ordering::Relaxed);
        let limit = self.timeout_nanos.load(Ordering::Relaxed);
        let r = match r {
            Ok(_) if limit > 0 && nanos > limit => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("I/O took {} ms, over the member timeout", nanos / 1_000_000),
            )),
            r => r,
        };
        if r.is_err() {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        (r, nanos)
    }

    /// A read for the array's users.
    pub fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_for(Origin::Foreground, buf, offset)
    }

    /// A read for `origin`: only the foreground's count toward the
    /// weakest link.
    pub fn read_for(&self, origin: Origin, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let (r, nanos) = self.timed(|| self.dev.read_at(buf, self.data_offset + offset));
        self.stats.recent.record(origin, nanos);
        self.stats.read_latency.record(nanos);
        self.stats.read_ops.fetch_add(1, Ordering::Relaxed);
        self.stats
            .read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        r
    }

    /// Writes this member and its replacement, for the array's users.
    pub fn write(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.write_for(Origin::Foreground, buf, offset, fua)
    }

    /// [`Member::write`] for `origin`.
    pub fn write_for(&self, origin: Origin, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.with_replacement(|m| m.write_own(origin, buf, offset, fua))
    }

    /// Writes this member's device only.
    pub fn write_own(&self, origin: Origin, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        let (r, nanos) = self.timed(|| self.dev.write_at(buf, self.data_offset + offset, fua));
        self.stats.recent.record(origin, nanos);
        self.stats.write_latency.record(nanos);
        self.stats.write_ops.fetch_add(1, Ordering::Relaxed);
        self.stats
            .write_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        r
    }

    pub fn flush(&self) -> io::Result<()> {
        self.with_replacement(|m| m.timed(|| m.dev.flush()).0)
    }

    /// Makes `len` bytes at `offset` read as zeros the way `how` says. A
    /// discard on a device whose discards do not read back as zeros
    /// writes zeros instead: the array's parity counts on them. For the
    /// array's users.
    pub fn zero(&self, how: Zeroing, offset: u64, len: u64) -> io::Result<()> {
        self.with_replacement(|m| m.zero_own(Origin::Foreground, how, offset, len))
    }

    /// Zeroes on this member's device only.
    pub fn zero_own(&self, origin: Origin, how: Zeroing, offset: u64, len: u64) -> io::Result<()> {
        let at = self.data_offset + offset;
        let (r, nanos) = self.timed(|| match how {
            Zeroing::Discard if self.dev.capabilities().discard_zeroes => self.dev.discard(at, len),
            Zeroing::Discard | Zeroing::WriteZeroes => self.dev.write_zeroes(at, len),
            Zeroing::Allocate => self.dev.allocate_zeroes(at, len),
        });
        self.stats.recent.record(origin, nanos);
        self.stats.write_latency.record(nanos);
        self.stats.write_ops.fetch_add(1, Ordering::Relaxed);
        r
    }

    /// Allocation state of the member's data at `offset` (see
    /// [`BlockDevice::allocation`]).
    pub fn allocation(&self, offset: u64, len: u64) -> io::Result<(Allocation, u64)> {
        self.dev.allocation(self.data_offset + offset, len)
    }
}

/// How a range is made to read as zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zeroing {
    /// Space given back where the device can (and still zeros).
    Discard,
    WriteZeroes,
    /// Space set aside, never deallocated.
    Allocate,
}
