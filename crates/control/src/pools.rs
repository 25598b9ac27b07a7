//! Opens the storage pools a configuration uses.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use block::{BlockDevice, FileDevice, FileOptions};
use pool::{MetadataLocation, Pool};

use crate::model::{Config, PoolConfig, PoolMember};

/// Pools open in this process, by metadata path: a live configuration
/// change or a second device on the same pool gets the pool already open
/// (its metadata admits one opener), and a pool no device uses any more
/// closes.
static OPEN: Mutex<BTreeMap<PathBuf, Weak<Pool>>> = Mutex::new(BTreeMap::new());

/// The pool `p` of `config` describes: the one already open in this
/// process, else opened (or created on first use), with the configured
/// devices among its data devices opened afresh.
pub fn open_pool(config: &Config, p: &PoolConfig) -> io::Result<Arc<Pool>> {
    let opener = crate::runtime::Opener::new(config, None);
    let member = |name: &str| opener.open(name).map(|(device, _)| device);
    open_pool_with(p, &member)
}

/// Device `name` of `config` and everything under it, opened afresh (in
/// a process that is not serving it).
pub fn open_device(config: &Config, name: &str) -> io::Result<Arc<dyn BlockDevice>> {
    crate::runtime::Opener::new(config, None)
        .open(name)
        .map(|(device, _)| device)
}

/// The pool `p` describes, its configured data devices given by `member`.
pub(crate) fn open_pool_with(p: &PoolConfig, member: &Member<'_>) -> io::Result<Arc<Pool>> {
    let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    open.retain(|_, pool| pool.strong_count() > 0);
    if let Some(pool) = open.get(&p.metadata).and_then(Weak::upgrade) {
        set_limits(&pool, p);
        return Ok(pool);
    }
    let pool = open_pool_files(p, member)?;
    set_limits(&pool, p);
    open.insert(p.metadata.clone(), Arc::downgrade(&pool));
    Ok(pool)
}

/// Whether the pool `p` describes is open in this process.
pub(crate) fn is_open(p: &PoolConfig) -> bool {
    let open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    open.get(&p.metadata).is_some_and(|w| w.strong_count() > 0)
}

/// The pool `p` describes, when it is open in this process.
pub(crate) fn open_now(p: &PoolConfig) -> Option<Arc<Pool>> {
    let open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    open.get(&p.metadata).and_then(Weak::upgrade)
}

/// Gives the pools of `configs` that are open their configured limits,
/// which a running pool takes at once.
pub fn apply_limits(configs: &[PoolConfig]) {
    let open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    for p in configs {
        if let Some(pool) = open.get(&p.metadata).and_then(Weak::upgrade) {
            set_limits(&pool, p);
        }
    }
}

fn set_limits(pool: &Pool, p: &PoolConfig) {
    pool.set_soft_threshold(p.soft_threshold);
    pool.set_max_overcommit(p.max_overcommit.map(|h| f64::from(h) / 100.0));
}

/// Opens a configured device by name.
pub(crate) type Member<'a> = dyn Fn(&str) -> io::Result<Arc<dyn BlockDevice>> + 'a;

fn open_pool_files(p: &PoolConfig, member: &Member<'_>) -> io::Result<Arc<Pool>> {
    let mut devices: Vec<Arc<dyn BlockDevice>> = Vec::new();
    for m in &p.devices {
        let dev: Arc<dyn BlockDevice> =
            match m {
                PoolMember::Path(path) => {
                    let opts = FileOptions {
                        direct: false,
                        read_only: false,
                        create_size: p.device_size,
                    };
                    Arc::new(FileDevice::open(path, opts).map_err(|e| {
                        io::Error::new(e.kind(), format!("{}: {e}", path.display()))
                    })?)
                }
                PoolMember::Device(name) => member(name)
                    .map_err(|e| io::Error::new(e.kind(), format!("device `{name}`: {e}")))?,
            };
        devices.push(dev);
    }
    let meta = MetadataLocation::File(p.metadata.clone());
    Pool::open_or_create(&p.name, devices, &meta, p.unit_size)
}

#[cfg(test)]
mod tests {
    use crate::{build, parse_config};

    fn config(dir: &std::path::Path, volume_size: &str) -> String {
        format!(
            r#"
[[portal]]
listen = "127.0.0.1:3260"
[[pool]]
name = "tank"
devices = ["{dir}/tank0.img", "{dir}/tank1.img"]
device_size = "8M"
unit_size = "64K"
[[device]]
name = "thin0"
kind = "volume"
pool = "tank"
{volume_size}
[[target]]
name = "iqn.2026-11.org.example:thin"
[[target.lun]]
lun = 0
device = "thin0"
"#,
            dir = dir.display()
        )
    }

    #[test]
    fn a_volume_lun_creates_its_pool_and_volume_then_reopens_them() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = parse_config(&config(dir.path(), "size = \"1G\""), "t.toml").unwrap();
        assert_eq!(cfg.pools[0].metadata, dir.path().join("tank0.img.meta"));
        let rt = build(&cfg).unwrap();
        let (name, _) = rt.logical_units().next().unwrap();
        assert_eq!(name, "thin0");
        rt.flush_all().unwrap();
        drop(rt);
        assert!(dir.path().join("tank0.img.meta").exists());
        // Reopened: the volume exists, so no size is needed; a larger one grows it.
        let cfg = parse_config(&config(dir.path(), ""), "t.toml").unwrap();
        drop(build(&cfg).unwrap());
        let cfg = parse_config(&config(dir.path(), "size = \"2G\""), "t.toml").unwrap();
        drop(build(&cfg).unwrap());
        let pool = super::open_pool(&cfg, &cfg.pools[0]).unwrap();
        assert_eq!(pool.volume_info("thin0").unwrap().size, 2 << 30);
        assert!(pool.check().unwrap().is_clean());
    }

    #[test]
    fn a_pool_open_in_this_process_is_shared_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = parse_config(&config(dir.path(), "size = \"1G\""), "t.toml").unwrap();
        let a = super::open_pool(&cfg, &cfg.pools[0]).unwrap();
        let b = super::open_pool(&cfg, &cfg.pools[0]).unwrap();
        assert!(std::sync::Arc::ptr_eq(&a, &b));
        // A runtime built meanwhile uses the same pool.
        let rt = build(&cfg).unwrap();
        assert!(a.volume_info("thin0").is_ok());
        drop((a, b, rt));
        let c = super::open_pool(&cfg, &cfg.pools[0]).unwrap();
        assert!(c.volume_info("thin0").is_ok());
    }

    #[test]
    fn volume_devices_need_a_declared_pool() {
        let text = r#"
[[device]]
name = "v"
kind = "volume"
pool = "nope"
size = "1G"
[[device]]
name = "m"
kind = "mem"
pool = "tank"
"#;
        let err = parse_config(text, "t.toml").unwrap_err().to_string();
        assert!(
            err.contains("device[0].pool: no [[pool]] named `nope`"),
            "{err}"
        );
        assert!(
            err.contains("device[1].pool: only `volume`, `rbd` devices have `pool`"),
            "{err}"
        );
        let text = "[[pool]]\nname = \"p\"\ndevices = []\nunit_size = \"3K\"\n";
        let err = parse_config(text, "t.toml").unwrap_err().to_string();
        assert!(err.contains("pool[0].devices"), "{err}");
        assert!(err.contains("pool[0].unit_size"), "{err}");
    }
}
