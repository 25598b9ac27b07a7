//! The NBD transport of the daemon: its server over the configuration's
//! device exports, its listeners, and its counters in `/metrics`.

use std::sync::{Arc, Mutex};

use anyhow::Context;
use stats::{Sample, SampleKind, SampleSource};

/// The NBD server of a daemon and its listeners.
pub struct NbdFrontend {
    pub server: nbd::Server,
    listeners: Arc<nbd::Listeners>,
    /// The TLS files being served, to load them again when they change.
    tls: Arc<Mutex<Option<nbd::TlsConfig>>>,
}

/// Where NBD listens, and whether a failure to bind there stops the
/// daemon: addresses of the built-in default configuration only warn, as
/// another daemon may hold the well-known port.
pub struct NbdListen {
    pub addrs: Vec<nbd::ListenAddr>,
    pub required: bool,
}

impl NbdFrontend {
    /// A server offering `exports`' device exports, with TLS when the
    /// configuration gives a certificate, and the peer limits of
    /// `options` (the `[daemon]` settings every listener shares); it
    /// listens nowhere yet.
    pub fn new(
        config: &control::Config,
        exports: &export::Exports,
        options: &iscsi::ServerOptions,
    ) -> anyhow::Result<Self> {
        let server = nbd::Server::new(nbd::exports_of(exports), limits(options));
        let tls = config.nbd.as_ref().and_then(|n| n.tls.clone());
        server.set_tls(load_tls(tls.as_ref()).map_err(anyhow::Error::msg)?);
        Ok(NbdFrontend {
            listeners: Arc::new(nbd::Listeners::new(server.clone())),
            server,
            tls: Arc::new(Mutex::new(tls)),
        })
    }

    /// What moves the listeners and TLS files on a configuration change.
    pub fn live(&self) -> Arc<dyn crate::LiveListeners> {
        Arc::new(NbdLive {
            server: self.server.clone(),
            listeners: self.listeners.clone(),
            tls: self.tls.clone(),
        })
    }

    pub async fn listen(&mut self, listen: &NbdListen) -> anyhow::Result<()> {
        for addr in &listen.addrs {
            let bound = nbd::listeners::bind(addr)
                .and_then(|bound| self.listeners.start(addr.clone(), bound));
            match bound {
                Ok(()) => {}
                Err(e) if !listen.required => {
                    tracing::warn!(%addr, error = %e, "NBD not served there (give --nbd-listen ADDR)");
                }
                Err(e) => return Err(e).with_context(|| format!("NBD: cannot listen on {addr}")),
            }
        }
        Ok(())
    }

    /// Stops listening; each session ends once its requests in flight are
    /// answered, or is cut after [`SHUTDOWN_GRACE`].
    pub async fn shutdown(self, grace: std::time::Duration) {
        self.server.shutdown();
        self.listeners.join(grace).await;
        let deadline = tokio::time::Instant::now() + grace;
        while !self.server.sessions().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

/// The server's TLS from the files `tls` names; `None` without.
fn load_tls(tls: Option<&nbd::TlsConfig>) -> Result<Option<nbd::Tls>, String> {
    let Some(tls) = tls else {
        return Ok(None);
    };
    let mode = if tls.require {
        nbd::TlsMode::Require
    } else {
        nbd::TlsMode::Allow
    };
    nbd::Tls::from_pem_files(&tls.cert, &tls.key, mode)
        .map(Some)
        .map_err(|e| {
            format!(
                "nbd.tls: cannot load {} and {}: {e}",
                tls.cert.display(),
                tls.key.display()
            )
        })
}

/// The NBD listeners and TLS files as a configuration change moves them.
#[derive(Clone)]
struct NbdLive {
    server: nbd::Server,
    listeners: Arc<nbd::Listeners>,
    tls: Arc<Mutex<Option<nbd::TlsConfig>>>,
}

/// How long a change waits for a dropped address's socket to close.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A change of where NBD listens, bound and loaded.
struct NbdChange {
    live: NbdLive,
    added: Vec<(nbd::ListenAddr, nbd::listeners::Bound)>,
    removed: Vec<nbd::ListenAddr>,
    /// New TLS files and what they load to, when they changed.
    tls: Option<(Option<nbd::TlsConfig>, Option<nbd::Tls>)>,
}

impl crate::LiveListeners for NbdLive {
    fn prepare(&self, next: &control::Config) -> Result<Box<dyn crate::PreparedListeners>, String> {
        let wanted = next.nbd.as_ref().map_or(&[][..], |n| &n.listen[..]);
        let running = self.listeners.addrs();
        let mut added = Vec::new();
        for addr in wanted.iter().filter(|a| !running.contains(a)) {
            let bound = nbd::listeners::bind(addr)
                .map_err(|e| format!("nbd.listen: cannot listen on {addr}: {e}"))?;
            added.push((addr.clone(), bound));
        }
        let removed = running
            .into_iter()
            .filter(|a| !wanted.contains(a))
            .collect();
        let tls = next.nbd.as_ref().and_then(|n| n.tls.clone());
        let changed = *self.tls.lock().unwrap_or_else(|p| p.into_inner()) != tls;
        let tls = match changed {
            true => Some((tls.clone(), load_tls(tls.as_ref())?)),
            false => None,
        };
        Ok(Box::new(NbdChange {
            live: self.clone(),
            added,
            removed,
            tls,
        }))
    }
}

impl crate::PreparedListeners for NbdChange {
    fn commit(self: Box<Self>) {
        let live = &self.live;
        if let Some((files, loaded)) = self.tls {
            live.server.set_tls(loaded);
            *live.tls.lock().unwrap_or_else(|p| p.into_inner()) = files;
            tracing::info!("NBD TLS files changed; new clients get them");
        }
        for (addr, bound) in self.added {
            if let Err(e) = live.listeners.start(addr.clone(), bound) {
                tracing::error!(%addr, error = %e, "NBD listener did not start");
            }
        }
        let closing: Vec<_> = self
            .removed
            .iter()
            .filter_map(|addr| live.listeners.stop(addr))
            .collect();
        // Returns once the sockets are closed, so that the next change may
        // bind their addresses again. (Polled: changes run on a blocking
        // thread.)
        let waiting = std::time::Instant::now();
        while closing.iter().any(|t| !t.is_finished()) && waiting.elapsed() < CLOSE_WAIT {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

/// NBD's limits from the `[daemon]` settings, as iSCSI reads them: the
/// handshake is NBD's login, and NBD has no ping, so a silent client is
/// probed by TCP keep-alive on the NOP timers instead.
fn limits(options: &iscsi::ServerOptions) -> nbd::Limits {
    let defaults = nbd::Limits::default();
    nbd::Limits {
        write_deadline: options.write_timeout,
        handshake_timeout: options.login_timeout,
        handshakes_per_source: options.max_logins_per_source,
        // Below the connection total, so that negotiating connections
        // can never fill it and the eviction of the oldest always helps.
        handshakes_total: options.max_logins.min(defaults.max_connections / 4),
        connections_per_source: options.max_connections_per_source,
        keep_alive: options.nop_interval.map(|idle| (idle, options.nop_timeout)),
        shutdown_grace: SHUTDOWN_GRACE,
        ..defaults
    }
}

/// How long NBD sessions get, on shutdown, to answer what they have in
/// flight; iSCSI initiators get their logout time meanwhile, so this is
/// not added to it.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The NBD server's counters at every scrape, labelled transport="nbd".
#[derive(Clone)]
pub struct NbdSamples(pub nbd::Server);

impl std::fmt::Debug for NbdSamples {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NbdSamples")
    }
}

fn sample(
    name: &'static str,
    help: &'static str,
    kind: SampleKind,
    extra: &[(&'static str, &str)],
    value: u64,
) -> Sample {
    let mut labels = vec![("transport", "nbd".to_string())];
    labels.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    Sample {
        name,
        help,
        kind,
        labels,
        value,
    }
}

impl SampleSource for NbdSamples {
    fn samples(&self) -> Vec<Sample> {
        use SampleKind::{Counter, Gauge};
        let s = self.0.stats();
        const REFUSED: &str = "openarray_connections_refused";
        const REFUSED_HELP: &str = "Connections or logins refused by a listener's limits";
        let mut out = vec![
            sample(
                REFUSED,
                REFUSED_HELP,
                Counter,
                &[("reason", "source_logging_in")],
                s.refused_busy,
            ),
            sample(
                REFUSED,
                REFUSED_HELP,
                Counter,
                &[("reason", "portal_full")],
                s.refused_full,
            ),
            sample(
                REFUSED,
                REFUSED_HELP,
                Counter,
                &[("reason", "source_holds_most")],
                s.refused_source,
            ),
            sample(
                "openarray_connections_stalled",
                "Connections dropped because the peer stopped reading",
                Counter,
                &[],
                s.stalled,
            ),
            sample(
                "openarray_connections_evicted",
                "Connections still logging in closed to make room for newer ones",
                Counter,
                &[],
                s.evicted,
            ),
            sample(
                "openarray_connections_logging_in",
                "Connections accepted that have not logged in yet",
                Gauge,
                &[],
                s.negotiating,
            ),
            sample(
                "openarray_nbd_protocol_errors",
                "NBD connections ended for breaking the protocol",
                Counter,
                &[],
                s.protocol_errors,
            ),
        ];
        for e in &s.exports {
            let export = [("export", e.name.as_str())];
            let op = |op: &'static str| [("export", e.name.as_str()), ("op", op)];
            const OPS: &str = "openarray_nbd_requests";
            const OPS_HELP: &str = "NBD requests completed, by export and command";
            for (name, value) in [
                ("read", e.reads),
                ("write", e.writes),
                ("flush", e.flushes),
                ("trim", e.trims),
                ("write_zeroes", e.zeroes),
                ("block_status", e.block_status),
            ] {
                out.push(sample(OPS, OPS_HELP, Counter, &op(name), value));
            }
            const BYTES: &str = "openarray_nbd_bytes";
            const BYTES_HELP: &str = "Bytes read and written through NBD, by export";
            out.push(sample(
                BYTES,
                BYTES_HELP,
                Counter,
                &op("read"),
                e.read_bytes,
            ));
            out.push(sample(
                BYTES,
                BYTES_HELP,
                Counter,
                &op("write"),
                e.write_bytes,
            ));
            out.push(sample(
                "openarray_nbd_errors",
                "NBD requests answered with an error, by export",
                Counter,
                &export,
                e.errors,
            ));
            out.push(sample(
                "openarray_nbd_connections",
                "NBD connections in transmission now, by export",
                Gauge,
                &export,
                e.open_connections,
            ));
            out.push(sample(
                "openarray_nbd_refused",
                "NBD clients refused by an export's allow list",
                Counter,
                &export,
                e.refused,
            ));
            out.push(sample(
                "openarray_nbd_gathered_waits",
                "Waits of NBD connections that let requests gather in the socket, by export",
                Counter,
                &export,
                e.gathered_waits,
            ));
        }
        out
    }
}

/// The source for a registry's `add_source`.
pub fn samples(server: &nbd::Server) -> Arc<dyn SampleSource> {
    Arc::new(NbdSamples(server.clone()))
}
