//! Where the entries live: one [`TargetStats`] per target name, each a
//! sharded map from (LUN, initiator) to its counters.
//!
//! The registry outlives configuration changes (the daemon keeps one), so
//! counters of a LUN that stays keep counting when the SCSI views are
//! rebuilt. Entries are created on a LUN's first command from an initiator
//! and kept; their number is bounded, since initiator names come from the
//! network: beyond [`MAX_ENTRIES`] per target, newcomers share one entry
//! per LUN under the initiator name [`OVERFLOW_INITIATOR`].

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::counters::{EntrySnapshot, LunStats};
use crate::samples::{Sample, SampleSource};

/// Shards per target: commands of LUNs in different shards never touch
/// the same lock word.
const SHARDS: usize = 16;
/// Entries per target before newcomers are folded together. An entry's
/// latency histograms take some kilobytes, and initiator names are chosen
/// by whoever connects, so this bounds what a stream of made-up names can
/// make the daemon hold (a few MiB per target) while leaving room for far
/// more hosts than a target is shared with in practice.
pub const MAX_ENTRIES: usize = 1024;
/// The initiator name of the shared entries beyond [`MAX_ENTRIES`].
pub const OVERFLOW_INITIATOR: &str = "(other initiators)";

/// Every command looks its entry up, by LUN and initiator name: a fast
/// hash (SipHash of the name was 2 % of the target's CPU in 4K reads). The
/// names come from whoever logs in, but [`MAX_ENTRIES`] bounds what
/// colliding ones could cost.
type Fast = foldhash::fast::RandomState;
type Shard = RwLock<HashMap<u64, HashMap<Arc<str>, Arc<LunStats>, Fast>, Fast>>;

/// The entries of one target.
pub struct TargetStats {
    name: Arc<str>,
    shards: Box<[Shard]>,
    entries: AtomicUsize,
}

impl std::fmt::Debug for TargetStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetStats")
            .field("name", &self.name)
            .field("entries", &self.entries.load(Ordering::Relaxed))
            .finish()
    }
}

impl TargetStats {
    fn new(name: &str) -> Self {
        TargetStats {
            name: name.into(),
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            entries: AtomicUsize::new(0),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn shard(&self, lun: u64) -> &Shard {
        &self.shards[(lun % SHARDS as u64) as usize]
    }

    /// The counters of `lun` as used by `initiator`, created on first use.
    pub fn entry(&self, lun: u64, initiator: &Arc<str>) -> Arc<LunStats> {
        let shard = self.shard(lun);
        {
            let map = shard.read();
            if let Some(by_initiator) = map.get(&lun) {
                if let Some(found) = by_initiator.get(&**initiator) {
                    return found.clone();
                }
                // Past the bound, an unknown initiator is one of the overflow.
                if self.entries.load(Ordering::Relaxed) >= MAX_ENTRIES {
                    if let Some(found) = by_initiator.get(OVERFLOW_INITIATOR) {
                        return found.clone();
                    }
                }
            }
        }
        let mut map = shard.write();
        let by_initiator = map.entry(lun).or_default();
        if let Some(found) = by_initiator.get(&**initiator) {
            return found.clone();
        }
        let key: Arc<str> = if self.entries.load(Ordering::Relaxed) < MAX_ENTRIES {
            initiator.clone()
        } else {
            OVERFLOW_INITIATOR.into()
        };
        by_initiator
            .entry(key)
            .or_insert_with(|| {
                self.entries.fetch_add(1, Ordering::Relaxed);
                Arc::default()
            })
            .clone()
    }

    fn snapshot(&self, out: &mut Vec<EntrySnapshot>) {
        for shard in self.shards.iter() {
            for (&lun, by_initiator) in shard.read().iter() {
                for (initiator, stats) in by_initiator {
                    out.push(stats.snapshot(&self.name, lun, initiator));
                }
            }
        }
    }
}

/// Every target's entries; one per daemon.
#[derive(Debug, Default)]
pub struct Registry {
    /// By target name in lower case (iSCSI names compare without case).
    targets: Mutex<BTreeMap<String, Arc<TargetStats>>>,
    /// Numbers other parts of the daemon report at every scrape.
    sources: Mutex<Vec<Arc<dyn SampleSource>>>,
    /// Failed login authentications, counted by the transport.
    auth_failures: Arc<AtomicU64>,
}

impl Registry {
    pub fn new() -> Arc<Registry> {
        Arc::default()
    }

    /// The entries of target `name`, created on first use. Called when a
    /// target's objects are built, not per command.
    pub fn target(&self, name: &str) -> Arc<TargetStats> {
        self.targets
            .lock()
            .entry(name.to_ascii_lowercase())
            .or_insert_with(|| Arc::new(TargetStats::new(name)))
            .clone()
    }

    /// Report `source`'s samples at every scrape from now on.
    pub fn add_source(&self, source: Arc<dyn SampleSource>) {
        self.sources.lock().push(source);
    }

    /// The samples of every source added.
    pub fn samples(&self) -> Vec<Sample> {
        let sources = self.sources.lock().clone();
        sources.iter().flat_map(|s| s.samples()).collect()
    }

    /// The counter of failed login authentications, for the transport
    /// to count into (shared, so it outlives configuration changes).
    pub fn auth_failures_counter(&self) -> Arc<AtomicU64> {
        self.auth_failures.clone()
    }

    /// Failed login authentications since start.
    pub fn auth_failures(&self) -> u64 {
        self.auth_failures.load(Ordering::Relaxed)
    }

    /// Every entry, ordered by target, LUN and initiator.
    pub fn snapshot(&self) -> Vec<EntrySnapshot> {
        let targets: Vec<Arc<TargetStats>> = self.targets.lock().values().cloned().collect();
        let mut out = Vec::new();
        for t in targets {
            t.snapshot(&mut out);
        }
        out.sort_by(|a, b| {
            (a.target.as_str(), a.lun, a.initiator.as_str()).cmp(&(
                b.target.as_str(),
                b.lun,
                b.initiator.as_str(),
            ))
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OpKind;

    #[test]
    fn entries_are_per_lun_and_initiator() {
        let reg = Registry::new();
        let t = reg.target("iqn.x:T");
        let a: Arc<str> = "iqn.a".into();
        let b: Arc<str> = "iqn.b".into();
        assert!(Arc::ptr_eq(&t.entry(1, &a), &t.entry(1, &a)));
        assert!(!Arc::ptr_eq(&t.entry(1, &a), &t.entry(1, &b)));
        assert!(!Arc::ptr_eq(&t.entry(1, &a), &t.entry(17, &a)));
        // The same target under another case is the same entries.
        assert!(Arc::ptr_eq(&reg.target("IQN.X:t"), &t));
        let e = t.entry(17, &b);
        e.begin();
        e.end(OpKind::Read, 8, 1, true);
        let snap = reg.snapshot();
        let keys: Vec<_> = snap
            .iter()
            .map(|e| (e.lun, e.initiator.as_str(), e.read.commands))
            .collect();
        assert_eq!(
            keys,
            vec![
                (1, "iqn.a", 0),
                (1, "iqn.b", 0),
                (17, "iqn.a", 0),
                (17, "iqn.b", 1)
            ]
        );
        assert!(snap.iter().all(|e| e.target == "iqn.x:T"));
    }

    #[test]
    fn newcomers_beyond_the_bound_share_an_entry() {
        let reg = Registry::new();
        let t = reg.target("t");
        for i in 0..MAX_ENTRIES {
            t.entry(0, &Arc::from(format!("iqn.{i}").as_str()));
        }
        let late1 = t.entry(0, &Arc::from("iqn.late1"));
        let late2 = t.entry(5, &Arc::from("iqn.late2"));
        let late3 = t.entry(0, &Arc::from("iqn.late3"));
        assert!(Arc::ptr_eq(&late1, &late3));
        assert!(!Arc::ptr_eq(&late1, &late2));
        let snap = reg.snapshot();
        assert_eq!(snap.len(), MAX_ENTRIES + 2);
        assert_eq!(
            snap.iter()
                .filter(|e| e.initiator == OVERFLOW_INITIATOR)
                .count(),
            2
        );
    }
}
