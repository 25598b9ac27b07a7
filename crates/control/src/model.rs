//! The validated configuration: what the daemon is told to serve.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::error::Location;

/// Port used when a portal gives only an address.
pub const DEFAULT_ISCSI_PORT: u16 = 3260;

/// Size of `mem` and `null` devices that give none.
pub const DEFAULT_DEVICE_SIZE: u64 = 1 << 30;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Where the configuration came from, for messages: a file name or
    /// `<built-in default>`.
    pub origin: String,
    pub daemon: Daemon,
    pub portals: Vec<Portal>,
    pub devices: Vec<Device>,
    pub targets: Vec<Target>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Daemon {
    /// Directory for state that must survive restarts (persistent
    /// reservations). Without it, APTPL reservations are not kept.
    pub state_dir: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Portal {
    pub listen: SocketAddr,
    pub at: Option<Location>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    File,
    Mem,
    Null,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub kind: DeviceKind,
    /// File or block device, for `file`.
    pub path: Option<PathBuf>,
    /// For `file`: create or extend the file to this size. For `mem` and
    /// `null`: the device size.
    pub size: Option<u64>,
    /// O_DIRECT, for `file`.
    pub direct: bool,
    pub product_id: Option<String>,
    pub serial: Option<String>,
    /// When absent, derived from the device name.
    pub naa: Option<[u8; 16]>,
    pub block_size: u32,
    pub read_only: bool,
    pub write_cache: bool,
    pub at: Option<Location>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub alias: Option<String>,
    /// Portals this target is offered on; `None` means every portal.
    pub portals: Option<Vec<SocketAddr>>,
    pub luns: Vec<Lun>,
    pub at: Option<Location>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lun {
    pub lun: u64,
    /// Name of a [`Device`].
    pub device: String,
    pub at: Option<Location>,
}

impl Config {
    /// Replaces the configured portals, e.g. from `--listen`; every target
    /// is then offered on all of them. Repeated addresses count once.
    pub fn override_listen(&mut self, listen: &[SocketAddr]) {
        self.portals.clear();
        for &addr in listen {
            if !self.portals.iter().any(|p| p.listen == addr) {
                self.portals.push(Portal {
                    listen: addr,
                    at: None,
                });
            }
        }
        for target in &mut self.targets {
            target.portals = None;
        }
    }

    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name)
    }

    /// Addresses a target is offered on.
    pub fn target_portals(&self, target: &Target) -> Vec<SocketAddr> {
        match &target.portals {
            Some(list) => list.clone(),
            None => self.portals.iter().map(|p| p.listen).collect(),
        }
    }
}
