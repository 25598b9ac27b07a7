//! The full feature phase of one connection.
//!
//! One loop owns all connection state (tasks by ITT, CmdSN ordering, R2Ts,
//! text exchanges, pings) and reacts to four sources: PDUs from the reader
//! task, completions from command workers, control requests from the
//! server or other sessions, and a housekeeping tick. Responses leave
//! through the writer task. A command's life is in tasks.rs, pings,
//! control requests, Logout and teardown in upkeep.rs.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use peer_limits::{OutgoingBudget, Stalled};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::command::TaskTable;
use super::exec::{self, Completion, ConnExec, Finished};
use super::gate::Gate;
use super::io::{Frame, OutPdu, Outgoing, PduReader, ReadError, StatSn, Writer};
use super::login_phase::Established;
use super::prestart::Prestarted;
use super::ring;
use super::SessionCtx;
use crate::cmdsn::{Arrival, CmdWindow};
use crate::lun;
use crate::negotiation::{Digest, Negotiator};
use crate::pdu::initiator::Request;
use crate::pdu::target::{self, reject_reason};
use crate::pdu::{Bhs, Framing, Opcode, Pdu, PduError, RESERVED_TAG};
use crate::server::Server;
use crate::session::Control;

/// Housekeeping period (pings, logout deadline).
const TICK: Duration = Duration::from_secs(1);
const OUTGOING_QUEUE: usize = 512;
/// Data-Out PDUs kept for one command held back by CmdSN ordering.
pub(super) const HELD_PDU_LIMIT: usize = 64;

/// Whether the loop goes on.
pub(super) enum Flow {
    Continue,
    Close(&'static str),
}

/// Reported by the I/O pool.
pub(super) enum Event {
    /// Commands that ran on the pool, in the order they finished.
    Completed(Vec<Completion>),
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

/// Which held-back commands an abort drops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HeldScope {
    Keep,
    All,
    Lun(u64),
}

impl HeldScope {
    /// Whether a command not yet handled, for `lun`, is dropped.
    pub fn covers(self, lun: u64) -> bool {
        match self {
            HeldScope::Keep => false,
            HeldScope::All => true,
            HeldScope::Lun(l) => l == lun,
        }
    }
}

/// Tasks stopped by an abort.
#[derive(Default)]
pub(super) struct Aborted {
    /// Completion signals of tasks that were running.
    pub waiters: Vec<Arc<Finished>>,
    /// ITTs whose abort took effect (no response will be sent).
    pub aborted: Vec<u32>,
}

pub(super) struct Conn {
    pub server: Arc<Server>,
    pub ctx: Arc<SessionCtx>,
    pub out: mpsc::Sender<Outgoing>,
    /// Bytes `out` may hold; closed when the writer ends or the session is
    /// told to end.
    pub(super) outgoing: Arc<OutgoingBudget>,
    pub window: Arc<Mutex<CmdWindow>>,
    pub events: mpsc::UnboundedSender<Event>,
    /// Results of commands run on the I/O pool.
    pub(super) events_rx: mpsc::UnboundedReceiver<Event>,
    /// What the I/O pool needs of this connection, made on first use.
    pub(super) exec: Option<Arc<ConnExec>>,
    /// Batchable commands decoded in this turn of the loop, handed to the
    /// I/O pool together at its end so that one worker takes them all.
    pub(super) batch: Vec<exec::Command>,
    pub tasks: TaskTable,
    pub held: Vec<Held>,
    /// CmdSNs counted as received although their command never came
    /// (aborted by RefCmdSN before arrival).
    pub consumed: Vec<u32>,
    pub(super) next_serial: u64,
    pub(super) next_ttt: u32,
    /// Write budget not reserved by any command, of `write_budget_total`.
    pub(super) write_budget: u64,
    pub(super) write_budget_total: u64,
    /// Commands waiting for write budget, in arrival order.
    pub(super) budget_waiters: VecDeque<u32>,
    pub(super) gate: Gate,
    pub(super) text: Option<super::text::TextExchange>,
    pub(super) text_negotiator: Negotiator,
    pub(super) ping: Option<(u32, Instant)>,
    pub(super) last_rx: Instant,
    /// A PDU arrived since the last tick; `last_rx` moves on the tick, so
    /// that the clock is not read for every PDU.
    pub(super) rx_since_tick: bool,
    pub(super) logout_deadline: Option<Instant>,
    /// The SCSI layer was told the I_T nexus is gone.
    pub(super) nexus_ended: bool,
    /// A WRITE started from the header of the command being received.
    pub(super) prestarted: Option<Prestarted>,
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
    let mut reader = PduReader::new(rd, framing);
    let window = Arc::new(Mutex::new(CmdWindow::new(
        est.exp_cmdsn,
        server.options.cmdsn_window,
    )));
    let (out_tx, out_rx) = mpsc::channel(OUTGOING_QUEUE);
    let writer = Writer::new(wr, framing, est.next_statsn, window.clone())
        .limited(est.outgoing.clone(), server.options.write_timeout);
    let writer = tokio::spawn(writer.run(out_rx));
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
        outgoing: est.outgoing,
        window,
        events: events_tx,
        events_rx,
        exec: None,
        batch: Vec::new(),
        tasks: TaskTable::default(),
        held: Vec::new(),
        consumed: Vec::new(),
        next_serial: 0,
        next_ttt: rand::random(),
        write_budget: budget,
        write_budget_total: budget,
        budget_waiters: VecDeque::new(),
        gate: Gate::default(),
        text: None,
        ping: None,
        last_rx: Instant::now(),
        rx_since_tick: false,
        logout_deadline: None,
        nexus_ended: false,
        prestarted: None,
    };
    let cause = conn.main_loop(&mut reader, est.control_rx).await;
    drop(reader);
    conn.teardown(cause, writer, est.closed_tx).await;
    drop((est.portal_slot, est.source_slot));
}

pub(super) fn next_tag(t: u32) -> u32 {
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
        reader: &mut PduReader<OwnedReadHalf>,
        mut control: mpsc::UnboundedReceiver<Control>,
    ) -> &'static str {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            reader.set_running(self.tasks.len());
            // Completions first: answering frees window slots and ITTs.
            let flow = tokio::select! {
                biased;
                Some(ev) = self.events_rx.recv() => self.on_event(ev).await,
                Some(c) = control.recv() => self.on_control(c).await,
                r = reader.fill() => match r {
                    Ok(true) => self.on_bytes(reader).await,
                    Ok(false) => Flow::Close("connection closed by initiator"),
                    Err(e) => self.on_read_error(e).await,
                },
                _ = tick.tick() => self.on_tick().await,
            };
            self.start_batch();
            if let Flow::Close(cause) = flow {
                return cause;
            }
        }
    }

    /// Start the batchable commands of this turn on this thread's ring,
    /// and hand what it declines to the I/O pool.
    pub(super) fn start_batch(&mut self) {
        if !self.batch.is_empty() {
            let declined = ring::start(self.batch.drain(..));
            if !declined.is_empty() {
                exec::io_pool().submit_all(declined);
            }
        }
    }

    pub(super) fn new_ttt(&mut self) -> u32 {
        self.next_ttt = next_tag(self.next_ttt);
        self.next_ttt
    }

    /// Queue a PDU for the writer; false when the connection is gone, is
    /// told to end, or the initiator stopped reading.
    pub(super) async fn send(&self, mut pdu: OutPdu) -> bool {
        // Without waiting first: arming a deadline reads the clock.
        let stall = self.server.options.write_timeout;
        let bytes = pdu.queued_bytes();
        pdu.charged = match self.outgoing.try_take(bytes) {
            Ok(taken) => taken,
            Err(Stalled::Closed) => return false,
            Err(Stalled::Deadline) => match self.outgoing.take(bytes, stall).await {
                Ok(taken) => taken,
                Err(why) => {
                    if why == Stalled::Deadline {
                        self.log_stalled();
                    }
                    return false;
                }
            },
        };
        match self.out.try_send(Outgoing::Pdu(pdu)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
            Err(mpsc::error::TrySendError::Full(out)) => {
                self.out.send_timeout(out, stall).await.is_ok()
            }
        }
    }

    pub(super) fn log_stalled(&self) {
        let (ctx, queued) = (&self.ctx, self.outgoing.queued());
        self.server.events.stalled.record(|held_back| {
            tracing::warn!(
                initiator = %ctx.initiator_name, peer = %ctx.peer, queued, held_back,
                "initiator stopped reading, closing connection"
            );
        });
    }

    pub(super) async fn send_or_close(&self, pdu: OutPdu) -> Flow {
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

    /// Handle every PDU that the last read completed.
    async fn on_bytes(&mut self, reader: &mut PduReader<OwnedReadHalf>) -> Flow {
        while let Some(r) = reader.next_placing(&mut |bhs, len| self.place_segment(bhs, len)) {
            self.rx_since_tick = true;
            let flow = match r {
                Ok(Frame::Pdu(pdu)) => self.on_pdu(pdu).await,
                // A command whose immediate data is in place already.
                Ok(Frame::Placed(bhs)) if bhs.opcode() == Some(Opcode::ScsiCommand) => {
                    self.on_pdu(Pdu::header_only(bhs)).await
                }
                Ok(Frame::Placed(bhs)) => self.on_placed(bhs).await,
                Err(e) => {
                    let in_sync = matches!(e, ReadError::Pdu { in_sync: true, .. });
                    let flow = self.on_read_error(e).await;
                    if !in_sync {
                        // The stream can no longer be framed.
                        return Flow::Close("protocol error");
                    }
                    flow
                }
            };
            self.drop_unused_prestart();
            if let Flow::Close(c) = flow {
                return Flow::Close(c);
            }
        }
        Flow::Continue
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
        if let Some(flow) = self.drop_if_aborted(&pdu.bhs).await {
            return flow;
        }
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
                let consumed = self.consume_if_next(&bhs);
                if let Flow::Close(c) = self
                    .reject(bhs, reject_reason::INVALID_PDU_FIELD, false)
                    .await
                {
                    return Flow::Close(c);
                }
                if consumed {
                    return self.release_held().await;
                }
                Flow::Continue
            }
        }
    }

    /// A malformed command at ExpCmdSN counts as received.
    fn consume_if_next(&mut self, bhs: &Bhs) -> bool {
        if bhs.immediate() {
            return false;
        }
        let cmdsn = bhs.u32_at(24);
        let mut w = self.window.lock();
        let in_order = w.classify(cmdsn) == Arrival::InOrder;
        if in_order {
            w.accept(false);
        }
        in_order
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
}
