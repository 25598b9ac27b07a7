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
    }
}
