//! The server: listeners, the admission of connections, and the state
//! they share.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use peer_limits::{EventLog, PreLoginBudget, SourceLimit};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use crate::exports::{Export, ExportCounters, ExportStats, ExportTable};
use crate::handshake::{self, HandshakeError, Negotiated, Offer, Step};
use crate::listeners::Bound;
use crate::placed::RecvInto;
use crate::placement::Placement;
use crate::sessions::{Session, Sessions};
use crate::socket::{fix_receive_buffer, keep_alive};
use crate::tls::Tls;
use crate::transmission::{self, Shared};
use export::ListenAddr;
use export::Peer;

/// Bounds that keep one client from hurting the others.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest read or write one request may carry (NBD_INFO_BLOCK_SIZE's
    /// maximum payload).
    pub max_payload: u32,
    /// Bytes one connection may have in flight: write data received and
    /// read data not yet sent.
    pub in_flight_bytes: usize,
    /// Device calls running at once on blocking threads, server-wide.
    pub device_threads: usize,
    /// How long one write to a client may make no progress.
    pub write_deadline: Duration,
    /// How long negotiation may take.
    pub handshake_timeout: Duration,
    /// Connections negotiating at once, per source address and in total.
    pub handshakes_per_source: usize,
    pub handshakes_total: usize,
    /// Connections one source address may have open, negotiating or
    /// transmitting (unix-socket clients are not counted).
    pub connections_per_source: usize,
    /// Connections open at once, negotiating or transmitting; with
    /// `in_flight_bytes` it bounds the server's memory.
    pub max_connections: usize,
    /// Probe a TCP client silent for the first, dropping it when the
    /// probes go unanswered for the second; `None`: never.
    pub keep_alive: Option<(Duration, Duration)>,
    /// On shutdown, how long connections may take to answer what they
    /// have in flight before they are cut.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_payload: 32 << 20,
            in_flight_bytes: 64 << 20,
            device_threads: 64,
            write_deadline: Duration::from_secs(20),
            handshake_timeout: Duration::from_secs(15),
            handshakes_per_source: 16,
            handshakes_total: 256,
            connections_per_source: 256,
            max_connections: 1024,
            keep_alive: Some((Duration::from_secs(15), Duration::from_secs(30))),
            shutdown_grace: Duration::from_secs(2),
        }
    }
}

/// Server-wide figures for status and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections in transmission now.
    pub open_connections: u64,
    /// Connections negotiating now.
    pub negotiating: u64,
    /// Connections ended for breaking the protocol, since start.
    pub protocol_errors: u64,
    /// Connections refused because their source had too many negotiating.
    pub refused_busy: u64,
    /// Connections refused at `max_connections`.
    pub refused_full: u64,
    /// Connections refused because their source held its most open.
    pub refused_source: u64,
    /// Connections dropped because the client stopped reading replies.
    pub stalled: u64,
    /// Negotiating connections evicted to make room for newer ones.
    pub evicted: u64,
    pub exports: Vec<ExportStats>,
}

const EVENT_LOG_INTERVAL: Duration = Duration::from_secs(10);

struct Inner {
    exports: ExportTable,
    shared: Arc<Shared>,
    prelogin: Arc<PreLoginBudget>,
    per_source: Arc<SourceLimit>,
    shutdown: watch::Sender<bool>,
    tls: parking_lot::RwLock<Option<Tls>>,
    sessions: Sessions,
    open: AtomicU64,
    protocol_errors: EventLog,
    source_full: EventLog,
    server_full: EventLog,
    source_holds_most: EventLog,
    stalled: EventLog,
    /// Clients refused an export they may not use (each answered as if it
    /// did not exist).
    pub(crate) export_refused: EventLog,
    connection_slots: Arc<Semaphore>,
    placement: Placement,
}

/// An NBD server: its exports, listeners and connections. Cheap to clone;
/// clones are the same server.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

/// The stream a negotiated connection transmits on.
enum Link<S> {
    Plain(S),
    Tls(Box<tokio_rustls::server::TlsStream<S>>),
}

/// Resolves once shutdown is asked for (or the server is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Where unix-socket clients are counted in the negotiation budget.
const UNIX_SOURCE: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

impl Server {
    pub fn new(exports: BTreeMap<String, Export>, limits: Limits) -> Server {
        let max_connections = limits.max_connections.max(1);
        let prelogin = PreLoginBudget::new(limits.handshakes_per_source, limits.handshakes_total);
        let per_source = SourceLimit::new(limits.connections_per_source);
        let shared = Arc::new(Shared {
            device_slots: Arc::new(Semaphore::new(limits.device_threads.max(1))),
            limits,
        });
        Server {
            inner: Arc::new(Inner {
                exports: ExportTable::new(exports),
                shared,
                prelogin,
                per_source,
                shutdown: watch::channel(false).0,
                tls: parking_lot::RwLock::new(None),
                sessions: Sessions::default(),
                open: AtomicU64::new(0),
                protocol_errors: EventLog::new(EVENT_LOG_INTERVAL),
                source_full: EventLog::new(EVENT_LOG_INTERVAL),
                server_full: EventLog::new(EVENT_LOG_INTERVAL),
                source_holds_most: EventLog::new(EVENT_LOG_INTERVAL),
                stalled: EventLog::new(EVENT_LOG_INTERVAL),
                export_refused: EventLog::new(EVENT_LOG_INTERVAL),
                connection_slots: Arc::new(Semaphore::new(max_connections)),
                placement: Placement::default(),
            }),
        }
    }

    /// Offers `exports` from now on. Sessions whose export is removed, or
    /// changes device, access list or mode, end once their requests in
    /// flight are answered; the others go on. Counters of a name carry
    /// over.
    pub fn replace_exports(&self, exports: BTreeMap<String, Export>) {
        let i = &self.inner;
        i.exports.replace(exports);
        // After the swap: a session registering meanwhile checks the new
        // table itself.
        let ended = i.sessions.end_changed(&i.exports.list());
        if ended > 0 {
            tracing::info!("nbd: ending {ended} sessions whose export was removed or changed");
        }
    }

    /// Ends the sessions whose export is gone or no longer the one they
    /// negotiated (device, access list, mode); returns how many.
    pub fn end_refused_sessions(&self) -> usize {
        let i = &self.inner;
        i.sessions.end_changed(&i.exports.list())
    }

    /// Serves connections accepted from now on on these runtimes (the
    /// least loaded for each) instead of the listener's; best with one
    /// worker thread each (`placement` says why).
    pub fn set_connection_runtimes(&self, handles: Vec<tokio::runtime::Handle>) {
        self.inner.placement.set(handles);
    }

    /// Ends the session `id` (as `session list` numbers it); false when
    /// there is none.
    pub fn end_session(&self, id: u64) -> bool {
        self.inner.sessions.end(id)
    }

    /// Connections in transmission now.
    pub fn sessions(&self) -> Vec<Session> {
        self.inner.sessions.list()
    }

    /// Offers TLS through NBD_OPT_STARTTLS (or stops offering it) to
    /// connections from now on; sessions already in TLS keep it.
    pub fn set_tls(&self, tls: Option<Tls>) {
        *self.inner.tls.write() = tls;
    }

    pub fn stats(&self) -> ServerStats {
        let i = &self.inner;
        ServerStats {
            open_connections: i.open.load(Ordering::Relaxed),
            negotiating: i.prelogin.waiting() as u64,
            protocol_errors: i.protocol_errors.total(),
            refused_busy: i.source_full.total(),
            refused_full: i.server_full.total(),
            refused_source: i.source_holds_most.total(),
            stalled: i.stalled.total(),
            evicted: i.prelogin.evicted(),
            exports: i.exports.stats(),
        }
    }

    /// Stops the listeners; each connection ends once its requests in
    /// flight are answered.
    pub fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
    }

    /// Binds `addr` and serves it on a task of the current runtime until
    /// [`Server::shutdown`]. A unix socket file left by a process that is
    /// gone is replaced; one that still answers is not.
    pub async fn listen(&self, addr: &ListenAddr) -> io::Result<JoinHandle<io::Result<()>>> {
        self.serve_bound(crate::listeners::bind(addr)?)
    }

    /// Serves an already bound socket on a task of the current runtime
    /// until [`Server::shutdown`] (or the task is aborted).
    pub fn serve_bound(&self, bound: Bound) -> io::Result<JoinHandle<io::Result<()>>> {
        let server = self.clone();
        Ok(match bound {
            Bound::Tcp(l) => {
                let l = TcpListener::from_std(l)?;
                tokio::spawn(async move { server.serve_tcp(l).await })
            }
            Bound::Unix(l) => {
                let l = UnixListener::from_std(l)?;
                tokio::spawn(async move { server.serve_unix(l).await })
            }
        })
    }

    /// Accepts clients on `listener` until [`Server::shutdown`].
    pub async fn serve_tcp(&self, listener: TcpListener) -> io::Result<()> {
        let mut stop = self.inner.shutdown.subscribe();
        loop {
            let (stream, addr) = tokio::select! {
                _ = stopped(&mut stop) => return Ok(()),
                r = listener.accept() => match r {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!("nbd: accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = stream.set_nodelay(true);
            if let Err(e) = fix_receive_buffer(stream.as_raw_fd()) {
                tracing::debug!("nbd: sizing a connection's receive buffer: {e}");
            }
            if let Some((idle, timeout)) = self.inner.shared.limits.keep_alive {
                if let Err(e) = keep_alive(stream.as_raw_fd(), idle, timeout) {
                    tracing::debug!("nbd: setting a connection's keep-alive: {e}");
                }
            }
            let server = self.clone();
            self.inner
                .placement
                .spawn(stream, move |stream: TcpStream| async move {
                    let peer = Peer::Ip(addr.ip());
                    server
                        .connection(stream, peer, addr.ip(), |s| s.into_split())
                        .await;
                });
        }
    }

    /// Accepts clients on a unix socket until [`Server::shutdown`].
    pub async fn serve_unix(&self, listener: UnixListener) -> io::Result<()> {
        let mut stop = self.inner.shutdown.subscribe();
        loop {
            let stream = tokio::select! {
                _ = stopped(&mut stop) => {
                    // Nothing answers there any more: no file left behind.
                    let path = listener.local_addr().ok().and_then(|a| a.as_pathname().map(|p| p.to_path_buf()));
                    if let Some(path) = path {
                        let _ = std::fs::remove_file(path);
                    }
                    return Ok(());
                }
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!("nbd: accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let server = self.clone();
            self.inner
                .placement
                .spawn(stream, move |stream: UnixStream| async move {
                    server
                        .connection(stream, Peer::Unix, UNIX_SOURCE, |s| s.into_split())
                        .await;
                });
        }
    }

    /// Negotiation from the greeting, through TLS when the client starts
    /// it: the export and the stream to transmit on, or `None` when the
    /// client left.
    async fn handshake<S>(
        stream: S,
        peer: Peer,
        offer: &Offer<'_>,
        tls: Option<Tls>,
    ) -> Result<Option<(Negotiated, Link<S>)>, HandshakeError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut stream = stream;
        let zeroes = handshake::greet(&mut stream).await?;
        match handshake::negotiate(&mut stream, peer, offer, zeroes, false).await? {
            Step::Transmit(n) => Ok(Some((n, Link::Plain(stream)))),
            Step::Leave => Ok(None),
            Step::StartTls => {
                let Some(tls) = tls else {
                    return Ok(None); // not offered, so never accepted
                };
                let mut secure = tls
                    .acceptor
                    .accept(stream)
                    .await
                    .map_err(HandshakeError::Tls)?;
                match handshake::negotiate(&mut secure, peer, offer, zeroes, true).await? {
                    Step::Transmit(n) => Ok(Some((n, Link::Tls(Box::new(secure))))),
                    Step::Leave | Step::StartTls => Ok(None),
                }
            }
        }
    }

    /// One client from accept to close.
    async fn connection<S, R, W>(
        &self,
        stream: S,
        peer: Peer,
        source: IpAddr,
        split: impl FnOnce(S) -> (R, W),
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        R: AsyncRead + RecvInto + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let i = &self.inner;
        let _source_slot = match peer {
            Peer::Unix => None,
            Peer::Ip(_) => match i.per_source.admit(source) {
                Ok(t) => Some(t),
                Err(_) => {
                    i.source_holds_most.record(|held| {
                        tracing::warn!(%peer, held_back = held, "nbd: refused a connection: its source address holds its most open connections");
                    });
                    return;
                }
            },
        };
        let Ok(_slot) = i.connection_slots.clone().try_acquire_owned() else {
            i.server_full.record(|held| {
                tracing::warn!(%peer, held_back = held, "nbd: refused a connection: the server has its maximum open");
            });
            return;
        };
        let Ok(ticket) = i.prelogin.admit(source) else {
            i.source_full.record(|held| {
                tracing::warn!(%peer, held_back = held, "nbd: refused a connection: too many negotiating from this source");
            });
            return;
        };
        let mut stop = i.shutdown.subscribe();
        if *stop.borrow() {
            return;
        }
        let tls = i.tls.read().clone();
        let offer = Offer {
            exports: &i.exports,
            max_payload: i.shared.limits.max_payload,
            tls: tls.as_ref().map(|t| t.mode),
            refused: &i.export_refused,
        };
        let timeout = i.shared.limits.handshake_timeout;
        let negotiated = tokio::select! {
            r = tokio::time::timeout(timeout, Self::handshake(stream, peer, &offer, tls)) => match r {
                Ok(Ok(Some(n))) => n,
                Ok(Ok(None)) => return,
                Ok(Err(HandshakeError::Io(e))) => {
                    tracing::debug!(%peer, "nbd: connection closed in negotiation: {e}");
                    return;
                }
                Ok(Err(e)) => {
                    self.protocol_error(peer, "negotiation", &e.to_string());
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "nbd: negotiation took longer than {timeout:?}");
                    return;
                }
            },
            _ = ticket.evicted() => {
                tracing::debug!(%peer, "nbd: negotiating connection evicted for a newer one");
                return;
            }
            _ = stopped(&mut stop) => return,
        };
        drop(ticket);
        let (negotiated, link) = negotiated;
        let counters = negotiated.served.counters.clone();
        let export = negotiated.served.name.clone();
        ExportCounters::add(&counters.connections, 1);
        ExportCounters::add(&counters.open_connections, 1);
        i.open.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%peer, %export, "nbd: client in transmission");
        let session = Session {
            id: 0,
            peer: peer.to_string(),
            export: export.clone(),
            tls: matches!(link, Link::Tls(_)),
            structured_replies: negotiated.agreed.structured,
            extended_headers: negotiated.agreed.extended,
            since: std::time::SystemTime::now(),
        };
        let registered = i
            .sessions
            .register(session, negotiated.served.export.clone());
        // The export may have been replaced since negotiation found it.
        i.sessions.end_changed(&i.exports.list());
        let end = registered.end.clone();
        let mut stop_cut = stop.clone();
        let transmitted = async {
            match link {
                Link::Plain(stream) => {
                    let (r, w) = split(stream);
                    transmission::transmit(r, w, negotiated, i.shared.clone(), true, stop, end)
                        .await
                }
                Link::Tls(secure) => {
                    let (r, w) = tokio::io::split(*secure);
                    transmission::transmit(r, w, negotiated, i.shared.clone(), false, stop, end)
                        .await
                }
            }
        };
        // A client that reads nothing cannot take its last replies: after
        // the grace it is cut, so shutdown does not wait on it.
        let grace = i.shared.limits.shutdown_grace;
        let ended = tokio::select! {
            ended = transmitted => ended,
            _ = async { stopped(&mut stop_cut).await; tokio::time::sleep(grace).await } => {
                Err(transmission::gone(format!("cut {} ms into shutdown", grace.as_millis())))
            }
        };
        drop(registered);
        i.open.fetch_sub(1, Ordering::Relaxed);
        counters.open_connections.fetch_sub(1, Ordering::Relaxed);
        if let Err(e) = ended {
            self.log_end(peer, &export, &e);
        }
    }

    fn log_end(&self, peer: Peer, export: &str, e: &transmission::Ended) {
        if e.protocol {
            self.protocol_error(peer, export, &e.reason);
        } else if e.stalled {
            self.inner.stalled.record(|held| {
                tracing::warn!(%peer, %export, held_back = held, "nbd: dropped a client that stopped reading replies: {}", e.reason);
            });
        } else {
            tracing::debug!(%peer, %export, "nbd: connection ended: {}", e.reason);
        }
    }

    fn protocol_error(&self, peer: Peer, context: &str, reason: &str) {
        self.inner.protocol_errors.record(|held| {
            tracing::warn!(%peer, held_back = held, "nbd: closed a connection that broke the protocol ({context}): {reason}");
        });
    }
}
