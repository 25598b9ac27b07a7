//! Chromium driven headless through chromedriver's WebDriver HTTP API:
//! just what the console's browser test needs (navigate, find, click,
//! type, read, run a script, take a screenshot).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The flags that keep Chromium from reaching for the network (which is
/// closed here, and would make it hang) or for a display.
const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
];

/// W3C's key for element references in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with a fresh profile.
    pub fn start(width: u32, height: u32) -> Browser {
        crate::common::require_tool("chromedriver");
        crate::common::require_tool("chromium");
        let port = crate::common::free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn chromedriver");
        let profile = tempfile::tempdir().expect("profile dir");
        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|s| s.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        args.push(format!("--window-size={width},{height}"));
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
            _profile: profile,
        };
        let started = Instant::now();
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": "/usr/bin/chromium", "args": args },
        }}});
        let answer = loop {
            match browser.try_call("POST", "/session", Some(&capabilities)) {
                Ok(answer) => break answer,
                Err(e) if started.elapsed() < Duration::from_secs(20) => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("chromedriver did not start a session: {e}"),
            }
        };
        browser.session = answer["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_string();
        browser
    }

    /// One WebDriver command; its `value`.
    fn try_call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| e.to_string())?;
        let body = body.map(Value::to_string).unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .map_err(|e| e.to_string())?;
        // chromedriver keeps the connection open: read by Content-Length.
        let mut answer = Vec::new();
        let mut chunk = [0u8; 64 << 10];
        let (head, body) = loop {
            let n = stream.read(&mut chunk).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("chromedriver closed the connection".into());
            }
            answer.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&answer).to_string();
            let Some((head, body)) = text.split_once("\r\n\r\n") else {
                continue;
            };
            let length = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse::<usize>().ok());
            match length {
                Some(n) if body.len() >= n => break (head.to_string(), body[..n].to_string()),
                Some(_) => continue,
                None if head.to_ascii_lowercase().contains("chunked")
                    && body.ends_with("0\r\n\r\n") =>
                {
                    break (head.to_string(), unchunk(body))
                }
                None => continue,
            }
        };
        let value: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if head.split_whitespace().nth(1) != Some("200") {
            return Err(format!("{method} {path}: {}", value["value"]));
        }
        Ok(value["value"].clone())
    }

    fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let body = (method == "POST").then_some(&body);
        self.try_call(method, &path, body)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn go(&self, url: &str) {
        self.call("POST", "/url", json!({ "url": url }));
    }

    pub fn url(&self) -> String {
        self.call("GET", "/url", Value::Null)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The first element `css` selects, if any.
    pub fn find(&self, css: &str) -> Option<String> {
        let path = format!("/session/{}/element", self.session);
        let by = json!({ "using": "css selector", "value": css });
        self.try_call("POST", &path, Some(&by))
            .ok()
            .and_then(|v| v[ELEMENT].as_str().map(String::from))
    }

    /// Waits up to `limit` for `css` to select something whose text
    /// `accept`s; its text.
    pub fn wait_text(&self, css: &str, limit: Duration, accept: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        let mut last = String::from("(nothing selected)");
        while start.elapsed() < limit {
            if let Some(text) = self.find(css).and_then(|e| self.text_of(&e)) {
                if accept(&text) {
                    return text;
                }
                last = text;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "`{css}` did not show what was awaited within {limit:?}; last: {last:?}\nat {}",
            self.url()
        );
    }

    fn text_of(&self, element: &str) -> Option<String> {
        let path = format!("/session/{}/element/{element}/text", self.session);
        self.try_call("GET", &path, None)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
    }

    /// Clicks `css` once it is there. Pages re-render as they refresh, so
    /// an element found may be gone by the click: then it is found again.
    pub fn click(&self, css: &str) {
        let start = Instant::now();
        loop {
            let element = self.wait_for(css);
            let path = format!("/session/{}/element/{element}/click", self.session);
            match self.try_call("POST", &path, Some(&json!({}))) {
                Ok(_) => return,
                Err(e) if start.elapsed() < Duration::from_secs(15) => {
                    eprintln!("clicking `{css}` again: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("cannot click `{css}`: {e}"),
            }
        }
    }

    /// Types `text` into `css` after clearing it.
    pub fn type_into(&self, css: &str, text: &str) {
        let element = self.wait_for(css);
        self.call("POST", &format!("/element/{element}/clear"), json!({}));
        self.call(
            "POST",
            &format!("/element/{element}/value"),
            json!({ "text": text }),
        );
    }

    fn wait_for(&self, css: &str) -> String {
        let start = Instant::now();
        loop {
            if let Some(e) = self.find(css) {
                return e;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "`{css}` never appeared at {}",
                self.url()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `script` in the page with `args`; what it returned.
    pub fn script(&self, script: &str, args: Value) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            json!({ "script": script, "args": args }),
        )
    }

    pub fn resize(&self, width: u32, height: u32) {
        self.call(
            "POST",
            "/window/rect",
            json!({ "width": width, "height": height }),
        );
    }

    /// The page as a PNG file at `path`.
    pub fn screenshot(&self, path: &Path) {
        let data = self.call("GET", "/screenshot", Value::Null);
        let png = base64_decode(data.as_str().expect("screenshot data"));
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(path, png).expect("write screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = self.try_call("DELETE", &path, None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn unchunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let digits: Vec<u8> = text
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
        .map(value)
        .collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let mut n = 0u32;
        for (i, &d) in chunk.iter().enumerate() {
            n |= u32::from(d) << (18 - 6 * i);
        }
        for i in 0..chunk.len().saturating_sub(1) {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}
