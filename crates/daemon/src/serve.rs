//! `openarray serve`: build the configured objects, listen, and on SIGTERM
//! or SIGINT end every session and flush every logical unit before exiting.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};

use crate::admin;
use crate::admin::portals;
use crate::nbd_serve::{NbdFrontend, NbdListen};

/// Where the administration API listens.
pub enum AdminSocket {
    /// `--admin-socket none`.
    Off,
    /// Not given: the default path. A daemon already serving there stops
    /// this one from starting; a path it may not create (not root) only
    /// leaves the API off, with a warning.
    Default(PathBuf),
    /// `--admin-socket PATH`: serving there is required.
    Given(PathBuf),
}

impl AdminSocket {
    pub fn from_arg(arg: Option<PathBuf>) -> AdminSocket {
        match arg {
            Some(p) if p.as_os_str() == "none" => AdminSocket::Off,
            Some(p) => AdminSocket::Given(p),
            None => AdminSocket::Default(PathBuf::from(crate::admin::DEFAULT_SOCKET)),
        }
    }

    fn path(&self) -> Option<&Path> {
        match self {
            AdminSocket::Off => None,
            AdminSocket::Default(p) | AdminSocket::Given(p) => Some(p),
        }
    }

    fn bind(&self) -> anyhow::Result<Option<(tokio::net::UnixListener, admin::SocketFile)>> {
        let Some(path) = self.path() else {
            return Ok(None);
        };
        match admin::bind(path) {
            Ok(bound) => Ok(Some(bound)),
            Err(e) if matches!(self, AdminSocket::Default(_)) && !admin::held_by_a_daemon(&e) => {
                tracing::warn!(socket = %path.display(), error = %format!("{e:#}"),
                    "administration API not started (give --admin-socket PATH, or none)");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// Ends the sessions of every transport at once, so that their peers'
/// graces overlap instead of adding up. A second signal while sessions
/// drain means "stop now".
async fn end_sessions(
    iscsi: &iscsi::Server,
    nbd: NbdFrontend,
    others: Vec<crate::transports::Shutdown>,
    sigterm: &mut tokio::signal::unix::Signal,
    sigint: &mut tokio::signal::unix::Signal,
) {
    let others: Vec<_> = others.into_iter().map(|s| tokio::spawn(s())).collect();
    let sessions_ended = async {
        let others = async {
            for task in others {
                let _ = task.await;
            }
        };
        tokio::join!(iscsi.shutdown(), nbd.shutdown(ACCEPT_LOOP_GRACE), others);
    };
    tokio::select! {
        _ = sessions_ended => {}
        _ = sigterm.recv() => tracing::warn!("second SIGTERM: not waiting for sessions to end"),
        _ = sigint.recv() => tracing::warn!("second SIGINT: not waiting for sessions to end"),
    }
}

/// A TCP listener on `addr` when one is given, for `what`.
fn bind_optional(
    addr: Option<SocketAddr>,
    what: &str,
) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    addr.map(|addr| {
        portals::bind(addr).with_context(|| format!("cannot listen for {what} on {addr}"))
    })
    .transpose()
}

/// The daemon as its API and scheduler see it: the running configuration
/// and every transport's frontend and listeners.
fn admin_of(
    current: admin::Current,
    server: &Arc<iscsi::Server>,
    nbd: &NbdFrontend,
    transports: &[crate::transports::Running],
    stats: Arc<stats::Registry>,
    portals: portals::Portals,
) -> Arc<admin::Admin> {
    let ha_running = crate::ha_pair::section(&current.config).cloned();
    let admin = Arc::new(admin::Admin {
        current: Mutex::new(current),
        server: server.clone(),
        frontends: [
            server.clone() as Arc<dyn export::Frontend>,
            Arc::new(nbd.server.clone()),
        ]
        .into_iter()
        .chain(transports.iter().map(|t| t.frontend.clone()))
        .collect(),
        listeners: [nbd.live()]
            .into_iter()
            .chain(transports.iter().map(|t| t.listeners.clone()))
            .chain([Arc::new(crate::ha_pair::HaLive {
                running: ha_running,
            }) as Arc<dyn crate::LiveListeners>])
            .collect(),
        stats,
        portals: Mutex::new(portals),
        jobs: Arc::default(),
        schedules: Arc::default(),
    });
    admin
        .stats
        .add_source(Arc::new(crate::device_metrics::DeviceSamples(
            Arc::downgrade(&admin),
        )));
    admin
}

/// Flushes every logical unit and closes the devices: the last step of
/// shutdown, once no session or change can reach them.
async fn flush_and_close(admin: Arc<admin::Admin>) -> anyhow::Result<()> {
    let flushed = tokio::task::spawn_blocking(move || {
        let current = admin.current.lock().unwrap_or_else(|p| p.into_inner());
        let flushed = current.runtime.flush_all();
        // Devices with metadata of their own (a cache) mark it clean.
        let closed = current.runtime.close_all();
        flushed.and(closed)
    })
    .await
    .context("flush task failed")?;
    flushed.context("flushing the logical units or closing the devices failed")?;
    tracing::info!("all logical units flushed; exiting");
    Ok(())
}

/// How long shutdown waits for the accept loops to return.
const ACCEPT_LOOP_GRACE: Duration = Duration::from_secs(10);

/// The configuration `serve` uses without `--config`, when it exists.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/openarray/openarray.toml";

/// Names another default configuration path (tests, staged installs).
pub const CONFIG_ENV: &str = "OPENARRAY_CONFIG";

/// [`DEFAULT_CONFIG_PATH`], or the file [`CONFIG_ENV`] names.
pub fn default_config_path() -> PathBuf {
    std::env::var_os(CONFIG_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH), PathBuf::from)
}

pub fn run(
    config_path: Option<&Path>,
    listen: &[SocketAddr],
    nbd_listen: &[nbd::ListenAddr],
    nvmf_listen: &[SocketAddr],
    admin_socket: &AdminSocket,
    metrics_listen: Option<SocketAddr>,
) -> anyhow::Result<()> {
    peer_limits::keep_freed_memory();
    let default_path = default_config_path();
    let config_path =
        config_path.or_else(|| default_path.exists().then_some(default_path.as_path()));
    let (mut config, text) = match config_path {
        Some(path) => {
            let config = control::load_config(path)?;
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            tracing::info!(config = %path.display(), "serving the configuration file");
            (config, text)
        }
        None => {
            tracing::info!(
                "no --config given and no {}: serving the built-in default configuration",
                default_path.display()
            );
            (control::default_config(), control::default_config_text())
        }
    };
    if !listen.is_empty() {
        config.override_listen(listen);
    }
    if !nbd_listen.is_empty() {
        config.override_nbd_listen(nbd_listen);
    }
    if !nvmf_listen.is_empty() {
        crate::nvmf_transport::override_listen(&mut config, nvmf_listen);
    }
    // Checked before anything is opened: a bad token file is a config error.
    let api_token = control::load_api_token(&config)?;
    let read_only_token = control::load_read_only_token(&config)?;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the I/O runtime")?;
    // Mirror devices replicate over the link: it runs before they open.
    let ha_link = tokio
        .block_on(crate::ha_pair::start_link(&config))
        .context("[ha]")?;
    let runtime = control::build(&config)?;
    let options = crate::iscsi_options(&config, runtime.stats.auth_failures_counter());
    let moved = crate::iscsi_section::deprecated_keys(&config);
    if !moved.is_empty() {
        tracing::warn!(
            keys = %moved.join(", "),
            "these [daemon] keys are iSCSI's: read for now, but they belong in [iscsi]"
        );
    }
    let connection_runtimes = connection_runtimes()?;
    let current = admin::Current {
        config,
        text,
        path: config_path.map(Path::to_path_buf),
        runtime,
        listen_override: listen.to_vec(),
        nbd_listen_override: nbd_listen.to_vec(),
        nvmf_listen_override: nvmf_listen.to_vec(),
    };
    let api = match (current.config.daemon.api_listen, api_token) {
        (Some(addr), Some(token)) => Some((
            addr,
            api_guard(&current, &options, &token, read_only_token.as_deref()),
        )),
        _ => None,
    };
    let handles = connection_runtimes
        .iter()
        .map(|r| r.handle.clone())
        .collect();
    let served = tokio.block_on(serve(
        current,
        options,
        admin_socket,
        metrics_listen,
        api,
        handles,
    ));
    // Every session has ended by now.
    for runtime in connection_runtimes {
        let _ = runtime.stop.send(());
        let _ = runtime.thread.join();
    }
    // After the mirrors flushed to both nodes.
    if let Some(link) = ha_link {
        link.shutdown();
    }
    served
}

/// One single-threaded runtime per core for the iSCSI and NBD connections
/// (why: the iscsi crate's `shards` module), each driven by a thread of its
/// own. A current-thread runtime, not a multi-threaded one of one worker:
/// that one also times each batch of tasks it runs (two clock reads per
/// wake-up) and looks for work to steal, per request of a connection
/// waiting for its client.
struct ConnectionRuntime {
    handle: tokio::runtime::Handle,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

fn connection_runtimes() -> anyhow::Result<Vec<ConnectionRuntime>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..cores)
        .map(|i| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start a connection runtime")?;
            let handle = runtime.handle().clone();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(format!("oa-conn-{i}"))
                .spawn(move || {
                    runtime.block_on(async {
                        let _ = stopped.await;
                    });
                    // What is left (a task still closing its socket) is
                    // cut short.
                    runtime.shutdown_timeout(Duration::from_secs(1));
                })
                .context("cannot start a connection runtime's thread")?;
            Ok(ConnectionRuntime {
                handle,
                stop,
                thread,
            })
        })
        .collect()
}

/// The TCP API's token, with the CHAP back-off settings for wrong ones
/// and the pre-login budget for its connections.
fn api_guard(
    current: &admin::Current,
    options: &iscsi::ServerOptions,
    token: &str,
    read_only: Option<&str>,
) -> admin::ApiGuard {
    let daemon = &current.config.daemon;
    let delays = (
        daemon
            .auth_fail_delay
            .unwrap_or(iscsi::AuthThrottle::DEFAULT_DELAY),
        daemon
            .auth_fail_delay_max
            .unwrap_or(iscsi::AuthThrottle::DEFAULT_DELAY_MAX),
    );
    let budget = (options.max_logins_per_source, options.max_logins);
    let token = admin::Token::new(token).with_read_only(read_only);
    admin::ApiGuard::new(token, delays, budget)
}

/// The `[daemon]` deadlines of administration API requests, where given.
fn api_deadlines(daemon: &control::Daemon) -> admin::Deadlines {
    let defaults = admin::Deadlines::default();
    admin::Deadlines {
        head: daemon.api_header_timeout.unwrap_or(defaults.head),
        body: daemon.api_body_timeout.unwrap_or(defaults.body),
    }
}

async fn serve(
    mut current: admin::Current,
    options: iscsi::ServerOptions,
    admin_socket: &AdminSocket,
    metrics_listen: Option<SocketAddr>,
    api: Option<(SocketAddr, admin::ApiGuard)>,
    connection_runtimes: Vec<tokio::runtime::Handle>,
) -> anyhow::Result<()> {
    // Handlers first, so a signal arriving while we start is not lost.
    let mut sigterm = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;

    let runtime = &mut current.runtime;
    let mut listeners = Vec::with_capacity(runtime.listen.len());
    for &addr in &runtime.listen {
        listeners.push((
            addr,
            portals::bind(addr).with_context(|| format!("cannot listen on {addr}"))?,
        ));
    }

    for t in &runtime.exports.scsi_targets {
        tracing::info!(target_name = %t.name, portals = ?t.portals, "target ready");
    }
    let server = iscsi::Server::with_connection_runtimes(
        options.clone(),
        Vec::new(),
        connection_runtimes.clone(),
    );
    // The targets with their access rules and CHAP, before any listener.
    export::Frontend::replace_exports(&*server, &runtime.exports);
    runtime
        .stats
        .add_source(Arc::new(crate::listener_metrics::ListenerSamples(
            server.clone(),
        )));
    let mut nbd = NbdFrontend::new(&current.config, &runtime.exports, &options)?;
    nbd.server.set_connection_runtimes(connection_runtimes);
    // The built-in default's NBD address may be held by another daemon;
    // an address of a file or of --nbd-listen must be served.
    let nbd_listen = NbdListen {
        addrs: current
            .config
            .nbd
            .as_ref()
            .map_or_else(Vec::new, |n| n.listen.clone()),
        required: current.path.is_some() || !current.nbd_listen_override.is_empty(),
    };
    nbd.listen(&nbd_listen).await?;
    runtime
        .stats
        .add_source(crate::nbd_serve::samples(&nbd.server));
    let transports = crate::transports::start_all(&current)?;
    let stats = current.runtime.stats.clone();
    for t in &transports {
        if let Some(samples) = &t.samples {
            stats.add_source(samples.clone());
        }
    }
    let admin_listener = admin_socket.bind()?;
    let api_listener = bind_optional(api.as_ref().map(|(addr, _)| *addr), "the API")?;
    let metrics_listener = bind_optional(metrics_listen, "metrics")?;
    let deadlines = api_deadlines(&current.config.daemon);
    let metrics_task = metrics_listener.map(|listener| {
        if let Some(addr) = metrics_listen {
            tracing::info!(%addr, "Prometheus metrics listening");
        }
        tokio::spawn(admin::serve_metrics(stats.clone(), listener, deadlines))
    });
    let mut portals = portals::Portals::new(server.clone());
    for (addr, listener) in listeners {
        tracing::info!(%addr, "listening");
        portals.start(addr, listener);
    }
    let admin = admin_of(current, &server, &nbd, &transports, stats, portals);
    tokio::spawn(admin.schedules.clone().run(admin.clone()));
    let (admin_listener, socket_file) = admin_listener.unzip();
    let admin_task = admin_listener.map(|listener| {
        if let Some(path) = admin_socket.path() {
            tracing::info!(socket = %path.display(), "administration API listening");
        }
        tokio::spawn(admin::serve_unix(admin.clone(), listener, deadlines))
    });
    let api_task = api.zip(api_listener).map(|((addr, guard), listener)| {
        tracing::info!(%addr, "administration API listening on TCP (token required)");
        tokio::spawn(admin::serve_tcp(admin.clone(), listener, guard, deadlines))
    });

    crate::systemd::ready();
    let watchdog = crate::systemd::watchdog().map(tokio::spawn);

    let outcome = tokio::select! {
        _ = sigterm.recv() => {
            tracing::info!("SIGTERM: shutting down");
            Ok(())
        }
        _ = sigint.recv() => {
            tracing::info!("SIGINT: shutting down");
            Ok::<(), anyhow::Error>(())
        }
    };

    crate::systemd::stopping();
    if let Some(task) = watchdog {
        task.abort();
    }
    // No configuration change may start while the devices are flushed;
    // API callers get no say in how long shutdown takes.
    if let Some(task) = admin_task {
        task.abort();
    }
    if let Some(task) = api_task {
        task.abort();
    }
    let others = transports.into_iter().map(|t| t.shutdown).collect();
    end_sessions(&server, nbd, others, &mut sigterm, &mut sigint).await;
    let mut listeners = std::mem::replace(
        &mut *admin.portals.lock().unwrap_or_else(|p| p.into_inner()),
        portals::Portals::new(server.clone()),
    );
    listeners.join_all(ACCEPT_LOOP_GRACE).await;
    if let Some(task) = metrics_task {
        task.abort();
    }
    if let Some(file) = socket_file {
        file.remove();
    }
    flush_and_close(admin).await?;
    outcome
}
