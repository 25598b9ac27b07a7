//! Pools on a running daemon: a live configuration change adds a thin
//! volume LUN to a pool the daemon already serves from (the running pool is
//! reused); snapshots, clones, rollback, resize, thick volumes and deletes
//! go through the administration API while a LUN serves the volume.

mod common;

use std::process::Command;
use std::time::Duration;

use common::admin::AdminDaemon;
use common::{free_port, require_tool, run_with_timeout};

const IQN: &str = "iqn.2026-11.org.openarray.test:live";

fn config(dir: &str, second: bool) -> String {
    let mut text = format!(
        r#"
[[pool]]
name = "tank"
devices = ["{dir}/tank0.img"]
device_size = "256M"

[[device]]
name = "thin0"
kind = "volume"
pool = "tank"
size = "64M"
"#
    );
    if second {
        text +=
            "\n[[device]]\nname = \"thin1\"\nkind = \"volume\"\npool = \"tank\"\nsize = \"32M\"\n";
    }
    text +=
        &format!("\n[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nlun = 0\ndevice = \"thin0\"\n");
    if second {
        text += "[[target.lun]]\nlun = 1\ndevice = \"thin1\"\n";
    }
    text
}

fn qemu_io(url: &str, command: &str) {
    require_tool("qemu-io");
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw", "-c", command, url]);
    let out = run_with_timeout(cmd, Duration::from_secs(120));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !text.contains("verification failed"),
        "qemu-io {command} {url}:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn openarray(args: &[&str]) -> String {
    let (ok, out, err) = try_openarray(args);
    assert!(ok, "openarray {args:?}: {err}");
    out
}

/// Success, stdout, stderr.
fn try_openarray(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_openarray"))
        .args(args)
        .output()
        .expect("run openarray");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn qemu_img_size(url: &str) -> u64 {
    require_tool("qemu-img");
    let mut cmd = Command::new("qemu-img");
    cmd.args(["info", "--output=json", url]);
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text
        .find("\"virtual-size\":")
        .expect("virtual-size in qemu-img info")
        + 15;
    text[at..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("qemu-img info {url}: {text}"))
}

#[test]
fn a_volume_lun_added_live_shares_the_open_pool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8");
    let first = dir.path().join("a.toml");
    let second = dir.path().join("b.toml");
    std::fs::write(&first, config(d, false)).unwrap();
    std::fs::write(&second, config(d, true)).unwrap();
    let socket = dir.path().join("admin.sock");
    let port = free_port();
    let served = AdminDaemon::start_listening(&first, dir.path(), port);
    let url = |lun: u64| format!("iscsi://127.0.0.1:{port}/{IQN}/{lun}");

    qemu_io(&url(0), "write -P 7 0 1M");
    let sock = socket.to_str().expect("utf-8");
    let applied = openarray(&[
        "config",
        "--socket",
        sock,
        "apply",
        second.to_str().unwrap(),
    ]);
    assert!(applied.contains("thin1"), "{applied}");
    qemu_io(&url(1), "write -P 9 0 1M");
    qemu_io(&url(0), "read -P 7 0 1M");
    qemu_io(&url(1), "read -P 9 0 1M");

    // SIGTERM: sessions end, every device is flushed.
    let status = served.terminate();
    assert!(status.success(), "daemon exited with {status}");

    let cfg = second.to_str().unwrap();
    let status = openarray(&["pool", "status", "--bytes", "-c", cfg, "tank"]);
    assert!(status.contains("used 2097152 "), "{status}");
    let check = openarray(&["pool", "check", "-c", cfg, "tank"]);
    assert!(check.contains(": clean"), "{check}");
}

#[test]
fn snapshots_clones_and_deletes_on_a_running_daemon() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8");
    let first = dir.path().join("a.toml");
    std::fs::write(&first, config(d, false)).unwrap();
    let socket = dir.path().join("admin.sock");
    let port = free_port();
    let served = AdminDaemon::start_listening(&first, dir.path(), port);
    let url = |lun: u64| format!("iscsi://127.0.0.1:{port}/{IQN}/{lun}");
    let sock = socket.to_str().expect("utf-8");
    let volume = |args: &[&str]| {
        let mut all = vec!["volume", args[0], "--socket", sock, "--pool", "tank"];
        all.extend(&args[1..]);
        try_openarray(&all)
    };

    // A snapshot holds the writes acknowledged before it, not later ones.
    qemu_io(&url(0), "write -P 7 0 1M");
    assert!(volume(&["snapshot", "thin0", "snap1"]).0);
    qemu_io(&url(0), "write -P 8 0 512K");
    assert!(volume(&["clone", "snap1", "c1"]).0);
    // The clone exported live reads the snapshot.
    let with_clone = config(d, false).replace(
        "[[target]]",
        "[[device]]\nname = \"c1dev\"\nkind = \"volume\"\npool = \"tank\"\nvolume = \"c1\"\n\n[[target]]",
    ) + "[[target.lun]]\nlun = 1\ndevice = \"c1dev\"\n";
    let second = dir.path().join("b.toml");
    std::fs::write(&second, with_clone).unwrap();
    openarray(&[
        "config",
        "--socket",
        sock,
        "apply",
        second.to_str().unwrap(),
    ]);
    qemu_io(&url(1), "read -P 7 0 1M");
    qemu_io(&url(1), "write -P 9 1M 1M");
    qemu_io(&url(0), "read -P 8 0 512K");
    qemu_io(&url(0), "read -P 7 512K 512K");
    qemu_io(&url(0), "read -P 0 1M 1M");

    // A volume a LUN serves is not deleted.
    let (ok, _, err) = volume(&["delete", "c1"]);
    assert!(!ok && err.contains("served by device c1dev"), "{err}");
    let listed = openarray(&["volume", "list", "--socket", sock, "--pool", "tank"]);
    assert!(listed.contains("served by c1dev"), "{listed}");

    // Growing the exported volume shows at once; shrinking it is refused.
    assert!(volume(&["resize", "thin0", "96M"]).0);
    assert_eq!(qemu_img_size(&url(0)), 96 << 20);
    let (ok, _, err) = volume(&["resize", "thin0", "32M"]);
    assert!(
        !ok && err.contains("only an unused volume shrinks"),
        "{err}"
    );

    // Rollback while served: a new session reads the snapshot.
    assert!(volume(&["rollback", "thin0", "snap1"]).0);
    qemu_io(&url(0), "read -P 7 0 1M");

    // Long operations report progress until done.
    let (ok, out, err) = volume(&["create", "fat", "8M", "--thick"]);
    assert!(
        ok && out.contains("preallocate fat: 100% (128 of 128 units)"),
        "{out}{err}"
    );
    let shown = openarray(&[
        "volume", "show", "--bytes", "--socket", sock, "--pool", "tank", "fat",
    ]);
    assert!(shown.contains("mapped        8388608"), "{shown}");
    let (ok, out, err) = volume(&["delete", "fat"]);
    assert!(ok && out.contains("delete fat: 100%"), "{out}{err}");

    let status = openarray(&["pool", "show", "--bytes", "--socket", sock, "tank"]);
    // thin0: 1 MiB shared with snap1; c1: its own 1 MiB.
    assert!(status.contains("used 2097152 "), "{status}");
    let check = openarray(&["pool", "check", "--socket", sock, "tank"]);
    assert!(check.contains(": clean"), "{check}");
    // The daemon holds the metadata: the offline path says what to do.
    let cfg = second.to_str().unwrap();
    let (ok, _, err) = try_openarray(&["pool", "check", "-c", cfg, "tank"]);
    assert!(!ok && err.contains("pass --socket"), "{err}");

    // SIGTERM: sessions end, every device is flushed; offline the pool
    // holds what the daemon did.
    assert!(served.terminate().success());
    let (ok, out, _) = try_openarray(&["pool", "check", "-c", cfg, "tank"]);
    assert!(ok && out.contains(": clean"), "{out}");
    let listed = openarray(&["volume", "list", "-c", cfg, "--pool", "tank"]);
    assert!(
        listed.contains("c1") && listed.contains("snap1") && !listed.contains("fat"),
        "{listed}"
    );
}
