//! The web console in a real browser: headless Chromium, driven through
//! chromedriver, against the real daemon. It logs in (a wrong token is
//! refused), watches a LUN's IOPS move while qemu-img writes to it, takes
//! a snapshot of a pool's volume and finds it, sees a RAID5 member failed
//! with `device fault` turn the array degraded and then rebuild onto a new
//! spare with its progress, applies a configuration that adds a LUN and sees it, sees an
//! invalid one refused naming its field with nothing applied, and sees a
//! read-only token refused every change. With `CONSOLE_SCREENSHOTS=DIR`
//! it saves a screenshot of each page there (docs/console/ holds them).

mod common;
#[path = "common/webdriver.rs"]
mod webdriver;

use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::admin::{http_exchange, AdminDaemon};
use common::{free_port, require_tool};
use serde_json::{json, Value};
use webdriver::Browser;

const TARGET: &str = "iqn.2026-11.org.test:console";
const TOKEN: &str = "console-full-token-0123456789";
const READ_ONLY: &str = "console-read-only-token-0123456789";
const WAIT: Duration = Duration::from_secs(20);

fn write_private(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A pool volume (LUN 0) and a RAID5 over three `faulty` members (LUN 1),
/// with an unused device to add as a spare.
fn config(dir: &Path, portal: u16, api: u16) -> String {
    let d = dir.display();
    let mut text = format!(
        "[daemon]\napi_listen = \"127.0.0.1:{api}\"\napi_token_file = \"{d}/token\"\n\
         api_read_only_token_file = \"{d}/read-only\"\n\n\
         [[portal]]\nlisten = \"127.0.0.1:{portal}\"\n\n\
         [[pool]]\nname = \"tank\"\ndevices = [\"{d}/tank0.img\"]\ndevice_size = \"64M\"\n\n\
         [[device]]\nname = \"thin0\"\nkind = \"volume\"\npool = \"tank\"\nsize = \"16M\"\n"
    );
    for m in ["m0", "m1", "m2"] {
        text += &format!(
            "\n[[device]]\nname = \"{m}-disk\"\nkind = \"file\"\npath = \"{d}/{m}.img\"\nsize = \"16M\"\n\
             [[device]]\nname = \"{m}\"\nkind = \"faulty\"\nover = \"{m}-disk\"\n"
        );
    }
    text += &format!(
        "\n[[device]]\nname = \"s1\"\nkind = \"file\"\npath = \"{d}/s1.img\"\nsize = \"16M\"\n\
         \n[[device]]\nname = \"r5\"\nkind = \"raid\"\nlevel = 5\nmembers = [\"m0\", \"m1\", \"m2\"]\nchunk = \"64K\"\n\
         \n[[target]]\nname = \"{TARGET}\"\n[[target.lun]]\nlun = 0\ndevice = \"thin0\"\n\
         [[target.lun]]\nlun = 1\ndevice = \"r5\"\n"
    );
    text
}

/// The TCP API with `token`: status and JSON body.
fn api(port: u16, method: &str, path: &str, token: &str, body: &str) -> (u16, Value) {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let (status, text) = http_exchange(
        stream,
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: openarray\r\nAuthorization: Bearer {token}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// qemu-img writing 4K blocks to `url` until killed.
struct Writer(Child);

impl Writer {
    fn start(url: &str) -> Writer {
        let child = Command::new("qemu-img")
            .args([
                "bench",
                "-f",
                "raw",
                "-t",
                "none",
                "-w",
                "-c",
                "100000000",
                "-d",
                "4",
                "-s",
                "4k",
                url,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn qemu-img");
        Writer(child)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Shots(Option<PathBuf>);

impl Shots {
    fn take(&self, browser: &Browser, name: &str) {
        if let Some(dir) = &self.0 {
            browser.screenshot(&dir.join(format!("{name}.png")));
        }
    }
}

fn log_in(browser: &Browser, base: &str, token: &str) {
    browser.go(&format!("{base}/console/login"));
    browser.type_into("#token", token);
    browser.click("#login-button");
}

fn confirm(browser: &Browser, fields: &[(&str, &str)]) {
    browser.wait_text("#confirm-title", WAIT, |t| !t.is_empty());
    for (name, value) in fields {
        let css = format!("#confirm-{name}");
        let set = "const e = document.querySelector(arguments[0]); e.value = arguments[1]; return e.value;";
        let got = browser.script(set, json!([css, value]));
        assert_eq!(got, json!(value), "{css} could not be set to {value}");
    }
    browser.click("#confirm-ok");
}

#[test]
fn the_console_shows_and_changes_the_array_in_a_browser() {
    require_tool("qemu-img");
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    write_private(&dir.path().join("token"), TOKEN);
    write_private(&dir.path().join("read-only"), READ_ONLY);
    let (portal, api_port) = (free_port(), free_port());
    let config_path = dir.path().join("openarray.toml");
    std::fs::write(&config_path, config(dir.path(), portal, api_port)).unwrap();
    let daemon = AdminDaemon::start(&config_path, dir.path(), portal);
    // Slow rebuilds, so the browser sees one under way.
    let (status, answer) = api(
        api_port,
        "POST",
        "/v1/raid/r5/speed",
        TOKEN,
        r#"{"max": 1048576}"#,
    );
    assert_eq!(status, 200, "{answer}");
    let base = format!("http://127.0.0.1:{api_port}");
    let shots = Shots(std::env::var_os("CONSOLE_SCREENSHOTS").map(PathBuf::from));
    let browser = Browser::start(1280, 1000);

    // A wrong token: refused on the login page, and logged.
    log_in(&browser, &base, "not-the-token-0123456789");
    let refused = browser.wait_text("#login-error", WAIT, |t| !t.is_empty());
    assert!(refused.contains("wrong token"), "{refused}");
    assert!(
        browser.url().ends_with("/console/login"),
        "{}",
        browser.url()
    );
    shots.take(&browser, "login");
    assert!(
        daemon.log().contains("console: login refused"),
        "{}",
        daemon.log()
    );

    // Logged in: the overview's IOPS of LUN 0 move while qemu-img writes.
    log_in(&browser, &base, TOKEN);
    browser.wait_text("#healthy", WAIT, |t| t.contains("Healthy"));
    assert!(
        browser.find("#role").is_none(),
        "the full token shown as read-only"
    );
    let writer = Writer::start(&format!("iscsi://127.0.0.1:{portal}/{TARGET}/0"));
    let lun0 = format!("#live-body tr[data-key=\"{TARGET} LUN 0\"] .iops");
    let iops = browser.wait_text(&lun0, WAIT, |t| t.parse::<f64>().is_ok_and(|n| n > 0.0));
    eprintln!("LUN 0 at {iops} IOPS in the console");
    // The graph is drawn from the same samples the number comes from.
    let busy =
        "return App.live.samples.filter(s => s.luns.some(l => l.lun === 0 && l.iops > 0)).length";
    let busy = browser.script(busy, json!([]));
    assert!(busy.as_u64().is_some_and(|n| n >= 1), "{busy}");
    let sessions = browser.wait_text("#overview-static", WAIT, |t| t.contains("iscsi"));
    assert!(sessions.contains("127.0.0.1"), "{sessions}");
    if shots.0.is_some() {
        // A few seconds of the graph for the picture.
        std::thread::sleep(Duration::from_secs(5));
    }
    shots.take(&browser, "overview");
    drop(writer);

    // Storage: a snapshot of the pool's volume through the console.
    browser.click("#nav-storage");
    browser.click("[data-volume=\"thin0\"] [data-action=\"snapshot\"]");
    confirm(&browser, &[("name", "nightly")]);
    let row = browser.wait_text(
        "[data-pool=\"tank\"] [data-volume=\"nightly\"]",
        WAIT,
        |t| t.contains("snapshot"),
    );
    assert!(row.contains("nightly"), "{row}");

    // RAID5: a member failed underneath with `device fault` (the array
    // finds out at its next write there), then a spare added from the
    // console; the array is degraded, then rebuilds with its progress shown.
    daemon.ok(&["device", "fault", "m1", "fail"]);
    let r5_writer = Writer::start(&format!("iscsi://127.0.0.1:{portal}/{TARGET}/1"));
    browser.wait_text("[data-device=\"r5\"] [data-state=\"array\"]", WAIT, |t| {
        t == "degraded"
    });
    drop(r5_writer);
    browser.click("#nav-overview");
    let degraded = browser.wait_text("#degraded", WAIT, |t| t.contains("r5"));
    assert!(degraded.contains("degraded"), "{degraded}");
    browser.click("#nav-storage");
    browser.click("[data-device=\"r5\"] [data-action=\"add\"]");
    confirm(&browser, &[("device", "s1")]);
    browser.wait_text("[data-device=\"r5\"] [data-state=\"sync\"]", WAIT, |t| {
        t.starts_with("rebuild")
    });
    shots.take(&browser, "storage");
    browser.click("#nav-jobs");
    let job = browser.wait_text("#jobs tr[data-array=\"r5\"]", WAIT, |t| {
        t.contains("rebuild")
    });
    eprintln!("jobs: {job}");
    let progress = browser.script(
        "return document.querySelector('#jobs tr[data-array=\"r5\"] progress').value",
        json!([]),
    );
    assert!(progress.as_f64().is_some_and(|p| p < 100.0), "{progress}");
    shots.take(&browser, "jobs");

    // Configuration: a LUN added through apply is listed.
    browser.click("#nav-config");
    browser.wait_text("#config-diff", WAIT, |t| !t.is_empty());
    let append = "const t = document.querySelector('#config-text'); t.value += arguments[0]; return t.value.split('\\n').length;";
    browser.script(
        append,
        json!(["\n[[device]]\nname = \"scratch\"\nkind = \"mem\"\nsize = \"4M\"\n\n[[target]]\nname = \"iqn.2026-11.org.test:added\"\n[[target.lun]]\nlun = 0\ndevice = \"scratch\"\n"]),
    );
    browser.click("#config-diff-button");
    browser.wait_text("#config-diff", WAIT, |t| t.contains("scratch"));
    shots.take(&browser, "config");
    browser.click("#config-apply");
    browser.wait_text("#config-applied", WAIT, |t| t == "Applied.");
    browser.click("#nav-overview");
    browser.wait_text("#luns", WAIT, |t| {
        t.contains("scratch") && t.contains("iqn.2026-11.org.test:added")
    });

    // An invalid change: the field is named, nothing is applied.
    browser.click("#nav-config");
    browser.wait_text("#config-diff", WAIT, |t| !t.is_empty());
    let lines = browser.script(
        append,
        json!(["\n[[device]]\nname = \"bad\"\nkind = \"mem\"\nsize = \"lots\"\n"]),
    );
    let bad_line = lines.as_u64().unwrap() - 1;
    browser.click("#config-apply");
    let error = browser.wait_text("#config-error", WAIT, |t| !t.is_empty());
    assert!(
        error.contains("size") && error.contains(&format!(":{bad_line}:")),
        "{error} (line {bad_line})"
    );
    let (_, objects) = api(api_port, "GET", "/v1/objects", TOKEN, "");
    let names: Vec<&str> = objects["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert!(
        names.contains(&"scratch") && !names.contains(&"bad"),
        "{names:?}"
    );

    // The read-only token reads everything and is refused every change.
    browser.click("header form button");
    log_in(&browser, &base, READ_ONLY);
    browser.wait_text("#luns", WAIT, |t| t.contains("scratch"));
    browser.wait_text("#role", WAIT, |t| t == "read-only");
    browser.click("#nav-storage");
    browser.click("[data-volume=\"thin0\"] [data-action=\"snapshot\"]");
    confirm(&browser, &[("name", "not-allowed")]);
    let refused = browser.wait_text("#notice-error", WAIT, |t| !t.is_empty());
    assert!(
        refused.contains("403") && refused.contains("read-only"),
        "{refused}"
    );
    browser.click("#nav-config");
    browser.wait_text("#config-diff", WAIT, |t| !t.is_empty());
    browser.script(
        append,
        json!(["\n[[device]]\nname = \"ro\"\nkind = \"mem\"\nsize = \"4M\"\n"]),
    );
    browser.click("#config-apply");
    let refused = browser.wait_text("#config-error", WAIT, |t| !t.is_empty());
    assert!(refused.contains("403"), "{refused}");
    let (status, _) = api(api_port, "GET", "/v1/status", READ_ONLY, "");
    assert_eq!(status, 200);
    let (status, answer) = api(api_port, "POST", "/v1/config/save", READ_ONLY, "");
    assert_eq!(
        (
            status,
            answer["error"].as_str().unwrap_or("").contains("read-only")
        ),
        (403, true),
        "{answer}"
    );
    let (_, volumes) = api(api_port, "GET", "/v1/volumes", TOKEN, "");
    assert!(!volumes.to_string().contains("not-allowed"), "{volumes}");

    // At phone width the overview still reads.
    browser.resize(390, 844);
    browser.click("#nav-overview");
    browser.wait_text("#luns", WAIT, |t| t.contains("scratch"));
    let overflow = "return document.documentElement.scrollWidth - window.innerWidth";
    let overflow = browser.script(overflow, json!([]));
    assert!(
        overflow.as_i64().is_some_and(|n| n <= 0),
        "wider than the phone by {overflow}px"
    );
    shots.take(&browser, "phone");
    eprintln!("the browser test took {:?}", started.elapsed());
}

/// One raw request to the console's listener; status, head and body.
fn raw(port: u16, request: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

/// The session cookie a login with `token` sets.
fn session(port: u16, token: &str) -> String {
    let form = format!("token={token}");
    let (status, head, _) = raw(
        port,
        &format!(
            "POST /console/login HTTP/1.1\r\nHost: a\r\nContent-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{form}",
            form.len()
        ),
    );
    assert_eq!(status, 303, "{head}");
    let cookie = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .unwrap_or_else(|| panic!("no cookie: {head}"));
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    cookie.split(';').next().unwrap().to_string()
}

/// The console's requests without a browser: sessions, the CSRF header,
/// the read-only role, bad cookies, oversized bodies and the event stream.
#[test]
fn console_requests_are_guarded() {
    let dir = tempfile::tempdir().unwrap();
    write_private(&dir.path().join("token"), TOKEN);
    write_private(&dir.path().join("read-only"), READ_ONLY);
    let (portal, port) = (free_port(), free_port());
    let config_path = dir.path().join("openarray.toml");
    std::fs::write(&config_path, config(dir.path(), portal, port)).unwrap();
    let daemon = AdminDaemon::start(&config_path, dir.path(), portal);
    // `openarray console` says where it is.
    let url = daemon.ok(&["console"]);
    assert_eq!(url.trim(), format!("http://127.0.0.1:{port}/console/"));
    let get = |path: &str, cookie: &str| {
        raw(
            port,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: a\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    let post = |path: &str, cookie: &str, extra: &str, body: &str| {
        raw(
            port,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: a\r\nCookie: {cookie}\r\n{extra}Content-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    // No session, or a made-up one: the page sends to the login, the data is refused.
    let (status, head, _) = get("/console/", "");
    assert!(
        status == 303 && head.contains("location: /console/login"),
        "{head}"
    );
    for cookie in ["", "openarray_console=00", "openarray_console=%%%; x=1"] {
        let (status, _, body) = get("/console/api/v1/status", cookie);
        assert_eq!(status, 401, "{cookie}: {body}");
    }
    let (status, _, _) = get("/", "");
    assert_eq!(status, 303);

    let full = session(port, TOKEN);
    let (status, _, body) = get("/console/api/v1/status", &full);
    assert_eq!(status, 200, "{body}");
    // A change needs the console's header, so a cross-site form cannot make one.
    let snapshot = r#"{"name": "s"}"#;
    let (status, _, body) = post(
        "/console/api/v1/volumes/tank/thin0/snapshot",
        &full,
        "",
        snapshot,
    );
    assert!(
        status == 403 && body.contains("X-Console"),
        "{status} {body}"
    );
    let (status, _, body) = post(
        "/console/api/v1/volumes/tank/thin0/snapshot",
        &full,
        "X-Console: 1\r\n",
        snapshot,
    );
    assert_eq!(status, 201, "{body}");
    let (status, _, body) = post(
        "/console/api/v1/volumes/tank/thin0/snapshot",
        &full,
        "X-Console: 1\r\n",
        "{not json",
    );
    assert_eq!(status, 400, "{body}");
    let (status, _, body) = post(
        "/console/api/v1/config/apply",
        &full,
        "X-Console: 1\r\n",
        &"#".repeat(5 << 20),
    );
    assert_eq!(status, 413, "{body}");

    let read_only = session(port, READ_ONLY);
    let (status, _, _) = get("/console/api/v1/volumes", &read_only);
    assert_eq!(status, 200);
    let (status, _, body) = post(
        "/console/api/v1/volumes/tank/thin0/snapshot",
        &read_only,
        "X-Console: 1\r\n",
        r#"{"name": "t"}"#,
    );
    assert!(
        status == 403 && body.contains("read-only"),
        "{status} {body}"
    );
    // Logging out ends the session.
    post("/console/logout", &read_only, "", "");
    let (status, _, _) = get("/console/api/v1/volumes", &read_only);
    assert_eq!(status, 401);

    // The event stream: the history, then a sample a second.
    let seen = live_events(
        port,
        &format!("Cookie: {full}"),
        "/console/api/v1/stats/live",
    );
    assert!(seen.contains("\"luns\""), "{seen}");
}

/// The start of the live stream at `path`: its `history` event and the
/// first sample after it.
fn live_events(port: u16, credentials: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: a\r\n{credentials}\r\n\r\n"
    )
    .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    while !(seen.contains("event: history") && seen.contains("\ndata: {")) {
        assert!(start.elapsed() < Duration::from_secs(10), "{seen}");
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "{seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert!(seen.contains("text/event-stream"), "{seen}");
    seen
}

/// The API routes the console's scripts may call: the `ROUTES` table of
/// app.js, as (method, path template). No asset names a `/v1/` path
/// anywhere else, and app.js has one `fetch` and one `EventSource`, both
/// given paths from that table.
fn console_routes() -> Vec<(String, String)> {
    let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/console/assets");
    let app = std::fs::read_to_string(assets.join("app.js")).unwrap();
    let start = app.find("const ROUTES = {").expect("app.js has ROUTES");
    let end = start + app[start..].find("};").unwrap();
    let table = &app[start..end];
    let routes: Vec<(String, String)> = table
        .lines()
        .filter_map(|l| {
            let (method, path) = l.split('"').nth(1)?.split_once(' ')?;
            Some((method.to_string(), path.to_string()))
        })
        .collect();
    assert!(routes.len() > 10, "{table}");
    for entry in std::fs::read_dir(&assets).unwrap() {
        let path = entry.unwrap().path();
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let text = text.replace(table, "");
        for line in text.lines().filter(|l| l.contains("/v1/")) {
            assert!(
                line.trim_start().starts_with("//"),
                "{} calls an API path outside ROUTES: {line}",
                path.display()
            );
        }
    }
    assert_eq!(app.matches("fetch(").count(), 1, "one fetch, in call()");
    assert_eq!(app.matches("EventSource(").count(), 1, "one EventSource");
    routes
}

/// Everything the console shows and does is a documented API route: each
/// route of the console's scripts is listed in docs/admin.md, with its
/// JSON, and answers on a running daemon (through a console session, as
/// the scripts call it; the live stream with a bearer token too).
#[test]
fn console_calls_only_documented_api_routes() {
    let routes = console_routes();
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/admin.md"))
        .unwrap();
    for (method, path) in &routes {
        assert!(
            docs.contains(&format!("`{method} {path}`")),
            "docs/admin.md does not list `{method} {path}`, which the console calls"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    write_private(&dir.path().join("token"), TOKEN);
    write_private(&dir.path().join("read-only"), READ_ONLY);
    let (portal, port) = (free_port(), free_port());
    let d = dir.path().display();
    // A cache is open only while something serves it: LUN 2 of the target.
    let text = config(dir.path(), portal, port)
        + &format!(
            "\n[[device]]\nname = \"fast\"\nkind = \"mem\"\nsize = \"8M\"\n\
             [[device]]\nname = \"slow\"\nkind = \"file\"\npath = \"{d}/slow.img\"\nsize = \"16M\"\n\
             [[device]]\nname = \"hybrid\"\nkind = \"cache\"\ncache = \"fast\"\nbacking = \"slow\"\n\
             mode = \"writeback\"\n\
             [[target.lun]]\nlun = 2\ndevice = \"hybrid\"\n"
        );
    let config_path = dir.path().join("openarray.toml");
    std::fs::write(&config_path, &text).unwrap();
    let _daemon = AdminDaemon::start(&config_path, dir.path(), portal);
    let cookie = session(port, TOKEN);
    let running = api(port, "GET", "/v1/config", TOKEN, "").1["toml"]
        .as_str()
        .unwrap()
        .to_string();

    // A real object for each parameter, and a body each change takes
    // without harm: a no-op, or one refused for a missing field (400).
    let params = [
        ("device", "r5"),
        ("faulty", "m2"),
        ("pool", "tank"),
        ("volume", "thin0"),
        ("array", "r5"),
        ("cache", "hybrid"),
    ];
    for (method, template) in &routes {
        let mut path = template.clone();
        for (name, value) in params {
            path = path.replace(&format!("{{{name}}}"), value);
        }
        assert!(!path.contains('{'), "no object for {template} in this test");
        // A clone is made of a snapshot: the one the snapshot route took.
        if template.ends_with("/clone") {
            path = path.replace("/thin0/", "/probe/");
        }
        if path == "/v1/stats/live" {
            let seen = live_events(
                port,
                &format!("Cookie: {cookie}"),
                "/console/api/v1/stats/live",
            );
            assert!(seen.contains("\"exports\""), "{seen}");
            let seen = live_events(port, &format!("Authorization: Bearer {READ_ONLY}"), &path);
            assert!(seen.contains("\"initiators\""), "{seen}");
            continue;
        }
        let (body, want): (&str, &[u16]) = match (method.as_str(), template.as_str()) {
            ("GET", _) => ("", &[200]),
            (_, "/v1/config/diff" | "/v1/config/apply") => (&running, &[200]),
            (_, "/v1/devices/{faulty}/fault") => (r#"{"fault": "heal"}"#, &[200]),
            (_, "/v1/volumes/{pool}/{volume}/snapshot") => (r#"{"name": "probe"}"#, &[201]),
            (_, "/v1/volumes/{pool}/{volume}/clone") => (r#"{"name": "probe-clone"}"#, &[201]),
            (_, "/v1/raid/{array}/scrub" | "/v1/caches/{cache}/flush") => ("{}", &[200, 202]),
            (_, "/v1/raid/{array}/fail" | "/v1/raid/{array}/replace" | "/v1/raid/{array}/add") => {
                ("{}", &[400])
            }
            _ => panic!("{method} {template}: the console calls it, this test does not know it"),
        };
        let (status, _, answer) = raw(
            port,
            &format!(
                "{method} /console/api{path} HTTP/1.1\r\nHost: a\r\nCookie: {cookie}\r\nX-Console: 1\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
        );
        assert!(
            want.contains(&status),
            "{method} {path}: {status} {answer}, expected one of {want:?}"
        );
        let value: Value = serde_json::from_str(&answer)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {answer}"));
        assert!(value.is_object(), "{method} {path}: {answer}");
    }
}
