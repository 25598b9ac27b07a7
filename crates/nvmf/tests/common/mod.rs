//! A target over a file device and a memory device, and hosts for it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use block::{BlockDevice, FileDevice, FileOptions, MemDevice};
use export::{Backing, Exports};
use nvmf::initiator::{Host, Options, Who};
use nvmf::{Config, Limits, NamespaceConfig, Server, SubsystemConfig};

pub const SUBNQN: &str = "nqn.2026-11.org.openarray:test";
pub const OTHER_NQN: &str = "nqn.2026-11.org.openarray:other";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b5c2e3e-6f1c-4c33-9d5f-000000000001";
pub const BS: usize = 512;

pub struct Target {
    pub server: Server,
    pub addr: SocketAddr,
    pub exports: Exports,
    pub config: Config,
    pub _dir: tempfile::TempDir,
}

pub fn namespace(nsid: u32, device: &str, block_size: u32) -> NamespaceConfig {
    NamespaceConfig {
        nsid,
        device: device.into(),
        block_size,
    }
}

/// Namespace 1: a 16 MiB file; 2: 8 MiB of memory in 4 KiB blocks.
/// A second subsystem admits only another host.
pub fn config() -> Config {
    Config {
        listen: vec!["127.0.0.1:0".into()],
        discovery_listen: vec![],
        subsystems: vec![
            SubsystemConfig {
                nqn: SUBNQN.into(),
                allow_hosts: vec!["nqn.2014-08.org.nvmexpress:uuid:*".into()],
                namespaces: vec![namespace(1, "file0", 512), namespace(2, "mem0", 4096)],
                hosts: vec![],
            },
            SubsystemConfig {
                nqn: OTHER_NQN.into(),
                allow_hosts: vec!["nqn.2026-11.org.example:only-this-host".into()],
                namespaces: vec![namespace(1, "mem0", 512)],
                hosts: vec![],
            },
        ],
    }
}

pub async fn target_with(limits: Limits) -> Target {
    target_of(limits, |_, _| {}).await
}

/// A target whose configuration `change` alters first, given the
/// target's temporary directory (for secret files).
pub async fn target_of(
    limits: Limits,
    change: impl FnOnce(&mut Config, &std::path::Path),
) -> Target {
    let dir = tempfile::tempdir().unwrap();
    let file = FileDevice::open(
        &dir.path().join("file0.img"),
        FileOptions {
            create_size: Some(16 << 20),
            ..FileOptions::default()
        },
    )
    .unwrap();
    let devices: BTreeMap<String, Arc<Backing>> = BTreeMap::from([
        (
            "file0".to_string(),
            Backing::new(Arc::new(file) as Arc<dyn BlockDevice>, true),
        ),
        (
            "mem0".to_string(),
            Backing::new(Arc::new(MemDevice::new(8 << 20)), true),
        ),
    ]);
    let exports = Exports {
        devices,
        ..Exports::default()
    };
    let mut config = config();
    change(&mut config, dir.path());
    let names = exports.devices.keys().cloned().collect();
    assert_eq!(config.validate(&names), vec![]);
    let server = Server::start(&config, &exports, limits).await.unwrap();
    let addr = server.local_addrs().await[0];
    Target {
        server,
        addr,
        exports,
        config,
        _dir: dir,
    }
}

pub async fn target() -> Target {
    target_with(Limits::default()).await
}

pub fn who(subnqn: &str) -> Who {
    Who {
        host_nqn: HOSTNQN.into(),
        host_id: [0x42; 16],
        subnqn: subnqn.into(),
    }
}

pub async fn host(addr: SocketAddr, opts: Options) -> Host {
    Host::connect(addr, who(SUBNQN), opts).await.unwrap()
}

/// Bytes that say where they were written (the initiator's, which its
/// verified I/O checks against).
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    nvmf::initiator::pattern(len, seed)
}
