//! The space of an open pool and of its volumes, in `/metrics`.

use stats::{Sample, SampleKind};

fn sample(
    name: &'static str,
    help: &'static str,
    kind: SampleKind,
    labels: Vec<(&'static str, String)>,
    value: u64,
) -> Sample {
    Sample {
        name,
        help,
        kind,
        labels,
        value,
    }
}

/// The samples of one pool, its volumes' after its own.
pub fn pool_samples(pool: &pool::Pool) -> Vec<Sample> {
    use SampleKind::{Counter, Gauge};
    let u = pool.usage();
    let at = || vec![("pool", pool.name().to_string())];
    let mut out = vec![
        sample(
            "openarray_pool_size_bytes",
            "Bytes the pool can hold",
            Gauge,
            at(),
            u.space.size(),
        ),
        sample(
            "openarray_pool_used_bytes",
            "Bytes of the pool's units that some volume maps",
            Gauge,
            at(),
            u.space.used(),
        ),
        sample(
            "openarray_pool_free_bytes",
            "Bytes of units free for new writes",
            Gauge,
            at(),
            u.space.free(),
        ),
        sample(
            "openarray_pool_held_bytes",
            "Bytes of freed units reusable after the next commit",
            Gauge,
            at(),
            u.space.held_units * u.space.unit_size,
        ),
        sample(
            "openarray_pool_referenced_bytes",
            "Bytes the volumes and snapshots map, a shared unit once per mapping",
            Gauge,
            at(),
            u.referenced,
        ),
        sample(
            "openarray_pool_provisioned_bytes",
            "Sum of the writable volumes' sizes (over the size: over-committed)",
            Gauge,
            at(),
            u.provisioned,
        ),
        sample(
            "openarray_pool_soft_threshold_reached",
            "Times the bytes in use rose to the pool's soft threshold",
            Counter,
            at(),
            u.threshold_reached,
        ),
        sample(
            "openarray_pool_allocation_failures",
            "Writes refused with SPACE ALLOCATION FAILED because no unit was free",
            Counter,
            at(),
            u.allocation_failures,
        ),
    ];
    if let Some(bytes) = u.soft_threshold {
        out.push(sample(
            "openarray_pool_soft_threshold_bytes",
            "Bytes in use at which initiators are told the soft threshold is reached",
            Gauge,
            at(),
            bytes,
        ));
    }
    for v in pool.volume_usage() {
        let labels = || {
            vec![
                ("pool", pool.name().to_string()),
                ("volume", v.name.clone()),
                (
                    "kind",
                    match v.kind {
                        pool::VolumeKind::Volume => "volume",
                        pool::VolumeKind::Snapshot => "snapshot",
                    }
                    .to_string(),
                ),
            ]
        };
        out.push(sample(
            "openarray_volume_size_bytes",
            "A volume's size",
            Gauge,
            labels(),
            v.size,
        ));
        out.push(sample(
            "openarray_volume_mapped_bytes",
            "Bytes of pool units a volume maps, shared ones included",
            Gauge,
            labels(),
            v.mapped,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use block::{BlockDevice, MemDevice};
    use pool::{MetadataLocation, Pool, SoftThreshold};

    use super::*;

    fn value(samples: &[Sample], name: &str, volume: Option<&str>) -> Option<u64> {
        samples
            .iter()
            .find(|s| {
                s.name == name
                    && volume.is_none_or(|v| s.labels.iter().any(|(k, x)| *k == "volume" && x == v))
            })
            .map(|s| s.value)
    }

    #[test]
    fn a_pool_and_its_volumes_are_sampled() {
        let unit = 4096;
        let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(5 * unit));
        let meta = MetadataLocation::Device(Arc::new(MemDevice::new(8 << 20)));
        let pool = Pool::create("tank", vec![data], &meta, unit).unwrap();
        pool.create_volume("v", 1 << 20).unwrap();
        let s = pool_samples(&pool);
        assert_eq!(value(&s, "openarray_pool_soft_threshold_bytes", None), None);
        pool.set_soft_threshold(Some(SoftThreshold::Percent(50)));
        let v = pool.volume("v").unwrap();
        for i in 0..5 {
            let _ = v.write_at(&[1; 4096], i * unit, false);
        }
        let s = pool_samples(&pool);
        assert_eq!(value(&s, "openarray_pool_size_bytes", None), Some(4 * unit));
        assert_eq!(value(&s, "openarray_pool_used_bytes", None), Some(4 * unit));
        assert_eq!(value(&s, "openarray_pool_free_bytes", None), Some(0));
        assert_eq!(
            value(&s, "openarray_pool_provisioned_bytes", None),
            Some(1 << 20)
        );
        assert_eq!(
            value(&s, "openarray_pool_soft_threshold_bytes", None),
            Some(2 * unit)
        );
        assert_eq!(
            value(&s, "openarray_pool_soft_threshold_reached", None),
            Some(1)
        );
        assert_eq!(
            value(&s, "openarray_pool_allocation_failures", None),
            Some(1)
        );
        assert_eq!(
            value(&s, "openarray_volume_mapped_bytes", Some("v")),
            Some(4 * unit)
        );
        assert_eq!(
            value(&s, "openarray_volume_size_bytes", Some("v")),
            Some(1 << 20)
        );
    }
}
