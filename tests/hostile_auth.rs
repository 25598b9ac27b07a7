//! Peers that stall or guess: the administration socket's file is only
//! replaced when it is a stale socket and is never wider than 0600, stalled
//! administration requests are dropped at their deadlines, CHAP guessing is
//! slowed down without locking out the right secret, and out-of-range
//! negotiation values are answered `Reject`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::admin::{http_exchange, AdminDaemon};
use common::iscsi::{login_request, op, parse_text, read_pdu, text, Digests};
use common::{free_port, listening_on, run_with_timeout, serve_command};

const TARGET: &str = "iqn.2026-11.org.test:guarded";
const OPEN_TARGET: &str = "iqn.2026-11.org.test:open";
const HOST: &str = "iqn.2026-11.org.test:guesser";
const USER: &str = "alice";
const SECRET: &str = "alice-secret-123";
const TOKEN: &str = "t0ken-of-the-hostile-test-0123456789";

/// One portal on `port`, a RAM disk, a target guarded by CHAP and one
/// open to all.
fn config(port: u16, daemon: &str) -> String {
    format!(
        r#"[daemon]
{daemon}

[[portal]]
listen = "127.0.0.1:{port}"

[[device]]
name = "ram"
kind = "mem"
size = "4M"

[[target]]
name = "{TARGET}"
chap = {{ user = "{USER}", secret = "{SECRET}" }}
[[target.lun]]
lun = 0
device = "ram"

[[target]]
name = "{OPEN_TARGET}"
[[target.lun]]
lun = 0
device = "ram"
"#
    )
}

fn write_config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn unix_get(socket: &Path, path: &str) -> (u16, String) {
    let stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    http_exchange(
        stream,
        &format!("GET {path} HTTP/1.1\r\nHost: openarray\r\nConnection: close\r\n\r\n"),
    )
}

/// `openarray serve --config CONFIG --admin-socket SOCKET` under umask 000,
/// its output in `log`.
fn serve_with_open_umask(config: &Path, socket: &Path, log: &Path) -> Child {
    let logfile = std::fs::File::create(log).unwrap();
    let mut cmd = serve_command();
    cmd.arg("--config")
        .arg(config)
        .arg("--admin-socket")
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(logfile.try_clone().unwrap())
        .stderr(logfile);
    // SAFETY: umask(2) is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    cmd.spawn().expect("spawn openarray serve")
}

/// `openarray serve` that must refuse to start; what it printed.
fn refused(config: &Path, socket: &Path) -> String {
    let mut cmd = serve_command();
    cmd.arg("--config")
        .arg(config)
        .arg("--admin-socket")
        .arg(socket);
    let out = run_with_timeout(cmd, Duration::from_secs(30));
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "the daemon started:\n{printed}");
    printed
}

#[test]
fn the_admin_socket_replaces_only_a_stale_socket_and_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(dir.path(), "a.toml", &config(port, ""));
    let socket = dir.path().join("admin.sock");

    // A regular file is kept, and the daemon says why it will not start.
    std::fs::write(&socket, "data\n").unwrap();
    let printed = refused(&cfg, &socket);
    assert!(
        printed.contains(&format!("{} exists and is not a socket", socket.display())),
        "{printed}"
    );
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "data\n");

    // A socket nobody listens on is replaced, under umask 000 too.
    std::fs::remove_file(&socket).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(UnixStream::connect(&socket).is_err(), "stale");
    let log = dir.path().join("daemon.log");
    let mut daemon = serve_with_open_umask(&cfg, &socket, &log);
    let start = Instant::now();
    while !listening_on(&std::fs::read_to_string(&log).unwrap_or_default(), port)
        || UnixStream::connect(&socket).is_err()
    {
        if let Ok(Some(status)) = daemon.try_wait() {
            panic!(
                "daemon exited with {status}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no daemon");
        std::thread::sleep(Duration::from_millis(50));
    }
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let (status, body) = unix_get(&socket, "/v1/objects");
    assert_eq!(status, 200, "{body}");
    // Nothing is left beside it but what the test put there.
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a.toml", "admin.sock", "daemon.log"]);

    // A socket a daemon serves on is not taken over.
    let other = write_config(dir.path(), "b.toml", &config(free_port(), ""));
    let printed = refused(&other, &socket);
    assert!(
        printed.contains(&format!(
            "another daemon is serving on {}",
            socket.display()
        )),
        "{printed}"
    );
    let (status, _) = unix_get(&socket, "/v1/objects");
    assert_eq!(status, 200, "the first daemon still serves");

    // SAFETY: kill(2) on our own child, still unreaped.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    assert!(daemon.wait().unwrap().success());
    assert!(!socket.exists(), "its own socket goes with the daemon");
}

/// Waits until `stream` is closed by the daemon; what it sent, and when.
fn until_closed(mut stream: impl Read, since: Instant) -> (String, Duration) {
    let mut answer = Vec::new();
    let read = stream.read_to_end(&mut answer);
    assert!(
        read.is_ok(),
        "still open after {:?}: {read:?}",
        since.elapsed()
    );
    (
        String::from_utf8_lossy(&answer).into_owned(),
        since.elapsed(),
    )
}

#[test]
fn stalled_admin_requests_are_dropped_while_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let api = format!("127.0.0.1:{}", free_port());
    let token_file = write_config(dir.path(), "token", &format!("{TOKEN}\n"));
    let cfg = write_config(
        dir.path(),
        "c.toml",
        &config(
            port,
            &format!(
                "api_header_timeout = \"1s\"\napi_body_timeout = \"1s\"\n\
                 api_listen = \"{api}\"\napi_token_file = \"{}\"",
                token_file.display()
            ),
        ),
    );
    let daemon = AdminDaemon::start(&cfg, dir.path(), port);
    let line = format!("administration API listening on TCP (token required) addr={api}");
    let start = Instant::now();
    while !daemon.log().lines().any(|l| l.ends_with(&line)) {
        assert!(start.elapsed() < Duration::from_secs(20), "no TCP API");
        std::thread::sleep(Duration::from_millis(50));
    }
    let patience = Some(Duration::from_secs(8));

    let since = Instant::now();
    // Half a body on the socket and on TCP, half a head on the socket.
    let mut body_stall = UnixStream::connect(&daemon.socket).unwrap();
    body_stall
        .write_all(
            b"POST /v1/config/diff HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n[daemon]\n",
        )
        .unwrap();
    body_stall.set_read_timeout(patience).unwrap();
    let mut tcp_stall = TcpStream::connect(&api).unwrap();
    write!(
        tcp_stall,
        "POST /v1/config/diff HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Length: 1000\r\n\r\n[daemon]\n"
    )
    .unwrap();
    tcp_stall.set_read_timeout(patience).unwrap();
    let mut head_stall = UnixStream::connect(&daemon.socket).unwrap();
    head_stall
        .write_all(b"GET /v1/objects HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    head_stall.set_read_timeout(patience).unwrap();

    // Others are served meanwhile.
    let (status, body) = unix_get(&daemon.socket, "/v1/objects");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(TARGET), "{body}");
    assert!(since.elapsed() < Duration::from_secs(1), "served at once");

    for (what, stream) in [
        (
            "half a body on the socket",
            &mut body_stall as &mut dyn Read,
        ),
        ("half a body on TCP", &mut tcp_stall),
    ] {
        let (answer, after) = until_closed(stream, since);
        assert!(answer.starts_with("HTTP/1.1 408"), "{what}: {answer}");
        assert!(
            (Duration::from_millis(900)..Duration::from_secs(6)).contains(&after),
            "{what}: dropped after {after:?}"
        );
    }
    let (answer, after) = until_closed(&mut head_stall, since);
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        (Duration::from_millis(900)..Duration::from_secs(6)).contains(&after),
        "half a head: dropped after {after:?}"
    );
    let (status, _) = unix_get(&daemon.socket, "/v1/objects");
    assert_eq!(status, 200, "still serving");
}

/// A login refused with this status class and detail.
#[derive(Debug, PartialEq, Eq)]
struct Refused(u8, u8);

/// One login over CHAP with `secret` through to the full feature phase.
fn chap_login(addr: SocketAddr, secret: &str) -> Result<(), Refused> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.set_nodelay(true).unwrap();
    let isid = [0x80, 0, 0, 0, 0, 1];
    let mut exp_statsn = 0;
    let mut step = |csg: u8, nsg: u8, transit: bool, keys: &[(&str, &str)]| {
        let mut req = login_request(isid, csg, nsg, transit, text(keys));
        req.set_u32(24, 1);
        req.set_u32(28, exp_statsn);
        stream.write_all(&req.encode(Digests::default())).unwrap();
        let rsp = read_pdu(&mut stream, Digests::default(), 65536).expect("a login response");
        assert_eq!(rsp.opcode(), op::LOGIN_RSP);
        exp_statsn = rsp.u32_at(24).wrapping_add(1);
        match (rsp.bhs[36], rsp.bhs[37]) {
            (0, _) => Ok(parse_text(&rsp.data)),
            (class, detail) => Err(Refused(class, detail)),
        }
    };
    let offered = step(
        0,
        1,
        false,
        &[
            ("InitiatorName", HOST),
            ("SessionType", "Normal"),
            ("TargetName", TARGET),
            ("AuthMethod", "CHAP"),
            ("CHAP_A", "5"),
        ],
    )?;
    let value = |k: &str| {
        offered
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {k} in {offered:?}"))
    };
    let id: u8 = value("CHAP_I").parse().unwrap();
    let challenge = iscsi::auth_chap::decode_binary(&value("CHAP_C")).unwrap();
    let response = iscsi::auth_chap::chap_response(id, secret, &challenge);
    let hex: String = response.iter().map(|b| format!("{b:02x}")).collect();
    step(
        0,
        1,
        true,
        &[("CHAP_N", USER), ("CHAP_R", &format!("0x{hex}"))],
    )?;
    step(
        1,
        3,
        true,
        &[
            ("HeaderDigest", "None"),
            ("DataDigest", "None"),
            ("MaxRecvDataSegmentLength", "65536"),
        ],
    )?;
    Ok(())
}

#[test]
fn chap_guessing_is_slowed_down_and_the_right_secret_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(
        dir.path(),
        "c.toml",
        &config(
            port,
            "auth_fail_delay = \"2ms\"\nauth_fail_delay_max = \"20ms\"",
        ),
    );
    let daemon = AdminDaemon::start(&cfg, dir.path(), port);
    let addr = daemon.addr();
    assert_eq!(chap_login(addr, SECRET), Ok(()));

    // 200 wrong guesses from four connections at a time. Failures delay
    // the next attempts 2, 4, 8, 16 and then 20 ms each, one after the
    // other whatever the parallelism: about 3.95 s in all. Unthrottled
    // they take a tenth of a second; with each failure only sleeping on
    // its own connection, about a quarter of the 3.95 s.
    let guessing = Instant::now();
    let guessers: Vec<_> = (0..4)
        .map(|g| {
            std::thread::spawn(move || {
                for i in 0..50 {
                    let guess = format!("guess-{g}-{i:04}-xyz");
                    assert_eq!(chap_login(addr, &guess), Err(Refused(2, 1)));
                }
            })
        })
        .collect();
    for g in guessers {
        g.join().unwrap();
    }
    let took = guessing.elapsed();
    assert!(took >= Duration::from_secs(3), "200 guesses in {took:?}");

    // The right secret waits its turn and logs in.
    let right = Instant::now();
    assert_eq!(chap_login(addr, SECRET), Ok(()));
    assert!(right.elapsed() < Duration::from_secs(2));

    let (status, metrics) = unix_get(&daemon.socket, "/metrics");
    assert_eq!(status, 200);
    assert!(
        metrics
            .lines()
            .any(|l| l == "openarray_iscsi_auth_failures_total 200"),
        "{metrics}"
    );
    let log = daemon.log();
    let failures = log
        .lines()
        .filter(|l| l.contains("CHAP authentication failed"))
        .collect::<Vec<_>>();
    assert_eq!(failures.len(), 200, "{log}");
    assert!(failures
        .iter()
        .all(|l| l.contains("authentication failure: wrong CHAP secret") && l.contains(HOST)));
    assert!(!log.contains("guess-") && !log.contains(SECRET), "{log}");
}

#[test]
fn out_of_range_negotiation_values_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(dir.path(), "c.toml", &config(port, ""));
    let daemon = AdminDaemon::start(&cfg, dir.path(), port);
    let mut stream = TcpStream::connect(daemon.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let isid = [0x80, 0, 0, 0, 0, 2];
    let keys = text(&[
        ("InitiatorName", HOST),
        ("SessionType", "Normal"),
        ("TargetName", OPEN_TARGET),
        ("AuthMethod", "None"),
    ]);
    let login = login_request(isid, 0, 1, true, keys);
    stream.write_all(&login.encode(Digests::default())).unwrap();
    let rsp = read_pdu(&mut stream, Digests::default(), 65536).unwrap();
    assert_eq!((rsp.bhs[36], rsp.bhs[37]), (0, 0));
    // Outside each key's range (RFC 7143 section 13), or no number at all.
    let offers = [
        ("MaxRecvDataSegmentLength", "0"),
        ("MaxBurstLength", "4294967296"),
        ("FirstBurstLength", "-1"),
        ("DefaultTime2Wait", "3601"),
        ("DefaultTime2Retain", "0x100000000"),
        ("MaxOutstandingR2T", "0"),
        ("MaxConnections", "65536"),
        ("ErrorRecoveryLevel", "1e3"),
        ("HeaderDigest", "None"),
    ];
    let mut login = login_request(isid, 1, 3, true, text(&offers));
    login.set_u32(28, rsp.u32_at(24).wrapping_add(1));
    stream.write_all(&login.encode(Digests::default())).unwrap();
    let rsp = read_pdu(&mut stream, Digests::default(), 65536).unwrap();
    let answers = parse_text(&rsp.data);
    for (key, _) in &offers[..8] {
        assert!(
            answers.iter().any(|(k, v)| k == key && v == "Reject"),
            "{key}: {answers:?}"
        );
    }
    assert!(answers.contains(&("HeaderDigest".into(), "None".into())));
    // The target's own declaration follows the answer to the initiator's.
    let declared = answers
        .iter()
        .rposition(|(k, v)| k == "MaxRecvDataSegmentLength" && v != "Reject");
    let rejected = answers
        .iter()
        .position(|(k, v)| k == "MaxRecvDataSegmentLength" && v == "Reject");
    assert!(declared > rejected, "{answers:?}");
    // Rejected keys keep their defaults: the login completes.
    assert_eq!((rsp.bhs[36], rsp.bhs[37]), (0, 0));
    assert_eq!(rsp.flags() & 0x83, 0x83, "on to the full feature phase");
}
