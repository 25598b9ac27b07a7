//! Shared by the integration tests: run the real `openarray` binary on free
//! loopback ports and drive real clients against it.
//!
//! - `Daemon`: `openarray serve [--config FILE] --listen 127.0.0.1:<free port>`,
//!   waits until its log says it listens on the port, discovers target names with `iscsi-ls -s`,
//!   reports pid/RSS/log, and is killed on drop.
//! - `iscsi`: a minimal initiator of our own (login, READ/WRITE(10), PDU
//!   framing) for verified I/O and for building malformed PDUs.
//! - `rng`: a seeded PRNG for reproducible test data.
//! - `admin`: a daemon with an administration socket and the command line
//!   that edits it.
//! - `nbd_clients`: qemu-img, nbdinfo, nbdcopy and fio's nbd engine,
//!   checked for success.
//! - `verified_io`: write, read back and compare a LUN in the background
//!   while a test changes the daemon.
//! - `xcopy`: EXTENDED COPY as an initiator sends it.
#![allow(dead_code)] // each test crate uses a different part of this

pub mod admin;
pub mod crash_model;
pub mod iscsi;
pub mod nbd_clients;
pub mod rng;
pub mod verified_io;
pub mod xcopy;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running daemon; killed (and reaped) on drop.
pub struct Daemon {
    child: Child,
    ports: Vec<u16>,
    log: std::path::PathBuf,
    _logdir: tempfile::TempDir,
    _config_dir: Option<tempfile::TempDir>,
}

/// A default configuration path that names no file.
pub const NO_CONFIG: &str = "/nonexistent/openarray-test/openarray.toml";

/// `openarray serve` with a log filter that, whatever RUST_LOG asks for,
/// keeps the portal's line that [`listening_on`] looks for.
pub fn serve_command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_openarray"));
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
    // Without --config, serve reads /etc/openarray/openarray.toml if an
    // install left one; the tests mean the built-in default.
    cmd.env("OPENARRAY_CONFIG", NO_CONFIG);
    cmd.arg("--log-level")
        .arg(format!("{filter},iscsi::server=info"))
        .arg("serve");
    cmd
}

/// Whether a daemon's log says it listens on `addr`. A successful connect
/// would not prove that this daemon does: the port, free when picked, may
/// serve another test's daemon, and a connect to a port nobody listens on
/// can even reach itself (TCP simultaneous open).
pub fn listening_at(log: &str, addr: SocketAddr) -> bool {
    let line = format!("iSCSI portal listening portal={addr}");
    log.lines().any(|l| l.ends_with(&line))
}

/// [`listening_at`] 127.0.0.1:`port`.
pub fn listening_on(log: &str, port: u16) -> bool {
    listening_at(log, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// Starts a daemon with `attempt` (which picks its ports, spawns it and
/// waits for it to listen, or returns its log if it exited first) until
/// one listens. A port free when picked may be taken before the daemon
/// binds it (by another test's daemon, or as the local port of a
/// connection); that daemon exits, and the next attempt picks new ports.
pub fn retrying_taken_ports<T>(mut attempt: impl FnMut() -> Result<T, String>) -> T {
    for _ in 0..5 {
        match attempt() {
            Ok(started) => return started,
            Err(log) if log.contains("Address already in use") => continue,
            Err(log) => panic!("daemon exited before listening:\n{log}"),
        }
    }
    panic!("no free ports for the daemon in five tries");
}

/// A config of `[daemon]` settings, the portal 127.0.0.1:3260 and one RAM
/// device `device` of `size` as LUN 0 of `target`.
pub fn one_ram_lun_config(daemon: &str, device: &str, size: &str, target: &str) -> String {
    format!(
        r#"[daemon]
{daemon}

[[portal]]
listen = "127.0.0.1:3260"

[[device]]
name = "{device}"
kind = "mem"
size = "{size}"

[[target]]
name = "{target}"
[[target.lun]]
lun = 0
device = "{device}"
"#
    )
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    free_port_on("127.0.0.1")
}

/// A port of `ip` (such as `::1`) nobody listens on right now.
pub fn free_port_on(ip: &str) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

impl Daemon {
    /// `openarray serve` with the embedded default on one free port.
    pub fn start() -> Daemon {
        Daemon::start_portals(None, 1)
    }

    /// `openarray serve [--config FILE]` listening on `portals` free
    /// loopback ports (new ones if one was taken: [`retrying_taken_ports`]).
    pub fn start_portals(config: Option<&Path>, portals: usize) -> Daemon {
        retrying_taken_ports(|| {
            let ports: Vec<u16> = (0..portals).map(|_| free_port()).collect();
            let mut daemon = Daemon::spawn(config, ports, &[]);
            daemon
                .wait_listening(Duration::from_secs(20))
                .map(|()| daemon)
        })
    }

    fn spawn(config: Option<&Path>, ports: Vec<u16>, extra: &[String]) -> Daemon {
        let logdir = tempfile::tempdir().expect("tempdir for daemon log");
        let log = logdir.path().join("daemon.log");
        let mut cmd = serve_command();
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        cmd.args(extra);
        // Tests run many daemons at once: none takes the default socket.
        if !extra.iter().any(|a| a == "--admin-socket") {
            cmd.arg("--admin-socket").arg("none");
        }
        for port in &ports {
            cmd.arg("--listen").arg(format!("127.0.0.1:{port}"));
        }
        let logfile = std::fs::File::create(&log).expect("create daemon log");
        cmd.stdin(Stdio::null())
            .stdout(logfile.try_clone().expect("dup log"))
            .stderr(logfile);
        Daemon {
            child: cmd.spawn().expect("spawn openarray serve"),
            ports,
            log,
            _logdir: logdir,
            _config_dir: None,
        }
    }

    /// `openarray serve --config` with `toml` as the config file, its one
    /// portal on a free port, and a metrics listener on another; returns
    /// the metrics address too.
    pub fn start_with_metrics(toml: &str) -> (Daemon, SocketAddr) {
        let dir = tempfile::tempdir().expect("tempdir for config");
        let path = dir.path().join("openarray.toml");
        std::fs::write(&path, toml).expect("write config");
        let (mut daemon, metrics) = retrying_taken_ports(|| {
            let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let extra = ["--metrics-listen".to_string(), metrics.to_string()];
            let mut daemon = Daemon::spawn(Some(&path), vec![free_port()], &extra);
            daemon
                .wait_listening(Duration::from_secs(20))
                .map(|()| (daemon, metrics))
        });
        daemon._config_dir = Some(dir);
        (daemon, metrics)
    }

    /// `openarray serve --config` with `toml` as the config file (kept in
    /// the daemon's log directory for as long as the daemon lives).
    pub fn start_with_config(toml: &str) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir for config");
        let path = dir.path().join("openarray.toml");
        std::fs::write(&path, toml).expect("write config");
        let mut daemon = Daemon::start_portals(Some(&path), 1);
        daemon._config_dir = Some(dir);
        daemon
    }

    /// Waits for this daemon's own log to say it listens on each port;
    /// `Err` with the log if it exited first.
    fn wait_listening(&mut self, limit: Duration) -> Result<(), String> {
        let start = Instant::now();
        for port in self.ports.clone() {
            while !listening_on(&self.log(), port) {
                if let Ok(Some(status)) = self.child.try_wait() {
                    return Err(format!("{status}\n{}", self.log()));
                }
                assert!(
                    start.elapsed() < limit,
                    "daemon not listening on {port}:\n{}",
                    self.log()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    pub fn port(&self) -> u16 {
        self.ports[0]
    }

    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port()))
    }

    /// `iscsi://127.0.0.1:PORT/IQN/LUN`, as libiscsi tools and qemu take it.
    pub fn url(&self, iqn: &str, lun: u64) -> String {
        format!("iscsi://127.0.0.1:{}/{iqn}/{lun}", self.port())
    }

    /// Resident set size in KiB (VmRSS of /proc/PID/status), if running.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Everything the daemon logged so far.
    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Target names the daemon lists in a SendTargets discovery.
    pub fn targets(&self) -> Vec<String> {
        let out = Command::new("iscsi-ls")
            .arg("-s")
            .arg(format!("iscsi://127.0.0.1:{}", self.port()))
            .output()
            .expect("run iscsi-ls (scripts/install-deps.sh installs it)");
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .filter_map(|l| l.strip_prefix("Target:"))
            .filter_map(|l| l.split_whitespace().next())
            .map(String::from)
            .collect()
    }

    pub fn first_target(&self) -> String {
        self.targets()
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no target discovered"))
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "daemon ignored SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Panic with a clear message unless `tool` is on PATH: the suite drives
/// real clients and must not silently skip them.
pub fn require_tool(tool: &str) {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "`{tool}` is not installed; run scripts/install-deps.sh"
    );
}

#[allow(unused_imports)] // each test crate uses a different part of this
pub use client_tools::run_with_timeout;

/// `run_with_timeout`, echoing the command, its exit status and what it
/// printed to the test's output, so a failure shows the client's own words.
pub fn run_echoed(cmd: Command, limit: Duration) -> Output {
    let shown = format!("{cmd:?}");
    let out = run_with_timeout(cmd, limit);
    let [stdout, stderr] = [&out.stdout, &out.stderr].map(|b| String::from_utf8_lossy(b));
    eprintln!("{shown}: {}\n{stdout}{stderr}", out.status);
    out
}

/// `GET path` over `stream`; the status line and the body.
pub fn http_get(mut stream: impl Read + Write, path: &str) -> (String, String) {
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: openarray\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of the sample `name{labels}` in Prometheus text.
pub fn prometheus_sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.parse().expect("a number"))
}
