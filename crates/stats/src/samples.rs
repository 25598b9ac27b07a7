//! Numbers kept outside the registry (listeners, transports), read at
//! every scrape through a [`SampleSource`] the daemon registers.

use std::fmt::Debug;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// Whether a sample only grows or goes up and down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleKind {
    Counter,
    Gauge,
}

/// One value of one metric family. Counters are named without `_total`;
/// the encoder adds it.
#[derive(Clone, Debug)]
pub struct Sample {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: SampleKind,
    pub labels: Vec<(&'static str, String)>,
    pub value: u64,
}

/// Something that reports samples when scraped.
pub trait SampleSource: Send + Sync + Debug {
    fn samples(&self) -> Vec<Sample>;
}

/// Encode `samples`, one family per name in the order names first appear.
pub(crate) fn encode(
    samples: &[Sample],
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let mut names: Vec<&'static str> = Vec::new();
    for s in samples {
        if !names.contains(&s.name) {
            names.push(s.name);
        }
    }
    for name in names {
        let mut family = samples.iter().filter(|s| s.name == name).peekable();
        let Some(first) = family.peek() else {
            continue;
        };
        let kind = match first.kind {
            SampleKind::Counter => MetricType::Counter,
            SampleKind::Gauge => MetricType::Gauge,
        };
        let mut out = encoder.encode_descriptor(name, first.help, None, kind)?;
        for s in family {
            let at = out.encode_family(&s.labels)?;
            match s.kind {
                SampleKind::Counter => ConstCounter::new(s.value).encode(at)?,
                SampleKind::Gauge => ConstGauge::new(s.value as i64).encode(at)?,
            }
        }
    }
    Ok(())
}
