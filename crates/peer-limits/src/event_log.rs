//! Logging an event that a peer can make happen thousands of times a
//! second: the first occurrence is logged, then at most one line per
//! interval carrying how many were held back, and a total for metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[derive(Debug)]
pub struct EventLog {
    interval: Duration,
    total: AtomicU64,
    /// When a line was last written, and how many occurred since.
    last: Mutex<(Option<Instant>, u64)>,
}

impl EventLog {
    pub const fn new(interval: Duration) -> EventLog {
        EventLog {
            interval,
            total: AtomicU64::new(0),
            last: Mutex::new((None, 0)),
        }
    }

    /// Count one occurrence, and call `log` with the number held back
    /// since the last line when a line is due.
    pub fn record(&self, log: impl FnOnce(u64)) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let due = {
            let mut last = self.last.lock();
            let now = Instant::now();
            match last.0 {
                Some(at) if now.duration_since(at) < self.interval => {
                    last.1 += 1;
                    None
                }
                _ => {
                    let held_back = last.1;
                    *last = (Some(now), 0);
                    Some(held_back)
                }
            }
        };
        if let Some(held_back) = due {
            log(held_back);
        }
    }

    /// Occurrences since start.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_held_back() {
        let log = EventLog::new(Duration::from_millis(50));
        let mut lines = Vec::new();
        for _ in 0..1000 {
            log.record(|held| lines.push(held));
        }
        assert_eq!(lines, vec![0]);
        std::thread::sleep(Duration::from_millis(60));
        log.record(|held| lines.push(held));
        assert_eq!(lines, vec![0, 999]);
        assert_eq!(log.total(), 1001);
    }
}
