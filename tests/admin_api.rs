//! The administration API over TCP with a bearer token, and the daemon's
//! protection against connections that never log in or go silent.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::admin::http_exchange;
use common::iscsi::{LoginParams, Session};
use common::{free_port, run_echoed, run_with_timeout, Daemon};

const TARGET: &str = "iqn.2026-11.org.test:api";
const HOST: &str = "iqn.2026-11.org.test:host";
const TOKEN: &str = "k3y-0f-the-test-api-0123456789";

fn base_config(daemon: &str) -> String {
    common::one_ram_lun_config(daemon, "ram", "4M", TARGET)
}

fn write_private(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `GET path` on `addr` with an optional `Authorization` value; the status
/// code and the body.
fn get(addr: &str, path: &str, authorization: Option<&str>) -> (u16, String) {
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    http_exchange(
        stream,
        &format!("GET {path} HTTP/1.1\r\nHost: openarray\r\n{auth}Connection: close\r\n\r\n"),
    )
}

fn cli(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_openarray"));
    cmd.args(args)
        .env_remove("OPENARRAY_API")
        .env_remove("OPENARRAY_TOKEN_FILE");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    run_echoed(cmd, Duration::from_secs(60))
}

/// Waits until the daemon's own log says its API listens on `addr`: it
/// binds the API before its portals, so the port is its own by now, and
/// this checks that the address it took is the configured one.
fn wait_for_api(daemon: &Daemon, addr: &str) {
    let start = Instant::now();
    let line = format!("administration API listening on TCP (token required) addr={addr}");
    while !daemon.log().lines().any(|l| l.ends_with(&line)) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the API never listened on {addr}:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_tcp_api_answers_only_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    write_private(&token_file, &format!("{TOKEN}\n"), 0o600);
    let api = format!("127.0.0.1:{}", free_port());
    let daemon = Daemon::start_with_config(&base_config(&format!(
        "api_listen = \"{api}\"\napi_token_file = \"{}\"",
        token_file.display()
    )));
    wait_for_api(&daemon, &api);

    // No token, a wrong one, another scheme: 401 and nothing else.
    let (status, body) = get(&api, "/v1/config", None);
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains(TARGET));
    let (status, _) = get(&api, "/v1/config", Some(&format!("Bearer {TOKEN}x")));
    assert_eq!(status, 401);
    let (status, _) = get(&api, "/v1/objects", Some(&format!("Basic {TOKEN}")));
    assert_eq!(status, 401);
    let (status, _) = get(&api, "/metrics", None);
    assert_eq!(status, 401, "the TCP API guards /metrics too");

    // A body over the limit is refused before it is sent.
    let mut stream = TcpStream::connect(&api).unwrap();
    write!(
        stream,
        "POST /v1/config/diff HTTP/1.1\r\nHost: openarray\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n",
        5 << 20
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // The right token.
    let (status, body) = get(&api, "/v1/objects", Some(&format!("Bearer {TOKEN}")));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(TARGET), "{body}");

    // The CLI with --api and --token-file, and with the environment.
    let token_path = token_file.to_str().unwrap();
    let out = cli(
        &["config", "--api", &api, "--token-file", token_path, "list"],
        &[],
    );
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("target {TARGET}")));
    let out = cli(
        &["config", "show"],
        &[
            ("OPENARRAY_API", &api),
            ("OPENARRAY_TOKEN_FILE", token_path),
        ],
    );
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("name = \"{TARGET}\"")));

    // A wrong token file is refused by the daemon.
    let wrong = dir.path().join("wrong");
    write_private(&wrong, "not-the-token-at-all-0000", 0o600);
    let out = cli(
        &[
            "config",
            "--api",
            &api,
            "--token-file",
            wrong.to_str().unwrap(),
            "show",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Bearer"));
    assert!(!String::from_utf8_lossy(&out.stdout).contains(TARGET));
    drop(daemon);
}

#[test]
fn a_token_file_others_can_read_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    write_private(&token_file, TOKEN, 0o644);
    let config = dir.path().join("openarray.toml");
    let api = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        &config,
        base_config(&format!(
            "api_listen = \"{api}\"\napi_token_file = \"{}\"",
            token_file.display()
        )),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_openarray"));
    cmd.arg("serve")
        .args(["--admin-socket", "none"])
        .arg("--config")
        .arg(&config)
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", free_port()));
    let out = run_with_timeout(cmd, Duration::from_secs(30));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("daemon.api_token_file") && err.contains("mode 644"),
        "{err}"
    );

    // check-config says the same without serving.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_openarray"));
    cmd.arg("check-config").arg(&config);
    let out = run_with_timeout(cmd, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("daemon.api_token_file"));
}

/// Reads until the peer closes; `true` when it did within `limit` (a
/// bound against a hang, not a measurement).
fn closed_by_peer(stream: &mut TcpStream, limit: Duration) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => continue,
        }
    }
    false
}

/// Ten times the configured timeouts, and still below the defaults (15 s
/// login, 15 s + 30 s ping), so the test fails if the settings are ignored.
const GENEROUS: Duration = Duration::from_secs(10);

#[test]
fn connections_that_never_log_in_or_go_silent_are_closed() {
    let daemon = Daemon::start_with_config(&base_config(
        "login_timeout = \"1s\"\nnop_interval = \"1s\"\nnop_timeout = \"1s\"",
    ));

    // Connected, never a login PDU.
    let mut idle = TcpStream::connect(daemon.addr()).unwrap();
    assert!(
        closed_by_peer(&mut idle, GENEROUS),
        "a connection without login stayed open"
    );
    // Half a login header, then silence.
    let mut partial = TcpStream::connect(daemon.addr()).unwrap();
    partial.write_all(&[0x43, 0x87, 0, 0, 0, 0]).unwrap();
    assert!(closed_by_peer(&mut partial, GENEROUS));
    assert!(daemon.log().contains("login timed out"), "{}", daemon.log());

    // Logged in, then never answering the target's pings.
    let session = Session::login(
        daemon.addr(),
        &LoginParams::normal(HOST, TARGET),
        Duration::from_secs(10),
    )
    .unwrap();
    let mut stream = session.stream;
    assert!(
        closed_by_peer(&mut stream, GENEROUS),
        "a silent session stayed open"
    );
    assert!(
        daemon.log().contains("did not answer a ping"),
        "{}",
        daemon.log()
    );
}
