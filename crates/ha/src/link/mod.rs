//! The replication link between the two nodes of a pair.
//!
//! Each node listens on its link address; the node whose name sorts
//! first also dials the other, so the two never race to connect twice.
//! A connection is used only after both nodes proved the shared secret
//! ([`handshake`]); until then it may send four small frames, it holds a
//! place in a per-source pre-login budget, and a wrong proof delays the
//! next attempts from that name and address ([`peer_limits::AuthThrottle`])
//! and is logged at most once per interval. A newly authenticated
//! connection replaces the one before it (the peer restarted). Heartbeats
//! keep an idle session alive; silence past the timeout ends it, and the
//! dialer reconnects with back-off.

pub mod handshake;
mod session;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use peer_limits::{auth_keys, AuthThrottle, EventLog, PreLoginBudget};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

pub use session::{lost, Endpoint, Incoming, Pending, Session, Timing, MAX_DATA, NO_SUCH_DEVICE};

/// Everything a node needs to run its end of the link.
#[derive(Clone)]
pub struct LinkSettings {
    pub node: String,
    pub peer: String,
    /// Where the peer listens (`host:port`).
    pub peer_address: String,
    pub listen: SocketAddr,
    pub secret: Vec<u8>,
    pub timing: Timing,
}

impl std::fmt::Debug for LinkSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkSettings")
            .field("node", &self.node)
            .field("peer", &self.peer)
            .field("peer_address", &self.peer_address)
            .field("listen", &self.listen)
            .field("timing", &self.timing)
            .finish_non_exhaustive()
    }
}

/// What the link says of itself.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LinkStatus {
    pub node: String,
    pub peer: String,
    pub connected: bool,
    pub rtt_us: Option<u64>,
    /// Sessions authenticated since start.
    pub sessions: u64,
    /// Connections that failed to prove the secret.
    pub auth_failures: u64,
}

const PRELOGIN_PER_SOURCE: usize = 4;
const PRELOGIN_TOTAL: usize = 64;
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

pub struct Link {
    settings: LinkSettings,
    local: SocketAddr,
    endpoints: Mutex<HashMap<String, Arc<dyn Endpoint>>>,
    current: Mutex<Option<Arc<Session>>>,
    throttle: AuthThrottle,
    prelogin: Arc<PreLoginBudget>,
    wrong_secret: EventLog,
    dial_failed: EventLog,
    sessions: AtomicU64,
    session_ended: Notify,
    stop: watch::Sender<bool>,
    me: Weak<Link>,
}

impl Link {
    /// Binds the listener and starts accepting (and, on the node whose
    /// name sorts first, dialing). Call within a Tokio runtime.
    pub async fn start(settings: LinkSettings) -> io::Result<Arc<Link>> {
        let listener = TcpListener::bind(settings.listen).await.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("link listen address {}: {e}", settings.listen),
            )
        })?;
        let local = listener.local_addr()?;
        let (stop, _) = watch::channel(false);
        let link = Arc::new_cyclic(|me| Link {
            settings,
            local,
            endpoints: Mutex::new(HashMap::new()),
            current: Mutex::new(None),
            throttle: AuthThrottle::default(),
            prelogin: PreLoginBudget::new(PRELOGIN_PER_SOURCE, PRELOGIN_TOTAL),
            wrong_secret: EventLog::new(Duration::from_secs(10)),
            dial_failed: EventLog::new(Duration::from_secs(30)),
            sessions: AtomicU64::new(0),
            session_ended: Notify::new(),
            stop,
            me: me.clone(),
        });
        tokio::spawn(link.clone().accept_loop(listener));
        if link.settings.node < link.settings.peer {
            tokio::spawn(link.clone().dial_loop());
        }
        Ok(link)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn settings(&self) -> &LinkSettings {
        &self.settings
    }

    /// Routes the peer's frames for `device` to `endpoint`, and tells it
    /// of the session if one is up.
    pub fn register(&self, device: &str, endpoint: Arc<dyn Endpoint>) {
        self.endpoints
            .lock()
            .insert(device.to_string(), endpoint.clone());
        if let Some(s) = self.session() {
            endpoint.connected(&s);
        }
    }

    /// Stops routing `device` to `endpoint`; a newer endpoint registered
    /// under the same name (the device reopened) keeps its place.
    pub fn unregister(&self, device: &str, endpoint: &Arc<dyn Endpoint>) {
        let mut endpoints = self.endpoints.lock();
        if endpoints
            .get(device)
            .is_some_and(|e| std::ptr::addr_eq(Arc::as_ptr(e), Arc::as_ptr(endpoint)))
        {
            endpoints.remove(device);
        }
    }

    /// The session in use, if the peer is connected.
    pub fn session(&self) -> Option<Arc<Session>> {
        self.current.lock().clone().filter(|s| !s.is_closed())
    }

    /// Ends the session in use; the dialer reconnects.
    pub fn drop_session(&self, why: &str) {
        if let Some(s) = self.session() {
            s.close(why);
        }
    }

    pub fn status(&self) -> LinkStatus {
        let s = self.session();
        LinkStatus {
            node: self.settings.node.clone(),
            peer: self.settings.peer.clone(),
            connected: s.is_some(),
            rtt_us: s.and_then(|s| s.rtt()).map(|d| d.as_micros() as u64),
            sessions: self.sessions.load(Ordering::Relaxed),
            auth_failures: self.throttle.failures(),
        }
    }

    /// Stops listening and dialing and ends the session.
    pub fn shutdown(&self) {
        let _ = self.stop.send(true);
        self.drop_session("this node stops its link");
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    fn install(&self, stream: TcpStream) {
        let Some(me) = self.me.upgrade() else { return };
        let id = self.sessions.fetch_add(1, Ordering::Relaxed) + 1;
        let route_link = self.me.clone();
        let route: session::Router =
            Arc::new(move |name: &str| route_link.upgrade()?.endpoints.lock().get(name).cloned());
        let session = session::start(
            id,
            self.settings.peer.clone(),
            stream,
            self.settings.timing.clone(),
            route,
            |session| {
                tracing::info!(peer = %self.settings.peer, session = id, "link to the peer is up");
                let old = self.current.lock().replace(session.clone());
                if let Some(old) = old {
                    old.close("a newer session with the peer replaced it");
                }
                let endpoints: Vec<_> = self.endpoints.lock().values().cloned().collect();
                for ep in endpoints {
                    ep.connected(session);
                }
            },
            move |s| me.ended(&s),
        );
        drop(session);
    }

    fn ended(&self, s: &Arc<Session>) {
        {
            let mut cur = self.current.lock();
            if cur.as_ref().is_some_and(|c| c.id == s.id) {
                *cur = None;
            }
        }
        let endpoints: Vec<_> = self.endpoints.lock().values().cloned().collect();
        for ep in endpoints {
            ep.disconnected(s.id);
        }
        self.session_ended.notify_waiters();
    }

    async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        let mut stop = self.stop.subscribe();
        loop {
            let accepted = tokio::select! {
                _ = stop.changed() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((stream, from)) => {
                    tokio::spawn(self.clone().admit(stream, from));
                }
                Err(e) => {
                    tracing::warn!("link listener: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// One incoming connection up to authentication.
    async fn admit(self: Arc<Self>, mut stream: TcpStream, from: SocketAddr) {
        let Ok(ticket) = self.prelogin.admit(from.ip()) else {
            tracing::debug!(%from, "link: too many unauthenticated connections from this source");
            return;
        };
        let deadline = Instant::now() + handshake::HANDSHAKE_TIMEOUT;
        let me = self.settings.node.clone();
        let outcome = tokio::select! {
            _ = ticket.evicted() => return,
            r = tokio::time::timeout_at(deadline.into(), self.authenticate(&mut stream, from, &me, deadline)) => r,
        };
        drop(ticket);
        match outcome {
            Ok(Ok(true)) => self.install(stream),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::debug!(%from, "link handshake failed: {e}"),
            Err(_) => tracing::debug!(%from, "link handshake timed out"),
        }
    }

    async fn authenticate(
        &self,
        stream: &mut TcpStream,
        from: SocketAddr,
        me: &str,
        deadline: Instant,
    ) -> io::Result<bool> {
        let claim = handshake::listen(stream, me).await?;
        let keys = auth_keys(&claim.name, from.ip());
        // Wait out the back-off earlier failures earned before checking.
        let Some(at) = self.throttle.reserve(&keys, deadline) else {
            return Ok(false);
        };
        tokio::time::sleep_until(at.into()).await;
        let secret = &self.settings.secret;
        if claim.check(stream, me, &self.settings.peer, secret).await? {
            self.throttle.succeeded(&keys);
            return Ok(true);
        }
        let (count, delay) = self.throttle.failed(&keys);
        self.wrong_secret.record(|held_back| {
            tracing::warn!(
                %from,
                claimed = %claim.name,
                "link: a connection failed to prove the shared secret ({count} in a row from it; \
                 next attempt waits {} ms; {held_back} such lines held back)",
                delay.as_millis()
            )
        });
        Ok(false)
    }

    async fn dial_loop(self: Arc<Self>) {
        let mut stop = self.stop.subscribe();
        let mut backoff = RECONNECT_FIRST;
        while !self.stopped() {
            if self.session().is_some() {
                let ended = self.session_ended.notified();
                tokio::pin!(ended);
                ended.as_mut().enable();
                if self.session().is_some() {
                    tokio::select! {
                        _ = stop.changed() => return,
                        _ = ended => {}
                    }
                }
                continue;
            }
            match tokio::time::timeout(handshake::HANDSHAKE_TIMEOUT, self.dial()).await {
                Ok(Ok(stream)) => {
                    backoff = RECONNECT_FIRST;
                    self.install(stream);
                    continue;
                }
                Ok(Err(e)) => self.dial_failed.record(|held| {
                    tracing::warn!(peer = %self.settings.peer, "link: connecting failed: {e} ({held} such lines held back)")
                }),
                Err(_) => self.dial_failed.record(|held| {
                    tracing::warn!(peer = %self.settings.peer, "link: connecting timed out ({held} such lines held back)")
                }),
            }
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(RECONNECT_MAX);
        }
    }

    async fn dial(&self) -> io::Result<TcpStream> {
        let mut stream = TcpStream::connect(&self.settings.peer_address).await?;
        let s = &self.settings;
        handshake::dial(&mut stream, &s.node, &s.peer, &s.secret).await?;
        Ok(stream)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
