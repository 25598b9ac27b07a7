//! Operations long enough to report progress: preallocating a volume
//! (a thick volume) and deleting a large one. Each runs as a series of
//! committed steps, so the pool's lock is held for one step at a time
//! (I/O to other volumes goes on in between) and a crash loses at most
//! the step under way.

use std::io;

use crate::pool::Pool;
use crate::record::VolumeKind;

/// Units handled per committed step: 1 GiB at the default 64 KiB unit.
const STEP_UNITS: usize = 16 * 1024;

/// Told how far a long operation got: units done out of units to do.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

impl Pool {
    /// Deletes a volume or snapshot like [`Pool::delete`], unmapping its
    /// units in committed steps first. After a crash mid-way the volume
    /// still exists with part of its units unmapped; deleting it again
    /// finishes the job.
    pub fn delete_with_progress(&self, name: &str, progress: Progress) -> io::Result<()> {
        let (id, total) = {
            let st = self.state.read();
            let id = st.id_of(name)?;
            (id, st.volumes[&id].map.len() as u64)
        };
        // Refuse before unmapping anything (e.g. a volume with snapshots):
        // the checks of `delete` run on the whole volume, not on a step.
        self.refuse_delete(id, name)?;
        let mut done = 0;
        progress(done, total);
        loop {
            let unmapped = self.operate(|st| {
                let vol = st
                    .volumes
                    .get(&id)
                    .filter(|v| v.record.name == name)
                    .ok_or_else(|| gone(name))?;
                let step: Vec<u64> = vol.map.keys().take(STEP_UNITS).collect();
                for &vunit in &step {
                    st.set_mapping(id, vunit, None);
                }
                Ok(step.len() as u64)
            })?;
            if unmapped == 0 {
                break;
            }
            done += unmapped;
            progress(done.min(total), total);
        }
        self.delete(name)
    }

    /// Why deleting volume `id` would be refused, checked before the
    /// first step.
    fn refuse_delete(&self, id: u64, name: &str) -> io::Result<()> {
        let st = self.state.read();
        if st.volumes[&id].record.kind == VolumeKind::Snapshot {
            return Ok(());
        }
        let snaps: Vec<&str> = st
            .volumes
            .values()
            .filter(|v| v.record.parent == Some(id) && v.record.kind == VolumeKind::Snapshot)
            .map(|v| v.record.name.as_str())
            .collect();
        if snaps.is_empty() {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name} has snapshots: {}", snaps.join(", ")),
            ))
        }
    }

    /// Allocates every unmapped unit of a volume, filled with zeros, so
    /// that later writes never wait for an allocation and the space is
    /// set aside (a thick volume). Units mapped already are left alone;
    /// discards still free units afterwards.
    pub fn preallocate(&self, name: &str, progress: Progress) -> io::Result<()> {
        let unit_size = self.unit_size();
        let (id, units) = {
            let st = self.state.read();
            let id = st.id_of(name)?;
            let rec = &st.volumes[&id].record;
            if rec.kind != VolumeKind::Volume {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "only a volume can be preallocated",
                ));
            }
            (id, rec.size.div_ceil(unit_size))
        };
        let missing: Vec<u64> = {
            let st = self.state.read();
            let map = &st.volumes[&id].map;
            (0..units).filter(|v| !map.contains_key(v)).collect()
        };
        if missing.len() as u64 > self.space().free_units {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "{name} needs {} more units, the pool has {} free",
                    missing.len(),
                    self.space().free_units
                ),
            ));
        }
        let total = missing.len() as u64;
        let mut done = 0;
        progress(done, total);
        for step in missing.chunks(STEP_UNITS) {
            for &vunit in step {
                // Fill a reserved unit outside the lock, then map it unless
                // a write mapped this virtual unit meanwhile.
                let unit = self.state.write().space.reserve()?;
                let written = self.layout.allocate_zeroes(unit);
                let mut st = self.state.write();
                st.space.unreserve(unit);
                written?;
                let vol = st.volumes.get(&id).ok_or_else(|| gone(name))?;
                if !vol.map.contains_key(&vunit) {
                    st.set_mapping(id, vunit, Some(unit));
                }
            }
            self.flush()?;
            done += step.len() as u64;
            progress(done, total);
        }
        Ok(())
    }
}

fn gone(name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{name} was deleted meanwhile"),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use block::{BlockDevice, MemDevice};

    use crate::{MetadataLocation, Pool};

    const UNIT: u64 = 4096;

    fn pool(units: u64) -> Arc<Pool> {
        let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new((units + 1) * UNIT));
        let meta = MetadataLocation::Device(Arc::new(MemDevice::new(8 << 20)));
        Pool::create("p", vec![data], &meta, UNIT).unwrap()
    }

    #[test]
    fn preallocation_maps_every_unit_with_zeros_and_keeps_data() {
        let p = pool(64);
        p.create_volume("v", 10 * UNIT).unwrap();
        let v = p.volume("v").unwrap();
        v.write_at(&[7; 512], 3 * UNIT, false).unwrap();
        let mut seen = Vec::new();
        p.preallocate("v", &mut |d, t| seen.push((d, t))).unwrap();
        assert_eq!(seen.first(), Some(&(0, 9)));
        assert_eq!(seen.last(), Some(&(9, 9)));
        assert_eq!(p.volume_info("v").unwrap().mapped_units, 10);
        assert_eq!(p.space().used_units, 10);
        let mut buf = vec![1u8; (10 * UNIT) as usize];
        v.read_at(&mut buf, 0).unwrap();
        assert!(buf[..(3 * UNIT) as usize].iter().all(|&b| b == 0));
        assert_eq!(&buf[(3 * UNIT) as usize..][..512], &[7; 512][..]);
        assert!(p.check().unwrap().is_clean());
    }

    #[test]
    fn preallocation_beyond_the_free_space_is_refused_up_front() {
        let p = pool(8);
        p.create_volume("v", 20 * UNIT).unwrap();
        let err = p.preallocate("v", &mut |_, _| {}).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
        assert_eq!(p.space().used_units, 0);
    }

    #[test]
    fn stepwise_delete_frees_only_unshared_units_and_reports_progress() {
        let p = pool(64);
        p.create_volume("v", 20 * UNIT).unwrap();
        let v = p.volume("v").unwrap();
        v.write_at(&vec![5; (20 * UNIT) as usize], 0, false)
            .unwrap();
        p.snapshot("v", "s").unwrap();
        p.clone_snapshot("s", "c").unwrap();
        // A volume with snapshots is refused before anything is unmapped.
        assert!(p.delete_with_progress("v", &mut |_, _| {}).is_err());
        assert_eq!(p.volume_info("v").unwrap().mapped_units, 20);
        let c = p.volume("c").unwrap();
        c.write_at(&[9; 4096], 0, false).unwrap();
        let mut last = (0, 0);
        p.delete_with_progress("s", &mut |d, t| last = (d, t))
            .unwrap();
        assert_eq!(last, (20, 20));
        assert!(p.volume_info("s").is_err());
        // The volume and the clone still share 19 units; the clone's own
        // first unit is its own.
        assert_eq!(p.space().used_units, 21);
        p.delete_with_progress("c", &mut |_, _| {}).unwrap();
        p.flush().unwrap();
        assert_eq!(p.space().used_units, 20);
        let mut buf = vec![0u8; (20 * UNIT) as usize];
        v.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&b| b == 5));
        assert!(p.check().unwrap().is_clean());
    }
}
