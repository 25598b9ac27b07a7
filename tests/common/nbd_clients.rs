//! The NBD client tools a test drives against an export, each checked for
//! success: qemu-img, nbdinfo, nbdcopy and fio's nbd engine (from the
//! `client-tools` crate), and waiting for a listener.

#[allow(unused_imports)] // each test crate uses a different part of this
pub use client_tools::{fio_verified_writes, nbdinfo_map, qemu_img_map, run};

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Waits until something accepts connections at `addr`.
pub fn wait_for_listener(addr: SocketAddr, limit: Duration) {
    let began = Instant::now();
    while TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
        assert!(began.elapsed() < limit, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
