//! A queue's commands as its connection receives them: Connect first,
//! then admin or NVM commands, their data in the capsule or asked for
//! with R2T, fused pairs kept together, device work on blocking threads.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use peer_limits::PreLoginTicket;
use tokio::sync::watch;

use crate::admin::{self, Reply};
use crate::auth::{self, Transaction};
use crate::capsule::{Fuse, Sqe, SGL_IN_CAPSULE, SGL_TRANSPORT};
use crate::controller::Controller;
use crate::fabrics;
use crate::io::{self, Transfer};
use crate::outbox::Completer;
use crate::server::Context;
use crate::status::Status;
use crate::wire::{self, fes, DataHeader, Fatal, Pdu};

/// How a connection ended.
#[derive(Debug)]
pub(crate) enum End {
    /// It broke the protocol: the termination request, and the header.
    Fatal(Fatal, Vec<u8>),
    Closed(String),
    /// The host stopped reading what it was sent.
    Stalled(String),
}

fn fatal(fes: u16, fei: u32, reason: &'static str) -> End {
    End::Fatal(Fatal { fes, fei, reason }, Vec::new())
}

/// A command waiting for data it asked for with R2T.
struct Pending {
    sqe: Sqe,
    buf: Vec<u8>,
    want: usize,
    digest_ok: bool,
}

/// Fused commands travel in pairs: the Compare first, then the Write,
/// each maybe waiting for its data.
#[derive(Default)]
struct Fused {
    /// The last capsule was a first fused command.
    open_first: Option<u16>,
    partner: HashMap<u16, u16>,
    /// Commands with their data, waiting for their partner's.
    parked: HashMap<u16, (Sqe, Vec<u8>)>,
    /// The first fused command failed before its second came.
    failed_first: bool,
    /// Fused commands to fail when their data is in: their partner never
    /// came, or failed.
    orphans: HashMap<u16, Status>,
}

struct Connected {
    ctrl: Arc<Controller>,
    qid: u16,
    /// The queue's authentication, when its host must authenticate.
    auth: Option<Transaction>,
}

impl Connected {
    fn authenticated(&self) -> bool {
        self.auth.as_ref().is_none_or(Transaction::authenticated)
    }
}

pub(crate) struct Queue {
    cx: Arc<Context>,
    peer: SocketAddr,
    via: fabrics::Via,
    completer: Arc<Completer>,
    ticket: Option<PreLoginTicket>,
    conn: Option<Connected>,
    transfers: HashMap<u16, Pending>,
    /// Commands whose data is yet to be asked for, and their lengths.
    deferred: VecDeque<(Sqe, usize)>,
    /// Bytes asked for with R2T and not yet received.
    receiving: usize,
    fused: Fused,
}

impl Queue {
    pub(crate) fn new(
        cx: Arc<Context>,
        peer: SocketAddr,
        via: fabrics::Via,
        completer: Arc<Completer>,
        ticket: Option<PreLoginTicket>,
    ) -> Queue {
        Queue {
            cx,
            peer,
            via,
            completer,
            ticket,
            conn: None,
            transfers: HashMap::new(),
            deferred: VecDeque::new(),
            receiving: 0,
            fused: Fused::default(),
        }
    }

    /// Connected, and authenticated when the host must be: until then
    /// the queue stays under the budgets and deadline of connections
    /// not yet connected.
    pub(crate) fn connected(&self) -> bool {
        self.conn.as_ref().is_some_and(Connected::authenticated)
    }

    pub(crate) fn controller_ended(&self) -> Option<watch::Receiver<bool>> {
        self.conn.as_ref().map(|c| c.ctrl.ended())
    }

    pub(crate) async fn evicted(&self) {
        match &self.ticket {
            Some(t) => t.evicted().await,
            None => std::future::pending().await,
        }
    }

    /// The connection is gone: an admin queue's controller ends with it.
    pub(crate) fn closed(&mut self) {
        let Some(c) = self.conn.take() else { return };
        c.ctrl.queues.fetch_sub(1, Ordering::Relaxed);
        if c.qid == 0 {
            self.cx.registry.remove(c.ctrl.cntlid);
        } else {
            c.ctrl.release_qid(c.qid);
        }
    }

    pub(crate) async fn on_pdu(&mut self, pdu: Pdu) -> Result<(), End> {
        let limits = &self.cx.limits;
        if !self
            .completer
            .backlog
            .below(limits.outgoing_bytes, limits.write_deadline)
            .await
        {
            return Err(End::Stalled("the host reads no answers".into()));
        }
        match pdu {
            Pdu::Command {
                sqe,
                data,
                digest_ok,
            } => self.on_command(Sqe(sqe), data, digest_ok).await,
            Pdu::H2CData(h, data, ok) => self.on_data(h, data, ok).await,
            Pdu::Term { fes, .. } => Err(End::Closed(format!(
                "the host ended the connection (status {fes:#x})"
            ))),
            _ => Err(fatal(
                fes::PDU_SEQUENCE,
                0,
                "an initialization request after initialization",
            )),
        }
    }

    async fn on_command(&mut self, sqe: Sqe, data: Vec<u8>, digest_ok: bool) -> Result<(), End> {
        let cid = sqe.cid();
        let is_connect = sqe.opcode() == fabrics::OPCODE && sqe.fctype() == fabrics::CONNECT;
        if self.conn.is_none() != is_connect {
            self.completer.refuse(cid, Status::COMMAND_SEQUENCE);
            return Ok(());
        }
        // Until the host has authenticated, nothing else reaches the
        // controller (Base 2.0, 8.13.1).
        if self
            .conn
            .as_ref()
            .is_some_and(|c| !c.authenticated() && !auth::allowed_before(&sqe))
        {
            self.completer.refuse(cid, Status::AUTH_REQUIRED);
            return Ok(());
        }
        if !self.completer.fetched(cid) {
            self.completer.refuse(cid, Status::CID_CONFLICT);
            return Ok(());
        }
        if self.completer.in_flight() as u32 > self.completer.entries() {
            return Err(fatal(
                fes::PDU_SEQUENCE,
                0,
                "more commands than the queue has entries",
            ));
        }
        self.pair(&sqe);
        let want = match self.data_wanted(&sqe) {
            Ok(n) => n,
            Err(s) => return self.fail(&sqe, s),
        };
        let sgl = sqe.sgl();
        match (want, sgl.kind) {
            (0, _) => self.ready(sqe, Vec::new(), digest_ok).await,
            (n, SGL_IN_CAPSULE) if sgl.addr == 0 && data.len() == n => {
                self.ready(sqe, data, digest_ok).await
            }
            (_, SGL_IN_CAPSULE) => self.fail(&sqe, Status::SGL_LENGTH_INVALID),
            (n, SGL_TRANSPORT) if data.is_empty() => {
                self.deferred.push_back((sqe, n));
                self.ask_for_data();
                Ok(())
            }
            _ => self.fail(&sqe, Status::SGL_INVALID_TYPE),
        }
    }

    /// Sends R2Ts for the commands waiting for their data, in order,
    /// while the data asked for and not yet received stays within the
    /// connection's bound (one command at least, however long).
    fn ask_for_data(&mut self) {
        while let Some(&(sqe, n)) = self.deferred.front() {
            if self.receiving > 0 && self.receiving + n > self.cx.limits.r2t_bytes {
                return;
            }
            self.deferred.pop_front();
            let cid = sqe.cid();
            self.receiving += n;
            let pending = Pending {
                sqe,
                buf: Vec::new(),
                want: n,
                digest_ok: true,
            };
            self.transfers.insert(cid, pending);
            self.completer.send(
                wire::encode_r2t(cid, cid, 0, n as u32, self.completer.digests),
                0,
            );
        }
    }

    /// Bytes command `sqe` carries from the host, or why it is refused
    /// before any move.
    fn data_wanted(&self, sqe: &Sqe) -> Result<usize, Status> {
        if sqe.psdt() == 0 {
            return Err(Status::INVALID_FIELD); // fabrics commands use SGLs
        }
        let Some(conn) = &self.conn else {
            return Ok(fabrics::CONNECT_DATA_LEN); // a Connect
        };
        if sqe.opcode() == fabrics::OPCODE && sqe.fctype() == auth::AUTH_SEND {
            let n = sqe.sgl().len as usize;
            return if n > auth::MAX_MESSAGE {
                Err(Status::INVALID_FIELD)
            } else {
                Ok(n)
            };
        }
        if sqe.opcode() == fabrics::OPCODE || conn.qid == 0 {
            return Ok(0);
        }
        let sub = conn.ctrl.subsystem();
        // Until its controller is ended, a host the allow list no longer
        // admits reaches no namespace.
        if !sub.admits(&conn.ctrl.host_nqn) {
            return Err(Status::ACCESS_DENIED);
        }
        let ns = sub.namespaces.get(&sqe.nsid());
        match io::transfer(ns.map(|n| &**n), sqe, self.cx.limits.transfer())? {
            Transfer::ToTarget(n) => Ok(n),
            Transfer::ToHost(_) | Transfer::None => Ok(0),
        }
    }

    async fn on_data(&mut self, h: DataHeader, data: Vec<u8>, ok: bool) -> Result<(), End> {
        let Some(t) = self.transfers.get_mut(&h.ttag) else {
            return Err(fatal(
                fes::INVALID_HEADER_FIELD,
                10,
                "data for a transfer tag not given",
            ));
        };
        if h.cccid != t.sqe.cid() {
            return Err(fatal(
                fes::INVALID_HEADER_FIELD,
                8,
                "data for another command than its tag's",
            ));
        }
        if data.len() > self.cx.limits.max_h2c_data as usize {
            return Err(fatal(
                fes::DATA_LIMIT_EXCEEDED,
                16,
                "more data in a PDU than MAXH2CDATA",
            ));
        }
        if h.offset as usize != t.buf.len() || t.buf.len() + data.len() > t.want {
            return Err(fatal(
                fes::DATA_OUT_OF_RANGE,
                12,
                "data outside what the R2T asked for",
            ));
        }
        if t.buf.is_empty() {
            // Data in one PDU (most writes): kept as it came, not copied.
            t.buf = data;
        } else {
            t.buf.extend_from_slice(&data);
        }
        t.digest_ok &= ok;
        if t.buf.len() < t.want {
            if h.last {
                return Err(fatal(
                    fes::PDU_SEQUENCE,
                    1,
                    "a last data PDU before the data's end",
                ));
            }
            return Ok(());
        }
        let Some(t) = self.transfers.remove(&h.ttag) else {
            return Ok(());
        };
        self.receiving -= t.want;
        self.ask_for_data();
        self.ready(t.sqe, t.buf, t.digest_ok).await
    }

    /// Pairs fused commands in the order their capsules came.
    fn pair(&mut self, sqe: &Sqe) {
        if self.conn.as_ref().is_none_or(|c| c.qid == 0) {
            return; // only NVM commands are fused
        }
        let cid = sqe.cid();
        let f = &mut self.fused;
        if std::mem::take(&mut f.failed_first) && sqe.fuse() == Fuse::Second {
            f.orphans.insert(cid, Status::FUSED_FAILED);
            return;
        }
        match (f.open_first.take(), sqe.fuse()) {
            (Some(first), Fuse::Second) => {
                f.partner.insert(first, cid);
                f.partner.insert(cid, first);
            }
            (Some(first), _) => {
                if f.parked.remove(&first).is_some() {
                    self.completer.complete_now(first, Status::FUSED_MISSING, 0);
                } else {
                    f.orphans.insert(first, Status::FUSED_MISSING);
                }
            }
            (None, Fuse::Second) => {
                f.orphans.insert(cid, Status::FUSED_MISSING);
            }
            _ => {}
        }
        if sqe.fuse() == Fuse::First {
            self.fused.open_first = Some(cid);
        }
    }

    /// Fails `sqe`, and its fused partner with it.
    fn fail(&mut self, sqe: &Sqe, status: Status) -> Result<(), End> {
        let cid = sqe.cid();
        self.completer.complete_now(cid, status, 0);
        self.log_error(sqe, status, 0);
        let f = &mut self.fused;
        f.orphans.remove(&cid);
        if f.open_first == Some(cid) {
            f.open_first = None;
            f.failed_first = true;
        }
        if let Some(p) = f.partner.remove(&cid) {
            f.partner.remove(&p);
            if f.parked.remove(&p).is_some() {
                self.completer.complete_now(p, Status::FUSED_FAILED, 0);
            } else {
                f.orphans.insert(p, Status::FUSED_FAILED);
            }
        }
        Ok(())
    }

    fn log_error(&self, sqe: &Sqe, status: Status, lba: u64) {
        if let Some(c) = &self.conn {
            c.ctrl.log_error(c.qid, sqe.cid(), status, sqe.nsid(), lba);
        }
    }

    /// Command `sqe` has all its data.
    async fn ready(&mut self, sqe: Sqe, data: Vec<u8>, digest_ok: bool) -> Result<(), End> {
        if !digest_ok {
            return self.fail(&sqe, Status::TRANSIENT_TRANSPORT);
        }
        let Some(conn) = &self.conn else {
            self.connect(&sqe, &data);
            return Ok(());
        };
        let ctrl = conn.ctrl.clone();
        let qid = conn.qid;
        if sqe.opcode() == fabrics::OPCODE {
            return self.fabrics(&ctrl, qid, &sqe, &data);
        }
        if qid == 0 {
            let offer = self.cx.limits.offer();
            let reply = if ctrl.is_discovery() {
                let table = self.cx.registry.table();
                crate::discovery::admin(&self.cx.discovery, &table, &ctrl, &sqe, &offer)
            } else {
                admin::run(&ctrl, &sqe, &offer)
            };
            match reply {
                Reply::Done {
                    status,
                    result,
                    data,
                } => {
                    if !status.is_success() {
                        self.log_error(&sqe, status, 0);
                    }
                    self.completer
                        .complete_with_data(sqe.cid(), status, result, &data, 0);
                }
                Reply::Held => {}
            }
            return Ok(());
        }
        self.nvm(ctrl, sqe, data).await
    }

    fn connect(&mut self, sqe: &Sqe, data: &[u8]) {
        let peer = self.peer.to_string();
        let limits = self.cx.limits.queues();
        match fabrics::connect(&self.cx.registry, limits, &peer, self.via, sqe, data) {
            Ok(c) => {
                self.completer.connected(c.qid, c.entries, c.flow_off);
                c.ctrl.queues.fetch_add(1, Ordering::Relaxed);
                if c.qid == 0 {
                    c.ctrl.set_admin(self.completer.clone());
                    tokio::spawn(watch_keep_alive(self.cx.clone(), c.ctrl.clone()));
                }
                let cntlid = c.ctrl.cntlid;
                tracing::debug!(peer = %self.peer, cntlid, qid = c.qid, host = %c.ctrl.host_nqn, "nvmf: queue connected");
                let auth = c
                    .auth
                    .map(|k| Transaction::new(k, &c.ctrl.host_nqn, &c.ctrl.subsystem().nqn));
                // AUTHREQ.ATR: the host authenticates before anything else.
                let atr = if auth.is_some() { 1 << 17 } else { 0 };
                let conn = Connected {
                    ctrl: c.ctrl,
                    qid: c.qid,
                    auth,
                };
                if conn.authenticated() {
                    self.ticket = None;
                }
                self.conn = Some(conn);
                self.completer
                    .complete_now(sqe.cid(), Status::SUCCESS, u64::from(cntlid) | atr);
            }
            Err(r) => {
                tracing::info!(peer = %self.peer, "nvmf: Connect refused: {:?}", r.status);
                self.completer.complete_now(sqe.cid(), r.status, r.result);
            }
        }
    }

    fn fabrics(&mut self, ctrl: &Controller, qid: u16, sqe: &Sqe, data: &[u8]) -> Result<(), End> {
        let cid = sqe.cid();
        match sqe.fctype() {
            auth::AUTH_SEND | auth::AUTH_RECEIVE => return self.authentication(sqe, data),
            _ => {}
        }
        match sqe.fctype() {
            fabrics::PROPERTY_GET | fabrics::PROPERTY_SET if qid == 0 => {
                match fabrics::property(ctrl, self.cx.limits.queues(), sqe) {
                    Ok(v) => self.completer.complete_now(cid, Status::SUCCESS, v),
                    Err(s) => self.completer.complete_now(cid, s, 0),
                }
                Ok(())
            }
            fabrics::DISCONNECT if qid != 0 => {
                self.completer.complete_now(cid, Status::SUCCESS, 0);
                Err(End::Closed("the host disconnected the queue".into()))
            }
            fabrics::CONNECT => self.fail(sqe, Status::COMMAND_SEQUENCE),
            _ => self.fail(sqe, Status::INVALID_OPCODE),
        }
    }

    /// AUTH_Send and AUTH_Receive: a step of the queue's authentication.
    fn authentication(&mut self, sqe: &Sqe, data: &[u8]) -> Result<(), End> {
        let sending = sqe.fctype() == auth::AUTH_SEND;
        let Some(t) = self.conn.as_mut().and_then(|c| c.auth.as_mut()) else {
            return self.fail(sqe, Status::COMMAND_SEQUENCE); // nothing to authenticate
        };
        if let Err(s) = auth::check_command(sqe, sending.then_some(data.len())) {
            return self.fail(sqe, s);
        }
        if sending {
            t.send(data);
            self.completer.complete_now(sqe.cid(), Status::SUCCESS, 0);
        } else {
            let mut msg = t.receive();
            let al = crate::wire::le32(&sqe.0, 44) as usize;
            msg.truncate(al.min(sqe.sgl().len as usize));
            self.completer
                .complete_with_data(sqe.cid(), Status::SUCCESS, 0, &msg, 0);
        }
        if self.connected() {
            self.ticket = None;
        }
        Ok(())
    }

    /// An NVM command with its data: alone, or as half of a fused pair.
    async fn nvm(&mut self, ctrl: Arc<Controller>, sqe: Sqe, data: Vec<u8>) -> Result<(), End> {
        let cid = sqe.cid();
        if let Some(status) = self.fused.orphans.remove(&cid) {
            return self.fail(&sqe, status);
        }
        match sqe.fuse() {
            Fuse::Normal => {}
            Fuse::Reserved => return self.fail(&sqe, Status::INVALID_FIELD),
            Fuse::First | Fuse::Second => {
                let partner = self.fused.partner.get(&cid).copied();
                let Some(other) = partner.and_then(|p| self.fused.parked.remove(&p)) else {
                    self.fused.parked.insert(cid, (sqe, data));
                    return Ok(());
                };
                self.fused.partner.remove(&cid);
                self.fused.partner.remove(&other.0.cid());
                let (first, second) = if sqe.fuse() == Fuse::First {
                    ((sqe, data), other)
                } else {
                    (other, (sqe, data))
                };
                return self.compare_and_write(ctrl, first, second).await;
            }
        }
        let Some(ns) = ctrl.subsystem().namespaces.get(&sqe.nsid()).cloned() else {
            return self.fail(&sqe, Status::INVALID_NAMESPACE);
        };
        // (Asked before `ns` moves into the command.)
        let inline =
            !ns.backing.device().capabilities().may_block && io::runs_without_waiting(&ns, &sqe);
        let out = if sqe.opcode() == io::OP_READ {
            sqe.sgl().len as usize
        } else {
            0
        };
        let taken = self.take_budget(out).await?;
        let completer = self.completer.clone();
        let qid = self.conn.as_ref().map_or(0, |c| c.qid);
        let run = move || {
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                io::run(&ns, &sqe, &data, &ctrl.counters)
            }));
            let done = run.unwrap_or_else(|_| io::Done {
                status: Status::INTERNAL_ERROR,
                data: Vec::new(),
                lba: 0,
            });
            if !done.status.is_success() {
                ctrl.log_error(qid, cid, done.status, sqe.nsid(), done.lba);
            }
            completer.complete_with_data(cid, done.status, 0, &done.data, taken);
        };
        if inline {
            // A device that never waits on I/O (RAM) answers here, as the
            // iSCSI transport runs such commands: a hand-off to another
            // thread would cost more than the command.
            run();
            return Ok(());
        }
        let permit = self.device_slot().await?;
        // The blocking thread completes the command itself: handing the
        // result back through a task of its own cost a second wake-up.
        tokio::task::spawn_blocking(move || {
            run();
            drop(permit);
        });
        Ok(())
    }

    async fn compare_and_write(
        &mut self,
        ctrl: Arc<Controller>,
        first: (Sqe, Vec<u8>),
        second: (Sqe, Vec<u8>),
    ) -> Result<(), End> {
        let Some(ns) = ctrl.subsystem().namespaces.get(&first.0.nsid()).cloned() else {
            self.completer
                .complete_now(first.0.cid(), Status::INVALID_NAMESPACE, 0);
            self.completer
                .complete_now(second.0.cid(), Status::FUSED_FAILED, 0);
            return Ok(());
        };
        let permit = self.device_slot().await?;
        let completer = self.completer.clone();
        tokio::spawn(async move {
            let (a, b) = (first.0.cid(), second.0.cid());
            let run = {
                let ctrl = ctrl.clone();
                tokio::task::spawn_blocking(move || {
                    io::compare_and_write(
                        &ns,
                        (&first.0, &first.1),
                        (&second.0, &second.1),
                        &ctrl.counters,
                    )
                })
            };
            let (sa, sb) = run
                .await
                .unwrap_or((Status::INTERNAL_ERROR, Status::FUSED_FAILED));
            drop(permit);
            completer.complete_now(a, sa, 0);
            completer.complete_now(b, sb, 0);
        });
        Ok(())
    }

    /// Room in the outgoing budget for `bytes` of read data.
    /// One of the threads the device work of every queue shares.
    async fn device_slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, End> {
        self.cx
            .device_slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| End::Closed("shutting down".into()))
    }

    async fn take_budget(&self, bytes: usize) -> Result<u32, End> {
        if bytes == 0 {
            return Ok(0);
        }
        let budget = &self.completer.budget;
        budget
            .take(bytes, self.cx.limits.write_deadline)
            .await
            .map_err(|s| End::Stalled(format!("no room to queue read data ({s:?})")))
    }
}

/// Ends a controller whose host stopped sending Keep Alive within its
/// timeout (Base 2.0, 3.9.4).
async fn watch_keep_alive(cx: Arc<Context>, ctrl: Arc<Controller>) {
    let mut ended = ctrl.ended();
    loop {
        let tick = (ctrl.kato() / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = crate::connection::until(&mut ended) => return,
        }
        if ctrl.keep_alive_expired() {
            tracing::warn!(cntlid = ctrl.cntlid, host = %ctrl.host_nqn, "nvmf: keep alive timeout expired; controller ended");
            cx.registry.remove(ctrl.cntlid);
            return;
        }
    }
}
