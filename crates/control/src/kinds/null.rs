//! `kind = "null"`: reads zeroes and discards writes, for benchmarks of
//! everything but the disk.

use std::io;
use std::sync::Arc;

use block::{BlockDevice, NullDevice};

use super::{DeviceSpec, Fields, Kind, OpenContext};
use crate::render;

pub const KIND: Kind = Kind {
    name: "null",
    fields: &["size"],
    parse,
    api: None,
    files: &[],
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NullSpec {
    pub size: u64,
}

fn parse(f: &mut Fields<'_>) -> Option<Arc<dyn DeviceSpec>> {
    let size = f.size("size").unwrap_or(crate::DEFAULT_DEVICE_SIZE);
    Some(Arc::new(NullSpec { size }))
}

impl DeviceSpec for NullSpec {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn size(&self) -> Option<u64> {
        Some(self.size)
    }

    fn open(&self, _: &OpenContext<'_>) -> io::Result<Arc<dyn BlockDevice>> {
        Ok(Arc::new(NullDevice::new(self.size)))
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        vec![("size", render::size(self.size))]
    }

    fn holds_data(&self) -> bool {
        false
    }

    fn holds(&self) -> String {
        "nothing (a null device holds no data)".into()
    }
}
