//! The NBD transport of the daemon: its server over the configuration's
//! device exports, its listeners, and its counters in `/metrics`.

use std::sync::Arc;

use anyhow::Context;
use stats::{Sample, SampleKind, SampleSource};
use tokio::task::JoinHandle;

/// The NBD server of a daemon and its listeners.
pub struct NbdFrontend {
    pub server: nbd::Server,
    listeners: Vec<JoinHandle<std::io::Result<()>>>,
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
        if let Some(tls) = config.nbd.as_ref().and_then(|n| n.tls.as_ref()) {
            let mode = if tls.require {
                nbd::TlsMode::Require
            } else {
                nbd::TlsMode::Allow
            };
            let loaded =
                nbd::Tls::from_pem_files(&tls.cert, &tls.key, mode).with_context(|| {
                    format!(
                        "nbd.tls: cannot load {} and {}",
                        tls.cert.display(),
                        tls.key.display()
                    )
                })?;
            server.set_tls(Some(loaded));
        }
        Ok(NbdFrontend {
            server,
            listeners: Vec::new(),
        })
    }

    pub async fn listen(&mut self, listen: &NbdListen) -> anyhow::Result<()> {
        for addr in &listen.addrs {
            match self.server.listen(addr).await {
                Ok(task) => {
                    tracing::info!(%addr, "NBD listening");
                    self.listeners.push(task);
                }
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
        for task in self.listeners {
            let _ = tokio::time::timeout(grace, task).await;
        }
        let deadline = tokio::time::Instant::now() + grace;
        while !self.server.sessions().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
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
