//! The command line as scripts and service managers use it: JSON listings,
//! exit statuses, OPENARRAY_SOCKET, `check-config` reporting everything at
//! once, the default configuration path, systemd notifications, the unit
//! file, completions and manual pages, and `scripts/install.sh`.

mod common;

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::admin::{esx_config, AdminDaemon};
use common::{free_port, listening_on, NO_CONFIG};
use serde_json::Value;

const TARGET: &str = "iqn.2026-11.org.test:scripting";
const ESX1: &str = "iqn.1998-01.com.vmware:esx1";

fn openarray() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_openarray"));
    cmd.env_remove("RUST_LOG")
        .env_remove("OPENARRAY_SOCKET")
        .env("OPENARRAY_CONFIG", NO_CONFIG)
        .stdin(Stdio::null());
    cmd
}

fn run(args: &[&str]) -> Output {
    openarray().args(args).output().expect("run openarray")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Standard output of a command that must succeed.
fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "openarray {args:?}: {}\n{}",
        out.status,
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn json(args: &[&str]) -> Value {
    let out = ok(args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}):\n{out}"))
}

/// A daemon with two 4 MiB file devices mapped as LUNs 3 and 201 of group
/// `esx`; its configuration file beside it.
fn daemon(dir: &Path) -> (AdminDaemon, PathBuf) {
    let port = free_port();
    let config = dir.join("openarray.toml");
    let luns = [(3, "other"), (201, "shared")];
    std::fs::write(&config, esx_config(dir, port, TARGET, ESX1, &luns)).unwrap();
    (AdminDaemon::start(&config, dir, port), config)
}

#[test]
fn lists_and_shows_print_json_and_human_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let (d, _) = daemon(dir.path());
    let sock = d.socket.to_str().unwrap();
    let with = |args: &[&'static str]| -> Vec<&str> { [args, &["--socket", sock]].concat() };

    let devices = json(&with(&["device", "list", "--json"]));
    let names: Vec<&str> = devices
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["shared", "other"]);
    assert_eq!(devices[0]["kind"], "file");
    assert_eq!(devices[0]["size"], 4 << 20);

    let shown = json(&with(&["device", "show", "other", "--json"]));
    assert_eq!(shown["name"], "other");
    assert_eq!(shown["size"], "4M");
    assert!(shown["path"].as_str().unwrap().ends_with("other.img"));

    let targets = json(&with(&["target", "list", "--json"]));
    assert_eq!(targets[0]["name"], TARGET);
    let target = json(&with(&["target", "show", TARGET, "--json"]));
    assert_eq!(target["group"][0]["name"], "esx");
    assert_eq!(target["group"][0]["lun"][1]["lun"], 201);

    let luns = json(&with(&["lun", "list", TARGET, "--group", "esx", "--json"]));
    assert_eq!(luns[0]["lun"], 3);
    assert_eq!(luns[0]["device"], "other");
    assert_eq!(luns[1]["read_only"], false);
    let groups = json(&with(&["group", "list", TARGET, "--json"]));
    assert_eq!(groups[0]["initiators"][0], ESX1);
    let members = json(&with(&["initiator", "list", TARGET, "esx", "--json"]));
    assert_eq!(members, serde_json::json!([ESX1]));
    let portals = json(&with(&["portal", "list", "--json"]));
    assert_eq!(portals[0], format!("127.0.0.1:{}", d.port));

    let listed = json(&["config", "list", "--json", "--socket", sock]);
    assert_eq!(listed["targets"][0]["groups"][0]["luns"][0]["lun"], 3);
    let config = json(&["config", "show", "--json", "--socket", sock]);
    assert_eq!(config["config"]["device"][1]["name"], "other");

    // Text by default, with sizes a person reads; --bytes for exact counts.
    let human = ok(&with(&["device", "list"]));
    assert!(human.contains("shared (file, 4M)"), "{human}");
    let exact = ok(&with(&["device", "list", "--bytes"]));
    assert!(exact.contains("shared (file, 4194304)"), "{exact}");
}

#[test]
fn pools_and_volumes_print_json_and_human_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pool.toml");
    std::fs::write(
        &config,
        format!(
            "[[pool]]\nname = \"tank\"\ndevices = [\"{}/a.img\"]\ndevice_size = \"64M\"\nunit_size = \"64K\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let c = config.to_str().unwrap();
    ok(&["pool", "create", "-c", c, "tank"]);
    ok(&["volume", "create", "-c", c, "--pool", "tank", "vm", "3M"]);

    let pools = json(&["pool", "list", "-c", c, "--json"]);
    assert_eq!(pools[0]["name"], "tank");
    assert_eq!(pools[0]["volumes"][0]["name"], "vm");
    let pool = json(&["pool", "show", "-c", c, "tank", "--json"]);
    assert_eq!(pool[0]["unit_size"], 64 << 10);
    let volumes = json(&["volume", "list", "-c", c, "--pool", "tank", "--json"]);
    assert_eq!(volumes[0]["size"], 3 << 20);
    // With one pool, --pool may be left out.
    assert_eq!(json(&["volume", "list", "-c", c, "--json"]), volumes);
    let volume = json(&["volume", "show", "-c", c, "--pool", "tank", "vm", "--json"]);
    assert_eq!(volume["name"], "vm");

    let human = ok(&["volume", "list", "-c", c, "--pool", "tank"]);
    assert!(human.contains("size             3M"), "{human}");
    let status = ok(&["pool", "status", "-c", c]);
    assert!(status.contains("(unit 64K)"), "{status}");
    let exact = ok(&["pool", "status", "-c", c, "--bytes"]);
    assert!(exact.contains("(unit 65536)"), "{exact}");
}

#[test]
fn exit_status_tells_drift_from_an_absent_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let (d, config) = daemon(dir.path());
    let cfg = config.to_str().unwrap();
    let sock = d.socket.to_str().unwrap();

    let same = run(&["config", "diff", cfg, "--socket", sock]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same.stderr));
    let drifted = dir.path().join("drifted.toml");
    let edited = std::fs::read_to_string(&config)
        .unwrap()
        .replace("size = \"4M\"", "size = \"8M\"");
    std::fs::write(&drifted, edited).unwrap();
    let differs = run(&[
        "config",
        "diff",
        drifted.to_str().unwrap(),
        "--socket",
        sock,
    ]);
    assert_eq!(differs.status.code(), Some(1), "{}", text(&differs.stderr));
    assert!(text(&differs.stdout).contains("size: 4M → 8M"));
    // Refused by the daemon: 1, with its reason.
    let refused = run(&["device", "show", "nope", "--socket", sock]);
    assert_eq!(refused.status.code(), Some(1));

    // No daemon: 2, whatever the command.
    let gone = dir.path().join("gone.sock");
    let gone = gone.to_str().unwrap();
    for args in [
        &["config", "diff", cfg, "--socket", gone][..],
        &["config", "list", "--socket", gone],
        &["device", "list", "--json", "--socket", gone],
        &["pool", "list", "--socket", gone],
        &["volume", "list", "--pool", "tank", "--socket", gone],
        &["stat", "-n", "1", "--socket", gone],
    ] {
        let out = run(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stderr).contains("cannot reach"), "{args:?}");
    }
    // A wrong command line, or a file argument that cannot be read: 2.
    assert_eq!(run(&["config", "nonsense"]).status.code(), Some(2));
    let absent = dir.path().join("absent.toml");
    let absent = absent.to_str().unwrap();
    for args in [
        &["config", "diff", absent, "--socket", sock][..],
        &["pool", "list", "-c", absent],
        &["pool", "destroy", "-c", absent, "tank"],
        &["check-config", absent],
        &["serve", "--config", absent],
    ] {
        assert_eq!(run(args).status.code(), Some(2), "{args:?}");
    }
    // A file with problems is a failed check: 1.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[pool]]\nname = \"tank\"\n").unwrap();
    let out = run(&["pool", "list", "-c", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(run(&["device", "list", "--bogus"]).status.code(), Some(2));
}

#[test]
fn openarray_socket_names_the_default_socket() {
    let dir = tempfile::tempdir().unwrap();
    let (d, _) = daemon(dir.path());
    let from_env = |socket: &Path, args: &[&str]| {
        openarray()
            .env("OPENARRAY_SOCKET", socket)
            .args(args)
            .output()
            .unwrap()
    };
    for args in [
        &["device", "list"][..],
        &["config", "list"],
        &["pool", "list"],
    ] {
        let out = from_env(&d.socket, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
    assert!(text(&from_env(&d.socket, &["target", "list"]).stdout).contains(TARGET));

    let missing = dir.path().join("missing.sock");
    let out = from_env(&missing, &["device", "list"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains(missing.to_str().unwrap()));
    // --socket wins over the environment.
    let sock = d.socket.to_str().unwrap();
    let out = from_env(&missing, &["device", "list", "--socket", sock]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn check_config_reports_every_problem_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, "not a directory").unwrap();
    let b = blocker.display();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        format!(
            "[daemon]\nstate_dir = \"{b}/state\"\n\n\
             [[pool]]\nname = \"tank\"\ndevices = [\"{d}/missing/t0.img\"]\n\n\
             [[device]]\nname = \"d0\"\nkind = \"file\"\npath = \"{d}/nowhere/d0.img\"\n\n\
             [[device]]\nname = \"d1\"\nkind = \"mem\"\nsize = \"12Q\"\n\n\
             [[target]]\nname = \"iqn.2026-11.org.example:t\"\n\
             [[target.lun]]\nlun = 0\ndevice = \"nope\"\n"
        ),
    )
    .unwrap();
    let out = run(&["check-config", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    for (field, why) in [
        ("daemon.state_dir", "is not a directory"),
        ("pool[0].devices[0]", "does not exist"),
        ("device[0].path", "does not exist"),
        ("device[1].size", "unknown size unit"),
        ("target[0].lun[0].device", "nope"),
    ] {
        assert!(
            err.lines().any(|l| l.contains(field) && l.contains(why)),
            "no `{field}: ...{why}` in:\n{err}"
        );
    }
    // In file order, each with its line.
    assert!(err.starts_with(&format!("{}:2:", file.display())), "{err}");

    let missing = run(&["check-config", &format!("{d}/none.toml")]);
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn check_config_counts_the_luns_of_groups() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("groups.toml");
    let luns = [(3, "other"), (201, "shared")];
    std::fs::write(&file, esx_config(dir.path(), 3260, TARGET, ESX1, &luns)).unwrap();
    let out = ok(&["check-config", file.to_str().unwrap()]);
    assert!(
        out.contains("1 group(s), 2 LUN mapping(s): 0 in targets, 2 in groups"),
        "{out}"
    );
}

/// `openarray serve ARGS` with `env`, logging to a file in `dir`.
fn spawn_serve(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (Child, PathBuf) {
    let log = dir.join("serve.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut cmd = openarray();
    cmd.arg("serve")
        .args(args)
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    for (k, v) in env {
        cmd.env(k, v);
    }
    (cmd.spawn().expect("start openarray serve"), log)
}

fn wait_listening(child: &mut Child, log: &Path, port: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if listening_on(&text, port) {
            return text;
        }
        assert!(child.try_wait().unwrap().is_none(), "serve exited:\n{text}");
        assert!(Instant::now() < deadline, "serve never listened:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop(mut child: Child) -> std::process::ExitStatus {
    // SAFETY: kill(2) on our own, unreaped child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap()
}

#[test]
fn serve_reads_the_default_configuration_path() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("etc-openarray.toml");
    let iqn = "iqn.2026-11.org.test:from-default-path";
    std::fs::write(
        &config,
        format!(
            "[[portal]]\nlisten = \"127.0.0.1:{port}\"\n[[device]]\nname = \"m\"\nkind = \"mem\"\nsize = \"1M\"\n\
             [[target]]\nname = \"{iqn}\"\n[[target.lun]]\nlun = 0\ndevice = \"m\"\n"
        ),
    )
    .unwrap();
    let env = [("OPENARRAY_CONFIG", config.to_str().unwrap())];
    let (mut child, log) = spawn_serve(dir.path(), &[], &env);
    let text = wait_listening(&mut child, &log, port);
    assert!(text.contains(&config.display().to_string()), "{text}");
    assert!(text.contains(iqn), "{text}");
    assert!(stop(child).success());

    // Absent: the built-in default, and the log says so.
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let missing = dir.path().join("absent.toml");
    let env = [("OPENARRAY_CONFIG", missing.to_str().unwrap())];
    let (mut child, log) = spawn_serve(dir.path(), &["--listen", &listen], &env);
    let text = wait_listening(&mut child, &log, port);
    assert!(text.contains("built-in default"), "{text}");
    assert!(text.contains(&missing.display().to_string()), "{text}");
    assert!(stop(child).success());
}

/// The next datagram within `limit`, as text.
fn receive(socket: &UnixDatagram, limit: Duration) -> Option<String> {
    socket.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    match socket.recv(&mut buf) {
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => None,
        Err(e) => panic!("recv: {e}"),
    }
}

#[test]
fn serve_notifies_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&notify).unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let admin = dir.path().join("admin.sock");
    let env = [
        ("NOTIFY_SOCKET", notify.to_str().unwrap()),
        ("WATCHDOG_USEC", "200000"),
    ];
    let args = [
        "--listen",
        &listen,
        "--admin-socket",
        admin.to_str().unwrap(),
    ];
    let (child, log) = spawn_serve(dir.path(), &args, &env);

    let first = receive(&socket, Duration::from_secs(30)).expect("no notification");
    assert!(first.lines().any(|l| l == "READY=1"), "{first}");
    // Ready means reachable: the portal is bound (its accept loop logs
    // on its own time) and the administration socket answers.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!("listening addr={listen}")),
        "READY=1 before listening:\n{text}"
    );
    std::net::TcpStream::connect(&listen).expect("portal after READY=1");
    std::os::unix::net::UnixStream::connect(&admin).expect("admin socket after READY=1");

    // 100 ms pings: several within a second.
    let start = Instant::now();
    let mut pings = 0;
    while start.elapsed() < Duration::from_secs(1) {
        if let Some(m) = receive(&socket, Duration::from_millis(300)) {
            pings += m.lines().filter(|l| *l == "WATCHDOG=1").count();
        }
    }
    assert!(pings >= 5, "{pings} watchdog pings in a second");

    // SAFETY: kill(2) on our own, unreaped child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut stopping = false;
    while let Some(m) = receive(&socket, Duration::from_secs(10)) {
        if m.lines().any(|l| l == "STOPPING=1") {
            stopping = true;
            break;
        }
    }
    assert!(stopping, "no STOPPING=1");
    let mut child = child;
    assert!(child.wait().unwrap().success());
}

#[test]
fn serve_sends_nothing_without_notify_socket() {
    // No NOTIFY_SOCKET, a watchdog asked for: serving works all the same.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let env = [("WATCHDOG_USEC", "100000")];
    let (mut child, log) = spawn_serve(dir.path(), &["--listen", &listen], &env);
    wait_listening(&mut child, &log, port);
    std::thread::sleep(Duration::from_millis(300));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("cannot notify"), "{text}");
    assert!(stop(child).success());
}

/// Every command path (`["device", "add"]`, ...), read from the help
/// the clap definition prints.
fn command_tree() -> Vec<Vec<String>> {
    fn walk(path: &[String], out: &mut Vec<Vec<String>>) {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let help = ok(&args);
        let Some(section) = help.split("Commands:\n").nth(1) else {
            return;
        };
        for line in section.lines() {
            if !line.starts_with("  ") || line.starts_with("   ") {
                break;
            }
            let name = line.split_whitespace().next().unwrap();
            if name == "help" {
                continue;
            }
            let mut sub = path.to_vec();
            sub.push(name.to_string());
            out.push(sub.clone());
            walk(&sub, out);
        }
    }
    let mut out = Vec::new();
    walk(&[], &mut out);
    out
}

#[test]
fn completions_and_man_pages_cover_every_command() {
    let tree = command_tree();
    let top: BTreeSet<&str> = tree.iter().map(|p| p[0].as_str()).collect();
    for expected in [
        "serve",
        "check-config",
        "config",
        "device",
        "completions",
        "man",
    ] {
        assert!(top.contains(expected), "{top:?}");
    }
    assert!(tree.len() > 40, "{tree:?}");

    for shell in ["bash", "zsh", "fish"] {
        let script = ok(&["completions", shell]);
        for path in &tree {
            let name = path.last().unwrap();
            assert!(script.contains(name.as_str()), "{shell}: no `{name}`");
        }
        // Options reach the completions too.
        assert!(script.contains("json") && script.contains("admin-socket"));
    }
    let bash = ok(&["completions", "bash"]);
    assert!(bash.contains("complete -F _openarray"), "not a bash script");
    let fish = ok(&["completions", "fish"]);
    assert!(fish.contains("complete -c openarray"), "not a fish script");
    let zsh = ok(&["completions", "zsh"]);
    assert!(zsh.starts_with("#compdef openarray"), "not a zsh script");

    let page = ok(&["man"]);
    assert!(page.contains(".TH openarray 1"), "{page}");
    for name in &top {
        let roff = name.replace('-', "\\-");
        assert!(
            page.contains(&format!("openarray\\-{roff}(1)")),
            "man: no {name}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    ok(&["man", "--dir", dir.path().to_str().unwrap()]);
    for path in &tree {
        let file = dir.path().join(format!("openarray-{}.1", path.join("-")));
        let page = std::fs::read_to_string(&file).unwrap_or_else(|_| panic!("no {file:?}"));
        assert!(page.contains(".SH SYNOPSIS"), "{file:?}");
    }
    assert!(dir.path().join("openarray.1").exists());
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn systemd_accepts_the_unit() {
    let analyze = Command::new("systemd-analyze").arg("--version").output();
    if analyze.as_ref().map_or(true, |o| !o.status.success()) {
        eprintln!("skipped: systemd-analyze cannot run here: {analyze:?}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // As installed: the binary where the unit names it, the man pages the
    // unit's Documentation= names on MANPATH.
    let unit = std::fs::read_to_string(repo().join("contrib/openarray.service")).unwrap();
    assert!(unit.contains("Type=notify") && unit.contains("WatchdogSec="));
    let unit = unit.replace("/usr/local/bin/openarray", env!("CARGO_BIN_EXE_openarray"));
    let path = dir.path().join("openarray.service");
    std::fs::write(&path, unit).unwrap();
    let man = dir.path().join("man");
    ok(&["man", "--dir", man.join("man1").to_str().unwrap()]);
    let verify = |unit: &Path| {
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(unit)
            .env("MANPATH", &man)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    // systemd-analyze warns on stderr about what it ignores.
    let accepted = |out: &Output| out.status.success() && out.stderr.is_empty();
    let out = verify(&path);
    assert!(accepted(&out), "{}{}", text(&out.stdout), text(&out.stderr));
    // The check can fail: a unit with a bad setting is refused.
    let bad = dir.path().join("bad.service");
    let broken = std::fs::read_to_string(&path)
        .unwrap()
        .replace("Type=notify", "Type=notifyy");
    std::fs::write(&bad, broken).unwrap();
    assert!(!accepted(&verify(&bad)));
}

#[test]
fn install_script_stages_everything_and_keeps_the_configuration() {
    let dest = tempfile::tempdir().unwrap();
    let install = || {
        let out = Command::new("bash")
            .arg(repo().join("scripts/install.sh"))
            .env("DESTDIR", dest.path())
            .env("PREFIX", "/usr/local")
            .env("OPENARRAY_BIN", env!("CARGO_BIN_EXE_openarray"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    };
    install();
    let at = |p: &str| dest.path().join(p.trim_start_matches('/'));
    for file in [
        "/usr/local/bin/openarray",
        "/etc/systemd/system/openarray.service",
        "/usr/local/share/bash-completion/completions/openarray",
        "/usr/local/share/zsh/site-functions/_openarray",
        "/usr/local/share/fish/vendor_completions.d/openarray.fish",
        "/usr/local/share/man/man1/openarray.1",
        "/usr/local/share/man/man1/openarray-serve.1",
        "/etc/openarray/openarray.toml",
    ] {
        let meta = std::fs::metadata(at(file)).unwrap_or_else(|_| panic!("{file} missing"));
        assert!(meta.len() > 0, "{file} is empty");
    }
    let unit = std::fs::read_to_string(at("/etc/systemd/system/openarray.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/openarray serve"));
    // The example configuration is valid as installed, and commented.
    let config = at("/etc/openarray/openarray.toml");
    ok(&["check-config", config.to_str().unwrap()]);
    let example = std::fs::read_to_string(&config).unwrap();
    assert!(example.contains("# [[device]]"), "{example}");

    // Again: the administrator's configuration stays as it is.
    std::fs::write(&config, "# mine\n").unwrap();
    install();
    assert_eq!(std::fs::read_to_string(&config).unwrap(), "# mine\n");
}
