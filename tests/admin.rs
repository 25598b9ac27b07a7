//! Live administration through `openarray config ...` and the daemon's
//! unix socket: a change of groups and LUN maps while another session runs
//! verified I/O, idempotent apply, a refused change that changes nothing,
//! and the applied state surviving a restart.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use common::admin::{esx_config, pool_config, run_openarray, AdminDaemon};
use common::verified_io::BackgroundIo;
use common::{free_port, require_tool};

const TARGET: &str = "iqn.2026-11.org.test:admin";
const ESX1: &str = "iqn.1998-01.com.vmware:esx1";

/// The test's configuration: `esx_luns` mapped for ESX1. Its portal is
/// pinned by `--listen` and never served.
fn config(dir: &Path, esx_luns: &[(u64, &str)]) -> String {
    esx_config(dir, 3260, TARGET, ESX1, esx_luns)
}

/// LUN numbers ESX1 sees on the daemon's port.
fn esx_luns(daemon: &AdminDaemon) -> Vec<u64> {
    daemon.luns(daemon.port, ESX1, "")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn live_changes_apply_persist_and_leave_other_io_alone() {
    require_tool("iscsi-ls");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openarray.toml");
    let v1 = config(dir.path(), &[(201, "shared"), (3, "other")]);
    std::fs::write(&path, &v1).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let daemon = AdminDaemon::start_listening(&path, dir.path(), free_port());
    assert_eq!(esx_luns(&daemon), vec![3, 201]);

    // Verified I/O on LUN 3 runs through every change below.
    let io = BackgroundIo::start(daemon.port, ESX1, TARGET, 3);
    io.wait_rounds(1);

    // LUN 201 goes, LUN 7 comes: same device under a new number.
    let v2 = config(dir.path(), &[(7, "shared"), (3, "other")]);
    let v2_path = dir.path().join("v2.toml");
    std::fs::write(&v2_path, &v2).unwrap();
    let diff = daemon.config_cli(&["diff", v2_path.to_str().unwrap()]);
    assert_eq!(diff.status.code(), Some(1), "diff reports drift");
    let text = stdout(&diff);
    assert!(
        text.contains("- target iqn.2026-11.org.test:admin group esx LUN 201 = shared"),
        "{text}"
    );
    assert!(
        text.contains("+ target iqn.2026-11.org.test:admin group esx LUN 7 = shared"),
        "{text}"
    );

    let apply = daemon.config_cli(&["apply", v2_path.to_str().unwrap()]);
    assert!(apply.status.success());
    assert!(stdout(&apply).contains("LUN 7 = shared"));
    assert_eq!(esx_luns(&daemon), vec![3, 7]);
    let list = stdout(&daemon.config_cli(&["list"]));
    assert!(
        list.contains(&format!(
            "target {TARGET}\n  group esx: {ESX1}\n    LUN 3 -> other\n    LUN 7 -> shared\n"
        )),
        "{list}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), v2);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the file keeps its secrets private");

    // Applying the same file again changes nothing.
    let again = daemon.config_cli(&["apply", v2_path.to_str().unwrap()]);
    assert!(again.status.success());
    assert_eq!(stdout(&again).trim(), "no changes");
    let diff = daemon.config_cli(&["diff", v2_path.to_str().unwrap()]);
    assert_eq!(diff.status.code(), Some(0));

    // A bad change is refused, names the field, and changes nothing.
    let bad = config(dir.path(), &[(7, "shared"), (3, "missing")]);
    let bad_path = dir.path().join("bad.toml");
    std::fs::write(&bad_path, &bad).unwrap();
    let refused = daemon.config_cli(&["apply", bad_path.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("bad.toml:") && err.contains("target[0].group[0].lun[1].device"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), v2);
    assert_eq!(stdout(&daemon.config_cli(&["show"])), v2);
    assert_eq!(esx_luns(&daemon), vec![3, 7]);

    // Under --listen the portals are pinned: a portal edit is refused.
    let refused = daemon.cli(&["portal", "add", "127.0.0.1:1"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--listen"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), v2);

    let untouched = io
        .finish()
        .unwrap_or_else(|e| panic!("I/O on the untouched LUN failed: {e}\n{}", daemon.log()));
    assert!(
        untouched.rounds >= 20 && !untouched.lun_gone,
        "{untouched:?}"
    );
    assert!(daemon.log().contains("configuration applied"));

    // The applied state is what a restart serves.
    let port = daemon.port;
    drop(daemon);
    let restarted = AdminDaemon::start_listening(&path, dir.path(), port);
    assert_eq!(esx_luns(&restarted), vec![3, 7]);
    let saved = restarted.config_cli(&["save"]);
    assert!(saved.status.success());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), v2);
}

#[test]
fn the_cli_says_when_no_daemon_listens() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("none.sock");
    let out = run_openarray([
        "config".as_ref(),
        "--socket".as_ref(),
        socket.as_os_str(),
        "show".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the daemon"));
}

#[test]
fn pool_changes_are_diffed_and_applied_or_refused_by_name() {
    use common::iscsi::{LoginParams, Session};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openarray.toml");
    let v1 = pool_config(dir.path(), 3260, TARGET, "128M", "");
    std::fs::write(&path, &v1).unwrap();
    let daemon = AdminDaemon::start_listening(&path, dir.path(), free_port());
    let write = |name: &str, text: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        file.to_str().unwrap().to_string()
    };

    // Growing the formatted pool's devices: shown, and refused by name.
    let grown = write(
        "grown.toml",
        &pool_config(dir.path(), 3260, TARGET, "256M", ""),
    );
    let diff = daemon.config_cli(&["diff", &grown]);
    assert_eq!(diff.status.code(), Some(1));
    assert_eq!(stdout(&diff), "~ pool tank device_size: 128M → 256M\n");
    for args in [&["apply", &grown][..], &["apply", "--force", &grown]] {
        let refused = daemon.config_cli(args);
        assert_eq!(refused.status.code(), Some(1));
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(
            err.contains("grown.toml:4:1: pool[0].device_size: pool `tank` exists")
                && err.contains("cannot grow or shrink")
                && err.contains("it stays 128M (asked: 256M)"),
            "{err}"
        );
    }
    assert_eq!(std::fs::read_to_string(&path).unwrap(), v1);
    assert_eq!(stdout(&daemon.config_cli(&["show"])), v1);

    // A new pool alone is a change: applied, so the pool commands reach it.
    let spare = format!(
        "\n[[pool]]\nname = \"spare\"\ndevices = [\"{}/spare0.img\"]\ndevice_size = \"64M\"\n",
        dir.path().display()
    );
    let v2 = pool_config(dir.path(), 3260, TARGET, "128M", &spare);
    let added = write("added.toml", &v2);
    let diff = daemon.config_cli(&["diff", &added]);
    assert_eq!(stdout(&diff), "+ pool spare\n");
    let apply = daemon.config_cli(&["apply", &added]);
    assert!(apply.status.success());
    assert_eq!(stdout(&apply), "+ pool spare\n");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), v2);
    daemon.ok(&["pool", "create", "spare"]);

    // A volume of the new pool served as LUN 1, next to LUN 0.
    let lun1 =
        "\n[[device]]\nname = \"thin1\"\nkind = \"volume\"\npool = \"spare\"\nsize = \"8M\"\n";
    let v3 = format!("{v2}{lun1}").replace(
        "device = \"thin0\"\n",
        "device = \"thin0\"\n[[target.lun]]\nlun = 1\ndevice = \"thin1\"\n",
    );
    let served = write("served.toml", &v3);
    let apply = daemon.config_cli(&["apply", &served]);
    assert!(apply.status.success());
    assert!(stdout(&apply).contains("+ device thin1"));
    let mut s = Session::login(
        daemon.addr(),
        &LoginParams::normal(ESX1, TARGET),
        std::time::Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(s.read_capacity(1).unwrap(), (8 << 20 >> 9, 512));
    assert_eq!(s.read_capacity(0).unwrap(), (16 << 20 >> 9, 512));
    let _ = s.logout();
}
