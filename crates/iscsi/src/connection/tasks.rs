//! A SCSI command's life on the connection: taking it in, ordering by
//! task attribute, running on the SCSI target, answering, and aborting.
//! Collecting its write data (immediate, unsolicited, R2T-solicited) is
//! in write_data.rs.

use std::sync::Arc;

use bytes::Bytes;
use scsi_api::{ScsiResponse, TaskAttr};

use super::command::{self, Phase, ResponseShape, Task};
use super::exec::{self, Completion, Finished, Job};
use super::ffp::{Aborted, Conn, Event, Flow, HeldScope};
use super::io::OutPdu;
use super::placed::Placed;
use crate::dataout::{WriteLimits, WriteState};
use crate::lun;
use crate::negotiation::Digest;
use crate::pdu::initiator::ScsiCommand as ScsiCommandPdu;
use crate::pdu::target::reject_reason;
use crate::pdu::Bhs;

impl Conn {
    pub(super) async fn on_scsi_command(
        &mut self,
        bhs: Bhs,
        c: ScsiCommandPdu,
        tracked: bool,
    ) -> Flow {
        if let Some(existing) = self.tasks.get(&c.itt) {
            // A task whose response is already on its way (or which was
            // aborted and has ended) no longer owns its ITT.
            let ended = match &existing.phase {
                Phase::Executing { aborted, finished } => *aborted && finished.is_done(),
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
            // Immediate data already placed by a write started from the
            // header is not in `c.data`.
            let immediate = match &self.prestarted {
                Some(p) if p.itt == c.itt && matches!(p.placed, Placed::Started(_)) => {
                    bhs.data_segment_len()
                }
                _ => c.data.len() as u32,
            };
            match WriteState::new(c.edtl, immediate, unsolicited, limits) {
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
        let placed = match self.take_prestarted(c.itt) {
            Some(placed) => Some(placed),
            None if write_state.is_some() => self.start_placed(&c),
            None => None,
        };
        let lun = lun::decode(c.lun);
        self.ctx.usage.luns.note(lun);
        let serial = self.next_serial;
        self.next_serial += 1;
        let complete = write_state.as_ref().is_none_or(|w| w.complete());
        let task = Task {
            serial,
            itt: c.itt,
            lun_raw: c.lun,
            lun,
            tracked,
            attr: command::task_attr(c.attr),
            cdb: c.cdb,
            read: c.read,
            write: c.write,
            edtl: c.edtl,
            immediate: if c.write && placed.is_none() {
                c.data
            } else {
                Bytes::new()
            },
            data: Vec::new(),
            write_state,
            reserved: 0,
            solicits_reserved: false,
            phase: Phase::Collecting,
            placed,
            placing: None,
        };
        self.tasks.insert(c.itt, task);
        if complete {
            self.ready(c.itt).await
        } else {
            self.issue_r2ts(c.itt).await
        }
    }

    /// Answer a task already taken out of the table, then start what its
    /// end released.
    pub(super) async fn answer_removed(&mut self, task: &Task, resp: Option<ScsiResponse>) -> Flow {
        let shape = task.response_shape(&self.ctx.params);
        let pdus = match resp {
            Some(resp) => command::response_pdus(&shape, resp),
            None => smallvec::smallvec![command::failure_pdu(&shape)],
        };
        if !self.send_response(pdus).await {
            return Flow::Close("connection lost");
        }
        if let Flow::Close(c) = self.unblock().await {
            return Flow::Close(c);
        }
        self.serve_budget_waiters().await
    }

    /// All data is in: run the task when its ordering allows.
    pub(super) async fn ready(&mut self, itt: u32) -> Flow {
        let Some(task) = self.tasks.get_mut(&itt) else {
            return Flow::Continue;
        };
        if task.placed.is_some() {
            return self.finish_placed(itt).await;
        }
        if self.gate.admits(task.attr) {
            self.start(itt).await
        } else {
            task.phase = Phase::Blocked;
            let attr = task.attr;
            self.gate.blocked.push_back(itt);
            if self.gate.blocked.len() == 1 {
                return self.raise_barrier(attr).await;
            }
            Flow::Continue
        }
    }

    /// The ORDERED task at the front waits only for the initiator to have
    /// read the file pages sent before it: ask with a ping, answered in
    /// `on_nop_out`.
    async fn raise_barrier(&mut self, attr: TaskAttr) -> Flow {
        if !self.gate.needs_barrier(attr) {
            return Flow::Continue;
        }
        let (ttt, flow) = self.send_ping().await;
        self.gate.barrier_sent(ttt, std::time::Instant::now());
        flow
    }

    /// Queue a command's response; false when the connection is gone.
    async fn send_response(&mut self, pdus: command::ResponsePdus) -> bool {
        self.gate.pages_unconfirmed |= pdus.iter().any(OutPdu::sends_file_pages);
        for pdu in pdus {
            if !self.send(pdu).await {
                return false;
            }
        }
        true
    }

    /// Start tasks released by a finished one.
    pub(super) async fn unblock(&mut self) -> Flow {
        while let Some(&itt) = self.gate.blocked.front() {
            let attr = match self.tasks.get(&itt) {
                Some(t) if matches!(t.phase, Phase::Blocked) => t.attr,
                _ => {
                    self.gate.blocked.pop_front();
                    continue;
                }
            };
            if !self.gate.admits_next(attr) {
                return self.raise_barrier(attr).await;
            }
            self.gate.blocked.pop_front();
            if let Flow::Close(c) = self.start(itt).await {
                return Flow::Close(c);
            }
        }
        Flow::Continue
    }

    /// Hand a task to the SCSI layer: on the I/O pool when it may block,
    /// inline otherwise.
    pub(super) async fn start(&mut self, itt: u32) -> Flow {
        let (Some(target), Some(nexus)) = (self.ctx.target.clone(), self.ctx.nexus.clone()) else {
            return Flow::Continue;
        };
        let params = &self.ctx.params;
        let Some(task) = self.tasks.get_mut(&itt) else {
            return Flow::Continue;
        };
        let (data_out, data_out_parts) = command::data_out(
            std::mem::take(&mut task.immediate),
            std::mem::take(&mut task.data),
            target.scsi.takes_data_out_in_parts(&task.cdb),
        );
        let job = Job {
            lun: task.lun,
            cdb: std::mem::take(&mut task.cdb),
            data_out,
            data_out_parts,
            data_in_len: if task.read { task.edtl } else { 0 },
            data_out_len: if task.write { task.edtl } else { 0 },
            attr: task.attr,
            tag: u64::from(itt),
            // ORDERED and HEAD OF QUEUE tasks get copies: a task after them
            // waits only for their end, not for the initiator's read.
            zero_copy: params.data_digest != Digest::Crc32c && task.attr == TaskAttr::Simple,
        };
        let shape = task.response_shape(params);
        if target.scsi.command_may_block(job.lun, &job.cdb) {
            let finished = Arc::new(Finished::default());
            if target.scsi.completes_async(job.lun) {
                // Put in flight from here and answered where the device
                // ends it: no I/O thread waits for it.
                let skeleton = exec::Completion {
                    itt,
                    serial: task.serial,
                    tracked: task.tracked,
                    attr: task.attr,
                    shape,
                    response: None,
                };
                let answer = exec::answer(self.events.clone(), skeleton, finished.clone());
                let parts = job.parts();
                if target
                    .scsi
                    .start_async(&nexus, &job.command(&parts), answer)
                    .is_ok()
                {
                    task.phase = Phase::Executing {
                        aborted: false,
                        finished,
                    };
                    self.gate.started(task.attr);
                    return Flow::Continue;
                }
            }
            let batchable = target.scsi.batches(job.lun, &job.cdb);
            task.phase = Phase::Executing {
                aborted: false,
                finished: finished.clone(),
            };
            self.gate.started(task.attr);
            let conn = self
                .exec
                .get_or_insert_with(|| {
                    Arc::new(exec::ConnExec {
                        scsi: target.scsi.clone(),
                        nexus,
                        events: self.events.clone(),
                    })
                })
                .clone();
            let command = exec::Command {
                conn,
                job,
                itt,
                serial: task.serial,
                tracked: task.tracked,
                shape,
                finished,
                batchable,
            };
            if batchable {
                self.batch.push(command);
            } else {
                exec::io_pool().submit(command);
            }
            return Flow::Continue;
        }
        let reserved = task.reserved;
        self.tasks.remove(&itt);
        self.write_budget += reserved;
        let pdus = match job.run(&*target.scsi, &nexus) {
            Some(resp) => command::response_pdus(&shape, resp),
            None => smallvec::smallvec![command::failure_pdu(&shape)],
        };
        if !self.send_response(pdus).await {
            return Flow::Close("connection lost");
        }
        if reserved > 0 {
            return self.serve_budget_waiters().await;
        }
        Flow::Continue
    }

    pub(super) async fn on_event(&mut self, ev: Event) -> Flow {
        match ev {
            Event::Completed(done) => self.on_completed(done).await,
        }
    }

    /// Results from the I/O pool: answer the commands still wanted, then
    /// start what their end released.
    pub(super) async fn on_completed(&mut self, done: Vec<Completion>) -> Flow {
        for c in done {
            let current = self.tasks.get(&c.itt).is_some_and(|t| t.serial == c.serial);
            // A task no longer in the table was aborted (and its ITT perhaps
            // reused); its result is not wanted.
            let aborted = !current
                || matches!(
                    self.tasks.get(&c.itt).map(|t| &t.phase),
                    Some(Phase::Executing { aborted: true, .. })
                );
            if current {
                if let Some(t) = self.tasks.remove(&c.itt) {
                    self.write_budget += t.reserved;
                }
            }
            self.gate.finished(c.attr);
            if aborted {
                if c.tracked {
                    // No response will free the window slot.
                    self.window.lock().finished();
                }
                continue;
            }
            let pdus = match c.response {
                Some(resp) => command::response_pdus(&c.shape, resp),
                None => smallvec::smallvec![command::failure_pdu(&c.shape)],
            };
            if !self.send_response(pdus).await {
                return Flow::Close("connection lost");
            }
        }
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
            let running = match self.tasks.get_mut(&itt).map(|t| &mut t.phase) {
                Some(Phase::Executing { aborted, finished }) => {
                    if !*aborted {
                        *aborted = true;
                        out.aborted.push(itt);
                    }
                    out.waiters.push(finished.clone());
                    true
                }
                Some(_) => false,
                None => continue,
            };
            if !running {
                if let Some(t) = self.tasks.remove(&itt) {
                    self.write_budget += t.reserved;
                    self.forget_placed(t.placed.as_ref());
                    if t.tracked {
                        self.window.lock().finished();
                    }
                    out.aborted.push(itt);
                }
            }
        }
        self.budget_waiters.retain(|i| !out.aborted.contains(i));
        self.abort_prestart(held);
        // Commands held for CmdSN order: count them as received and drop them.
        let mut kept = Vec::new();
        for h in self.held.drain(..) {
            if h.lun.is_some_and(|l| held.covers(l)) {
                self.consumed.push(h.cmdsn);
            } else {
                kept.push(h);
            }
        }
        self.held = kept;
        out
    }
}
