//! Atomic writes of a volume (atomic.rs) on RAM devices, with power cuts
//! rehearsed by faulty devices under the data and the metadata.

use std::sync::Arc;

use block::{BlockDevice, FaultyDevice, MemDevice};

use crate::tests::{assert_both_writes_kept, pausing_pool};
use crate::{MetadataLocation, Pool, MAX_ATOMIC_BYTES};

const UNIT: u64 = 4096;

fn read(dev: &dyn BlockDevice, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xEE; len];
    dev.read_at(&mut buf, offset).unwrap();
    buf
}

/// The physical unit each of the first `n` virtual units maps.
fn units_of(pool: &Pool, volume: &str, n: u64) -> Vec<Option<u64>> {
    let st = pool.state.read();
    let id = st.id_of(volume).unwrap();
    (0..n)
        .map(|v| st.volumes[&id].map.get(&v).copied())
        .collect()
}

#[test]
fn an_atomic_write_moves_every_unit_it_touches_and_frees_the_old_ones() {
    let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(17 * UNIT));
    let meta = MetadataLocation::Device(Arc::new(MemDevice::new(8 << 20)));
    let pool = Pool::create("p", vec![data], &meta, UNIT).unwrap();
    pool.create_volume("v", 8 * UNIT).unwrap();
    let v = pool.volume("v").unwrap();
    assert_eq!(
        v.atomic_writes(),
        Some(block::AtomicWrites::up_to(MAX_ATOMIC_BYTES))
    );
    v.write_at(&vec![0x11; 3 * UNIT as usize], 0, false)
        .unwrap();
    pool.flush().unwrap();
    let before = units_of(&pool, "v", 5);

    // From the middle of unit 0 to the middle of unit 3 (never written).
    let start = UNIT / 2;
    let len = 3 * UNIT as usize;
    v.write_atomic(&vec![0x22; len], start, false).unwrap();
    let after = units_of(&pool, "v", 5);
    for vunit in 0..4 {
        assert!(after[vunit].is_some());
        assert_ne!(after[vunit], before[vunit], "unit {vunit} moved");
    }
    assert_eq!(after[4], None);
    let back = read(&v, 0, 4 * UNIT as usize);
    let half = (UNIT / 2) as usize;
    assert!(back[..half].iter().all(|&b| b == 0x11));
    assert!(back[half..half + len].iter().all(|&b| b == 0x22));
    assert!(back[half + len..].iter().all(|&b| b == 0));

    // The old units are held until the switch commits, then free.
    assert_eq!(pool.space().used_units, 4);
    assert_eq!(pool.space().held_units, 3);
    pool.flush().unwrap();
    assert_eq!(pool.space().held_units, 0);
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn an_atomic_write_to_a_snapshot_shared_unit_leaves_the_snapshot() {
    let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(17 * UNIT));
    let meta = MetadataLocation::Device(Arc::new(MemDevice::new(8 << 20)));
    let pool = Pool::create("p", vec![data], &meta, UNIT).unwrap();
    pool.create_volume("v", 4 * UNIT).unwrap();
    let v = pool.volume("v").unwrap();
    v.write_at(&vec![0x11; 2 * UNIT as usize], 0, false)
        .unwrap();
    pool.snapshot("v", "s").unwrap();
    v.write_atomic(&[0x33; 100], UNIT - 50, true).unwrap();
    let s = pool.volume("s").unwrap();
    assert!(read(&s, 0, 2 * UNIT as usize).iter().all(|&b| b == 0x11));
    assert!(s.atomic_writes().is_none(), "a snapshot is read-only");
    let back = read(&v, UNIT - 60, 120);
    assert_eq!(back[..10], [0x11; 10]);
    assert_eq!(back[10..110], [0x33; 100]);
    assert_eq!(back[110..], [0x11; 10]);
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn a_write_beyond_the_limit_or_the_pool_changes_nothing() {
    let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(5 * UNIT));
    let meta = MetadataLocation::Device(Arc::new(MemDevice::new(8 << 20)));
    let pool = Pool::create("p", vec![data], &meta, UNIT).unwrap();
    pool.create_volume("v", MAX_ATOMIC_BYTES * 2).unwrap();
    let v = pool.volume("v").unwrap();
    v.write_at(&vec![0x11; 2 * UNIT as usize], 0, false)
        .unwrap();
    let too_long = vec![0; MAX_ATOMIC_BYTES as usize + 1];
    let err = v.write_atomic(&too_long, 0, false).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    // Four units in the pool, two used: three fresh ones do not fit.
    let err = v
        .write_atomic(&vec![0x22; 3 * UNIT as usize], 0, false)
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
    assert!(read(&v, 0, 2 * UNIT as usize).iter().all(|&b| b == 0x11));
    assert_eq!(pool.space().free_units, 2, "nothing stays reserved");
    v.write_atomic(&vec![0x22; 2 * UNIT as usize], 0, false)
        .unwrap();
    assert!(read(&v, 0, 2 * UNIT as usize).iter().all(|&b| b == 0x22));
}

#[test]
fn a_write_beside_the_range_while_its_units_are_copied_is_kept() {
    let (data, pool, v) = pausing_pool();
    pool.flush().unwrap();

    // The atomic write copies unit 0 around its range and stops there.
    let (paused, resume) = data.arm();
    let atomic = {
        let v = v.clone();
        std::thread::spawn(move || v.write_atomic(&[0xA0; 512], 0, false))
    };
    paused.recv().unwrap();
    // A plain write to other bytes of the same unit meanwhile: the switch
    // to the copy made before it would lose it.
    v.write_at(&[0xB0; 512], 512, false).unwrap();
    resume.send(()).unwrap();
    atomic.join().unwrap().unwrap();

    assert_both_writes_kept(&pool, &v);
}

/// A pool whose data and metadata devices are faulty RAM disks.
struct Cuttable {
    data: Arc<FaultyDevice>,
    meta: Arc<FaultyDevice>,
}

impl Cuttable {
    fn new(units: u64) -> (Cuttable, Arc<Pool>) {
        let c = Cuttable {
            data: Arc::new(FaultyDevice::new(Arc::new(MemDevice::new(
                (units + 1) * UNIT,
            )))),
            meta: Arc::new(FaultyDevice::new(Arc::new(MemDevice::new(8 << 20)))),
        };
        let pool = Pool::create("p", c.devices(), &c.location(), UNIT).unwrap();
        (c, pool)
    }

    fn devices(&self) -> Vec<Arc<dyn BlockDevice>> {
        vec![self.data.clone()]
    }

    fn location(&self) -> MetadataLocation {
        MetadataLocation::Device(self.meta.clone())
    }

    /// Power cut: everything unflushed is lost, then the pool restarts.
    fn cut(&self, pool: Arc<Pool>) -> Arc<Pool> {
        for dev in [&self.data, &self.meta] {
            dev.set_fail_writes(true);
            dev.drop_unflushed();
        }
        drop(pool);
        for dev in [&self.data, &self.meta] {
            dev.heal();
        }
        Pool::open("p", self.devices(), &self.location()).unwrap()
    }
}

/// Reads `len` bytes at `offset` of volume `v` and says whether they are
/// all `old` or all `new` (and which), failing on a mix.
fn old_or_new(pool: &Arc<Pool>, offset: u64, expect_old: &[u8], new: u8) -> bool {
    let back = read(&pool.volume("v").unwrap(), offset, expect_old.len());
    if back == expect_old {
        return false;
    }
    assert!(
        back.iter().all(|&b| b == new),
        "torn: neither the old bytes nor the new"
    );
    true
}

#[test]
fn a_cut_before_the_mappings_commit_leaves_the_old_bytes_even_once_the_data_is_flushed() {
    let (c, pool) = Cuttable::new(16);
    pool.create_volume("v", 8 * UNIT).unwrap();
    let v = pool.volume("v").unwrap();
    // Unit 0 committed with 0x11; unit 1 never written.
    v.write_at(&vec![0x11; UNIT as usize], 0, false).unwrap();
    pool.flush().unwrap();
    let old: Vec<u8> = [vec![0x11u8; 2048], vec![0; 2048]].concat();

    // Without a flush, the cut loses the whole write.
    v.write_atomic(&[0x22; 4096], UNIT - 2048, false).unwrap();
    drop(v);
    let pool = c.cut(pool);
    assert!(!old_or_new(&pool, UNIT - 2048, &old, 0x22));

    // A FUA write whose data reach the device but whose mappings fail to
    // commit: the cut still leaves the old bytes.
    c.meta.set_fail_writes(true);
    let v = pool.volume("v").unwrap();
    assert!(v.write_atomic(&[0x22; 4096], UNIT - 2048, true).is_err());
    assert_eq!(c.data.unflushed_bytes(), 0, "the data were flushed");
    drop(v);
    let pool = c.cut(pool);
    assert!(!old_or_new(&pool, UNIT - 2048, &old, 0x22));
    assert!(pool.check().unwrap().is_clean());

    // Once committed, the new bytes, whole.
    let v = pool.volume("v").unwrap();
    v.write_atomic(&[0x22; 4096], UNIT - 2048, true).unwrap();
    drop(v);
    let pool = c.cut(pool);
    assert!(old_or_new(&pool, UNIT - 2048, &old, 0x22));
    assert!(pool.check().unwrap().is_clean());
}
