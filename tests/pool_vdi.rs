//! Virtual desktops on thin clones: a parent volume holding a 256 MiB
//! pattern is snapshotted and cloned twenty times; each clone is written at
//! its own offset through QEMU's iSCSI driver and read back, the pool grows
//! by exactly the units written, and deleting the clones gives them back.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{require_tool, run_with_timeout, Daemon};

const IQN: &str = "iqn.2026-11.org.openarray.test:vdi";
const CLONES: u64 = 20;
const UNIT: u64 = 64 << 10;
const PARENT_SIZE: u64 = 256 << 20;
/// Each clone writes this much at `clone number` MiB (whole units).
const CLONE_WRITE: u64 = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(300);

fn pool_section(dir: &Path) -> String {
    format!(
        r#"
[[pool]]
name = "vdi"
devices = ["{d}/vdi0.img", "{d}/vdi1.img"]
device_size = "384M"
unit_size = "64K"
"#,
        d = dir.display()
    )
}

/// LUN i = volume `names[i]`.
fn config(dir: &Path, names: &[String], size: Option<&str>) -> String {
    let mut text = pool_section(dir);
    for name in names {
        text += &format!(
            "\n[[device]]\nname = \"{name}\"\nkind = \"volume\"\npool = \"vdi\"\n{}\n",
            size.map(|s| format!("size = \"{s}\"")).unwrap_or_default()
        );
    }
    text += &format!("\n[[target]]\nname = \"{IQN}\"\n");
    for (lun, name) in names.iter().enumerate() {
        text += &format!("[[target.lun]]\nlun = {lun}\ndevice = \"{name}\"\n");
    }
    text
}

fn serve(dir: &Path, text: &str) -> Daemon {
    let path = dir.join("openarray.toml");
    std::fs::write(&path, text).expect("write config");
    Daemon::start_portals(Some(&path), 1)
}

fn qemu_io(url: &str, command: &str) {
    require_tool("qemu-io");
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw", "-c", command, url]);
    let out: Output = run_with_timeout(cmd, TIMEOUT);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !text.contains("verification failed") && !text.contains("error"),
        "qemu-io {command} {url}:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn openarray(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_openarray"))
        .args(args)
        .output()
        .expect("run openarray");
    assert!(
        out.status.success(),
        "openarray {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Used bytes of the pool, from `openarray pool status`.
fn used(config: &str) -> u64 {
    let status = openarray(&["pool", "status", "--bytes", "-c", config, "vdi"]);
    let line = status.lines().next().expect("status line");
    let after = line.split(" used ").nth(1).expect("used field");
    after
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no used bytes in `{line}`"))
}

fn check_clean(config: &str) {
    let out = openarray(&["pool", "check", "-c", config, "vdi"]);
    assert!(out.contains(": clean"), "{out}");
}

#[test]
fn twenty_clones_share_their_parent_and_give_space_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config_path = dir.path().join("openarray.toml");
    let cfg = config_path.to_str().expect("utf-8").to_string();

    // The parent image: 256 MiB of one pattern.
    let parent = vec!["parent".to_string()];
    let daemon = serve(dir.path(), &config(dir.path(), &parent, Some("256M")));
    let url = daemon.url(IQN, 0);
    qemu_io(&url, &format!("write -P 0x5a 0 {PARENT_SIZE}"));
    assert!(daemon.terminate().success());
    let base = used(&cfg);
    assert_eq!(base, PARENT_SIZE, "the parent maps every unit once");

    openarray(&[
        "volume", "snapshot", "-c", &cfg, "--pool", "vdi", "parent", "golden",
    ]);
    let clones: Vec<String> = (1..=CLONES).map(|i| format!("desk{i}")).collect();
    for name in &clones {
        openarray(&[
            "volume", "clone", "-c", &cfg, "--pool", "vdi", "golden", name,
        ]);
    }
    assert_eq!(used(&cfg), base, "snapshot and clones share every unit");

    // Each clone writes 1 MiB of its own pattern at its own offset.
    let daemon = serve(dir.path(), &config(dir.path(), &clones, None));
    for (i, _) in clones.iter().enumerate() {
        let n = i as u64 + 1;
        let url = daemon.url(IQN, i as u64);
        qemu_io(&url, &format!("write -P {n} {} {CLONE_WRITE}", n << 20));
    }
    for (i, _) in clones.iter().enumerate() {
        let n = i as u64 + 1;
        let url = daemon.url(IQN, i as u64);
        qemu_io(&url, &format!("read -P {n} {} {CLONE_WRITE}", n << 20));
        qemu_io(&url, &format!("read -P 0x5a 0 {}", n << 20));
        let rest = (n << 20) + CLONE_WRITE;
        qemu_io(&url, &format!("read -P 0x5a {rest} {}", PARENT_SIZE - rest));
    }
    assert!(daemon.terminate().success());
    let written_units = CLONES * CLONE_WRITE / UNIT;
    assert_eq!(
        used(&cfg),
        base + written_units * UNIT,
        "the pool grew by exactly the units the clones wrote"
    );
    check_clean(&cfg);

    // The parent still reads its pattern everywhere.
    let daemon = serve(dir.path(), &config(dir.path(), &parent, None));
    qemu_io(
        &daemon.url(IQN, 0),
        &format!("read -P 0x5a 0 {PARENT_SIZE}"),
    );
    assert!(daemon.terminate().success());

    for name in &clones {
        openarray(&["volume", "delete", "-c", &cfg, "--pool", "vdi", name]);
    }
    assert_eq!(
        used(&cfg),
        base,
        "deleting the clones gave their units back"
    );
    openarray(&["volume", "delete", "-c", &cfg, "--pool", "vdi", "golden"]);
    assert_eq!(used(&cfg), base);
    check_clean(&cfg);
}
