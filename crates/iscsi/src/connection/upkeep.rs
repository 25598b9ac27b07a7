//! A connection's upkeep and end: pings and their timeouts, the
//! server's control requests, Logout, and teardown.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::command::Phase;
use super::ffp::{Conn, Flow, HeldScope};
use super::io::{OutPdu, Outgoing, StatSn};
use crate::pdu::initiator::{LogoutRequest, NopOut};
use crate::pdu::target::{self, async_event, reject_reason};
use crate::pdu::{Bhs, RESERVED_TAG};
use crate::session::Control;

/// How long teardown waits for queued responses to be written.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// Logout Response codes (RFC 7143 11.15.1).
const LOGOUT_OK: u8 = 0;
const LOGOUT_CID_NOT_FOUND: u8 = 1;
const LOGOUT_RECOVERY_NOT_SUPPORTED: u8 = 2;

impl Conn {
    /// Send a NOP-In that asks for an answer; returns its TTT.
    pub(super) async fn send_ping(&mut self) -> (u32, Flow) {
        let ttt = self.new_ttt();
        let bhs = target::nop_in([0; 8], RESERVED_TAG, ttt);
        let flow = self
            .send_or_close(OutPdu::new(bhs, Bytes::new(), StatSn::Peek))
            .await;
        (ttt, flow)
    }

    pub(super) async fn on_nop_out(&mut self, n: NopOut) -> Flow {
        if n.itt != RESERVED_TAG {
            // A ping: echo its data back, copied, so that the queued echo
            // holds what the outgoing budget charges for it and not the
            // whole received buffer it was cut from.
            let len = n.data.len().min(self.ctx.params.initiator_mrdsl as usize);
            let bhs = target::nop_in(n.lun, n.itt, RESERVED_TAG);
            let echo = Bytes::copy_from_slice(&n.data[..len]);
            return self
                .send_or_close(OutPdu::new(bhs, echo, StatSn::Advance))
                .await;
        }
        if n.ttt != RESERVED_TAG && self.ping.is_some_and(|(ttt, _)| ttt == n.ttt) {
            self.ping = None;
        }
        if n.ttt != RESERVED_TAG && self.gate.barrier_answered(n.ttt) {
            return self.unblock().await;
        }
        Flow::Continue
    }

    pub(super) async fn on_logout(&mut self, bhs: Bhs, l: LogoutRequest) -> Flow {
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
                Some(Phase::Executing { finished, .. }) => waiters.push(finished.clone()),
                _ => {
                    if let Some(t) = self.tasks.remove(&itt) {
                        self.write_budget += t.reserved;
                    }
                }
            }
        }
        // Commands of this turn may be among them: they must run to end.
        self.start_batch();
        for w in waiters {
            w.wait().await;
        }
        // Their results are queued by now: answer them first.
        while let Ok(ev) = self.events_rx.try_recv() {
            if let Flow::Close(c) = self.on_event(ev).await {
                return Flow::Close(c);
            }
        }
        // The I_T nexus ends before the initiator hears that it did: a
        // reservation it held must not outlive the Logout Response it sees.
        self.end_nexus().await;
        let bhs = target::logout_response(l.itt, LOGOUT_OK, 0, 0);
        let _ = self
            .send(OutPdu::new(bhs, Bytes::new(), StatSn::Advance))
            .await;
        tracing::info!(initiator = %self.ctx.initiator_name, tsih = self.ctx.tsih, "logout");
        Flow::Close("logout")
    }

    pub(super) async fn on_control(&mut self, c: Control) -> Flow {
        match c {
            Control::Close(reason) => {
                tracing::info!(initiator = %self.ctx.initiator_name, tsih = self.ctx.tsih, ?reason, "closing session");
                Flow::Close("closed by target")
            }
            Control::RequestLogout => {
                if self.ctx.target.is_none() {
                    return Flow::Close("shutdown");
                }
                // Whoever asked (an administrator, an access change,
                // shutdown), listings show it.
                self.ctx
                    .usage
                    .logout_requested
                    .store(true, std::sync::atomic::Ordering::Relaxed);
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
                    for w in aborted.waiters {
                        w.wait().await;
                    }
                    let _ = done.send(());
                });
                Flow::Continue
            }
        }
    }

    pub(super) async fn on_tick(&mut self) -> Flow {
        if self.outgoing.is_closed() {
            // The writer gave up on the initiator, or the session was
            // told to end while this loop was busy.
            return Flow::Close("connection lost");
        }
        let now = Instant::now();
        if std::mem::take(&mut self.rx_since_tick) {
            self.last_rx = now;
        }
        if self.logout_deadline.is_some_and(|d| now >= d) {
            return Flow::Close("initiator did not log out");
        }
        if self
            .gate
            .barrier_overdue(now.into_std(), self.server.options.nop_timeout)
        {
            tracing::warn!(
                initiator = %self.ctx.initiator_name, peer = %self.ctx.peer,
                "initiator did not answer the ping an ORDERED task waits on, closing connection"
            );
            return Flow::Close("ping timeout");
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
                let (ttt, flow) = self.send_ping().await;
                self.ping = Some((ttt, now));
                flow
            }
            None => Flow::Continue,
        }
    }

    /// Tell the SCSI layer this session's I_T nexus is gone (once).
    async fn end_nexus(&mut self) {
        if std::mem::replace(&mut self.nexus_ended, true) {
            return;
        }
        if let (Some(target), Some(nexus)) = (self.ctx.target.clone(), self.ctx.nexus.clone()) {
            let _ = tokio::task::spawn_blocking(move || target.scsi.nexus_lost(&nexus)).await;
        }
    }

    pub(super) async fn teardown(
        mut self,
        cause: &'static str,
        writer: JoinHandle<Option<std::io::Error>>,
        closed: watch::Sender<bool>,
    ) {
        let aborted = self.abort_matching(HeldScope::All, |_| true);
        // Write whatever is queued (a last response), then close the
        // socket; not when the initiator stopped reading or the session
        // was killed, and never waiting on a full queue.
        if !self.outgoing.is_closed() {
            let (ack_tx, ack_rx) = oneshot::channel();
            if self.out.try_send(Outgoing::Close(Some(ack_tx))).is_ok() {
                let _ = tokio::time::timeout(FLUSH_WAIT, ack_rx).await;
            }
        }
        self.outgoing.close();
        writer.abort();
        if let Ok(Some(e)) = writer.await {
            if e.kind() == std::io::ErrorKind::TimedOut {
                self.log_stalled();
            }
        }
        for w in aborted.waiters {
            w.wait().await;
        }
        self.end_nexus().await;
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
