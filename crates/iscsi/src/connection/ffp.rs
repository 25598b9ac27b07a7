//! The full feature phase of one connection.
//!
//! One loop owns all connection state (tasks by ITT, CmdSN ordering, R2Ts,
//! text exchanges, pings) and reacts to four sources: PDUs from the reader
//! task, completions from command workers, control requests from the
//! server or other sessions, and a housekeeping tick. Responses leave
//! through the writer task.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use scsi_api::{Nexus, ScsiCommand, ScsiResponse, ScsiTarget, TaskAttr};
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::command::{self, Phase, ResponseShape, Task, RESPONDING, RUNNING};
use super::gate::Gate;
use super::io::{self, OutPdu, Outgoing, ReadError, StatSn, Writer};
use super::login_phase::Established;
use super::SessionCtx;
use crate::cmdsn::{Arrival, CmdWindow};
use crate::dataout::{WriteLimits, WriteState};
use crate::negotiation::{Digest, Negotiator, Stage};
use crate::pdu::initiator::{
    LogoutRequest, NopOut, Request, ScsiCommand as ScsiCommandPdu, TextRequest,
};
use crate::pdu::target::{self, async_event, reject_reason};
use crate::pdu::{Bhs, Framing, Pdu, PduError, RESERVED_TAG};
use crate::server::Server;
use crate::session::Control;
use crate::text::{self, Accumulator};
use crate::{discovery, lun};

/// Housekeeping period (pings, logout deadline).
const TICK: Duration = Duration::from_secs(1);
/// Text request bytes accepted for one exchange.
const TEXT_LIMIT: usize = 64 * 1024;
const INCOMING_QUEUE: usize = 8;
const OUTGOING_QUEUE: usize = 512;
const READ_BUFFER: usize = 64 * 1024;
/// Data-Out PDUs kept for one command held back by CmdSN ordering.
const HELD_PDU_LIMIT: usize = 64;
/// How long teardown waits for queued responses to be written.
const FLUSH_WAIT: Duration = Duration::from_secs(5);
/// A writer that cannot take a PDU for this long means the initiator has
/// stopped reading; the connection is given up.
const WRITE_STALL: Duration = Duration::from_secs(60);

/// Logout Response codes (RFC 7143 11.15.1).
const LOGOUT_OK: u8 = 0;
const LOGOUT_CID_NOT_FOUND: u8 = 1;
const LOGOUT_RECOVERY_NOT_SUPPORTED: u8 = 2;

/// Whether the loop goes on.
pub(super) enum Flow {
    Continue,
    Close(&'static str),
}

/// Reported by a command worker when it is done.
pub(super) enum Event {
    Finished {
        itt: u32,
        serial: u64,
        responded: bool,
        tracked: bool,
        attr: TaskAttr,
    },
}

/// A non-immediate command that arrived ahead of a missing CmdSN, with any
/// Data-Out that followed it.
pub(super) struct Held {
    pub cmdsn: u32,
    pub itt: u32,
    pub lun: Option<u64>,
    pub pdus: Vec<(Bhs, Request)>,
    /// Data bytes held for this command.
    pub bytes: usize,
}

/// A Text exchange in progress (request or response spanning PDUs).
struct TextExchange {
    itt: u32,
    ttt: u32,
    lun: [u8; 8],
    request: Accumulator,
    /// Response bytes not sent yet.
    pending: Bytes,
}

/// Work handed to the SCSI layer.
struct Job {
    lun: u64,
    cdb: Vec<u8>,
    data_out: Bytes,
    data_in_len: u32,
    data_out_len: u32,
    attr: TaskAttr,
    tag: u64,
}

impl Job {
    fn run(&self, scsi: &dyn ScsiTarget, nexus: &Nexus) -> ScsiResponse {
        let cmd = ScsiCommand {
            lun: self.lun,
            cdb: &self.cdb,
            data_out: &self.data_out,
            data_in_len: self.data_in_len,
            data_out_len: self.data_out_len,
            task_attr: self.attr,
            tag: self.tag,
        };
        scsi.execute(nexus, &cmd)
    }
}

/// Which held-back commands an abort drops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HeldScope {
    Keep,
    All,
    Lun(u64),
}

/// Tasks stopped by an abort.
#[derive(Default)]
pub(super) struct Aborted {
    /// Completion signals of tasks that were running.
    pub waiters: Vec<watch::Receiver<bool>>,
    /// ITTs whose abort took effect (no response will be sent).
    pub aborted: Vec<u32>,
}

pub(super) struct Conn {
    pub server: Arc<Server>,
    pub ctx: Arc<SessionCtx>,
    pub out: mpsc::Sender<Outgoing>,
    pub window: Arc<Mutex<CmdWindow>>,
    pub events: mpsc::UnboundedSender<Event>,
    pub tasks: HashMap<u32, Task>,
    pub held: Vec<Held>,
    /// CmdSNs counted as received although their command never came
    /// (aborted by RefCmdSN before arrival).
    pub consumed: Vec<u32>,
    next_serial: u64,
    next_ttt: u32,
    write_budget: u64,
    budget_waiters: VecDeque<u32>,
    gate: Gate,
    text: Option<TextExchange>,
    text_negotiator: Negotiator,
    ping: Option<(u32, Instant)>,
    last_rx: Instant,
    logout_deadline: Option<Instant>,
}

/// Run the full feature phase until the connection ends, then tear the
/// session down.
pub(crate) async fn run(server: Arc<Server>, stream: TcpStream, est: Established) {
    let ctx = est.ctx.clone();
    let framing = Framing {
        header_digest: ctx.params.header_digest == Digest::Crc32c,
        data_digest: ctx.params.data_digest == Digest::Crc32c,
        max_data_segment: ctx.params.target_mrdsl,
    };
    let (rd, wr) = stream.into_split();
    let (in_tx, in_rx) = mpsc::channel(INCOMING_QUEUE);
    let reader = tokio::spawn(io::reader_task(
        BufReader::with_capacity(READ_BUFFER, rd),
        framing,
        in_tx,
    ));
    let window = Arc::new(Mutex::new(CmdWindow::new(
        est.exp_cmdsn,
        server.options.cmdsn_window,
    )));
    let (out_tx, out_rx) = mpsc::channel(OUTGOING_QUEUE);
    let writer =
        tokio::spawn(Writer::new(wr, framing, est.next_statsn, window.clone()).run(out_rx));
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let budget = server
        .options
        .max_write_buffer
        .max(u64::from(ctx.params.max_burst_length));
    let mut conn = Conn {
        text_negotiator: Negotiator::new(server.limits.clone()),
        server,
        ctx,
        out: out_tx,
        window,
        events: events_tx,
        tasks: HashMap::new(),
        held: Vec::new(),
        consumed: Vec::new(),
        next_serial: 0,
        next_ttt: rand::random(),
        write_budget: budget,
        budget_waiters: VecDeque::new(),
        gate: Gate::default(),
        text: None,
        ping: None,
        last_rx: Instant::now(),
        logout_deadline: None,
    };
    let cause = conn.main_loop(in_rx, est.control_rx, events_rx).await;
    conn.teardown(cause, reader, writer, est.closed_tx).await;
}

fn next_tag(t: u32) -> u32 {
    let n = t.wrapping_add(1);
    if n == RESERVED_TAG {
        0
    } else {
        n
    }
}

impl Conn {
    async fn main_loop(
        &mut self,
        mut incoming: mpsc::Receiver<Result<Pdu, ReadError>>,
        mut control: mpsc::UnboundedReceiver<Control>,
        mut events: mpsc::UnboundedReceiver<Event>,
    ) -> &'static str {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Completions first, so a finished task's ITT is free before the
            // initiator's next command is read.
            let flow = tokio::select! {
                biased;
                Some(ev) = events.recv() => self.on_event(ev).await,
                Some(c) = control.recv() => self.on_control(c).await,
                msg = incoming.recv() => match msg {
                    None => Flow::Close("connection closed by initiator"),
                    Some(Ok(pdu)) => {
                        self.last_rx = Instant::now();
                        self.on_pdu(pdu).await
                    }
                    Some(Err(e)) => self.on_read_error(e).await,
                },
                _ = tick.tick() => self.on_tick().await,
            };
            if let Flow::Close(cause) = flow {
                return cause;
            }
        }
    }

    pub(super) fn new_ttt(&mut self) -> u32 {
        self.next_ttt = next_tag(self.next_ttt);
        self.next_ttt
    }

    /// Queue a PDU for the writer; false when the connection is gone or
    /// the initiator stopped reading.
    pub(super) async fn send(&self, pdu: OutPdu) -> bool {
        self.out
            .send_timeout(Outgoing::Pdu(pdu), WRITE_STALL)
            .await
            .is_ok()
    }

    async fn send_or_close(&self, pdu: OutPdu) -> Flow {
        if self.send(pdu).await {
            Flow::Continue
        } else {
            Flow::Close("connection lost")
        }
    }

    /// Send a Reject carrying the offending header.
    pub(super) async fn reject(&self, bhs: Bhs, reason: u8, frees_window_slot: bool) -> Flow {
        let mut pdu = OutPdu::new(
            target::reject(reason),
            Bytes::copy_from_slice(&bhs.0),
            StatSn::Advance,
        );
        pdu.frees_window_slot = frees_window_slot;
        self.send_or_close(pdu).await
    }

    async fn on_read_error(&mut self, e: ReadError) -> Flow {
        match e {
            ReadError::Io(e) => {
                tracing::debug!(initiator = %self.ctx.initiator_name, error = %e, "connection read failed");
                Flow::Close("connection lost")
            }
            ReadError::Pdu { error, header, .. } => {
                tracing::warn!(initiator = %self.ctx.initiator_name, peer = %self.ctx.peer, %error, "bad PDU, closing connection");
                let reason = match error {
                    PduError::DataDigest => Some(reject_reason::DATA_DIGEST_ERROR),
                    PduError::DataSegmentTooLong { .. } => Some(reject_reason::PROTOCOL_ERROR),
                    _ => None,
                };
                // At ErrorRecoveryLevel 0 a lost PDU cannot be recovered:
                // tell the initiator why, then end the connection.
                if let (Some(bhs), Some(reason)) = (header, reason) {
                    let _ = self.reject(bhs, reason, false).await;
                }
                Flow::Close("protocol error")
            }
        }
    }

    async fn on_pdu(&mut self, pdu: Pdu) -> Flow {
        let bhs = pdu.bhs;
        match Request::parse(pdu) {
            Ok(req) => self.on_request(bhs, req).await,
            Err(PduError::UnsupportedOpcode(op)) => {
                tracing::debug!(opcode = op, "unsupported opcode rejected");
                self.reject(bhs, reject_reason::COMMAND_NOT_SUPPORTED, false)
                    .await
            }
            Err(e) => {
                tracing::debug!(error = %e, "malformed PDU rejected");
                // The command still used its CmdSN; keep the window moving.
                self.consume_if_next(&bhs);
                self.reject(bhs, reject_reason::INVALID_PDU_FIELD, false)
                    .await
            }
        }
    }

    /// A malformed command at ExpCmdSN counts as received.
    fn consume_if_next(&mut self, bhs: &Bhs) {
        if bhs.immediate() {
            return;
        }
        let cmdsn = bhs.u32_at(24);
        let mut w = self.window.lock();
        if w.classify(cmdsn) == Arrival::InOrder {
            w.accept(false);
        }
    }

    async fn on_request(&mut self, bhs: Bhs, req: Request) -> Flow {
        let (cmdsn, immediate) = match &req {
            Request::DataOut(_) => return self.on_data_out(bhs, req).await,
            Request::Login(_) | Request::Snack(_) => {
                // No login in the full feature phase; no SNACK at ERL 0.
                return self.reject(bhs, reject_reason::PROTOCOL_ERROR, false).await;
            }
            Request::ScsiCommand(c) => (c.cmdsn, c.immediate),
            Request::NopOut(n) => (n.cmdsn, n.immediate),
            Request::TaskMgmt(t) => (t.cmdsn, t.immediate),
            Request::Text(t) => (t.cmdsn, t.immediate),
            Request::Logout(l) => (l.cmdsn, l.immediate),
        };
        if immediate {
            return self.dispatch(bhs, req, false).await;
        }
        let arrival = self.window.lock().classify(cmdsn);
        match arrival {
            Arrival::InOrder => {
                let tracked = matches!(req, Request::ScsiCommand(_));
                self.window.lock().accept(tracked);
                if let Flow::Close(c) = self.dispatch(bhs, req, tracked).await {
                    return Flow::Close(c);
                }
                self.release_held().await
            }
            Arrival::Ahead => {
                self.hold(cmdsn, bhs, req);
                Flow::Continue
            }
            Arrival::Outside => {
                tracing::debug!(cmdsn, "command outside the CmdSN window dropped");
                Flow::Continue
            }
        }
    }

    fn hold(&mut self, cmdsn: u32, bhs: Bhs, req: Request) {
        let limit = self.server.options.cmdsn_window as usize;
        if self.held.len() >= limit || self.held.iter().any(|h| h.cmdsn == cmdsn) {
            return;
        }
        let (itt, lun, bytes) = match &req {
            Request::ScsiCommand(c) => (c.itt, Some(lun::decode(c.lun)), c.data.len()),
            Request::NopOut(n) => (n.itt, None, 0),
            Request::TaskMgmt(t) => (t.itt, None, 0),
            Request::Text(t) => (t.itt, None, 0),
            Request::Logout(l) => (l.itt, None, 0),
            _ => return,
        };
        self.held.push(Held {
            cmdsn,
            itt,
            lun,
            pdus: vec![(bhs, req)],
            bytes,
        });
    }

    /// Deliver held commands whose turn has come.
    pub(super) async fn release_held(&mut self) -> Flow {
        loop {
            let exp = self.window.lock().exp_cmdsn();
            if let Some(pos) = self.consumed.iter().position(|&c| c == exp) {
                self.consumed.swap_remove(pos);
                self.window.lock().accept(false);
                continue;
            }
            let Some(pos) = self.held.iter().position(|h| h.cmdsn == exp) else {
                return Flow::Continue;
            };
            let held = self.held.swap_remove(pos);
            let mut pdus = held.pdus.into_iter();
            let Some((bhs, req)) = pdus.next() else {
                continue;
            };
            let tracked = matches!(req, Request::ScsiCommand(_));
            self.window.lock().accept(tracked);
            if let Flow::Close(c) = self.dispatch(bhs, req, tracked).await {
                return Flow::Close(c);
            }
            for (bhs, req) in pdus {
                if let Flow::Close(c) = self.on_data_out(bhs, req).await {
                    return Flow::Close(c);
                }
            }
        }
    }

    async fn dispatch(&mut self, bhs: Bhs, req: Request, tracked: bool) -> Flow {
        let discovery = self.ctx.target.is_none();
        match req {
            Request::ScsiCommand(_) | Request::TaskMgmt(_) if discovery => {
                self.reject(bhs, reject_reason::PROTOCOL_ERROR, tracked)
                    .await
            }
            Request::ScsiCommand(c) => self.on_scsi_command(bhs, c, tracked).await,
            Request::NopOut(n) => self.on_nop_out(n).await,
            Request::TaskMgmt(t) => self.on_task_management(bhs, t).await,
            Request::Text(t) => self.on_text(bhs, t).await,
            Request::Logout(l) => self.on_logout(bhs, l).await,
            Request::DataOut(_) | Request::Login(_) | Request::Snack(_) => Flow::Continue,
        }
    }

    // ---- SCSI commands ----------------------------------------------------

    async fn on_scsi_command(&mut self, bhs: Bhs, c: ScsiCommandPdu, tracked: bool) -> Flow {
        if let Some(existing) = self.tasks.get(&c.itt) {
            // A task whose response is already on its way (or which was
            // aborted and has ended) no longer owns its ITT.
            let ended = match &existing.phase {
                Phase::Executing { state, done } => {
                    state.load(Ordering::Acquire) == RESPONDING || *done.borrow()
                }
                _ => false,
            };
            if !ended {
                return self
                    .reject(bhs, reject_reason::TASK_IN_PROGRESS, tracked)
                    .await;
            }
            if let Some(old) = self.tasks.remove(&c.itt) {
                self.write_budget += old.reserved;
            }
        }
        if c.read && c.write {
            // Bidirectional commands are not supported.
            return self
                .reject(bhs, reject_reason::COMMAND_NOT_SUPPORTED, tracked)
                .await;
        }
        let params = &self.ctx.params;
        let shape = ResponseShape {
            itt: c.itt,
            read: c.read,
            write: c.write,
            edtl: c.edtl,
            r2ts: 0,
            initiator_mrdsl: params.initiator_mrdsl,
            max_burst_length: params.max_burst_length,
            tracked,
        };
        if c.write && c.edtl > self.server.options.max_command_data {
            // Larger than the target is prepared to buffer for one command.
            let resp = ScsiResponse::check_condition(command::invalid_field_in_cdb_sense());
            for pdu in command::response_pdus(&shape, resp) {
                if !self.send(pdu).await {
                    return Flow::Close("connection lost");
                }
            }
            return Flow::Continue;
        }
        let write_state = if c.write {
            if !c.data.is_empty() && !params.immediate_data {
                tracing::warn!(initiator = %self.ctx.initiator_name, "immediate data without ImmediateData=Yes");
                let _ = self.reject(bhs, reject_reason::PROTOCOL_ERROR, false).await;
                return Flow::Close("protocol error");
            }
            let limits = WriteLimits {
                first_burst_length: params.first_burst_length,
                max_burst_length: params.max_burst_length,
                max_outstanding_r2t: params.max_outstanding_r2t,
            };
            let unsolicited = !c.final_ && !params.initial_r2t;
            match WriteState::new(c.edtl, c.data.len() as u32, unsolicited, limits) {
                Ok(ws) => Some(ws),
                Err(e) => {
                    tracing::warn!(initiator = %self.ctx.initiator_name, error = %e, "bad write command");
                    let _ = self.reject(bhs, reject_reason::PROTOCOL_ERROR, false).await;
                    return Flow::Close("protocol error");
                }
            }
        } else {
            None
        };
        let serial = self.next_serial;
        self.next_serial += 1;
        let complete = write_state.as_ref().is_none_or(|w| w.complete());
        let task = Task {
            serial,
            itt: c.itt,
            lun_raw: c.lun,
            lun: lun::decode(c.lun),
            tracked,
            attr: command::task_attr(c.attr),
            cdb: c.cdb,
            read: c.read,
            write: c.write,
            edtl: c.edtl,
            immediate: if c.write { c.data } else { Bytes::new() },
            data: Vec::new(),
            write_state,
            reserved: 0,
            phase: Phase::Collecting,
        };
        self.tasks.insert(c.itt, task);
        if complete {
            self.ready(c.itt).await
        } else {
            self.issue_r2ts(c.itt).await
        }
    }

    /// Solicit more write data for a task, within the connection's budget.
    async fn issue_r2ts(&mut self, itt: u32) -> Flow {
        let mut ttt = self.next_ttt;
        let mut budget = self.write_budget;
        let Some(task) = self.tasks.get_mut(&itt) else {
            return Flow::Continue;
        };
        let Some(ws) = task.write_state.as_mut() else {
            return Flow::Continue;
        };
        let before = budget;
        let requests = ws.next_r2ts(&mut budget, || {
            ttt = next_tag(ttt);
            ttt
        });
        let starving = requests.is_empty() && ws.wants_more() && ws.outstanding() == 0;
        task.reserved += before - budget;
        let lun_raw = task.lun_raw;
        self.next_ttt = ttt;
        self.write_budget = budget;
        if starving && !self.budget_waiters.contains(&itt) {
            self.budget_waiters.push_back(itt);
        }
        for r in requests {
            let bhs = target::r2t(lun_raw, itt, r.ttt, r.r2tsn, r.offset, r.len);
            if !self
                .send(OutPdu::new(bhs, Bytes::new(), StatSn::Peek))
                .await
            {
                return Flow::Close("connection lost");
            }
        }
        Flow::Continue
    }

    /// Give freed write budget to tasks that were waiting for it.
    async fn serve_budget_waiters(&mut self) -> Flow {
        for _ in 0..self.budget_waiters.len() {
            let Some(itt) = self.budget_waiters.pop_front() else {
                break;
            };
            if let Flow::Close(c) = self.issue_r2ts(itt).await {
                return Flow::Close(c);
            }
        }
        Flow::Continue
    }

    async fn on_data_out(&mut self, bhs: Bhs, req: Request) -> Flow {
        let Request::DataOut(d) = req else {
            return Flow::Continue;
        };
        let itt = d.itt;
        let Some(task) = self.tasks.get_mut(&itt) else {
            let limit = self.ctx.params.first_burst_length as usize;
            if let Some(h) = self.held.iter_mut().find(|h| h.itt == itt) {
                // Only unsolicited data can precede the command's turn.
                if h.pdus.len() < HELD_PDU_LIMIT && h.bytes + d.data.len() <= limit {
                    h.bytes += d.data.len();
                    h.pdus.push((bhs, Request::DataOut(d)));
                }
            } else {
                // Data for a command that was dropped, refused or aborted.
                tracing::debug!(itt, "Data-Out for unknown task ignored");
            }
            return Flow::Continue;
        };
        if let Phase::Draining { finals_left } = &mut task.phase {
            // A failed command: discard its data until every sequence ended.
            if d.final_ {
                *finals_left = finals_left.saturating_sub(1);
                if *finals_left == 0 {
                    return self.fail_write(itt).await;
                }
            }
            return Flow::Continue;
        }
        let (Phase::Collecting, Some(ws)) = (&task.phase, task.write_state.as_mut()) else {
            tracing::debug!(itt, "Data-Out for a task not expecting data ignored");
            return Flow::Continue;
        };
        let placement = match ws.accept(
            d.ttt,
            d.datasn,
            d.buffer_offset,
            d.data.len() as u32,
            d.final_,
        ) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(initiator = %self.ctx.initiator_name, itt, error = %e, "Data-Out sequence error, failing the command");
                let finals_left = ws.finals_after_error(d.ttt, d.final_);
                task.phase = Phase::Draining { finals_left };
                self.budget_waiters.retain(|&i| i != itt);
                if finals_left == 0 {
                    return self.fail_write(itt).await;
                }
                return Flow::Continue;
            }
        };
        let complete = ws.complete();
        // Immediate data was kept as received; assemble once more arrives.
        if task.data.is_empty() && !task.immediate.is_empty() {
            task.data.extend_from_slice(&task.immediate);
            task.immediate = Bytes::new();
        }
        let start = placement.offset as usize;
        let end = start + placement.len as usize;
        if task.data.len() < end {
            task.data.resize(end, 0);
        }
        task.data[start..end].copy_from_slice(&d.data);
        if complete {
            return self.ready(itt).await;
        }
        if placement.sequence_done {
            return self.issue_r2ts(itt).await;
        }
        Flow::Continue
    }

    /// End a write whose Data-Out could not be received (RFC 3720 6.7):
    /// CHECK CONDITION, ABORTED COMMAND, PROTOCOL SERVICE CRC ERROR.
    async fn fail_write(&mut self, itt: u32) -> Flow {
        let Some(task) = self.tasks.remove(&itt) else {
            return Flow::Continue;
        };
        self.write_budget += task.reserved;
        let shape = ResponseShape {
            itt,
            read: task.read,
            write: task.write,
            edtl: task.edtl,
            r2ts: task.write_state.as_ref().map_or(0, |w| w.r2ts_sent()),
            initiator_mrdsl: self.ctx.params.initiator_mrdsl,
            max_burst_length: self.ctx.params.max_burst_length,
            tracked: task.tracked,
        };
        let resp = ScsiResponse::check_condition(command::protocol_service_crc_error_sense());
        for pdu in command::response_pdus(&shape, resp) {
            if !self.send(pdu).await {
                return Flow::Close("connection lost");
            }
        }
        self.serve_budget_waiters().await
    }

    /// All data is in: run the task when its ordering allows.
    async fn ready(&mut self, itt: u32) -> Flow {
        let Some(task) = self.tasks.get_mut(&itt) else {
            return Flow::Continue;
        };
        if self.gate.admits(task.attr) {
            self.start(itt).await
        } else {
            task.phase = Phase::Blocked;
            self.gate.blocked.push_back(itt);
            Flow::Continue
        }
    }

    /// Start tasks released by a finished one.
    async fn unblock(&mut self) -> Flow {
        while let Some(&itt) = self.gate.blocked.front() {
            let admitted = match self.tasks.get(&itt) {
                Some(t) if matches!(t.phase, Phase::Blocked) => self.gate.admits_next(t.attr),
                _ => {
                    self.gate.blocked.pop_front();
                    continue;
                }
            };
            if !admitted {
                break;
            }
            self.gate.blocked.pop_front();
            if let Flow::Close(c) = self.start(itt).await {
                return Flow::Close(c);
            }
        }
        Flow::Continue
    }

    /// Hand a task to the SCSI layer: on a worker thread when it may block,
    /// inline otherwise.
    async fn start(&mut self, itt: u32) -> Flow {
        let (Some(target), Some(nexus)) = (self.ctx.target.clone(), self.ctx.nexus.clone()) else {
            return Flow::Continue;
        };
        let params = &self.ctx.params;
        let Some(task) = self.tasks.get_mut(&itt) else {
            return Flow::Continue;
        };
        let data_out = if task.data.is_empty() {
            std::mem::take(&mut task.immediate)
        } else {
            Bytes::from(std::mem::take(&mut task.data))
        };
        let job = Job {
            lun: task.lun,
            cdb: std::mem::take(&mut task.cdb),
            data_out,
            data_in_len: if task.read { task.edtl } else { 0 },
            data_out_len: if task.write { task.edtl } else { 0 },
            attr: task.attr,
            tag: u64::from(itt),
        };
        let shape = ResponseShape {
            itt,
            read: task.read,
            write: task.write,
            edtl: task.edtl,
            r2ts: task.write_state.as_ref().map_or(0, |w| w.r2ts_sent()),
            initiator_mrdsl: params.initiator_mrdsl,
            max_burst_length: params.max_burst_length,
            tracked: task.tracked,
        };
        if target.scsi.may_block(task.lun) {
            let state = Arc::new(AtomicU8::new(RUNNING));
            let (done_tx, done_rx) = watch::channel(false);
            task.phase = Phase::Executing {
                state: state.clone(),
                done: done_rx,
            };
            let (serial, tracked, attr) = (task.serial, task.tracked, task.attr);
            self.gate.started(attr);
            let out = self.out.clone();
            let events = self.events.clone();
            tokio::spawn(async move {
                let scsi = target.scsi.clone();
                let result = tokio::task::spawn_blocking(move || job.run(&*scsi, &nexus)).await;
                let pdus = match result {
                    Ok(resp) => command::response_pdus(&shape, resp),
                    Err(e) => {
                        tracing::error!(itt, error = %e, "SCSI command failed in the target");
                        vec![command::failure_pdu(&shape)]
                    }
                };
                // Whoever moves the state first wins: a response or an abort.
                let responded = state
                    .compare_exchange(RUNNING, RESPONDING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok();
                if responded {
                    for pdu in pdus {
                        if out.send(Outgoing::Pdu(pdu)).await.is_err() {
                            break;
                        }
                    }
                }
                let _ = done_tx.send(true);
                let _ = events.send(Event::Finished {
                    itt,
                    serial,
                    responded,
                    tracked,
                    attr,
                });
            });
            return Flow::Continue;
        }
        let reserved = task.reserved;
        self.tasks.remove(&itt);
        self.write_budget += reserved;
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| job.run(&*target.scsi, &nexus)));
        let pdus = match result {
            Ok(resp) => command::response_pdus(&shape, resp),
            Err(_) => {
                tracing::error!(itt, "SCSI command panicked in the target");
                vec![command::failure_pdu(&shape)]
            }
        };
        for pdu in pdus {
            if !self.send(pdu).await {
                return Flow::Close("connection lost");
            }
        }
        if reserved > 0 {
            return self.serve_budget_waiters().await;
        }
        Flow::Continue
    }

    async fn on_event(&mut self, ev: Event) -> Flow {
        let Event::Finished {
            itt,
            serial,
            responded,
            tracked,
            attr,
        } = ev;
        if self.tasks.get(&itt).is_some_and(|t| t.serial == serial) {
            if let Some(t) = self.tasks.remove(&itt) {
                self.write_budget += t.reserved;
            }
        }
        if !responded && tracked {
            // Aborted: no response will free the window slot.
            self.window.lock().finished();
        }
        self.gate.finished(attr);
        if let Flow::Close(c) = self.unblock().await {
            return Flow::Close(c);
        }
        self.serve_budget_waiters().await
    }

    /// Stop tasks matching `filter`: those not running yet are dropped,
    /// running ones are marked aborted (their response is suppressed) and
    /// returned as waiters. Commands held back by CmdSN order are dropped
    /// as `held` says.
    pub(super) fn abort_matching(
        &mut self,
        held: HeldScope,
        filter: impl Fn(&Task) -> bool,
    ) -> Aborted {
        let mut out = Aborted::default();
        let itts: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(_, t)| filter(t))
            .map(|(i, _)| *i)
            .collect();
        for itt in itts {
            let running = match self.tasks.get(&itt).map(|t| &t.phase) {
                Some(Phase::Executing { state, done }) => {
                    if state
                        .compare_exchange(
                            RUNNING,
                            command::ABORTED,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                    {
                        out.aborted.push(itt);
                    }
                    out.waiters.push(done.clone());
                    true
                }
                Some(_) => false,
                None => continue,
            };
            if !running {
                if let Some(t) = self.tasks.remove(&itt) {
                    self.write_budget += t.reserved;
                    if t.tracked {
                        self.window.lock().finished();
                    }
                    out.aborted.push(itt);
                }
            }
        }
        self.budget_waiters.retain(|i| !out.aborted.contains(i));
        // Commands held for CmdSN order: count them as received and drop them.
        let mut kept = Vec::new();
        for h in self.held.drain(..) {
            let matches = match held {
                HeldScope::Keep => false,
                HeldScope::All => true,
                HeldScope::Lun(l) => h.lun == Some(l),
            };
            if matches && h.lun.is_some() {
                self.consumed.push(h.cmdsn);
            } else {
                kept.push(h);
            }
        }
        self.held = kept;
        out
    }

    // ---- NOP, Text, Logout --------------------------------------------------

    async fn on_nop_out(&mut self, n: NopOut) -> Flow {
        if n.itt != RESERVED_TAG {
            // A ping: echo its data back.
            let len = n.data.len().min(self.ctx.params.initiator_mrdsl as usize);
            let bhs = target::nop_in(n.lun, n.itt, RESERVED_TAG);
            return self
                .send_or_close(OutPdu::new(bhs, n.data.slice(..len), StatSn::Advance))
                .await;
        }
        if n.ttt != RESERVED_TAG && self.ping.is_some_and(|(ttt, _)| ttt == n.ttt) {
            self.ping = None;
        }
        Flow::Continue
    }

    async fn on_text(&mut self, bhs: Bhs, t: TextRequest) -> Flow {
        if t.ttt != RESERVED_TAG {
            match &self.text {
                Some(x) if x.ttt == t.ttt && x.itt == t.itt => {
                    if !x.pending.is_empty() {
                        return self.send_text_chunk().await;
                    }
                }
                _ => {
                    return self
                        .reject(bhs, reject_reason::INVALID_PDU_FIELD, false)
                        .await
                }
            }
        } else {
            // A new exchange replaces any unfinished one.
            self.text = Some(TextExchange {
                itt: t.itt,
                ttt: RESERVED_TAG,
                lun: t.lun,
                request: Accumulator::default(),
                pending: Bytes::new(),
            });
        }
        let Some(x) = self.text.as_mut() else {
            return Flow::Continue;
        };
        if x.request.push(&t.data, TEXT_LIMIT).is_err() {
            self.text = None;
            return self.reject(bhs, reject_reason::PROTOCOL_ERROR, false).await;
        }
        if t.continue_ {
            // More request text follows: acknowledge with an empty response.
            let ttt = self.new_ttt();
            let Some(x) = self.text.as_mut() else {
                return Flow::Continue;
            };
            x.ttt = ttt;
            let bhs = target::text_response(x.lun, x.itt, ttt, false, false);
            return self
                .send_or_close(OutPdu::new(bhs, Bytes::new(), StatSn::Advance))
                .await;
        }
        let keys = match text::parse(&x.request.take()) {
            Ok(k) => k,
            Err(_) => {
                self.text = None;
                return self.reject(bhs, reject_reason::PROTOCOL_ERROR, false).await;
            }
        };
        let own_target = self.ctx.target.as_ref().map(|t| t.name.clone());
        let mut answers = Vec::new();
        let mut others = Vec::new();
        for (k, v) in keys {
            if k == "SendTargets" {
                let mut listings = self.server.listings();
                // A session's own target stays reportable after a config change.
                if let Some(own) = &self.ctx.target {
                    if !listings.iter().any(|l| l.name == own.name) {
                        listings.push(discovery::Listing {
                            name: own.name.clone(),
                            portal_group: own.portal_group,
                            portals: own.portals.clone(),
                        });
                    }
                }
                answers.extend(discovery::send_targets(
                    &v,
                    &listings,
                    self.ctx.local,
                    own_target.as_deref(),
                ));
            } else {
                others.push((k, v));
            }
        }
        answers.extend(
            self.text_negotiator
                .negotiate(Stage::FullFeature, &others)
                .unwrap_or_default(),
        );
        if let Some(x) = self.text.as_mut() {
            x.pending = Bytes::from(text::encode(&answers));
        }
        self.send_text_chunk().await
    }

    /// Send the next part of a Text response, at most the initiator's
    /// MaxRecvDataSegmentLength; C bit and a TTT when more follows.
    async fn send_text_chunk(&mut self) -> Flow {
        let max = self.ctx.params.initiator_mrdsl as usize;
        let ttt = self.new_ttt();
        let Some(x) = self.text.as_mut() else {
            return Flow::Continue;
        };
        let chunk = x.pending.split_to(x.pending.len().min(max));
        let more = !x.pending.is_empty();
        x.ttt = if more { ttt } else { RESERVED_TAG };
        let bhs = target::text_response(x.lun, x.itt, x.ttt, !more, more);
        if !more {
            self.text = None;
        }
        self.send_or_close(OutPdu::new(bhs, chunk, StatSn::Advance))
            .await
    }

    async fn on_logout(&mut self, bhs: Bhs, l: LogoutRequest) -> Flow {
        let code = match l.reason {
            0 => LOGOUT_OK,
            1 if l.cid == self.ctx.cid => LOGOUT_OK,
            1 => LOGOUT_CID_NOT_FOUND,
            2 => LOGOUT_RECOVERY_NOT_SUPPORTED,
            _ => {
                return self
                    .reject(bhs, reject_reason::INVALID_PDU_FIELD, false)
                    .await
            }
        };
        if code != LOGOUT_OK {
            let bhs = target::logout_response(l.itt, code, 0, 0);
            return self
                .send_or_close(OutPdu::new(bhs, Bytes::new(), StatSn::Advance))
                .await;
        }
        // Commands still waiting for data will not get it; running ones
        // finish and answer before the Logout Response.
        let mut waiters = Vec::new();
        let itts: Vec<u32> = self.tasks.keys().copied().collect();
        for itt in itts {
            match self.tasks.get(&itt).map(|t| &t.phase) {
                Some(Phase::Executing { done, .. }) => waiters.push(done.clone()),
                _ => {
                    if let Some(t) = self.tasks.remove(&itt) {
                        self.write_budget += t.reserved;
                    }
                }
            }
        }
        for mut w in waiters {
            let _ = w.wait_for(|d| *d).await;
        }
        let bhs = target::logout_response(l.itt, LOGOUT_OK, 0, 0);
        let _ = self
            .send(OutPdu::new(bhs, Bytes::new(), StatSn::Advance))
            .await;
        tracing::info!(initiator = %self.ctx.initiator_name, tsih = self.ctx.tsih, "logout");
        Flow::Close("logout")
    }

    // ---- control, tick, teardown ---------------------------------------------

    async fn on_control(&mut self, c: Control) -> Flow {
        match c {
            Control::Close(reason) => {
                tracing::info!(initiator = %self.ctx.initiator_name, tsih = self.ctx.tsih, ?reason, "closing session");
                Flow::Close("closed by target")
            }
            Control::RequestLogout => {
                if self.ctx.target.is_none() {
                    return Flow::Close("shutdown");
                }
                let wait = self.server.options.logout_timeout;
                let secs = wait.as_secs().clamp(1, 3600) as u16;
                let bhs = target::async_message([0; 8], async_event::LOGOUT_REQUEST, [0, 0, secs]);
                self.logout_deadline = Some(Instant::now() + wait);
                self.send_or_close(OutPdu::new(bhs, Bytes::new(), StatSn::Advance))
                    .await
            }
            Control::AbortTasks { lun, done } => {
                let scope = lun.map_or(HeldScope::All, HeldScope::Lun);
                let aborted = self.abort_matching(scope, |t| lun.is_none_or(|l| t.lun == l));
                tokio::spawn(async move {
                    for mut w in aborted.waiters {
                        let _ = w.wait_for(|d| *d).await;
                    }
                    let _ = done.send(());
                });
                Flow::Continue
            }
        }
    }

    async fn on_tick(&mut self) -> Flow {
        let now = Instant::now();
        if self.logout_deadline.is_some_and(|d| now >= d) {
            return Flow::Close("initiator did not log out");
        }
        let Some(interval) = self.server.options.nop_interval else {
            return Flow::Continue;
        };
        match self.ping {
            Some((_, sent)) if now.duration_since(sent) >= self.server.options.nop_timeout => {
                tracing::warn!(
                    initiator = %self.ctx.initiator_name, peer = %self.ctx.peer,
                    "initiator did not answer a ping, closing connection"
                );
                Flow::Close("ping timeout")
            }
            Some(_) => Flow::Continue,
            None if now.duration_since(self.last_rx) >= interval => {
                let ttt = self.new_ttt();
                self.ping = Some((ttt, now));
                let bhs = target::nop_in([0; 8], RESERVED_TAG, ttt);
                self.send_or_close(OutPdu::new(bhs, Bytes::new(), StatSn::Peek))
                    .await
            }
            None => Flow::Continue,
        }
    }

    async fn teardown(
        mut self,
        cause: &'static str,
        reader: JoinHandle<()>,
        writer: JoinHandle<()>,
        closed: watch::Sender<bool>,
    ) {
        reader.abort();
        let aborted = self.abort_matching(HeldScope::All, |_| true);
        // Write whatever is queued (a last response), then close the socket.
        let (ack_tx, ack_rx) = oneshot::channel();
        if self.out.send(Outgoing::Close(Some(ack_tx))).await.is_ok() {
            let _ = tokio::time::timeout(FLUSH_WAIT, ack_rx).await;
        }
        writer.abort();
        for mut w in aborted.waiters {
            let _ = w.wait_for(|d| *d).await;
        }
        if let (Some(target), Some(nexus)) = (self.ctx.target.clone(), self.ctx.nexus.clone()) {
            let _ = tokio::task::spawn_blocking(move || target.scsi.nexus_lost(&nexus)).await;
        }
        self.server.registry.lock().remove(self.ctx.id);
        let _ = closed.send(true);
        tracing::info!(
            initiator = %self.ctx.initiator_name,
            tsih = self.ctx.tsih,
            peer = %self.ctx.peer,
            cause,
            "session closed"
        );
    }
}
