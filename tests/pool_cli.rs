//! `openarray pool ...` and `openarray volume ...` on a pool of two files.

use std::path::Path;
use std::process::{Command, Output};

fn openarray(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_openarray"))
        .args(args)
        .output()
        .expect("run openarray")
}

fn ok(args: &[&str]) -> String {
    let out = openarray(args);
    assert!(
        out.status.success(),
        "openarray {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write_config(dir: &Path) -> String {
    let text = format!(
        r#"
[[pool]]
name = "tank"
devices = ["{d}/a.img", "{d}/b.img"]
device_size = "64M"
unit_size = "64K"
"#,
        d = dir.display()
    );
    let path = dir.join("openarray.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn volumes_snapshots_and_clones_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path());
    let c = cfg.as_str();
    ok(&["volume", "create", "-c", c, "--pool", "tank", "vm", "1G"]);
    ok(&[
        "volume", "snapshot", "-c", c, "--pool", "tank", "vm", "vm@1",
    ]);
    ok(&["volume", "clone", "-c", c, "--pool", "tank", "vm@1", "vm2"]);
    ok(&["volume", "resize", "-c", c, "--pool", "tank", "vm2", "2G"]);
    let status = ok(&["pool", "status", "--bytes", "-c", c]);
    assert!(status.contains("pool tank: size"), "{status}");
    assert!(
        status.contains("vm2") && status.contains("size     2147483648"),
        "{status}"
    );
    assert!(status.contains("parent vm@1"), "{status}");
    // A volume with snapshots is kept.
    let out = openarray(&["volume", "delete", "-c", c, "--pool", "tank", "vm"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has snapshots"));
    ok(&["volume", "promote", "-c", c, "--pool", "tank", "vm2"]);
    ok(&["volume", "delete", "-c", c, "--pool", "tank", "vm"]);
    let check = ok(&["pool", "check", "-c", c, "tank"]);
    assert!(check.contains("clean"), "{check}");
    let list = ok(&["volume", "list", "-c", c, "--pool", "tank"]);
    assert!(list.contains("vm@1") && !list.contains(" vm "), "{list}");
}

#[test]
fn pools_are_created_listed_and_destroyed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path());
    let c = cfg.as_str();
    // Reading does not format anything.
    let out = openarray(&["pool", "show", "-c", c, "tank"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not created yet"));
    assert!(!dir.path().join("a.img").exists());
    let created = ok(&["pool", "create", "--bytes", "-c", c, "tank"]);
    // Two 64 MiB files, one superblock unit each.
    assert!(
        created.contains(&format!("size {} used 0", 2 * (64 << 20) - 2 * (64 << 10))),
        "{created}"
    );
    ok(&["volume", "create", "-c", c, "--pool", "tank", "vm", "1M"]);
    let listed = ok(&["pool", "list", "-c", c]);
    assert!(
        listed.contains("pool tank:") && listed.contains(" vm "),
        "{listed}"
    );
    let out = openarray(&["pool", "destroy", "-c", c, "tank"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds vm"));
    ok(&["pool", "destroy", "-c", c, "tank", "--force"]);
    assert!(!dir.path().join("a.img.meta").exists());
    // A new, empty pool can be made over the same devices.
    ok(&["pool", "create", "-c", c, "tank"]);
    let list = ok(&["volume", "list", "-c", c, "--pool", "tank"]);
    assert!(list.trim().is_empty(), "{list}");
}
