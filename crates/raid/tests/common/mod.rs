//! Members for tests: fault-injecting devices over memory.

#![allow(dead_code)]

use std::sync::Arc;

use block::{BlockDevice, FaultyDevice, MemDevice};
use raid::{Level, RaidArray, RaidOptions};

pub const CHUNK: u64 = 4096;

pub fn faulty(size: u64) -> Arc<FaultyDevice> {
    Arc::new(FaultyDevice::new(Arc::new(MemDevice::new(size))))
}

pub fn devs(members: &[Arc<FaultyDevice>]) -> Vec<Arc<dyn BlockDevice>> {
    members
        .iter()
        .map(|m| m.clone() as Arc<dyn BlockDevice>)
        .collect()
}

pub fn options() -> RaidOptions {
    RaidOptions {
        chunk: CHUNK,
        bitmap_region: 4 * CHUNK,
        sync_speed_min: 1 << 40,
        sync_speed_max: 1 << 40,
        assume_clean: true,
        log_slots: 16,
        member_timeout: None,
        scrub_every: None,
    }
}

pub fn members_for(level: Level) -> usize {
    match level {
        Level::Raid0 => 3,
        Level::Raid1 => 3,
        Level::Raid10 => 3,
        Level::Raid5 => 4,
        Level::Raid6 => 5,
    }
}

/// An array of `n` members with `rows` chunk rows of data each.
pub fn array(
    level: Level,
    n: usize,
    spares: usize,
    rows: u64,
) -> (RaidArray, Vec<Arc<FaultyDevice>>, Vec<Arc<FaultyDevice>>) {
    let slots = if level.parity() > 0 {
        options().log_slots
    } else {
        0
    };
    let size = raid::superblock::data_offset(CHUNK, slots) + rows * CHUNK;
    let members: Vec<_> = (0..n).map(|_| faulty(size)).collect();
    let spare_devs: Vec<_> = (0..spares).map(|_| faulty(size)).collect();
    let array = RaidArray::create(level, devs(&members), devs(&spare_devs), options()).unwrap();
    (array, members, spare_devs)
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Independent copies of the members' current bytes (cache included).
pub fn copies(members: &[Arc<FaultyDevice>]) -> Vec<Arc<FaultyDevice>> {
    members
        .iter()
        .map(|m| {
            let mut bytes = vec![0u8; m.size() as usize];
            m.read_at(&mut bytes, 0).unwrap();
            let c = faulty(m.size());
            c.write_at(&bytes, 0, true).unwrap();
            c
        })
        .collect()
}

/// Bytes a member needs for `rows` rows of data with [`options`].
pub fn member_size(rows: u64) -> u64 {
    raid::superblock::data_offset(CHUNK, options().log_slots) + rows * CHUNK
}
