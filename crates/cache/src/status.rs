//! Counters and the status report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use serde::Serialize;

use crate::device::CacheDevice;
use crate::mode::Mode;
use crate::writeback::FlushProgress;

/// Over how long the write-back rate is measured.
const RATE_WINDOW_SECS: f64 = 5.0;

#[derive(Default)]
pub struct Counters {
    read_hit: AtomicU64,
    read_miss: AtomicU64,
    write_hit: AtomicU64,
    write_miss: AtomicU64,
    bypassed_ios: AtomicU64,
    bypassed_bytes: AtomicU64,
    pub evictions: AtomicU64,
    written_back: AtomicU64,
    /// Recent write-back passes: when, and how many bytes.
    recent: Mutex<Vec<(Instant, u64)>>,
}

impl Counters {
    pub fn read(&self, hit: u64, miss: u64) {
        self.read_hit.fetch_add(hit, Ordering::Relaxed);
        self.read_miss.fetch_add(miss, Ordering::Relaxed);
    }

    /// Bytes written to a line that was (`hit`) or was not cached.
    pub fn write(&self, hit: bool, bytes: u64) {
        let c = if hit {
            &self.write_hit
        } else {
            &self.write_miss
        };
        c.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn bypassed(&self, bytes: u64) {
        self.bypassed_ios.fetch_add(1, Ordering::Relaxed);
        self.bypassed_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn written_back(&self, bytes: u64) {
        self.written_back.fetch_add(bytes, Ordering::Relaxed);
        let now = Instant::now();
        let mut recent = self.recent.lock();
        recent.retain(|(t, _)| now.duration_since(*t).as_secs_f64() < RATE_WINDOW_SECS);
        recent.push((now, bytes));
    }

    fn rate(&self) -> u64 {
        let now = Instant::now();
        let recent = self.recent.lock();
        let bytes: u64 = recent
            .iter()
            .filter(|(t, _)| now.duration_since(*t).as_secs_f64() < RATE_WINDOW_SECS)
            .map(|(_, b)| b)
            .sum();
        (bytes as f64 / RATE_WINDOW_SECS) as u64
    }
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct HitRatio {
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    /// Hits over all bytes, 0 when there was no I/O.
    pub ratio: f64,
}

impl HitRatio {
    fn of(hit: &AtomicU64, miss: &AtomicU64) -> HitRatio {
        let (h, m) = (hit.load(Ordering::Relaxed), miss.load(Ordering::Relaxed));
        HitRatio {
            hit_bytes: h,
            miss_bytes: m,
            ratio: if h + m == 0 {
                0.0
            } else {
                h as f64 / (h + m) as f64
            },
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum Health {
    Ok,
    /// The cache device failed. I/O to the `stranded_bytes` of blocks not
    /// yet written back fails (MEDIUM ERROR); every other block is served
    /// from the backing.
    Failed {
        stranded_bytes: u64,
        /// What that means for I/O, for the administrator.
        effect: String,
    },
}

fn failed_effect(stranded: u64) -> String {
    if stranded == 0 {
        "every block is served from the backing; nothing was lost".into()
    } else {
        format!(
            "{stranded} bytes written to the cache were not yet written back: reads and \
             writes touching them fail with MEDIUM ERROR until the cache device is repaired \
             and attached again; every other block is served from the backing"
        )
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WritebackStatus {
    pub written_bytes: u64,
    /// Over the last few seconds.
    pub rate_bytes_per_sec: u64,
    pub threshold_bytes: u64,
    pub limit_bytes_per_sec: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CacheStatus {
    pub mode: Mode,
    pub attached: bool,
    pub health: Health,
    pub line_size: u64,
    pub lines: u64,
    pub occupied_lines: u64,
    /// Occupied over all lines.
    pub occupancy: f64,
    pub dirty_bytes: u64,
    pub dirty_lines: u64,
    /// The backing is marked (on itself) as holding writes only this cache
    /// device has: started without this cache device, it is not served
    /// until they are given up. Cleared once everything is written back.
    pub backing_marked: bool,
    pub reads: HitRatio,
    pub writes: HitRatio,
    /// I/O that went around the cache: sequential streams past the cutoff,
    /// and writes that found no clean line to replace.
    pub bypassed_ios: u64,
    pub bypassed_bytes: u64,
    pub sequential_cutoff: u64,
    pub evictions: u64,
    pub writeback: WritebackStatus,
    /// A full write-back under way (mode change, detach, flush).
    pub flushing: Option<FlushProgress>,
    /// The latest notable events, oldest first, as `unix-seconds: text`.
    pub events: Vec<String>,
}

impl CacheDevice {
    pub fn status(&self) -> CacheStatus {
        let inner = &self.inner;
        let c = &inner.counters;
        let (occupied, dirty_subs, dirty_lines) = {
            let st = inner.state.lock();
            (
                st.occupied() as u64,
                st.dirty_subs,
                st.dirty_lines.len() as u64,
            )
        };
        let dirty_bytes = dirty_subs * inner.geo.sub;
        let settings = *inner.writeback.lock();
        let lines = inner.geo.slots as u64;
        CacheStatus {
            mode: *inner.mode.read(),
            attached: !inner.is_detached(),
            health: if inner.is_failed() {
                Health::Failed {
                    stranded_bytes: dirty_bytes,
                    effect: failed_effect(dirty_bytes),
                }
            } else {
                Health::Ok
            },
            line_size: inner.geo.line,
            lines,
            occupied_lines: occupied,
            occupancy: occupied as f64 / lines as f64,
            dirty_bytes,
            dirty_lines,
            backing_marked: *inner.backing_mark.read(),
            reads: HitRatio::of(&c.read_hit, &c.read_miss),
            writes: HitRatio::of(&c.write_hit, &c.write_miss),
            bypassed_ios: c.bypassed_ios.load(Ordering::Relaxed),
            bypassed_bytes: c.bypassed_bytes.load(Ordering::Relaxed),
            sequential_cutoff: inner.streams.lock().cutoff(),
            evictions: c.evictions.load(Ordering::Relaxed),
            writeback: WritebackStatus {
                written_bytes: c.written_back.load(Ordering::Relaxed),
                rate_bytes_per_sec: c.rate(),
                threshold_bytes: lines * inner.geo.line / 100
                    * settings.dirty_threshold_percent as u64,
                limit_bytes_per_sec: settings.rate,
            },
            flushing: *inner.flushing.lock(),
            events: inner.events.lock().iter().cloned().collect(),
        }
    }
}
