//! An array whose members refused assembly (too few current, a stale
//! one where no force was asked): it stands in the device graph failed,
//! with the reason, so that the daemon serves everything else. Its LUNs
//! and exports answer NOT READY (ENXIO) until `openarray raid assemble
//! NAME [--force]` puts it together from the same members.

use std::io;
use std::sync::{Arc, Mutex, OnceLock};

use block::{Allocation, AtomicWrites, BlockDevice, Capabilities};
use raid::superblock::Superblock;
use raid::RaidArray;

use super::raid::{Assembly, RaidSpec};

type Named = (Arc<dyn BlockDevice>, String);

pub struct PendingArray {
    spec: RaidSpec,
    /// The configured members and spares, open, for the next try.
    named: Vec<Named>,
    /// The size the members' newest superblock gives the array.
    size: u64,
    /// Why the last assembly was refused.
    reason: Mutex<String>,
    array: OnceLock<Arc<RaidArray>>,
}

impl PendingArray {
    /// Stands in for the array `spec` over `named`, which refused to
    /// assemble for `reason`; `None` when the members give no geometry
    /// (no superblock readable): then the error is the configuration's.
    pub fn new(spec: &RaidSpec, named: &[Named], reason: String) -> Option<PendingArray> {
        let newest = named
            .iter()
            .filter_map(|(dev, _)| Superblock::read_from(&**dev).ok()?.ok()?)
            .filter(|sb| !sb.is_spare())
            .max_by_key(|sb| sb.events)?;
        Some(PendingArray {
            spec: spec.clone(),
            named: named.to_vec(),
            size: newest.geometry().size(),
            reason: Mutex::new(reason),
            array: OnceLock::new(),
        })
    }

    /// The array once `assemble` put it together.
    pub fn array(&self) -> Option<&RaidArray> {
        self.array.get().map(|a| &**a)
    }

    pub fn reason(&self) -> String {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Tries the assembly again (forced when `force`); the array, the
    /// device `name`, serves from then on, at the size its LUNs already
    /// have.
    pub fn assemble(&self, name: &str, force: bool) -> Result<&RaidArray, String> {
        if let Some(a) = self.array() {
            return Ok(a);
        }
        let spec = RaidSpec {
            assemble: if force {
                Assembly::Force
            } else {
                self.spec.assemble
            },
            ..self.spec.clone()
        };
        let array = match spec.open_array(&self.named) {
            Ok(a) => a,
            Err(e) => {
                *self.reason.lock().unwrap_or_else(|p| p.into_inner()) = e.to_string();
                return Err(e.to_string());
            }
        };
        if array.size() != self.size {
            return Err(format!(
                "the assembled array has {} bytes, not the {} its LUNs were given",
                array.size(),
                self.size
            ));
        }
        array.name_members(&self.named);
        let _ = self.array.set(Arc::new(array));
        tracing::info!(device = %name, "RAID array assembled");
        Ok(self.array().expect("just set"))
    }

    fn live(&self) -> io::Result<&RaidArray> {
        self.array()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENXIO))
    }
}

impl BlockDevice for PendingArray {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.live()?.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.live()?.write_at(buf, offset, fua)
    }

    fn flush(&self) -> io::Result<()> {
        self.live()?.flush()
    }

    fn atomic_writes(&self) -> Option<AtomicWrites> {
        self.array()?.atomic_writes()
    }

    fn write_atomic(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.live()?.write_atomic(buf, offset, fua)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.live()?.discard(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.live()?.write_zeroes(offset, len)
    }

    fn allocate_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.live()?.allocate_zeroes(offset, len)
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<(Allocation, u64)> {
        self.live()?.allocation(offset, len)
    }

    fn granularity(&self) -> u64 {
        self.array().map_or(0, |a| a.granularity())
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn capabilities(&self) -> Capabilities {
        match self.array() {
            Some(a) => a.capabilities(),
            None => Capabilities {
                volatile_cache: false,
                may_block: true,
                ..Capabilities::default()
            },
        }
    }

    fn describe(&self) -> String {
        match self.array() {
            Some(a) => a.describe(),
            None => format!("raid{}(not assembled)", self.spec.level),
        }
    }
}
