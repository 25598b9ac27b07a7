//! `kind = "volume"`: a thin volume of a `[[pool]]`, created with `size`
//! when missing and grown to it when smaller.

use std::io;
use std::sync::Arc;

use block::BlockDevice;

use super::{Change, DeviceSpec, Fields, Kind, OpenContext};
use crate::render;

pub const KIND: Kind = Kind {
    name: "volume",
    fields: &["pool", "volume", "size"],
    parse,
    api: None,
    files: &[],
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeSpec {
    pub pool: String,
    /// The volume's name in the pool.
    pub volume: String,
    /// Create the volume with this size, or grow it to it.
    pub size: Option<u64>,
}

fn parse(f: &mut Fields<'_>) -> Option<Arc<dyn DeviceSpec>> {
    f.needs("pool", "the `[[pool]]` holding it");
    let pool = f.pool("pool");
    let volume = f.volume_name("volume");
    let size = f.size("size");
    Some(Arc::new(VolumeSpec {
        pool: pool?,
        volume: volume?,
        size,
    }))
}

impl DeviceSpec for VolumeSpec {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn pool(&self) -> Option<&str> {
        Some(&self.pool)
    }

    fn size(&self) -> Option<u64> {
        self.size
    }

    fn open(&self, ctx: &OpenContext<'_>) -> io::Result<Arc<dyn BlockDevice>> {
        let pool = ctx.pool(&self.pool)?;
        let name = self.volume.as_str();
        match pool.volume_info(name) {
            Ok(info) => {
                if let Some(size) = self.size.filter(|&s| s > info.size) {
                    pool.resize(name, size)?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let size = self.size.ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("volume {name} does not exist yet: give `size` to create it"),
                    )
                })?;
                pool.create_volume(name, size)?;
            }
            Err(e) => return Err(e),
        }
        Ok(Arc::new(pool.volume(name)?))
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("pool", self.pool.clone()),
            ("volume", self.volume.clone()),
            ("size", self.size.map_or(render::UNSET.into(), render::size)),
        ]
    }

    fn replaces_data(&self, change: &Change<'_>) -> Option<(&'static str, String)> {
        let new = change.new_as::<VolumeSpec>()?;
        let key = if !change.same_pool {
            "pool"
        } else if new.volume != self.volume {
            "volume"
        } else {
            return None;
        };
        let what = format!(
            "`{}` would serve another volume: {}",
            change.name,
            self.holds()
        );
        Some((key, what))
    }

    fn holds(&self) -> String {
        format!(
            "volume {} of pool {} is no longer served (it stays in the pool)",
            self.volume, self.pool
        )
    }
}
