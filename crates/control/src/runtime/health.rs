//! What is wrong with the devices being served, for `openarray status`.

use super::Runtime;

/// A device the running configuration has open, and its problem if it
/// has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceHealth {
    pub name: String,
    pub kind: &'static str,
    /// For a volume device, its pool.
    pub pool: Option<String>,
    pub problem: Option<String>,
    /// The problem makes some of its data unreadable.
    pub failed: bool,
    /// The configured devices it is built on.
    pub children: Vec<String>,
}

impl Runtime {
    /// Every open device, by name, with the verdict its kind gives.
    pub fn device_health(&self) -> Vec<DeviceHealth> {
        // Every node, not only those served: a RAID under a pool or a
        // cache has a health of its own.
        let mut all: Vec<DeviceHealth> = self
            .live
            .nodes
            .iter()
            .map(|(name, node)| {
                let (dev, device) = (&node.settings, &node.device);
                let verdict = dev.spec.health(&**device);
                DeviceHealth {
                    name: name.clone(),
                    kind: dev.kind(),
                    pool: dev.spec.pool().map(String::from),
                    problem: verdict.problem().map(String::from),
                    failed: verdict.is_failed(),
                    children: dev.spec.children().into_iter().map(String::from).collect(),
                }
            })
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }
}

/// The problems of `name` and of every device under it, nearest first:
/// a LUN over a pool volume over a degraded RAID is degraded too.
pub fn problems_under<'a>(all: &'a [DeviceHealth], name: &str) -> Vec<&'a DeviceHealth> {
    let mut out = Vec::new();
    let mut queue = vec![name.to_string()];
    let mut seen = std::collections::HashSet::new();
    while let Some(n) = queue.pop() {
        if !seen.insert(n.clone()) {
            continue;
        }
        let Some(d) = all.iter().find(|d| d.name == n) else {
            continue;
        };
        if d.problem.is_some() {
            out.push(d);
        }
        queue.extend(d.children.iter().rev().cloned());
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::{build, parse_config};

    #[test]
    fn a_removed_file_is_a_problem_and_a_ram_disk_never_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.img");
        let text = format!(
            r#"
[[portal]]
listen = "127.0.0.1:3260"
[[device]]
name = "a"
kind = "file"
path = "{}"
size = "1M"
[[device]]
name = "m"
kind = "mem"
size = "1M"
[[target]]
name = "iqn.2026-11.org.test:h"
[[target.lun]]
lun = 0
device = "a"
[[target.lun]]
lun = 1
device = "m"
"#,
            path.display()
        );
        let runtime = build(&parse_config(&text, "t.toml").unwrap()).unwrap();
        let problems = |r: &crate::Runtime| -> Vec<(String, bool)> {
            r.device_health()
                .into_iter()
                .map(|d| (d.name, d.problem.is_some()))
                .collect()
        };
        assert_eq!(
            problems(&runtime),
            vec![("a".into(), false), ("m".into(), false)]
        );
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            problems(&runtime),
            vec![("a".into(), true), ("m".into(), false)]
        );
        // Another file at the same path is not the one served either.
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let health = runtime.device_health();
        let problem = health[0].problem.as_deref().unwrap();
        assert!(problem.contains("removed or replaced"), "{problem}");
    }
}
