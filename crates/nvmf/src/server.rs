//! The target: TCP listeners (the set can change live), the admission
//! of connections under `peer-limits` budgets, and the subsystem table
//! they serve.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use export::{Backing, Exports};
use parking_lot::Mutex;
use peer_limits::{EventLog, PreLoginBudget, SourceLimit};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::config::Config;
use crate::connection;
use crate::discovery::Discovery;
use crate::limits::Limits;
use crate::queue::End;
use crate::registry::Registry;
use crate::subsystem;

/// A change of listeners and subsystems, its new addresses bound.
pub struct Prepared {
    server: Server,
    config: Config,
    bound: Vec<(SocketAddr, std::net::TcpListener)>,
}

impl Prepared {
    /// Starts the new listeners, stops the dropped ones (connections
    /// accepted through them go on) and serves the new subsystems. Needs
    /// the context of the runtime the server runs on.
    pub fn commit(self) -> io::Result<()> {
        let inner = &self.server.inner;
        let io = self.config.listen_addrs();
        let disc = self.config.discovery_addrs();
        // Each address wanted, and whether it serves discovery only.
        let wanted: Vec<(SocketAddr, bool)> = io
            .iter()
            .map(|a| (*a, false))
            .chain(disc.iter().map(|a| (*a, true)))
            .collect();
        let mut started = Vec::new();
        for (a, l) in self.bound {
            let listener = TcpListener::from_std(l)?;
            started.push((a, listener.local_addr()?, listener));
        }
        {
            let mut listeners = inner.listeners.lock();
            listeners.retain(|a, l| match wanted.iter().find(|(w, _)| w == a) {
                Some((_, only)) => {
                    l.discovery_only.store(*only, Ordering::Relaxed);
                    true
                }
                None => {
                    l.stop.send_replace(true);
                    tracing::info!("nvmf: no longer listening on {}", l.local);
                    false
                }
            });
            for (a, local, listener) in started {
                let stop = watch::channel(false).0;
                let only = disc.contains(&a);
                let discovery_only = Arc::new(AtomicBool::new(only));
                tokio::spawn(self.server.clone().accept(
                    listener,
                    stop.subscribe(),
                    discovery_only.clone(),
                ));
                let what = if only {
                    "discovery"
                } else {
                    "I/O and discovery"
                };
                tracing::info!("nvmf: listening on {local} ({what})");
                let l = Listener {
                    local,
                    stop,
                    discovery_only,
                };
                listeners.insert(a, l);
            }
            // What the discovery log lists: the I/O listeners, in order.
            *inner.io_listeners.lock() = io
                .iter()
                .filter_map(|a| listeners.get(a).map(|l| l.local))
                .collect();
        }
        *inner.config.lock() = self.config;
        self.server.resolve();
        Ok(())
    }
}

/// A listening socket as the other transports make one: the address
/// reusable at once after a restart.
fn bind(a: SocketAddr) -> io::Result<std::net::TcpListener> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(a),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    s.set_reuse_address(true)?;
    if a.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.bind(&a.into())?;
    s.listen(1024)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// What every connection of the server shares.
pub(crate) struct Context {
    pub registry: Registry,
    pub limits: Limits,
    pub device_slots: Arc<Semaphore>,
    pub discovery: Discovery,
}

struct Listener {
    local: SocketAddr,
    stop: watch::Sender<bool>,
    /// Only the discovery controller answers on it.
    discovery_only: Arc<AtomicBool>,
}

struct Inner {
    cx: Arc<Context>,
    config: Mutex<Config>,
    devices: Mutex<BTreeMap<String, Arc<Backing>>>,
    listeners: Mutex<BTreeMap<SocketAddr, Listener>>,
    /// The bound addresses of the I/O listeners, in configured order.
    io_listeners: Mutex<Vec<SocketAddr>>,
    shutdown: watch::Sender<bool>,
    connecting: Arc<PreLoginBudget>,
    per_source: Arc<SourceLimit>,
    connections: Arc<Semaphore>,
    protocol_errors: EventLog,
    /// Refusals by reason, each logged at most once an interval.
    refused_source: EventLog,
    refused_full: EventLog,
    refused_connecting: EventLog,
    stalled: EventLog,
}

/// What the listeners did with their peers since start, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenerStats {
    /// Refused: the source address held its most open connections.
    pub refused_source: u64,
    /// Refused: the target held its most connections.
    pub refused_full: u64,
    /// Refused: too many from the source not yet connected.
    pub refused_connecting: u64,
    /// Not yet connected, closed to make room for newer ones.
    pub evicted: u64,
    /// Accepted and not yet connected, now.
    pub connecting: u64,
    /// Dropped because the host stopped reading.
    pub stalled: u64,
    /// Ended for breaking the protocol.
    pub protocol_errors: u64,
}

/// An NVMe/TCP target. Cheap to clone; clones are the same server.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

const EVENT_LOG_INTERVAL: Duration = Duration::from_secs(10);

impl Server {
    /// A server with no listeners and no subsystems.
    pub fn new(limits: Limits) -> Server {
        let cx = Arc::new(Context {
            registry: Registry::default(),
            device_slots: Arc::new(Semaphore::new(limits.device_threads.max(1))),
            limits: limits.clone(),
            discovery: Discovery::default(),
        });
        Server {
            inner: Arc::new(Inner {
                cx,
                config: Mutex::new(Config::default()),
                devices: Mutex::new(BTreeMap::new()),
                listeners: Mutex::new(BTreeMap::new()),
                io_listeners: Mutex::new(Vec::new()),
                shutdown: watch::channel(false).0,
                connecting: PreLoginBudget::new(
                    limits.connecting_per_source,
                    limits.connecting_total,
                ),
                per_source: SourceLimit::new(limits.connections_per_source),
                connections: Arc::new(Semaphore::new(limits.max_connections.max(1))),
                protocol_errors: EventLog::new(EVENT_LOG_INTERVAL),
                refused_source: EventLog::new(EVENT_LOG_INTERVAL),
                refused_full: EventLog::new(EVENT_LOG_INTERVAL),
                refused_connecting: EventLog::new(EVENT_LOG_INTERVAL),
                stalled: EventLog::new(EVENT_LOG_INTERVAL),
            }),
        }
    }

    /// A server serving `config` (validated) over the devices of
    /// `exports`, listening where it says; on the current runtime.
    pub async fn start(config: &Config, exports: &Exports, limits: Limits) -> io::Result<Server> {
        let server = Server::new(limits);
        *server.inner.devices.lock() = exports.devices.clone();
        server.reconfigure(config).await?;
        Ok(server)
    }

    /// Serves `config` from now on: listeners added and removed, the
    /// subsystem table replaced (controllers of subsystems that stay see
    /// their namespace changes; those of removed ones end). Nothing
    /// changes when a new address cannot be bound.
    pub async fn reconfigure(&self, config: &Config) -> io::Result<()> {
        self.prepare(config)?.commit()
    }

    /// Binds the addresses `config` adds, without serving them or
    /// changing anything else until [`Prepared::commit`]: a change whose
    /// address is taken is refused whole.
    pub fn prepare(&self, config: &Config) -> io::Result<Prepared> {
        let listening: Vec<SocketAddr> = self.inner.listeners.lock().keys().copied().collect();
        let mut bound = Vec::new();
        for a in config
            .listen_addrs()
            .into_iter()
            .chain(config.discovery_addrs())
        {
            if !listening.contains(&a) {
                let l = bind(a)
                    .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {a}: {e}")))?;
                bound.push((a, l));
            }
        }
        Ok(Prepared {
            server: self.clone(),
            config: config.clone(),
            bound,
        })
    }

    /// Where the server listens (bound addresses: port 0 resolved).
    pub async fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listening()
    }

    /// Where the server listens now (bound addresses).
    pub fn listening(&self) -> Vec<SocketAddr> {
        self.inner
            .listeners
            .lock()
            .values()
            .map(|l| l.local)
            .collect()
    }

    /// The configuration served now.
    pub fn config(&self) -> Config {
        self.inner.config.lock().clone()
    }

    fn resolve(&self) {
        let table = subsystem::resolve(&self.inner.config.lock(), &self.inner.devices.lock());
        self.inner.cx.registry.replace(table);
        self.publish();
    }

    /// Publishes the discovery log; hosts of discovery controllers that
    /// asked are told when it changed.
    fn publish(&self) {
        let cx = &self.inner.cx;
        let listeners = self.inner.io_listeners.lock().clone();
        if cx.discovery.update(&listeners, &cx.registry.table()) {
            cx.registry.discovery_changed();
        }
    }

    /// The discovery log's generation counter.
    pub fn discovery_generation(&self) -> u64 {
        self.inner.cx.discovery.genctr()
    }

    /// Serves the devices of `exports` from now on.
    pub fn replace_devices(&self, exports: &Exports) {
        *self.inner.devices.lock() = exports.devices.clone();
        self.resolve();
    }

    /// Stops listening and ends every connection.
    pub fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
        for c in self.inner.cx.registry.controllers() {
            self.inner.cx.registry.remove(c.cntlid);
        }
    }

    pub(crate) fn context(&self) -> &Context {
        &self.inner.cx
    }

    async fn accept(
        self,
        listener: TcpListener,
        mut stop: watch::Receiver<bool>,
        discovery_only: Arc<AtomicBool>,
    ) {
        let mut shutdown = self.inner.shutdown.subscribe();
        loop {
            let (stream, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!("nvmf: accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = crate::connection::until(&mut stop) => return,
                _ = crate::connection::until(&mut shutdown) => return,
            };
            let _ = stream.set_nodelay(true);
            let server = self.clone();
            let only = discovery_only.load(Ordering::Relaxed);
            tokio::spawn(async move { server.connection(stream, peer, only).await });
        }
    }

    async fn connection(
        &self,
        stream: tokio::net::TcpStream,
        peer: SocketAddr,
        discovery_only: bool,
    ) {
        let i = &self.inner;
        let refuse = |events: &EventLog, why: &str| {
            events.record(
                |held| tracing::warn!(%peer, held_back = held, "nvmf: refused a connection: {why}"),
            );
        };
        let Ok(_source) = i.per_source.admit(peer.ip()) else {
            return refuse(
                &i.refused_source,
                "its source address holds its most open connections",
            );
        };
        let Ok(_slot) = i.connections.clone().try_acquire_owned() else {
            return refuse(&i.refused_full, "the target has its most connections open");
        };
        let Ok(ticket) = i.connecting.admit(peer.ip()) else {
            return refuse(
                &i.refused_connecting,
                "too many connecting from this source",
            );
        };
        let stop = i.shutdown.subscribe();
        let r = connection::serve(stream, peer, discovery_only, i.cx.clone(), ticket, stop).await;
        match r {
            Ok(()) => {}
            Err(End::Fatal(f, _)) => i.protocol_errors.record(|held| {
                tracing::warn!(%peer, held_back = held, "nvmf: closed a connection that broke the protocol: {f}");
            }),
            Err(End::Stalled(why)) => i.stalled.record(|held| {
                tracing::warn!(%peer, held_back = held, "nvmf: dropped a host: {why}");
            }),
            Err(End::Closed(why)) => tracing::debug!(%peer, "nvmf: connection ended: {why}"),
        }
    }

    /// Connections dropped because their host stopped reading, since start.
    pub fn stalled(&self) -> u64 {
        self.inner.stalled.total()
    }

    /// The listeners' counts of refused, evicted and dropped peers.
    pub fn listener_stats(&self) -> ListenerStats {
        let i = &self.inner;
        ListenerStats {
            refused_source: i.refused_source.total(),
            refused_full: i.refused_full.total(),
            refused_connecting: i.refused_connecting.total(),
            evicted: i.connecting.evicted(),
            connecting: i.connecting.waiting() as u64,
            stalled: i.stalled.total(),
            protocol_errors: i.protocol_errors.total(),
        }
    }

    /// Connections ended for breaking the protocol, since start.
    pub fn protocol_errors(&self) -> u64 {
        self.inner.protocol_errors.total()
    }
}
