//! Device errors as a real NBD client sees them: a thin volume larger
//! than its pool, written through NBD until the pool is full, fails with
//! "No space left on device" (NBD_ENOSPC) in qemu-io, as an iSCSI
//! initiator is told SPACE ALLOCATION FAILED, not with an I/O error; what
//! was written before reads back and can be written again.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use client_tools::tool;
use common::admin::{pool_config, AdminDaemon};
use common::nbd_clients::{run, wait_for_listener};
use common::{free_port, retrying_taken_ports, run_echoed};

const IQN: &str = "iqn.2026-11.org.openarray.test:nbd-errors";

/// The daemon serving volume `thin0` (16 MiB) of a pool on an 8 MiB
/// device as NBD export `thin`; its NBD address.
fn start(dir: &std::path::Path) -> (AdminDaemon, SocketAddr) {
    let started = retrying_taken_ports(|| {
        let (port, nbd_port) = (free_port(), free_port());
        let export = format!(
            "\n[nbd]\nlisten = [\"127.0.0.1:{nbd_port}\"]\n\n[[nbd.export]]\nname = \"thin\"\ndevice = \"thin0\"\n"
        );
        let cfg = dir.join("openarray.toml");
        std::fs::write(&cfg, pool_config(dir, port, IQN, "8M", &export)).unwrap();
        AdminDaemon::try_start(&cfg, dir, port).map(|d| (d, nbd_port))
    });
    let nbd = SocketAddr::from(([127, 0, 0, 1], started.1));
    wait_for_listener(nbd, Duration::from_secs(30));
    (started.0, nbd)
}

#[test]
fn a_write_to_a_full_pool_fails_with_enospc_over_nbd() {
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, nbd) = start(dir.path());
    let uri = format!("nbd://{nbd}/thin");

    // 1 MiB writes, so the pool fills part way and the rest are refused.
    let mut cmd = Command::new(tool("qemu-io"));
    cmd.args(["-f", "raw", &uri]);
    for mib in 0..16 {
        cmd.args(["-c", &format!("write -P 0x5a {}M 1M", mib)]);
    }
    let out = run_echoed(cmd, Duration::from_secs(120));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let written = text.matches("wrote 1048576/1048576").count();
    let full = text
        .matches("write failed: No space left on device")
        .count();
    assert!(
        (1..16).contains(&written),
        "the 8 MiB pool takes some but not all of 16 MiB: {text}"
    );
    assert_eq!(
        written + full,
        16,
        "every other write is out of space: {text}"
    );
    assert!(!text.contains("Input/output error"), "{text}");

    // The pool is full, not failing: what fit reads back and is written
    // again in place.
    let end = format!("{}M", written);
    let out = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            &format!("read -P 0x5a 0 {end}"),
            "-c",
            &format!("write -P 0x33 0 {end}"),
            "-c",
            &format!("read -P 0x33 0 {end}"),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("failed"), "{text}");
    assert_eq!(text.matches("read ").count(), 2, "{text}");
}
