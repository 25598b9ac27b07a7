//! A latency histogram with logarithmic buckets, updated with one relaxed
//! atomic addition per sample.
//!
//! Values below 2^SUB_BITS nanoseconds have a bucket each; above, every
//! power of two is split into 2^SUB_BITS equal buckets, so a bucket's width
//! is at most 1/16 of its lower bound and a percentile read from it is off
//! by less than 6.25%. The whole u64 range fits in [`BUCKETS`] buckets
//! (about 8 KiB), so no sample is ever clamped.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Buckets per power of two, as a power of two.
const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
/// Enough buckets for every u64 value.
pub const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB;

/// The bucket that holds `value`.
pub fn bucket_of(value: u64) -> usize {
    if value < SUB as u64 {
        return value as usize;
    }
    let exp = 63 - value.leading_zeros(); // >= SUB_BITS
    let shift = exp - SUB_BITS;
    let sub = ((value >> shift) as usize) & (SUB - 1);
    (shift as usize + 1) * SUB + sub
}

/// The smallest and largest value bucket `index` holds.
pub fn bucket_bounds(index: usize) -> (u64, u64) {
    if index < SUB {
        return (index as u64, index as u64);
    }
    let shift = (index / SUB - 1) as u32;
    let sub = (index % SUB) as u64;
    let low = (SUB as u64 + sub) << shift;
    (low, low + ((1u64 << shift) - 1))
}

/// Shared, lock-free histogram of latencies in nanoseconds.
pub struct LatencyHistogram {
    counts: Box<[AtomicU64]>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.snapshot().count())
            .finish()
    }
}

impl LatencyHistogram {
    pub fn record(&self, nanos: u64) {
        self.counts[bucket_of(nanos)].fetch_add(1, Ordering::Relaxed);
    }

    /// The non-empty buckets at this moment.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: self
                .counts
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    let n = c.load(Ordering::Relaxed);
                    (n > 0).then_some((i as u32, n))
                })
                .collect(),
        }
    }
}

/// Sparse bucket counts: `(bucket index, samples)` in rising index order.
/// Two snapshots of one histogram subtract to the samples between them,
/// which is how `openarray stat` shows percentiles per interval.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistogramSnapshot {
    pub buckets: Vec<(u32, u64)>,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|&(_, n)| n).sum()
    }

    /// The value at quantile `q` (0..=1) in nanoseconds: the upper bound of
    /// the bucket holding the sample of that rank (so it never understates),
    /// or `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        // The rank of the sample at q, 1-based: p99 of 1000 samples is the 990th.
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for &(index, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return Some(bucket_bounds(index as usize).1);
            }
        }
        None
    }

    /// The samples recorded after `earlier` was taken (buckets whose count
    /// did not grow are left out; a count that shrank counts as zero).
    pub fn since(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        let mut old = earlier.buckets.iter().peekable();
        let mut buckets = Vec::new();
        for &(index, n) in &self.buckets {
            while old.peek().is_some_and(|&&(i, _)| i < index) {
                old.next();
            }
            let before = match old.peek() {
                Some(&&(i, m)) if i == index => m,
                _ => 0,
            };
            if n > before {
                buckets.push((index, n - before));
            }
        }
        HistogramSnapshot { buckets }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut last = None;
        for v in (0..5000u64).chain([u64::MAX / 3, u64::MAX - 1, u64::MAX]) {
            let b = bucket_of(v);
            assert!(b < BUCKETS, "{v} -> {b}");
            let (low, high) = bucket_bounds(b);
            assert!(low <= v && v <= high, "{v} not in {low}..={high}");
            if let Some(prev) = last {
                assert!(b >= prev);
            }
            last = Some(b);
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        // Adjacent buckets touch without overlapping.
        for i in 1..BUCKETS {
            assert_eq!(bucket_bounds(i - 1).1 + 1, bucket_bounds(i).0, "bucket {i}");
        }
    }

    #[test]
    fn bucket_width_is_within_a_sixteenth() {
        for i in SUB..BUCKETS {
            let (low, high) = bucket_bounds(i);
            assert!((high - low) as f64 <= low as f64 / 16.0, "bucket {i}");
        }
    }

    #[test]
    fn percentiles_of_a_uniform_range() {
        let h = LatencyHistogram::default();
        for v in 1..=10_000u64 {
            h.record(v * 1000); // 1 us .. 10 ms
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 10_000);
        let near = |q: f64, want: f64| {
            let got = s.quantile(q).unwrap() as f64;
            assert!(
                got >= want && got <= want * 1.0625,
                "q{q}: got {got}, want about {want}"
            );
        };
        near(0.5, 5_000_000.0);
        near(0.99, 9_900_000.0);
        near(0.999, 9_990_000.0);
        near(1.0, 10_000_000.0);
        // The smallest sample's bucket, reported by its upper bound.
        assert_eq!(s.quantile(0.0), Some(bucket_bounds(bucket_of(1000)).1));
    }

    #[test]
    fn a_slow_tail_shows_in_p99_not_p50() {
        let h = LatencyHistogram::default();
        for _ in 0..985 {
            h.record(100_000);
        }
        for _ in 0..15 {
            h.record(50_000_000);
        }
        let s = h.snapshot();
        assert!(s.quantile(0.5).unwrap() < 110_000);
        assert!(s.quantile(0.99).unwrap() >= 50_000_000);
        assert!(s.quantile(0.98).unwrap() < 110_000);
    }

    #[test]
    fn empty_has_no_quantile() {
        assert_eq!(HistogramSnapshot::default().quantile(0.5), None);
        assert_eq!(LatencyHistogram::default().snapshot().count(), 0);
    }

    #[test]
    fn since_keeps_only_new_samples() {
        let h = LatencyHistogram::default();
        h.record(10);
        h.record(1_000_000);
        let first = h.snapshot();
        h.record(1_000_000);
        h.record(5_000);
        h.record(5_000);
        let delta = h.snapshot().since(&first);
        assert_eq!(delta.count(), 3);
        assert_eq!(
            delta.buckets,
            vec![
                (bucket_of(5_000) as u32, 2),
                (bucket_of(1_000_000) as u32, 1)
            ]
        );
        assert_eq!(
            delta.quantile(0.5).unwrap(),
            bucket_bounds(bucket_of(5_000)).1
        );
        assert!(h.snapshot().since(&h.snapshot()).buckets.is_empty());
    }
}
