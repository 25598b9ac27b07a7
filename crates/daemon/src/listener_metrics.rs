//! What the iSCSI listeners count of their peers, in `/metrics`.

use std::sync::Arc;

use stats::{Sample, SampleKind, SampleSource};

/// Reads an iSCSI server's listener counts at every scrape.
#[derive(Debug)]
pub struct ListenerSamples(pub Arc<iscsi::Server>);

fn transport() -> Vec<(&'static str, String)> {
    vec![("transport", "iscsi".to_string())]
}

fn counter(name: &'static str, help: &'static str, reason: Option<&str>, value: u64) -> Sample {
    let mut labels = transport();
    if let Some(reason) = reason {
        labels.push(("reason", reason.to_string()));
    }
    Sample {
        name,
        help,
        kind: SampleKind::Counter,
        labels,
        value,
    }
}

impl SampleSource for ListenerSamples {
    fn samples(&self) -> Vec<Sample> {
        let events = self.0.events();
        const REFUSED: &str = "openarray_connections_refused";
        const REFUSED_HELP: &str = "Connections or logins refused by a listener's limits";
        vec![
            counter(
                REFUSED,
                REFUSED_HELP,
                Some("source_logging_in"),
                events.source_full.total(),
            ),
            counter(
                REFUSED,
                REFUSED_HELP,
                Some("portal_full"),
                events.portal_full.total(),
            ),
            counter(
                REFUSED,
                REFUSED_HELP,
                Some("source_holds_most"),
                events.source_holds_most.total(),
            ),
            counter(
                "openarray_connections_evicted",
                "Connections still logging in closed to make room for newer ones",
                None,
                events.login_evicted.total(),
            ),
            counter(
                "openarray_connections_stalled",
                "Connections dropped because the peer stopped reading",
                None,
                events.stalled.total(),
            ),
            Sample {
                name: "openarray_connections_logging_in",
                help: "Connections accepted that have not logged in yet",
                kind: SampleKind::Gauge,
                labels: transport(),
                value: self.0.logging_in() as u64,
            },
        ]
        .into_iter()
        .chain(session_samples(&self.0))
        .collect()
    }
}

/// Sessions and connections logged in now, and logins by outcome.
fn session_samples(server: &iscsi::Server) -> Vec<Sample> {
    let counts = server.session_counts();
    let gauge = |name, help, labels, value: usize| Sample {
        name,
        help,
        kind: SampleKind::Gauge,
        labels,
        value: value as u64,
    };
    const SESSIONS: &str = "openarray_sessions";
    const SESSIONS_HELP: &str = "Sessions logged in, by target (discovery sessions: target \"\")";
    let mut samples: Vec<Sample> = counts
        .by_target
        .iter()
        .map(|(target, n)| {
            let mut labels = transport();
            labels.push(("target", target.clone()));
            gauge(SESSIONS, SESSIONS_HELP, labels, *n)
        })
        .collect();
    let mut labels = transport();
    labels.push(("target", String::new()));
    samples.push(gauge(SESSIONS, SESSIONS_HELP, labels, counts.discovery));
    samples.push(gauge(
        "openarray_connections",
        "Connections logged in (normal and discovery)",
        transport(),
        counts.connections,
    ));
    const LOGINS: &str = "openarray_logins";
    const LOGINS_HELP: &str = "Logins accepted, and refused by reason";
    let logins = server.logins();
    let mut labels = transport();
    labels.push(("result", "accepted".to_string()));
    samples.push(Sample {
        name: LOGINS,
        help: LOGINS_HELP,
        kind: SampleKind::Counter,
        labels,
        value: logins.accepted(),
    });
    for (refusal, n) in logins.refused() {
        let mut labels = transport();
        labels.push(("result", "refused".to_string()));
        labels.push(("reason", refusal.label().to_string()));
        samples.push(Sample {
            name: LOGINS,
            help: LOGINS_HELP,
            kind: SampleKind::Counter,
            labels,
            value: n,
        });
    }
    samples
}

/// Reads the NVMe/TCP listeners' counts at every scrape, with the names
/// and reasons iSCSI's and NBD's use, labelled transport="nvme-tcp".
#[derive(Clone)]
pub struct NvmfListenerSamples(pub nvmf::Server);

impl std::fmt::Debug for NvmfListenerSamples {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NvmfListenerSamples")
    }
}

impl SampleSource for NvmfListenerSamples {
    fn samples(&self) -> Vec<Sample> {
        let s = self.0.listener_stats();
        let sample = |name, help, kind, reason: Option<&str>, value| {
            let mut labels = vec![("transport", "nvme-tcp".to_string())];
            if let Some(reason) = reason {
                labels.push(("reason", reason.to_string()));
            }
            Sample {
                name,
                help,
                kind,
                labels,
                value,
            }
        };
        const REFUSED: &str = "openarray_connections_refused";
        const REFUSED_HELP: &str = "Connections or logins refused by a listener's limits";
        use SampleKind::{Counter, Gauge};
        vec![
            sample(
                REFUSED,
                REFUSED_HELP,
                Counter,
                Some("source_logging_in"),
                s.refused_connecting,
            ),
            sample(
                REFUSED,
                REFUSED_HELP,
                Counter,
                Some("portal_full"),
                s.refused_full,
            ),
            sample(
                REFUSED,
                REFUSED_HELP,
                Counter,
                Some("source_holds_most"),
                s.refused_source,
            ),
            sample(
                "openarray_connections_evicted",
                "Connections still logging in closed to make room for newer ones",
                Counter,
                None,
                s.evicted,
            ),
            sample(
                "openarray_connections_stalled",
                "Connections dropped because the peer stopped reading",
                Counter,
                None,
                s.stalled,
            ),
            sample(
                "openarray_connections_logging_in",
                "Connections accepted that have not logged in yet",
                Gauge,
                None,
                s.connecting,
            ),
            sample(
                "openarray_nvmf_protocol_errors",
                "NVMe/TCP connections ended for breaking the protocol",
                Counter,
                None,
                s.protocol_errors,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_has_a_session_gauge_and_every_reason_a_counter() {
        let target = iscsi::Target {
            name: "iqn.2026-11.org.test:m".into(),
            alias: None,
            portal_group: 1,
            portals: Vec::new(),
            scsi: std::sync::Arc::new(scsi_api::testing::NoLuns),
        };
        let server = iscsi::Server::new(iscsi::ServerOptions::default(), vec![target]);
        let samples = ListenerSamples(server).samples();
        let find = |name: &str, label: (&str, &str)| {
            samples
                .iter()
                .find(|s| s.name == name && s.labels.iter().any(|(k, v)| (*k, v.as_str()) == label))
                .map(|s| s.value)
        };
        assert_eq!(
            find("openarray_sessions", ("target", "iqn.2026-11.org.test:m")),
            Some(0)
        );
        assert_eq!(find("openarray_sessions", ("target", "")), Some(0));
        assert_eq!(
            find("openarray_connections", ("transport", "iscsi")),
            Some(0)
        );
        assert_eq!(find("openarray_logins", ("result", "accepted")), Some(0));
        for r in iscsi::Refusal::ALL {
            assert_eq!(find("openarray_logins", ("reason", r.label())), Some(0));
        }
    }
}
