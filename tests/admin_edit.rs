//! The imperative administration commands (`openarray group|lun|initiator|
//! chap|device|portal ...`) against a running daemon while another session
//! runs verified I/O on an untouched LUN: initiators see exactly their
//! LUNs, read-only mappings refuse writes, portals come and go, the state
//! survives a restart, and a refused edit changes nothing.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::admin::{esx_config, AdminDaemon};
use common::iscsi::{rw10_cdb, LoginParams, Session};
use common::verified_io::BackgroundIo;
use common::{free_port, require_tool, run_with_timeout};

const TARGET: &str = "iqn.2026-11.org.test:edit";
const ESX1: &str = "iqn.1998-01.com.vmware:esx1";
const LINUX1: &str = "iqn.2026-11.org.test:linux-1";
const STRANGER: &str = "iqn.2026-11.org.test:stranger";
const LINUX_SECRET: &str = "linux-secret-0123";
const MUTUAL_SECRET: &str = "array-secret-4567";

/// The starting configuration, served on `port`, with a comment the edits
/// must keep.
fn config(dir: &Path, port: u16) -> String {
    let luns = [(3, "other"), (201, "shared")];
    let body = esx_config(dir, port, TARGET, ESX1, &luns);
    format!("# edited by the test through the CLI only\n{body}")
}

/// Distinct LUN numbers `initiator` sees through `iscsi-ls -s` on `port`,
/// sorted: with two portals the target (and its LUNs) is listed once per
/// portal.
fn distinct_luns(daemon: &AdminDaemon, port: u16, initiator: &str) -> Vec<u64> {
    let mut luns = daemon.luns(port, initiator, "");
    luns.sort();
    luns.dedup();
    luns
}

/// Target names `initiator` is shown by `iscsi-ls` on the daemon's port.
fn targets(daemon: &AdminDaemon, initiator: &str) -> String {
    let mut cmd = Command::new("iscsi-ls");
    cmd.arg("-i")
        .arg(initiator)
        .arg(format!("iscsi://127.0.0.1:{}", daemon.port));
    String::from_utf8_lossy(&run_with_timeout(cmd, Duration::from_secs(60)).stdout).into_owned()
}

/// One-way CHAP for the linux group: user `linux`, the secret from
/// `secret_file` (a set replaces any credentials the group had).
fn set_one_way_chap(daemon: &AdminDaemon, secret_file: &Path) {
    let secret_file = secret_file.to_str().unwrap();
    let group = ["--target", TARGET, "--group", "linux"];
    let user = ["--user", "linux", "--secret-file", secret_file];
    daemon.ok(&[&["chap", "set"][..], &group, &user].concat());
}

/// The sense key of a one-block WRITE(10) to `lun` as `initiator`, past
/// the unit attentions a new session gets.
fn write_sense_key(port: u16, initiator: &str, lun: u64) -> Option<u8> {
    let mut s = Session::login(
        ([127, 0, 0, 1], port).into(),
        &LoginParams::normal(initiator, TARGET),
        Duration::from_secs(10),
    )
    .expect("login");
    for _ in 0..4 {
        let c = s
            .command(lun, &rw10_cdb(0x2a, 0, 1), &[0u8; 512], 0)
            .unwrap();
        if c.sense_key() != Some(6) {
            let _ = s.logout();
            return c.sense_key();
        }
    }
    panic!("unit attentions kept coming");
}

/// `iscsi-inq -i LINUX1 URL` with extra environment; true on success.
fn inq(url: &str, env: &[(&str, &str)]) -> bool {
    let mut cmd = Command::new("iscsi-inq");
    cmd.arg("-i").arg(LINUX1).arg(url);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_with_timeout(cmd, Duration::from_secs(60))
        .status
        .success()
}

#[test]
fn cli_edits_apply_live_persist_and_refuse_bad_changes() {
    require_tool("iscsi-ls");
    require_tool("iscsi-inq");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openarray.toml");
    let port = free_port();
    std::fs::write(&path, config(dir.path(), port)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let daemon = AdminDaemon::start(&path, dir.path(), port);
    assert_eq!(daemon.luns(port, ESX1, ""), vec![3, 201]);

    // Verified I/O on LUN 3 runs through every change below.
    let io = BackgroundIo::start(port, ESX1, TARGET, 3);

    // A new device, a new group with its own map (the same device under
    // another number), a read-only mapping, a mapping added then removed.
    daemon.ok(&[
        "device",
        "add",
        "spare",
        "--kind",
        "file",
        "--path",
        dir.path().join("spare.img").to_str().unwrap(),
        "--size",
        "2M",
    ]);
    daemon.ok(&[
        "group",
        "add",
        TARGET,
        "linux",
        "iqn.2026-11.org.test:linux-*",
    ]);
    daemon.ok(&["lun", "add", TARGET, "0", "shared", "--group", "linux"]);
    daemon.ok(&["lun", "add", TARGET, "1", "spare", "--group", "linux"]);
    daemon.ok(&["lun", "add", TARGET, "5", "spare", "--group", "esx"]);
    assert_eq!(daemon.luns(port, ESX1, ""), vec![3, 5, 201]);

    // LUN 5 is removed while a session writes to it: its I/O ends with
    // LOGICAL UNIT NOT SUPPORTED, never a hang, an error on another LUN
    // or a wrong read.
    let doomed = BackgroundIo::until_gone(port, ESX1, TARGET, 5);
    doomed.wait_rounds(10);
    daemon.ok(&["lun", "remove", TARGET, "5", "--group", "esx"]);
    let removed = doomed
        .finish()
        .unwrap_or_else(|e| panic!("I/O on the removed LUN: {e}\n{}", daemon.log()));
    assert!(removed.lun_gone && removed.rounds >= 10, "{removed:?}");
    daemon.ok(&[
        "lun",
        "modify",
        TARGET,
        "0",
        "--group",
        "linux",
        "--read-only",
    ]);
    daemon.ok(&[
        "initiator",
        "add",
        TARGET,
        "esx",
        "iqn.1998-01.com.vmware:esx2",
    ]);
    let listed = daemon.ok(&["lun", "list", TARGET, "--group", "linux"]);
    assert_eq!(listed, "0 -> shared (read-only)\n1 -> spare\n");
    let groups = daemon.ok(&["group", "list", TARGET]);
    assert!(
        groups.contains("esx: iqn.1998-01.com.vmware:esx1, iqn.1998-01.com.vmware:esx2"),
        "{groups}"
    );
    let shown = daemon.ok(&["target", "show", TARGET]);
    assert!(shown.contains("name = \"linux\""), "{shown}");

    // Each initiator sees exactly its group's LUNs; a stranger nothing.
    assert_eq!(daemon.luns(port, ESX1, ""), vec![3, 201]);
    assert_eq!(daemon.luns(port, LINUX1, ""), vec![0, 1]);
    assert!(daemon.luns(port, STRANGER, "").is_empty());
    assert!(!targets(&daemon, STRANGER).contains(TARGET));
    assert_eq!(write_sense_key(port, LINUX1, 0), Some(0x07), "DATA PROTECT");
    assert_eq!(write_sense_key(port, LINUX1, 1), None, "LUN 1 is writable");

    // CHAP for the linux group, the secret from a file.
    let secret_file = dir.path().join("linux.secret");
    std::fs::write(&secret_file, format!("{LINUX_SECRET}\n")).unwrap();
    set_one_way_chap(&daemon, &secret_file);
    assert!(
        !std::fs::read_to_string(&path).unwrap().is_empty()
            && !daemon
                .ok(&["target", "show", TARGET])
                .contains(LINUX_SECRET),
        "show masks the secret"
    );
    assert!(
        daemon.luns(port, LINUX1, "").is_empty(),
        "no CHAP, no login"
    );
    assert!(daemon
        .luns(port, LINUX1, "linux%wrong-secret-0123@")
        .is_empty());
    assert_eq!(
        daemon.luns(port, LINUX1, &format!("linux%{LINUX_SECRET}@")),
        vec![0, 1]
    );

    // Mutual CHAP, the initiator's secret from standard input; then back
    // to one-way (a set replaces the credentials).
    let mutual_file = dir.path().join("array.secret");
    std::fs::write(&mutual_file, format!("{MUTUAL_SECRET}\n")).unwrap();
    let mut set = Command::new(env!("CARGO_BIN_EXE_openarray"));
    set.args(["chap", "set", "--target", TARGET, "--group", "linux"])
        .args([
            "--user",
            "linux",
            "--secret-file",
            "-",
            "--mutual-user",
            "array",
        ])
        .arg("--mutual-secret-file")
        .arg(&mutual_file)
        .arg("--socket")
        .arg(&daemon.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::null());
    let mut child = set.spawn().unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{LINUX_SECRET}").unwrap();
    }
    assert!(child.wait().unwrap().success());
    let url = format!("iscsi://linux%{LINUX_SECRET}@127.0.0.1:{port}/{TARGET}/0");
    assert!(inq(
        &url,
        &[
            ("LIBISCSI_CHAP_TARGET_USERNAME", "array"),
            ("LIBISCSI_CHAP_TARGET_PASSWORD", MUTUAL_SECRET)
        ]
    ));
    assert!(!inq(
        &url,
        &[
            ("LIBISCSI_CHAP_TARGET_USERNAME", "array"),
            ("LIBISCSI_CHAP_TARGET_PASSWORD", "array-secret-wrong")
        ]
    ));
    assert!(!inq(&url, &[]), "the target insists on mutual CHAP");
    set_one_way_chap(&daemon, &secret_file);
    assert!(inq(&url, &[]));
    let log = daemon.log();
    assert!(
        !log.contains(LINUX_SECRET) && !log.contains(MUTUAL_SECRET),
        "a secret reached the log"
    );

    // A second portal comes and goes without touching the first.
    let port2 = free_port();
    let portal2 = format!("127.0.0.1:{port2}");
    daemon.ok(&["portal", "add", &portal2]);
    assert_eq!(distinct_luns(&daemon, port2, ESX1), vec![3, 201]);
    assert!(daemon.ok(&["portal", "list"]).contains(&portal2));
    daemon.ok(&["portal", "remove", &portal2]);
    // `portal remove` answers once the listener is closed.
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port2)).is_err(),
        "the removed portal still accepts"
    );

    // Refused edits change nothing: neither the file nor the running state.
    let file_before = std::fs::read(&path).unwrap();
    let running_before = daemon.ok(&["config", "show"]);
    let out = daemon.cli(&["device", "remove", "shared"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("still mapped as target"), "{err}");
    let out = daemon.cli(&["lun", "add", TARGET, "9", "missing", "--group", "esx"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("target[0].group[0].lun[2].device"), "{err}");
    let out = daemon.cli(&[
        "initiator",
        "remove",
        TARGET,
        "linux",
        "iqn.2026-11.org.test:linux-*",
    ]);
    assert_eq!(out.status.code(), Some(1), "a group may not be left empty");
    let out = daemon.cli(&["portal", "add", &format!("127.0.0.1:{port}")]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read(&path).unwrap(), file_before);
    assert_eq!(daemon.ok(&["config", "show"]), running_before);
    assert_eq!(daemon.luns(port, ESX1, ""), vec![3, 201]);

    let untouched = io
        .finish()
        .unwrap_or_else(|e| panic!("I/O on the untouched LUN failed: {e}\n{}", daemon.log()));
    assert!(untouched.rounds >= 20);
    assert!(!untouched.lun_gone);
    assert!(
        untouched.luns_changed,
        "the group's sessions hear that its LUN map changed"
    );

    // The file keeps its comment, stays private, and is what a restart serves.
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.starts_with("# edited by the test through the CLI only\n"),
        "{text}"
    );
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    drop(daemon);
    let restarted = AdminDaemon::start(&path, dir.path(), port);
    assert_eq!(restarted.luns(port, ESX1, ""), vec![3, 201]);
    assert_eq!(
        restarted.luns(port, LINUX1, &format!("linux%{LINUX_SECRET}@")),
        vec![0, 1]
    );
    assert_eq!(
        restarted.ok(&["lun", "list", TARGET, "--group", "linux"]),
        "0 -> shared (read-only)\n1 -> spare\n"
    );
    assert!(std::net::TcpStream::connect(("127.0.0.1", port2)).is_err());
}

/// A RAM device `scratch` of `size` served as LUN 0 of TARGET on `port`.
fn ram_config(port: u16, size: &str, identity: &str) -> String {
    format!(
        "[[portal]]\nlisten = \"127.0.0.1:{port}\"\n\n[[device]]\nname = \"scratch\"\nkind = \"mem\"\nsize = \"{size}\"\n{identity}\n[[target]]\nname = \"{TARGET}\"\n[[target.lun]]\nlun = 0\ndevice = \"scratch\"\n"
    )
}

/// (vendor + product identification of INQUIRY, unit serial number).
fn identity(s: &mut Session) -> (String, String) {
    let std = s.command_good(0, &[0x12, 0, 0, 0, 96, 0], &[], 96).unwrap();
    let serial = s
        .command_good(0, &[0x12, 1, 0x80, 0, 255, 0], &[], 255)
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    (text(&std[16..32]), text(&serial[4..4 + serial[3] as usize]))
}

#[test]
fn ram_device_changes_keep_its_data_or_need_force() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openarray.toml");
    let port = free_port();
    std::fs::write(&path, ram_config(port, "4M", "")).unwrap();
    let daemon = AdminDaemon::start(&path, dir.path(), port);
    // Two initiators: a second login of one would replace its session.
    let login = |initiator: &str| {
        Session::login(
            ([127, 0, 0, 1], port).into(),
            &LoginParams::normal(initiator, TARGET),
            Duration::from_secs(10),
        )
        .expect("login")
    };
    let mut s = login(ESX1);
    let pattern: Vec<u8> = (0..64 * 512).map(|i| (i * 7 % 251) as u8).collect();
    s.write10(0, 100, &pattern, 512).unwrap();

    // Identity changes apply around the open RAM device: the data stays,
    // for the session that wrote it and for a new one.
    let report = daemon.ok(&[
        "device",
        "modify",
        "scratch",
        "product_id=KEPT",
        "serial=S-42",
    ]);
    assert_eq!(
        report,
        "~ device scratch product_id: (not set) → KEPT\n\
         ~ device scratch serial: (derived from the NAA) → S-42\n"
    );
    assert_eq!(s.read10(0, 100, 64, 512).unwrap(), pattern);
    let mut fresh = login(LINUX1);
    assert_eq!(identity(&mut fresh), ("KEPT".into(), "S-42".into()));
    assert_eq!(fresh.read10(0, 100, 64, 512).unwrap(), pattern);

    // So does a whole file changing the identity (config apply).
    let renamed = dir.path().join("renamed.toml");
    let applied = "product_id = \"APPLIED\"\nserial = \"S-42\"\n";
    let text = ram_config(port, "4M", applied);
    std::fs::write(&renamed, &text).unwrap();
    let apply = daemon.config_cli(&["apply", renamed.to_str().unwrap()]);
    assert!(apply.status.success());
    assert_eq!(
        String::from_utf8_lossy(&apply.stdout),
        "~ device scratch product_id: KEPT → APPLIED\n"
    );
    assert_eq!(s.read10(0, 100, 64, 512).unwrap(), pattern);
    assert_eq!(identity(&mut fresh).0, "APPLIED");

    // A resize would re-create the device: refused without --force, by
    // the edit and by a file, and nothing changes.
    let file_before = std::fs::read(&path).unwrap();
    let running_before = daemon.ok(&["config", "show"]);
    let out = daemon.cli(&["device", "modify", "scratch", "size=8M"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("(as edited):4:1: device[0].size: a RAM device cannot be resized in place")
            && err.contains("the 4M of data it holds are lost; pass --force"),
        "{err}"
    );
    let bigger = dir.path().join("bigger.toml");
    std::fs::write(&bigger, ram_config(port, "8M", applied)).unwrap();
    let diff = daemon.config_cli(&["diff", bigger.to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&diff.stdout);
    assert!(
        shown.starts_with("~ device scratch size: 4M → 8M\n! device scratch: a RAM device"),
        "{shown}"
    );
    let out = daemon.config_cli(&["apply", bigger.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bigger.toml:4:1: device[0].size"));
    assert_eq!(std::fs::read(&path).unwrap(), file_before);
    assert_eq!(daemon.ok(&["config", "show"]), running_before);
    assert_eq!(s.read_capacity(0).unwrap(), (4 << 20 >> 9, 512));
    assert_eq!(s.read10(0, 100, 64, 512).unwrap(), pattern);

    // With --force it is done, and the report says what was lost.
    let report = daemon.ok(&["device", "modify", "scratch", "size=8M", "--force"]);
    assert!(
        report.starts_with("~ device scratch size: 4M → 8M\n"),
        "{report}"
    );
    assert!(
        report.contains("! device scratch: a RAM device cannot be resized in place")
            && report.contains("the 4M of data it holds are lost"),
        "{report}"
    );
    assert!(!report.contains("Device {"), "{report}");
    assert_eq!(s.read_capacity(0).unwrap(), (8 << 20 >> 9, 512));
    assert_eq!(s.read10(0, 100, 64, 512).unwrap(), vec![0; 64 * 512]);
    let _ = s.logout();
    let _ = fresh.logout();
}

#[test]
fn removing_a_device_under_a_cache_names_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openarray.toml");
    let port = free_port();
    let devices = "[[device]]\nname = \"ssd2\"\nkind = \"mem\"\nsize = \"4M\"\n\n\
                   [[device]]\nname = \"hdd2\"\nkind = \"mem\"\nsize = \"16M\"\n\n\
                   [[device]]\nname = \"hybrid2\"\nkind = \"cache\"\ncache = \"ssd2\"\nbacking = \"hdd2\"\n";
    let text = ram_config(port, "4M", "").replace("[[target]]", &format!("{devices}\n[[target]]"));
    let text = format!("{text}[[target.lun]]\nlun = 1\ndevice = \"hybrid2\"\n");
    std::fs::write(&path, &text).unwrap();
    let daemon = AdminDaemon::start(&path, dir.path(), port);
    let out = daemon.cli(&["device", "remove", "ssd2"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("device `ssd2` is used by cache `hybrid2`"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    assert!(daemon.terminate().success());
}
