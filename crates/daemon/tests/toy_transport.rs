//! A transport the daemon has never heard of joins it with one
//! registration line: a toy line protocol (`READ device offset length`,
//! answered `OK hex`) serving reads of the configured devices. Its
//! section is part of the configuration language (a typo is named with
//! its line), it serves what the configuration gives it, and its sessions,
//! status and counters appear in `/v1/sessions`, `/v1/status` and
//! `/metrics` with no change anywhere else in the daemon.
//!
//! The daemon runs in a child process: this test binary started again
//! with `TOY_DAEMON` set runs `toy_daemon` only, which registers the toy
//! and calls the daemon's `serve` as `openarray serve` does.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control::sections::{Problem, SectionOwner};
use daemon::transports::{Running, Start, Transport};
use serde::{Deserialize, Serialize};

/// `[toy]`: where it listens and which device it reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct ToyConfig {
    listen: String,
    device: String,
}

#[derive(Clone)]
struct Toy;

impl SectionOwner for Toy {
    type Config = ToyConfig;
    const NAME: &'static str = "toy";

    fn check(&self, config: &ToyConfig, devices: &BTreeSet<String>) -> Vec<Problem> {
        let mut problems = Vec::new();
        if config.listen.parse::<SocketAddr>().is_err() {
            problems.push(Problem {
                field: "toy.listen".into(),
                reason: format!("{:?} is not an address and port", config.listen),
            });
        }
        if !devices.contains(&config.device) {
            problems.push(Problem {
                field: "toy.device".into(),
                reason: format!("no device is named {:?}", config.device),
            });
        }
        problems
    }

    fn served_devices(&self, config: &ToyConfig) -> BTreeSet<String> {
        BTreeSet::from([config.device.clone()])
    }
}

/// The toy's live state: what it serves and who is connected.
#[derive(Default)]
struct ToyServer {
    exports: Mutex<Option<export::Exports>>,
    device: String,
    listen: String,
    peers: Mutex<Vec<(u64, SocketAddr)>>,
    reads: AtomicU64,
}

impl export::Frontend for ToyServer {
    fn transport(&self) -> &'static str {
        "toy"
    }

    fn replace_exports(&self, exports: &export::Exports) {
        *self.exports.lock().unwrap() = Some(exports.clone());
    }

    fn end_refused_sessions(&self) -> usize {
        0
    }

    fn sessions(&self) -> Vec<serde_json::Value> {
        let peers = self.peers.lock().unwrap();
        peers
            .iter()
            .map(|(id, peer)| {
                serde_json::json!({
                    "id": format!("toy-{id}"),
                    "transport": "toy",
                    "peer": peer.to_string(),
                })
            })
            .collect()
    }

    fn status(&self) -> Option<export::TransportStatus> {
        Some(export::TransportStatus {
            summary: serde_json::json!({ "listen": self.listen, "device": self.device }),
            problems: Vec::new(),
        })
    }
}

impl std::fmt::Debug for ToyServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ToyServer")
    }
}

impl stats::SampleSource for ToyServer {
    fn samples(&self) -> Vec<stats::Sample> {
        vec![stats::Sample {
            name: "openarray_toy_reads",
            help: "Reads the toy transport served.",
            kind: stats::SampleKind::Counter,
            labels: vec![("device", self.device.clone())],
            value: self.reads.load(Ordering::Relaxed),
        }]
    }
}

impl ToyServer {
    /// One line in, one line out, until the peer goes.
    async fn session(self: Arc<Self>, stream: tokio::net::TcpStream, id: u64) {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let (read, mut write) = stream.into_split();
        let mut lines = tokio::io::BufReader::new(read).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let answer = self.answer(&line);
            if write.write_all(answer.as_bytes()).await.is_err() {
                break;
            }
        }
        self.peers.lock().unwrap().retain(|(i, _)| *i != id);
    }

    fn answer(&self, line: &str) -> String {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [_, device, offset, len] = words[..] else {
            return "ERR READ device offset length\n".into();
        };
        let (Ok(offset), Ok(len)) = (offset.parse::<u64>(), len.parse::<usize>()) else {
            return "ERR bad number\n".into();
        };
        let backing = self
            .exports
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|e| e.devices.get(device).cloned());
        let Some(backing) = backing else {
            return "ERR no such device\n".into();
        };
        let mut buf = vec![0u8; len.min(1 << 20)];
        match backing.device().read_at(&mut buf, offset) {
            Ok(()) => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                let hex: String = buf.iter().map(|b| format!("{b:02x}")).collect();
                format!("OK {hex}\n")
            }
            Err(e) => format!("ERR {e}\n"),
        }
    }
}

/// The toy's listener does not move: a change of its address is refused.
struct Fixed(String);

impl daemon::LiveListeners for Fixed {
    fn prepare(
        &self,
        next: &control::Config,
    ) -> Result<Box<dyn daemon::PreparedListeners>, String> {
        let next = next.sections.get("toy").and_then(|s| s.get::<ToyConfig>());
        match next {
            Some(n) if n.listen != self.0 => Err("toy.listen: changes at the next start".into()),
            _ => Ok(Box::new(Nothing)),
        }
    }
}

struct Nothing;

impl daemon::PreparedListeners for Nothing {
    fn commit(self: Box<Self>) {}
}

impl Transport for Toy {
    fn name(&self) -> &'static str {
        "toy"
    }

    fn start(&self, start: &Start<'_>) -> anyhow::Result<Running> {
        let config = start
            .config
            .sections
            .get("toy")
            .and_then(|s| s.get::<ToyConfig>())
            .cloned()
            .unwrap_or_default();
        let server = Arc::new(ToyServer {
            device: config.device.clone(),
            listen: config.listen.clone(),
            ..ToyServer::default()
        });
        export::Frontend::replace_exports(&*server, start.exports);
        let listener = std::net::TcpListener::bind(&config.listen)?;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let accepting = server.clone();
        let task = tokio::spawn(async move {
            let mut next = 0;
            while let Ok((stream, peer)) = listener.accept().await {
                next += 1;
                accepting.peers.lock().unwrap().push((next, peer));
                tokio::spawn(accepting.clone().session(stream, next));
            }
        });
        Ok(Running {
            frontend: server.clone(),
            listeners: Arc::new(Fixed(config.listen)),
            samples: Some(server),
            shutdown: Box::new(move || {
                Box::pin(async move {
                    task.abort();
                })
            }),
        })
    }
}

/// The child: the daemon with the toy, until SIGTERM.
#[test]
fn toy_daemon() {
    let Some(args) = std::env::var_os("TOY_DAEMON") else {
        return;
    };
    let args = args.into_string().unwrap();
    let [config, socket, metrics] = args.split('|').collect::<Vec<_>>()[..] else {
        panic!("TOY_DAEMON is config|socket|metrics");
    };
    daemon::transports::register(Toy);
    daemon::register_builtins();
    daemon::serve::run(
        Some(Path::new(config)),
        &[],
        &[],
        &[],
        &daemon::serve::AdminSocket::Given(PathBuf::from(socket)),
        Some(metrics.parse().unwrap()),
    )
    .unwrap();
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Daemon {
    child: Child,
    socket: PathBuf,
    metrics: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(config: &str) -> (Child, tempfile::TempDir, PathBuf, SocketAddr) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openarray.toml");
    std::fs::write(&path, config).unwrap();
    let socket = dir.path().join("admin.sock");
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "toy_daemon", "--nocapture", "--test-threads=1"])
        .env(
            "TOY_DAEMON",
            format!("{}|{}|{metrics}", path.display(), socket.display()),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    (child, dir, socket, metrics)
}

fn serve(config: &str) -> Daemon {
    let (mut child, dir, socket, metrics) = start(config);
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("the daemon did not start: {err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Daemon {
        child,
        socket,
        metrics,
        _dir: dir,
    }
}

fn exchange(mut stream: impl Read + Write, request: &str) -> String {
    stream
        .write_all(format!("{request} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

impl Daemon {
    fn api(&self, request: &str) -> serde_json::Value {
        let answer = exchange(UnixStream::connect(&self.socket).unwrap(), request);
        let body = answer.split_once("\r\n\r\n").unwrap().1;
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
    }

    fn metrics(&self) -> String {
        exchange(TcpStream::connect(self.metrics).unwrap(), "GET /metrics")
    }
}

fn config(toy_port: u16, device: &str) -> String {
    format!(
        r#"[[portal]]
listen = "127.0.0.1:{portal}"

[[device]]
name = "d0"
kind = "mem"
size = "1M"

[toy]
listen = "127.0.0.1:{toy_port}"
device = "{device}"
"#,
        portal = free_port()
    )
}

#[test]
fn a_toy_transport_joins_with_one_registration() {
    let port = free_port();
    let d = serve(&config(port, "d0"));

    // It serves the device the configuration gave it.
    let mut peer = TcpStream::connect(("127.0.0.1", port)).unwrap();
    peer.write_all(b"READ d0 4096 4\n").unwrap();
    let mut line = String::new();
    BufReader::new(peer.try_clone().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "OK 00000000\n");

    // Its session is listed beside the other transports' ones.
    let sessions = d.api("GET /v1/sessions");
    let listed = sessions.to_string();
    assert!(listed.contains("\"transport\":\"toy\""), "{listed}");
    assert!(
        listed.contains(&peer.local_addr().unwrap().to_string()),
        "{listed}"
    );

    // Its status is in the daemon's.
    let status = d.api("GET /v1/status");
    assert_eq!(
        status["transports"]["toy"]["listen"],
        format!("127.0.0.1:{port}"),
        "{status:#}"
    );
    assert_eq!(status["transports"]["toy"]["device"], "d0");

    // And its counters in /metrics.
    let metrics = d.metrics();
    assert!(
        metrics.contains("openarray_toy_reads_total{device=\"d0\"} 1"),
        "{metrics}"
    );
}

#[test]
fn the_toy_section_is_checked_with_the_configuration() {
    let (mut child, _dir, _, _) = start(&config(free_port(), "nope"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "a bad [toy] was served");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        err.contains("toy.device: no device is named \"nope\""),
        "{err}"
    );
}
