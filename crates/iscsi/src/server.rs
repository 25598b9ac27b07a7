//! The listening side: targets, accepting connections, shutdown.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use peer_limits::{EventLog, PreLoginBudget, SourceLimit};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::access::{AccessPolicy, Admission};
use crate::connection;
use crate::discovery::Listing;
use crate::login::{TargetDirectory, TargetInfo};
use crate::login_outcome::LoginCounters;
use crate::negotiation::TargetLimits;
use crate::options::ServerOptions;
use crate::session::{Control, Registry, SessionHandle};
use crate::session_info::SessionInfo;
use crate::shards::Shards;

/// One iSCSI target: a name, where it is reachable and the SCSI device
/// server behind it.
pub struct Target {
    /// IQN.
    pub name: String,
    /// TargetAlias.
    pub alias: Option<String>,
    /// TPGT.
    pub portal_group: u16,
    /// Addresses listed in SendTargets for this target (every portal).
    pub portals: Vec<SocketAddr>,
    pub scsi: Arc<dyn scsi_api::ScsiTarget>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("alias", &self.alias)
            .field("portal_group", &self.portal_group)
            .field("portals", &self.portals)
            .finish_non_exhaustive()
    }
}

/// Counts live connections so shutdown can wait for them.
#[derive(Debug)]
pub(crate) struct ConnectionCount(watch::Sender<usize>);

/// Held by each connection task; dropping it counts the connection out.
pub(crate) struct ConnectionGuard(Arc<Server>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0
            .connections
            .0
            .send_modify(|c| *c = c.saturating_sub(1));
    }
}

/// The logged-in connections of one portal, against its limit.
pub(crate) struct PortalCount {
    count: Arc<AtomicUsize>,
    limit: usize,
}

impl PortalCount {
    /// A place for one more logged-in connection, if the portal has one.
    pub fn try_take(&self) -> Option<PortalSlot> {
        let taken = self
            .count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                (c < self.limit).then_some(c + 1)
            });
        taken.ok().map(|_| PortalSlot(self.count.clone()))
    }
}

/// One logged-in connection counted against its portal's limit while it
/// lives.
pub(crate) struct PortalSlot(Arc<AtomicUsize>);

impl Drop for PortalSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Events a peer can repeat at will: each logged at most once per
/// interval, each counted for metrics.
#[derive(Debug)]
pub struct ListenerEvents {
    /// Connections closed at accept: their source had as many logging in
    /// as it may.
    pub source_full: EventLog,
    /// Connections logging in closed to make room for newer ones.
    pub login_evicted: EventLog,
    /// Logins refused: the portal had its most logged-in connections.
    pub portal_full: EventLog,
    /// Logins refused: their source held its most logged-in connections.
    pub source_holds_most: EventLog,
    /// Connections dropped because the initiator stopped reading.
    pub stalled: EventLog,
}

const EVENT_LOG_INTERVAL: Duration = Duration::from_secs(10);

impl Default for ListenerEvents {
    fn default() -> Self {
        ListenerEvents {
            source_full: EventLog::new(EVENT_LOG_INTERVAL),
            login_evicted: EventLog::new(EVENT_LOG_INTERVAL),
            portal_full: EventLog::new(EVENT_LOG_INTERVAL),
            source_holds_most: EventLog::new(EVENT_LOG_INTERVAL),
            stalled: EventLog::new(EVENT_LOG_INTERVAL),
        }
    }
}

/// The iSCSI target server.
pub struct Server {
    pub(crate) options: ServerOptions,
    pub(crate) limits: TargetLimits,
    targets: RwLock<Arc<Vec<Arc<Target>>>>,
    pub(crate) registry: Mutex<Registry>,
    shutdown: watch::Sender<bool>,
    connections: ConnectionCount,
    next_id: AtomicU64,
    /// Where accepted connections run.
    shards: Shards,
    /// Connections accepted and not logged in yet, on every portal.
    prelogin: Arc<PreLoginBudget>,
    /// Logged-in connections, per source address.
    pub(crate) per_source: Arc<SourceLimit>,
    pub(crate) events: ListenerEvents,
    /// Logins accepted and refused, by reason.
    pub(crate) logins: LoginCounters,
}

/// How many sessions are logged in, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionCounts {
    /// Normal sessions by target name: every target served (with 0), and
    /// any a session still uses after it was removed.
    pub by_target: Vec<(String, usize)>,
    pub discovery: usize,
    /// Logged-in connections, normal and discovery (one per session).
    pub connections: usize,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Snapshot of the targets, used to look them up during login, with the
/// access policy that says who may use them.
pub(crate) struct Directory {
    targets: Arc<Vec<Arc<Target>>>,
    access: Arc<dyn AccessPolicy>,
}

impl Directory {
    pub fn get(&self, name: &str) -> Option<Arc<Target>> {
        self.targets.iter().find(|t| t.name == name).cloned()
    }

    /// The target as `initiator` may use it: with its group's SCSI view in
    /// place of the target's own, or `None` when it may not.
    pub fn get_for(&self, name: &str, initiator: &str) -> Option<Arc<Target>> {
        let target = self.get(name)?;
        match self.access.admit(initiator, name) {
            Admission::Refused => None,
            Admission::Open => Some(target),
            Admission::View(scsi) => Some(Arc::new(Target {
                name: target.name.clone(),
                alias: target.alias.clone(),
                portal_group: target.portal_group,
                portals: target.portals.clone(),
                scsi,
            })),
        }
    }
}

impl TargetDirectory for Directory {
    fn target_info(&self, name: &str) -> Option<TargetInfo> {
        self.get(name).map(|t| TargetInfo {
            portal_group: t.portal_group,
            alias: t.alias.clone(),
        })
    }

    fn admits(&self, initiator: &str, name: &str) -> bool {
        !self.access.admit(initiator, name).is_refused()
    }
}

impl Server {
    /// A server whose connections run on the runtime that accepts them.
    pub fn new(options: ServerOptions, targets: Vec<Target>) -> Arc<Server> {
        Server::with_connection_runtimes(options, targets, Vec::new())
    }

    /// A server whose connections run on `runtimes`, each placed on the
    /// one serving the fewest. Each should have one worker thread; why is
    /// in the `shards` module. The runtimes must outlive the server's
    /// connections ([`Server::shutdown`] waits for them to end).
    pub fn with_connection_runtimes(
        options: ServerOptions,
        targets: Vec<Target>,
        runtimes: Vec<tokio::runtime::Handle>,
    ) -> Arc<Server> {
        let limits = options.limits();
        Arc::new(Server {
            limits,
            targets: RwLock::new(Arc::new(targets.into_iter().map(Arc::new).collect())),
            registry: Mutex::new(Registry::default()),
            shutdown: watch::channel(false).0,
            connections: ConnectionCount(watch::channel(0).0),
            next_id: AtomicU64::new(1),
            shards: Shards::new(runtimes),
            prelogin: PreLoginBudget::new(options.max_logins_per_source, options.max_logins),
            per_source: SourceLimit::new(options.max_connections_per_source),
            events: ListenerEvents::default(),
            logins: LoginCounters::default(),
            options,
        })
    }

    /// Live config change; existing sessions keep their target handle.
    pub fn replace_targets(&self, targets: Vec<Target>) {
        *self.targets.write() = Arc::new(targets.into_iter().map(Arc::new).collect());
    }

    /// After an access change: ask every session whose initiator may no
    /// longer use its target, or whose target is gone, to log out (it is
    /// closed if it does not). Returns how many were asked.
    pub fn end_refused_sessions(&self) -> usize {
        let sessions = self.registry.lock().all();
        let targets = self.targets.read().clone();
        let mut asked = 0;
        for s in sessions {
            let Some(key) = &s.key else {
                continue;
            };
            let gone = !targets.iter().any(|t| *t.name == *key.target_name);
            if gone
                || self
                    .options
                    .access
                    .admit(&key.initiator_name, &key.target_name)
                    .is_refused()
            {
                tracing::info!(
                    initiator = %key.initiator_name,
                    target = %key.target_name,
                    tsih = s.tsih,
                    "access withdrawn: asking the session to log out"
                );
                let _ = s.control.send(Control::RequestLogout);
                asked += 1;
            }
        }
        asked
    }

    pub(crate) fn directory(&self) -> Directory {
        Directory {
            targets: self.targets.read().clone(),
            access: self.options.access.clone(),
        }
    }

    /// Every target `initiator` may log in to, as SendTargets reports it.
    pub(crate) fn listings(&self, initiator: &str) -> Vec<Listing> {
        self.targets
            .read()
            .iter()
            .filter(|t| !self.options.access.admit(initiator, &t.name).is_refused())
            .map(|t| Listing {
                name: t.name.clone(),
                portal_group: t.portal_group,
                portals: t.portals.clone(),
            })
            .collect()
    }

    /// Counts of the events peers can repeat, for metrics.
    pub fn events(&self) -> &ListenerEvents {
        &self.events
    }

    /// Sessions logged in to `target` now.
    pub fn sessions_on(&self, target: &str) -> usize {
        self.registry.lock().for_target(target).len()
    }

    /// How long a session asked to log out has before it is closed.
    pub fn logout_timeout(&self) -> Duration {
        self.options.logout_timeout
    }

    /// Logins accepted and refused so far, for metrics.
    pub fn logins(&self) -> &LoginCounters {
        &self.logins
    }

    /// Every logged-in session, by id. Each LU of a session's map is
    /// locked briefly to read its reservations.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        // Snapshots are taken outside the registry's lock.
        let described = self.registry.lock().described();
        described.iter().map(|c| SessionInfo::of(c)).collect()
    }

    /// The logged-in session `id`, if there is one.
    pub fn session(&self, id: u64) -> Option<SessionInfo> {
        let found = self.registry.lock().described_one(id);
        found.map(|(ctx, _)| SessionInfo::of(&ctx))
    }

    /// Ask session `id` to log out (Async Message); it is closed if it
    /// has not after `logout_timeout`, as when access is withdrawn. False
    /// when there is no such session.
    pub fn request_logout(&self, id: u64) -> bool {
        let Some((ctx, handle)) = self.registry.lock().described_one(id) else {
            return false;
        };
        tracing::info!(
            initiator = %ctx.initiator_name,
            tsih = ctx.tsih,
            peer = %ctx.peer,
            "administrator ends the session: asking it to log out"
        );
        let _ = handle.control.send(Control::RequestLogout);
        true
    }

    /// Sessions per target and connections, without locking any LU.
    pub fn session_counts(&self) -> SessionCounts {
        let mut counts = SessionCounts {
            by_target: self
                .targets
                .read()
                .iter()
                .map(|t| (t.name.clone(), 0))
                .collect(),
            ..SessionCounts::default()
        };
        for s in self.registry.lock().all() {
            counts.connections += 1;
            let Some(name) = s.target_name() else {
                counts.discovery += 1;
                continue;
            };
            match counts.by_target.iter_mut().find(|(t, _)| t == name) {
                Some((_, n)) => *n += 1,
                None => counts.by_target.push((name.to_string(), 1)),
            }
        }
        counts
    }

    /// Connections logging in now, on every portal.
    pub fn logging_in(&self) -> usize {
        self.prelogin.waiting()
    }

    pub(crate) fn next_session_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    fn track_connection(self: &Arc<Self>) -> ConnectionGuard {
        self.connections.0.send_modify(|c| *c += 1);
        ConnectionGuard(self.clone())
    }

    /// Accept connections on `listener` until [`Server::shutdown`] is called.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        // The sender stays alive (and silent) for as long as we serve.
        let (_never, stop) = watch::channel(false);
        self.serve_until(listener, stop).await
    }

    /// Accept connections on `listener` until [`Server::shutdown`] is
    /// called or `stop` turns true (the portal was removed). Connections
    /// already accepted keep running either way until shutdown: removing
    /// a portal only stops new logins on it.
    pub async fn serve_until(
        self: Arc<Self>,
        listener: TcpListener,
        mut stop: watch::Receiver<bool>,
    ) -> std::io::Result<()> {
        let local = listener.local_addr()?;
        tracing::info!(portal = %local, "iSCSI portal listening");
        let mut shutdown = self.shutdown_signal();
        let on_portal = Arc::new(PortalCount {
            count: Arc::new(AtomicUsize::new(0)),
            limit: self.options.max_connections_per_portal,
        });
        // False once the stopping side is gone: only shutdown ends us then.
        let mut stoppable = true;
        loop {
            if *shutdown.borrow() || *stop.borrow() {
                break;
            }
            tokio::select! {
                _ = shutdown.changed() => continue,
                changed = stop.changed(), if stoppable => {
                    stoppable = changed.is_ok();
                    continue;
                }
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let ticket = match self.prelogin.admit(peer.ip()) {
                            Ok(ticket) => ticket,
                            Err(_) => {
                                // Closing at once tells the initiator to retry later.
                                self.events.source_full.record(|held_back| {
                                    tracing::info!(%peer, portal = %local, held_back, "connection refused: its address has the most connections logging in that one may");
                                });
                                continue;
                            }
                        };
                        // Both end with the closure, even one that never runs.
                        let guard = self.track_connection();
                        let server = self.clone();
                        let portal = on_portal.clone();
                        self.shards.spawn(stream, move |stream| async move {
                            connection::run(server, stream, peer, ticket, &portal).await;
                            drop(guard);
                        });
                    }
                    Err(e) => {
                        // Out of descriptors and similar: back off, keep serving.
                        tracing::warn!(portal = %local, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        tracing::info!(portal = %local, "iSCSI portal closed");
        Ok(())
    }

    /// Stop accepting, end every session (async logout request, then
    /// drop), and wait for in-flight commands. Peers get `logout_timeout`
    /// to log out, except ones that stopped reading, which cannot see the
    /// request: they are dropped once their queue shows no progress for
    /// [`STALLED_AT_SHUTDOWN`]. After that no wait depends on a peer,
    /// only on the devices finishing commands already running.
    pub async fn shutdown(&self) {
        let _ = self.shutdown.send(true);
        let sessions = self.registry.lock().all();
        for s in &sessions {
            let _ = s.control.send(Control::RequestLogout);
        }
        let mut count = self.connections.0.subscribe();
        let grace = self.options.logout_timeout;
        let all_gone = count.wait_for(|c| *c == 0);
        let logged_out = async {
            tokio::select! {
                _ = all_gone => {}
                _ = close_stalled(&sessions) => {}
            }
        };
        if tokio::time::timeout(grace, logged_out).await.is_err() {
            for s in self.registry.lock().all() {
                s.close(crate::session::CloseReason::Shutdown);
            }
            let _ = count.wait_for(|c| *c == 0).await;
        }
    }
}

/// How long a session's outgoing queue may sit unchanged, and not empty,
/// before shutdown stops waiting for its initiator to log out.
const STALLED_AT_SHUTDOWN: Duration = Duration::from_secs(1);

/// Closes each of `sessions` whose queue toward its initiator stays full
/// and unchanged for [`STALLED_AT_SHUTDOWN`]; a reading initiator drains
/// its queue within that time. Never returns.
async fn close_stalled(sessions: &[SessionHandle]) {
    let mut seen: Vec<usize> = sessions.iter().map(|s| s.outgoing.queued()).collect();
    loop {
        tokio::time::sleep(STALLED_AT_SHUTDOWN).await;
        for (s, before) in sessions.iter().zip(seen.iter_mut()) {
            let now = s.outgoing.queued();
            if now > 0 && now == *before && !s.outgoing.is_closed() {
                tracing::info!(
                    tsih = s.tsih,
                    "shutdown: dropping a session whose initiator stopped reading"
                );
                s.close(crate::session::CloseReason::Shutdown);
            }
            *before = now;
        }
    }
}
