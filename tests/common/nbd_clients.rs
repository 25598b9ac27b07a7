//! The NBD client tools a test drives against an export, each checked for
//! success: qemu-img, nbdinfo, nbdcopy and fio's nbd engine.

use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs a client tool given two minutes; its failure fails the test with
/// its output.
pub fn run(tool: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(tool);
    cmd.args(args);
    let out = super::run_with_timeout(cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{tool} {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Waits until something accepts connections at `addr`.
pub fn wait_for_listener(addr: SocketAddr, limit: Duration) {
    let began = Instant::now();
    while TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
        assert!(began.elapsed() < limit, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `nbdinfo --map`: (offset, length, data?) runs, data meaning not a hole.
pub fn nbdinfo_map(uri: &str) -> Vec<(u64, u64, bool)> {
    let out = run("nbdinfo", &["--map", uri]);
    let text = String::from_utf8(out.stdout).expect("nbdinfo prints text");
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let kind: u32 = f[2].parse().expect("a map entry's type");
            // Bit 0 of the type: a hole.
            (
                f[0].parse().expect("offset"),
                f[1].parse().expect("length"),
                kind & 1 == 0,
            )
        })
        .collect()
}

/// fio's nbd engine writes `size` of random 4K blocks at depth 16 and
/// reads every one back verified; fails the test on any mismatch.
pub fn fio_verified_writes(uri: &str, size: &str) {
    let out = run(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            &format!("--size={size}"),
            "--iodepth=16",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=terse",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // Terse field 6 is the read kB (the verify pass), 47 the write kB.
    let fields: Vec<&str> = text.trim().split(';').collect();
    assert!(fields.len() > 46, "fio's terse output: {text}");
    let (read_kb, write_kb) = (fields[5], fields[46]);
    assert_eq!(read_kb, write_kb, "fio verified less than it wrote: {text}");
    assert_ne!(write_kb, "0", "fio wrote nothing: {text}");
}
