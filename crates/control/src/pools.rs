//! Opens the storage pools a configuration uses, and their volumes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use block::{BlockDevice, FileDevice, FileOptions};
use pool::{MetadataLocation, Pool};

use crate::error::Issue;
use crate::model::{Config, Device, PoolConfig};

/// Opens (creating on first use) every pool that a used volume device is
/// in. A pool's problems are reported against its `[[pool]]` table.
pub fn open_pools(
    config: &Config,
    used: &BTreeSet<&str>,
) -> (HashMap<String, Arc<Pool>>, Vec<Issue>) {
    let wanted: BTreeSet<&str> = config
        .devices
        .iter()
        .filter(|d| used.contains(d.name.as_str()))
        .filter_map(|d| d.pool.as_deref())
        .collect();
    let mut pools = HashMap::new();
    let mut issues = Vec::new();
    for (i, p) in config.pools.iter().enumerate() {
        if !wanted.contains(p.name.as_str()) {
            continue;
        }
        match open_pool(p) {
            Ok(pool) => {
                let space = pool.space();
                tracing::info!(pool = %p.name, size = space.size(), used = space.used(), "opened pool");
                pools.insert(p.name.clone(), pool);
            }
            Err(e) => issues.push(Issue {
                location: p.at,
                field: format!("pool[{i}]"),
                reason: e.to_string(),
            }),
        }
    }
    (pools, issues)
}

/// Pools open in this process, by metadata path: a live configuration
/// change or a second device on the same pool gets the pool already open
/// (its metadata admits one opener), and a pool no device uses any more
/// closes.
static OPEN: Mutex<BTreeMap<PathBuf, Weak<Pool>>> = Mutex::new(BTreeMap::new());

/// The pool `p` describes: the one already open in this process, else
/// opened (or created on first use).
pub fn open_pool(p: &PoolConfig) -> io::Result<Arc<Pool>> {
    let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    open.retain(|_, pool| pool.strong_count() > 0);
    if let Some(pool) = open.get(&p.metadata).and_then(Weak::upgrade) {
        set_limits(&pool, p);
        return Ok(pool);
    }
    let pool = open_pool_files(p)?;
    set_limits(&pool, p);
    open.insert(p.metadata.clone(), Arc::downgrade(&pool));
    Ok(pool)
}

/// Every pool open in this process.
pub fn open_pools_now() -> Vec<Arc<Pool>> {
    let open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    open.values().filter_map(Weak::upgrade).collect()
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

fn open_pool_files(p: &PoolConfig) -> io::Result<Arc<Pool>> {
    let mut devices: Vec<Arc<dyn BlockDevice>> = Vec::new();
    for path in &p.devices {
        let opts = FileOptions {
            direct: false,
            read_only: false,
            create_size: p.device_size,
        };
        let dev = FileDevice::open(path, opts)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        devices.push(Arc::new(dev));
    }
    let meta = MetadataLocation::File(p.metadata.clone());
    Pool::open_or_create(&p.name, devices, &meta, p.unit_size)
}

/// The volume of a `volume` device, created with the device's size when
/// missing and grown to it when smaller.
pub fn open_volume(
    pools: &HashMap<String, Arc<Pool>>,
    dev: &Device,
) -> io::Result<Arc<dyn BlockDevice>> {
    let missing = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
    let pool = dev
        .pool
        .as_deref()
        .and_then(|p| pools.get(p))
        .ok_or_else(|| missing("the pool is not open"))?;
    let name = dev.volume.as_deref().unwrap_or(&dev.name);
    match pool.volume_info(name) {
        Ok(info) => {
            if let Some(size) = dev.size.filter(|&s| s > info.size) {
                pool.resize(name, size)?;
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let size = dev.size.ok_or_else(|| {
                missing(&format!(
                    "volume {name} does not exist yet: give `size` to create it"
                ))
            })?;
            pool.create_volume(name, size)?;
        }
        Err(e) => return Err(e),
    }
    Ok(Arc::new(pool.volume(name)?))
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
        let pool = super::open_pool(&cfg.pools[0]).unwrap();
        assert_eq!(pool.volume_info("thin0").unwrap().size, 2 << 30);
        assert!(pool.check().unwrap().is_clean());
    }

    #[test]
    fn a_pool_open_in_this_process_is_shared_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = parse_config(&config(dir.path(), "size = \"1G\""), "t.toml").unwrap();
        let a = super::open_pool(&cfg.pools[0]).unwrap();
        let b = super::open_pool(&cfg.pools[0]).unwrap();
        assert!(std::sync::Arc::ptr_eq(&a, &b));
        // A runtime built meanwhile uses the same pool.
        let rt = build(&cfg).unwrap();
        assert!(a.volume_info("thin0").is_ok());
        drop((a, b, rt));
        let c = super::open_pool(&cfg.pools[0]).unwrap();
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
            err.contains("device[1].pool: only `volume` devices"),
            "{err}"
        );
        let text = "[[pool]]\nname = \"p\"\ndevices = []\nunit_size = \"3K\"\n";
        let err = parse_config(text, "t.toml").unwrap_err().to_string();
        assert!(err.contains("pool[0].devices"), "{err}");
        assert!(err.contains("pool[0].unit_size"), "{err}");
    }
}
