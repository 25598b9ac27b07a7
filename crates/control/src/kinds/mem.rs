//! `kind = "mem"`: a RAM disk, empty at every start.

use std::io;
use std::sync::Arc;

use block::{BlockDevice, MemDevice};

use super::{Change, DeviceSpec, Fields, Kind, OpenContext};
use crate::render;

pub const KIND: Kind = Kind {
    name: "mem",
    fields: &["size"],
    parse,
    api: None,
    files: &[],
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemSpec {
    pub size: u64,
}

fn parse(f: &mut Fields<'_>) -> Option<Arc<dyn DeviceSpec>> {
    let size = f.size("size").unwrap_or(crate::DEFAULT_DEVICE_SIZE);
    Some(Arc::new(MemSpec { size }))
}

impl DeviceSpec for MemSpec {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn size(&self) -> Option<u64> {
        Some(self.size)
    }

    fn open(&self, _: &OpenContext<'_>) -> io::Result<Arc<dyn BlockDevice>> {
        Ok(Arc::new(MemDevice::new(self.size)))
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        vec![("size", render::size(self.size))]
    }

    fn replaces_data(&self, change: &Change<'_>) -> Option<(&'static str, String)> {
        let new = change.new_as::<MemSpec>()?;
        let name = change.name;
        if new.size != self.size {
            return Some((
                "size",
                format!(
                    "a RAM device cannot be resized in place: `{name}` is re-created empty with {} and {}",
                    render::size(new.size),
                    self.holds()
                ),
            ));
        }
        (change.old_block_size != change.new_block_size).then(|| {
            (
                "block_size",
                format!(
                    "RAM device `{name}` is re-created empty for {}-byte blocks (was {}) and {}",
                    change.new_block_size,
                    change.old_block_size,
                    self.holds()
                ),
            )
        })
    }

    fn holds(&self) -> String {
        format!("the {} of data it holds are lost", render::size(self.size))
    }

    fn lost_when_closed(&self) -> bool {
        true
    }

    fn block_size_is_data(&self) -> bool {
        true
    }
}
