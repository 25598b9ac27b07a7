//! What an administrator does to volumes: create them, snapshot and clone
//! them, roll back, refresh and promote clones, delete and resize. Each is
//! one metadata transaction (`Pool::operate`).

use std::io;

use super::{invalid, Pool};
use crate::record::{VolumeInfo, VolumeKind, VolumeRecord};

impl Pool {
    /// A new, empty (all zeros) volume of `size` bytes.
    pub fn create_volume(&self, name: &str, size: u64) -> io::Result<VolumeInfo> {
        if size == 0 || !size.is_multiple_of(512) {
            return Err(invalid("a volume size is a positive multiple of 512"));
        }
        self.operate(|st| {
            st.name_free(name)?;
            let provisioned = st.provisioned();
            st.limits
                .check_overcommit(provisioned, provisioned.saturating_add(size))?;
            let id = st.new_id();
            st.put_record(
                id,
                VolumeRecord {
                    name: name.to_string(),
                    kind: VolumeKind::Volume,
                    size,
                    parent: None,
                },
            );
            st.info_of(id)
        })
    }

    /// A read-only image of `volume` as of now.
    pub fn snapshot(&self, volume: &str, name: &str) -> io::Result<VolumeInfo> {
        self.derive(volume, name, VolumeKind::Volume, VolumeKind::Snapshot)
    }

    /// A writable volume starting as a copy of `snapshot`.
    pub fn clone_snapshot(&self, snapshot: &str, name: &str) -> io::Result<VolumeInfo> {
        self.derive(snapshot, name, VolumeKind::Snapshot, VolumeKind::Volume)
    }

    /// A new `kind` named `name` sharing every unit of `source`, which must
    /// be a `from`; its parent is `source`.
    fn derive(
        &self,
        source: &str,
        name: &str,
        from: VolumeKind,
        kind: VolumeKind,
    ) -> io::Result<VolumeInfo> {
        self.operate(|st| {
            let src = st.id_of(source)?;
            let rec = st.volumes[&src].record.clone();
            if rec.kind != from {
                return Err(invalid(match from {
                    VolumeKind::Volume => "only a volume can be snapshotted",
                    VolumeKind::Snapshot => "only a snapshot can be cloned",
                }));
            }
            st.name_free(name)?;
            if kind == VolumeKind::Volume {
                // A new writable volume counts against the over-commit.
                let provisioned = st.provisioned();
                st.limits
                    .check_overcommit(provisioned, provisioned.saturating_add(rec.size))?;
            }
            let id = st.new_id();
            let record = VolumeRecord {
                name: name.to_string(),
                kind,
                size: rec.size,
                parent: Some(src),
            };
            st.copy_volume(src, id, record);
            st.info_of(id)
        })
    }

    /// Makes `volume` read as `snapshot` (one of its own snapshots) again.
    pub fn rollback(&self, volume: &str, snapshot: &str) -> io::Result<()> {
        self.operate(|st| {
            let vol = st.id_of(volume)?;
            let snap = st.id_of(snapshot)?;
            let srec = &st.volumes[&snap].record;
            if srec.kind != VolumeKind::Snapshot || srec.parent != Some(vol) {
                return Err(invalid(&format!(
                    "{snapshot} is not a snapshot of {volume}"
                )));
            }
            st.map_as(vol, snap);
            Ok(())
        })
    }

    /// Makes clone `clone` a fresh clone of `snapshot` (a snapshot of the
    /// same size, usually a newer one of the same origin): its own writes
    /// are dropped and it reads as the snapshot, under the same name and
    /// identity, so a LUN serving it keeps serving it.
    pub fn refresh_clone(&self, clone: &str, snapshot: &str) -> io::Result<()> {
        self.operate(|st| {
            let c = st.id_of(clone)?;
            let snap = st.id_of(snapshot)?;
            let crec = st.volumes[&c].record.clone();
            let srec = &st.volumes[&snap].record;
            if crec.kind != VolumeKind::Volume || crec.parent.is_none() {
                return Err(invalid(&format!("{clone} is not a clone")));
            }
            if srec.kind != VolumeKind::Snapshot {
                return Err(invalid(&format!("{snapshot} is not a snapshot")));
            }
            if srec.size != crec.size {
                return Err(invalid(&format!(
                    "{snapshot} has {} bytes and {clone} {}: a refresh keeps the size",
                    srec.size, crec.size
                )));
            }
            if st.volumes.values().any(|v| v.record.parent == Some(c)) {
                return Err(invalid(&format!(
                    "{clone} has snapshots or clones of its own"
                )));
            }
            st.map_as(c, snap);
            st.put_record(
                c,
                VolumeRecord {
                    parent: Some(snap),
                    ..crec
                },
            );
            Ok(())
        })
    }

    /// Swaps the lineage of a clone and its origin: the clone's source
    /// snapshot, and the origin's older snapshots, become snapshots of the
    /// clone, and the origin becomes a clone of that snapshot. Data is not
    /// touched: shared units are reference counted either way.
    pub fn promote(&self, clone: &str) -> io::Result<()> {
        self.operate(|st| {
            let c = st.id_of(clone)?;
            let crec = st.volumes[&c].record.clone();
            let snap = match (crec.kind, crec.parent) {
                (VolumeKind::Volume, Some(s)) => s,
                _ => return Err(invalid(&format!("{clone} is not a clone"))),
            };
            let origin = st.volumes.get(&snap).and_then(|s| s.record.parent);
            let moved: Vec<u64> = st
                .volumes
                .iter()
                .filter(|(&id, v)| {
                    v.record.kind == VolumeKind::Snapshot
                        && v.record.parent == origin
                        && origin.is_some()
                        && id <= snap
                })
                .map(|(&id, _)| id)
                .collect();
            let origin_parent = origin.and_then(|o| st.volumes[&o].record.parent);
            for id in moved {
                let mut r = st.volumes[&id].record.clone();
                r.parent = Some(c);
                st.put_record(id, r);
            }
            let mut r = crec;
            r.parent = origin_parent;
            st.put_record(c, r);
            if let Some(o) = origin {
                let mut r = st.volumes[&o].record.clone();
                r.parent = Some(snap);
                st.put_record(o, r);
            }
            Ok(())
        })
    }

    /// Deletes a volume or snapshot, freeing the units no one else maps.
    /// A volume with snapshots is kept (delete them first).
    pub fn delete(&self, name: &str) -> io::Result<()> {
        self.operate(|st| {
            let id = st.id_of(name)?;
            let kind = st.volumes[&id].record.kind;
            let children: Vec<u64> = st
                .volumes
                .iter()
                .filter(|(_, v)| v.record.parent == Some(id))
                .map(|(&c, _)| c)
                .collect();
            if kind == VolumeKind::Volume {
                let snaps: Vec<String> = children
                    .iter()
                    .filter(|c| st.volumes[c].record.kind == VolumeKind::Snapshot)
                    .map(|c| st.volumes[c].record.name.clone())
                    .collect();
                if !snaps.is_empty() {
                    return Err(invalid(&format!(
                        "{name} has snapshots: {}",
                        snaps.join(", ")
                    )));
                }
            }
            for c in children {
                let mut r = st.volumes[&c].record.clone();
                r.parent = None;
                st.put_record(c, r);
            }
            let vunits: Vec<u64> = st.volumes[&id].map.keys().collect();
            for vunit in vunits {
                st.set_mapping(id, vunit, None);
            }
            st.volumes.remove(&id);
            st.dirty.maps.retain(|&(v, _), _| v != id);
            st.dirty.volumes.insert(id, None);
            Ok(())
        })
    }

    /// Grows a volume (the new space reads as zeros) or shrinks it to a
    /// whole number of units, freeing the units beyond its new end. A
    /// size inside a unit is refused when shrinking: the rest of that unit
    /// would keep old data that a later growth would show.
    pub fn resize(&self, name: &str, size: u64) -> io::Result<()> {
        if size == 0 || !size.is_multiple_of(512) {
            return Err(invalid("a volume size is a positive multiple of 512"));
        }
        let unit_size = self.unit_size();
        self.operate(|st| {
            let id = st.id_of(name)?;
            let mut r = st.volumes[&id].record.clone();
            if r.kind != VolumeKind::Volume {
                return Err(invalid("a snapshot cannot be resized"));
            }
            let provisioned = st.provisioned();
            st.limits
                .check_overcommit(provisioned, provisioned - r.size + size)?;
            if size < r.size {
                if !size.is_multiple_of(unit_size) {
                    return Err(invalid(&format!(
                        "a volume shrinks to a multiple of the pool's {unit_size}-byte unit"
                    )));
                }
                let first_beyond = size / unit_size;
                let beyond: Vec<u64> = st.volumes[&id]
                    .map
                    .keys()
                    .filter(|&v| v >= first_beyond)
                    .collect();
                for vunit in beyond {
                    st.set_mapping(id, vunit, None);
                }
            }
            r.size = size;
            st.put_record(id, r);
            Ok(())
        })
    }
}
