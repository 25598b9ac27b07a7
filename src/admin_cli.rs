//! `openarray config show|diff|apply|save`: the command line side of the
//! administration API (see `admin.rs`).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context};
use clap::Subcommand;
use serde_json::Value;

/// Where `serve --admin-socket` listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/openarray.sock";

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Print the running configuration.
    Show,
    /// List the running devices, targets, groups and LUN mappings.
    List,
    /// Show what differs between FILE and the running configuration
    /// (exit status 1 when something does).
    Diff {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Make the running configuration what FILE says, while sessions run,
    /// and keep it in the daemon's configuration file. Applying what is
    /// already running changes nothing.
    Apply {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Write the running configuration to the daemon's configuration file.
    Save,
}

/// One request; returns the HTTP status and the JSON body.
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: &[u8],
    origin: Option<&str>,
) -> anyhow::Result<(u16, Value)> {
    let mut stream = UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot reach the daemon at {} (is `openarray serve --admin-socket` running?)",
            socket.display()
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: openarray\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(origin) = origin {
        // Header values are one line.
        head.push_str(&format!(
            "X-Config-Origin: {}\r\n",
            origin.replace(['\r', '\n'], " ")
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("malformed answer from the daemon"))?;
    let status_line = String::from_utf8_lossy(&answer[..split]);
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("malformed status from the daemon: {status_line}"))?;
    let json: Value =
        serde_json::from_slice(&answer[split + 4..]).context("malformed JSON from the daemon")?;
    Ok((status, json))
}

fn changes(json: &Value) -> Vec<String> {
    json["changes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The objects of `GET /v1/objects` as indented lines.
fn listing(json: &Value) -> String {
    let empty = Vec::new();
    let list = |v: &Value| v.as_array().unwrap_or(&empty).clone();
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let chap = |v: &Value| {
        if v.is_null() {
            String::new()
        } else {
            let mutual = if v["mutual_user"].is_null() {
                ""
            } else {
                ", mutual"
            };
            format!(" [CHAP user {}{mutual}]", s(&v["user"]))
        }
    };
    let luns = |out: &mut String, v: &Value, indent: &str| {
        for l in list(v) {
            let ro = if l["read_only"].as_bool() == Some(true) {
                " (read-only)"
            } else {
                ""
            };
            out.push_str(&format!(
                "{indent}LUN {} -> {}{ro}\n",
                l["lun"],
                s(&l["device"])
            ));
        }
    };
    let mut out = String::new();
    for p in list(&json["portals"]) {
        out.push_str(&format!("portal {}\n", s(&p)));
    }
    if !json["discovery_chap"].is_null() {
        out.push_str(&format!("discovery{}\n", chap(&json["discovery_chap"])));
    }
    for d in list(&json["devices"]) {
        out.push_str(&format!("device {} ({})\n", s(&d["name"]), s(&d["kind"])));
    }
    for t in list(&json["targets"]) {
        out.push_str(&format!("target {}{}\n", s(&t["name"]), chap(&t["chap"])));
        luns(&mut out, &t["luns"], "  ");
        for g in list(&t["groups"]) {
            let members: Vec<String> = list(&g["initiators"]).iter().map(s).collect();
            out.push_str(&format!(
                "  group {}{}: {}\n",
                s(&g["name"]),
                chap(&g["chap"]),
                if members.is_empty() {
                    "(initiators no other group names)".to_string()
                } else {
                    members.join(", ")
                }
            ));
            luns(&mut out, &g["luns"], "    ");
        }
    }
    out
}

fn run_inner(socket: &Path, cmd: ConfigCommand) -> anyhow::Result<ExitCode> {
    let read = |file: &Path| {
        std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))
    };
    let (status, json) = match &cmd {
        ConfigCommand::Show => request(socket, "GET", "/v1/config", b"", None)?,
        ConfigCommand::List => request(socket, "GET", "/v1/objects", b"", None)?,
        ConfigCommand::Diff { file } => request(
            socket,
            "POST",
            "/v1/config/diff",
            &read(file)?,
            Some(&file.display().to_string()),
        )?,
        ConfigCommand::Apply { file } => request(
            socket,
            "POST",
            "/v1/config/apply",
            &read(file)?,
            Some(&file.display().to_string()),
        )?,
        ConfigCommand::Save => request(socket, "POST", "/v1/config/save", b"", None)?,
    };
    if status != 200 {
        let message = json["error"].as_str().unwrap_or("unknown error");
        eprintln!("{message}");
        return Ok(ExitCode::FAILURE);
    }
    match cmd {
        ConfigCommand::Show => print!("{}", json["toml"].as_str().unwrap_or("")),
        ConfigCommand::List => print!("{}", listing(&json)),
        ConfigCommand::Diff { .. } => {
            let changes = changes(&json);
            for c in &changes {
                println!("{c}");
            }
            if !changes.is_empty() {
                return Ok(ExitCode::from(1));
            }
        }
        ConfigCommand::Apply { .. } => {
            let changes = changes(&json);
            if changes.is_empty() {
                println!("no changes");
            }
            for c in &changes {
                println!("{c}");
            }
        }
        ConfigCommand::Save => {
            println!("saved to {}", json["path"].as_str().unwrap_or("?"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(socket: &Path, cmd: ConfigCommand) -> ExitCode {
    match run_inner(socket, cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("openarray: {e:#}");
            ExitCode::from(2)
        }
    }
}
