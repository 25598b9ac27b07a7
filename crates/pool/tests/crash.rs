//! Power cuts: data and metadata devices that lose every write since their
//! last flush. After each cut the pool reopens, every write acknowledged
//! before the last completed flush (or written with FUA) reads back
//! exactly, later writes read as either their data or what was there, and
//! the unit ownership checks clean.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

use block::{BlockDevice, FaultyDevice, MemDevice};
use pool::{MetadataLocation, Pool};
use proptest::prelude::*;

const UNIT: u64 = 4096;
const SECTOR: u64 = 512;
const VOL_SIZE: u64 = 8 * UNIT;
const SECTORS: usize = (VOL_SIZE / SECTOR) as usize;

#[derive(Clone, Debug)]
enum Op {
    Write {
        vol: usize,
        offset: u64,
        len: u64,
        byte: u8,
        fua: bool,
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
        snap: usize,
    },
    Delete {
        vol: usize,
    },
    Flush,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    let range =
        (0..VOL_SIZE / SECTOR, 1..3 * UNIT / SECTOR).prop_map(|(o, l)| (o * SECTOR, l * SECTOR));
    prop_oneof![
        8 => (any::<usize>(), range.clone(), 1..=255u8, proptest::bool::weighted(0.15))
            .prop_map(|(vol, (offset, len), byte, fua)| Op::Write { vol, offset, len, byte, fua }),
        2 => (any::<usize>(), range)
            .prop_map(|(vol, (offset, len))| Op::Discard { vol, offset, len }),
        1 => any::<usize>().prop_map(|vol| Op::Snapshot { vol }),
        1 => any::<usize>().prop_map(|snap| Op::Clone { snap }),
        1 => any::<usize>().prop_map(|vol| Op::Delete { vol }),
        2 => Just(Op::Flush),
        2 => Just(Op::Crash),
    ]
}

/// What a volume must read after a cut: per sector, its durable content,
/// or the byte of one of the writes since (0 for a discard).
struct Expect {
    now: Vec<u8>,
    durable: Vec<u8>,
    since: Vec<Vec<u8>>,
    snapshot: bool,
}

impl Expect {
    fn new(content: Vec<u8>, snapshot: bool) -> Expect {
        Expect {
            durable: content.clone(),
            now: content,
            since: vec![Vec::new(); SECTORS],
            snapshot,
        }
    }

    fn settle(&mut self) {
        self.durable.clone_from(&self.now);
        self.since.iter_mut().for_each(Vec::clear);
    }

    fn touch(&mut self, offset: u64, len: u64, byte: u8, durable: bool) {
        let r = offset as usize..(offset + len) as usize;
        self.now[r.clone()].fill(byte);
        if durable {
            self.durable[r].fill(byte);
        }
        let s = (offset / SECTOR) as usize..((offset + len) / SECTOR) as usize;
        for since in &mut self.since[s] {
            if durable {
                since.clear();
            } else {
                since.push(byte);
            }
        }
    }
}

struct Rig {
    data: Arc<FaultyDevice>,
    meta: Arc<FaultyDevice>,
    pool: Option<Arc<Pool>>,
    vols: BTreeMap<String, Expect>,
    next: u32,
}

impl Rig {
    fn new() -> Rig {
        let data = Arc::new(FaultyDevice::new(Arc::new(MemDevice::new(40 * UNIT))));
        let meta = Arc::new(FaultyDevice::new(Arc::new(MemDevice::new(16 << 20))));
        let devices: Vec<Arc<dyn BlockDevice>> = vec![data.clone()];
        let pool =
            Pool::create("c", devices, &MetadataLocation::Device(meta.clone()), UNIT).unwrap();
        let mut rig = Rig {
            data,
            meta,
            pool: Some(pool),
            vols: BTreeMap::new(),
            next: 0,
        };
        for name in ["a", "b"] {
            rig.pool().create_volume(name, VOL_SIZE).unwrap();
            rig.vols.insert(
                name.to_string(),
                Expect::new(vec![0; VOL_SIZE as usize], false),
            );
        }
        rig
    }

    fn pool(&self) -> &Arc<Pool> {
        self.pool.as_ref().unwrap()
    }

    fn pick(&self, i: usize, snapshot: bool) -> Option<String> {
        let names: Vec<&String> = self
            .vols
            .iter()
            .filter(|(_, e)| e.snapshot == snapshot)
            .map(|(n, _)| n)
            .collect();
        (!names.is_empty()).then(|| names[i % names.len()].clone())
    }

    /// Everything so far is durable.
    fn settle_all(&mut self) {
        self.vols.values_mut().for_each(Expect::settle);
    }

    /// A write that ran out of space leaves its range partly written: take
    /// what the volume reads there as its content, not yet durable.
    fn failed(&mut self, name: &str, offset: u64, len: u64, byte: u8, e: io::Error) {
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        let dev = self.pool().volume(name).unwrap();
        let mut got = vec![0u8; len as usize];
        dev.read_at(&mut got, offset).unwrap();
        let exp = self.vols.get_mut(name).unwrap();
        exp.touch(offset, len, byte, false);
        exp.now[offset as usize..(offset + len) as usize].copy_from_slice(&got);
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Write {
                vol,
                offset,
                len,
                byte,
                fua,
            } => {
                let Some(name) = self.pick(vol, false) else {
                    return;
                };
                let len = len.min(VOL_SIZE - offset);
                let dev = self.pool().volume(&name).unwrap();
                match dev.write_at(&vec![byte; len as usize], offset, fua) {
                    Ok(()) => self
                        .vols
                        .get_mut(&name)
                        .unwrap()
                        .touch(offset, len, byte, fua),
                    Err(e) => self.failed(&name, offset, len, byte, e),
                }
            }
            Op::Discard { vol, offset, len } => {
                let Some(name) = self.pick(vol, false) else {
                    return;
                };
                let len = len.min(VOL_SIZE - offset);
                let dev = self.pool().volume(&name).unwrap();
                match dev.discard(offset, len) {
                    Ok(()) => self
                        .vols
                        .get_mut(&name)
                        .unwrap()
                        .touch(offset, len, 0, false),
                    Err(e) => self.failed(&name, offset, len, 0, e),
                }
            }
            Op::Snapshot { vol } => {
                let Some(name) = self.pick(vol, false) else {
                    return;
                };
                self.next += 1;
                let snap = format!("{name}@{}", self.next);
                self.pool().snapshot(&name, &snap).unwrap();
                // A volume operation commits everything before it.
                self.settle_all();
                let now = self.vols[&name].now.clone();
                self.vols.insert(snap, Expect::new(now, true));
            }
            Op::Clone { snap } => {
                let Some(snap) = self.pick(snap, true) else {
                    return;
                };
                self.next += 1;
                let name = format!("clone{}", self.next);
                self.pool().clone_snapshot(&snap, &name).unwrap();
                self.settle_all();
                let now = self.vols[&snap].now.clone();
                self.vols.insert(name, Expect::new(now, false));
            }
            Op::Delete { vol } => {
                let Some(name) = self.vols.keys().nth(vol % self.vols.len()).cloned() else {
                    return;
                };
                let prefix = format!("{name}@");
                let has_snaps = self.vols.keys().any(|n| n.starts_with(&prefix));
                if name == "a" || name == "b" || has_snaps {
                    return;
                }
                self.pool().delete(&name).unwrap();
                self.vols.remove(&name);
                self.settle_all();
            }
            Op::Flush => {
                self.pool().flush().unwrap();
                self.settle_all();
            }
            Op::Crash => self.crash(),
        }
    }

    fn crash(&mut self) {
        self.data.drop_unflushed();
        self.meta.drop_unflushed();
        // Nothing reaches the devices while the old pool goes away.
        self.data.set_fail_writes(true);
        self.meta.set_fail_writes(true);
        self.pool = None;
        self.data.set_fail_writes(false);
        self.meta.set_fail_writes(false);
        let devices: Vec<Arc<dyn BlockDevice>> = vec![self.data.clone()];
        let meta = MetadataLocation::Device(self.meta.clone());
        self.pool = Some(Pool::open("c", devices, &meta).unwrap());
        let report = self.pool().check().unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
        let mut names: Vec<String> = self.pool().volumes().into_iter().map(|v| v.name).collect();
        names.sort();
        assert_eq!(names, self.vols.keys().cloned().collect::<Vec<_>>());
        let pool = self.pool.clone().unwrap();
        for (name, e) in &mut self.vols {
            let mut got = vec![0u8; VOL_SIZE as usize];
            pool.volume(name).unwrap().read_at(&mut got, 0).unwrap();
            for (s, since) in e.since.iter().enumerate() {
                let r = s * SECTOR as usize..(s + 1) * SECTOR as usize;
                let sector = &got[r.clone()];
                let written_since = since.iter().any(|&b| sector.iter().all(|&x| x == b));
                assert!(
                    *sector == e.durable[r] || written_since,
                    "{name}: sector {s} holds neither its durable content nor a later write"
                );
            }
            e.now = got;
            e.settle();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn acknowledged_flushed_writes_survive_power_cuts(ops in proptest::collection::vec(op(), 1..80)) {
        let mut rig = Rig::new();
        for op in &ops {
            rig.apply(op);
        }
        rig.apply(&Op::Crash);
    }
}
