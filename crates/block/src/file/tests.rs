use super::*;
use proptest::prelude::*;

fn create(dir: &tempfile::TempDir, name: &str, size: u64, direct: bool) -> FileDevice {
    let opts = FileOptions {
        direct,
        read_only: false,
        create_size: Some(size),
    };
    FileDevice::open(&dir.path().join(name), opts).unwrap()
}

#[test]
fn creates_a_sparse_file_of_the_requested_size() {
    let dir = tempfile::tempdir().unwrap();
    let dev = create(&dir, "a.img", 1 << 30, false);
    assert_eq!(dev.size(), 1 << 30);
    let meta = std::fs::metadata(dir.path().join("a.img")).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    assert_eq!(
        dev.allocation(0, 1 << 30).unwrap(),
        (Allocation::Deallocated, 1 << 30)
    );
    let mut buf = vec![1u8; 4096];
    dev.read_at(&mut buf, 12345).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
}

#[test]
fn allocated_zeroes_read_as_zeros_and_keep_their_space() {
    let dir = tempfile::tempdir().unwrap();
    let dev = create(&dir, "z.img", 1 << 20, false);
    dev.write_at(&[7; 8192], 4096, false).unwrap();
    dev.allocate_zeroes(0, 65536).unwrap();
    let mut back = vec![1u8; 65536];
    dev.read_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == 0));
    // The file system holds the whole range's blocks, no more.
    let meta = std::fs::metadata(dir.path().join("z.img")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::blocks(&meta) * 512, 65536);
}

#[test]
fn copies_between_files_in_the_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let a = create(&dir, "a.img", 1 << 20, false);
    let b = create(&dir, "b.img", 1 << 20, false);
    let data: Vec<u8> = (0..65536).map(|i| (i % 251) as u8).collect();
    a.write_at(&data, 4096, false).unwrap();
    b.copy_from(&a, 4096 + 512, 8192, 60000).unwrap().unwrap();
    let mut back = vec![0u8; 60000];
    b.read_at(&mut back, 8192).unwrap();
    assert!(back[..] == data[512..60512]);
    // Within one file, apart.
    a.copy_from(&a, 4096, 512 << 10, 65536).unwrap().unwrap();
    let mut back = vec![0u8; 65536];
    a.read_at(&mut back, 512 << 10).unwrap();
    assert!(back == data);
    // Overlapping ranges of one file are the caller's to copy.
    assert!(a.copy_from(&a, 4096, 8192, 65536).is_none());
    assert!(b.copy_from(&a, 1 << 20, 0, 1).unwrap().is_err());
    let direct = create(&dir, "d.img", 1 << 20, true);
    assert!(direct.copy_from(&a, 0, 0, 4096).is_none());
    assert!(b
        .copy_from(&crate::MemDevice::new(1 << 20), 0, 0, 4096)
        .is_none());
}

#[test]
fn write_read_allocation_and_discard() {
    let dir = tempfile::tempdir().unwrap();
    let dev = create(&dir, "b.img", 1 << 20, false);
    let data: Vec<u8> = (0..65536).map(|i| (i % 253) as u8).collect();
    dev.write_at(&data, 65536, false).unwrap();
    dev.write_at(&data[..512], 0, true).unwrap();
    dev.flush().unwrap();
    let mut back = vec![0; data.len()];
    dev.read_at(&mut back, 65536).unwrap();
    assert_eq!(back, data);

    let (state, n) = dev.allocation(65536, (1 << 20) - 65536).unwrap();
    assert_eq!(state, Allocation::Mapped);
    assert!(n >= 65536);
    assert_eq!(
        dev.allocation(1 << 19, 1 << 19).unwrap(),
        (Allocation::Deallocated, 1 << 19)
    );

    dev.discard(65536, 65536).unwrap();
    dev.read_at(&mut back, 65536).unwrap();
    assert!(back.iter().all(|&b| b == 0));
    assert_eq!(
        dev.allocation(65536, 65536).unwrap().0,
        Allocation::Deallocated
    );

    dev.write_at(&data, 0, false).unwrap();
    dev.write_zeroes(512, 4096).unwrap();
    let mut head = vec![0xffu8; 8192];
    dev.read_at(&mut head, 0).unwrap();
    assert_eq!(&head[..512], &data[..512]);
    assert!(head[512..4608].iter().all(|&b| b == 0));
    assert_eq!(&head[4608..], &data[4608..8192]);
    assert!(dev.capabilities().thin);
}

/// File system type of the mount holding `path`, from /proc/self/mounts
/// (the longest mount point that prefixes it).
fn mount_type(path: &Path) -> String {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let path = path.canonicalize().unwrap();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, point, kind) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(point)
                .then(|| (point.len(), kind.to_string()))
        })
        .max()
        .unwrap()
        .1
}

#[test]
fn writes_and_discards_decide_which_pages_are_read_through_the_mapping() {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        return;
    };
    let dev = create(&dir, "m.img", 1 << 20, false);
    assert!(dev.memory_map().is_some(), "/dev/shm is tmpfs");
    assert!(dev.mapped_bytes(0, 4096).is_none(), "a hole");
    dev.write_at(&[7; 4096], 8192, false).unwrap();
    dev.write_parts_at(&[&[8; 100], &[9; 3996]], 12288, false)
        .unwrap();
    let bytes = dev.mapped_bytes(8192, 8192).expect("written pages");
    assert_eq!(bytes.as_ref()[..4096], [7; 4096]);
    assert_eq!(bytes.as_ref()[4096..4196], [8; 100]);
    assert!(dev.mapped_bytes(8192, 8193).is_none(), "into a hole");
    assert!(dev.mapped_bytes(1 << 20, 1).is_none(), "outside");
    dev.discard(12288, 4096).unwrap();
    assert!(dev.mapped_bytes(12288, 10).is_none(), "discarded");
    dev.write_zeroes(8192, 512).unwrap();
    assert!(dev.mapped_bytes(8192, 10).is_none(), "zeroed by a punch");
    let blocks = std::fs::metadata(dir.path().join("m.img"))
        .unwrap()
        .blocks();
    for offset in (0..1 << 20).step_by(4096) {
        let _ = dev.mapped_bytes(offset, 4096);
    }
    let after = std::fs::metadata(dir.path().join("m.img"))
        .unwrap()
        .blocks();
    assert_eq!(after, blocks, "looking allocates nothing");

    let read_only = FileDevice::open(
        &dir.path().join("m.img"),
        FileOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(read_only.mapped_bytes(8192, 10).is_none());
}

#[test]
fn only_files_in_memory_run_inline() {
    let shm = Path::new("/dev/shm");
    let dirs = [
        tempfile::tempdir().unwrap(),
        tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap(),
    ];
    let shm_dir = shm.is_dir().then(|| tempfile::tempdir_in(shm).unwrap());
    for dir in dirs.iter().chain(shm_dir.iter()) {
        let dev = create(dir, "m.img", 1 << 20, false);
        let path = dir.path().join("m.img");
        let in_memory = matches!(mount_type(dir.path()).as_str(), "tmpfs" | "ramfs");
        assert_eq!(
            dev.capabilities().may_block,
            !in_memory,
            "{}",
            path.display()
        );
    }
}

#[test]
fn existing_files_grow_but_never_shrink() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.img");
    std::fs::write(&path, vec![9u8; 8192]).unwrap();
    let dev = FileDevice::open(
        &path,
        FileOptions {
            create_size: Some(4096),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(dev.size(), 8192);
    drop(dev);
    let dev = FileDevice::open(
        &path,
        FileOptions {
            create_size: Some(16384),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(dev.size(), 16384);
    let mut buf = [0u8; 2];
    dev.read_at(&mut buf, 8191).unwrap();
    assert_eq!(buf, [9, 0]);
}

#[test]
fn missing_file_without_create_size_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.img");
    let err = FileDevice::open(&path, FileOptions::default())
        .err()
        .unwrap();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert!(err.to_string().contains("missing.img"), "{err}");
    assert!(!path.exists());
}

#[test]
fn directories_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = FileDevice::open(
        dir.path(),
        FileOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("neither"), "{err}");
}

#[test]
fn read_only_refuses_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.img");
    std::fs::write(&path, vec![5u8; 4096]).unwrap();
    let dev = FileDevice::open(
        &path,
        FileOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(dev.capabilities().read_only);
    let mut buf = [0u8; 4];
    dev.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [5; 4]);
    assert_eq!(
        dev.write_at(&[1], 0, false).unwrap_err().raw_os_error(),
        Some(libc::EROFS)
    );
    assert!(dev.discard(0, 512).is_err());
    assert!(dev.write_zeroes(0, 512).is_err());
    dev.flush().unwrap();
}

#[test]
fn direct_io_handles_unaligned_buffers_and_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let dev = create(&dir, "d.img", 1 << 20, true);
    assert!(dev.describe().ends_with(",direct"));
    // Misaligned buffer pointer, aligned offset.
    let data: Vec<u8> = (0..8193).map(|i| (i % 241) as u8).collect();
    dev.write_at(&data[1..], 4096, false).unwrap();
    // Misaligned offset and length: read-modify-write.
    dev.write_at(&[0xab; 700], 4096 + 100, true).unwrap();
    let mut back = vec![0u8; 8193];
    dev.read_at(&mut back[1..], 4096).unwrap();
    let mut expect = data[1..].to_vec();
    expect[100..800].fill(0xab);
    assert_eq!(&back[1..], &expect[..]);
    // The bytes really are in the file, seen through the page cache.
    let on_disk = std::fs::read(dir.path().join("d.img")).unwrap();
    assert_eq!(&on_disk[4096..4096 + 8192], &expect[..]);
}

#[test]
fn direct_batches_read_what_single_reads_do() {
    let dir = tempfile::tempdir().unwrap();
    let size = 1u64 << 20;
    let dev = create(&dir, "b.img", size, true);
    assert!(dev.reads_in_batches());
    let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
    dev.write_at(&data, 0, false).unwrap();
    // More reads than one ring round, mixing aligned, misaligned and
    // out-of-range requests.
    let asks: Vec<(u64, usize)> = (0..150u64)
        .map(|i| match i % 3 {
            0 => (i * 4096, 4096),
            1 => (i * 4096 + 512 + 3, 1000),
            _ => (size - 4096 * (i % 5), 8192),
        })
        .collect();
    // Misaligned buffers: a read into the middle of a larger vector.
    let mut reads: Vec<BatchRead> = asks
        .iter()
        .map(|&(off, n)| BatchRead::new(vec![0xee; n], off))
        .collect();
    let mut seen = vec![0; asks.len()];
    dev.read_batch(&mut reads, &mut |i, r| {
        seen[i] += 1;
        let (off, n) = asks[i];
        if off + n as u64 > size {
            assert!(r.result.is_err(), "read {off}+{n} is out of range");
            return;
        }
        r.result.as_ref().unwrap();
        let at = off as usize;
        assert_eq!(&r.buf[..], &data[at..at + n], "read {off}+{n}");
    });
    assert!(
        seen.iter().all(|&n| n == 1),
        "each read ends once: {seen:?}"
    );
}

#[test]
fn a_panic_while_answering_a_batch_leaves_no_read_behind() {
    let dir = tempfile::tempdir().unwrap();
    let dev = create(&dir, "p.img", 1 << 20, true);
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
    dev.write_at(&data, 0, false).unwrap();
    let batch = || -> Vec<BatchRead> {
        (0..40u64)
            .map(|i| BatchRead::new(vec![0; 4096], i * 8192))
            .collect()
    };
    let mut reads = batch();
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dev.read_batch(&mut reads, &mut |_, _| panic!("answering failed"));
    }));
    assert!(first.is_err(), "the panic reaches the caller");
    // The same thread's ring holds no stale completion: the next batch
    // reads exactly what it asked for.
    let mut reads = batch();
    let mut answered = 0;
    dev.read_batch(&mut reads, &mut |i, r| {
        answered += 1;
        let at = i * 8192;
        assert_eq!(&r.buf[..], &data[at..at + 4096], "read {i}");
    });
    assert_eq!(answered, 40);
}

#[test]
fn direct_io_refuses_unaligned_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.img");
    std::fs::write(&path, vec![0u8; 1000]).unwrap();
    let opts = FileOptions {
        direct: true,
        ..Default::default()
    };
    assert!(FileDevice::open(&path, opts).is_err());
}

/// A loop device over a sparse file, detached on drop; `None` where
/// loop devices can't be set up (not root, no loop driver).
struct Loop(String);

impl Loop {
    fn attach(image: &Path) -> Option<Loop> {
        let out = std::process::Command::new("losetup")
            .arg("-f")
            .arg("--show")
            .arg(image)
            .output()
            .ok()?;
        let dev = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !dev.is_empty()).then_some(Loop(dev))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn block_device_size_io_discard_and_zeroing() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("loop.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let Some(lo) = Loop::attach(&image) else {
        eprintln!("skipped: no loop device available");
        return;
    };
    for direct in [false, true] {
        let opts = FileOptions {
            direct,
            create_size: Some(1 << 40),
            ..Default::default()
        };
        let dev = FileDevice::open(Path::new(&lo.0), opts).unwrap();
        // The size comes from the device; create_size is ignored.
        assert_eq!(dev.size(), 8 << 20);
        let caps = dev.capabilities();
        assert!(!caps.thin && caps.discard && !caps.discard_zeroes && caps.may_block);
        assert_eq!(dev.allocation(0, 4096).unwrap(), (Allocation::Mapped, 4096));
        let data: Vec<u8> = (0..8192).map(|i| (i % 199) as u8 | 1).collect();
        dev.write_at(&data, 1 << 20, true).unwrap();
        dev.write_at(&data[..100], (1 << 20) + 10, false).unwrap();
        dev.flush().unwrap();
        let mut back = vec![0u8; 8192];
        dev.read_at(&mut back, 1 << 20).unwrap();
        let mut expect = data.clone();
        expect[10..110].copy_from_slice(&data[..100]);
        assert_eq!(back, expect);
        dev.write_zeroes(1 << 20, 4096).unwrap();
        dev.read_at(&mut back, 1 << 20).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0));
        assert_eq!(&back[4096..], &expect[4096..]);
        dev.discard(0, 1 << 20).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn direct_file_matches_a_byte_vector(
        ops in proptest::collection::vec((0u64..60_000, 0usize..9000, any::<u8>(), any::<bool>()), 1..16)
    ) {
        const SIZE: u64 = 64 * 1024;
        let dir = tempfile::tempdir().unwrap();
        let dev = create(&dir, "p.img", SIZE, true);
        let mut model = vec![0u8; SIZE as usize];
        for (offset, len, byte, fua) in ops {
            let len = len.min((SIZE - offset) as usize);
            let data = vec![byte; len + 1];
            // Start one byte in so the pointer is rarely aligned.
            dev.write_at(&data[1..], offset, fua).unwrap();
            model[offset as usize..offset as usize + len].fill(byte);
        }
        let mut all = vec![0u8; SIZE as usize];
        dev.read_at(&mut all, 0).unwrap();
        prop_assert_eq!(all, model);
    }
}

#[test]
fn writes_in_parts_land_as_one_write_would() {
    let dir = tempfile::tempdir().unwrap();
    for direct in [false, true] {
        let dev = create(&dir, &format!("parts-{direct}.img"), 1 << 20, direct);
        let data: Vec<u8> = (0..64u32 << 10).map(|i| (i % 251) as u8).collect();
        // Odd part sizes, an empty one, more parts than one call takes.
        let mut parts: Vec<&[u8]> = vec![&data[..1000], &[], &data[1000..4096]];
        parts.extend(data[4096..].chunks(48));
        assert!(parts.len() > 1024);
        dev.write_parts_at(&parts, 8192, false).unwrap();
        let mut back = vec![0u8; data.len()];
        dev.read_at(&mut back, 8192).unwrap();
        assert!(back == data, "direct={direct}");
        assert!(
            dev.write_parts_at(&parts, (1 << 20) - 4096, true).is_err(),
            "past the end"
        );
    }
}
