//! Task management functions (RFC 7143 11.5, 11.6).
//!
//! Transport state goes first: tasks of this session (and, for LU and
//! target resets and CLEAR TASK SET, of other sessions on the same target)
//! are aborted and the running ones are waited for. Then the SCSI target
//! resets its own state, and the response goes out. All waiting happens off
//! the connection loop.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use scsi_api::{Nexus, TaskManagement, TmfResult};
use tokio::sync::{mpsc, oneshot};

use super::ffp::{Conn, Flow, HeldScope};
use super::io::{OutPdu, Outgoing, StatSn};
use crate::cmdsn::{sn_le, sn_lt};
use crate::lun;
use crate::pdu::initiator::TaskMgmtRequest;
use crate::pdu::target;
use crate::pdu::Bhs;
use crate::server::Target;
use crate::session::{CloseReason, Control};

/// TMF request function codes.
pub(super) mod function {
    pub const ABORT_TASK: u8 = 1;
    pub const ABORT_TASK_SET: u8 = 2;
    pub const CLEAR_ACA: u8 = 3;
    pub const CLEAR_TASK_SET: u8 = 4;
    pub const LOGICAL_UNIT_RESET: u8 = 5;
    pub const TARGET_WARM_RESET: u8 = 6;
    pub const TARGET_COLD_RESET: u8 = 7;
    pub const TASK_REASSIGN: u8 = 8;
}

/// TMF response codes.
pub(super) mod response {
    pub const FUNCTION_COMPLETE: u8 = 0;
    pub const TASK_DOES_NOT_EXIST: u8 = 1;
    pub const LUN_DOES_NOT_EXIST: u8 = 2;
    pub const REASSIGNMENT_NOT_SUPPORTED: u8 = 4;
    pub const NOT_SUPPORTED: u8 = 5;
    pub const REJECTED: u8 = 255;
}

/// How long a reset waits for other sessions to abort their tasks.
const CROSS_SESSION_WAIT: Duration = Duration::from_secs(30);

fn response_code(result: TmfResult) -> u8 {
    match result {
        TmfResult::Complete => response::FUNCTION_COMPLETE,
        TmfResult::TaskDoesNotExist => response::TASK_DOES_NOT_EXIST,
        TmfResult::LunDoesNotExist => response::LUN_DOES_NOT_EXIST,
        TmfResult::NotSupported => response::NOT_SUPPORTED,
        TmfResult::Rejected => response::REJECTED,
    }
}

/// Which sessions besides this one a function reaches.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reach {
    ThisSession,
    /// Every session on the target; `None` LUN means all LUNs.
    AllSessions(Option<u64>),
}

impl Conn {
    pub(super) async fn on_task_management(&mut self, _bhs: Bhs, t: TaskMgmtRequest) -> Flow {
        let (Some(target), Some(nexus)) = (self.ctx.target.clone(), self.ctx.nexus.clone()) else {
            return Flow::Continue;
        };
        let lun = lun::decode(t.lun);
        let lun_exists = || target.scsi.lun_exists(&nexus, lun);
        let (tmf, reach) = match t.function {
            function::ABORT_TASK => return self.abort_task(t).await,
            function::ABORT_TASK_SET
            | function::CLEAR_ACA
            | function::CLEAR_TASK_SET
            | function::LOGICAL_UNIT_RESET
                if !lun_exists() =>
            {
                return self.tmf_respond(t.itt, response::LUN_DOES_NOT_EXIST).await;
            }
            function::ABORT_TASK_SET => (TaskManagement::AbortTaskSet { lun }, Reach::ThisSession),
            function::CLEAR_ACA => (TaskManagement::ClearAca { lun }, Reach::ThisSession),
            function::CLEAR_TASK_SET => (
                TaskManagement::ClearTaskSet { lun },
                Reach::AllSessions(Some(lun)),
            ),
            function::LOGICAL_UNIT_RESET => (
                TaskManagement::LogicalUnitReset { lun },
                Reach::AllSessions(Some(lun)),
            ),
            function::TARGET_WARM_RESET => {
                (TaskManagement::TargetWarmReset, Reach::AllSessions(None))
            }
            function::TARGET_COLD_RESET => {
                (TaskManagement::TargetColdReset, Reach::AllSessions(None))
            }
            function::TASK_REASSIGN => {
                return self
                    .tmf_respond(t.itt, response::REASSIGNMENT_NOT_SUPPORTED)
                    .await
            }
            _ => return self.tmf_respond(t.itt, response::NOT_SUPPORTED).await,
        };
        let waiters = match tmf {
            TaskManagement::ClearAca { .. } => Vec::new(),
            TaskManagement::TargetWarmReset | TaskManagement::TargetColdReset => {
                self.abort_matching(HeldScope::All, |_| true).waiters
            }
            _ => {
                self.abort_matching(HeldScope::Lun(lun), |task| task.lun == lun)
                    .waiters
            }
        };
        let others: Vec<oneshot::Receiver<()>> = match reach {
            Reach::ThisSession => Vec::new(),
            Reach::AllSessions(lun) => {
                let sessions = self.server.registry.lock().for_target(&target.name);
                sessions
                    .into_iter()
                    .filter(|s| s.id != self.ctx.id)
                    .filter_map(|s| {
                        let (tx, rx) = oneshot::channel();
                        s.control
                            .send(Control::AbortTasks { lun, done: tx })
                            .ok()
                            .map(|_| rx)
                    })
                    .collect()
            }
        };
        let cold = tmf == TaskManagement::TargetColdReset;
        let me = self.ctx.id;
        let out = self.out.clone();
        let server = self.server.clone();
        let itt = t.itt;
        tokio::spawn(async move {
            // The SCSI layer hears of the function before we wait for the
            // aborted tasks: a command that waits on a long operation (a
            // SANITIZE) is released by it, and would otherwise hold the
            // response back until the operation ends.
            let result = run_on_target(&target, nexus, tmf).await;
            for w in waiters {
                w.wait().await;
            }
            let _ = tokio::time::timeout(CROSS_SESSION_WAIT, async {
                for rx in others {
                    let _ = rx.await;
                }
            })
            .await;
            queue_response(&out, itt, response_code(result)).await;
            if cold {
                // A cold reset ends every connection to the target, after
                // the response has been queued on this one; the others at
                // once, even one blocked on an initiator that stopped
                // reading, while this one still writes its response.
                for s in server.registry.lock().for_target(&target.name) {
                    if s.id == me {
                        let _ = s.control.send(Control::Close(CloseReason::ColdReset));
                    } else {
                        s.close(CloseReason::ColdReset);
                    }
                }
            }
        });
        Flow::Continue
    }

    async fn tmf_respond(&self, itt: u32, code: u8) -> Flow {
        let bhs = target::task_mgmt_response(itt, code);
        if self
            .send(OutPdu::new(bhs, Bytes::new(), StatSn::Advance))
            .await
        {
            Flow::Continue
        } else {
            Flow::Close("connection lost")
        }
    }

    /// ABORT TASK: find the task by its ITT, including one still waiting
    /// for Data-Out or held back by CmdSN order.
    async fn abort_task(&mut self, t: TaskMgmtRequest) -> Flow {
        let rtt = t.referenced_tag;
        let Some(target) = self.ctx.target.clone() else {
            return Flow::Continue;
        };
        let Some(nexus) = self.ctx.nexus.clone() else {
            return Flow::Continue;
        };
        if let Some(task_lun) = self.tasks.get(&rtt).map(|task| task.lun) {
            let aborted = self.abort_matching(HeldScope::Keep, |task| task.itt == rtt);
            let took_effect = aborted.aborted.contains(&rtt);
            let out = self.out.clone();
            let itt = t.itt;
            tokio::spawn(async move {
                // As for the other functions: tell the SCSI layer first,
                // then wait for the task to end.
                let code = if took_effect {
                    let tmf = TaskManagement::AbortTask {
                        lun: task_lun,
                        tag: u64::from(rtt),
                    };
                    match run_on_target(&target, nexus, tmf).await {
                        TmfResult::NotSupported => response::NOT_SUPPORTED,
                        TmfResult::Rejected => response::REJECTED,
                        // The transport stopped the task; the SCSI layer may not
                        // have known it at all.
                        _ => response::FUNCTION_COMPLETE,
                    }
                } else {
                    // Its response was already on the way.
                    response::TASK_DOES_NOT_EXIST
                };
                for w in aborted.waiters {
                    w.wait().await;
                }
                queue_response(&out, itt, code).await;
            });
            return Flow::Continue;
        }
        if let Some(pos) = self
            .held
            .iter()
            .position(|h| h.itt == rtt && h.lun.is_some())
        {
            let h = self.held.swap_remove(pos);
            self.consumed.push(h.cmdsn);
            return self.tmf_respond(t.itt, response::FUNCTION_COMPLETE).await;
        }
        // Not received yet (RFC 7143 11.5.1): a RefCmdSN inside the window
        // and before this request counts as received and aborted.
        let (exp, max) = {
            let w = self.window.lock();
            (w.exp_cmdsn(), w.max_cmdsn())
        };
        if sn_le(exp, t.ref_cmdsn) && sn_le(t.ref_cmdsn, max) && sn_lt(t.ref_cmdsn, t.cmdsn) {
            if !self.consumed.contains(&t.ref_cmdsn) {
                self.consumed.push(t.ref_cmdsn);
            }
            let flow = self.tmf_respond(t.itt, response::FUNCTION_COMPLETE).await;
            if let Flow::Close(c) = flow {
                return Flow::Close(c);
            }
            // Boxed: releasing held commands may run another TMF.
            return Box::pin(self.release_held()).await;
        }
        self.tmf_respond(t.itt, response::TASK_DOES_NOT_EXIST).await
    }
}

/// Run a task management function in the SCSI layer, off the reactor (it
/// may wait for a long operation to notice).
async fn run_on_target(target: &Arc<Target>, nexus: Nexus, tmf: TaskManagement) -> TmfResult {
    let scsi = target.scsi.clone();
    tokio::task::spawn_blocking(move || scsi.task_management(&nexus, tmf))
        .await
        .unwrap_or(TmfResult::Rejected)
}

/// Queue a Task Management Function Response from a task of its own, for
/// when the connection loop has moved on.
async fn queue_response(out: &mpsc::Sender<Outgoing>, itt: u32, code: u8) {
    let bhs = target::task_mgmt_response(itt, code);
    let pdu = OutPdu::new(bhs, Bytes::new(), StatSn::Advance);
    let _ = out.send(Outgoing::Pdu(pdu)).await;
}
