//! Collecting a write's data: R2Ts within the connection's write budget,
//! Data-Out PDUs checked against their sequences, and writes started
//! before their data arrives (placed.rs), which take it as it comes.

use std::sync::Arc;

use bytes::Bytes;
use scsi_api::{ScsiResponse, TaskAttr, WriteStart};

use super::command::{self, Phase};
use super::ffp::{next_tag, Conn, Flow, HELD_PDU_LIMIT};
use super::io::{OutPdu, StatSn};
use super::placed::{Placed, PlacedWrite, PLACED_WRITE_MIN};
use crate::lun;
use crate::negotiation::Digest;
use crate::pdu::initiator::{Request, ScsiCommand as ScsiCommandPdu};
use crate::pdu::target;
use crate::pdu::Bhs;

/// A write keeps at most this many Data-Out segments apart before they
/// are copied together.
const MAX_SEGMENTS: usize = 256;

impl Conn {
    /// Solicit more write data for a task, within the connection's budget.
    ///
    /// A command reserves the budget for all it still has to fetch before
    /// its first R2T, or waits its turn. Reserving burst by burst let
    /// every command hold part of its data while waiting for budget that
    /// the others held, and then none could finish (many large writes at
    /// once did that). Waiting commands are served in arrival order, so a
    /// large one is not overtaken forever by small ones; one larger than
    /// the whole budget goes when it has the budget to itself.
    pub(super) async fn issue_r2ts(&mut self, itt: u32) -> Flow {
        let Some(task) = self.tasks.get_mut(&itt) else {
            self.budget_waiters.retain(|&i| i != itt);
            return Flow::Continue;
        };
        let Some(ws) = task.write_state.as_mut() else {
            self.budget_waiters.retain(|&i| i != itt);
            return Flow::Continue;
        };
        if ws.awaiting_unsolicited() {
            // Its end calls again, when what is left to fetch is known.
            return Flow::Continue;
        }
        if !task.solicits_reserved {
            let need = u64::from(ws.left_to_solicit());
            let turn = self.budget_waiters.front().is_none_or(|&w| w == itt);
            let fits = need <= self.write_budget || self.write_budget == self.write_budget_total;
            if !(turn && fits) {
                if !self.budget_waiters.contains(&itt) {
                    self.budget_waiters.push_back(itt);
                }
                return Flow::Continue;
            }
            if self.budget_waiters.front() == Some(&itt) {
                self.budget_waiters.pop_front();
            }
            let take = need.min(self.write_budget);
            self.write_budget -= take;
            task.reserved += take;
            task.solicits_reserved = true;
        }
        let mut ttt = self.next_ttt;
        let requests = ws.next_r2ts(|| {
            ttt = next_tag(ttt);
            ttt
        });
        let lun_raw = task.lun_raw;
        self.next_ttt = ttt;
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

    /// Give freed write budget to the commands waiting for it, in order,
    /// until one does not fit.
    pub(super) async fn serve_budget_waiters(&mut self) -> Flow {
        while let Some(&itt) = self.budget_waiters.front() {
            if let Flow::Close(c) = self.issue_r2ts(itt).await {
                return Flow::Close(c);
            }
            if self.budget_waiters.front() == Some(&itt) {
                break;
            }
        }
        Flow::Continue
    }

    pub(super) async fn on_data_out(&mut self, bhs: Bhs, req: Request) -> Flow {
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
        match &task.placed {
            Some(Placed::Started(write)) => write.write(placement.offset as usize, &d.data),
            Some(Placed::Answered(_)) => {}
            None => {
                task.data.push((placement.offset as usize, d.data));
                if task.data.len() >= MAX_SEGMENTS {
                    // Tiny segments would cost more in bookkeeping than they hold.
                    let merged = command::assemble(
                        std::mem::take(&mut task.immediate),
                        std::mem::take(&mut task.data),
                    );
                    task.data.push((0, merged));
                }
            }
        }
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
    pub(super) async fn fail_write(&mut self, itt: u32) -> Flow {
        let Some(task) = self.tasks.remove(&itt) else {
            return Flow::Continue;
        };
        self.write_budget += task.reserved;
        self.forget_placed(task.placed.as_ref());
        let resp = ScsiResponse::check_condition(command::protocol_service_crc_error_sense());
        self.answer_removed(&task, Some(resp)).await
    }

    /// A write started before its data ends without finishing: no more
    /// of its data goes in, and the tasks after it no longer wait for it
    /// (it is SIMPLE, as `start_placed` only starts those).
    pub(super) fn forget_placed(&mut self, placed: Option<&Placed>) {
        if let Some(Placed::Started(write)) = placed {
            write.stop();
            self.gate.finished(TaskAttr::Simple);
        }
    }

    /// Start a long WRITE before its data arrives, when the SCSI layer
    /// can take the data as it comes (placed.rs): only without data
    /// digests (data must be checked before it lands), and only a SIMPLE
    /// task that may run now, since it runs from its first byte.
    pub(super) fn start_placed(&mut self, c: &ScsiCommandPdu) -> Option<Placed> {
        let attr = command::task_attr(c.attr);
        if c.read
            || c.edtl < PLACED_WRITE_MIN
            || self.ctx.params.data_digest == Digest::Crc32c
            || attr != TaskAttr::Simple
            || !self.gate.admits(attr)
        {
            return None;
        }
        let (target, nexus) = (self.ctx.target.as_ref()?, self.ctx.nexus.as_ref()?);
        let cmd = scsi_api::ScsiCommand {
            lun: lun::decode(c.lun),
            cdb: &c.cdb,
            data_out: &[],
            data_out_parts: &[],
            data_in_len: 0,
            data_out_len: c.edtl,
            task_attr: attr,
            tag: u64::from(c.itt),
            zero_copy: false,
        };
        match target.scsi.start_write(nexus, &cmd) {
            WriteStart::Declined => None,
            WriteStart::Answered(resp) => Some(Placed::Answered(resp)),
            WriteStart::Started(started) => {
                let write = PlacedWrite::new(started);
                if !c.data.is_empty() {
                    write.write(0, &c.data);
                }
                self.gate.started(attr);
                Some(Placed::Started(write))
            }
        }
    }

    /// Where a Data-Out's data goes when its write was started: checked
    /// against its sequence like any Data-Out, before any of it lands. A
    /// SCSI Command's immediate data goes to `place_command` (prestart.rs).
    pub(super) fn place_segment(
        &mut self,
        bhs: &Bhs,
        len: usize,
    ) -> Option<(Arc<PlacedWrite>, usize)> {
        if bhs.opcode() == Some(crate::pdu::Opcode::ScsiCommand) {
            return self.place_command(bhs, len);
        }
        let Ok(Request::DataOut(d)) = Request::parse(crate::pdu::Pdu::header_only(*bhs)) else {
            return None;
        };
        let task = self.tasks.get_mut(&d.itt)?;
        let (Phase::Collecting, Some(ws), Some(Placed::Started(write))) =
            (&task.phase, task.write_state.as_mut(), &task.placed)
        else {
            return None;
        };
        let placement = ws
            .accept(
                d.ttt,
                d.datasn,
                d.buffer_offset,
                u32::try_from(len).ok()?,
                d.final_,
            )
            .ok()?;
        task.placing = Some(placement);
        Some((write.clone(), placement.offset as usize))
    }

    /// All data of a Data-Out that [`Conn::place_segment`] placed is in.
    pub(super) async fn on_placed(&mut self, bhs: Bhs) -> Flow {
        let itt = bhs.itt();
        let Some(task) = self.tasks.get_mut(&itt) else {
            // Aborted while its data arrived.
            return Flow::Continue;
        };
        let (Some(placement), Some(ws)) = (task.placing.take(), task.write_state.as_ref()) else {
            return Flow::Continue;
        };
        if ws.complete() {
            return self.ready(itt).await;
        }
        if placement.sequence_done {
            return self.issue_r2ts(itt).await;
        }
        Flow::Continue
    }

    /// The data of a write started before it is all in: answer it.
    pub(super) async fn finish_placed(&mut self, itt: u32) -> Flow {
        let Some(mut task) = self.tasks.remove(&itt) else {
            return Flow::Continue;
        };
        self.write_budget += task.reserved;
        let resp = match task.placed.take() {
            Some(Placed::Started(write)) => {
                self.gate.finished(task.attr);
                write.finish()
            }
            Some(Placed::Answered(resp)) => Some(resp),
            None => None,
        };
        self.answer_removed(&task, resp).await
    }
}
