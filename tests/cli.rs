//! The `openarray` command line: configuration checking and the serve
//! lifecycle, run as the real binary.

mod common;

use common::{free_port, free_port_on};

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

fn openarray() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_openarray"));
    cmd.env_remove("RUST_LOG")
        .env("OPENARRAY_CONFIG", common::NO_CONFIG);
    cmd
}

fn run(args: &[&str]) -> Output {
    openarray()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run openarray")
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/openarray.toml")
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A running `openarray serve`, killed if the test ends early. Its output
/// goes to a file, which says when it listens.
struct Served {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Served {
    /// Starts `openarray serve` with the arguments `setup` makes, and waits
    /// until its log says it listens on each address `setup` returns; if a
    /// port was taken meanwhile, `setup` is asked again for new ports
    /// ([`common::retrying_taken_ports`]).
    fn start(setup: impl Fn() -> (Vec<String>, Vec<SocketAddr>)) -> (Served, Vec<SocketAddr>) {
        common::retrying_taken_ports(|| {
            let (args, addrs) = setup();
            let mut served = Served::spawn(&args);
            served.wait_listening(&addrs).map(|()| (served, addrs))
        })
    }

    fn spawn(args: &[String]) -> Served {
        let mut args = args.to_vec();
        // Tests run many daemons at once: none takes the default socket.
        if !args.iter().any(|a| a == "--admin-socket") {
            args.extend(["--admin-socket".into(), "none".into()]);
        }
        Served::spawn_exactly(&args)
    }

    /// `openarray serve ARGS`, nothing added.
    fn spawn_exactly(args: &[String]) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("serve.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = openarray()
            .arg("serve")
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start openarray serve");
        Served {
            child,
            log,
            _dir: dir,
        }
    }

    /// Waits for the log lines of every address; the log if it exits first.
    fn wait_listening(&mut self, addrs: &[SocketAddr]) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = self.log();
            if addrs.iter().all(|&addr| common::listening_at(&log, addr)) {
                return Ok(());
            }
            if self.child.try_wait().unwrap().is_some() {
                return Err(self.log());
            }
            assert!(
                Instant::now() < deadline,
                "openarray never listened on {addrs:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: sends a signal to our own child process.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill failed");
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "openarray did not exit: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn check_config_accepts_the_example() {
    let out = run(&["check-config", example().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("openarray.toml: ok"), "{stdout}");
    assert!(stdout.contains("2 target(s)"), "{stdout}");
}

#[test]
fn check_config_names_file_line_field_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "bad.toml",
        "[[device]]\nname = \"d0\"\nkind = \"mem\"\nsize = \"12Q\"\n\n[[target]]\nname = \"iqn.2026-11.org.example:t\"\n[[target.lun]]\nlun = 0\ndevice = \"nope\"\n",
    );
    let out = run(&["check-config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let file = path.display().to_string();
    assert!(
        err.contains(&format!(
            "{file}:4:8: device[0].size: unknown size unit `Q`"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{file}:10:10: target[0].lun[0].device: no [[device]] is named `nope`"
        )),
        "{err}"
    );
}

#[test]
fn check_config_reports_unknown_fields_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "typo.toml",
        "[[portal]]\nlisten = \"127.0.0.1:3260\"\nbacklog = 5\n",
    );
    let out = run(&["check-config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("typo.toml:3:1: portal[0].backlog: unknown field `backlog`"),
        "{}",
        stderr(&out)
    );

    // A file that cannot be read is a usage error, like a bad argument.
    let out = run(&["check-config", "/nonexistent/openarray.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("/nonexistent/openarray.toml: cannot read"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn check_config_reports_ten_independent_mistakes_in_one_run() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/control/src/validate/ten_mistakes.toml");
    let out = run(&["check-config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let file = path.display();
    let expected = [
        "4:10: portal[0].listen: `127.0.0.1:http` is not an address with port",
        "11:8: device[1].name: device `d0` is already defined (line 6)",
        "17:1: device[2].colour: unknown field `colour`",
        "51:11: device[10].members: no [[device]] is named `ghost`",
        "56:9: device[11].level: expected 0, 1, 10, 5 or 6, found 7",
        "62:9: device[12].cache: `ssd` is already used by device `parity`",
        "69:11: device[13].backing: the cache and the backing must be two devices",
        "76:9: device[14].chunk: 3072 bytes: a chunk is a multiple of 4K",
        "85:10: target[0].lun[1].device: no [[device]] is named `nothing`",
        "87:7: target[0].lun[2].lun: LUN 0 is already mapped here",
    ];
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), expected.len(), "{err}");
    // One line each, in file order.
    for (line, want) in lines.iter().zip(expected) {
        assert!(line.starts_with(&format!("{file}:{want}")), "{err}");
    }
}

#[test]
fn default_config_is_printed_and_valid() {
    let out = run(&["default-config"]);
    assert!(out.status.success());
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "default.toml",
        &String::from_utf8(out.stdout).unwrap(),
    );
    let out = run(&["check-config", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn serve_refuses_a_bad_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "bad.toml", "[[target]]\nname = \"Target1\"\n");
    let out = run(&["serve", "--config", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("{}:2:8: target[0].name", path.display())),
        "{err}"
    );
}

#[test]
fn serve_reports_a_device_that_cannot_be_opened() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.img");
    let text = format!(
        "[[portal]]\nlisten = \"127.0.0.1:{}\"\n\n[[device]]\nname = \"d0\"\nkind = \"file\"\npath = \"{}\"\n\n[[target]]\nname = \"iqn.2026-11.org.example:t\"\n[[target.lun]]\nlun = 0\ndevice = \"d0\"\n",
        free_port(),
        missing.display()
    );
    let path = write(&dir, "nofile.toml", &text);
    let out = run(&["serve", "--config", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("device[0].path") && err.contains("missing.img"),
        "{err}"
    );
}

#[test]
fn serve_rejects_a_bad_listen_address() {
    let out = run(&["serve", "--listen", "localhost"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--listen"), "{}", stderr(&out));
}

#[test]
fn serve_listens_and_stops_cleanly_on_sigterm() {
    let (mut served, addrs) = Served::start(|| {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        (vec!["--listen".into(), addr.to_string()], vec![addr])
    });
    let addr = addrs[0];
    served.signal(libc::SIGTERM);
    let status = served.wait_exit();
    assert!(status.success(), "exit {status}: {}", served.log());
    // The port is free again.
    assert!(TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err());
}

#[test]
fn serve_with_a_file_device_flushes_and_stops_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("lun0.img");
    let state = dir.path().join("state");
    let (mut served, _) = Served::start(|| {
        let port = free_port();
        let text = format!(
        "[daemon]\nstate_dir = \"{}\"\n\n[[portal]]\nlisten = \"127.0.0.1:{port}\"\n\n[[device]]\nname = \"d0\"\nkind = \"file\"\npath = \"{}\"\nsize = \"64M\"\nblock_size = 4096\n\n[[target]]\nname = \"iqn.2026-11.org.example:filetest\"\n[[target.lun]]\nlun = 3\ndevice = \"d0\"\n",
        state.display(),
        image.display()
    );
        let config = write(&dir, "file.toml", &text);
        let args = ["--config", config.to_str().unwrap(), "--log-level", "debug"];
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        (args.map(String::from).to_vec(), vec![addr])
    });
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 64 << 20);
    assert!(state.is_dir());
    served.signal(libc::SIGINT);
    let status = served.wait_exit();
    assert!(status.success(), "exit {status}: {}", served.log());
}

#[test]
fn serve_listens_on_ipv6_loopback() {
    // Skip where the machine has no IPv6 loopback.
    if TcpListener::bind("[::1]:0").is_err() {
        return;
    }
    let (mut served, _) = Served::start(|| {
        let v6: SocketAddr = format!("[::1]:{}", free_port_on("::1")).parse().unwrap();
        let v4: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let args = vec![
            "--listen".into(),
            v6.to_string(),
            "--listen".into(),
            v4.to_string(),
        ];
        (args, vec![v6, v4])
    });
    served.signal(libc::SIGTERM);
    assert!(served.wait_exit().success());
}

#[test]
fn serve_offers_the_configured_targets_and_luns() {
    // Needs libiscsi's iscsi-ls; skip where it is not installed.
    if Command::new("iscsi-ls").arg("--help").output().is_err() {
        eprintln!("skipped: iscsi-ls not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (mut served, addrs) = Served::start(|| {
        let port = free_port();
        let text = format!(
        "[[portal]]\nlisten = \"127.0.0.1:{port}\"\n\n[[device]]\nname = \"small\"\nkind = \"mem\"\nsize = \"64M\"\nblock_size = 4096\n\n[[device]]\nname = \"zero\"\nkind = \"null\"\nsize = \"1G\"\n\n[[target]]\nname = \"iqn.2026-11.org.example:one\"\n[[target.lun]]\nlun = 201\ndevice = \"small\"\n[[target.lun]]\nlun = 0\ndevice = \"zero\"\n\n[[target]]\nname = \"iqn.2026-11.org.example:two\"\n[[target.lun]]\nlun = 7\ndevice = \"small\"\n"
    );
        let config = write(&dir, "two.toml", &text);
        let args = vec!["--config".into(), config.to_str().unwrap().into()];
        (args, vec![format!("127.0.0.1:{port}").parse().unwrap()])
    });
    let addr = addrs[0];
    let out = Command::new("iscsi-ls")
        .arg("-s")
        .arg(format!("iscsi://{addr}"))
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{listing}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "Target:iqn.2026-11.org.example:one",
        "Target:iqn.2026-11.org.example:two",
        "Lun:201",
        "Lun:7",
        "Lun:0",
    ] {
        assert!(listing.contains(want), "`{want}` missing from:\n{listing}");
    }
    served.signal(libc::SIGTERM);
    assert!(served.wait_exit().success());
}

/// `openarray serve` with no socket option opens the default one, which
/// `openarray target list` finds with no option either; a second daemon
/// refuses to start over it, and a clean stop removes it.
#[test]
fn the_admin_socket_is_on_by_default() {
    const DEFAULT: &str = "/run/openarray.sock";
    let spawn =
        |port: u16| Served::spawn_exactly(&["--listen".into(), format!("127.0.0.1:{port}")]);
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut first = spawn(addr.port());
    first.wait_listening(&[addr]).expect("first daemon listens");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !first.log().contains("administration API listening") {
        assert!(Instant::now() < deadline, "{}", first.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(first.log().contains(DEFAULT), "{}", first.log());
    let listed = run(&["target", "list"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("iqn.2026-11.org.openarray:default"),
        "{listed:?}"
    );

    let mut second = spawn(free_port());
    let status = second.wait_exit();
    assert!(!status.success());
    assert!(
        second
            .log()
            .contains(&format!("another daemon is serving on {DEFAULT}")),
        "{}",
        second.log()
    );

    first.signal(libc::SIGTERM);
    assert!(first.wait_exit().success(), "{}", first.log());
    assert!(!Path::new(DEFAULT).exists(), "the socket is left behind");
}
