//! Run arbitrary SCSI commands, as an initiator may send them, against a
//! target with two small memory LUNs (512- and 4096-byte blocks), a thin
//! clone of a pool's snapshot on a pool too small to fill it, and one LUN
//! number that is not mapped. `scsi::command_stream` reads the input as
//! commands and task management of two initiators, and checks every
//! answer.

#![no_main]

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use block::{BlockDevice, MemDevice};
use libfuzzer_sys::fuzz_target;
use pool::{MetadataLocation, Pool};
use scsi::command_stream::logical_unit;
use scsi::{LuRegistry, Target};
use scsi_api::{Nexus, ScsiTarget};

fn nexus(name: &str) -> Nexus {
    Nexus {
        initiator_name: name.into(),
        isid: [0x80, 0, 0, 0, 0, 1],
        target_name: "iqn.2026-11.org.openarray:fuzz".into(),
        relative_port: 1,
        portal_group: 1,
    }
}

fn memory(size: u64) -> Arc<dyn BlockDevice> {
    Arc::new(MemDevice::new(size))
}

/// A pool of 48 units of 4 KiB holding a snapshot of a volume of 64 with
/// data in its first units. Made once: a pool takes far longer to create
/// than an input takes to run.
fn pool() -> &'static Arc<Pool> {
    const UNIT: u64 = 4096;
    static POOL: OnceLock<Arc<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let meta = MetadataLocation::Device(memory(8 << 20));
        let pool = Pool::create("fuzz", vec![memory(49 * UNIT)], &meta, UNIT).unwrap();
        pool.create_volume("base", 64 * UNIT).unwrap();
        let base = pool.volume("base").unwrap();
        base.write_at(&[0xA5; 4 * UNIT as usize], 0, false).unwrap();
        pool.snapshot("base", "snap").unwrap();
        pool
    })
}

/// A new clone of the pool's snapshot, for one input: reads go through
/// the clone's parent, and writes can run the pool out of space.
/// [`drop_thin_clone`] deletes it, so every input starts from the same
/// pool.
fn thin_clone() -> Arc<dyn BlockDevice> {
    pool().clone_snapshot("snap", "clone").unwrap();
    Arc::new(pool().volume("clone").unwrap())
}

fn drop_thin_clone() {
    pool().delete("clone").unwrap();
}

/// A fresh target for every input, so that no state carries over and a
/// crash replays from its input alone.
fn target() -> Arc<Target> {
    let mut luns = BTreeMap::new();
    luns.insert(0, logical_unit("fuzz/0", memory(256 << 10), 512));
    luns.insert(1, logical_unit("fuzz/1", memory(256 << 10), 4096));
    luns.insert(2, logical_unit("fuzz/2", thin_clone(), 512));
    Target::new("iqn.2026-11.org.openarray:fuzz", luns, LuRegistry::new())
}

fn initiators() -> &'static [Nexus; 2] {
    static INITIATORS: OnceLock<[Nexus; 2]> = OnceLock::new();
    INITIATORS.get_or_init(|| {
        [
            nexus("iqn.2026-11.org.fuzz:a"),
            nexus("iqn.2026-11.org.fuzz:b"),
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let target = target();
    for n in initiators() {
        target.nexus_added(n);
    }
    scsi::command_stream::run(&*target, initiators(), data);
    for n in initiators() {
        target.nexus_lost(n);
    }
    drop(target);
    drop_thin_clone();
});
