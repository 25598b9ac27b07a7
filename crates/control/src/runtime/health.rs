//! What is wrong with the devices being served, for `openarray status`.

use block::FileDevice;

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
}

impl Runtime {
    /// Every open device, by name. A file device whose path no longer
    /// names the file it has open (deleted or replaced) is a problem: its
    /// LUN still works, on a file nothing finds again after a restart.
    pub fn device_health(&self) -> Vec<DeviceHealth> {
        let mut all: Vec<DeviceHealth> = self
            .live
            .devices
            .iter()
            .map(|(name, (dev, device, _))| {
                let file = device
                    .as_any()
                    .and_then(|any| any.downcast_ref::<FileDevice>());
                let problem = file.and_then(|f| match f.path_names_it() {
                    Ok(true) => None,
                    Ok(false) => Some(format!(
                        "{} was removed or replaced: I/O goes to the file opened at start, \
                         which is lost when the daemon stops",
                        f.path().display()
                    )),
                    Err(e) => Some(format!("cannot check {}: {e}", f.path().display())),
                });
                DeviceHealth {
                    name: name.clone(),
                    kind: dev.kind(),
                    pool: dev.spec.pool().map(String::from),
                    problem,
                }
            })
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }
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
