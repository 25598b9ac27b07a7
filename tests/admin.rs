//! Live administration through `openarray config ...` and the daemon's
//! unix socket: a change of groups and LUN maps while another session runs
//! verified I/O, idempotent apply, a refused change that changes nothing,
//! and the applied state surviving a restart.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::iscsi::{LoginParams, Session};
use common::{free_port, require_tool, run_with_timeout};

const TARGET: &str = "iqn.2026-11.org.test:admin";
const ESX1: &str = "iqn.1998-01.com.vmware:esx1";

fn config(esx_luns: &[(u64, &str)]) -> String {
    let mut text = format!(
        r#"[[portal]]
listen = "127.0.0.1:3260"

[[device]]
name = "shared"
kind = "file"
path = "@DIR@/shared.img"
size = "4M"

[[device]]
name = "other"
kind = "file"
path = "@DIR@/other.img"
size = "4M"

[[target]]
name = "{TARGET}"
[[target.group]]
name = "esx"
initiators = ["{ESX1}"]
"#
    );
    for (lun, device) in esx_luns {
        text.push_str(&format!(
            "[[target.group.lun]]\nlun = {lun}\ndevice = \"{device}\"\n"
        ));
    }
    text
}

/// `openarray serve --config FILE --listen PORT --admin-socket SOCK`,
/// killed on drop.
struct Daemon {
    child: Child,
    port: u16,
    socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    fn start(config: &Path, dir: &Path, port: u16) -> Daemon {
        let socket = dir.join("admin.sock");
        let log = dir.join(format!("daemon-{port}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_openarray"))
            .arg("serve")
            .arg("--config")
            .arg(config)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--admin-socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn openarray serve");
        let d = Daemon {
            child,
            port,
            socket,
            log,
        };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() || !d.socket.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "daemon did not start:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn cli(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_openarray"));
        cmd.arg("config")
            .arg("--socket")
            .arg(&self.socket)
            .args(args);
        let out = run_with_timeout(cmd, Duration::from_secs(60));
        eprintln!(
            "openarray config {args:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// LUN numbers `initiator` sees, from `iscsi-ls -s`.
    fn luns(&self, initiator: &str) -> Vec<u64> {
        let mut cmd = Command::new("iscsi-ls");
        cmd.arg("-s")
            .arg("-i")
            .arg(initiator)
            .arg(format!("iscsi://127.0.0.1:{}", self.port));
        let out = run_with_timeout(cmd, Duration::from_secs(60));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("Lun:"))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes and reads back LUN `lun` until told to stop; returns the number
/// of verified rounds or the first error.
fn verified_io(port: u16, lun: u64, stop: Arc<AtomicBool>) -> Result<u64, String> {
    let mut s = Session::login(
        ([127, 0, 0, 1], port).into(),
        &LoginParams::normal(ESX1, TARGET),
        Duration::from_secs(10),
    )
    .map_err(|e| format!("login: {e}"))?;
    let mut rounds = 0u64;
    while !stop.load(Ordering::Relaxed) || rounds < 20 {
        let lba = (rounds % 64) as u32 * 8;
        let data: Vec<u8> = (0..4096u32)
            .map(|i| (i as u64 * 31 + rounds * 7) as u8)
            .collect();
        s.write10(lun, lba, &data, 512)
            .map_err(|e| format!("write round {rounds}: {e}"))?;
        let back = s
            .read10(lun, lba, 8, 512)
            .map_err(|e| format!("read round {rounds}: {e}"))?;
        if back != data {
            return Err(format!("round {rounds}: data read back differs"));
        }
        rounds += 1;
    }
    s.logout().map_err(|e| format!("logout: {e}"))?;
    Ok(rounds)
}

#[test]
fn live_changes_apply_persist_and_leave_other_io_alone() {
    require_tool("iscsi-ls");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let path = dir.path().join("openarray.toml");
    let v1 = config(&[(201, "shared"), (3, "other")]).replace("@DIR@", d);
    std::fs::write(&path, &v1).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let daemon = Daemon::start(&path, dir.path(), free_port());
    assert_eq!(daemon.luns(ESX1), vec![3, 201]);

    // Verified I/O on LUN 3 runs through every change below.
    let stop = Arc::new(AtomicBool::new(false));
    let io = {
        let stop = stop.clone();
        let port = daemon.port;
        std::thread::spawn(move || verified_io(port, 3, stop))
    };
    std::thread::sleep(Duration::from_millis(300));

    // LUN 201 goes, LUN 7 comes: same device under a new number.
    let v2 = config(&[(7, "shared"), (3, "other")]).replace("@DIR@", d);
    let v2_path = dir.path().join("v2.toml");
    std::fs::write(&v2_path, &v2).unwrap();
    let diff = daemon.cli(&["diff", v2_path.to_str().unwrap()]);
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

    let apply = daemon.cli(&["apply", v2_path.to_str().unwrap()]);
    assert!(apply.status.success());
    assert!(stdout(&apply).contains("LUN 7 = shared"));
    assert_eq!(daemon.luns(ESX1), vec![3, 7]);
    let list = stdout(&daemon.cli(&["list"]));
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
    let again = daemon.cli(&["apply", v2_path.to_str().unwrap()]);
    assert!(again.status.success());
    assert_eq!(stdout(&again).trim(), "no changes");
    let diff = daemon.cli(&["diff", v2_path.to_str().unwrap()]);
    assert_eq!(diff.status.code(), Some(0));

    // A bad change is refused, names the field, and changes nothing.
    let bad = config(&[(7, "shared"), (3, "missing")]).replace("@DIR@", d);
    let bad_path = dir.path().join("bad.toml");
    std::fs::write(&bad_path, &bad).unwrap();
    let refused = daemon.cli(&["apply", bad_path.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("bad.toml:") && err.contains("target[0].group[0].lun[1].device"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), v2);
    assert_eq!(stdout(&daemon.cli(&["show"])), v2);
    assert_eq!(daemon.luns(ESX1), vec![3, 7]);

    // Under --listen the portals are pinned: a portal edit is refused.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_openarray"));
    cmd.args(["portal", "add", "127.0.0.1:1", "--socket"])
        .arg(&daemon.socket);
    let refused = run_with_timeout(cmd, Duration::from_secs(60));
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--listen"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), v2);

    stop.store(true, Ordering::Relaxed);
    let rounds = io
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("I/O on the untouched LUN failed: {e}\n{}", daemon.log()));
    assert!(rounds >= 20);
    assert!(daemon.log().contains("configuration applied"));

    // The applied state is what a restart serves.
    let port = daemon.port;
    drop(daemon);
    let restarted = Daemon::start(&path, dir.path(), port);
    assert_eq!(restarted.luns(ESX1), vec![3, 7]);
    let saved = restarted.cli(&["save"]);
    assert!(saved.status.success());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), v2);
}

#[test]
fn the_cli_says_when_no_daemon_listens() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_openarray"));
    cmd.arg("config")
        .arg("--socket")
        .arg(dir.path().join("none.sock"))
        .arg("show");
    let out = run_with_timeout(cmd, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the daemon"));
}
