//! A cache device lost for good: the backing's mark (the last 4 KiB of
//! the backing) says whether writes not yet written back lived on it, so
//! that a restart without it refuses rather than serve stale blocks.

mod common;

use std::sync::Arc;

use block::{BlockDevice, MemDevice};
use cache::{CacheDevice, Mode};
use common::{options, pattern, read, Rig};

const MIB: u64 = 1 << 20;

/// A blank device in place of the rig's cache device.
fn blank_cache() -> Arc<dyn BlockDevice> {
    Arc::new(MemDevice::new(MIB))
}

#[test]
fn a_restart_without_the_cache_that_holds_dirty_writes_refuses_until_they_are_given_up() {
    let rig = Rig::new(MIB, 4 * MIB);
    let old = pattern(1, 8192);
    rig.backing.write_at(&old, 0, false).unwrap();
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    let new = pattern(2, 8192);
    dev.write_at(&new, 0, false).unwrap();
    dev.flush().unwrap();
    assert!(dev.status().dirty_bytes > 0);
    drop(dev); // a crash, or a clean stop: the dirty blocks stay on the cache

    // The same cache device: warm, with its dirty blocks.
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    assert_eq!(read(&dev, 0, 8192), new);
    dev.close().unwrap();

    // The cache device lost, a blank one in its place.
    let refused = CacheDevice::open(blank_cache(), rig.backing.clone(), options(Mode::WriteBack))
        .err()
        .expect("a blank cache over a backing marked dirty is refused");
    let text = refused.to_string();
    for words in [
        "not yet written back",
        "is blank",
        "older than what was acknowledged",
        "RAID1",
        "accept_lost_writes",
    ] {
        assert!(text.contains(words), "{words:?} in {text}");
    }
    // Unreadable: refused too, saying so.
    rig.cache.set_fail_reads(true);
    let text = rig
        .open(options(Mode::WriteBack))
        .err()
        .expect("an unreadable cache is refused")
        .to_string();
    assert!(text.contains("cannot be read"), "{text}");

    // Given up explicitly: the backing serves what it has, and the mark is
    // gone for good.
    let mut o = options(Mode::WriteBack);
    o.accept_lost_writes = true;
    let cache = blank_cache();
    let dev = CacheDevice::open(cache.clone(), rig.backing.clone(), o).unwrap();
    assert_eq!(read(&dev, 0, 8192), old);
    assert!(dev.status().events.iter().any(|e| e.contains("gave up")));
    dev.close().unwrap();
    CacheDevice::open(blank_cache(), rig.backing.clone(), options(Mode::WriteBack))
        .unwrap()
        .close()
        .unwrap();
}

#[test]
fn a_backing_with_everything_written_back_stands_alone() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    dev.write_at(&pattern(3, 4096), 0, false).unwrap();
    dev.flush_dirty(&mut |_| {}).unwrap();
    // More writes after the flush mark the backing again; leaving
    // write-back writes them back and clears it.
    dev.write_at(&pattern(4, 4096), 4096, false).unwrap();
    dev.set_mode(Mode::WriteThrough, &mut |_| {}).unwrap();
    drop(dev);
    let dev = CacheDevice::open(blank_cache(), rig.backing.clone(), options(Mode::WriteBack))
        .expect("nothing was left on the lost cache");
    assert_eq!(read(&dev, 4096, 4096), pattern(4, 4096));
    dev.close().unwrap();
    // Write-through never marks the backing.
    let dev = CacheDevice::open(
        blank_cache(),
        rig.backing.clone(),
        options(Mode::WriteThrough),
    )
    .unwrap();
    dev.write_at(&pattern(5, 4096), 0, false).unwrap();
    drop(dev);
    CacheDevice::open(blank_cache(), rig.backing.clone(), options(Mode::WriteBack))
        .unwrap()
        .close()
        .unwrap();
}
