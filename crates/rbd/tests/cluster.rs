//! RbdDevice against a real one-node Ceph cluster (scripts/ceph-fixture.sh),
//! checked from outside with the `rbd` tool. A build without librbd fails
//! here rather than passing without having tested anything.

#[cfg(not(have_librbd))]
#[test]
fn librbd_is_needed_to_test_against_ceph() {
    panic!(
        "this build has no librbd: install librbd-dev (scripts/ceph-fixture.sh does) and rebuild"
    );
}

#[cfg(have_librbd)]
mod fixture;

#[cfg(have_librbd)]
mod against_ceph {

    use std::io;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use block::{Allocation, BatchRead, BlockDevice};
    use rbd::{LockStatus, RbdConfig, RbdDevice};

    use super::fixture;

    const MIB: u64 = 1 << 20;

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn open(config: &RbdConfig) -> RbdDevice {
        RbdDevice::open(config).unwrap_or_else(|e| panic!("opening {}: {e}", config.spec()))
    }

    #[test]
    fn reads_writes_discards_and_zeroes_match_rbd_export() {
        let f = fixture::cluster();
        let config = f.config("roundtrip", 16 * MIB);
        let dev = open(&config);
        assert_eq!(dev.size(), 16 * MIB);
        assert_eq!(dev.granularity(), 4 * MIB);
        let mut model = vec![0u8; 16 * MIB as usize];
        let mut write = |dev: &RbdDevice, data: Vec<u8>, offset: u64, fua: bool| {
            dev.write_at(&data, offset, fua).unwrap();
            model[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
        };
        write(&dev, pattern(1, 4096), 0, false);
        write(&dev, pattern(2, 3 * 512), 4 * MIB - 512, true); // across objects
        write(&dev, pattern(3, 6 * MIB as usize), 8 * MIB, false);
        let parts = pattern(4, 8192);
        dev.write_parts_at(&[&parts[..1000], &parts[1000..]], 100_000, false)
            .unwrap();
        model[100_000..108_192].copy_from_slice(&parts);
        // A whole object discarded reads back as zeros; write_zeroes always.
        dev.discard(8 * MIB, 4 * MIB).unwrap();
        model[8 * MIB as usize..12 * MIB as usize].fill(0);
        dev.write_zeroes(13 * MIB + 512, 4096).unwrap();
        model[(13 * MIB + 512) as usize..(13 * MIB + 512 + 4096) as usize].fill(0);
        dev.flush().unwrap();

        let mut buf = vec![0xEEu8; 3 * 512];
        dev.read_at(&mut buf, 4 * MIB - 512).unwrap();
        assert_eq!(
            buf,
            &model[(4 * MIB - 512) as usize..(4 * MIB + 1024) as usize]
        );
        // Many reads in flight at once, answered in order.
        let mut reads: Vec<BatchRead> = (0..16)
            .map(|i| BatchRead::new(vec![0xAA; 64 * 1024], i * MIB))
            .collect();
        let mut answered = Vec::new();
        dev.read_batch(&mut reads, &mut |i, r| {
            r.result.as_ref().unwrap();
            let at = r.offset as usize;
            assert_eq!(r.buf, &model[at..at + r.buf.len()], "batch read {i}");
            answered.push(i);
        });
        assert_eq!(answered, (0..16).collect::<Vec<_>>());
        // Objects 0, 1 and 3 hold data; 2 was discarded whole.
        assert_eq!(
            dev.allocation(0, 16 * MIB).unwrap(),
            (Allocation::Mapped, 8 * MIB)
        );
        assert_eq!(
            dev.allocation(8 * MIB, 8 * MIB).unwrap(),
            (Allocation::Deallocated, 4 * MIB)
        );
        assert_eq!(
            dev.allocation(12 * MIB + 4096, 4096).unwrap(),
            (Allocation::Mapped, 4096)
        );
        let outside = dev.read_at(&mut buf, 16 * MIB - 512).unwrap_err();
        assert_eq!(outside.kind(), io::ErrorKind::InvalidInput);

        let export = f.export(&config.image);
        assert_eq!(export.len(), model.len());
        assert!(export == model, "rbd export differs from what was written");
        drop(dev);
        f.rbd(&["rm", "--no-progress", &config.spec()]);
    }

    #[test]
    fn writes_from_many_threads_are_in_flight_together() {
        let f = fixture::cluster();
        let config = f.config("parallel", 8 * MIB);
        let dev = Arc::new(open(&config));
        let written = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (dev, written) = (&dev, &written);
                s.spawn(move || {
                    for i in 0..32u64 {
                        let offset = (t * 32 + i) * 16 * 1024;
                        dev.write_at(&pattern(t as u8 + i as u8, 16 * 1024), offset, false)
                            .unwrap();
                        written.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(written.load(Ordering::Relaxed), 256);
        dev.flush().unwrap();
        let export = f.export(&config.image);
        for t in 0..8u64 {
            for i in 0..32u64 {
                let at = ((t * 32 + i) * 16 * 1024) as usize;
                assert_eq!(
                    &export[at..at + 16 * 1024],
                    &pattern(t as u8 + i as u8, 16 * 1024)[..],
                    "thread {t} write {i}"
                );
            }
        }
    }

    #[test]
    fn asynchronous_requests_are_answered_on_librbd_threads_all_in_flight_at_once() {
        let f = fixture::cluster();
        let config = f.config("answered", 8 * MIB);
        let dev = open(&config);
        assert!(dev.completes_async());
        let (tx, rx) = std::sync::mpsc::channel();
        let caller = std::thread::current().id();
        // Every write is submitted before any answer is awaited: a thread
        // per request would not be needed, and none is.
        for i in 0..64u64 {
            let tx = tx.clone();
            dev.write_async(
                pattern(i as u8, 8192),
                i * 64 * 1024,
                i % 8 == 0,
                Box::new(move |r| tx.send((i, r.map(|()| Vec::new()))).unwrap()),
            );
        }
        let mut answered = std::collections::HashSet::new();
        for _ in 0..64 {
            let (i, r) = rx.recv_timeout(Duration::from_secs(30)).expect("an answer");
            r.unwrap_or_else(|e| panic!("write {i}: {e}"));
            answered.insert(i);
        }
        assert_eq!(answered.len(), 64);
        for i in 0..64u64 {
            let tx = tx.clone();
            dev.read_async(
                i * 64 * 1024,
                8192,
                Box::new(move |r| {
                    assert_ne!(std::thread::current().id(), caller, "answered in place");
                    tx.send((i, r)).unwrap()
                }),
            );
        }
        for _ in 0..64 {
            let (i, r) = rx.recv_timeout(Duration::from_secs(30)).expect("an answer");
            assert_eq!(r.unwrap(), pattern(i as u8, 8192), "read {i}");
        }
        // Out of range: answered at once with the error.
        dev.read_async(
            8 * MIB - 512,
            1024,
            Box::new(move |r| tx.send((0, r)).unwrap()),
        );
        let (_, r) = rx.recv().unwrap();
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        dev.flush().unwrap();
        let export = f.export(&config.image);
        for i in 0..64usize {
            let at = i * 64 * 1024;
            assert_eq!(
                &export[at..at + 8192],
                &pattern(i as u8, 8192)[..],
                "write {i}"
            );
        }
    }

    #[test]
    fn flushed_writes_survive_closing_the_device() {
        let f = fixture::cluster();
        let config = f.config("durable", 8 * MIB);
        let dev = open(&config);
        dev.write_at(&pattern(9, 64 * 1024), 3 * MIB, false)
            .unwrap();
        dev.write_at(&pattern(10, 4096), 7 * MIB, true).unwrap(); // FUA
        dev.flush().unwrap();
        drop(dev);
        let export = f.export(&config.image);
        assert_eq!(
            &export[3 * MIB as usize..][..64 * 1024],
            &pattern(9, 64 * 1024)[..]
        );
        assert_eq!(&export[7 * MIB as usize..][..4096], &pattern(10, 4096)[..]);
    }

    #[test]
    fn compare_and_write_writes_only_on_a_match() {
        let f = fixture::cluster();
        let config = f.config("ats", 4 * MIB);
        let dev = open(&config);
        let old = pattern(20, 512);
        dev.write_at(&old, 4096, false).unwrap();
        let new = pattern(21, 512);
        assert_eq!(dev.compare_and_write(&old, &new, 4096).unwrap(), None);
        let mut wrong = new.clone();
        wrong[100] ^= 0xFF;
        assert_eq!(
            dev.compare_and_write(&wrong, &old, 4096).unwrap(),
            Some(100)
        );
        let mut buf = vec![0; 512];
        dev.read_at(&mut buf, 4096).unwrap();
        assert_eq!(buf, new, "a mismatching compare-and-write wrote");
    }

    #[test]
    fn snapshots_clones_and_resize_are_visible_to_the_rbd_tool() {
        let f = fixture::cluster();
        let config = f.config("snaps", 8 * MIB);
        let dev = open(&config);
        let spec = config.spec();
        dev.write_at(&pattern(30, 4096), 0, true).unwrap();
        dev.create_snapshot("before").unwrap();
        let listed = f.rbd(&["snap", "ls", &spec]);
        assert!(listed.contains("before"), "rbd snap ls: {listed}");
        assert_eq!(dev.snapshots().unwrap()[0].name, "before");

        dev.write_at(&pattern(31, 4096), 0, true).unwrap();
        dev.rollback_snapshot("before").unwrap();
        let mut buf = vec![0; 4096];
        dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(
            buf,
            pattern(30, 4096),
            "rollback did not restore the snapshot"
        );

        let clone = f.image_name("snaps-clone");
        dev.clone_snapshot("before", &f.pool, &clone).unwrap();
        let children = f.rbd(&["children", &format!("{spec}@before")]);
        assert!(children.contains(&clone), "rbd children: {children}");
        let mut clone_config = config.clone();
        clone_config.image = clone.clone();
        clone_config.create = false;
        let child = open(&clone_config);
        child.read_at(&mut buf, 0).unwrap();
        assert_eq!(
            buf,
            pattern(30, 4096),
            "the clone does not show its parent's data"
        );
        drop(child);

        dev.resize(12 * MIB).unwrap();
        assert_eq!(dev.size(), 12 * MIB);
        let info = f.rbd(&["info", &spec]);
        assert!(info.contains("size 12 MiB"), "rbd info: {info}");

        // A resize by another client is noticed through the update watch.
        let notified = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&notified);
        dev.on_update(Box::new(move || {
            seen.fetch_add(1, Ordering::Relaxed);
        }));
        f.rbd(&["resize", "--no-progress", "--size", "16M", &spec]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !dev.update_pending() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            dev.update_pending(),
            "no update notification after rbd resize"
        );
        assert!(notified.load(Ordering::Relaxed) > 0);
        assert_eq!(dev.refresh_size().unwrap(), Some(16 * MIB));
        assert_eq!(dev.size(), 16 * MIB);

        f.rbd(&["rm", "--no-progress", &format!("{}/{clone}", f.pool)]);
        dev.unprotect_snapshot("before").unwrap();
        dev.delete_snapshot("before").unwrap();
        let listed = f.rbd(&["snap", "ls", &spec]);
        assert!(
            !listed.contains("before"),
            "rbd snap ls after delete: {listed}"
        );
    }

    #[test]
    fn a_second_device_writes_only_once_the_first_lets_the_lock_go() {
        let f = fixture::cluster();
        let config = f.config("lock", 4 * MIB);
        let first = open(&config);
        assert_eq!(first.lock_status(), LockStatus::Owner);
        first.write_at(&pattern(40, 4096), 0, true).unwrap();

        let second = open(&config);
        assert_eq!(second.lock_status(), LockStatus::Standby);
        let refused = second.write_at(&pattern(41, 4096), 0, true).unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
        std::thread::sleep(Duration::from_millis(600));
        let refused = second.write_at(&pattern(41, 4096), 0, true).unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
        // The first still writes, and what the second tried never landed.
        first.write_at(&pattern(42, 4096), 4096, true).unwrap();
        assert_eq!(&f.export(&config.image)[..4096], &pattern(40, 4096)[..]);

        drop(first);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match second.write_at(&pattern(43, 4096), 0, true) {
                Ok(()) => break,
                Err(e) if Instant::now() < deadline => {
                    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("the second device never got the lock: {e}"),
            }
        }
        assert_eq!(second.lock_status(), LockStatus::Owner);
        drop(second);
        let export = f.export(&config.image);
        assert_eq!(&export[..4096], &pattern(43, 4096)[..]);
        assert_eq!(&export[4096..8192], &pattern(42, 4096)[..]);
    }

    #[test]
    fn no_write_after_the_lock_is_broken() {
        let f = fixture::cluster();
        let mut config = f.config("fenced", 4 * MIB);
        // Breaking the lock fences the whole connection: this device gets
        // one of its own (another keyring path), not the other tests'.
        let dir = tempfile::tempdir().unwrap();
        let keyring = dir.path().join("keyring");
        std::fs::copy(&f.keyring, &keyring).unwrap();
        config.keyring = Some(keyring);
        let dev = open(&config);
        dev.write_at(&pattern(50, 4096), 0, true).unwrap();
        let owners = dev.lock_owners().unwrap();
        assert_eq!(owners.len(), 1, "lock owners: {owners:?}");
        // Another client breaks the lock (which also fences this one).
        let locks = f.rbd(&["lock", "ls", "--format", "json", &config.spec()]);
        let id = json_field(&locks, "id");
        let locker = json_field(&locks, "locker");
        f.rbd(&["lock", "rm", &config.spec(), &id, &locker]);

        let deadline = Instant::now() + Duration::from_secs(20);
        let mut refused = None;
        while Instant::now() < deadline {
            match dev.write_at(&pattern(51, 4096), 0, true) {
                Ok(()) => std::thread::sleep(Duration::from_millis(200)),
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        let refused = refused.expect("writes still went through after the lock was broken");
        assert_ne!(refused.raw_os_error(), Some(libc::ETIMEDOUT), "{refused}");
        assert_eq!(dev.lock_status(), LockStatus::Lost);
        let again = dev.write_at(&pattern(52, 4096), 0, true).unwrap_err();
        assert_eq!(again.raw_os_error(), Some(libc::EROFS), "{again}");

        // An image opened afterwards with the same settings gets a fresh
        // connection instead of the fenced one.
        let mut other = config.clone();
        other.image = f.image_name("fenced-after");
        let after = open(&other);
        after.write_at(&pattern(53, 4096), 0, true).unwrap();
    }

    /// The string value of `"key":"value"` in `rbd --format json` output.
    fn json_field(json: &str, key: &str) -> String {
        let start = json
            .find(&format!("\"{key}\":\""))
            .unwrap_or_else(|| panic!("no {key} in {json}"))
            + key.len()
            + 4;
        let end = start + json[start..].find('"').expect("closing quote");
        json[start..end].to_owned()
    }

    /// With the OSD stopped, librbd's write-back cache may take a plain
    /// write, but nothing that promises stable data completes: no flush,
    /// no FUA write (either path), no read it has not cached. Once the OSD
    /// is back a flush writes what the failed ones could not.
    #[test]
    fn no_flush_completes_while_the_cluster_does_not_answer() {
        let f = fixture::cluster();
        let mut config = f.config("stalled", 8 * MIB);
        // A connection of its own, opened with the short timeout.
        let dir = tempfile::tempdir().unwrap();
        let keyring = dir.path().join("keyring");
        std::fs::copy(&f.keyring, &keyring).unwrap();
        config.keyring = Some(keyring);
        config.timeout = Duration::from_secs(3);
        let dev = open(&config);
        // The object exists (an absent one reads as zeros without asking an
        // OSD), and the range read below is not in librbd's cache.
        dev.write_at(&pattern(60, 4096), 4 * MIB, true).unwrap();
        let paused = fixture::Paused::osd(f);
        let began = Instant::now();
        // Cached: it may complete, but only a flush makes it stable.
        let cached = dev.write_at(&pattern(61, 4096), 4 * MIB + 8192, false);
        // Answered by the watchdog, since librbd will not answer in time.
        let (tx, rx) = std::sync::mpsc::channel();
        let read_tx = tx.clone();
        dev.read_async(
            6 * MIB + 8192,
            4096,
            Box::new(move |r| read_tx.send(("asynchronous read", r.map(drop))).unwrap()),
        );
        dev.write_async(
            pattern(62, 4096),
            4 * MIB + 16384,
            true,
            Box::new(move |r| tx.send(("asynchronous FUA write", r)).unwrap()),
        );
        let must_fail: Vec<(&str, io::Result<()>)> = std::thread::scope(|s| {
            let flush = s.spawn(|| dev.flush());
            let fua = s.spawn(|| dev.write_at(&pattern(63, 4096), 4 * MIB + 24576, true));
            let read = s.spawn(|| dev.read_at(&mut vec![0; 4096], 6 * MIB));
            let mut results = vec![
                ("flush", flush.join().unwrap()),
                ("FUA write", fua.join().unwrap()),
                ("read", read.join().unwrap()),
            ];
            for _ in 0..2 {
                results.push(rx.recv_timeout(Duration::from_secs(10)).expect("an answer"));
            }
            results
        });
        let took = began.elapsed();
        drop(paused);
        for (what, result) in must_fail {
            let e = result
                .err()
                .unwrap_or_else(|| panic!("{what} succeeded with the OSD stopped"));
            assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "{what}: {e}");
        }
        assert!(took < Duration::from_secs(12), "took {took:?}");
        // Once the OSD is back a flush succeeds, and it has written what
        // the failed flushes could not: a failed write-back stays dirty.
        dev.flush().unwrap();
        let export = f.export(&config.image);
        let at = |offset: u64| &export[offset as usize..offset as usize + 4096];
        assert_eq!(at(4 * MIB), &pattern(60, 4096)[..]);
        if cached.is_ok() {
            assert_eq!(at(4 * MIB + 8192), &pattern(61, 4096)[..]);
        }
        assert_eq!(at(4 * MIB + 16384), &pattern(62, 4096)[..]);
        assert_eq!(at(4 * MIB + 24576), &pattern(63, 4096)[..]);
    }

    #[test]
    fn a_missing_image_is_not_created_unless_asked() {
        let f = fixture::cluster();
        let mut config = f.config("missing", 4 * MIB);
        config.create = false;
        let e = RbdDevice::open(&config)
            .err()
            .expect("opened a missing image");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains(&config.spec()), "{e}");
    }

    #[test]
    fn an_unreachable_cluster_fails_within_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        // A monitor address nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let conf = dir.path().join("ceph.conf");
        std::fs::write(
            &conf,
            format!("[global]\nmon host = v2:127.0.0.1:{port}\nauth client required = none\n"),
        )
        .unwrap();
        let mut config = RbdConfig::new("rbd", "nowhere", &conf);
        config.client = "client.nobody".into();
        config.timeout = Duration::from_secs(3);
        let began = Instant::now();
        let e = RbdDevice::open(&config)
            .err()
            .expect("connected to nothing");
        let took = began.elapsed();
        assert!(took < Duration::from_secs(10), "took {took:?}");
        let message = e.to_string();
        assert!(
            message.contains("cannot connect to the Ceph cluster"),
            "{message}"
        );
        assert!(message.contains("client.nobody"), "{message}");
    }
}
