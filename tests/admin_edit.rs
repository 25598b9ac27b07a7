//! The imperative administration commands (`openarray group|lun|initiator|
//! chap|device|portal ...`) against a running daemon while another session
//! runs verified I/O on an untouched LUN: initiators see exactly their
//! LUNs, read-only mappings refuse writes, portals come and go, the state
//! survives a restart, and a refused edit changes nothing.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::iscsi::{rw10_cdb, Completion, LoginParams, Session};
use common::{free_port, require_tool, run_with_timeout};

const TARGET: &str = "iqn.2026-11.org.test:edit";
const ESX1: &str = "iqn.1998-01.com.vmware:esx1";
const LINUX1: &str = "iqn.2026-11.org.test:linux-1";
const STRANGER: &str = "iqn.2026-11.org.test:stranger";
const LINUX_SECRET: &str = "linux-secret-0123";
const MUTUAL_SECRET: &str = "array-secret-4567";

fn config(dir: &Path, port: u16) -> String {
    let d = dir.display();
    format!(
        r#"# edited by the test through the CLI only
[[portal]]
listen = "127.0.0.1:{port}"

[[device]]
name = "shared"
kind = "file"
path = "{d}/shared.img"
size = "4M"

[[device]]
name = "other"
kind = "file"
path = "{d}/other.img"
size = "4M"

[[target]]
name = "{TARGET}"
[[target.group]]
name = "esx"
initiators = ["{ESX1}"]
[[target.group.lun]]
lun = 3
device = "other"
[[target.group.lun]]
lun = 201
device = "shared"
"#
    )
}

/// `openarray serve --config FILE --admin-socket SOCK` on the configured
/// portals (no `--listen`, so portal changes are live); killed on drop.
struct Daemon {
    child: Child,
    port: u16,
    socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    fn start(config: &Path, dir: &Path, port: u16) -> Daemon {
        let socket = dir.join("admin.sock");
        let log = dir.join(format!(
            "daemon-{}.log",
            Instant::now().elapsed().as_nanos()
        ));
        let logfile = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_openarray"))
            .arg("serve")
            .arg("--config")
            .arg(config)
            .arg("--admin-socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(logfile.try_clone().unwrap())
            .stderr(logfile)
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

    /// `openarray ARGS --socket SOCK`.
    fn cli(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_openarray"));
        cmd.args(args).arg("--socket").arg(&self.socket);
        let out = run_with_timeout(cmd, Duration::from_secs(60));
        eprintln!(
            "openarray {args:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(out.status.success(), "openarray {args:?} failed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// LUN numbers `initiator` sees through `iscsi-ls -s` on `port`
    /// (`credentials` as `user%secret@` or empty).
    fn luns(&self, port: u16, initiator: &str, credentials: &str) -> Vec<u64> {
        let mut cmd = Command::new("iscsi-ls");
        cmd.arg("-s")
            .arg("-i")
            .arg(initiator)
            .arg(format!("iscsi://{credentials}127.0.0.1:{port}"));
        let out = run_with_timeout(cmd, Duration::from_secs(60));
        let mut luns: Vec<u64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("Lun:"))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect();
        // With two portals the target is listed (and its LUNs) once per portal.
        luns.sort();
        luns.dedup();
        luns
    }

    fn targets(&self, initiator: &str) -> String {
        let mut cmd = Command::new("iscsi-ls");
        cmd.arg("-i")
            .arg(initiator)
            .arg(format!("iscsi://127.0.0.1:{}", self.port));
        String::from_utf8_lossy(&run_with_timeout(cmd, Duration::from_secs(60)).stdout).into_owned()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one I/O session saw.
#[derive(Debug, Default)]
struct IoOutcome {
    /// Rounds of write + read back + compare that succeeded.
    rounds: u64,
    /// A unit attention REPORTED LUNS DATA HAS CHANGED arrived.
    luns_changed: bool,
    /// Commands ended with LOGICAL UNIT NOT SUPPORTED (the LUN was removed).
    lun_gone: bool,
}

/// ASC and ASCQ of fixed or descriptor format sense data.
fn asc(c: &Completion) -> (u8, u8) {
    let at = |i: usize| c.sense.get(i).copied().unwrap_or(0);
    match at(0) & 0x7f {
        0x72 | 0x73 => (at(2), at(3)),
        _ => (at(12), at(13)),
    }
}

/// One command, retried past unit attentions (noting a changed LUN map).
fn command(
    s: &mut Session,
    lun: u64,
    cdb: &[u8],
    data: &[u8],
    read_len: usize,
    seen: &mut IoOutcome,
) -> Result<Completion, String> {
    for _ in 0..8 {
        let c = s
            .command(lun, cdb, data, read_len)
            .map_err(|e| format!("round {}: {e}", seen.rounds))?;
        if c.sense_key() != Some(6) {
            return Ok(c);
        }
        if asc(&c) == (0x3f, 0x0e) {
            seen.luns_changed = true;
        }
    }
    Err("unit attentions kept coming".into())
}

/// Writes, reads back and compares LUN `lun` as ESX1 until `stop` (and at
/// least 20 rounds), or with `until_gone` until the LUN is removed: then
/// the only acceptable failure is LOGICAL UNIT NOT SUPPORTED.
fn verified_io(
    port: u16,
    lun: u64,
    stop: Arc<AtomicBool>,
    until_gone: bool,
    progress: Arc<AtomicU64>,
) -> Result<IoOutcome, String> {
    // One session per LUN: the same ISID would reinstate (end) the other.
    let mut params = LoginParams::normal(ESX1, TARGET);
    params.isid[5] = lun as u8;
    let mut s = Session::login(
        ([127, 0, 0, 1], port).into(),
        &params,
        Duration::from_secs(10),
    )
    .map_err(|e| format!("login: {e}"))?;
    let mut seen = IoOutcome::default();
    let gone = |c: &Completion| c.sense_key() == Some(0x05) && asc(c) == (0x25, 0x00);
    while until_gone || !stop.load(Ordering::Relaxed) || seen.rounds < 20 {
        let lba = (seen.rounds % 64) as u32 * 8;
        let data: Vec<u8> = (0..4096u32)
            .map(|i| (i as u64 * 13 + seen.rounds * 5 + lun) as u8)
            .collect();
        let w = command(&mut s, lun, &rw10_cdb(0x2a, lba, 8), &data, 0, &mut seen)?;
        let r = command(&mut s, lun, &rw10_cdb(0x28, lba, 8), &[], 4096, &mut seen)?;
        if until_gone && (gone(&w) || gone(&r)) {
            seen.lun_gone = true;
            break;
        }
        if w.status != 0 || r.status != 0 {
            return Err(format!(
                "round {}: status {:#x}/{:#x}, sense {:02x?} {:02x?}",
                seen.rounds, w.status, r.status, w.sense, r.sense
            ));
        }
        if r.data != data {
            return Err(format!("round {}: data read back differs", seen.rounds));
        }
        seen.rounds += 1;
        progress.store(seen.rounds, Ordering::Relaxed);
    }
    s.logout().map_err(|e| format!("logout: {e}"))?;
    Ok(seen)
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
    let daemon = Daemon::start(&path, dir.path(), port);
    assert_eq!(daemon.luns(port, ESX1, ""), vec![3, 201]);

    // Verified I/O on LUN 3 runs through every change below.
    let stop = Arc::new(AtomicBool::new(false));
    let io = {
        let stop = stop.clone();
        let progress = Arc::new(AtomicU64::new(0));
        std::thread::spawn(move || verified_io(port, 3, stop, false, progress))
    };

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
    let progress = Arc::new(AtomicU64::new(0));
    let (done_tx, done_rx) = mpsc::channel();
    {
        let progress = progress.clone();
        let never = Arc::new(AtomicBool::new(false));
        std::thread::spawn(move || {
            let _ = done_tx.send(verified_io(port, 5, never, true, progress));
        });
    }
    let start = Instant::now();
    while progress.load(Ordering::Relaxed) < 10 {
        assert!(start.elapsed() < Duration::from_secs(60), "no I/O on LUN 5");
        std::thread::sleep(Duration::from_millis(10));
    }
    daemon.ok(&["lun", "remove", TARGET, "5", "--group", "esx"]);
    let removed = done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("I/O on the removed LUN ended")
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
    assert!(!daemon.targets(STRANGER).contains(TARGET));
    assert_eq!(write_sense_key(port, LINUX1, 0), Some(0x07), "DATA PROTECT");
    assert_eq!(write_sense_key(port, LINUX1, 1), None, "LUN 1 is writable");

    // CHAP for the linux group, the secret from a file.
    let secret_file = dir.path().join("linux.secret");
    std::fs::write(&secret_file, format!("{LINUX_SECRET}\n")).unwrap();
    daemon.ok(&[
        "chap",
        "set",
        "--target",
        TARGET,
        "--group",
        "linux",
        "--user",
        "linux",
        "--secret-file",
        secret_file.to_str().unwrap(),
    ]);
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
    daemon.ok(&[
        "chap",
        "set",
        "--target",
        TARGET,
        "--group",
        "linux",
        "--user",
        "linux",
        "--secret-file",
        secret_file.to_str().unwrap(),
    ]);
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
    assert_eq!(daemon.luns(port2, ESX1, ""), vec![3, 201]);
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

    stop.store(true, Ordering::Relaxed);
    let untouched = io
        .join()
        .unwrap()
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
    let restarted = Daemon::start(&path, dir.path(), port);
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
