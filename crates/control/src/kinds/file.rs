//! `kind = "file"`: a file or block device, optionally with O_DIRECT.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use block::{BlockDevice, FileDevice, FileOptions};

use super::{Change, DeviceSpec, Fields, Kind, OpenContext, Verdict};
use crate::render;

pub const KIND: Kind = Kind {
    name: "file",
    fields: &["path", "size", "direct"],
    parse,
    api: None,
    files: &[("path", super::FileUse::Data)],
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSpec {
    pub path: PathBuf,
    /// Create or extend the file to this size.
    pub size: Option<u64>,
    /// O_DIRECT: no page cache between the daemon and the disk.
    pub direct: bool,
}

fn parse(f: &mut Fields<'_>) -> Option<Arc<dyn DeviceSpec>> {
    f.needs("path", "a file or block device");
    let path = f.path("path");
    let size = f.size("size");
    let direct = f.bool("direct").unwrap_or(false);
    Some(Arc::new(FileSpec {
        path: path?,
        size,
        direct,
    }))
}

impl DeviceSpec for FileSpec {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn size(&self) -> Option<u64> {
        self.size
    }

    fn open(&self, ctx: &OpenContext<'_>) -> io::Result<Arc<dyn BlockDevice>> {
        let opts = FileOptions {
            direct: self.direct,
            read_only: ctx.read_only,
            create_size: self.size,
        };
        Ok(Arc::new(FileDevice::open(&self.path, opts)?))
    }

    /// A file whose path no longer names the file open (deleted or
    /// replaced): its LUN still works, on a file nothing finds again
    /// after a restart.
    fn health(&self, device: &dyn BlockDevice) -> Verdict {
        let Some(f) = device.as_any().and_then(|a| a.downcast_ref::<FileDevice>()) else {
            return Verdict::Ok;
        };
        match f.path_names_it() {
            Ok(true) => Verdict::Ok,
            Ok(false) => Verdict::Degraded(format!(
                "{} was removed or replaced: I/O goes to the file opened at start, \
                 which is lost when the daemon stops",
                f.path().display()
            )),
            Err(e) => Verdict::Degraded(format!("cannot check {}: {e}", f.path().display())),
        }
    }

    fn open_field(&self) -> Option<&'static str> {
        Some("path")
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("path", self.path.display().to_string()),
            ("size", self.size.map_or(render::UNSET.into(), render::size)),
            ("direct", self.direct.to_string()),
        ]
    }

    fn replaces_data(&self, change: &Change<'_>) -> Option<(&'static str, String)> {
        let new = change.new_as::<FileSpec>()?;
        (new.path != self.path).then(|| {
            let name = change.name;
            (
                "path",
                format!("`{name}` would serve another file: {}", self.holds()),
            )
        })
    }

    fn holds(&self) -> String {
        format!(
            "what initiators wrote to {} is no longer served (the file is left as it is)",
            self.path.display()
        )
    }

    fn opened_read_only(&self, read_only: bool) -> bool {
        read_only
    }
}
