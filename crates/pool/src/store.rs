//! The metadata store: volumes, their unit mappings and the reference count
//! of every used physical unit, in redb tables. redb commits are atomic and
//! durable (copy-on-write B-trees with a checksummed commit slot), so after
//! a crash the store holds exactly the last committed transaction.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;

use block::BlockDevice;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::backend::DeviceBackend;
use crate::record::VolumeRecord;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Device index -> data units on it.
const DEVICES: TableDefinition<u64, u64> = TableDefinition::new("devices");
const VOLUMES: TableDefinition<u64, &[u8]> = TableDefinition::new("volumes");
/// (volume id, virtual unit) -> physical unit.
const MAP: TableDefinition<(u64, u64), u64> = TableDefinition::new("map");
/// Physical unit -> reference count; units absent here are free.
const REFS: TableDefinition<u64, u32> = TableDefinition::new("refs");

const FORMAT_VERSION: u64 = 1;

pub fn db_err(e: impl Into<redb::Error>) -> io::Error {
    io::Error::other(format!("pool metadata: {}", e.into()))
}

/// The pool-wide facts fixed at creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolMeta {
    pub pool_id: u128,
    pub unit_size: u64,
    /// Data units per device, in device order.
    pub devices: Vec<u64>,
}

/// Everything the store holds, as read at open or by `check`.
pub struct Loaded {
    pub meta: PoolMeta,
    pub next_volume_id: u64,
    pub volumes: BTreeMap<u64, (VolumeRecord, BTreeMap<u64, u64>)>,
    pub refs: BTreeMap<u64, u32>,
}

/// Changes since the last commit, with reference counts as they were when
/// the changes were taken.
#[derive(Default)]
pub struct Delta {
    pub maps: BTreeMap<(u64, u64), Option<u64>>,
    pub refs: BTreeMap<u64, u32>,
    pub volumes: BTreeMap<u64, Option<VolumeRecord>>,
    pub next_volume_id: u64,
    /// Units whose count dropped to zero; reusable once this commits.
    pub freed: Vec<u64>,
}

impl Delta {
    /// Whether committing would change nothing but the volume id counter,
    /// which only volume operations (always committed) advance.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
            && self.refs.is_empty()
            && self.volumes.is_empty()
            && self.freed.is_empty()
    }
}

pub struct Store {
    db: Database,
}

impl Store {
    /// Opens an existing store.
    pub fn open_file(path: &Path) -> io::Result<Store> {
        let db = Database::builder().open(path).map_err(db_err)?;
        Ok(Store { db })
    }

    /// Creates (or opens an empty) store file.
    pub fn create_file(path: &Path) -> io::Result<Store> {
        let db = Database::builder().create(path).map_err(db_err)?;
        Ok(Store { db })
    }

    pub fn on_device(device: Arc<dyn BlockDevice>) -> io::Result<Store> {
        let backend = DeviceBackend::new(device)?;
        let db = Database::builder()
            .create_with_backend(backend)
            .map_err(db_err)?;
        Ok(Store { db })
    }

    /// Whether a pool was ever initialised in this store.
    pub fn is_initialised(&self) -> io::Result<bool> {
        let txn = self.db.begin_read().map_err(db_err)?;
        match txn.open_table(META) {
            Ok(t) => Ok(t.get("unit_size").map_err(db_err)?.is_some()),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
            Err(e) => Err(db_err(e)),
        }
    }

    pub fn initialise(&self, meta: &PoolMeta) -> io::Result<()> {
        let txn = self.db.begin_write().map_err(db_err)?;
        {
            let mut t = txn.open_table(META).map_err(db_err)?;
            t.insert("format", FORMAT_VERSION).map_err(db_err)?;
            t.insert("unit_size", meta.unit_size).map_err(db_err)?;
            t.insert("pool_id_hi", (meta.pool_id >> 64) as u64)
                .map_err(db_err)?;
            t.insert("pool_id_lo", meta.pool_id as u64)
                .map_err(db_err)?;
            t.insert("next_volume_id", 1).map_err(db_err)?;
            let mut d = txn.open_table(DEVICES).map_err(db_err)?;
            for (i, units) in meta.devices.iter().enumerate() {
                d.insert(i as u64, *units).map_err(db_err)?;
            }
            txn.open_table(VOLUMES).map_err(db_err)?;
            txn.open_table(MAP).map_err(db_err)?;
            txn.open_table(REFS).map_err(db_err)?;
        }
        txn.commit().map_err(db_err)
    }

    pub fn load(&self) -> io::Result<Loaded> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let meta_t = txn.open_table(META).map_err(db_err)?;
        let get = |key: &str| -> io::Result<u64> {
            meta_t
                .get(key)
                .map_err(db_err)?
                .map(|v| v.value())
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("pool metadata lacks {key}"),
                    )
                })
        };
        if get("format")? != FORMAT_VERSION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "unknown pool metadata format",
            ));
        }
        let pool_id = ((get("pool_id_hi")? as u128) << 64) | get("pool_id_lo")? as u128;
        let unit_size = get("unit_size")?;
        let next_volume_id = get("next_volume_id")?;
        let mut devices = Vec::new();
        for row in txn
            .open_table(DEVICES)
            .map_err(db_err)?
            .iter()
            .map_err(db_err)?
        {
            let (_, units) = row.map_err(db_err)?;
            devices.push(units.value());
        }
        let mut volumes = BTreeMap::new();
        for row in txn
            .open_table(VOLUMES)
            .map_err(db_err)?
            .iter()
            .map_err(db_err)?
        {
            let (id, rec) = row.map_err(db_err)?;
            let rec = VolumeRecord::decode(rec.value())?;
            volumes.insert(id.value(), (rec, BTreeMap::new()));
        }
        for row in txn
            .open_table(MAP)
            .map_err(db_err)?
            .iter()
            .map_err(db_err)?
        {
            let (key, unit) = row.map_err(db_err)?;
            let (vol, vunit) = key.value();
            let entry = volumes.get_mut(&vol).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("mapping of unknown volume {vol}"),
                )
            })?;
            entry.1.insert(vunit, unit.value());
        }
        let mut refs = BTreeMap::new();
        for row in txn
            .open_table(REFS)
            .map_err(db_err)?
            .iter()
            .map_err(db_err)?
        {
            let (unit, count) = row.map_err(db_err)?;
            refs.insert(unit.value(), count.value());
        }
        Ok(Loaded {
            meta: PoolMeta {
                pool_id,
                unit_size,
                devices,
            },
            next_volume_id,
            volumes,
            refs,
        })
    }

    /// Applies `delta` in one durable transaction.
    pub fn apply(&self, delta: &Delta) -> io::Result<()> {
        let txn = self.db.begin_write().map_err(db_err)?;
        {
            let mut meta = txn.open_table(META).map_err(db_err)?;
            meta.insert("next_volume_id", delta.next_volume_id)
                .map_err(db_err)?;
            let mut map = txn.open_table(MAP).map_err(db_err)?;
            for (&key, unit) in &delta.maps {
                match unit {
                    Some(u) => map.insert(key, *u).map_err(db_err)?,
                    None => map.remove(key).map_err(db_err)?,
                };
            }
            let mut vols = txn.open_table(VOLUMES).map_err(db_err)?;
            for (&id, rec) in &delta.volumes {
                match rec {
                    Some(r) => {
                        vols.insert(id, r.encode().as_slice()).map_err(db_err)?;
                    }
                    None => {
                        vols.remove(id).map_err(db_err)?;
                        map.retain_in((id, 0)..=(id, u64::MAX), |_, _| false)
                            .map_err(db_err)?;
                    }
                }
            }
            let mut refs = txn.open_table(REFS).map_err(db_err)?;
            for (&unit, &count) in &delta.refs {
                if count == 0 {
                    refs.remove(unit).map_err(db_err)?;
                } else {
                    refs.insert(unit, count).map_err(db_err)?;
                }
            }
        }
        txn.commit().map_err(db_err)
    }
}
