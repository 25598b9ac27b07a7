//! Run arbitrary SCSI commands, as an initiator may send them, against a
//! target with two small memory LUNs (512- and 4096-byte blocks), a thin
//! clone of a pool's snapshot on a pool too small to fill it, and one LUN
//! number that is not mapped. Two initiators take turns, so
//! reservations and unit attentions of one meet the commands of the other.
//!
//! The input is a sequence of records:
//! `[flags] [cdb length] [cdb...] [data-in length: 2 bytes]
//! [data-out length: 2 bytes] [data-out...]`.
//! Flags: bits 0-1 the LUN, bit 2 the initiator, bit 3 a task management
//! function instead of a command (the next byte picks it), bit 4 the
//! command goes through `start_write` first, bit 5 through
//! `execute_batch`.

#![no_main]

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use block::{BlockDevice, MemDevice};
use libfuzzer_sys::fuzz_target;
use pool::{MetadataLocation, Pool};
use scsi::{naa_from_seed, LogicalUnit, LuConfig, LuRegistry, Target};
use scsi_api::{
    Nexus, ScsiCommand, ScsiResponse, ScsiTarget, TaskAttr, TaskManagement, WriteStart,
};

fn nexus(name: &str) -> Nexus {
    Nexus {
        initiator_name: name.into(),
        isid: [0x80, 0, 0, 0, 0, 1],
        target_name: "iqn.2026-11.org.openarray:fuzz".into(),
        relative_port: 1,
        portal_group: 1,
    }
}

fn lu(seed: &str, device: Arc<dyn BlockDevice>, block_size: u32) -> Arc<LogicalUnit> {
    let config = LuConfig {
        naa: naa_from_seed(seed),
        block_size,
        ..LuConfig::default()
    };
    LogicalUnit::new(device, config).unwrap()
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
    luns.insert(0, lu("fuzz/0", memory(256 << 10), 512));
    luns.insert(1, lu("fuzz/1", memory(256 << 10), 4096));
    luns.insert(2, lu("fuzz/2", thin_clone(), 512));
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

/// Takes `n` bytes off the front of `input`, or what is left.
fn take<'a>(input: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, rest) = input.split_at(n.min(input.len()));
    *input = rest;
    head
}

fn take_byte(input: &mut &[u8]) -> u8 {
    take(input, 1).first().copied().unwrap_or(0)
}

fn take_u16(input: &mut &[u8]) -> u16 {
    u16::from_be_bytes([take_byte(input), take_byte(input)])
}

fn tmf(pick: u8, lun: u64) -> TaskManagement {
    match pick % 7 {
        0 => TaskManagement::AbortTask { lun, tag: 1 },
        1 => TaskManagement::AbortTaskSet { lun },
        2 => TaskManagement::ClearAca { lun },
        3 => TaskManagement::ClearTaskSet { lun },
        4 => TaskManagement::LogicalUnitReset { lun },
        5 => TaskManagement::TargetWarmReset,
        _ => TaskManagement::TargetColdReset,
    }
}

/// What every answer must hold, whatever the command.
fn check(resp: &ScsiResponse) {
    if resp.status == 0x02 {
        assert!(resp.sense.len() >= 8, "CHECK CONDITION without sense data");
    }
}

fn run(target: &Target, nexus: &Nexus, cmd: &ScsiCommand<'_>, flags: u8) {
    if flags & 0x10 != 0 {
        let started = ScsiCommand {
            data_out: &[],
            ..*cmd
        };
        match target.start_write(nexus, &started) {
            WriteStart::Answered(resp) => return check(&resp),
            WriteStart::Started(write) => {
                let len = (cmd.data_out_len as usize).min(cmd.data_out.len());
                let failed = write.write(0, &cmd.data_out[..len]).err();
                return check(&write.finish(failed));
            }
            WriteStart::Declined => {}
        }
    }
    if flags & 0x20 != 0 {
        let batch = [(nexus, ScsiCommand { ..*cmd })];
        let mut answers = 0;
        target.execute_batch(&batch, &mut |i, resp| {
            assert_eq!(i, 0);
            answers += 1;
            check(&resp);
        });
        assert_eq!(answers, 1, "execute_batch answered {answers} times");
    } else {
        check(&target.execute(nexus, cmd));
    }
}

fuzz_target!(|data: &[u8]| {
    let target = target();
    for n in initiators() {
        target.nexus_added(n);
    }
    let mut input = data;
    while let Some((&flags, rest)) = input.split_first() {
        input = rest;
        let lun = u64::from(flags & 3);
        let nexus = &initiators()[usize::from(flags >> 2 & 1)];
        if flags & 0x08 != 0 {
            target.task_management(nexus, tmf(take_byte(&mut input), lun));
            continue;
        }
        let cdb_len = usize::from(take_byte(&mut input) % 33);
        // The transport hands on at least the 16 bytes of the BHS's field.
        let mut cdb = take(&mut input, cdb_len).to_vec();
        cdb.resize(cdb.len().max(16), 0);
        let data_in_len = u32::from(take_u16(&mut input)) << 4;
        let wanted = usize::from(take_u16(&mut input));
        // It also gathers the whole Data-Out before a command runs.
        let data_out = take(&mut input, wanted);
        let cmd = ScsiCommand {
            lun,
            cdb: &cdb,
            data_out,
            data_out_parts: &[],
            data_in_len,
            data_out_len: data_out.len() as u32,
            task_attr: TaskAttr::Simple,
            tag: 1,
            zero_copy: false,
        };
        run(&target, nexus, &cmd, flags);
    }
    for n in initiators() {
        target.nexus_lost(n);
    }
    drop(target);
    drop_thin_clone();
});
