//! `kind = "rbd"`: an image of a Ceph cluster, through librbd. The image
//! keeps its data in the cluster; the device holds the image's exclusive
//! lock while it is open, and its LUN's NAA comes from the image's id.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use block::BlockDevice;
use rbd::{RbdConfig, RbdDevice};

use super::{Change, DeviceSpec, Fields, Kind, OpenContext};
use crate::render;

pub const KIND: Kind = Kind {
    name: "rbd",
    fields: &[
        "pool",
        "image",
        "size",
        "create",
        "ceph_conf",
        "client",
        "keyring",
        "timeout",
    ],
    parse,
    api: None,
    files: &[],
};

/// Where the cluster's configuration usually is.
const DEFAULT_CEPH_CONF: &str = "/etc/ceph/ceph.conf";
const DEFAULT_CLIENT: &str = "client.admin";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdSpec {
    /// The Ceph pool (not a `[[pool]]` of this configuration).
    pub pool: String,
    /// The image's name in the Ceph pool; the device's name when not given.
    pub image: String,
    /// Bytes to create the image with.
    pub size: Option<u64>,
    pub create: bool,
    pub ceph_conf: PathBuf,
    pub client: String,
    pub keyring: Option<PathBuf>,
    /// Bound on connecting and on every request.
    pub timeout: Duration,
}

fn parse(f: &mut Fields<'_>) -> Option<Arc<dyn DeviceSpec>> {
    f.needs("pool", "the Ceph pool holding the image");
    let pool = f.string("pool");
    let image = f.volume_name("image");
    let size = f.size("size");
    let create = f.bool("create").unwrap_or(false);
    let ceph_conf = f
        .path("ceph_conf")
        .unwrap_or_else(|| DEFAULT_CEPH_CONF.into());
    let client = f.string("client").unwrap_or_else(|| DEFAULT_CLIENT.into());
    let keyring = f.path("keyring");
    let timeout = f.duration("timeout").unwrap_or(rbd::DEFAULT_TIMEOUT);
    if timeout.is_zero() {
        f.fail("timeout", None, "must be more than zero");
    }
    if create && size.is_none() && !f.has_issues() {
        f.fail(
            "size",
            None,
            "`create = true` needs `size` to create the image with",
        );
    }
    if f.has_issues() {
        return None;
    }
    Some(Arc::new(RbdSpec {
        pool: pool?,
        image: image?,
        size,
        create,
        ceph_conf,
        client,
        keyring,
        timeout,
    }))
}

impl RbdSpec {
    pub fn config(&self) -> RbdConfig {
        RbdConfig {
            pool: self.pool.clone(),
            image: self.image.clone(),
            size: self.size,
            create: self.create,
            ceph_conf: self.ceph_conf.clone(),
            client: self.client.clone(),
            keyring: self.keyring.clone(),
            timeout: self.timeout,
        }
    }
}

impl DeviceSpec for RbdSpec {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn open(&self, _ctx: &OpenContext<'_>) -> io::Result<Arc<dyn BlockDevice>> {
        let config = self.config();
        let device = RbdDevice::open(&config).map_err(|e| {
            // Say which image, unless the error already does.
            let spec = config.spec();
            if e.to_string().contains(&spec) {
                e
            } else {
                io::Error::new(e.kind(), format!("RBD image {spec}: {e}"))
            }
        })?;
        Ok(Arc::new(device))
    }

    fn open_field(&self) -> Option<&'static str> {
        Some("image")
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        let unset = || render::UNSET.to_string();
        vec![
            ("pool", self.pool.clone()),
            ("image", self.image.clone()),
            ("size", self.size.map_or_else(unset, render::size)),
            ("create", self.create.to_string()),
            ("ceph_conf", self.ceph_conf.display().to_string()),
            ("client", self.client.clone()),
            (
                "keyring",
                self.keyring
                    .as_ref()
                    .map_or_else(unset, |k| k.display().to_string()),
            ),
            ("timeout", render::duration(self.timeout)),
        ]
    }

    fn replaces_data(&self, change: &Change<'_>) -> Option<(&'static str, String)> {
        let new = change.new_as::<RbdSpec>()?;
        let key = if new.image != self.image {
            "image"
        } else if new.pool != self.pool {
            "pool"
        } else if new.ceph_conf != self.ceph_conf {
            "ceph_conf"
        } else {
            return None;
        };
        let name = change.name;
        Some((
            key,
            format!("`{name}` would serve another RBD image: {}", self.holds()),
        ))
    }

    fn holds(&self) -> String {
        format!(
            "what initiators wrote to the RBD image {}/{} is no longer served (it stays in the cluster)",
            self.pool, self.image
        )
    }

    fn identity_seed(&self, device: &dyn BlockDevice) -> Option<String> {
        let rbd = as_rbd(device)?;
        Some(format!("rbd:{}", rbd.identity()))
    }

    fn state(&self, device: &dyn BlockDevice) -> Vec<(&'static str, String)> {
        let Some(rbd) = as_rbd(device) else {
            return Vec::new();
        };
        vec![
            ("identity", rbd.identity().to_string()),
            ("lock", format!("{:?}", rbd.lock_status()).to_lowercase()),
            ("cluster", rbd.cluster().to_string()),
        ]
    }
}

fn as_rbd(device: &dyn BlockDevice) -> Option<&RbdDevice> {
    device.as_any()?.downcast_ref::<RbdDevice>()
}

/// Whether `device` is an open `rbd` device serving image `image` of Ceph
/// pool `pool`.
pub fn serves_rbd_image(device: &dyn BlockDevice, pool: &str, image: &str) -> bool {
    as_rbd(device).is_some_and(|rbd| rbd.config().pool == pool && rbd.config().image == image)
}

/// An administrative operation on the image an open `rbd` device serves,
/// made through the device's own connection (which holds the image's lock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RbdOp {
    /// An RBD snapshot of the image.
    Snapshot { snapshot: String },
    /// A layered clone `image`, in the same Ceph pool, of snapshot
    /// `snapshot` (protected first, as RBD clones need).
    Clone { snapshot: String, image: String },
    /// Grow the image to `size` bytes; the LUN reports the new capacity.
    Resize { size: u64 },
}

/// Runs `op` on `device`, which must be an `rbd` device; says what was done.
pub fn rbd_operation(device: &dyn BlockDevice, op: &RbdOp) -> Result<String, String> {
    let rbd = as_rbd(device).ok_or("not an `rbd` device")?;
    let spec = rbd.config().spec();
    match op {
        RbdOp::Snapshot { snapshot } => {
            rbd.create_snapshot(snapshot).map_err(|e| e.to_string())?;
            Ok(format!("snapshot {spec}@{snapshot} created"))
        }
        RbdOp::Clone { snapshot, image } => {
            let pool = &rbd.config().pool;
            rbd.clone_snapshot(snapshot, pool, image)
                .map_err(|e| e.to_string())?;
            Ok(format!("{pool}/{image} cloned from {spec}@{snapshot}"))
        }
        RbdOp::Resize { size } => {
            let now = device.size();
            // Shrinking drops the data past the new end: not from here.
            if *size < now {
                return Err(format!(
                    "{spec} has {now} bytes; shrinking it to {size} would lose data"
                ));
            }
            rbd.resize(*size).map_err(|e| e.to_string())?;
            Ok(format!("{spec} resized to {size} bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_config;

    fn config(device: &str) -> Result<crate::Config, String> {
        let text = format!(
            "[[portal]]\nlisten = \"127.0.0.1:3260\"\n\n[[device]]\nname = \"vm42\"\nkind = \"rbd\"\n{device}\n\
             [[target]]\nname = \"iqn.2026-11.org.example:t0\"\n[[target.lun]]\nlun = 0\ndevice = \"vm42\"\n"
        );
        parse_config(&text, "test.toml").map_err(|e| e.to_string())
    }

    fn spec(device: &str) -> RbdSpec {
        let c = config(device).unwrap();
        c.devices[0].spec.as_kind::<RbdSpec>().unwrap().clone()
    }

    #[test]
    fn settings_have_defaults_and_the_image_is_the_device_name() {
        let s = spec("pool = \"rbd\"");
        assert_eq!((s.pool.as_str(), s.image.as_str()), ("rbd", "vm42"));
        assert_eq!(s.ceph_conf, PathBuf::from(DEFAULT_CEPH_CONF));
        assert_eq!(s.client, DEFAULT_CLIENT);
        assert_eq!(s.timeout, rbd::DEFAULT_TIMEOUT);
        assert!(!s.create && s.size.is_none() && s.keyring.is_none());
        // The Ceph pool is not a `[[pool]]` of the configuration.
        let s = spec(
            "pool = \"ssd\"\nimage = \"disk\"\nsize = \"10G\"\ncreate = true\n\
             ceph_conf = \"/c/ceph.conf\"\nclient = \"openarray\"\nkeyring = \"/c/k\"\ntimeout = \"5s\"",
        );
        assert_eq!(s.config().spec(), "ssd/disk");
        assert_eq!(s.config().client_name(), "client.openarray");
        assert_eq!(s.size, Some(10 << 30));
        assert_eq!(s.timeout, Duration::from_secs(5));
        assert_eq!(s.keyring, Some(PathBuf::from("/c/k")));
    }

    #[test]
    fn bad_settings_name_their_field() {
        let e = config("image = \"x\"").unwrap_err();
        assert!(
            e.contains("device[0].pool") && e.contains("Ceph pool"),
            "{e}"
        );
        let e = config("pool = \"rbd\"\ncreate = true").unwrap_err();
        assert!(e.contains("device[0].size"), "{e}");
        let e = config("pool = \"rbd\"\ntimeout = 5").unwrap_err();
        assert!(e.contains("device[0].timeout"), "{e}");
        let e = config("pool = \"rbd\"\npath = \"/x\"").unwrap_err();
        assert!(e.contains("device[0].path"), "{e}");
    }

    #[test]
    fn another_image_replaces_data_and_a_new_timeout_does_not() {
        let old = spec("pool = \"rbd\"");
        let change = |new: &RbdSpec| {
            old.replaces_data(&Change {
                name: "vm42",
                new,
                old_block_size: 512,
                new_block_size: 512,
                same_pool: true,
            })
        };
        let other = spec("pool = \"rbd\"\nimage = \"other\"");
        assert_eq!(change(&other).map(|c| c.0), Some("image"));
        let slower = spec("pool = \"rbd\"\ntimeout = \"60s\"");
        assert_eq!(change(&slower), None);
    }
}
