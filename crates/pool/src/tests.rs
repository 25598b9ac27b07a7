//! Behaviour of the pool engine on RAM devices.

use std::sync::mpsc;
use std::sync::Arc;

use block::{Allocation, BlockDevice, MemDevice};

use crate::{MetadataLocation, Pool, VolumeKind};

const UNIT: u64 = 4096;

fn new_pool(units: u64) -> (Arc<Pool>, Arc<dyn BlockDevice>, MetadataLocation) {
    let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new((units + 1) * UNIT));
    let meta = MetadataLocation::Device(Arc::new(MemDevice::new(8 << 20)));
    let pool = Pool::create("p", vec![data.clone()], &meta, UNIT).unwrap();
    (pool, data, meta)
}

fn read(dev: &dyn BlockDevice, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xEE; len];
    dev.read_at(&mut buf, offset).unwrap();
    buf
}

#[test]
fn unwritten_volume_reads_zeros_and_uses_no_space() {
    let (pool, _, _) = new_pool(16);
    pool.create_volume("v", 1 << 30).unwrap();
    let v = pool.volume("v").unwrap();
    assert_eq!(v.size(), 1 << 30);
    assert_eq!(read(&v, 12345, 100), vec![0; 100]);
    assert_eq!(pool.space().used_units, 0);
    assert_eq!(
        v.allocation(0, 1 << 20).unwrap(),
        (Allocation::Deallocated, 1 << 20)
    );
    let caps = v.capabilities();
    assert!(caps.thin && caps.discard && caps.discard_zeroes && caps.volatile_cache);
    // RAM devices under data and metadata: nothing waits on storage.
    assert!(!caps.may_block);
}

#[test]
fn a_pool_with_its_metadata_file_on_disk_may_block() {
    // RAM data devices: the metadata file decides.
    let mut dirs = vec![tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap()];
    if std::path::Path::new("/dev/shm").is_dir() {
        dirs.push(tempfile::tempdir_in("/dev/shm").unwrap());
    }
    for dir in dirs {
        let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(17 * UNIT));
        let meta = MetadataLocation::File(dir.path().join("p.meta"));
        let pool = Pool::create("p", vec![data], &meta, UNIT).unwrap();
        // block's own tests check this function against /proc/self/mounts.
        let in_memory = block::on_memory_file_system(dir.path());
        assert_eq!(pool.may_block(), !in_memory, "{:?}", dir.path());
    }
}

#[test]
fn writes_allocate_units_and_discard_frees_them() {
    let (pool, _, _) = new_pool(16);
    pool.create_volume("v", 64 * UNIT).unwrap();
    let v = pool.volume("v").unwrap();
    v.write_at(b"hello", UNIT + 10, false).unwrap();
    assert_eq!(read(&v, UNIT + 8, 9), b"\0\0hello\0\0");
    assert_eq!(pool.space().used_units, 1);
    assert_eq!(
        v.allocation(0, 4 * UNIT).unwrap(),
        (Allocation::Deallocated, UNIT)
    );
    assert_eq!(
        v.allocation(UNIT, 4 * UNIT).unwrap(),
        (Allocation::Mapped, UNIT)
    );
    // A partial discard zeroes, a whole-unit discard frees.
    v.discard(UNIT + 11, 2).unwrap();
    assert_eq!(read(&v, UNIT + 10, 5), b"h\0\0lo");
    v.discard(UNIT, UNIT).unwrap();
    assert_eq!(read(&v, UNIT + 10, 5), vec![0; 5]);
    let s = pool.space();
    assert_eq!((s.used_units, s.held_units), (0, 1));
    pool.flush().unwrap();
    assert_eq!(pool.space().free_units, 16);
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn snapshots_share_units_until_written() {
    let (pool, _, _) = new_pool(16);
    pool.create_volume("v", 8 * UNIT).unwrap();
    let v = pool.volume("v").unwrap();
    v.write_at(&vec![1; 2 * UNIT as usize], 0, false).unwrap();
    pool.snapshot("v", "s").unwrap();
    assert_eq!(pool.space().used_units, 2);
    v.write_at(&[2; 10], 5, false).unwrap();
    assert_eq!(pool.space().used_units, 3, "copy on write");
    let s = pool.volume("s").unwrap();
    assert_eq!(read(&s, 0, 16), vec![1; 16]);
    assert_eq!(read(&v, 4, 3), vec![1, 2, 2]);
    assert!(s.write_at(b"x", 0, false).is_err());
    assert_eq!(pool.volume_info("s").unwrap().kind, VolumeKind::Snapshot);

    let c = pool.clone_snapshot("s", "c").unwrap();
    assert_eq!(c.parent.as_deref(), Some("s"));
    let cdev = pool.volume("c").unwrap();
    cdev.write_at(&[3; 4], UNIT, false).unwrap();
    assert_eq!(read(&cdev, UNIT - 1, 3), vec![1, 3, 3]);
    assert_eq!(read(&s, UNIT, 1), vec![1]);
    assert!(pool.delete("v").is_err(), "v has a snapshot");

    pool.rollback("v", "s").unwrap();
    assert_eq!(read(&v, 4, 3), vec![1, 1, 1]);
    pool.delete("s").unwrap();
    assert_eq!(pool.volume_info("c").unwrap().parent, None);
    pool.delete("c").unwrap();
    pool.delete("v").unwrap();
    pool.flush().unwrap();
    assert_eq!(pool.space().used_units, 0);
    assert_eq!(pool.space().free_units, 16);
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn refresh_repoints_a_clone_at_a_newer_snapshot() {
    let (pool, _, _) = new_pool(16);
    pool.create_volume("gold", 4 * UNIT).unwrap();
    let gold = pool.volume("gold").unwrap();
    gold.write_at(&[1; 8], 0, false).unwrap();
    pool.snapshot("gold", "s1").unwrap();
    pool.clone_snapshot("s1", "vdi").unwrap();
    // The clone's device stays open across the refresh, as under a LUN.
    let vdi = pool.volume("vdi").unwrap();
    vdi.write_at(&[9; 4], UNIT, false).unwrap();
    gold.write_at(&[2; 8], 0, false).unwrap();
    pool.snapshot("gold", "s2").unwrap();

    pool.refresh_clone("vdi", "s2").unwrap();
    assert_eq!(read(&vdi, 0, 8), vec![2; 8], "reads the newer snapshot");
    assert_eq!(read(&vdi, UNIT, 4), vec![0; 4], "its own writes are gone");
    assert_eq!(
        pool.volume_info("vdi").unwrap().parent.as_deref(),
        Some("s2")
    );
    // The older snapshot no longer has a clone and can go.
    pool.delete("s1").unwrap();

    assert!(pool.refresh_clone("gold", "s2").is_err(), "not a clone");
    assert!(pool.refresh_clone("vdi", "gold").is_err(), "not a snapshot");
    pool.create_volume("big", 8 * UNIT).unwrap();
    pool.snapshot("big", "bs").unwrap();
    assert!(pool.refresh_clone("vdi", "bs").is_err(), "another size");
    pool.flush().unwrap();
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn promote_swaps_lineage() {
    let (pool, _, _) = new_pool(8);
    pool.create_volume("v", 4 * UNIT).unwrap();
    pool.snapshot("v", "s").unwrap();
    pool.clone_snapshot("s", "c").unwrap();
    pool.promote("c").unwrap();
    assert_eq!(pool.volume_info("s").unwrap().parent.as_deref(), Some("c"));
    assert_eq!(pool.volume_info("v").unwrap().parent.as_deref(), Some("s"));
    assert_eq!(pool.volume_info("c").unwrap().parent, None);
    pool.delete("v").unwrap();
    assert!(pool.promote("c").is_err());
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn resize_grows_with_zeros_and_shrinks_to_whole_units() {
    let (pool, _, _) = new_pool(8);
    pool.create_volume("v", 1000 * 512).unwrap();
    let v = pool.volume("v").unwrap();
    v.write_at(&[9; 512], 999 * 512, false).unwrap();
    pool.resize("v", 2000 * 512).unwrap();
    assert_eq!(v.size(), 2000 * 512);
    assert_eq!(read(&v, 999 * 512 + 510, 4), vec![9, 9, 0, 0]);
    // Shrinking inside a unit is refused; to a unit boundary it frees
    // the units beyond, and growing again reads zeros there.
    assert!(pool.resize("v", 512).is_err());
    v.write_at(&[5; 512], 3 * UNIT, false).unwrap();
    assert_eq!(pool.space().used_units, 2);
    pool.resize("v", 3 * UNIT).unwrap();
    assert_eq!(v.size(), 3 * UNIT);
    assert_eq!(pool.space().used_units, 0);
    pool.resize("v", 8 * UNIT).unwrap();
    assert_eq!(read(&v, 3 * UNIT, 512), vec![0; 512]);
    assert!(pool.check().unwrap().is_clean());
    // A device of a deleted volume is empty and serves nothing.
    pool.delete("v").unwrap();
    assert_eq!(v.size(), 0);
    assert!(v.read_at(&mut [0; 512], 0).is_err());
}

#[test]
fn full_pool_fails_writes_with_no_space() {
    let (pool, _, _) = new_pool(2);
    pool.create_volume("v", 8 * UNIT).unwrap();
    let v = pool.volume("v").unwrap();
    v.write_at(&[1; 8], 0, false).unwrap();
    v.write_at(&[1; 8], UNIT, false).unwrap();
    let err = v.write_at(&[1; 8], 2 * UNIT, false).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn reopen_keeps_what_was_flushed() {
    let (pool, data, meta) = new_pool(8);
    pool.create_volume("v", 8 * UNIT).unwrap();
    let v = pool.volume("v").unwrap();
    v.write_at(b"kept", 0, false).unwrap();
    pool.flush().unwrap();
    v.write_at(b"lost", UNIT, false).unwrap();
    drop(v);
    drop(pool);
    let pool = Pool::open("p", vec![data.clone()], &meta).unwrap();
    let v = pool.volume("v").unwrap();
    assert_eq!(read(&v, 0, 4), b"kept");
    assert_eq!(read(&v, UNIT, 4), vec![0; 4], "unflushed mapping is gone");
    assert_eq!(pool.space().used_units, 1);
    assert!(pool.check().unwrap().is_clean());
    // The wrong devices are refused.
    let other: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(9 * UNIT));
    assert!(Pool::open("p", vec![other], &meta).is_err());
    assert!(Pool::create("p", vec![data], &meta, UNIT).is_err());
}

#[test]
fn fua_write_commits_its_mapping() {
    let (pool, data, meta) = new_pool(8);
    pool.create_volume("v", 8 * UNIT).unwrap();
    pool.volume("v").unwrap().write_at(b"fua", 0, true).unwrap();
    drop(pool);
    let pool = Pool::open("p", vec![data], &meta).unwrap();
    assert_eq!(read(&pool.volume("v").unwrap(), 0, 3), b"fua");
}

#[test]
fn metadata_in_a_file_beside_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool.redb");
    let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(64 * UNIT));
    let meta = MetadataLocation::File(path);
    let pool = Pool::open_or_create("p", vec![data.clone()], &meta, UNIT).unwrap();
    pool.create_volume("v", UNIT).unwrap();
    drop(pool);
    let pool = Pool::open_or_create("p", vec![data], &meta, UNIT).unwrap();
    assert_eq!(pool.volumes().len(), 1);
    assert_eq!(pool.space().total_units, 63);
}

#[test]
fn a_unit_still_shared_in_committed_metadata_is_copied_before_writing() {
    use block::FaultyDevice;
    let data = Arc::new(FaultyDevice::new(Arc::new(MemDevice::new(9 * UNIT))));
    let meta = MetadataLocation::Device(Arc::new(MemDevice::new(8 << 20)));
    let devices: Vec<Arc<dyn BlockDevice>> = vec![data.clone()];
    let pool = Pool::create("p", devices.clone(), &meta, UNIT).unwrap();
    pool.create_volume("a", 2 * UNIT).unwrap();
    pool.volume("a")
        .unwrap()
        .write_at(&vec![1; UNIT as usize], 0, false)
        .unwrap();
    pool.snapshot("a", "s").unwrap();
    pool.clone_snapshot("s", "c").unwrap();
    pool.delete("s").unwrap();
    // a and c share one committed unit; a lets go of it without a commit.
    pool.volume("a").unwrap().discard(0, UNIT).unwrap();
    pool.volume("c")
        .unwrap()
        .write_at(&[2; 512], 0, true)
        .unwrap();
    data.drop_unflushed();
    data.set_fail_writes(true);
    drop(pool);
    data.set_fail_writes(false);
    let pool = Pool::open("p", devices, &meta).unwrap();
    let a = read(&pool.volume("a").unwrap(), 0, 512);
    assert!(a == vec![1; 512] || a == vec![0; 512], "a reads c's write");
    assert_eq!(read(&pool.volume("c").unwrap(), 0, 512), vec![2; 512]);
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn copy_between_volumes_of_a_pool_shares_whole_units() {
    let (pool, data, meta) = new_pool(32);
    pool.create_volume("a", 16 * UNIT).unwrap();
    pool.create_volume("b", 16 * UNIT).unwrap();
    let a = pool.volume("a").unwrap();
    let b = pool.volume("b").unwrap();
    let pattern: Vec<u8> = (0..8 * UNIT).map(|i| (i % 251) as u8).collect();
    a.write_at(&pattern, 0, false).unwrap();
    b.write_at(&[9; 10], 7 * UNIT, false).unwrap();
    assert_eq!(pool.space().used_units, 9);
    // Half of unit 0, units 1 to 5 whole, 100 bytes of unit 6.
    let (from, len) = (UNIT / 2, 6 * UNIT + 100);
    b.copy_from(&a, from, from, len).unwrap().unwrap();
    assert_eq!(
        read(&b, from, len as usize),
        &pattern[from as usize..(from + len) as usize]
    );
    assert_eq!(read(&b, 0, 4), vec![0; 4], "before the range untouched");
    assert_eq!(
        read(&b, 7 * UNIT, 10),
        vec![9; 10],
        "after the range untouched"
    );
    // Units 1..=5 shared; the head (unit 0) and tail (unit 6) were copied.
    assert_eq!(pool.space().used_units, 9 + 2);
    // Copy-on-write keeps them apart.
    a.write_at(&[1; 3], 2 * UNIT, false).unwrap();
    b.write_at(&[2; 3], 3 * UNIT, false).unwrap();
    assert_eq!(read(&b, 2 * UNIT, 3), pattern[2 * UNIT as usize..][..3]);
    assert_eq!(read(&a, 3 * UNIT, 3), pattern[3 * UNIT as usize..][..3]);
    assert!(pool.check().unwrap().is_clean());
    pool.flush().unwrap();
    drop((a, b));
    drop(pool);
    let pool = Pool::open("p", vec![data], &meta).unwrap();
    let b = pool.volume("b").unwrap();
    assert_eq!(read(&b, 4 * UNIT, 8), pattern[4 * UNIT as usize..][..8]);
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn copy_of_unmapped_units_unmaps_the_destination() {
    let (pool, _, _) = new_pool(16);
    pool.create_volume("a", 8 * UNIT).unwrap();
    pool.create_volume("b", 8 * UNIT).unwrap();
    let (a, b) = (pool.volume("a").unwrap(), pool.volume("b").unwrap());
    b.write_at(&vec![5; 4 * UNIT as usize], 0, false).unwrap();
    b.copy_from(&a, 0, 0, 4 * UNIT).unwrap().unwrap();
    assert_eq!(read(&b, 0, 4 * UNIT as usize), vec![0; 4 * UNIT as usize]);
    assert_eq!(pool.space().used_units, 0);
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn copy_is_not_offloaded_across_pools_or_alignments() {
    let (pool, _, _) = new_pool(16);
    let (other, _, _) = new_pool(16);
    pool.create_volume("a", 8 * UNIT).unwrap();
    pool.create_volume("b", 8 * UNIT).unwrap();
    other.create_volume("c", 8 * UNIT).unwrap();
    let (a, b) = (pool.volume("a").unwrap(), pool.volume("b").unwrap());
    let c = other.volume("c").unwrap();
    assert!(c.copy_from(&a, 0, 0, UNIT).is_none(), "another pool");
    assert!(b.copy_from(&a, 0, 512, UNIT).is_none(), "another alignment");
    assert!(a.copy_from(&a, 0, UNIT, 2 * UNIT).is_none(), "overlap");
    let mem = MemDevice::new(8 * UNIT);
    assert!(b.copy_from(&mem, 0, 0, UNIT).is_none(), "not a volume");
    // One volume onto itself without overlap is shared.
    a.write_at(&vec![3; UNIT as usize], 0, false).unwrap();
    a.copy_from(&a, 0, 4 * UNIT, UNIT).unwrap().unwrap();
    assert_eq!(read(&a, 4 * UNIT, 4), vec![3; 4]);
    assert_eq!(pool.space().used_units, 1);
    // Snapshots are not destinations.
    pool.snapshot("a", "s").unwrap();
    let s = pool.volume("s").unwrap();
    assert!(s.copy_from(&a, 0, 0, UNIT).is_none());
}

/// A pool of `units` on one data file in `dir`, its metadata beside it.
fn file_pool(dir: &tempfile::TempDir, units: u64) -> Arc<Pool> {
    let opts = block::FileOptions {
        create_size: Some((units + 1) * UNIT),
        ..Default::default()
    };
    let data: Arc<dyn BlockDevice> =
        Arc::new(block::FileDevice::open(&dir.path().join("data"), opts).unwrap());
    let meta = MetadataLocation::File(dir.path().join("meta"));
    Pool::create("p", vec![data], &meta, UNIT).unwrap()
}

#[test]
fn a_unit_whose_pages_wait_to_be_sent_is_not_reused_until_sent() {
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        return;
    };
    // One data unit: a second volume can only write into the first's.
    let pool = file_pool(&dir, 1);
    pool.create_volume("a", UNIT).unwrap();
    pool.create_volume("b", UNIT).unwrap();
    let (a, b) = (pool.volume("a").unwrap(), pool.volume("b").unwrap());
    assert!(
        a.mapped_bytes(0, 512).is_none(),
        "an unmapped unit reads as zeros"
    );
    a.write_at(&[0xA1; UNIT as usize], 0, false).unwrap();
    // The data file's mapping is made on first use; pages written after
    // that are known to exist at once.
    drop(a.mapped_bytes(0, 512));
    a.write_at(&[0xA1; UNIT as usize], 0, false).unwrap();
    pool.flush().unwrap();

    let held = a
        .mapped_bytes(512, 1024)
        .expect("a unit of a file in memory");
    assert!(
        a.mapped_bytes(UNIT - 512, 1024).is_none(),
        "beyond the volume"
    );
    a.discard(0, UNIT).unwrap();
    pool.flush().unwrap();
    assert_eq!(read(&a, 0, 512), vec![0; 512]);
    assert_eq!(pool.space().free_units, 0, "freed but held for sending");
    let full = b.write_at(&[0xB2; 512], 0, false).unwrap_err();
    assert_eq!(full.kind(), std::io::ErrorKind::StorageFull);
    assert_eq!(held.as_ref(), &[0xA1; 1024][..], "still the discarded data");

    drop(held);
    assert_eq!(pool.space().free_units, 1, "free once sent");
    b.write_at(&[0xB2; 512], 0, false).unwrap();
    assert_eq!(read(&b, 0, 512), vec![0xB2; 512]);
    assert_eq!(pool.send_holds.kept_back(), 0);

    // Pages held across no commit are simply let go.
    let again = b.mapped_bytes(0, 512).unwrap();
    drop(again);
    assert_eq!(pool.space().free_units, 0);
}

#[test]
fn a_snapshot_shared_unit_of_a_file_pool_is_copied_in_the_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let pool = file_pool(&dir, 6);
    pool.create_volume("v", UNIT).unwrap();
    let old: Vec<u8> = (0..UNIT).map(|i| (i % 253) as u8).collect();
    pool.volume("v").unwrap().write_at(&old, 0, false).unwrap();
    pool.snapshot("v", "s").unwrap();
    let s = pool.volume("s").unwrap();
    // Each end of the unit, its middle, all of it: the copy goes around
    // each write (and is not needed for the last).
    let writes = [
        (0, 512),
        (UNIT - 512, 512),
        (1024, 1024),
        (0, UNIT as usize),
    ];
    for (i, (at, len)) in writes.into_iter().enumerate() {
        let name = format!("c{i}");
        pool.clone_snapshot("s", &name).unwrap();
        let c = pool.volume(&name).unwrap();
        c.write_at(&vec![0xC3; len], at, false).unwrap();
        let mut expect = old.clone();
        expect[at as usize..at as usize + len].fill(0xC3);
        assert!(read(&c, 0, UNIT as usize) == expect, "write at {at}");
        assert!(
            read(&s, 0, UNIT as usize) == old,
            "the snapshot keeps its unit"
        );
    }
    assert_eq!(pool.space().used_units, 5);
    assert!(pool.check().unwrap().is_clean());
}

/// A RAM device whose next read, once armed, stops after reading: it says
/// so and waits to be let go, so a test can act while a copy-on-write
/// holds the bytes it copied.
pub(crate) struct PausingReads {
    pub pause: std::sync::Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
}

impl PausingReads {
    /// Arms the pause: (told when the next read has paused, lets it go).
    pub fn arm(&self) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (paused_tx, paused) = mpsc::channel();
        let (resume, resume_rx) = mpsc::channel();
        *self.pause.lock().unwrap() = Some((paused_tx, resume_rx));
        (paused, resume)
    }
}

/// A pool on a pausing RAM device with a volume "v" of four units, the
/// first of them written with 0x11.
pub(crate) fn pausing_pool() -> (
    Arc<block::Wrapped<PausingReads>>,
    Arc<Pool>,
    Arc<crate::VolumeDevice>,
) {
    let data = Arc::new(block::Wrapped::over(
        Arc::new(MemDevice::new(17 * UNIT)),
        PausingReads {
            pause: std::sync::Mutex::new(None),
        },
    ));
    let meta = MetadataLocation::Device(Arc::new(MemDevice::new(8 << 20)));
    let pool = Pool::create("p", vec![data.clone() as Arc<dyn BlockDevice>], &meta, UNIT).unwrap();
    pool.create_volume("v", 4 * UNIT).unwrap();
    let v = Arc::new(pool.volume("v").unwrap());
    v.write_at(&vec![0x11; UNIT as usize], 0, false).unwrap();
    (data, pool, v)
}

/// Unit 0 of `v` holds 0xA0 then 0xB0 (512 bytes each) over the 0x11 of
/// `pausing_pool`, in the one unit the pool uses, and the pool is clean.
pub(crate) fn assert_both_writes_kept(pool: &Pool, v: &crate::VolumeDevice) {
    let unit = read(v, 0, UNIT as usize);
    assert_eq!(&unit[..512], &[0xA0; 512][..]);
    assert_eq!(&unit[512..1024], &[0xB0; 512][..]);
    assert!(unit[1024..].iter().all(|&b| b == 0x11));
    pool.flush().unwrap();
    assert_eq!(pool.space().used_units, 1);
    assert!(pool.check().unwrap().is_clean());
}

impl block::Wrapper for PausingReads {
    fn read_at(&self, child: &dyn BlockDevice, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        child.read_at(buf, offset)?;
        let pause = self.pause.lock().unwrap().take();
        if let Some((paused, resume)) = pause {
            paused.send(()).unwrap();
            resume.recv().unwrap();
        }
        Ok(())
    }
    fn describe(&self, child: &dyn BlockDevice) -> String {
        child.describe()
    }
}

#[test]
fn a_unit_being_copied_takes_no_write_in_place_even_once_exclusive() {
    let (data, pool, v) = pausing_pool();
    pool.snapshot("v", "s").unwrap();

    // A write to the shared unit copies it, and stops once it has read it.
    let (paused, resume) = data.arm();
    let first = {
        let v = v.clone();
        std::thread::spawn(move || v.write_at(&[0xA0; 512], 0, false))
    };
    paused.recv().unwrap();

    // Meanwhile the snapshot goes, so the unit becomes the volume's alone,
    // and a second write lands in the same unit. Written in place, it
    // would be lost when the first write maps its copy.
    pool.delete("s").unwrap();
    v.write_at(&[0xB0; 512], 512, false).unwrap();
    resume.send(()).unwrap();
    first.join().unwrap().unwrap();

    assert_both_writes_kept(&pool, &v);
}

#[test]
fn a_read_across_units_that_follow_on_the_device_is_sent_from_their_pages() {
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        return;
    };
    let pool = file_pool(&dir, 5);
    pool.create_volume("v", 4 * UNIT).unwrap();
    let v = pool.volume("v").unwrap();
    v.write_at(&[1; 512], 0, false).unwrap();
    // The data file's mapping is made on first use; pages written after
    // that are known to exist at once.
    drop(v.mapped_bytes(0, 512));
    // Virtual units 0, 1, 3, 2 written in that order: units 0, 1, 2, 3.
    for (vunit, byte) in [(0, 0xA0), (1, 0xA1), (3, 0xA3), (2, 0xA2)] {
        v.write_at(&[byte; UNIT as usize], vunit * UNIT, false)
            .unwrap();
    }
    pool.flush().unwrap();

    let across = v
        .mapped_bytes(UNIT - 512, 1024)
        .expect("units 0 and 1 follow");
    let mut want = vec![0xA0; 512];
    want.extend([0xA1; 512]);
    assert_eq!(across.as_ref(), &want[..]);
    assert!(
        v.mapped_bytes(2 * UNIT - 512, 1024).is_none(),
        "virtual units 1 and 2 are units 1 and 3"
    );
    assert_eq!(read(&v, 2 * UNIT - 1, 2), vec![0xA1, 0xA2]);

    // Both units stay held until the pages are sent.
    v.discard(0, 2 * UNIT).unwrap();
    pool.flush().unwrap();
    assert_eq!(pool.space().free_units, 1);
    assert_eq!(across.as_ref(), &want[..], "still the discarded data");
    drop(across);
    assert_eq!(pool.space().free_units, 3);
}

#[test]
fn writes_refused_for_want_of_a_unit_are_counted() {
    let (pool, _, _) = new_pool(2);
    pool.create_volume("v", 1 << 20).unwrap();
    let v = pool.volume("v").unwrap();
    v.write_at(&[1; 4096], 0, false).unwrap();
    v.write_at(&[1; 4096], 4096, false).unwrap();
    assert_eq!(pool.usage().allocation_failures, 0);
    for i in 2..5 {
        let e = v.write_at(&[1; 4096], i * 4096, false).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::StorageFull);
    }
    // In place: no unit needed, nothing refused.
    v.write_at(&[2; 4096], 0, false).unwrap();
    assert_eq!(pool.usage().allocation_failures, 3);
}

#[test]
fn usage_sums_the_volumes_and_the_threshold_follows_the_space_in_use() {
    let (pool, _, _) = new_pool(10);
    pool.set_soft_threshold(Some(crate::SoftThreshold::Percent(30)));
    pool.create_volume("a", 1 << 20).unwrap();
    let a = pool.volume("a").unwrap();
    let t = a.space_threshold().unwrap();
    assert_eq!(t.bytes(), Some(3 * UNIT));
    assert_eq!((t.capacity(), t.granularity()), (10 * UNIT, UNIT));
    a.write_at(&[1; 8192], 0, false).unwrap();
    assert_eq!(t.reached(), 0);
    a.write_at(&[1; 4096], 8192, false).unwrap();
    assert_eq!(t.reached(), 1);
    pool.snapshot("a", "s").unwrap();
    let u = pool.usage();
    assert_eq!(u.provisioned, 1 << 20, "snapshots do not count");
    assert_eq!(u.referenced, 6 * UNIT, "each mapping counts");
    assert_eq!(u.space.used(), 3 * UNIT);
    assert_eq!(u.soft_threshold, Some(3 * UNIT));
    assert_eq!(u.threshold_reached, 1);
    assert!((u.overcommit() - (1 << 20) as f64 / (10 * UNIT) as f64).abs() < 1e-9);
    let volumes = pool.volume_usage();
    assert_eq!(volumes.len(), 2);
    assert!(volumes.iter().all(|v| v.mapped == 3 * UNIT));
}

#[test]
fn max_overcommit_refuses_creation_clones_and_growth_beyond_it() {
    let (pool, _, _) = new_pool(16);
    let size = 16 * UNIT;
    pool.set_max_overcommit(Some(2.0));
    pool.create_volume("a", size).unwrap();
    pool.create_volume("b", size).unwrap();
    let e = pool.create_volume("c", 512).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::StorageFull);
    assert!(e.to_string().contains("over-committed 2.01×"), "{e}");
    pool.snapshot("a", "s").unwrap();
    assert!(pool.clone_snapshot("s", "c").is_err());
    assert!(pool.resize("a", size + 512).is_err());
    pool.resize("b", size / 2).unwrap();
    pool.resize("a", size + size / 2).unwrap();
    pool.set_max_overcommit(None);
    pool.clone_snapshot("s", "c").unwrap();
    assert_eq!(pool.usage().provisioned, 3 * size);
}
