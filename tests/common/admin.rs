//! A daemon with an administration socket, and the `openarray` command line
//! that edits it: `openarray serve --config FILE --admin-socket SOCK`,
//! killed on drop.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{listening_on, run_echoed, run_with_timeout, serve_command};

/// Numbers the daemon logs, so a restart in the same directory keeps the
/// log of the daemon before it.
static LOG_SEQ: AtomicUsize = AtomicUsize::new(0);

/// A configuration with one portal on 127.0.0.1:`port`, the 4 MiB file
/// devices `shared` and `other` under `dir`, and `target`, whose group
/// `esx` admits `initiator` and maps `luns` (LUN number, device) in order.
pub fn esx_config(
    dir: &Path,
    port: u16,
    target: &str,
    initiator: &str,
    luns: &[(u64, &str)],
) -> String {
    let mut text = format!("[[portal]]\nlisten = \"127.0.0.1:{port}\"\n");
    for device in ["shared", "other"] {
        let path = dir.join(format!("{device}.img"));
        let _ = write!(
            text,
            "\n[[device]]\nname = \"{device}\"\nkind = \"file\"\npath = \"{}\"\nsize = \"4M\"\n",
            path.display()
        );
    }
    let _ = write!(
        text,
        "\n[[target]]\nname = \"{target}\"\n[[target.group]]\nname = \"esx\"\ninitiators = [\"{initiator}\"]\n"
    );
    for (lun, device) in luns {
        let _ = write!(
            text,
            "[[target.group.lun]]\nlun = {lun}\ndevice = \"{device}\"\n"
        );
    }
    text
}

/// Sends an HTTP/1.1 `request` on `stream` and reads the answer to its
/// end: the status code and the body.
pub fn http_exchange(mut stream: impl Read + Write, request: &str) -> (u16, String) {
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    (status, body.to_string())
}

/// A portal on 127.0.0.1:`port` and a pool `tank` of `device_size`
/// under `dir` serving volume `thin0` (16M) as LUN 0 of `target`, and
/// `extra` more text.
pub fn pool_config(dir: &Path, port: u16, target: &str, device_size: &str, extra: &str) -> String {
    format!(
        r#"[[portal]]
listen = "127.0.0.1:{port}"

[[pool]]
name = "tank"
devices = ["{d}/tank0.img"]
device_size = "{device_size}"

[[device]]
name = "thin0"
kind = "volume"
pool = "tank"
size = "16M"

[[target]]
name = "{target}"
[[target.lun]]
lun = 0
device = "thin0"
{extra}"#,
        d = dir.display()
    )
}

/// `openarray ARGS`, given a minute; what it printed goes to the test's
/// output so a failure shows the command's own words.
pub fn run_openarray<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_openarray"));
    cmd.args(args);
    run_echoed(cmd, Duration::from_secs(60))
}

/// A daemon serving a config file with its administration socket open.
pub struct AdminDaemon {
    child: Child,
    pub port: u16,
    pub socket: PathBuf,
    log: PathBuf,
}

impl AdminDaemon {
    /// On the portals of `config` (no `--listen`, so portal changes are
    /// live); `port` is one of them, waited for.
    pub fn start(config: &Path, dir: &Path, port: u16) -> AdminDaemon {
        AdminDaemon::spawn(config, dir, port, &[])
    }

    /// With `--listen 127.0.0.1:PORT`, which pins the portals.
    pub fn start_listening(config: &Path, dir: &Path, port: u16) -> AdminDaemon {
        let listen = format!("127.0.0.1:{port}");
        AdminDaemon::spawn(config, dir, port, &["--listen", &listen])
    }

    /// [`AdminDaemon::start`], or the daemon's log where it exited before
    /// it listened (a port taken meanwhile: [`retrying_taken_ports`]).
    ///
    /// [`retrying_taken_ports`]: super::retrying_taken_ports
    pub fn try_start(config: &Path, dir: &Path, port: u16) -> Result<AdminDaemon, String> {
        AdminDaemon::try_spawn(config, dir, port, &[])
    }

    fn spawn(config: &Path, dir: &Path, port: u16, extra: &[&str]) -> AdminDaemon {
        AdminDaemon::try_spawn(config, dir, port, extra)
            .unwrap_or_else(|log| panic!("daemon exited before listening:\n{log}"))
    }

    fn try_spawn(
        config: &Path,
        dir: &Path,
        port: u16,
        extra: &[&str],
    ) -> Result<AdminDaemon, String> {
        let socket = dir.join("admin.sock");
        let seq = LOG_SEQ.fetch_add(1, Ordering::Relaxed);
        let log = dir.join(format!("daemon-{seq}.log"));
        let logfile = std::fs::File::create(&log).expect("create daemon log");
        let child = serve_command()
            .arg("--config")
            .arg(config)
            .args(extra)
            .arg("--admin-socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(logfile.try_clone().expect("dup daemon log"))
            .stderr(logfile)
            .spawn()
            .expect("spawn openarray serve");
        let mut d = AdminDaemon {
            child,
            port,
            socket,
            log,
        };
        let start = Instant::now();
        // Connect to the socket rather than look for its file: a daemon
        // killed with SIGKILL leaves the file behind.
        while !listening_on(&d.log(), port) || UnixStream::connect(&d.socket).is_err() {
            if let Ok(Some(status)) = d.child.try_wait() {
                return Err(format!("exit {status}:\n{}", d.log()));
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "daemon did not start:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(d)
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The portal it was started with (`port` on 127.0.0.1).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// SIGTERM, and how the daemon exited.
    pub fn terminate(mut self) -> ExitStatus {
        // SAFETY: kill(2) on our own child, still unreaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().expect("wait for daemon")
    }

    /// Everything the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `openarray ARGS --socket SOCK` (the editing commands).
    pub fn cli(&self, args: &[&str]) -> Output {
        let socket = ["--socket".as_ref(), self.socket.as_os_str()];
        run_openarray(args.iter().map(OsStr::new).chain(socket))
    }

    /// `openarray ARGS --socket SOCK`, which must succeed; its standard
    /// output.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(out.status.success(), "openarray {args:?} failed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `openarray config --socket SOCK ARGS`.
    pub fn config_cli(&self, args: &[&str]) -> Output {
        let socket = [
            "config".as_ref(),
            "--socket".as_ref(),
            self.socket.as_os_str(),
        ];
        run_openarray(socket.into_iter().chain(args.iter().map(OsStr::new)))
    }

    /// LUN numbers `initiator` sees through `iscsi-ls -s` on `port`
    /// (`credentials` as `user%secret@` or empty), as listed: a target
    /// reachable through two portals is listed (with its LUNs) twice.
    pub fn luns(&self, port: u16, initiator: &str, credentials: &str) -> Vec<u64> {
        let mut cmd = Command::new("iscsi-ls");
        cmd.arg("-s")
            .arg("-i")
            .arg(initiator)
            .arg(format!("iscsi://{credentials}127.0.0.1:{port}"));
        let out = run_with_timeout(cmd, Duration::from_secs(60));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("Lun:"))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect()
    }
}

impl Drop for AdminDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
