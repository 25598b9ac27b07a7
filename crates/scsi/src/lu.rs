//! The logical unit: one block device seen through SBC-3.
//!
//! Every command passes the same gate, in this order: a pending unit
//! attention of its I_T nexus, the operation code and CDB fields, the ALUA
//! state of the port group it came through, a running sanitize,
//! reservations. Then the handler of its module runs.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use block::{BlockDevice, Capabilities};
use parking_lot::Mutex;
use scsi_api::{status, Nexus, ScsiCommand, ScsiResponse};

use crate::block_locks::BlockLocks;
use crate::commands::{self, op, sa, Access, Command, Lookup, Needs};
use crate::config::{naa_from_seed, LuConfig};
use crate::mode::ModeParams;
use crate::nexus::NexusState;
use crate::registry::LuRegistry;
use crate::reservations::{PortPair, PrState};
use crate::sanitize::{SanitizeState, Waiter};
use crate::sense::{asc, io_sense, Failure, Sense};
use crate::{pr_file, transfer};
use export::{AccessStates, AccessWatcher, Backing};

/// Largest data transfer of one command (MAXIMUM TRANSFER LENGTH).
pub const MAX_TRANSFER_BYTES: u64 = 32 << 20;
/// Largest COMPARE AND WRITE in logical blocks (the field is one byte).
pub const MAX_COMPARE_AND_WRITE_BLOCKS: u64 = 255;
/// Preferred transfer size (OPTIMAL TRANSFER LENGTH).
pub const OPTIMAL_TRANSFER_BYTES: u64 = 1 << 20;
/// Most block descriptors one UNMAP may carry.
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;

pub(crate) type Outcome = Result<ScsiResponse, Failure>;

/// What a command needs besides the LU: who sent it and how to reach the
/// other LUs of the daemon.
pub(crate) struct Ctx<'a> {
    pub nexus: &'a Nexus,
    pub cmd: &'a ScsiCommand<'a>,
    pub registry: &'a LuRegistry,
    /// The LUN is mapped read-only for this target (view).
    pub read_only: bool,
    /// Designators of the LUs this target maps read-only, which EXTENDED
    /// COPY must not write either.
    pub protected: &'a [[u8; 16]],
}

impl Ctx<'_> {
    pub fn cdb(&self) -> &[u8] {
        self.cmd.cdb
    }

    /// The first `len` bytes of Data-Out as a parameter list; a shorter
    /// transfer than the CDB announced is a parameter list length error.
    pub fn param(&self, len: usize) -> Result<&[u8], Sense> {
        self.cmd
            .data_out
            .get(..len)
            .ok_or_else(Sense::param_list_length)
    }
}

pub(crate) struct LuState {
    /// Looked up by every command: a fast hash, and at most one entry per
    /// logged-in session.
    pub nexuses: HashMap<Nexus, NexusState, foldhash::fast::RandomState>,
    pub pr: PrState,
    /// Holder of a RESERVE(6)/RESERVE(10) reservation.
    pub spc2: Option<Nexus>,
    pub sanitize: SanitizeState,
    /// (target port group, relative target port) of every nexus seen.
    pub ports: BTreeSet<(u16, u16)>,
    /// Initiators already told about the power on.
    pub greeted: HashSet<Arc<str>>,
    /// Nexuses whose SET TARGET PORT GROUPS is being carried out: the
    /// change they asked for is no unit attention to them.
    pub stpg_from: Vec<Nexus>,
}

/// Bound on [`LuState::greeted`]; when full it starts over.
const MAX_GREETED_INITIATORS: usize = 4096;

impl LuState {
    pub fn nexus(&mut self, n: &Nexus) -> &mut NexusState {
        if !self.nexuses.contains_key(n) {
            self.admit_nexus(n);
        }
        // Found without cloning the key (two reference counts) per command.
        self.nexuses.get_mut(n).expect("admitted above")
    }

    /// Starts tracking `n`. The first I_T nexus of each initiator since the
    /// LU came up is told POWER ON, RESET OR BUS DEVICE RESET OCCURRED.
    /// Later nexuses of that initiator are not: an initiator that
    /// reconnects (libiscsi with a fresh ISID every time) resends its
    /// pending command at once and would receive the unit attention
    /// instead of its status, again after every reconnect.
    fn admit_nexus(&mut self, n: &Nexus) {
        self.ports.insert((n.portal_group, n.relative_port));
        let first = if self.greeted.contains(&n.initiator_name) {
            false
        } else {
            if self.greeted.len() >= MAX_GREETED_INITIATORS {
                self.greeted.clear();
            }
            self.greeted.insert(n.initiator_name.clone())
        };
        let state = if first {
            NexusState::fresh()
        } else {
            NexusState::default()
        };
        self.nexuses.insert(n.clone(), state);
    }

    /// Establishes a unit attention for every known nexus except `except`.
    pub fn notify_all(&mut self, code: (u8, u8), except: Option<&Nexus>) {
        for (n, s) in self.nexuses.iter_mut() {
            if Some(n) != except {
                s.add_unit_attention(code);
            }
        }
    }

    /// Establishes a unit attention for the nexuses a registration covers.
    pub fn notify_port(&mut self, port: &PortPair, code: (u8, u8)) {
        for (n, s) in self.nexuses.iter_mut() {
            if *n.initiator_name == *port.initiator
                && n.isid == port.isid
                && *n.target_name == *port.target
                && n.relative_port == port.relative_port
            {
                s.add_unit_attention(code);
            }
        }
    }
}

pub struct LogicalUnit {
    pub(crate) me: Weak<LogicalUnit>,
    pub(crate) device: Arc<dyn BlockDevice>,
    config: LuConfig,
    pub(crate) naa: [u8; 16],
    pub(crate) serial: String,
    pub(crate) block_size: u32,
    pub(crate) caps: Capabilities,
    pub(crate) mode: Mutex<ModeParams>,
    pub(crate) default_mode: ModeParams,
    pub(crate) state: Mutex<LuState>,
    pub(crate) locks: BlockLocks,
    /// The device, its range locks and write-cache policy, shared with
    /// every other unit and transport serving the device.
    backing: Arc<Backing>,
    /// The backing's ALUA states, looked at by every command.
    pub(crate) access: Arc<AccessStates>,
    /// SANITIZE commands waiting for their operation, so an abort can
    /// release them (the operation itself goes on, SBC-4 4.11.2).
    pub(crate) sanitize_waiters: Mutex<Vec<Waiter>>,
    /// Capacity in blocks as last reported, to notice resizes.
    capacity_seen: AtomicU64,
    /// The pool's soft threshold, for a volume of a pool.
    pub(crate) space_threshold: Option<Arc<block::SpaceThreshold>>,
    /// How many times the pool had reached it at this LU's last command.
    pub(crate) threshold_seen: AtomicU64,
}

/// Makes designators of LUs configured without identity unique within the
/// process.
static ANONYMOUS_LUS: AtomicU64 = AtomicU64::new(0);

/// See [`LogicalUnit::reads_long`].
const LONG_READ: u64 = 1 << 20;

impl LogicalUnit {
    /// Creates a logical unit over `device`, which no other unit or
    /// transport shares. Loads the persistent reservation state file when
    /// the configuration names one.
    pub fn new(device: Arc<dyn BlockDevice>, config: LuConfig) -> io::Result<Arc<LogicalUnit>> {
        let backing = Backing::new(device, config.write_cache);
        LogicalUnit::over(backing, config)
    }

    /// Creates a logical unit over a device shared with other units and
    /// transports: they see its range locks, and its write cache as this
    /// unit's caching mode page sets it.
    pub fn over(backing: Arc<Backing>, config: LuConfig) -> io::Result<Arc<LogicalUnit>> {
        let device = backing.device().clone();
        // The unit's caching mode page starts at its configured default.
        backing.set_write_cache(config.write_cache);
        let bs = config.block_size;
        if !bs.is_power_of_two() || !(512..=65536).contains(&bs) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("block size {bs} is not a power of two between 512 and 65536"),
            ));
        }
        if device.size() < u64::from(bs) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is smaller than one {bs}-byte block", device.describe()),
            ));
        }
        let naa = if config.naa != [0; 16] {
            config.naa
        } else if !config.serial.is_empty() {
            naa_from_seed(&format!("serial/{}", config.serial))
        } else {
            let n = ANONYMOUS_LUS.fetch_add(1, Ordering::Relaxed);
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            naa_from_seed(&format!(
                "{}/{}/{n}/{t}",
                device.describe(),
                std::process::id()
            ))
        };
        backing.set_naa(naa);
        let serial = if config.serial.is_empty() {
            naa.iter().map(|b| format!("{b:02X}")).collect()
        } else {
            config.serial.clone()
        };
        let pr = match &config.pr_state_file {
            Some(path) => pr_file::load(path)?.unwrap_or_default(),
            None => PrState::default(),
        };
        let caps = device.capabilities();
        let default_mode = ModeParams::defaults(config.write_cache);
        let capacity = device.size() / u64::from(bs);
        let space_threshold = device.space_threshold();
        let threshold_seen = space_threshold.as_ref().map_or(0, |t| t.reached());
        let access = backing.access_states().clone();
        let lu = Arc::new_cyclic(|me| LogicalUnit {
            me: me.clone(),
            device,
            naa,
            serial,
            block_size: bs,
            caps,
            mode: Mutex::new(default_mode),
            default_mode,
            state: Mutex::new(LuState {
                nexuses: HashMap::default(),
                pr,
                spc2: None,
                sanitize: SanitizeState::Idle,
                ports: BTreeSet::new(),
                greeted: HashSet::new(),
                stpg_from: Vec::new(),
            }),
            locks: BlockLocks::new(backing.clone(), bs),
            backing,
            sanitize_waiters: Mutex::new(Vec::new()),
            capacity_seen: AtomicU64::new(capacity),
            space_threshold,
            threshold_seen: AtomicU64::new(threshold_seen),
            config,
            access,
        });
        let watcher: Weak<dyn AccessWatcher> = Arc::downgrade(&lu) as Weak<LogicalUnit>;
        lu.access.watch(watcher);
        Ok(lu)
    }

    /// Makes every completed write stable.
    pub fn flush(&self) -> io::Result<()> {
        self.device.flush()
    }

    pub fn config(&self) -> &LuConfig {
        &self.config
    }

    /// The NAA designator this LU reports (VPD page 0x83).
    pub fn naa(&self) -> [u8; 16] {
        self.naa
    }

    /// Capacity in logical blocks.
    pub fn blocks(&self) -> u64 {
        self.device.size() / u64::from(self.block_size)
    }

    /// Whether commands for this LU may block the calling thread.
    pub fn may_block(&self) -> bool {
        self.caps.may_block
    }

    pub(crate) fn read_only(&self) -> bool {
        self.config.read_only || self.caps.read_only
    }

    /// Logical block provisioning management enabled (LBPME).
    pub(crate) fn thin(&self) -> bool {
        self.caps.thin && self.caps.discard
    }

    /// Unmapped blocks read as zeros (LBPRZ).
    pub(crate) fn unmapped_reads_zero(&self) -> bool {
        self.thin() && self.caps.discard_zeroes
    }

    /// The device's preferred granularity in logical blocks (1 when it has
    /// none, or one that is not a power-of-two multiple of the block size).
    pub(crate) fn granularity_blocks(&self) -> u64 {
        let g = self.device.granularity();
        let bs = u64::from(self.block_size);
        if g > bs && g.is_power_of_two() && bs.is_power_of_two() {
            g / bs
        } else {
            1
        }
    }

    pub(crate) fn max_transfer_blocks(&self) -> u64 {
        MAX_TRANSFER_BYTES / u64::from(self.block_size)
    }

    pub(crate) fn mode_params(&self) -> ModeParams {
        *self.mode.lock()
    }

    /// Whether this LU offers `c` at all.
    pub(crate) fn supports(&self, c: &Command) -> bool {
        match c.needs {
            Needs::Nothing => true,
            Needs::Provisioning => self.thin(),
            Needs::Atomic => self.atomic_limits().is_some(),
            Needs::Sanitize | Needs::SanitizeOverwrite => true,
            Needs::SanitizeBlockErase => self.thin(),
            Needs::ExplicitAlua => self.access.explicit().is_some(),
        }
    }

    /// Runs one command for `ctx.nexus`.
    pub(crate) fn execute(&self, ctx: &Ctx<'_>) -> ScsiResponse {
        self.respond(ctx, self.run(ctx))
    }

    /// The response to `ctx`'s command that ended in `outcome`.
    pub(crate) fn respond(&self, ctx: &Ctx<'_>, outcome: Outcome) -> ScsiResponse {
        let wanted = transfer::data_out_wanted(ctx.cdb(), self.block_size);
        self.respond_wanting(outcome, wanted)
    }

    /// [`LogicalUnit::respond`] for a command no longer at hand, given the
    /// Data-Out its CDB asked for.
    pub(crate) fn respond_wanting(
        &self,
        outcome: Outcome,
        data_out_wanted: Option<u32>,
    ) -> ScsiResponse {
        let mut resp = match outcome {
            Ok(r) => r,
            Err(f) => self.failure(f),
        };
        resp.data_out_wanted = data_out_wanted;
        resp
    }

    /// Whether reads of this LU run better in batches.
    pub(crate) fn reads_in_batches(&self) -> bool {
        self.device.reads_in_batches()
    }

    /// Whether `cdb` goes to [`LogicalUnit::read_batch`]: a READ of a
    /// device that reads in batches.
    pub(crate) fn batches(&self, cdb: &[u8]) -> bool {
        crate::rw::is_read(crate::cdb::u8_at(cdb, 0)) && self.reads_in_batches()
    }

    /// A READ this large copies long enough, even from memory, that the
    /// transport's thread does better sending the previous one meanwhile.
    /// WRITEs stay where their data arrived: handing a freshly received
    /// megabyte to another core cost more than it gained.
    pub(crate) fn reads_long(&self, cdb: &[u8]) -> bool {
        crate::rw::is_read(crate::cdb::u8_at(cdb, 0))
            && crate::rw::extent(cdb).blocks * u64::from(self.block_size) >= LONG_READ
    }

    pub(crate) fn failure(&self, f: Failure) -> ScsiResponse {
        match f {
            Failure::Check(sense) => {
                ScsiResponse::check_condition(sense.encode(self.mode_params().d_sense))
            }
            Failure::Status(s) => ScsiResponse::status(s),
        }
    }

    fn run(&self, ctx: &Ctx<'_>) -> Outcome {
        let command = self.accept(ctx)?;
        self.dispatch(ctx, command)
    }

    /// Everything before a command's own work: it is known and supported,
    /// a pending unit attention is reported, and sanitize and reservations
    /// let it run.
    pub(crate) fn accept(&self, ctx: &Ctx<'_>) -> Result<&'static Command, Failure> {
        let cdb = ctx.cdb();
        let Some(&opcode) = cdb.first() else {
            return Err(Sense::invalid_cdb(0, None).into());
        };
        self.notice_capacity_change();
        self.notice_threshold();
        let checked = match commands::lookup(cdb, |c| self.supports(c)) {
            Lookup::Found(c) => c.check_cdb(cdb).map(|()| c),
            Lookup::UnknownOpcode => Err(Sense::invalid_opcode()),
            Lookup::UnknownServiceAction => Err(Sense::invalid_cdb(1, Some(4))),
        };
        let exempt = commands::ignores_unit_attention(opcode);
        let command = {
            let mut st = self.state.lock();
            let ns = st.nexus(ctx.nexus);
            if !exempt {
                if let Some(code) = ns.take_unit_attention() {
                    return Err(Sense::unit_attention(code).into());
                }
            }
            let command = checked?;
            self.admit(&st, ctx, command)?;
            command
        };
        Ok(command)
    }

    /// ALUA, sanitize and reservation checks, under the state lock.
    fn admit(&self, st: &LuState, ctx: &Ctx<'_>, c: &Command) -> Result<(), Failure> {
        self.check_access(ctx, c)?;
        if let Some(sense) = st.sanitize.blocks(c) {
            return Err(sense.into());
        }
        let cdb = ctx.cdb();
        // Commands whose effect depends on their fields (SBC-3 table 13).
        let access = match c.opcode {
            op::PREVENT_ALLOW if cdb[4] & 0x03 == 0 => Access::Always,
            op::START_STOP_UNIT if cdb[4] & 0xF1 == 0x01 => Access::Always,
            _ => c.access,
        };
        if let Some(holder) = &st.spc2 {
            if holder != ctx.nexus {
                let allowed = match access {
                    Access::Always => true,
                    Access::Own => matches!(
                        c.opcode,
                        op::RELEASE_6 | op::RELEASE_10 | op::RESERVE_6 | op::RESERVE_10
                    ),
                    _ => false,
                };
                if !allowed {
                    return Err(Failure::Status(status::RESERVATION_CONFLICT));
                }
            }
        }
        if st.pr.conflicts(ctx.nexus, access) {
            return Err(Failure::Status(status::RESERVATION_CONFLICT));
        }
        Ok(())
    }

    pub(crate) fn dispatch(&self, ctx: &Ctx<'_>, c: &Command) -> Outcome {
        use op::*;
        match (c.opcode, c.service_action) {
            (TEST_UNIT_READY, _) => Ok(ScsiResponse::good()),
            (REQUEST_SENSE, _) => self.request_sense(ctx),
            (INQUIRY, _) => self.inquiry(ctx),
            (MODE_SENSE_6 | MODE_SENSE_10, _) => self.mode_sense(ctx),
            (MODE_SELECT_6 | MODE_SELECT_10, _) => self.mode_select(ctx),
            (READ_CAPACITY_10, _) => self.read_capacity_10(ctx),
            (SERVICE_ACTION_IN_16, Some(sa::READ_CAPACITY_16)) => self.read_capacity_16(ctx),
            (SERVICE_ACTION_IN_16, _) => self.get_lba_status(ctx),
            (READ_6 | READ_10 | READ_12 | READ_16, _) => self.read(ctx),
            (WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16, _) => self.write(ctx),
            (VERIFY_10 | VERIFY_12 | VERIFY_16, _) => self.verify(ctx),
            (WRITE_VERIFY_10 | WRITE_VERIFY_12 | WRITE_VERIFY_16, _) => self.write_and_verify(ctx),
            (ORWRITE_16, _) => self.orwrite(ctx),
            (COMPARE_AND_WRITE, _) => self.compare_and_write(ctx),
            (WRITE_ATOMIC_16, _) => self.write_atomic(ctx),
            (PRE_FETCH_10 | PRE_FETCH_16, _) => self.pre_fetch(ctx),
            (SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16, _) => self.synchronize_cache(ctx),
            (WRITE_SAME_10 | WRITE_SAME_16, _) => self.write_same(ctx),
            (UNMAP, _) => self.unmap(ctx),
            (START_STOP_UNIT, _) => self.start_stop_unit(ctx),
            (PREVENT_ALLOW, _) => self.prevent_allow(ctx),
            (READ_DEFECT_DATA_10 | READ_DEFECT_DATA_12, _) => self.read_defect_data(ctx),
            (RESERVE_6 | RESERVE_10, _) => self.reserve(ctx),
            (RELEASE_6 | RELEASE_10, _) => self.release(ctx),
            (PERSISTENT_RESERVE_IN, _) => self.persistent_reserve_in(ctx),
            (PERSISTENT_RESERVE_OUT, _) => self.persistent_reserve_out(ctx),
            (EXTENDED_COPY, _) => self.extended_copy(ctx),
            (RECEIVE_COPY_RESULTS, _) => self.receive_copy_results(ctx),
            (SANITIZE, _) => self.sanitize(ctx),
            (MAINTENANCE_IN, Some(sa::REPORT_SUPPORTED_OPCODES)) => {
                self.report_supported_opcodes(ctx)
            }
            (MAINTENANCE_IN, Some(sa::REPORT_SUPPORTED_TMFS)) => self.report_supported_tmfs(ctx),
            (MAINTENANCE_IN, Some(sa::REPORT_TARGET_PORT_GROUPS)) => {
                self.report_target_port_groups(ctx)
            }
            (MAINTENANCE_OUT, Some(sa::SET_TARGET_PORT_GROUPS)) => self.set_target_port_groups(ctx),
            // REPORT LUNS is answered by the target before reaching an LU;
            // an entry in the table without a handler is a bug, reported
            // rather than panicking.
            _ => Err(Sense::internal_failure().into()),
        }
    }

    /// Establishes CAPACITY DATA HAS CHANGED when the device was resized.
    fn notice_capacity_change(&self) {
        let now = self.blocks();
        if self.capacity_seen.swap(now, Ordering::Relaxed) != now {
            self.state
                .lock()
                .notify_all(asc::CAPACITY_DATA_CHANGED, None);
        }
    }

    /// A new I_T nexus: it starts with the power on unit attention.
    pub(crate) fn nexus_added(&self, n: &Nexus) {
        let mut st = self.state.lock();
        if !st.nexuses.contains_key(n) {
            st.admit_nexus(n);
        }
    }

    /// An I_T nexus is gone: its RESERVE(6/10) reservation, PREVENT state
    /// and held copy results go with it.
    pub(crate) fn nexus_lost(&self, n: &Nexus) {
        let mut st = self.state.lock();
        st.nexuses.remove(n);
        if st.spc2.as_ref() == Some(n) {
            st.spc2 = None;
        }
        let still_used = st
            .nexuses
            .keys()
            .any(|k| k.portal_group == n.portal_group && k.relative_port == n.relative_port);
        if !still_used {
            st.ports.remove(&(n.portal_group, n.relative_port));
        }
    }

    /// LOGICAL UNIT RESET (SAM-5 6.3.3): releases RESERVE(6/10), clears
    /// PREVENT, returns mode parameters to their defaults and establishes a
    /// reset unit attention for every nexus. Persistent reservations stay.
    pub(crate) fn reset(&self) {
        self.abort_waiting(None, None);
        let mut mode = self.mode.lock();
        *mode = self.default_mode;
        self.backing.set_write_cache(mode.wce);
        drop(mode);
        let mut st = self.state.lock();
        st.spc2 = None;
        for s in st.nexuses.values_mut() {
            s.prevent = false;
        }
        st.notify_all(asc::POWER_ON_RESET, None);
    }

    /// Task management aborted commands of `nexus` (all nexuses when
    /// `None`), or only the one with `tag`: commands waiting here stop.
    pub(crate) fn abort_waiting(&self, nexus: Option<&Nexus>, tag: Option<u64>) {
        for w in self.sanitize_waiters.lock().iter() {
            if nexus.is_none_or(|n| *n == w.nexus) && tag.is_none_or(|t| t == w.tag) {
                w.completion.abandon();
            }
        }
    }

    /// Offset in bytes of logical block `lba`.
    pub(crate) fn offset(&self, lba: u64) -> u64 {
        lba * u64::from(self.block_size)
    }

    /// LBA OUT OF RANGE unless `[lba, lba + blocks)` lies inside the LU.
    pub(crate) fn check_range(&self, lba: u64, blocks: u64) -> Result<(), Sense> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.blocks() => Ok(()),
            _ => Err(Sense::lba_out_of_range()),
        }
    }

    /// DATA PROTECT unless the medium may be written through `ctx`.
    pub(crate) fn check_writable(&self, ctx: &Ctx<'_>) -> Result<(), Sense> {
        self.check_writable_through(ctx.read_only)
    }

    /// DATA PROTECT unless the medium may be written through a mapping
    /// that is read-only or not.
    pub(crate) fn check_writable_through(&self, read_only_mapping: bool) -> Result<(), Sense> {
        if self.read_only() || read_only_mapping {
            return Err(Sense::write_protected());
        }
        if self.mode_params().swp {
            return Err(Sense::new(
                crate::sense::key::DATA_PROTECT,
                asc::SOFTWARE_WRITE_PROTECTED,
            ));
        }
        Ok(())
    }

    /// Whether a write must reach stable storage before completing: FUA
    /// was asked for, or the write cache is disabled (WCE = 0).
    pub(crate) fn force_unit_access(&self, fua: bool) -> bool {
        self.backing.force_unit_access(fua)
    }

    /// The device as every transport serving it shares it.
    pub fn backing(&self) -> &Arc<Backing> {
        &self.backing
    }

    /// Bytes in `blocks` logical blocks, as a buffer length.
    pub(crate) fn byte_len(&self, blocks: u64) -> Result<usize, Sense> {
        usize::try_from(blocks * u64::from(self.block_size)).map_err(|_| Sense::internal_failure())
    }

    pub(crate) fn read_blocks(&self, lba: u64, blocks: u64) -> Result<Vec<u8>, Sense> {
        let len = self.byte_len(blocks)?;
        let mut buf = scsi_api::buffers::take(len);
        let _guard = self.locks.lock(lba, blocks, false);
        self.read_locked(&mut buf, lba)?;
        Ok(buf)
    }

    pub(crate) fn write_blocks(&self, lba: u64, data: &[u8], fua: bool) -> Result<(), Sense> {
        let blocks = data.len() as u64 / u64::from(self.block_size);
        let _guard = self.locks.lock(lba, blocks, false);
        self.write_locked(data, lba, fua)
    }

    /// Like [`LogicalUnit::write_blocks`], for data in parts.
    pub(crate) fn write_blocks_parts(
        &self,
        lba: u64,
        parts: &[&[u8]],
        fua: bool,
    ) -> Result<(), Sense> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let blocks = len as u64 / u64::from(self.block_size);
        let _guard = self.locks.lock(lba, blocks, false);
        self.device
            .write_parts_at(parts, self.offset(lba), self.force_unit_access(fua))
            .map_err(|e| io_sense(&e, true))
    }

    /// Read at `lba` while the caller holds the range's lock.
    pub(crate) fn read_locked(&self, buf: &mut [u8], lba: u64) -> Result<(), Sense> {
        self.device
            .read_at(buf, self.offset(lba))
            .map_err(|e| io_sense(&e, false))
    }

    /// Write at `lba` (forced to stable storage when `fua` or WCE = 0 ask
    /// for it) while the caller holds the range's lock.
    pub(crate) fn write_locked(&self, data: &[u8], lba: u64, fua: bool) -> Result<(), Sense> {
        self.device
            .write_at(data, self.offset(lba), self.force_unit_access(fua))
            .map_err(|e| io_sense(&e, true))
    }
}

#[cfg(test)]
pub(crate) mod test_support;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod bench;
