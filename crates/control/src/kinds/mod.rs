//! The registry of device kinds. Each kind is one module: the settings it
//! reads from a `[[device]]` table (checked with errors naming file, line
//! and field), the configured devices it is built on, how it opens, what
//! it says of its state, and what a change of its settings destroys.
//!
//! Adding a kind: write a module with a settings type implementing
//! [`DeviceSpec`] and a `pub const KIND: Kind`, and list it in [`KINDS`].
//! Its surface comes with it: API routes ([`Kind::api`]), `/metrics`
//! figures ([`DeviceSpec::samples`]), a health verdict for `status`
//! ([`DeviceSpec::health`]), its state in `device show`.

use std::any::Any;
use std::fmt;
use std::io;
use std::sync::Arc;

use block::BlockDevice;

mod api;
mod cache;
mod cache_api;
mod cache_metrics;
mod delay;
mod faulty;
mod fields;
mod file;
mod files;
mod mem;
mod mirror;
mod mirror_api;
mod null;
mod raid;
mod raid_api;
mod raid_metrics;
mod raid_pending;
mod rbd;
mod volume;

pub use self::raid::{as_pending, as_raid, member_state, take_device, RaidSpec};
pub use api::{api_for, ApiError, ApiErrorKind, ApiRequest, ApiResult, Daemon, KindApi};
pub use cache::{as_cache, CacheSpec};
pub use delay::DelaySpec;
pub use faulty::{inject_fault, Fault, FaultySpec};
pub use fields::Fields;
pub(crate) use fields::TableContext;
pub use file::FileSpec;
pub use files::{device_files, DeviceFile, FileUse};
pub use mem::MemSpec;
pub use mirror::{as_mirror, MirrorSpec};
pub use null::NullSpec;
pub use raid_pending::PendingArray;
pub use rbd::{rbd_operation, serves_rbd_image, RbdOp, RbdSpec};
pub use volume::VolumeSpec;

/// An open device and its name in the configuration.
pub type Named = (Arc<dyn BlockDevice>, String);

/// What an open device says of its health.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// Serving everything, with less redundancy than configured or a
    /// problem the operator must act on.
    Degraded(String),
    /// Some or all of its data cannot be served.
    Failed(String),
}

impl Verdict {
    /// The problem in words, when there is one.
    pub fn problem(&self) -> Option<&str> {
        match self {
            Verdict::Ok => None,
            Verdict::Degraded(p) | Verdict::Failed(p) => Some(p),
        }
    }

    pub fn is_failed(&self) -> bool {
        matches!(self, Verdict::Failed(_))
    }
}

/// Every kind a `[[device]]` may have.
pub const KINDS: &[Kind] = &[
    file::KIND,
    mem::KIND,
    null::KIND,
    volume::KIND,
    delay::KIND,
    faulty::KIND,
    rbd::KIND,
    raid::KIND,
    cache::KIND,
    mirror::KIND,
];

/// One kind of device, as the registry lists it.
pub struct Kind {
    /// The `kind = "..."` value.
    pub name: &'static str,
    /// The settings it reads beside those every device has.
    pub fields: &'static [&'static str],
    /// Reads the kind's settings; reports problems to `fields` and returns
    /// `None` when there were any.
    pub parse: fn(&mut Fields<'_>) -> Option<Arc<dyn DeviceSpec>>,
    /// Its own routes in the daemon's API, when it has any.
    pub api: Option<&'static KindApi>,
    /// The settings that name files it opens, for `check-config`.
    pub files: &'static [(&'static str, FileUse)],
}

/// The kind named `name`.
pub fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == name)
}

/// The validated settings of one device of some kind.
pub trait DeviceSpec: SameSpec + fmt::Debug + Send + Sync {
    fn kind(&self) -> &'static str;

    /// The configured devices this one is built on, in order. Each may
    /// have one parent only.
    fn children(&self) -> Vec<&str> {
        Vec::new()
    }

    /// The size the configuration gives, when it gives one.
    fn size(&self) -> Option<u64> {
        None
    }

    /// The pool this device is carved from.
    fn pool(&self) -> Option<&str> {
        None
    }

    fn open(&self, ctx: &OpenContext<'_>) -> io::Result<Arc<dyn BlockDevice>>;

    /// The setting a failure to open is most likely about (a file's
    /// `path`), to name in the error.
    fn open_field(&self) -> Option<&'static str> {
        None
    }

    /// The settings, as an administrator writes them, for change reports
    /// and `device show`.
    fn settings(&self) -> Vec<(&'static str, String)>;

    /// What re-opening with the settings of `change.new` (of this same
    /// kind) would lose, when it would lose data: `(setting, message)`.
    fn replaces_data(&self, change: &Change<'_>) -> Option<(&'static str, String)> {
        let _ = change;
        None
    }

    /// Why the open device named `name` cannot take the settings of `new`
    /// (of this same kind) at all, not even with `--force`: `(setting,
    /// why and what to do instead)`.
    fn refuses_change(&self, name: &str, new: &dyn DeviceSpec) -> Option<(&'static str, String)> {
        let _ = (name, new);
        None
    }

    /// Whether the device holds data of its own that replacing it loses.
    fn holds_data(&self) -> bool {
        true
    }

    /// Whether closing the device loses its data (a RAM disk).
    fn lost_when_closed(&self) -> bool {
        false
    }

    /// What a LUN stops serving when this device is replaced, in words.
    fn holds(&self) -> String;

    /// Whether re-opening with another block size loses data (a RAM disk's
    /// blocks are its data).
    fn block_size_is_data(&self) -> bool {
        false
    }

    /// Whether the open device must be opened again to take writes after
    /// being opened read-only.
    fn opened_read_only(&self, read_only: bool) -> bool {
        let _ = read_only;
        false
    }

    /// What the LUN's NAA and serial derive from when the configuration
    /// gives no `naa`: something of the open device that every gateway
    /// serving the same data sees (an RBD image's id), rather than the
    /// device's name in this file.
    fn identity_seed(&self, device: &dyn BlockDevice) -> Option<String> {
        let _ = device;
        None
    }

    /// What the open device says of itself beyond its settings: faults
    /// injected, limits in force.
    fn state(&self, device: &dyn BlockDevice) -> Vec<(&'static str, String)> {
        let _ = device;
        Vec::new()
    }

    /// The open device's health, for `status`, `/metrics` and the
    /// console: a RAID degraded or failed, a cache failed, a file gone.
    fn health(&self, device: &dyn BlockDevice) -> Verdict {
        let _ = device;
        Verdict::Ok
    }

    /// The open device's figures for `/metrics`, labelled with its
    /// configured `name`: a RAID's members, a cache's hits.
    fn samples(&self, name: &str, device: &dyn BlockDevice) -> Vec<stats::Sample> {
        let _ = (name, device);
        Vec::new()
    }

    /// Whether the open device can take the settings of `new` (of this
    /// same kind) in place, without opening it again (a cache's mode).
    fn applies_live(&self, new: &dyn DeviceSpec) -> bool {
        let _ = new;
        false
    }

    /// Gives the open `device` these settings, when
    /// [`DeviceSpec::applies_live`] said it can take them; `gained`: the
    /// devices it is now built on that it was not (a RAID's new spare),
    /// open, by name.
    fn apply_live(&self, device: &dyn BlockDevice, gained: &[Named]) -> io::Result<()> {
        let _ = (device, gained);
        Ok(())
    }

    /// Closes the open `device` cleanly when the daemon stops using it
    /// (a cache marks its metadata clean, so it reopens warm).
    fn close(&self, device: &dyn BlockDevice) -> io::Result<()> {
        let _ = device;
        Ok(())
    }
}

/// Comparing settings of any kind: equal only when of the same kind and
/// equal there. Implemented for every `PartialEq` settings type.
pub trait SameSpec: Any {
    fn same(&self, other: &dyn Any) -> bool;
    fn as_any(&self) -> &dyn Any;
}

impl<T: PartialEq + Any> SameSpec for T {
    fn same(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<T>() == Some(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A device's kind and settings, comparable and cloneable.
#[derive(Clone, Debug)]
pub struct Spec(pub Arc<dyn DeviceSpec>);

impl PartialEq for Spec {
    fn eq(&self, other: &Spec) -> bool {
        self.0.same(other.0.as_any())
    }
}

impl Eq for Spec {}

impl std::ops::Deref for Spec {
    type Target = dyn DeviceSpec;

    fn deref(&self) -> &(dyn DeviceSpec + 'static) {
        &*self.0
    }
}

impl Spec {
    /// The settings as `T`, when the device is of that kind.
    pub fn as_kind<T: 'static>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref::<T>()
    }
}

/// A device's settings changing, for [`DeviceSpec::replaces_data`].
pub struct Change<'a> {
    pub name: &'a str,
    /// The new settings, of the same kind.
    pub new: &'a dyn DeviceSpec,
    pub old_block_size: u32,
    pub new_block_size: u32,
    /// Whether the pool named before and the one named now are the same
    /// pool (a pool renamed in the file is).
    pub same_pool: bool,
}

impl Change<'_> {
    /// The new settings as `T`: the kind's own type.
    pub fn new_as<T: 'static>(&self) -> Option<&T> {
        self.new.as_any().downcast_ref::<T>()
    }
}

/// What a kind's `open` gets: the devices it names, already open, and
/// the pools.
pub struct OpenContext<'a> {
    pub name: &'a str,
    /// The device is served read-only.
    pub read_only: bool,
    children: Vec<Arc<dyn BlockDevice>>,
    pools: &'a dyn Fn(&str) -> io::Result<Arc<pool::Pool>>,
}

impl<'a> OpenContext<'a> {
    pub fn new(
        name: &'a str,
        read_only: bool,
        children: Vec<Arc<dyn BlockDevice>>,
        pools: &'a dyn Fn(&str) -> io::Result<Arc<pool::Pool>>,
    ) -> Self {
        OpenContext {
            name,
            read_only,
            children,
            pools,
        }
    }

    /// The open devices named by [`DeviceSpec::children`], in that order.
    pub fn children(&self) -> &[Arc<dyn BlockDevice>] {
        &self.children
    }

    /// The only child of a one-child kind.
    pub fn child(&self) -> io::Result<Arc<dyn BlockDevice>> {
        self.children
            .first()
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no device under it"))
    }

    pub fn pool(&self, name: &str) -> io::Result<Arc<pool::Pool>> {
        (self.pools)(name)
    }
}

/// Kinds that have setting `key`, for "only `file` devices have it".
pub fn kinds_with(key: &str) -> Vec<&'static str> {
    KINDS
        .iter()
        .filter(|k| k.fields.contains(&key))
        .map(|k| k.name)
        .collect()
}

/// The names of every kind, for messages: "`file`, `mem`, ...".
pub fn kind_names() -> String {
    KINDS
        .iter()
        .map(|k| format!("`{}`", k.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A one-child kind whose `over` changed serves another device's data.
fn over_changed(name: &str, old: &str, new: &str) -> Option<(&'static str, String)> {
    (old != new).then(|| {
        (
            "over",
            format!("`{name}` would serve another device: {}", over_holds(old)),
        )
    })
}

fn over_holds(over: &str) -> String {
    format!("what initiators wrote to device `{over}` is no longer served (it stays there)")
}
