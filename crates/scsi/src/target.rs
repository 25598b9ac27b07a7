//! A SCSI target device: logical units by LUN behind one target name.
//! Answers REPORT LUNS and commands to unmapped LUNs itself, passes the
//! rest to the logical unit, and turns task management and nexus events
//! into LU state changes.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use scsi_api::{
    Answer, LunHolding, Nexus, ReadStart, ScsiCommand, ScsiResponse, ScsiTarget, TaskManagement,
    TmfResult, WriteStart,
};

use crate::cdb::{be32, put32, truncate, u8_at};
use crate::commands::{op, COMMANDS};
use crate::inquiry::unmapped_standard_inquiry;
use crate::lu::{Ctx, LogicalUnit};
use crate::registry::LuRegistry;
use crate::sense::{asc, Sense};

/// Highest LUN the flat space addressing method can express.
pub const MAX_LUN: u64 = 16383;

pub struct Target {
    name: String,
    inventory: RwLock<Inventory>,
    registry: Arc<LuRegistry>,
    /// Live I_T nexuses, to tell them when the LUN inventory changes.
    nexuses: Mutex<HashSet<Nexus>>,
}

/// How a target shows one logical unit at a LUN.
#[derive(Clone)]
pub struct Mapping {
    pub lu: Arc<LogicalUnit>,
    /// Writes through this mapping fail with DATA PROTECT and MODE SENSE
    /// shows WP; the LU itself (reservations, other mappings) is shared.
    pub read_only: bool,
}

impl Mapping {
    pub fn read_write(lu: Arc<LogicalUnit>) -> Mapping {
        Mapping {
            lu,
            read_only: false,
        }
    }
}

#[derive(Default)]
struct Inventory {
    luns: BTreeMap<u64, Mapping>,
    /// Designators of the LUs mapped read-only.
    protected: Vec<[u8; 16]>,
}

impl Inventory {
    fn new(luns: BTreeMap<u64, Mapping>) -> Inventory {
        let luns: BTreeMap<u64, Mapping> =
            luns.into_iter().filter(|(l, _)| *l <= MAX_LUN).collect();
        let protected = luns
            .values()
            .filter(|m| m.read_only)
            .map(|m| m.lu.naa())
            .collect();
        Inventory { luns, protected }
    }
}

/// The 8-byte LUN of `lun`: peripheral device addressing below 256, flat
/// space addressing (01b) above (SAM-5 4.7).
pub fn encode_lun(lun: u64) -> [u8; 8] {
    let mut l = [0u8; 8];
    if lun < 256 {
        l[1] = lun as u8;
    } else {
        l[0] = 0x40 | ((lun >> 8) & 0x3F) as u8;
        l[1] = lun as u8;
    }
    l
}

fn read_write(luns: BTreeMap<u64, Arc<LogicalUnit>>) -> BTreeMap<u64, Mapping> {
    luns.into_iter()
        .map(|(l, lu)| (l, Mapping::read_write(lu)))
        .collect()
}

impl Target {
    /// `luns`: LUN number (0..=16383) -> LU. Every LU becomes reachable
    /// through `registry` for EXTENDED COPY.
    pub fn new(
        name: &str,
        luns: BTreeMap<u64, Arc<LogicalUnit>>,
        registry: Arc<LuRegistry>,
    ) -> Arc<Target> {
        Target::with_mappings(name, read_write(luns), registry)
    }

    /// Like [`Target::new`], with per-LUN read-only mappings: several
    /// targets (or initiator groups) can show one LU, some read-only.
    pub fn with_mappings(
        name: &str,
        luns: BTreeMap<u64, Mapping>,
        registry: Arc<LuRegistry>,
    ) -> Arc<Target> {
        let inventory = Inventory::new(luns);
        for m in inventory.luns.values() {
            registry.add(m.lu.clone());
        }
        Arc::new(Target {
            name: name.to_string(),
            inventory: RwLock::new(inventory),
            registry,
            nexuses: Mutex::new(HashSet::new()),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `f` on the LU `cmd` addresses, with the command's context;
    /// `None` when no LU is mapped there. The inventory is not held while
    /// `f` runs.
    fn with_lu<T>(
        &self,
        nexus: &Nexus,
        cmd: &ScsiCommand<'_>,
        f: impl FnOnce(&Arc<LogicalUnit>, &Ctx<'_>) -> T,
    ) -> Option<T> {
        let inventory = self.inventory.read();
        let mapping = inventory.luns.get(&cmd.lun).cloned()?;
        let protected = inventory.protected.clone();
        drop(inventory);
        let ctx = Ctx {
            nexus,
            cmd,
            registry: &self.registry,
            read_only: mapping.read_only,
            protected: &protected,
        };
        Some(f(&mapping.lu, &ctx))
    }

    pub fn lu(&self, lun: u64) -> Option<Arc<LogicalUnit>> {
        self.inventory.read().luns.get(&lun).map(|m| m.lu.clone())
    }

    pub fn luns(&self) -> BTreeMap<u64, Arc<LogicalUnit>> {
        self.inventory
            .read()
            .luns
            .iter()
            .map(|(l, m)| (*l, m.lu.clone()))
            .collect()
    }

    pub fn mappings(&self) -> BTreeMap<u64, Mapping> {
        self.inventory.read().luns.clone()
    }

    /// Replaces the LUN inventory while sessions stay up; every live nexus
    /// is told REPORTED LUNS DATA HAS CHANGED.
    pub fn set_luns(&self, luns: BTreeMap<u64, Arc<LogicalUnit>>) {
        self.set_mappings(read_write(luns));
    }

    /// [`Target::set_luns`] with per-LUN read-only mappings.
    pub fn set_mappings(&self, luns: BTreeMap<u64, Mapping>) {
        let new = Inventory::new(luns);
        for m in new.luns.values() {
            self.registry.add(m.lu.clone());
        }
        let lus: Vec<Arc<LogicalUnit>> = new.luns.values().map(|m| m.lu.clone()).collect();
        let old = std::mem::replace(&mut *self.inventory.write(), new);
        let inventory = self.inventory.read();
        let same = old.luns.len() == inventory.luns.len()
            && old
                .luns
                .iter()
                .zip(inventory.luns.iter())
                .all(|((la, a), (lb, b))| {
                    la == lb && Arc::ptr_eq(&a.lu, &b.lu) && a.read_only == b.read_only
                });
        drop(inventory);
        if same {
            return;
        }
        let nexuses: Vec<Nexus> = self.nexuses.lock().iter().cloned().collect();
        for lu in lus {
            let mut st = lu.state.lock();
            for n in &nexuses {
                st.nexus(n).add_unit_attention(asc::REPORTED_LUNS_CHANGED);
            }
        }
    }

    fn report_luns(&self, nexus: &Nexus, cmd: &ScsiCommand<'_>) -> ScsiResponse {
        let cdb = cmd.cdb;
        let Some(entry) = COMMANDS.iter().find(|c| c.opcode == op::REPORT_LUNS) else {
            return ScsiResponse::check_condition(Sense::internal_failure().encode(false));
        };
        if let Err(sense) = entry.check_cdb(cdb) {
            return ScsiResponse::check_condition(sense.encode(false));
        }
        // SELECT REPORT: there are no well-known and no administrative LUs.
        let all = match u8_at(cdb, 2) {
            0x00 | 0x02 | 0x11 => true,
            0x01 | 0x10 | 0x12 => false,
            _ => return ScsiResponse::check_condition(Sense::invalid_cdb(2, None).encode(false)),
        };
        let alloc = be32(cdb, 6) as usize;
        let inventory = self.inventory.read();
        let luns = &inventory.luns;
        let mut d = vec![0u8; 8];
        if all {
            for &lun in luns.keys() {
                d.extend_from_slice(&encode_lun(lun));
            }
        }
        let len = (d.len() - 8) as u32;
        put32(&mut d, 0, len);
        // Reporting the inventory clears the notice that it changed.
        for m in luns.values() {
            if let Some(s) = m.lu.state.lock().nexuses.get_mut(nexus) {
                s.remove_unit_attention(asc::REPORTED_LUNS_CHANGED);
            }
        }
        ScsiResponse::with_data(truncate(d, alloc))
    }

    /// A command to a LUN with no logical unit (SPC-4 6.6.2, SAM-5 5.9.2).
    fn unmapped(&self, cmd: &ScsiCommand<'_>) -> ScsiResponse {
        let cdb = cmd.cdb;
        match u8_at(cdb, 0) {
            op::INQUIRY if u8_at(cdb, 1) & 0x01 == 0 => {
                let alloc = usize::from(crate::cdb::be16(cdb, 3));
                ScsiResponse::with_data(truncate(unmapped_standard_inquiry(), alloc))
            }
            op::REQUEST_SENSE => {
                let alloc = usize::from(u8_at(cdb, 4));
                let descriptor = u8_at(cdb, 1) & 0x01 != 0;
                ScsiResponse::with_data(truncate(
                    Sense::lu_not_supported().encode(descriptor),
                    alloc,
                ))
            }
            _ => ScsiResponse::check_condition(Sense::lu_not_supported().encode(false)),
        }
    }

    fn all_lus(&self) -> Vec<Arc<LogicalUnit>> {
        self.inventory
            .read()
            .luns
            .values()
            .map(|m| m.lu.clone())
            .collect()
    }
}

/// Commands that can take long even on a device that never blocks: they
/// run off the transport's reactor.
fn long_running(cdb: &[u8]) -> bool {
    matches!(
        u8_at(cdb, 0),
        op::SANITIZE
            | op::EXTENDED_COPY
            | op::SYNCHRONIZE_CACHE_10
            | op::SYNCHRONIZE_CACHE_16
            | op::WRITE_SAME_10
            | op::WRITE_SAME_16
    )
}

impl ScsiTarget for Target {
    fn execute(&self, nexus: &Nexus, cmd: &ScsiCommand<'_>) -> ScsiResponse {
        if u8_at(cmd.cdb, 0) == op::REPORT_LUNS {
            return self.report_luns(nexus, cmd);
        }
        let inventory = self.inventory.read();
        let Some(mapping) = inventory.luns.get(&cmd.lun).cloned() else {
            drop(inventory);
            return self.unmapped(cmd);
        };
        let protected = inventory.protected.clone();
        drop(inventory);
        mapping.lu.execute(&Ctx {
            nexus,
            cmd,
            registry: &self.registry,
            read_only: mapping.read_only,
            protected: &protected,
        })
    }

    fn batches(&self, lun: u64, cdb: &[u8]) -> bool {
        self.lu(lun).is_some_and(|lu| lu.batches(cdb))
    }

    fn execute_batch(
        &self,
        cmds: &[(&Nexus, ScsiCommand<'_>)],
        done: &mut dyn FnMut(usize, ScsiResponse),
    ) {
        // The mapping of each command the batch can help, looked up once
        // (not through self.batches: a second read lock could wait behind
        // a writer); the others run alone.
        let inventory = self.inventory.read();
        let protected = inventory.protected.clone();
        let mut batched = Vec::new();
        let mut alone = Vec::new();
        for (i, (_, cmd)) in cmds.iter().enumerate() {
            match inventory.luns.get(&cmd.lun) {
                Some(m) if m.lu.batches(cmd.cdb) => batched.push((i, m.clone())),
                _ => alone.push(i),
            }
        }
        drop(inventory);
        for i in alone {
            let (nexus, cmd) = &cmds[i];
            done(i, self.execute(nexus, cmd));
        }
        // One device batch per logical unit, each in arrival order.
        batched.sort_by_key(|(_, m)| Arc::as_ptr(&m.lu));
        for group in batched.chunk_by(|(_, a), (_, b)| Arc::ptr_eq(&a.lu, &b.lu)) {
            let ctxs: Vec<Ctx<'_>> = group
                .iter()
                .map(|(i, m)| Ctx {
                    nexus: cmds[*i].0,
                    cmd: &cmds[*i].1,
                    registry: &self.registry,
                    read_only: m.read_only,
                    protected: &protected,
                })
                .collect();
            group[0]
                .1
                .lu
                .read_batch(&ctxs, &mut |k, resp| done(group[k].0, resp));
        }
    }

    fn start_read(&self, nexus: &Nexus, cmd: &ScsiCommand<'_>) -> ReadStart {
        self.with_lu(nexus, cmd, |lu, ctx| {
            // A device that answers on its own threads would be read in
            // place, on the transport's thread: it reads in batches on
            // the I/O pool instead.
            if lu.batches(cmd.cdb) && !lu.device.completes_async() {
                lu.start_read(ctx)
            } else {
                ReadStart::Declined
            }
        })
        .unwrap_or(ReadStart::Declined)
    }

    fn completes_async(&self, lun: u64) -> bool {
        self.lu(lun).is_some_and(|lu| lu.device.completes_async())
    }

    fn start_async(
        &self,
        nexus: &Nexus,
        cmd: &ScsiCommand<'_>,
        answer: Answer,
    ) -> Result<(), Answer> {
        let mut answer = Some(answer);
        let started = self.with_lu(nexus, cmd, |lu, ctx| {
            let taken = answer.take().expect("taken once");
            lu.start_async(ctx, taken)
        });
        // No such LUN: `with_lu` did not call back and `answer` is here.
        started.unwrap_or_else(|| answer.map_or(Ok(()), Err))
    }

    fn start_write(&self, nexus: &Nexus, cmd: &ScsiCommand<'_>) -> WriteStart {
        self.with_lu(nexus, cmd, |lu, ctx| lu.start_write(ctx))
            .unwrap_or(WriteStart::Declined)
    }

    fn may_block(&self, lun: u64) -> bool {
        self.lu(lun).is_some_and(|lu| lu.may_block())
    }

    fn command_may_block(&self, lun: u64, cdb: &[u8]) -> bool {
        // One look at the inventory per command: this runs for every one.
        long_running(cdb)
            || self
                .lu(lun)
                .is_some_and(|lu| lu.may_block() || lu.reads_long(cdb))
    }

    fn takes_data_out_in_parts(&self, cdb: &[u8]) -> bool {
        // The plain WRITEs hand their data to the device as it is
        // (`LogicalUnit::write`); every other command wants one buffer.
        matches!(
            crate::cdb::u8_at(cdb, 0),
            op::WRITE_6 | op::WRITE_10 | op::WRITE_12 | op::WRITE_16
        )
    }

    fn lun_exists(&self, _nexus: &Nexus, lun: u64) -> bool {
        self.inventory.read().luns.contains_key(&lun)
    }

    fn task_management(&self, nexus: &Nexus, tmf: TaskManagement) -> TmfResult {
        match tmf {
            TaskManagement::AbortTask { lun, tag } => match self.lu(lun) {
                Some(lu) => {
                    lu.abort_waiting(Some(nexus), Some(tag));
                    TmfResult::Complete
                }
                None => TmfResult::LunDoesNotExist,
            },
            // The task set is shared by every nexus (TST = 0): ABORT TASK
            // SET covers the caller's tasks, CLEAR TASK SET everyone's.
            TaskManagement::AbortTaskSet { lun } | TaskManagement::ClearTaskSet { lun } => {
                match self.lu(lun) {
                    Some(lu) => {
                        let only =
                            matches!(tmf, TaskManagement::AbortTaskSet { .. }).then_some(nexus);
                        lu.abort_waiting(only, None);
                        TmfResult::Complete
                    }
                    None => TmfResult::LunDoesNotExist,
                }
            }
            // NormACA is not supported, so there is never an ACA to clear.
            TaskManagement::ClearAca { .. } => TmfResult::NotSupported,
            TaskManagement::LogicalUnitReset { lun } => match self.lu(lun) {
                Some(lu) => {
                    lu.reset();
                    TmfResult::Complete
                }
                None => TmfResult::LunDoesNotExist,
            },
            TaskManagement::TargetWarmReset | TaskManagement::TargetColdReset => {
                for lu in self.all_lus() {
                    lu.reset();
                }
                TmfResult::Complete
            }
        }
    }

    fn nexus_lost(&self, nexus: &Nexus) {
        self.nexuses.lock().remove(nexus);
        for lu in self.all_lus() {
            lu.nexus_lost(nexus);
        }
    }

    fn nexus_added(&self, nexus: &Nexus) {
        self.nexuses.lock().insert(nexus.clone());
        for lu in self.all_lus() {
            lu.nexus_added(nexus);
        }
    }

    fn nexus_luns(&self, nexus: &Nexus) -> Vec<LunHolding> {
        // The inventory is not held while the LUs are locked.
        let mappings = self.mappings();
        mappings
            .into_iter()
            .map(|(lun, m)| {
                let st = m.lu.state.lock();
                let holds = st.pr.is_holder(nexus);
                LunHolding {
                    lun,
                    read_only: m.read_only,
                    registered_key: st.pr.registration(nexus).map(|r| r.key),
                    reservation_type: st
                        .pr
                        .reservation
                        .as_ref()
                        .filter(|_| holds)
                        .map(|r| r.kind as u8),
                    reserved: st.spc2.as_ref() == Some(nexus),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
