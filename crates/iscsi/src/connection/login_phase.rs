//! Driving the login state machine over a socket and turning a successful
//! login into a registered session.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use peer_limits::{EventLog, OutgoingBudget, PreLoginTicket, SourceTicket};
use scsi_api::Nexus;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::io::read_pdu;
use super::SessionCtx;
use crate::login::{LoginMachine, LoginResult, LoginStatus, LoginStep, Reply};
use crate::negotiation::SessionType;
use crate::pdu::initiator::Request;
use crate::pdu::{self, Framing, Pdu};
use crate::server::{PortalCount, PortalSlot, Server};
use crate::session::{CloseReason, Control, RegisterError, SessionHandle, SessionKey, SessionLink};

/// How long a reinstating login waits for the old session to go away.
const REINSTATE_WAIT: Duration = Duration::from_secs(10);

/// A session ready for the full feature phase.
pub(crate) struct Established {
    pub ctx: Arc<SessionCtx>,
    pub handle: SessionHandle,
    pub control_rx: mpsc::UnboundedReceiver<Control>,
    pub closed_tx: watch::Sender<bool>,
    pub exp_cmdsn: u32,
    pub next_statsn: u32,
    pub outgoing: Arc<OutgoingBudget>,
    /// The connection's place among its portal's logged-in connections.
    pub portal_slot: Option<PortalSlot>,
    /// Its place among its source address's.
    pub source_slot: Option<SourceTicket>,
}

async fn send_reply<S: AsyncWrite + Unpin>(stream: &mut S, reply: &Reply) -> std::io::Result<()> {
    let pdu = Pdu::new(reply.response.to_bhs(), Bytes::copy_from_slice(&reply.text));
    stream
        .write_all(&pdu::encode(&pdu, &Framing::LOGIN))
        .await?;
    stream.flush().await
}

/// Run the login phase. Returns the new session, or None when the login
/// failed, the connection ended, or the pre-login budget evicted it (the
/// reason is logged).
pub(crate) async fn login<S: AsyncRead + AsyncWrite + Unpin>(
    server: &Arc<Server>,
    stream: &mut S,
    peer: SocketAddr,
    local: SocketAddr,
    ticket: &PreLoginTicket,
    portal: &PortalCount,
) -> Option<Established> {
    let deadline = Instant::now() + server.options.login_timeout;
    // Below 2^31: libiscsi (1.19) takes StatSN from the login response
    // only when the login went through security negotiation, and from
    // then on only a StatSN "after" its initial 0 in serial arithmetic.
    // One from the upper half would leave its ExpStatSN stuck at 1 for
    // the whole session, and with it the lockstep test of `spin`.
    let first_statsn: u32 = rand::random::<u32>() >> 1;
    let mut machine = LoginMachine::new(
        server.limits.clone(),
        server.options.authenticator.clone(),
        first_statsn,
        server.options.cmdsn_window,
    );
    let directory = server.directory();
    let mut shutdown = server.shutdown_signal();
    loop {
        let read = tokio::select! {
            r = tokio::time::timeout_at(deadline, read_pdu(stream, &Framing::LOGIN)) => r,
            _ = shutdown.wait_for(|s| *s) => return None,
            _ = ticket.evicted() => {
                server.events.login_evicted.record(|held_back| {
                    tracing::info!(%peer, portal = %local, held_back, "connection still logging in closed to make room for a new one");
                });
                return None;
            }
        };
        let pdu = match read {
            Err(_) => {
                tracing::info!(%peer, portal = %local, "login timed out");
                return None;
            }
            Ok(Ok(Some(pdu))) => pdu,
            Ok(Ok(None)) => {
                tracing::debug!(%peer, "connection closed during login");
                return None;
            }
            Ok(Err(e)) => {
                tracing::info!(%peer, portal = %local, error = %e, "bad PDU during login");
                return None;
            }
        };
        let req = match Request::parse(pdu) {
            Ok(Request::Login(req)) => req,
            Ok(_) | Err(_) => {
                tracing::info!(%peer, portal = %local, "non-login PDU during login, closing");
                return None;
            }
        };
        // Wrong proofs delay this initiator's and this address's next ones.
        let checks_proof = machine.auth().is_some_and(|a| a.awaits_proof()) && !req.continue_;
        let proof = if checks_proof {
            let keys = peer_limits::auth_keys(machine.initiator_name().unwrap_or(""), peer.ip());
            let throttle = &server.options.auth_throttle;
            let Some(start) = throttle.reserve(&keys, deadline.into_std()) else {
                tracing::info!(
                    initiator = machine.initiator_name().unwrap_or("?"),
                    %peer,
                    portal = %local,
                    "login refused: CHAP attempts are delayed after failures, \
                     and this one would wait past the login timeout"
                );
                let reply = machine.failure(&req, LoginStatus::SERVICE_UNAVAILABLE);
                let _ = send_reply(stream, &reply).await;
                return None;
            };
            tokio::select! {
                _ = tokio::time::sleep_until(Instant::from_std(start)) => {}
                _ = shutdown.wait_for(|s| *s) => return None,
            }
            Some(keys)
        } else {
            None
        };
        let step = machine.step(&req, &directory);
        if let Some(keys) = &proof {
            judge_proof(server, &machine, keys, &step, peer, local);
        }
        match step {
            LoginStep::Reply(reply) => {
                if send_reply(stream, &reply).await.is_err() {
                    return None;
                }
            }
            LoginStep::Fail(reply, status) => {
                if proof.is_some() && status == LoginStatus::AUTHENTICATION_FAILURE {
                    // judge_proof has logged it, with the back-off.
                    count_refused(server, &machine, status);
                } else {
                    log_refused(server, &machine, peer, local, status);
                }
                let _ = send_reply(stream, &reply).await;
                return None;
            }
            LoginStep::Complete(mut reply, result) => {
                let (slot, source_slot) = match take_places(server, portal, peer) {
                    Ok(places) => places,
                    Err((refusal, events, why)) => {
                        server.logins.count_refused(refusal);
                        events.record(|held_back| {
                            tracing::info!(%peer, portal = %local, held_back, "login refused: {why}");
                        });
                        let status = LoginStatus::OUT_OF_RESOURCES;
                        let _ = send_reply(stream, &machine.failure(&req, status)).await;
                        return None;
                    }
                };
                let established = match establish(server, &directory, *result, peer, local).await {
                    Ok(mut e) => {
                        e.portal_slot = Some(slot);
                        e.source_slot = Some(source_slot);
                        e
                    }
                    Err(status) => {
                        log_refused(server, &machine, peer, local, status);
                        let reply = machine.failure(&req, status);
                        let _ = send_reply(stream, &reply).await;
                        return None;
                    }
                };
                reply.response.tsih = established.handle.tsih;
                if send_reply(stream, &reply).await.is_err() {
                    established.abandon(server).await;
                    return None;
                }
                server.logins.count_accepted();
                log_accepted(&established.ctx);
                return Some(established);
            }
        }
    }
}

/// A logged-in connection's places among its portal's and its source
/// address's; at either limit, how the refusal is counted and logged.
fn take_places<'a>(
    server: &'a Server,
    portal: &PortalCount,
    peer: SocketAddr,
) -> Result<(PortalSlot, SourceTicket), (crate::Refusal, &'a EventLog, &'static str)> {
    let events = &server.events;
    let slot = portal.try_take().ok_or((
        crate::Refusal::PortalFull,
        &events.portal_full,
        "portal at its limit of logged-in connections",
    ))?;
    let source = server.per_source.admit(peer.ip()).map_err(|_| {
        (
            crate::Refusal::OutOfResources,
            &events.source_holds_most,
            "the source address holds its limit of logged-in connections",
        )
    })?;
    Ok((slot, source))
}

/// Counts a checked proof: a failure delays the keys' next attempts, a
/// success clears them.
fn judge_proof(
    server: &Server,
    machine: &LoginMachine,
    keys: &[peer_limits::AuthKey],
    step: &LoginStep,
    peer: SocketAddr,
    local: SocketAddr,
) {
    let throttle = &server.options.auth_throttle;
    match step {
        LoginStep::Fail(_, status) if *status == LoginStatus::AUTHENTICATION_FAILURE => {
            let (failures, delay) = throttle.failed(keys);
            tracing::info!(
                initiator = machine.initiator_name().unwrap_or("?"),
                target = machine.target_name().unwrap_or("-"),
                %peer,
                portal = %local,
                reason = crate::login_outcome::Refused::of(*status, machine.auth())
                    .reason
                    .as_str(),
                failures,
                next_delay = ?delay,
                "login refused: CHAP authentication failed"
            );
        }
        LoginStep::Fail(..) => {}
        LoginStep::Reply(_) | LoginStep::Complete(..) => {
            if machine.auth().is_some_and(|a| a.complete()) {
                throttle.succeeded(keys);
            }
        }
    }
}

/// Count a refusal by its reason; the reason as the audit log gives it.
fn count_refused(server: &Server, machine: &LoginMachine, status: LoginStatus) -> String {
    let refused = crate::login_outcome::Refused::of(status, machine.auth());
    server.logins.count_refused(refused.refusal);
    refused.reason
}

fn log_refused(
    server: &Server,
    machine: &LoginMachine,
    peer: SocketAddr,
    local: SocketAddr,
    status: LoginStatus,
) {
    let reason = count_refused(server, machine, status);
    tracing::info!(
        initiator = machine.initiator_name().unwrap_or("?"),
        target = machine.target_name().unwrap_or("-"),
        %peer,
        portal = %local,
        status = format_args!("{:#06x}", status.code()),
        reason = reason.as_str(),
        "login refused"
    );
}

fn log_accepted(ctx: &SessionCtx) {
    tracing::info!(
        initiator = %ctx.initiator_name,
        isid = %hex(&ctx.isid),
        target = ctx.target.as_ref().map(|t| t.name.as_str()).unwrap_or("(discovery)"),
        tsih = ctx.tsih,
        peer = %ctx.peer,
        portal = %ctx.local,
        "login accepted"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Established {
    /// Undo registration when the final Login Response could not be sent.
    pub(crate) async fn abandon(self, server: &Arc<Server>) {
        if let (Some(target), Some(nexus)) = (&self.ctx.target, &self.ctx.nexus) {
            target.scsi.nexus_lost(nexus);
        }
        server.registry.lock().remove(self.ctx.id);
        let _ = self.closed_tx.send(true);
    }
}

/// Register the session: reinstate an older one with the same key, pick a
/// TSIH, tell the SCSI target about the new nexus.
async fn establish(
    server: &Arc<Server>,
    directory: &crate::server::Directory,
    result: LoginResult,
    peer: SocketAddr,
    local: SocketAddr,
) -> Result<Established, LoginStatus> {
    let initiator_name: Arc<str> = result.initiator_name.as_str().into();
    let (target, key) = match result.session_type {
        SessionType::Discovery => (None, None),
        SessionType::Normal => {
            let name = result
                .target_name
                .as_deref()
                .ok_or(LoginStatus::MISSING_PARAMETER)?;
            // The target may have been removed by a live config change mid-login.
            if directory.get(name).is_none() {
                return Err(LoginStatus::TARGET_REMOVED);
            }
            // The session gets the view of the initiator's group.
            let target = directory
                .get_for(name, &initiator_name)
                .ok_or(LoginStatus::AUTHORIZATION_FAILURE)?;
            let key = SessionKey {
                initiator_name: initiator_name.clone(),
                isid: result.isid,
                target_name: name.into(),
            };
            (Some(target), Some(key))
        }
    };

    // Session (TSIH 0) or connection (TSIH set) reinstatement: the old
    // session must be gone, and its nexus_lost called, before the new
    // nexus is added.
    let old = {
        let reg = server.registry.lock();
        if result.tsih != 0 {
            match reg.find_tsih(result.tsih) {
                Some(h) if h.key == key && key.is_some() => Some(h),
                _ => return Err(LoginStatus::SESSION_DOES_NOT_EXIST),
            }
        } else {
            key.as_ref().and_then(|k| reg.find_key(k))
        }
    };
    if let Some(old) = old {
        tracing::info!(initiator = %initiator_name, tsih = old.tsih, "reinstating session");
        old.close(CloseReason::Reinstated);
        if tokio::time::timeout(REINSTATE_WAIT, old.wait_closed())
            .await
            .is_err()
        {
            return Err(LoginStatus::SERVICE_UNAVAILABLE);
        }
    }

    let id = server.next_session_id();
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    let (closed_tx, closed_rx) = watch::channel(false);
    let outgoing = Arc::new(OutgoingBudget::new(server.options.max_queued_output));
    let handle = {
        let mut reg = server.registry.lock();
        if key.as_ref().is_some_and(|k| reg.find_key(k).is_some()) {
            // Another login with the same key won the race.
            return Err(LoginStatus::SERVICE_UNAVAILABLE);
        }
        if let Some(k) = &key {
            let held = reg
                .all()
                .iter()
                .filter(|h| {
                    h.key
                        .as_ref()
                        .is_some_and(|o| o.initiator_name == k.initiator_name)
                })
                .count();
            if held >= server.options.max_sessions_per_initiator {
                return Err(LoginStatus::OUT_OF_RESOURCES);
            }
        }
        reg.register(
            id,
            result.tsih,
            key,
            SessionLink {
                control: control_tx,
                closed: closed_rx,
                outgoing: outgoing.clone(),
            },
            server.options.max_sessions,
        )
        .map_err(|e| match e {
            RegisterError::TooManySessions | RegisterError::NoFreeTsih => {
                LoginStatus::OUT_OF_RESOURCES
            }
        })?
    };
    if server.is_shutting_down() {
        server.registry.lock().remove(id);
        return Err(LoginStatus::SERVICE_UNAVAILABLE);
    }
    let nexus = target.as_ref().map(|t| Nexus {
        initiator_name: initiator_name.clone(),
        isid: result.isid,
        target_name: t.name.as_str().into(),
        relative_port: t.portal_group.max(1),
        portal_group: t.portal_group,
    });
    if let (Some(t), Some(n)) = (&target, &nexus) {
        t.scsi.nexus_added(n);
    }
    let ctx = Arc::new(SessionCtx {
        id,
        tsih: handle.tsih,
        cid: result.cid,
        initiator_name,
        isid: result.isid,
        target,
        nexus,
        params: result.params,
        peer,
        local,
        initiator_alias: result.initiator_alias,
        usage: crate::session_info::SessionUsage::new(),
    });
    Ok(Established {
        ctx,
        handle,
        control_rx,
        closed_tx,
        exp_cmdsn: result.exp_cmdsn,
        next_statsn: result.next_statsn,
        outgoing,
        portal_slot: None,
        source_slot: None,
    })
}
