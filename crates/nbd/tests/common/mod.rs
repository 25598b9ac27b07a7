//! What the tests share: a server on 127.0.0.1:0 in its own runtime, the
//! external tools they drive, and a raw-socket NBD client for what no
//! installed client does.

#![allow(dead_code)]

pub mod hostile_packets;
pub mod raw;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use block::BlockDevice;
use nbd::{Export, Limits, Server};

/// A server on an ephemeral port, shut down on drop.
pub struct Running {
    pub server: Server,
    pub addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Running {
    pub fn start(exports: Vec<(&str, Export)>) -> Running {
        Running::with_limits(exports, Limits::default())
    }

    pub fn with_limits(exports: Vec<(&str, Export)>, limits: Limits) -> Running {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let table: BTreeMap<String, Export> = exports
            .into_iter()
            .map(|(n, e)| (n.to_string(), e))
            .collect();
        let server = Server::new(table, limits);
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let s = server.clone();
        runtime.spawn(async move { s.serve_tcp(listener).await });
        Running {
            server,
            addr,
            runtime: Some(runtime),
        }
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{}", self.addr, export)
    }

    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.server.shutdown();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(5));
        }
    }
}

pub fn export(device: Arc<dyn BlockDevice>) -> Export {
    Export::new(device)
}

#[allow(unused_imports)] // each test crate uses a different part of this
pub use client_tools::{run, tool};

/// Deterministic pseudo-random bytes.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Resident memory of this process in bytes.
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Waits up to ten seconds for `cond`: the server counts a session or an
/// error on its own task, after the client has had its answer.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "never came true: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
