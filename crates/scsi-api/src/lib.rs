//! The seam between a transport and the SCSI command set.
//!
//! A transport (iSCSI today, NBD later) turns its wire format into a
//! [`ScsiCommand`] and hands it to a [`ScsiTarget`]; it gets back a
//! [`ScsiResponse`]. The transport knows nothing of CDB meaning beyond the
//! transfer length and direction it was told on the wire; the command set
//! knows nothing of PDUs.

use std::fs::File;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

pub mod buffers;

/// SCSI status byte values (SAM-5).
pub mod status {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const CONDITION_MET: u8 = 0x04;
    pub const BUSY: u8 = 0x08;
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    pub const TASK_SET_FULL: u8 = 0x28;
    pub const ACA_ACTIVE: u8 = 0x30;
    pub const TASK_ABORTED: u8 = 0x40;
}

/// Identifies one I_T nexus: an initiator port talking to a target port.
///
/// Persistent reservations, unit attentions and RESERVE/RELEASE are all
/// tracked per nexus, so two sessions from the same initiator name with
/// different ISIDs are different nexuses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Nexus {
    /// Initiator name, e.g. `iqn.1994-05.com.redhat:abc`.
    pub initiator_name: Arc<str>,
    /// Initiator session id (ISID), 6 bytes, as the transport defines it.
    pub isid: [u8; 6],
    /// Target name the session logged in to.
    pub target_name: Arc<str>,
    /// Relative target port identifier (1-based) of the port the session uses.
    pub relative_port: u16,
    /// Target portal group tag of that port.
    pub portal_group: u16,
}

impl Nexus {
    /// SCSI initiator port name as SPC-4 7.6.4.6 spells it for iSCSI:
    /// `<name>,i,0x<isid hex>`.
    pub fn initiator_port_name(&self) -> String {
        let mut s = String::with_capacity(self.initiator_name.len() + 17);
        s.push_str(&self.initiator_name);
        s.push_str(",i,0x");
        for b in self.isid {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }
}

/// Task attribute from the transport (SAM-5 8.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TaskAttr {
    #[default]
    Simple,
    Ordered,
    HeadOfQueue,
    Aca,
    /// The transport sent an attribute value that SAM does not define.
    Untagged,
}

/// One SCSI command as a transport delivers it.
#[derive(Debug)]
pub struct ScsiCommand<'a> {
    /// LUN as a 64-bit number in SAM flat/peripheral addressing already
    /// decoded to the plain LUN number (0..16383).
    pub lun: u64,
    pub cdb: &'a [u8],
    /// Data the initiator sent (Data-Out), at most the expected transfer length.
    pub data_out: &'a [u8],
    /// The same data in the pieces the transport received it in, in order,
    /// for commands the target takes it so
    /// ([`ScsiTarget::takes_data_out_in_parts`]):
    /// `data_out` is then empty. Joining them would be one more copy of
    /// every byte written.
    pub data_out_parts: &'a [&'a [u8]],
    /// Expected data transfer length the initiator announced for Data-In.
    /// The command set may produce more or less; the transport reports
    /// the difference as residual.
    pub data_in_len: u32,
    /// Expected data transfer length for Data-Out, as announced.
    pub data_out_len: u32,
    pub task_attr: TaskAttr,
    /// Transport task tag, for task management.
    pub tag: u64,
    /// The transport can send Data-In straight from a file
    /// ([`ScsiResponse::data_in_file`]) instead of from memory.
    pub zero_copy: bool,
}

impl ScsiCommand<'_> {
    /// How many bytes of Data-Out came, in one piece or in parts.
    pub fn data_out_total(&self) -> usize {
        self.data_out.len() + self.data_out_parts.iter().map(|p| p.len()).sum::<usize>()
    }
}

/// What the command set answers.
#[derive(Debug, Default)]
pub struct ScsiResponse {
    pub status: u8,
    /// Sense data (fixed or descriptor format), empty if none.
    pub sense: Vec<u8>,
    /// Data-In produced by the command. May be longer than the transport's
    /// expected length: the transport truncates and reports overflow.
    pub data_in: Vec<u8>,
    /// Data-In that is a region of a file instead (`data_in` is then
    /// empty): only for commands that allowed it ([`ScsiCommand::zero_copy`]).
    pub data_in_file: Option<FileRegion>,
    /// Data-In left in the buffer the device read it into (`data_in` is
    /// then empty), sent from there rather than from a copy.
    pub data_in_held: Option<HeldData>,
    /// For commands with Data-Out: how many bytes the CDB asked for, so the
    /// transport can report residual over/underflow. `None` when the
    /// command carries no Data-Out.
    pub data_out_wanted: Option<u32>,
}

/// Data-In held in a file whose pages are memory (tmpfs): the transport
/// hands the pages to the socket instead of copying them out first.
///
/// The bytes are those of the file when the transport sends them, not when
/// the command ran; see docs/design.md for why that is allowed.
#[derive(Clone, Debug)]
pub struct FileRegion {
    pub file: Arc<File>,
    pub offset: u64,
    pub len: usize,
}

/// Data-In a response hands to the transport where it already is, rather
/// than copied into a buffer of its own:
/// - the buffer of an O_DIRECT read: copying it out first cost the
///   target about a sixth of its time per 4K read, the device having just
///   written it behind the CPU's caches;
/// - a file's pages through a mapping (`file_pages`): the bytes are then
///   those of the file when the transport sends them, as with
///   [`FileRegion`], and only for commands that allowed that
///   ([`ScsiCommand::zero_copy`]). The transport must hand them to the
///   kernel only, never read them itself (block::MappedBytes says why).
pub struct HeldData {
    pub bytes: Box<dyn AsRef<[u8]> + Send + Sync>,
    pub file_pages: bool,
}

impl HeldData {
    /// Bytes no one else changes (an O_DIRECT read's own buffer).
    pub fn owned(bytes: Box<dyn AsRef<[u8]> + Send + Sync>) -> HeldData {
        HeldData {
            bytes,
            file_pages: false,
        }
    }

    /// A file's pages, which later writes change.
    pub fn file_pages(bytes: Box<dyn AsRef<[u8]> + Send + Sync>) -> HeldData {
        HeldData {
            bytes,
            file_pages: true,
        }
    }
}

impl AsRef<[u8]> for HeldData {
    fn as_ref(&self) -> &[u8] {
        self.bytes.as_ref().as_ref()
    }
}

impl std::fmt::Debug for HeldData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HeldData({} bytes, file pages: {})",
            self.as_ref().len(),
            self.file_pages
        )
    }
}

impl FileRegion {
    /// The region's bytes in memory, zeros past the end of the file.
    pub fn read(&self) -> std::io::Result<Vec<u8>> {
        let mut buf = buffers::take(self.len);
        let mut done = 0;
        while done < self.len {
            match self
                .file
                .read_at(&mut buf[done..], self.offset + done as u64)
            {
                Ok(0) => {
                    buf[done..].fill(0);
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(buf)
    }
}

impl ScsiResponse {
    /// How many bytes of Data-In the command produced.
    pub fn data_in_len(&self) -> usize {
        match (&self.data_in_file, &self.data_in_held) {
            (Some(region), _) => region.len,
            (None, Some(held)) => held.as_ref().len(),
            (None, None) => self.data_in.len(),
        }
    }

    pub fn good() -> Self {
        ScsiResponse::default()
    }

    pub fn with_data(data_in: Vec<u8>) -> Self {
        ScsiResponse {
            data_in,
            ..Default::default()
        }
    }

    pub fn with_held(held: HeldData) -> Self {
        ScsiResponse {
            data_in_held: Some(held),
            ..Default::default()
        }
    }

    pub fn check_condition(sense: Vec<u8>) -> Self {
        ScsiResponse {
            status: status::CHECK_CONDITION,
            sense,
            ..Default::default()
        }
    }

    pub fn status(status: u8) -> Self {
        ScsiResponse {
            status,
            ..Default::default()
        }
    }
}

/// Task management functions (SAM-5 7), as carried by iSCSI TMF requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskManagement {
    AbortTask { lun: u64, tag: u64 },
    AbortTaskSet { lun: u64 },
    ClearAca { lun: u64 },
    ClearTaskSet { lun: u64 },
    LogicalUnitReset { lun: u64 },
    TargetWarmReset,
    TargetColdReset,
}

/// Result of a task management function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmfResult {
    Complete,
    TaskDoesNotExist,
    LunDoesNotExist,
    NotSupported,
    Rejected,
}

/// Answers a command started with [`ScsiTarget::start_async`]: called once,
/// on whichever thread the device ended it on. It must not block.
pub type Answer = Box<dyn FnOnce(ScsiResponse) + Send>;

/// A READ whose device read the transport runs itself, e.g. on an
/// io_uring of its own thread, so that no other thread is woken for it:
/// it reads `len` bytes of `fd` at `offset` into `buf`, then turns the
/// outcome into the response with `finish`.
pub trait StartedRead: Send {
    /// The file to read; a read in flight holds its own reference to it.
    fn fd(&self) -> RawFd;
    fn offset(&self) -> u64;
    /// Where the bytes go. The memory stays put until `finish`, even when
    /// the value moves.
    fn buf(&mut self) -> &mut [u8];
    /// The response, given how many bytes the read put in `buf` (fewer
    /// than its length are read again here) or why it failed.
    fn finish(self: Box<Self>, read: io::Result<usize>) -> ScsiResponse;
}

/// What [`ScsiTarget::start_read`] made of a command.
pub enum ReadStart {
    /// Answered without the device (a check failed, or nothing to read).
    Answered(ScsiResponse),
    Started(Box<dyn StartedRead>),
    /// Not started, nothing done: run it with `execute` or `execute_batch`.
    Declined,
}

/// A WRITE whose data the transport puts in place itself as it arrives,
/// instead of collecting it and calling [`ScsiTarget::execute`]: the
/// command was accepted and checked when it started, its bytes go into
/// the device's memory as they come off the network, and `finish` answers
/// it once they all have.
pub trait StartedWrite: Send + Sync {
    /// Writes `bytes` that arrived in memory at `at` within the write.
    fn write(&self, at: usize, bytes: &[u8]) -> io::Result<()>;

    /// Lets `fill` put up to `len` bytes at `at` straight into the
    /// device's memory; it returns how many it put there. `fill` gets an
    /// address and a length, and must write that memory only through a
    /// system call (`recv`): it is a shared mapping of a file, where a
    /// store of its own could fault (SIGBUS) when the file system cannot
    /// back a page, and a system call fails with EFAULT instead.
    fn fill(&self, at: usize, len: usize, fill: &mut Fill<'_>) -> io::Result<usize>;

    /// The response, once every byte is in place, or after `failed` kept
    /// some from being written.
    fn finish(self: Box<Self>, failed: Option<io::Error>) -> ScsiResponse;
}

/// What [`StartedWrite::fill`] calls with an address and a length: puts
/// bytes there through a system call and says how many.
pub type Fill<'a> = dyn FnMut(*mut u8, usize) -> io::Result<usize> + 'a;

/// What [`ScsiTarget::start_write`] made of a command.
pub enum WriteStart {
    /// Refused by a check: the answer, to send once the initiator has sent
    /// its data (which is not written).
    Answered(ScsiResponse),
    Started(Box<dyn StartedWrite>),
    /// Not started, nothing done: collect its data and `execute` it.
    Declined,
}

/// One LUN as an I_T nexus sees it, with what that nexus holds there;
/// for listings of sessions, not for the data path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LunHolding {
    pub lun: u64,
    /// Writes through this mapping are refused.
    pub read_only: bool,
    /// The persistent reservation key the nexus registered, if any.
    pub registered_key: Option<u64>,
    /// The type code (SPC-4 table 188) of the persistent reservation the
    /// nexus holds, if it holds one.
    pub reservation_type: Option<u8>,
    /// The nexus holds a RESERVE(6)/RESERVE(10) reservation.
    pub reserved: bool,
}

/// A SCSI target device as the transport sees it: a set of logical units
/// behind one target name.
pub trait ScsiTarget: Send + Sync {
    /// Execute one command. May block on device I/O; see
    /// [`ScsiTarget::may_block`].
    fn execute(&self, nexus: &Nexus, cmd: &ScsiCommand<'_>) -> ScsiResponse;

    /// Whether `cdb` for `lun` runs better in a batch with others
    /// ([`ScsiTarget::execute_batch`]) than alone: reads of a device that
    /// has them all in flight at once.
    fn batches(&self, lun: u64, cdb: &[u8]) -> bool {
        let _ = (lun, cdb);
        false
    }

    /// Execute several commands, each as [`ScsiTarget::execute`] would,
    /// calling `done` with a command's index and response as soon as it
    /// has ended, once per command. The commands are independent: they may
    /// run and end in any order.
    fn execute_batch(
        &self,
        cmds: &[(&Nexus, ScsiCommand<'_>)],
        done: &mut dyn FnMut(usize, ScsiResponse),
    ) {
        for (i, (nexus, cmd)) in cmds.iter().enumerate() {
            done(i, self.execute(nexus, cmd));
        }
    }

    /// Start a command that [`ScsiTarget::batches`] as a read the
    /// transport runs itself, checked and accepted as
    /// [`ScsiTarget::execute`] would. Never blocks: a command that would
    /// wait (for a range another command holds) is declined untouched.
    fn start_read(&self, nexus: &Nexus, cmd: &ScsiCommand<'_>) -> ReadStart {
        let _ = (nexus, cmd);
        ReadStart::Declined
    }

    /// Whether [`ScsiTarget::start_async`] may take commands for `lun`:
    /// its device ends requests on threads of its own.
    fn completes_async(&self, lun: u64) -> bool {
        let _ = lun;
        false
    }

    /// Start a command on a device that ends requests on threads of its
    /// own (a network device such as an RBD image), checked and accepted
    /// as [`ScsiTarget::execute`] would: `answer` gets the response where
    /// the device ended the command, maybe before this returns. Never
    /// blocks. A command not taken so comes back with its `answer`
    /// untouched, to run with `execute`. Data-Out is complete.
    fn start_async(
        &self,
        nexus: &Nexus,
        cmd: &ScsiCommand<'_>,
        answer: Answer,
    ) -> Result<(), Answer> {
        let _ = (nexus, cmd);
        Err(answer)
    }

    /// Start a WRITE whose Data-Out has not arrived yet, checked and
    /// accepted as [`ScsiTarget::execute`] would, for the transport to put
    /// its data in place as it comes ([`StartedWrite`]). `cmd.data_out` is
    /// empty; `cmd.data_out_len` is the length the transport will receive.
    /// Never blocks. Declines untouched what it cannot start so.
    fn start_write(&self, nexus: &Nexus, cmd: &ScsiCommand<'_>) -> WriteStart {
        let _ = (nexus, cmd);
        WriteStart::Declined
    }

    /// True when executing commands for `lun` may block the calling thread
    /// (file-backed devices). Transports run such commands off the reactor.
    fn may_block(&self, lun: u64) -> bool;

    /// Like [`ScsiTarget::may_block`], for one command: some commands
    /// (SANITIZE, EXTENDED COPY, ...) can run for a long time even on a
    /// LUN whose device never blocks. Transports that can choose per
    /// command should ask this instead.
    fn command_may_block(&self, lun: u64, cdb: &[u8]) -> bool {
        let _ = cdb;
        self.may_block(lun)
    }

    /// Whether the command `cdb` takes its Data-Out in the pieces the
    /// transport received ([`ScsiCommand::data_out_parts`]) instead of
    /// one buffer. A target that says yes reads the parts of such
    /// commands; the default is one buffer for every command.
    fn takes_data_out_in_parts(&self, cdb: &[u8]) -> bool {
        let _ = cdb;
        false
    }

    /// Whether a LUN is mapped for this nexus.
    fn lun_exists(&self, nexus: &Nexus, lun: u64) -> bool;

    /// Task management. The transport has already aborted/cleared its own
    /// bookkeeping for affected tasks; the target resets its state
    /// (reservations, unit attentions, mode pages) as SAM/SPC require.
    fn task_management(&self, nexus: &Nexus, tmf: TaskManagement) -> TmfResult;

    /// A session is gone (logout, connection drop, reinstatement): releases
    /// RESERVE(6/10) reservations held by it and resets PREVENT state.
    fn nexus_lost(&self, nexus: &Nexus);

    /// A new I_T nexus was established (login). Targets use this to queue
    /// the power-on/reset unit attention for it.
    fn nexus_added(&self, nexus: &Nexus);

    /// The LUNs `nexus` sees, in order, with its reservations there. Takes
    /// each logical unit's state lock briefly: for administration only.
    fn nexus_luns(&self, nexus: &Nexus) -> Vec<LunHolding> {
        let _ = nexus;
        Vec::new()
    }
}

/// Stand-ins for transport tests and fuzzing.
pub mod testing {
    use super::*;

    /// A target without logical units: every LUN is unknown, and commands
    /// get an empty GOOD response. Login never reaches a target's LUNs, so
    /// this is all a login test needs.
    pub struct NoLuns;

    impl ScsiTarget for NoLuns {
        fn execute(&self, _: &Nexus, _: &ScsiCommand<'_>) -> ScsiResponse {
            ScsiResponse::default()
        }
        fn may_block(&self, _: u64) -> bool {
            false
        }
        fn lun_exists(&self, _: &Nexus, _: u64) -> bool {
            false
        }
        fn task_management(&self, _: &Nexus, _: TaskManagement) -> TmfResult {
            TmfResult::Complete
        }
        fn nexus_lost(&self, _: &Nexus) {}
        fn nexus_added(&self, _: &Nexus) {}
    }
}
