//! The registry's numbers in the Prometheus/OpenMetrics text format.
//!
//! Per (target, LUN, initiator) and, where it applies, per `op` (read,
//! write, other):
//!
//! | metric | type |
//! | --- | --- |
//! | `openarray_scsi_commands_total` | counter |
//! | `openarray_scsi_bytes_total` (read, write) | counter |
//! | `openarray_scsi_errors_total` | counter |
//! | `openarray_scsi_busy_seconds_total` | counter: summed latency |
//! | `openarray_scsi_latency_seconds{quantile="0.5"/"0.99"/"0.999"}` | gauge, since start, from the histogram |
//! | `openarray_scsi_in_flight` | gauge: commands executing now |
//!
//! And for the whole daemon:
//!
//! | metric | type |
//! | --- | --- |
//! | `openarray_iscsi_auth_failures_total` | counter: logins whose CHAP proof was wrong |
//!
//! Label values are escaped by the encoder. The rate of the busy seconds
//! is the mean queue depth over the scrape interval.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::counters::{EntrySnapshot, OpSnapshot};
use crate::registry::Registry;

/// The quantiles exported for every entry and kind of command.
pub const QUANTILES: [(f64, &str); 3] = [(0.5, "0.5"), (0.99, "0.99"), (0.999, "0.999")];

/// A collector reading the registry at every scrape.
#[derive(Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
}

impl Metrics {
    pub fn new(registry: Arc<Registry>) -> Self {
        Metrics { registry }
    }
}

type Labels = Vec<(&'static str, String)>;

fn labels(e: &EntrySnapshot) -> Labels {
    vec![
        ("target", e.target.clone()),
        ("lun", e.lun.to_string()),
        ("initiator", e.initiator.clone()),
    ]
}

fn ops(e: &EntrySnapshot) -> [(&'static str, &OpSnapshot); 3] {
    [("read", &e.read), ("write", &e.write), ("other", &e.other)]
}

fn with(mut labels: Labels, more: &[(&'static str, &str)]) -> Labels {
    labels.extend(more.iter().map(|&(k, v)| (k, v.to_string())));
    labels
}

impl Collector for Metrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let entries = self.registry.snapshot();
        let per_op = |encoder: &mut DescriptorEncoder,
                      name: &str,
                      help: &str,
                      value: &dyn Fn(&OpSnapshot) -> u64,
                      kinds: &[&str]|
         -> Result<(), std::fmt::Error> {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for e in &entries {
                for (op, snap) in ops(e) {
                    if kinds.contains(&op) {
                        let set = with(labels(e), &[("op", op)]);
                        ConstCounter::new(value(snap)).encode(family.encode_family(&set)?)?;
                    }
                }
            }
            Ok(())
        };
        let all = ["read", "write", "other"];
        per_op(
            &mut encoder,
            "openarray_scsi_commands",
            "SCSI commands executed",
            &|s| s.commands,
            &all,
        )?;
        per_op(
            &mut encoder,
            "openarray_scsi_bytes",
            "Bytes read or written",
            &|s| s.bytes,
            &["read", "write"],
        )?;
        per_op(
            &mut encoder,
            "openarray_scsi_errors",
            "Commands that ended with a status other than GOOD",
            &|s| s.errors,
            &all,
        )?;
        {
            let mut family = encoder.encode_descriptor(
                "openarray_scsi_busy_seconds",
                "Summed command latency in seconds; its rate is the mean queue depth",
                None,
                MetricType::Counter,
            )?;
            for e in &entries {
                for (op, snap) in ops(e) {
                    let set = with(labels(e), &[("op", op)]);
                    ConstCounter::new(snap.latency_ns as f64 / 1e9)
                        .encode(family.encode_family(&set)?)?;
                }
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "openarray_scsi_latency_seconds",
                "Command latency percentiles since start, from a log-bucket histogram",
                None,
                MetricType::Gauge,
            )?;
            for e in &entries {
                for (op, snap) in ops(e) {
                    for (q, label) in QUANTILES {
                        let Some(nanos) = snap.latency.quantile(q) else {
                            continue;
                        };
                        let set = with(labels(e), &[("op", op), ("quantile", label)]);
                        ConstGauge::new(nanos as f64 / 1e9).encode(family.encode_family(&set)?)?;
                    }
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "openarray_scsi_in_flight",
            "Commands executing now (queue depth at the SCSI layer)",
            None,
            MetricType::Gauge,
        )?;
        for e in &entries {
            ConstGauge::new(e.in_flight as i64).encode(family.encode_family(&labels(e))?)?;
        }
        let auth = encoder.encode_descriptor(
            "openarray_iscsi_auth_failures",
            "Login attempts whose CHAP proof was wrong",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(self.registry.auth_failures()).encode(auth)?;
        crate::samples::encode(&self.registry.samples(), &mut encoder)
    }
}

/// The text a Prometheus scrape gets.
pub fn encode_text(registry: &Arc<Registry>) -> String {
    let mut reg = prometheus_client::registry::Registry::default();
    reg.register_collector(Box::new(Metrics::new(registry.clone())));
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OpKind;

    #[test]
    fn text_has_counters_percentiles_and_queue_depth() {
        let reg = Registry::new();
        let t = reg.target("iqn.t");
        let e = t.entry(201, &Arc::from("iqn.host\"1"));
        for _ in 0..1000 {
            e.begin();
            e.end(OpKind::Read, 4096, 200_000, true);
        }
        e.begin();
        e.end(OpKind::Write, 512, 1_000_000, false);
        e.begin(); // one still running
        reg.auth_failures_counter()
            .fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        let text = encode_text(&reg);
        let l = r#"target="iqn.t",lun="201",initiator="iqn.host\"1""#;
        for line in [
            format!("openarray_scsi_commands_total{{{l},op=\"read\"}} 1000"),
            format!("openarray_scsi_commands_total{{{l},op=\"write\"}} 1"),
            format!("openarray_scsi_bytes_total{{{l},op=\"read\"}} 4096000"),
            format!("openarray_scsi_errors_total{{{l},op=\"write\"}} 1"),
            format!("openarray_scsi_in_flight{{{l}}} 1"),
            "# TYPE openarray_scsi_latency_seconds gauge".to_string(),
            "openarray_iscsi_auth_failures_total 3".to_string(),
        ] {
            assert!(text.lines().any(|x| x == line), "no {line} in\n{text}");
        }
        let p99 = text
            .lines()
            .find(|x| {
                x.starts_with("openarray_scsi_latency_seconds{")
                    && x.contains("op=\"read\"")
                    && x.contains("quantile=\"0.99\"")
            })
            .expect("read p99");
        let value: f64 = p99.rsplit(' ').next().unwrap().parse().unwrap();
        assert!((0.0002..0.0002125).contains(&value), "{p99}");
        // No bytes family for "other", no quantiles without samples.
        assert!(!text.contains("openarray_scsi_bytes_total{target=\"iqn.t\",lun=\"201\",initiator=\"iqn.host\\\"1\",op=\"other\"}"));
        assert!(!text.lines().any(
            |x| x.starts_with("openarray_scsi_latency_seconds{") && x.contains("op=\"other\"")
        ));
    }
}
