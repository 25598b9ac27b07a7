//! Subsystems as served: the configuration's namespaces resolved to the
//! [`export::Backing`] of each configured device, which every transport
//! of that device shares (one range lock, one write-cache policy).

use std::collections::BTreeMap;
use std::sync::Arc;

use export::{Backing, NamespaceIds};

use crate::auth::HostKeys;
use crate::config::{glob, Config, DISCOVERY_NQN};

/// A namespace: a device under a block size.
pub struct Namespace {
    pub backing: Arc<Backing>,
    pub block_size: u32,
    pub ids: NamespaceIds,
}

impl Namespace {
    /// Size in logical blocks.
    pub fn blocks(&self) -> u64 {
        self.backing.device().size() / u64::from(self.block_size)
    }

    /// Whether `other` is this namespace unchanged (same device, format
    /// and identity): a host need not be told of it.
    pub fn same_as(&self, other: &Namespace) -> bool {
        Arc::ptr_eq(&self.backing, &other.backing)
            && self.block_size == other.block_size
            && self.blocks() == other.blocks()
            && self.ids == other.ids
    }
}

pub struct Subsystem {
    pub nqn: String,
    pub allow_hosts: Vec<String>,
    pub namespaces: BTreeMap<u32, Arc<Namespace>>,
    /// Hosts that must authenticate, with their secrets; `None` when a
    /// secret could not be read (the host is then refused).
    pub hosts: BTreeMap<String, Option<Arc<HostKeys>>>,
}

impl Subsystem {
    pub fn admits(&self, host_nqn: &str) -> bool {
        self.allow_hosts.iter().any(|p| glob(p, host_nqn))
            && !matches!(self.hosts.get(host_nqn), Some(None))
    }

    /// The secrets host `host_nqn` must prove it knows, if any.
    pub fn keys(&self, host_nqn: &str) -> Option<Arc<HostKeys>> {
        self.hosts.get(host_nqn).cloned().flatten()
    }

    /// The discovery subsystem, which every host may reach.
    pub fn discovery() -> Subsystem {
        Subsystem {
            nqn: DISCOVERY_NQN.into(),
            allow_hosts: vec!["*".into()],
            namespaces: BTreeMap::new(),
            hosts: BTreeMap::new(),
        }
    }

    /// The serial number controllers of the subsystem report: stable, and
    /// the same for every controller of it (Base 2.0, 5.17.2.1).
    pub fn serial(&self) -> String {
        let naa = export::naa_from_seed(&format!("nvmf/{}", self.nqn));
        naa[8..]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()[..16]
            .to_string()
    }
}

/// The subsystems by NQN.
pub type Table = BTreeMap<String, Arc<Subsystem>>;

/// The subsystems of `config` over `devices` (every served device by its
/// configured name). A namespace whose device is not among them is left
/// out, and said so.
pub fn resolve(config: &Config, devices: &BTreeMap<String, Arc<Backing>>) -> Table {
    let mut table = Table::new();
    for s in &config.subsystems {
        let mut namespaces = BTreeMap::new();
        for n in &s.namespaces {
            let Some(backing) = devices.get(&n.device) else {
                tracing::error!(subsystem = %s.nqn, nsid = n.nsid, device = %n.device,
                    "nvmf: namespace not served: its device is not open");
                continue;
            };
            let ns = Namespace {
                backing: backing.clone(),
                block_size: n.block_size,
                ids: backing.namespace_ids(&n.device),
            };
            namespaces.insert(n.nsid, Arc::new(ns));
        }
        let hosts = s
            .hosts
            .iter()
            .map(|h| {
                let keys = HostKeys::read(h).map_err(|why| {
                    tracing::error!(subsystem = %s.nqn, host = %h.nqn,
                        "nvmf: host refused: its DH-HMAC-CHAP secret cannot be used: {why}");
                });
                (h.nqn.clone(), keys.ok().map(Arc::new))
            })
            .collect();
        let sub = Subsystem {
            nqn: s.nqn.clone(),
            allow_hosts: s.allow_hosts.clone(),
            namespaces,
            hosts,
        };
        table.insert(s.nqn.clone(), Arc::new(sub));
    }
    table
}

/// The namespace ids that differ between `old` and `new` (added,
/// removed or changed).
pub fn changed_namespaces(old: &Subsystem, new: &Subsystem) -> Vec<u32> {
    let mut ids: Vec<u32> = old
        .namespaces
        .keys()
        .chain(new.namespaces.keys())
        .copied()
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids.retain(
        |id| match (old.namespaces.get(id), new.namespaces.get(id)) {
            (Some(a), Some(b)) => !a.same_as(b),
            _ => true,
        },
    );
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{NamespaceConfig, SubsystemConfig};
    use block::MemDevice;

    fn config(namespaces: &[(u32, &str)]) -> Config {
        Config {
            listen: vec![],
            discovery_listen: vec![],
            subsystems: vec![SubsystemConfig {
                nqn: "nqn.2026-11.org.openarray:a".into(),
                allow_hosts: vec!["nqn.2026-11.org.host:*".into()],
                hosts: vec![],
                namespaces: namespaces
                    .iter()
                    .map(|(nsid, device)| NamespaceConfig {
                        nsid: *nsid,
                        device: device.to_string(),
                        block_size: 512,
                    })
                    .collect(),
            }],
        }
    }

    #[test]
    fn namespaces_resolve_to_the_shared_backing_and_its_identity() {
        let a = Backing::new(Arc::new(MemDevice::new(1 << 20)), true);
        let b = Backing::new(Arc::new(MemDevice::new(1 << 20)), true);
        b.set_naa(export::naa_from_seed("the unit's own"));
        let devices = BTreeMap::from([("a".to_string(), a.clone()), ("b".to_string(), b.clone())]);
        let t = resolve(&config(&[(1, "a"), (2, "b"), (3, "gone")]), &devices);
        let s = &t["nqn.2026-11.org.openarray:a"];
        assert_eq!(s.namespaces.len(), 2, "the unopened device is left out");
        assert!(Arc::ptr_eq(&s.namespaces[&1].backing, &a));
        assert_eq!(
            s.namespaces[&1].ids,
            NamespaceIds::from_naa(export::naa_from_seed("a"))
        );
        assert_eq!(
            s.namespaces[&2].ids.nguid,
            export::naa_from_seed("the unit's own")
        );
        assert_eq!(s.namespaces[&1].blocks(), 2048);
        assert!(s.admits("nqn.2026-11.org.host:x") && !s.admits("nqn.2026-11.org.other:x"));
        assert_eq!(s.serial().len(), 16);

        let t2 = resolve(&config(&[(1, "a"), (2, "a"), (4, "b")]), &devices);
        assert_eq!(
            changed_namespaces(s, &t2["nqn.2026-11.org.openarray:a"]),
            vec![2, 4]
        );
    }
}
