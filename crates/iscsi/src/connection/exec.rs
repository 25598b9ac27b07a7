//! Commands that may block run on a shared pool of I/O threads; their
//! results come back to the connection loop in batches, which turns them
//! into response PDUs.
//!
//! The connection loop alone decides whether a result is answered or
//! dropped (because the task was aborted meanwhile), so no race between a
//! worker and the loop needs settling. A [`Finished`] signal tells task
//! management when a command has stopped running; it is raised only after
//! the command's result is in the loop's queue.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use scsi_api::{Nexus, ScsiCommand, ScsiResponse, ScsiTarget, TaskAttr};
use tokio::sync::{mpsc, Notify};

use super::command::ResponseShape;
use super::ffp::Event;
use super::pool::{self, Limits, Pool};
use crate::pdu::initiator::Cdb;

/// Work handed to the SCSI layer.
pub(super) struct Job {
    pub lun: u64,
    pub cdb: Cdb,
    pub data_out: Bytes,
    /// Data-Out in parts, for commands that take it so (`data_out` is then
    /// empty).
    pub data_out_parts: Vec<Bytes>,
    pub data_in_len: u32,
    pub data_out_len: u32,
    pub attr: TaskAttr,
    pub tag: u64,
    /// Data-In may come back as a file region (no data digest to compute).
    pub zero_copy: bool,
}

impl Job {
    /// The parts of Data-Out as slices, for [`Job::command`].
    pub fn parts(&self) -> Vec<&[u8]> {
        self.data_out_parts.iter().map(|p| p.as_ref()).collect()
    }

    pub fn command<'a>(&'a self, parts: &'a [&'a [u8]]) -> ScsiCommand<'a> {
        ScsiCommand {
            lun: self.lun,
            cdb: &self.cdb,
            data_out: &self.data_out,
            data_out_parts: parts,
            data_in_len: self.data_in_len,
            data_out_len: self.data_out_len,
            task_attr: self.attr,
            tag: self.tag,
            zero_copy: self.zero_copy,
        }
    }

    /// Run on the SCSI target; a panic in the target becomes `None`.
    pub fn run(&self, scsi: &dyn ScsiTarget, nexus: &Nexus) -> Option<ScsiResponse> {
        let parts = self.parts();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            scsi.execute(nexus, &self.command(&parts))
        }));
        if result.is_err() {
            tracing::error!(tag = self.tag, "SCSI command panicked in the target");
        }
        result.ok()
    }
}

/// Raised when a command has stopped running (its result is queued for
/// the connection loop).
#[derive(Default)]
pub(crate) struct Finished {
    done: AtomicBool,
    /// Someone waits: raising must wake them.
    watched: AtomicBool,
    notify: Notify,
}

impl Finished {
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    fn raise(&self) {
        self.done.store(true, Ordering::SeqCst);
        if self.watched.load(Ordering::SeqCst) {
            self.notify.notify_waiters();
        }
    }

    /// Wait until the command has stopped running.
    pub async fn wait(&self) {
        self.watched.store(true, Ordering::SeqCst);
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_done() {
                return;
            }
            notified.await;
        }
    }
}

/// What the I/O threads need from one connection.
pub(super) struct ConnExec {
    pub scsi: Arc<dyn ScsiTarget>,
    pub nexus: Nexus,
    pub events: mpsc::UnboundedSender<Event>,
}

/// How a command the loop handed off ended.
pub(super) struct Completion {
    pub itt: u32,
    pub serial: u64,
    pub tracked: bool,
    pub attr: TaskAttr,
    pub shape: ResponseShape,
    /// `None` when the target panicked.
    pub response: Option<ScsiResponse>,
}

/// One command on its way through the pool.
pub(super) struct Command {
    pub conn: Arc<ConnExec>,
    pub job: Job,
    pub itt: u32,
    pub serial: u64,
    pub tracked: bool,
    pub shape: ResponseShape,
    pub finished: Arc<Finished>,
    /// The target runs this command better in a batch with others.
    pub batchable: bool,
}

impl Command {
    /// Queue this command's result for its connection.
    pub fn deliver(&self, response: Option<ScsiResponse>, batch: &mut Deliveries) {
        let completion = Completion {
            itt: self.itt,
            serial: self.serial,
            tracked: self.tracked,
            attr: self.job.attr,
            shape: self.shape,
            response,
        };
        match batch
            .conns
            .iter_mut()
            .find(|d| Arc::ptr_eq(&d.conn, &self.conn))
        {
            Some(d) => {
                d.done.push(completion);
                d.signals.push(self.finished.clone());
            }
            None => batch.conns.push(Delivery {
                conn: self.conn.clone(),
                done: vec![completion],
                signals: vec![self.finished.clone()],
            }),
        }
    }
}

/// Results for one connection, waiting to be delivered.
struct Delivery {
    conn: Arc<ConnExec>,
    done: Vec<Completion>,
    signals: Vec<Arc<Finished>>,
}

/// The answer for a command whose device ends it on a thread of its own
/// ([`ScsiTarget::start_async`]): the result goes to the connection loop
/// from that thread, as the I/O pool's would.
pub(super) fn answer(
    events: mpsc::UnboundedSender<Event>,
    skeleton: Completion,
    finished: Arc<Finished>,
) -> scsi_api::Answer {
    Box::new(move |response| {
        let completion = Completion {
            response: Some(response),
            ..skeleton
        };
        // A closed loop no longer wants results; waiters still do.
        let _ = events.send(Event::Completed(vec![completion]));
        finished.raise();
    })
}

/// Results a worker holds until it delivers them, by connection.
#[derive(Default)]
pub(super) struct Deliveries {
    conns: Vec<Delivery>,
}

impl pool::Job for Command {
    type Batch = Deliveries;

    fn run(self, batch: &mut Deliveries) {
        let response = self.job.run(&*self.conn.scsi, &self.conn.nexus);
        self.deliver(response, batch);
    }

    fn batchable(&self) -> bool {
        self.batchable
    }

    fn run_batch(mut jobs: Vec<Self>, batch: &mut Deliveries) {
        // One target call per SCSI target among the jobs.
        while let Some(first) = jobs.first() {
            let scsi = first.conn.scsi.clone();
            let (group, rest): (Vec<_>, Vec<_>) = jobs
                .into_iter()
                .partition(|c| Arc::ptr_eq(&c.conn.scsi, &scsi));
            jobs = rest;
            let parts: Vec<_> = group.iter().map(|c| c.job.parts()).collect();
            let cmds: Vec<_> = group
                .iter()
                .zip(&parts)
                .map(|(c, parts)| (&c.conn.nexus, c.job.command(parts)))
                .collect();
            // Each result goes out as soon as it is known, while the rest
            // of the batch is still on the device.
            let mut delivered = vec![false; group.len()];
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                scsi.execute_batch(&cmds, &mut |i, response| {
                    if let (Some(command), Some(false)) = (group.get(i), delivered.get(i).copied())
                    {
                        delivered[i] = true;
                        command.deliver(Some(response), batch);
                        Self::flush(batch);
                    }
                })
            }));
            if result.is_err() {
                tracing::error!("a batch of SCSI commands panicked in the target");
            }
            for (command, _) in group.iter().zip(delivered).filter(|(_, d)| !d) {
                command.deliver(None, batch);
            }
        }
    }

    fn flush(batch: &mut Deliveries) {
        for d in batch.conns.drain(..) {
            // A closed loop no longer wants results; waiters still do.
            let _ = d.conn.events.send(Event::Completed(d.done));
            for s in d.signals {
                s.raise();
            }
        }
    }
}

/// The process-wide I/O pool.
pub(super) fn io_pool() -> &'static Pool<Command> {
    static POOL: OnceLock<Pool<Command>> = OnceLock::new();
    POOL.get_or_init(|| Pool::new("oa-io", Limits::default()))
}
