//! What a pool says about its space: the soft threshold and when the
//! space in use rises to it, writes refused for want of a unit (logged at
//! most once per interval), and how far the volumes' sizes over-commit
//! the pool.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use block::SpaceThreshold;
use peer_limits::EventLog;

use crate::pool::{Pool, PoolSpace, State};
use crate::record::VolumeKind;

/// A write refused for want of a unit is logged at most this often.
pub(crate) const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The soft threshold as configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SoftThreshold {
    /// Percent of the pool's units, 1 to 100.
    Percent(u8),
    Bytes(u64),
}

impl SoftThreshold {
    /// The threshold in units of a pool of `total` units of `unit` bytes:
    /// rounded up, at least one unit and at most the pool.
    pub fn units(self, total: u64, unit: u64) -> u64 {
        let units = match self {
            SoftThreshold::Percent(p) => (u128::from(total) * u128::from(p)).div_ceil(100) as u64,
            SoftThreshold::Bytes(b) => b.div_ceil(unit),
        };
        units.clamp(1, total.max(1))
    }
}

/// The space a pool holds against what its volumes may come to need.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolUsage {
    pub space: PoolSpace,
    /// Sum of the sizes of the writable volumes (snapshots never grow).
    pub provisioned: u64,
    /// Bytes the volumes and snapshots map, a shared unit once per mapping.
    pub referenced: u64,
    /// Bytes in use at which the soft threshold is reached.
    pub soft_threshold: Option<u64>,
    /// Times the space in use rose to the soft threshold.
    pub threshold_reached: u64,
    /// Writes refused because no unit was free.
    pub allocation_failures: u64,
    pub max_overcommit: Option<f64>,
}

impl PoolUsage {
    /// Provisioned bytes per byte of pool: above 1 the pool is
    /// over-committed.
    pub fn overcommit(&self) -> f64 {
        ratio(self.provisioned, self.space.size())
    }
}

fn ratio(provisioned: u64, capacity: u64) -> f64 {
    if capacity == 0 {
        return 0.0;
    }
    provisioned as f64 / capacity as f64
}

/// One volume's share of the pool, cheap to take (no walk of its map).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeUsage {
    pub name: String,
    pub kind: VolumeKind,
    pub size: u64,
    pub mapped: u64,
}

/// The limits set on a pool, kept under its state lock.
pub(crate) struct Limits {
    pool: String,
    /// Units in use at which the soft threshold is reached; `u64::MAX`
    /// when none is set, so the check on allocation is one compare.
    threshold_units: u64,
    pub shared: Arc<SpaceThreshold>,
    pub max_overcommit: Option<f64>,
}

impl Limits {
    pub fn new(pool: &str, total_units: u64, unit_size: u64) -> Limits {
        Limits {
            pool: pool.to_string(),
            threshold_units: u64::MAX,
            shared: Arc::new(SpaceThreshold::new(total_units * unit_size, unit_size)),
            max_overcommit: None,
        }
    }

    /// The units in use rose by one to `used`: reaching the threshold from
    /// below is an event; dropping below it arms the next one.
    pub fn rose_to(&self, used: u64) {
        if used == self.threshold_units {
            self.reached(used);
        }
    }

    fn reached(&self, used: u64) {
        self.shared.note_reached();
        let unit = self.shared.granularity();
        tracing::warn!(
            pool = %self.pool,
            used = used * unit,
            threshold = self.threshold_units * unit,
            size = self.shared.capacity(),
            "pool reached its soft threshold"
        );
    }

    /// A new threshold (in units); reached at once if the pool is already
    /// at or past it and was below the one before.
    pub fn set_threshold(&mut self, units: Option<u64>, used: u64) {
        let old = self.threshold_units;
        let new = units.unwrap_or(u64::MAX);
        if new == old {
            return;
        }
        self.threshold_units = new;
        let unit = self.shared.granularity();
        self.shared.set_bytes(units.map(|u| u * unit));
        if used >= new && used < old {
            self.reached(used);
        }
    }

    /// Refuses a change that takes the writable volumes' sizes from
    /// `before` to `after` bytes beyond the over-commit limit; growth up to
    /// the limit, and shrinking (even while beyond it), always go.
    pub fn check_overcommit(&self, before: u64, after: u64) -> io::Result<()> {
        let Some(max) = self.max_overcommit else {
            return Ok(());
        };
        let capacity = self.shared.capacity();
        let now = ratio(after, capacity);
        if after <= before || now <= max {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::StorageFull,
            format!(
                "pool {} would be over-committed {now:.2}× ({after} bytes of volumes on {capacity} bytes), beyond its max_overcommit of {max}",
                self.pool
            ),
        ))
    }
}

impl State {
    /// Sum of the writable volumes' sizes.
    pub(crate) fn provisioned(&self) -> u64 {
        self.volumes
            .values()
            .filter(|v| v.record.kind == VolumeKind::Volume)
            .map(|v| v.record.size)
            .sum()
    }
}

impl Pool {
    /// Sets the soft threshold (`None`: none). Every volume of the pool
    /// reports it, and tells its initiators when the space in use rises
    /// to it.
    pub fn set_soft_threshold(&self, threshold: Option<SoftThreshold>) {
        let mut st = self.state.write();
        let total = st.space.total();
        let units = threshold.map(|t| t.units(total, self.unit_size()));
        let used = st.space.used();
        st.limits.set_threshold(units, used);
    }

    /// Sets the most the writable volumes' sizes may add up to, per byte
    /// of pool (`None`: no limit). Volumes already beyond it stay.
    pub fn set_max_overcommit(&self, max: Option<f64>) {
        self.state.write().limits.max_overcommit = max;
    }

    /// The threshold every volume of this pool shares.
    pub fn space_threshold(&self) -> Arc<SpaceThreshold> {
        self.state.read().limits.shared.clone()
    }

    pub fn usage(&self) -> PoolUsage {
        let space = self.space();
        let st = self.state.read();
        let referenced: u64 = st.volumes.values().map(|v| v.map.len() as u64).sum();
        PoolUsage {
            space,
            provisioned: st.provisioned(),
            referenced: referenced * space.unit_size,
            soft_threshold: st.limits.shared.bytes(),
            threshold_reached: st.limits.shared.reached(),
            allocation_failures: self.allocation_failures.total(),
            max_overcommit: st.limits.max_overcommit,
        }
    }

    /// Every volume and snapshot with its size and mapped bytes.
    pub fn volume_usage(&self) -> Vec<VolumeUsage> {
        let unit = self.unit_size();
        let st = self.state.read();
        st.volumes
            .values()
            .map(|v| VolumeUsage {
                name: v.record.name.clone(),
                kind: v.record.kind,
                size: v.record.size,
                mapped: v.map.len() as u64 * unit,
            })
            .collect()
    }

    /// A write to `volume` found no free unit.
    pub(crate) fn allocation_failed(&self, volume: &str) {
        let space = self.space();
        self.allocation_failures.record(|held_back| {
            tracing::warn!(
                pool = %self.name(),
                volume = %volume,
                used = space.used(),
                held = space.held_units * space.unit_size,
                size = space.size(),
                held_back,
                "pool is full: a write that needs a new unit failed (SPACE ALLOCATION FAILED WRITE PROTECT)"
            );
        });
    }

    pub(crate) fn new_failure_log() -> EventLog {
        EventLog::new(FAILURE_LOG_INTERVAL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_round_up_to_whole_units_within_the_pool() {
        assert_eq!(SoftThreshold::Percent(80).units(100, 65536), 80);
        assert_eq!(SoftThreshold::Percent(80).units(7, 65536), 6);
        assert_eq!(SoftThreshold::Percent(100).units(7, 65536), 7);
        assert_eq!(SoftThreshold::Percent(1).units(7, 65536), 1);
        assert_eq!(SoftThreshold::Bytes(65537).units(100, 65536), 2);
        assert_eq!(SoftThreshold::Bytes(1).units(100, 65536), 1);
        assert_eq!(SoftThreshold::Bytes(u64::MAX).units(100, 65536), 100);
    }

    #[test]
    fn the_threshold_is_reached_once_per_rise_from_below() {
        let mut l = Limits::new("p", 10, 4096);
        l.set_threshold(Some(3), 0);
        assert_eq!(l.shared.bytes(), Some(3 * 4096));
        for used in 1..=5 {
            l.rose_to(used);
        }
        assert_eq!(l.shared.reached(), 1);
        // Down to 2 (below) and up again: armed again.
        l.rose_to(3);
        assert_eq!(l.shared.reached(), 2);
        // A threshold set at or below what is in use is reached at once,
        // unless the one before was reached already.
        l.set_threshold(Some(2), 3);
        assert_eq!(l.shared.reached(), 2);
        l.set_threshold(None, 3);
        assert_eq!(l.shared.bytes(), None);
        l.set_threshold(Some(3), 3);
        assert_eq!(l.shared.reached(), 3);
    }

    #[test]
    fn overcommit_is_refused_only_beyond_the_limit_and_only_when_growing() {
        let mut l = Limits::new("p", 16, 65536);
        let cap = 1 << 20;
        assert!(l.check_overcommit(0, 100 * cap).is_ok(), "no limit");
        l.max_overcommit = Some(2.0);
        assert!(l.check_overcommit(0, 2 * cap).is_ok());
        let e = l.check_overcommit(2 * cap, 2 * cap + 512).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert!(e.to_string().contains("max_overcommit of 2"), "{e}");
        assert!(l.check_overcommit(5 * cap, 4 * cap).is_ok(), "shrinking");
    }
}
