//! Drives a LogicalUnit the way a transport would.

use super::*;
use scsi_api::TaskAttr;

pub fn nexus(name: &str) -> Nexus {
    Nexus {
        initiator_name: name.into(),
        isid: [0x80, 0, 0, 0, 0, 1],
        target_name: "iqn.2026-11.org.openarray:test".into(),
        relative_port: 1,
        portal_group: 1,
    }
}

pub fn lu_with(size: u64, config: LuConfig) -> Arc<LogicalUnit> {
    LogicalUnit::new(Arc::new(block::MemDevice::new(size)), config).unwrap()
}

pub fn lu() -> Arc<LogicalUnit> {
    lu_with(
        1 << 20,
        LuConfig {
            naa: naa_from_seed("test"),
            ..LuConfig::default()
        },
    )
}

pub fn run(lu: &LogicalUnit, n: &Nexus, cdb: &[u8], data_out: &[u8]) -> ScsiResponse {
    let registry = LuRegistry::new();
    registry.add(lu.me.upgrade().unwrap());
    run_with(lu, n, cdb, data_out, &registry)
}

pub fn run_with(
    lu: &LogicalUnit,
    n: &Nexus,
    cdb: &[u8],
    data_out: &[u8],
    registry: &LuRegistry,
) -> ScsiResponse {
    run_as(lu, n, cdb, data_out, registry, false)
}

/// Like [`run`], from a transport that can send Data-In from files.
pub fn run_zero_copy(lu: &LogicalUnit, n: &Nexus, cdb: &[u8]) -> ScsiResponse {
    let registry = LuRegistry::new();
    registry.add(lu.me.upgrade().unwrap());
    run_as(lu, n, cdb, &[], &registry, true)
}

fn run_as(
    lu: &LogicalUnit,
    n: &Nexus,
    cdb: &[u8],
    data_out: &[u8],
    registry: &LuRegistry,
    zero_copy: bool,
) -> ScsiResponse {
    let mut full = cdb.to_vec();
    full.resize(full.len().max(16), 0);
    let cmd = ScsiCommand {
        data_out,
        zero_copy,
        ..command(&full, 1 << 24, data_out.len() as u32)
    };
    lu.execute(&ctx(n, &cmd, registry))
}

/// A SIMPLE command for LUN 0 with no Data-Out in hand.
pub fn command(cdb: &[u8], data_in_len: u32, data_out_len: u32) -> ScsiCommand<'_> {
    ScsiCommand {
        lun: 0,
        cdb,
        data_out: &[],
        data_in_len,
        data_out_len,
        task_attr: TaskAttr::Simple,
        tag: 1,
        zero_copy: false,
        data_out_parts: &[],
    }
}

/// The context a transport gives `cmd` from `n`, on a writable mapping.
pub fn ctx<'a>(n: &'a Nexus, cmd: &'a ScsiCommand<'a>, registry: &'a LuRegistry) -> Ctx<'a> {
    Ctx {
        nexus: n,
        cmd,
        registry,
        read_only: false,
        protected: &[],
    }
}

/// A registry holding `lu` alone.
pub fn registry_of(lu: &Arc<LogicalUnit>) -> Arc<LuRegistry> {
    let registry = LuRegistry::new();
    registry.add(lu.clone());
    registry
}

/// A 10-byte medium access CDB (READ, WRITE, ...).
pub fn rw10(opcode: u8, flags: u8, lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![opcode, flags];
    c.extend_from_slice(&lba.to_be_bytes());
    c.push(0);
    c.extend_from_slice(&blocks.to_be_bytes());
    c.push(0);
    c
}

/// Runs a command on a nexus whose power-on unit attention has been
/// consumed.
pub fn ready(lu: &LogicalUnit, n: &Nexus) {
    let _ = run(lu, n, &[0; 6], &[]);
}

/// (sense key, ASC, ASCQ) of a fixed-format CHECK CONDITION.
pub fn sense_of(r: &ScsiResponse) -> (u8, u8, u8) {
    assert_eq!(
        r.status,
        status::CHECK_CONDITION,
        "expected CHECK CONDITION, got {r:?}"
    );
    (r.sense[2] & 0x0F, r.sense[12], r.sense[13])
}
