//! The live numbers: once a second the statistics registry is read and
//! what happened since the previous reading becomes one sample (IOPS,
//! throughput and latency percentiles per LUN, per initiator and per NBD
//! export), kept for [`HISTORY`] and sent to every open event stream.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde_json::{json, Value};
use stats::{EntrySnapshot, HistogramSnapshot, Registry};
use tokio::sync::broadcast;

/// Samples kept: the last 15 minutes at one a second.
pub const HISTORY: usize = 15 * 60;
pub const INTERVAL: Duration = Duration::from_secs(1);

/// The samples so far and the channel new ones go out on.
pub struct Live {
    history: Mutex<VecDeque<Arc<str>>>,
    sender: broadcast::Sender<Arc<str>>,
}

impl Live {
    /// Starts sampling `registry` on the current tokio runtime; the task
    /// ends once the returned `Live` is dropped.
    pub fn start(registry: Arc<Registry>) -> Arc<Live> {
        let (sender, _) = broadcast::channel(16);
        let live = Arc::new(Live {
            history: Mutex::new(VecDeque::with_capacity(HISTORY)),
            sender,
        });
        tokio::spawn(sample_forever(Arc::downgrade(&live), registry));
        live
    }

    /// The samples kept, oldest first, and a receiver of the ones to come
    /// (taken together, so none is missed or sent twice).
    pub fn subscribe(&self) -> (Vec<Arc<str>>, broadcast::Receiver<Arc<str>>) {
        let history = self.history.lock();
        (history.iter().cloned().collect(), self.sender.subscribe())
    }

    fn push(&self, sample: Arc<str>) {
        let mut history = self.history.lock();
        if history.len() == HISTORY {
            history.pop_front();
        }
        history.push_back(sample.clone());
        // Sent under the lock: `subscribe` sees it in the history or in
        // the channel, never both.
        let _ = self.sender.send(sample);
    }
}

async fn sample_forever(live: Weak<Live>, registry: Arc<Registry>) {
    let mut sampler = Sampler::default();
    sampler.take(&registry);
    let mut ticks = tokio::time::interval(INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(live) = live.upgrade() else { return };
        let sample = sampler.take(&registry);
        live.push(sample.to_string().into());
    }
}

/// The previous reading, to subtract from the next.
#[derive(Default)]
pub struct Sampler {
    entries: HashMap<(String, u64, String), EntrySnapshot>,
    exports: HashMap<(String, String), u64>,
    at: Option<std::time::Instant>,
}

impl Sampler {
    /// What happened since the previous call, as one JSON sample.
    pub fn take(&mut self, registry: &Registry) -> Value {
        let now = std::time::Instant::now();
        let seconds = self
            .at
            .map(|at| now.duration_since(at).as_secs_f64())
            .unwrap_or(0.0)
            .max(1e-3);
        self.at = Some(now);
        let entries = registry.snapshot();
        let samples = registry.samples();
        let mut sample = self.entries_sample(entries, seconds);
        sample["exports"] = self.exports_sample(&samples, seconds);
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        sample["t"] = json!(millis);
        sample
    }

    fn entries_sample(&mut self, entries: Vec<EntrySnapshot>, seconds: f64) -> Value {
        let mut luns: BTreeMap<(String, u64), Rates> = BTreeMap::new();
        let mut initiators = Vec::new();
        for entry in entries {
            let key = (entry.target.clone(), entry.lun, entry.initiator.clone());
            let delta = match self.entries.get(&key) {
                Some(before) => entry.since(before),
                None => entry.since(&EntrySnapshot::default()),
            };
            let rates = Rates::of(&delta, seconds);
            if rates.ops > 0.0 {
                initiators.push(json!({
                    "target": entry.target,
                    "lun": entry.lun,
                    "initiator": entry.initiator,
                    "iops": rates.ops,
                    "bytes": rates.read_bytes + rates.write_bytes,
                }));
            }
            luns.entry((entry.target.clone(), entry.lun))
                .or_default()
                .add(&rates, &delta);
            self.entries.insert(key, entry);
        }
        let luns: Vec<Value> = luns
            .into_iter()
            .map(|((target, lun), r)| r.json(json!({ "target": target, "lun": lun })))
            .collect();
        json!({ "luns": luns, "initiators": initiators })
    }

    /// Per export from the NBD server's counters (`openarray_nbd_requests`
    /// and `openarray_nbd_bytes`, by export and operation).
    fn exports_sample(&mut self, samples: &[stats::Sample], seconds: f64) -> Value {
        let mut by_export: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for s in samples {
            let what = match s.name {
                "openarray_nbd_requests" => 0,
                "openarray_nbd_bytes" => 1,
                _ => continue,
            };
            let label = |name: &str| {
                s.labels
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            let (export, op) = (label("export"), label("op"));
            let key = (format!("{what}/{export}"), op);
            let before = self.exports.insert(key, s.value).unwrap_or(s.value);
            let rate = s.value.saturating_sub(before) as f64 / seconds;
            let totals = by_export.entry(export).or_default();
            match what {
                0 => totals.0 += rate,
                _ => totals.1 += rate,
            }
        }
        by_export
            .into_iter()
            .map(
                |(export, (iops, bytes))| json!({ "export": export, "iops": iops, "bytes": bytes }),
            )
            .collect()
    }
}

/// One LUN's (or initiator's) activity over an interval.
#[derive(Default)]
struct Rates {
    ops: f64,
    read_ops: f64,
    write_ops: f64,
    read_bytes: f64,
    write_bytes: f64,
    latency: HistogramSnapshot,
}

impl Rates {
    fn of(delta: &EntrySnapshot, seconds: f64) -> Rates {
        let count = |n: u64| n as f64 / seconds;
        Rates {
            ops: count(delta.read.commands + delta.write.commands + delta.other.commands),
            read_ops: count(delta.read.commands),
            write_ops: count(delta.write.commands),
            read_bytes: count(delta.read.bytes),
            write_bytes: count(delta.write.bytes),
            latency: HistogramSnapshot::default(),
        }
    }

    fn add(&mut self, other: &Rates, delta: &EntrySnapshot) {
        self.ops += other.ops;
        self.read_ops += other.read_ops;
        self.write_ops += other.write_ops;
        self.read_bytes += other.read_bytes;
        self.write_bytes += other.write_bytes;
        for h in [&delta.read.latency, &delta.write.latency] {
            self.latency = merged(&self.latency, h);
        }
    }

    fn json(&self, mut base: Value) -> Value {
        let micros = |q: f64| self.latency.quantile(q).map(|ns| ns as f64 / 1000.0);
        base["iops"] = json!(self.ops);
        base["read_iops"] = json!(self.read_ops);
        base["write_iops"] = json!(self.write_ops);
        base["read_bytes"] = json!(self.read_bytes);
        base["write_bytes"] = json!(self.write_bytes);
        base["p50_us"] = json!(micros(0.5));
        base["p99_us"] = json!(micros(0.99));
        base["p999_us"] = json!(micros(0.999));
        base
    }
}

/// The samples of both histograms (bucket lists ordered by index).
fn merged(a: &HistogramSnapshot, b: &HistogramSnapshot) -> HistogramSnapshot {
    let mut counts: BTreeMap<u32, u64> = BTreeMap::new();
    for &(index, n) in a.buckets.iter().chain(&b.buckets) {
        *counts.entry(index).or_default() += n;
    }
    HistogramSnapshot {
        buckets: counts.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stats::OpKind;

    #[test]
    fn a_sample_counts_what_happened_since_the_last() {
        let registry = Registry::new();
        let target = registry.target("iqn.t");
        let host: Arc<str> = "iqn.host".into();
        let entry = target.entry(3, &host);
        for _ in 0..10 {
            entry.begin();
            entry.end(OpKind::Write, 4096, 2_000_000, true);
        }
        let mut sampler = Sampler::default();
        sampler.take(&registry);
        for _ in 0..4 {
            entry.begin();
            entry.end(OpKind::Read, 512, 1_000, true);
        }
        std::thread::sleep(Duration::from_millis(20));
        let sample = sampler.take(&registry);
        let lun = &sample["luns"][0];
        assert_eq!(
            (lun["target"].as_str(), lun["lun"].as_u64()),
            (Some("iqn.t"), Some(3))
        );
        assert!(lun["read_iops"].as_f64().unwrap() > 0.0, "{sample}");
        assert_eq!(lun["write_iops"], 0.0, "{sample}");
        // Only the four reads of about a microsecond are in the percentiles.
        let p99 = lun["p99_us"].as_f64().unwrap();
        assert!(p99 < 100.0, "{sample}");
        assert_eq!(sample["initiators"][0]["initiator"], "iqn.host");
        // Nothing since: zero rates, no percentiles, no active initiators.
        let idle = sampler.take(&registry);
        assert_eq!(idle["luns"][0]["iops"], 0.0, "{idle}");
        assert!(idle["luns"][0]["p50_us"].is_null(), "{idle}");
        assert_eq!(idle["initiators"], json!([]));
    }

    #[tokio::test(start_paused = true)]
    async fn history_is_bounded_and_subscribers_get_what_follows() {
        let registry = Registry::new();
        let live = Live::start(registry);
        for _ in 0..3 {
            tokio::time::sleep(INTERVAL).await;
        }
        let (history, mut receiver) = live.subscribe();
        assert!(!history.is_empty());
        tokio::time::sleep(INTERVAL * 2).await;
        let next = receiver.recv().await.unwrap();
        assert!(next.contains("\"luns\""), "{next}");
        for i in 0..HISTORY + 2 {
            live.push(format!("{i}").into());
        }
        let (history, _) = live.subscribe();
        assert_eq!(history.len(), HISTORY);
        assert_eq!(&*history[HISTORY - 1], &format!("{}", HISTORY + 1));
    }
}
