//! Runs a byte stream as SCSI commands from two initiators against a
//! target, the way a transport hands them on, and checks what every
//! answer must hold whatever the command. The fuzz target `scsi_commands`
//! feeds it arbitrary bytes; a property test here feeds it random ones.
//!
//! The stream is a sequence of records:
//! `[flags] [cdb length] [cdb...] [data-in length: 2 bytes]
//! [data-out length: 2 bytes] [data-out...]`, lengths big-endian, the
//! data-in length in units of 16 bytes. Flags: bits 0-1 the LUN, bit 2
//! the initiator, bit 3 a task management function instead of a command
//! (the next byte picks it), bit 4 the command goes through
//! `start_write` first, bit 5 through `execute_batch`. A record cut short
//! by the end of the stream takes zeros for what is missing.

use std::sync::Arc;

use block::BlockDevice;
use scsi_api::{
    status, Nexus, ScsiCommand, ScsiResponse, ScsiTarget, TaskAttr, TaskManagement, WriteStart,
};

use crate::{naa_from_seed, LogicalUnit, LuConfig};

/// A logical unit for such a stream: default settings, `block_size`, and
/// a designator of its own derived from `seed`, so that EXTENDED COPY can
/// name it.
pub fn logical_unit(seed: &str, device: Arc<dyn BlockDevice>, block_size: u32) -> Arc<LogicalUnit> {
    let config = LuConfig {
        naa: naa_from_seed(seed),
        block_size,
        ..LuConfig::default()
    };
    LogicalUnit::new(device, config).expect("a logical unit with default settings")
}

/// What a stream's commands were answered with.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub commands: usize,
    pub good: usize,
    pub check_condition: usize,
}

/// Runs `stream` against `target`, `initiators[0]` and `initiators[1]`
/// taking turns as its flags say. Panics when an answer breaks a rule
/// every answer must keep: one answer per command, sense data with every
/// CHECK CONDITION.
pub fn run(target: &dyn ScsiTarget, initiators: &[Nexus; 2], stream: &[u8]) -> Tally {
    let mut tally = Tally::default();
    let mut input = stream;
    while let Some((&flags, rest)) = input.split_first() {
        input = rest;
        let lun = u64::from(flags & 3);
        let nexus = &initiators[usize::from(flags >> 2 & 1)];
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
        let resp = answer(target, nexus, &cmd, flags);
        tally.commands += 1;
        match resp.status {
            status::GOOD => tally.good += 1,
            status::CHECK_CONDITION => {
                assert!(
                    well_formed_sense(&resp.sense),
                    "CHECK CONDITION without valid sense data for CDB {:02x?}: {:02x?}",
                    &cdb,
                    resp.sense
                );
                tally.check_condition += 1;
            }
            _ => {}
        }
    }
    tally
}

fn answer(
    target: &dyn ScsiTarget,
    nexus: &Nexus,
    cmd: &ScsiCommand<'_>,
    flags: u8,
) -> ScsiResponse {
    if flags & 0x10 != 0 {
        let started = ScsiCommand {
            data_out: &[],
            ..*cmd
        };
        match target.start_write(nexus, &started) {
            WriteStart::Answered(resp) => return resp,
            WriteStart::Started(write) => {
                let failed = write.write(0, cmd.data_out).err();
                return write.finish(failed);
            }
            WriteStart::Declined => {}
        }
    }
    if flags & 0x20 == 0 {
        return target.execute(nexus, cmd);
    }
    let mut answer = None;
    target.execute_batch(&[(nexus, ScsiCommand { ..*cmd })], &mut |i, resp| {
        assert_eq!(i, 0, "execute_batch answered a command it was not given");
        assert!(
            answer.replace(resp).is_none(),
            "execute_batch answered twice"
        );
    });
    answer.expect("execute_batch did not answer")
}

/// Fixed or descriptor format (SPC-4 4.5), its additional length within
/// the bytes, and a sense key that says something went wrong.
fn well_formed_sense(sense: &[u8]) -> bool {
    let (Some(&code), Some(&additional)) = (sense.first(), sense.get(7)) else {
        return false;
    };
    let key = match code & 0x7F {
        0x70 | 0x71 => sense.get(2).map(|k| k & 0x0F),
        0x72 | 0x73 => sense.get(1).map(|k| k & 0x0F),
        _ => None,
    };
    sense.len() >= 8 + usize::from(additional) && key.is_some_and(|k| k != 0)
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use block::MemDevice;
    use pool::{MetadataLocation, Pool};
    use proptest::prelude::*;

    use super::*;
    use crate::commands::COMMANDS;
    use crate::lu::test_support::nexus;
    use crate::{LuRegistry, Target};

    /// A clone of a snapshot of a volume with data, in a pool of 48 units
    /// under a volume of 64: writes can run the pool out of space.
    fn thin_clone() -> Arc<dyn BlockDevice> {
        const UNIT: u64 = 4096;
        let meta = MetadataLocation::Device(Arc::new(MemDevice::new(8 << 20)));
        let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(49 * UNIT));
        let pool = Pool::create("p", vec![data], &meta, UNIT).unwrap();
        pool.create_volume("base", 64 * UNIT).unwrap();
        let base = pool.volume("base").unwrap();
        base.write_at(&[0xA5; 4 * UNIT as usize], 0, false).unwrap();
        pool.snapshot("base", "snap").unwrap();
        pool.clone_snapshot("snap", "clone").unwrap();
        Arc::new(pool.volume("clone").unwrap())
    }

    /// Memory LUNs of 512- and 4096-byte blocks at 0 and 1, the thin
    /// clone at 2, nothing at 3.
    fn target() -> Arc<Target> {
        let mut luns = BTreeMap::new();
        let memory = |size| -> Arc<dyn BlockDevice> { Arc::new(MemDevice::new(size)) };
        luns.insert(0, logical_unit("s/0", memory(256 << 10), 512));
        luns.insert(1, logical_unit("s/1", memory(256 << 10), 4096));
        luns.insert(2, logical_unit("s/2", thin_clone(), 512));
        Target::new("iqn.2026-11.org.openarray:s", luns, LuRegistry::new())
    }

    fn initiators() -> [Nexus; 2] {
        [
            nexus("iqn.2026-11.org.test:a"),
            nexus("iqn.2026-11.org.test:b"),
        ]
    }

    fn record(flags: u8, cdb: &[u8], data_in_len: u16, data_out: &[u8]) -> Vec<u8> {
        let mut r = vec![flags, cdb.len() as u8];
        r.extend_from_slice(cdb);
        r.extend_from_slice(&data_in_len.to_be_bytes());
        r.extend_from_slice(&(data_out.len() as u16).to_be_bytes());
        r.extend_from_slice(data_out);
        r
    }

    /// INQUIRY of LUNs 0 to 2 from the first initiator, then a READ(10)
    /// of LUN 0 from the second, which reservations may refuse.
    fn inquiry_of_every_lun() -> Vec<u8> {
        let mut stream: Vec<u8> = (0..3)
            .flat_map(|lun| record(lun, &[0x12, 0, 0, 0, 0x60, 0], 6, &[]))
            .collect();
        stream.extend(record(0x04, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], 32, &[]));
        stream
    }

    #[test]
    fn writes_and_reads_on_every_path_are_good() {
        let target = target();
        let initiators = initiators();
        // The first command of each initiator to each LUN meets the unit
        // attention of a new nexus; TEST UNIT READY takes it.
        let waking: Vec<u8> = [0, 1, 2, 4, 5, 6]
            .into_iter()
            .flat_map(|flags| record(flags, &[0; 6], 0, &[]))
            .collect();
        let woken = run(&*target, &initiators, &waking);
        assert_eq!(woken.check_condition, 6, "{woken:?}");

        let mut stream = Vec::new();
        let write10 = [0x2a, 0, 0, 0, 0, 8, 0, 0, 2, 0];
        stream.extend(record(0, &write10, 0, &[0x5A; 1024]));
        stream.extend(record(0x10, &write10, 0, &[0x5A; 1024]));
        stream.extend(record(0x22, &[0x28, 0, 0, 0, 0, 8, 0, 0, 2, 0], 64, &[]));
        stream.extend(record(0x06, &write10, 0, &[0x5A; 1024]));
        stream.extend(record(1, &[0x2a, 0, 0, 0, 0, 1, 0, 0, 1, 0], 0, &[7; 4096]));
        let tally = run(&*target, &initiators, &stream);
        assert_eq!(tally.commands, 5);
        assert_eq!(tally.good, 5, "{tally:?}");
    }

    /// A CDB for one of the commands the target knows: its opcode and
    /// service action, other bits from `noise` where its usage mask
    /// allows them, about half of the bytes zero so that LBAs and lengths
    /// often fall within the small LUNs.
    fn known_cdb(pick: usize, noise: &[u8]) -> Vec<u8> {
        let usage = COMMANDS[pick % COMMANDS.len()].usage;
        let mut cdb: Vec<u8> = usage
            .iter()
            .zip(noise.iter().cycle())
            .map(|(&mask, &n)| if n & 1 == 0 { 0 } else { mask & n })
            .collect();
        cdb[0] = usage[0];
        if usage.len() > 1 {
            cdb[1] = (cdb[1] & !0x1F) | (usage[1] & 0x1F);
        }
        cdb
    }

    fn stream_of_known_commands() -> impl Strategy<Value = Vec<u8>> {
        let one = (
            any::<u8>(),
            any::<usize>(),
            prop::collection::vec(any::<u8>(), 32),
            any::<u16>(),
            prop::collection::vec(any::<u8>(), 0..1100),
        )
            .prop_map(|(flags, pick, noise, din, dout)| {
                if flags & 0x08 != 0 {
                    vec![flags, noise[0]]
                } else {
                    record(flags, &known_cdb(pick, &noise), din >> 4, &dout)
                }
            });
        prop::collection::vec(one, 1..40).prop_map(|r| r.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Any commands from two initiators, then: every LUN still answers
        /// INQUIRY, so no stream leaves a LUN stuck.
        #[test]
        fn any_command_stream_is_answered_and_leaves_luns_serving(
            stream in prop_oneof![
                stream_of_known_commands(),
                prop::collection::vec(any::<u8>(), 0..2048),
            ]
        ) {
            let target = target();
            let initiators = initiators();
            run(&*target, &initiators, &stream);
            let after = run(&*target, &initiators, &inquiry_of_every_lun());
            prop_assert_eq!(after.commands, 4);
            prop_assert!(after.good >= 3, "{:?}", after);
        }
    }
}
