//! NVMe/TCP as the daemon serves it: `[nvmf]` (whose types and checks
//! are the nvmf crate's) joins the configuration language, the target
//! starts with the daemon whether or not the section is there (so a
//! change can add it), and a change of the section applies live.

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use control::sections::{Problem, SectionOwner};

/// NVMe/TCP as a transport of the daemon, and its `[nvmf]` section as
/// the configuration reads it.
#[derive(Clone, Copy)]
pub struct Nvmf;

impl SectionOwner for Nvmf {
    type Config = nvmf::Config;
    const NAME: &'static str = "nvmf";
    const DEFAULT_TEXT: &'static str = r#"# And to NVMe/TCP hosts:
# nvme connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.2026-11.org.openarray:default
[nvmf]
listen = ["127.0.0.1:4420"]

[[nvmf.subsystem]]
nqn = "nqn.2026-11.org.openarray:default"
allow_hosts = ["*"]

[[nvmf.subsystem.namespace]]
nsid = 1
device = "mem0"
"#;

    fn check(&self, config: &nvmf::Config, devices: &BTreeSet<String>) -> Vec<Problem> {
        config
            .validate(devices)
            .into_iter()
            .map(|e| Problem {
                field: e.field,
                reason: e.why,
            })
            .collect()
    }

    fn served_devices(&self, config: &nvmf::Config) -> BTreeSet<String> {
        config.devices().into_iter().map(str::to_string).collect()
    }
}

/// The `[nvmf]` of `config`, if it has one.
pub fn section(config: &control::Config) -> Option<&nvmf::Config> {
    config
        .sections
        .get(Nvmf::NAME)
        .and_then(|s| s.get::<nvmf::Config>())
}

/// Replaces where NVMe/TCP listens, e.g. from `--nvmf-listen`; a
/// configuration without `[nvmf]` gets one without subsystems.
pub fn override_listen(config: &mut control::Config, listen: &[SocketAddr]) {
    let mut section = section(config).cloned().unwrap_or_default();
    // Repeated addresses count once, as for portals: a second bind of
    // one address would fail the start.
    section.listen.clear();
    for a in listen.iter().map(SocketAddr::to_string) {
        if !section.listen.contains(&a) {
            section.listen.push(a);
        }
    }
    control::sections::set(&mut config.sections, &Nvmf, section);
}

/// The NVMe/TCP limits from the `[daemon]` settings every listener
/// shares, the transport's own defaults elsewhere.
pub fn limits(daemon: &control::Daemon) -> nvmf::Limits {
    let d = nvmf::Limits::default();
    nvmf::Limits {
        write_deadline: daemon.write_timeout.unwrap_or(d.write_deadline),
        connect_timeout: daemon.login_timeout.unwrap_or(d.connect_timeout),
        connecting_per_source: daemon
            .max_logins_per_source
            .unwrap_or(d.connecting_per_source),
        connecting_total: daemon.max_logins.unwrap_or(d.connecting_total),
        connections_per_source: daemon
            .max_connections_per_source
            .unwrap_or(d.connections_per_source),
        outgoing_bytes: daemon.max_queued_output.unwrap_or(d.outgoing_bytes),
        ..d
    }
}

/// The NVMe/TCP target of the daemon.
#[derive(Clone)]
pub struct NvmfTransport {
    pub server: nvmf::Server,
}

impl NvmfTransport {
    /// Serves `config`'s `[nvmf]` over `exports`' devices. When not
    /// `required` (the built-in default, whose address another daemon
    /// may hold) an address that cannot be bound is left with a warning.
    /// Needs the I/O runtime's context.
    pub fn start(
        config: &control::Config,
        exports: &export::Exports,
        required: bool,
    ) -> io::Result<NvmfTransport> {
        let server = nvmf::Server::new(limits(&config.daemon));
        export::Frontend::replace_exports(&server, exports);
        let section = section(config).cloned().unwrap_or_default();
        match server.prepare(&section) {
            Ok(p) => p.commit()?,
            Err(e) if !required => {
                tracing::warn!(error = %e, "NVMe/TCP not served there (give --nvmf-listen ADDR)");
                let mut without = section;
                without.listen.clear();
                server.prepare(&without)?.commit()?;
            }
            Err(e) => return Err(e),
        }
        Ok(NvmfTransport { server })
    }
}

impl crate::LiveListeners for NvmfTransport {
    fn prepare(&self, next: &control::Config) -> Result<Box<dyn crate::PreparedListeners>, String> {
        let section = section(next).cloned().unwrap_or_default();
        let prepared = self
            .server
            .prepare(&section)
            .map_err(|e| format!("nvmf.listen: {e}"))?;
        Ok(Box::new(Prepared(prepared, self.server.clone())))
    }
}

struct Prepared(nvmf::Prepared, nvmf::Server);

impl crate::transports::Transport for Nvmf {
    fn name(&self) -> &'static str {
        "nvme-tcp"
    }

    fn listen_overridden(&self, current: &crate::Current) -> bool {
        !current.nvmf_listen_override.is_empty()
    }

    fn start(
        &self,
        start: &crate::transports::Start<'_>,
    ) -> anyhow::Result<crate::transports::Running> {
        let running = NvmfTransport::start(start.config, start.exports, start.required)?;
        let server = running.server.clone();
        Ok(crate::transports::Running {
            frontend: Arc::new(server.clone()),
            listeners: Arc::new(running),
            samples: Some(Arc::new(crate::listener_metrics::NvmfListenerSamples(
                server.clone(),
            ))),
            shutdown: Box::new(move || {
                Box::pin(async move {
                    server.shutdown();
                })
            }),
        })
    }
}

impl crate::PreparedListeners for Prepared {
    fn commit(self: Box<Self>) {
        if let Err(e) = self.0.commit() {
            tracing::warn!(error = %e, "NVMe/TCP: a listener of the change did not start");
        }
        // The allow lists change with the section, after the transports
        // ended the sessions the old ones refuse: end the controllers of
        // hosts the new ones no longer admit, as iSCSI's and NBD's are.
        let ended = export::Frontend::end_refused_sessions(&self.1);
        if ended > 0 {
            tracing::info!(ended, "nvmf: ended controllers of hosts no longer admitted");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<control::Config, control::ConfigError> {
        control::sections::register(Nvmf);
        control::parse_config(text, "t.toml")
    }

    const DEVICE: &str = "[[device]]\nname = \"d0\"\nkind = \"mem\"\n\n";

    #[test]
    fn the_section_serves_its_devices_and_its_problems_name_the_line() {
        let ok = format!(
            "{DEVICE}[nvmf]\nlisten = [\"127.0.0.1:4420\"]\n[[nvmf.subsystem]]\nnqn = \"nqn.2026-11.org.openarray:a\"\nallow_hosts = [\"*\"]\n[[nvmf.subsystem.namespace]]\nnsid = 1\ndevice = \"d0\"\n"
        );
        let c = parse(&ok).unwrap();
        assert_eq!(section(&c).unwrap().subsystems.len(), 1);
        assert!(c.mapped_devices().contains("d0"));

        let bad = ok.replace("device = \"d0\"", "device = \"nope\"");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(
            e.contains(
                "t.toml:12:1: nvmf.subsystem[0].namespace[0].device: no device is named \"nope\""
            ),
            "{e}"
        );
        let typo = ok.replace("listen =", "lisen =");
        let e = parse(&typo).unwrap_err().to_string();
        assert!(
            e.contains("t.toml:6:1: nvmf.lisen") && e.contains("unknown field `lisen`"),
            "{e}"
        );
    }

    #[test]
    fn the_default_serves_its_ram_disk_over_nvme_tcp() {
        control::sections::register(Nvmf);
        let c = control::default_config();
        let s = section(&c).unwrap();
        assert_eq!(s.listen, ["127.0.0.1:4420"]);
        assert_eq!(s.subsystems[0].namespaces[0].device, "mem0");
    }

    #[test]
    fn listen_overrides_replace_or_add_the_section() {
        let mut c = parse(DEVICE).unwrap();
        let a: SocketAddr = "127.0.0.1:5420".parse().unwrap();
        override_listen(&mut c, &[a, a]);
        assert_eq!(section(&c).unwrap().listen, ["127.0.0.1:5420"]);
        assert!(section(&c).unwrap().subsystems.is_empty());
        let b: SocketAddr = "127.0.0.1:5421".parse().unwrap();
        override_listen(&mut c, &[a, b, a]);
        assert_eq!(
            section(&c).unwrap().listen,
            ["127.0.0.1:5420", "127.0.0.1:5421"]
        );
    }

    #[test]
    fn daemon_settings_bound_the_connections() {
        let daemon = control::Daemon {
            write_timeout: Some(std::time::Duration::from_secs(3)),
            max_connections_per_source: Some(7),
            ..Default::default()
        };
        let l = limits(&daemon);
        assert_eq!(l.write_deadline, std::time::Duration::from_secs(3));
        assert_eq!(l.connections_per_source, 7);
        assert_eq!(l.connecting_total, nvmf::Limits::default().connecting_total);
    }
}
