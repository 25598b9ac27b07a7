//! Ceph RBD images as block devices.
//!
//! [`RbdDevice`] opens one image of one pool through librbd's asynchronous
//! C API and serves it as a [`block::BlockDevice`]. Images opened with the
//! same ceph.conf, cephx user and keyring share one cluster connection.
//! The device takes the image's exclusive lock and refuses writes once it
//! has lost it ([`LockStatus`]).
//!
//! librbd is linked when its headers (librbd-dev) are found at build time
//! and the `rbd` feature is on; otherwise the crate still builds and
//! [`RbdDevice::open`] says it was built without librbd.

mod config;
pub use config::{RbdConfig, DEFAULT_TIMEOUT};

#[cfg_attr(not(have_librbd), allow(dead_code))]
mod lock;
pub use lock::LockStatus;

#[cfg(have_librbd)]
mod aio;
#[cfg(have_librbd)]
mod allocation;
#[cfg(have_librbd)]
mod answered;
#[cfg(have_librbd)]
mod async_io;
#[cfg(have_librbd)]
mod cluster;
#[cfg(have_librbd)]
mod device;
#[cfg(have_librbd)]
mod errno;
#[cfg(have_librbd)]
mod ffi;
#[cfg(have_librbd)]
mod image;
#[cfg(have_librbd)]
mod snapshots;
#[cfg(have_librbd)]
mod watch;

#[cfg(have_librbd)]
pub use device::RbdDevice;
#[cfg(have_librbd)]
pub use snapshots::Snapshot;
#[cfg(have_librbd)]
pub use watch::UpdateCallback;

#[cfg(not(have_librbd))]
mod unavailable;
#[cfg(not(have_librbd))]
pub use unavailable::{RbdDevice, Snapshot, UpdateCallback};

/// Whether this build can open RBD images.
pub const AVAILABLE: bool = cfg!(have_librbd);
