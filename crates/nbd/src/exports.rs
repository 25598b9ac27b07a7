//! The exports a server offers, replaceable while it runs, and the
//! counters kept for each.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use block::BlockDevice;
use export::thread_slots::PerSlot;
use export::Backing;
use parking_lot::RwLock;

use export::Allow;

/// One device offered under a name.
#[derive(Clone)]
pub struct Export {
    /// The device with the range locks and write-cache policy every
    /// transport over it shares.
    pub backing: Arc<Backing>,
    /// Refuse writes even where the device takes them.
    pub read_only: bool,
    pub allow: Allow,
    /// Shown to clients listing the exports.
    pub description: String,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("device", &self.device().describe())
            .field("read_only", &self.read_only)
            .field("allow", &self.allow)
            .field("description", &self.description)
            .finish()
    }
}

impl Export {
    /// An export of a device no other transport serves, with its write
    /// cache on.
    pub fn new(device: Arc<dyn BlockDevice>) -> Export {
        Export::over(Backing::new(device, true))
    }

    /// An export over a device shared with other transports.
    pub fn over(backing: Arc<Backing>) -> Export {
        Export {
            backing,
            read_only: false,
            allow: Allow::default(),
            description: String::new(),
        }
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        self.backing.device()
    }
}

/// Counters of one export since the server started, kept across
/// replacements of the export under the same name.
#[derive(Debug, Default)]
pub struct ExportCounters {
    /// Kept per thread slot: connections on several CPUs count every
    /// request without sharing a cache line.
    requests: PerSlot<RequestCounters>,
    /// Connections that entered transmission on this export.
    pub connections: AtomicU64,
    /// Connections open now.
    pub open_connections: AtomicU64,
    /// Clients refused by the allow list.
    pub refused: AtomicU64,
}

/// What the requests of one thread slot did.
#[derive(Debug, Default)]
pub struct RequestCounters {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub flushes: AtomicU64,
    pub trims: AtomicU64,
    pub zeroes: AtomicU64,
    pub block_status: AtomicU64,
    /// Requests answered with an error.
    pub errors: AtomicU64,
    /// Waits that let requests gather in the socket (`crate::gather`).
    pub gathered_waits: AtomicU64,
}

/// The counters of one export at one moment, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    pub name: String,
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub zeroes: u64,
    pub block_status: u64,
    pub errors: u64,
    pub connections: u64,
    pub open_connections: u64,
    pub refused: u64,
    pub gathered_waits: u64,
}

impl ExportCounters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The request counters of the calling thread's slot.
    pub(crate) fn requests(&self) -> &RequestCounters {
        self.requests.mine()
    }

    fn snapshot(&self, name: &str) -> ExportStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let sum = |of: fn(&RequestCounters) -> &AtomicU64| -> u64 {
            self.requests.iter().map(|r| get(of(r))).sum()
        };
        ExportStats {
            name: name.to_string(),
            reads: sum(|r| &r.reads),
            read_bytes: sum(|r| &r.read_bytes),
            writes: sum(|r| &r.writes),
            write_bytes: sum(|r| &r.write_bytes),
            flushes: sum(|r| &r.flushes),
            trims: sum(|r| &r.trims),
            zeroes: sum(|r| &r.zeroes),
            block_status: sum(|r| &r.block_status),
            errors: sum(|r| &r.errors),
            connections: get(&self.connections),
            open_connections: get(&self.open_connections),
            refused: get(&self.refused),
            gathered_waits: sum(|r| &r.gathered_waits),
        }
    }
}

/// An export as a connection holds it: the export and its counters.
#[derive(Clone)]
pub(crate) struct Served {
    pub name: String,
    pub export: Export,
    pub counters: Arc<ExportCounters>,
}

pub use export::DEFAULT_EXPORT;

/// The table of exports. Replacing it affects new negotiations only: a
/// connection in transmission keeps the export it negotiated.
#[derive(Default)]
pub(crate) struct ExportTable {
    exports: RwLock<Arc<BTreeMap<String, Export>>>,
    counters: RwLock<BTreeMap<String, Arc<ExportCounters>>>,
}

impl ExportTable {
    pub fn new(exports: BTreeMap<String, Export>) -> ExportTable {
        let t = ExportTable::default();
        t.replace(exports);
        t
    }

    pub fn replace(&self, exports: BTreeMap<String, Export>) {
        let mut counters = self.counters.write();
        for name in exports.keys() {
            counters.entry(name.clone()).or_default();
        }
        *self.exports.write() = Arc::new(exports);
    }

    /// The export a client names; "" is the one named `default`.
    pub fn find(&self, name: &str) -> Option<Served> {
        let name = if name.is_empty() {
            DEFAULT_EXPORT
        } else {
            name
        };
        let export = self.exports.read().get(name)?.clone();
        let counters = self.counters.read().get(name)?.clone();
        Some(Served {
            name: name.to_string(),
            export,
            counters,
        })
    }

    pub fn list(&self) -> Arc<BTreeMap<String, Export>> {
        self.exports.read().clone()
    }

    /// Counters of every export offered now.
    pub fn stats(&self) -> Vec<ExportStats> {
        let exports = self.list();
        let counters = self.counters.read();
        exports
            .keys()
            .filter_map(|n| counters.get(n).map(|c| c.snapshot(n)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::MemDevice;

    #[test]
    fn counters_survive_a_replacement_and_default_resolves() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 20));
        let table = ExportTable::new(BTreeMap::from([(
            DEFAULT_EXPORT.to_string(),
            Export::new(dev.clone()),
        )]));
        let served = table.find("").expect("the default export");
        ExportCounters::add(&served.counters.requests().reads, 3);
        table.replace(BTreeMap::from([
            (DEFAULT_EXPORT.to_string(), Export::new(dev.clone())),
            ("other".to_string(), Export::new(dev)),
        ]));
        let stats = table.stats();
        assert_eq!(stats.len(), 2);
        assert_eq!(stats.iter().find(|s| s.name == "default").unwrap().reads, 3);
        table.replace(BTreeMap::new());
        assert!(table.find("other").is_none());
        assert!(table.stats().is_empty());
    }
}
