//! `kind = "faulty"`: its `over` device with failures injected live
//! (`openarray device fault`), and a volatile write cache: writes no flush
//! has covered are held in memory, so `drop-unflushed` loses exactly what
//! a power cut would.

use std::io;
use std::sync::Arc;

use block::{BlockDevice, FaultyDevice};

use super::{Change, DeviceSpec, Fields, Kind, OpenContext};

pub const KIND: Kind = Kind {
    name: "faulty",
    fields: &["over"],
    parse,
    api: None,
    files: &[],
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultySpec {
    pub over: String,
}

fn parse(f: &mut Fields<'_>) -> Option<Arc<dyn DeviceSpec>> {
    f.needs("over", "the device it injects faults into");
    let over = f.device("over")?;
    Some(Arc::new(FaultySpec { over }))
}

impl DeviceSpec for FaultySpec {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn children(&self) -> Vec<&str> {
        vec![&self.over]
    }

    fn open(&self, ctx: &OpenContext<'_>) -> io::Result<Arc<dyn BlockDevice>> {
        Ok(Arc::new(FaultyDevice::new(ctx.child()?)))
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        vec![("over", self.over.clone())]
    }

    fn replaces_data(&self, change: &Change<'_>) -> Option<(&'static str, String)> {
        let new = change.new_as::<FaultySpec>()?;
        super::over_changed(change.name, &self.over, &new.over)
    }

    fn holds(&self) -> String {
        super::over_holds(&self.over)
    }

    fn state(&self, device: &dyn BlockDevice) -> Vec<(&'static str, String)> {
        let Some(faulty) = as_faulty(device) else {
            return Vec::new();
        };
        let (reads, writes) = faulty.failing();
        let failing = match (reads, writes) {
            (false, false) => "nothing",
            (true, false) => "reads",
            (false, true) => "writes",
            (true, true) => "reads and writes",
        };
        vec![
            ("failing", failing.to_string()),
            ("corrupt_ranges", faulty.corrupt_ranges().len().to_string()),
            ("unflushed_bytes", faulty.unflushed_bytes().to_string()),
        ]
    }
}

fn as_faulty(device: &dyn BlockDevice) -> Option<&FaultyDevice> {
    device.as_any()?.downcast_ref::<FaultyDevice>()
}

/// A fault injected into a `faulty` device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Fail reads, writes or both with an I/O error.
    Fail { reads: bool, writes: bool },
    /// Clear every failure and corruption.
    Heal,
    /// Make `len` bytes at `offset` read back inverted until rewritten.
    Corrupt { offset: u64, len: u64 },
    /// Lose every write no flush has covered, as a power cut would.
    DropUnflushed,
}

/// Injects `fault` into `device`, which must be a `faulty` device; says
/// what was done.
pub fn inject_fault(device: &dyn BlockDevice, fault: Fault) -> Result<String, String> {
    let faulty = as_faulty(device).ok_or("not a `faulty` device")?;
    Ok(match fault {
        Fault::Fail { reads, writes } => {
            faulty.set_fail_reads(reads);
            faulty.set_fail_writes(writes);
            match (reads, writes) {
                (true, true) => "reads and writes fail".into(),
                (true, false) => "reads fail".into(),
                (false, true) => "writes fail".into(),
                (false, false) => "nothing fails".into(),
            }
        }
        Fault::Heal => {
            faulty.heal();
            "healed: no failures, no corruption".into()
        }
        Fault::Corrupt { offset, len } => {
            let size = device.size();
            if offset.checked_add(len).is_none_or(|end| end > size) || len == 0 {
                return Err(format!(
                    "{len} bytes at {offset} are not within the device's {size} bytes"
                ));
            }
            faulty.corrupt(offset, len);
            format!("{len} bytes at offset {offset} read back corrupted")
        }
        Fault::DropUnflushed => {
            let lost = faulty.unflushed_bytes();
            faulty.drop_unflushed();
            format!("dropped {lost} unflushed bytes")
        }
    })
}
