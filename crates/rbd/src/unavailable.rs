//! The device of a build without librbd: the same API, and opening says
//! why nothing can be opened. No value of the type exists, so every other
//! method is unreachable.

use std::io;

use block::{BlockDevice, Capabilities};

use crate::config::RbdConfig;
use crate::lock::LockStatus;

/// One snapshot of an image, as `rbd snap ls` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub id: u64,
    pub name: String,
    pub size: u64,
}

/// What to call when the image's header changed.
pub type UpdateCallback = Box<dyn Fn() + Send + Sync>;

/// An RBD image; this build cannot open any.
pub enum RbdDevice {}

impl RbdDevice {
    pub fn open(config: &RbdConfig) -> io::Result<RbdDevice> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "cannot open the RBD image {}: openarray was built without librbd \
                 (install librbd-dev and build with the `rbd` feature)",
                config.spec()
            ),
        ))
    }

    pub fn identity(&self) -> &str {
        match *self {}
    }
    pub fn config(&self) -> &RbdConfig {
        match *self {}
    }
    pub fn cluster(&self) -> &str {
        match *self {}
    }
    pub fn lock_status(&self) -> LockStatus {
        match *self {}
    }
    pub fn reacquire_lock(&self) -> io::Result<()> {
        match *self {}
    }
    pub fn release_lock(&self) -> io::Result<()> {
        match *self {}
    }
    pub fn lock_owners(&self) -> io::Result<Vec<String>> {
        match *self {}
    }
    pub fn on_update(&self, _callback: UpdateCallback) {
        match *self {}
    }
    pub fn refresh_size(&self) -> io::Result<Option<u64>> {
        match *self {}
    }
    pub fn update_pending(&self) -> bool {
        match *self {}
    }
    pub fn resize(&self, _size: u64) -> io::Result<()> {
        match *self {}
    }
    pub fn create_snapshot(&self, _name: &str) -> io::Result<()> {
        match *self {}
    }
    pub fn snapshots(&self) -> io::Result<Vec<Snapshot>> {
        match *self {}
    }
    pub fn delete_snapshot(&self, _name: &str) -> io::Result<()> {
        match *self {}
    }
    pub fn rollback_snapshot(&self, _name: &str) -> io::Result<()> {
        match *self {}
    }
    pub fn protect_snapshot(&self, _name: &str) -> io::Result<()> {
        match *self {}
    }
    pub fn unprotect_snapshot(&self, _name: &str) -> io::Result<()> {
        match *self {}
    }
    pub fn clone_snapshot(&self, _snap: &str, _pool: &str, _child: &str) -> io::Result<()> {
        match *self {}
    }
    pub fn remove_image(&self, _pool: &str, _name: &str) -> io::Result<()> {
        match *self {}
    }
    pub fn compare_and_write(
        &self,
        _compare: &[u8],
        _write: &[u8],
        _offset: u64,
    ) -> io::Result<Option<u64>> {
        match *self {}
    }
}

impl BlockDevice for RbdDevice {
    /// So that the configuration can reach the image's identity and lock.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn size(&self) -> u64 {
        match *self {}
    }
    fn read_at(&self, _buf: &mut [u8], _offset: u64) -> io::Result<()> {
        match *self {}
    }
    fn write_at(&self, _buf: &[u8], _offset: u64, _fua: bool) -> io::Result<()> {
        match *self {}
    }
    fn flush(&self) -> io::Result<()> {
        match *self {}
    }
    fn capabilities(&self) -> Capabilities {
        match *self {}
    }
    fn describe(&self) -> String {
        match *self {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_says_the_build_has_no_librbd() {
        let config = RbdConfig::new("rbd", "vm42", "/etc/ceph/ceph.conf");
        let Err(e) = RbdDevice::open(&config);
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("built without librbd"), "{e}");
    }
}
