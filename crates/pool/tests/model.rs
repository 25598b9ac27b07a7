//! The pool engine against a model: random writes, discards, snapshots,
//! clones, rollbacks, resizes, deletes, flushes and reopens, then every
//! volume's content and the unit ownership are checked.

use std::collections::BTreeMap;
use std::sync::Arc;

use block::{BlockDevice, MemDevice};
use pool::{MetadataLocation, Pool, VolumeKind};
use proptest::prelude::*;

const UNIT: u64 = 4096;
const VOL_SIZE: u64 = 6 * UNIT;

#[derive(Clone, Debug)]
enum Op {
    Write {
        vol: usize,
        offset: u64,
        len: u64,
        byte: u8,
    },
    Discard {
        vol: usize,
        offset: u64,
        len: u64,
    },
    Snapshot {
        vol: usize,
    },
    Clone {
        vol: usize,
    },
    Rollback {
        vol: usize,
        snap: usize,
    },
    Resize {
        vol: usize,
        grow: u64,
    },
    Delete {
        vol: usize,
    },
    Flush,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let range = (0..VOL_SIZE / 512, 1..3 * UNIT / 512).prop_map(|(o, l)| (o * 512, l * 512));
    prop_oneof![
        6 => (any::<usize>(), range.clone(), any::<u8>())
            .prop_map(|(vol, (offset, len), byte)| Op::Write { vol, offset, len, byte }),
        2 => (any::<usize>(), range).prop_map(|(vol, (offset, len))| Op::Discard { vol, offset, len }),
        1 => any::<usize>().prop_map(|vol| Op::Snapshot { vol }),
        1 => any::<usize>().prop_map(|vol| Op::Clone { vol }),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(vol, snap)| Op::Rollback { vol, snap }),
        1 => (any::<usize>(), 1..4u64).prop_map(|(vol, grow)| Op::Resize { vol, grow }),
        1 => any::<usize>().prop_map(|vol| Op::Delete { vol }),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

struct ModelVolume {
    kind: VolumeKind,
    parent: Option<String>,
    data: Vec<u8>,
}

struct Harness {
    data: Arc<dyn BlockDevice>,
    meta: MetadataLocation,
    pool: Option<Arc<Pool>>,
    model: BTreeMap<String, ModelVolume>,
    next: u32,
}

impl Harness {
    fn new() -> Harness {
        let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(65 * UNIT));
        let meta = MetadataLocation::Device(Arc::new(MemDevice::new(16 << 20)));
        let pool = Pool::create("m", vec![data.clone()], &meta, UNIT).unwrap();
        let mut h = Harness {
            data,
            meta,
            pool: Some(pool),
            model: BTreeMap::new(),
            next: 0,
        };
        for _ in 0..2 {
            let name = h.fresh();
            h.pool
                .as_ref()
                .unwrap()
                .create_volume(&name, VOL_SIZE)
                .unwrap();
            h.model.insert(
                name,
                ModelVolume {
                    kind: VolumeKind::Volume,
                    parent: None,
                    data: vec![0; VOL_SIZE as usize],
                },
            );
        }
        h
    }

    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("v{}", self.next)
    }

    fn pick(&self, i: usize, kind: Option<VolumeKind>) -> Option<String> {
        let names: Vec<&String> = self
            .model
            .iter()
            .filter(|(_, v)| kind.is_none_or(|k| v.kind == k))
            .map(|(n, _)| n)
            .collect();
        (!names.is_empty()).then(|| names[i % names.len()].clone())
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Write {
                vol,
                offset,
                len,
                byte,
            } => {
                let Some(name) = self.pick(vol, Some(VolumeKind::Volume)) else {
                    return;
                };
                let m = self.model.get_mut(&name).unwrap();
                let size = m.data.len() as u64;
                if offset >= size {
                    return;
                }
                let len = len.min(size - offset);
                let dev = self.pool.as_ref().unwrap().volume(&name).unwrap();
                let range = offset as usize..(offset + len) as usize;
                match dev.write_at(&vec![byte; len as usize], offset, byte % 7 == 0) {
                    Ok(()) => m.data[range].fill(byte),
                    Err(e) => {
                        // Out of space: each sector holds the old or the new bytes.
                        assert_eq!(e.kind(), std::io::ErrorKind::StorageFull);
                        let mut got = vec![0u8; len as usize];
                        dev.read_at(&mut got, offset).unwrap();
                        for (i, (g, o)) in got
                            .chunks(512)
                            .zip(m.data[range.clone()].chunks(512))
                            .enumerate()
                        {
                            assert!(
                                g == o || g.iter().all(|&b| b == byte),
                                "sector {i} of a failed write is torn"
                            );
                        }
                        m.data[range].copy_from_slice(&got);
                    }
                }
            }
            Op::Discard { vol, offset, len } => {
                let Some(name) = self.pick(vol, Some(VolumeKind::Volume)) else {
                    return;
                };
                let m = self.model.get_mut(&name).unwrap();
                let size = m.data.len() as u64;
                if offset >= size {
                    return;
                }
                let len = len.min(size - offset);
                let dev = self.pool.as_ref().unwrap().volume(&name).unwrap();
                let range = offset as usize..(offset + len) as usize;
                match dev.discard(offset, len) {
                    Ok(()) => m.data[range].fill(0),
                    Err(e) => {
                        // Zeroing part of a shared unit copies it, which may
                        // find the pool full.
                        assert_eq!(e.kind(), std::io::ErrorKind::StorageFull);
                        let mut got = vec![0u8; len as usize];
                        dev.read_at(&mut got, offset).unwrap();
                        m.data[range].copy_from_slice(&got);
                    }
                }
            }
            Op::Snapshot { vol } => {
                let Some(name) = self.pick(vol, Some(VolumeKind::Volume)) else {
                    return;
                };
                let snap = self.fresh();
                self.pool.as_ref().unwrap().snapshot(&name, &snap).unwrap();
                let data = self.model[&name].data.clone();
                self.model.insert(
                    snap,
                    ModelVolume {
                        kind: VolumeKind::Snapshot,
                        parent: Some(name),
                        data,
                    },
                );
            }
            Op::Clone { vol } => {
                let Some(snap) = self.pick(vol, Some(VolumeKind::Snapshot)) else {
                    return;
                };
                let name = self.fresh();
                self.pool
                    .as_ref()
                    .unwrap()
                    .clone_snapshot(&snap, &name)
                    .unwrap();
                let data = self.model[&snap].data.clone();
                self.model.insert(
                    name,
                    ModelVolume {
                        kind: VolumeKind::Volume,
                        parent: Some(snap),
                        data,
                    },
                );
            }
            Op::Rollback { vol, snap } => {
                let Some(name) = self.pick(vol, Some(VolumeKind::Volume)) else {
                    return;
                };
                let snaps: Vec<String> = self
                    .model
                    .iter()
                    .filter(|(_, v)| {
                        v.kind == VolumeKind::Snapshot && v.parent.as_ref() == Some(&name)
                    })
                    .map(|(n, _)| n.clone())
                    .collect();
                if snaps.is_empty() {
                    assert!(self
                        .pool
                        .as_ref()
                        .unwrap()
                        .rollback(&name, "nothing")
                        .is_err());
                    return;
                }
                let s = &snaps[snap % snaps.len()];
                self.pool.as_ref().unwrap().rollback(&name, s).unwrap();
                let from = self.model[s].data.clone();
                let m = self.model.get_mut(&name).unwrap();
                m.data.fill(0);
                m.data[..from.len()].copy_from_slice(&from);
            }
            Op::Resize { vol, grow } => {
                let Some(name) = self.pick(vol, Some(VolumeKind::Volume)) else {
                    return;
                };
                let m = self.model.get_mut(&name).unwrap();
                if m.data.len() as u64 > 3 * VOL_SIZE {
                    return;
                }
                let size = m.data.len() as u64 + grow * 1536;
                self.pool.as_ref().unwrap().resize(&name, size).unwrap();
                m.data.resize(size as usize, 0);
            }
            Op::Delete { vol } => {
                let Some(name) = self.pick(vol, None) else {
                    return;
                };
                let has_snaps = self
                    .model
                    .values()
                    .any(|v| v.kind == VolumeKind::Snapshot && v.parent.as_ref() == Some(&name));
                let is_volume = self.model[&name].kind == VolumeKind::Volume;
                let result = self.pool.as_ref().unwrap().delete(&name);
                if is_volume && has_snaps {
                    assert!(result.is_err());
                    return;
                }
                result.unwrap();
                self.model.remove(&name);
                for v in self.model.values_mut() {
                    if v.parent.as_ref() == Some(&name) {
                        v.parent = None;
                    }
                }
            }
            Op::Flush => self.pool.as_ref().unwrap().flush().unwrap(),
            Op::Reopen => {
                self.pool.as_ref().unwrap().flush().unwrap();
                // The store must be closed before it is opened again.
                self.pool = None;
                self.pool = Some(Pool::open("m", vec![self.data.clone()], &self.meta).unwrap());
            }
        }
    }

    fn verify(&self) {
        let infos = self.pool.as_ref().unwrap().volumes();
        assert_eq!(infos.len(), self.model.len());
        let mut mapped = 0;
        for info in infos {
            let m = &self.model[&info.name];
            assert_eq!(info.kind, m.kind, "{}", info.name);
            assert_eq!(info.parent, m.parent, "{}", info.name);
            let dev = self.pool.as_ref().unwrap().volume(&info.name).unwrap();
            assert_eq!(dev.size(), m.data.len() as u64);
            let mut got = vec![0xEE; m.data.len()];
            dev.read_at(&mut got, 0).unwrap();
            assert!(got == m.data, "content of {} differs", info.name);
            mapped += info.mapped_units;
        }
        let report = self.pool.as_ref().unwrap().check().unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
        let space = self.pool.as_ref().unwrap().space();
        assert!(space.used_units <= mapped);
        assert_eq!(
            space.used_units + space.held_units + space.free_units,
            space.total_units
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn pool_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        let mut h = Harness::new();
        for op in &ops {
            h.apply(op);
        }
        h.verify();
        // Everything is durable after a flush: reopen and look again.
        h.apply(&Op::Reopen);
        h.verify();
        // Deleting everything gives every unit back.
        let snaps: Vec<String> = h.model.iter().filter(|(_, v)| v.kind == VolumeKind::Snapshot).map(|(n, _)| n.clone()).collect();
        for n in snaps.into_iter().chain(h.model.keys().cloned().collect::<Vec<_>>()) {
            if h.model.contains_key(&n) {
                h.pool.as_ref().unwrap().delete(&n).unwrap();
                h.model.remove(&n);
            }
        }
        h.pool.as_ref().unwrap().flush().unwrap();
        let s = h.pool.as_ref().unwrap().space();
        prop_assert_eq!((s.used_units, s.free_units), (0, s.total_units));
        prop_assert!(h.pool.as_ref().unwrap().check().unwrap().is_clean());
    }
}
