//! A cache device in `/metrics`.

use cache::CacheStatus;
use stats::{Sample, SampleKind};

/// The samples of cache `name`.
pub fn cache_samples(name: &str, s: &CacheStatus) -> Vec<Sample> {
    use SampleKind::{Counter, Gauge};
    let sample = |metric, help, kind, value, extra: Option<(&'static str, &str)>| {
        let mut labels = vec![("cache", name.to_string())];
        if let Some((k, v)) = extra {
            labels.push((k, v.to_string()));
        }
        Sample {
            name: metric,
            help,
            kind,
            labels,
            value,
        }
    };
    const HIT: &str = "openarray_cache_hit_bytes";
    const HIT_HELP: &str = "Bytes read or written that the cache held";
    const MISS: &str = "openarray_cache_miss_bytes";
    const MISS_HELP: &str = "Bytes read or written that the cache did not hold";
    vec![
        sample(
            HIT,
            HIT_HELP,
            Counter,
            s.reads.hit_bytes,
            Some(("op", "read")),
        ),
        sample(
            HIT,
            HIT_HELP,
            Counter,
            s.writes.hit_bytes,
            Some(("op", "write")),
        ),
        sample(
            MISS,
            MISS_HELP,
            Counter,
            s.reads.miss_bytes,
            Some(("op", "read")),
        ),
        sample(
            MISS,
            MISS_HELP,
            Counter,
            s.writes.miss_bytes,
            Some(("op", "write")),
        ),
        sample(
            "openarray_cache_dirty_bytes",
            "Bytes on the cache device not yet written back",
            Gauge,
            s.dirty_bytes,
            None,
        ),
        sample(
            "openarray_cache_written_back_bytes",
            "Bytes written back to the backing",
            Counter,
            s.writeback.written_bytes,
            None,
        ),
        sample(
            "openarray_cache_writeback_rate_bytes",
            "Bytes a second written back over the last seconds",
            Gauge,
            s.writeback.rate_bytes_per_sec,
            None,
        ),
        sample(
            "openarray_cache_evictions",
            "Cache lines evicted to make room",
            Counter,
            s.evictions,
            None,
        ),
        sample(
            "openarray_cache_lines",
            "Cache lines the cache device holds",
            Gauge,
            s.lines,
            None,
        ),
        sample(
            "openarray_cache_occupied_lines",
            "Cache lines holding data",
            Gauge,
            s.occupied_lines,
            None,
        ),
        sample(
            "openarray_cache_bypassed_ios",
            "I/Os that went around the cache (sequential streams past the cutoff)",
            Counter,
            s.bypassed_ios,
            None,
        ),
        sample(
            "openarray_cache_bypassed_bytes",
            "Bytes that went around the cache",
            Counter,
            s.bypassed_bytes,
            None,
        ),
        sample(
            "openarray_cache_failed",
            "1 when the cache device failed and the backing serves alone",
            Gauge,
            u64::from(!matches!(s.health, cache::Health::Ok)),
            None,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use block::{BlockDevice, MemDevice};
    use cache::{CacheDevice, CacheOptions, Mode};

    use super::*;

    #[test]
    fn a_cache_is_sampled() {
        let ssd: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 << 20));
        let hdd: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(32 << 20));
        let mut options = CacheOptions::new("hdd");
        options.mode = Mode::WriteBack;
        options.background = false;
        let dev = CacheDevice::open(ssd, hdd, options).unwrap();
        dev.write_at(&[1; 8192], 0, false).unwrap();
        dev.read_at(&mut [0; 4096], 0).unwrap();
        let s = cache_samples("hybrid", &dev.status());
        let value = |name: &str, op: Option<&str>| {
            s.iter()
                .find(|x| x.name == name && op.is_none_or(|o| x.labels.iter().any(|(_, v)| v == o)))
                .map(|x| x.value)
        };
        assert_eq!(value("openarray_cache_dirty_bytes", None), Some(8192));
        assert_eq!(value("openarray_cache_hit_bytes", Some("read")), Some(4096));
        assert_eq!(value("openarray_cache_failed", None), Some(0));
        assert!(s
            .iter()
            .all(|x| x.labels[0] == ("cache", "hybrid".to_string())));
    }
}
