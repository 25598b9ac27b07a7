//! `openarray config show|diff|apply|save`: the command line side of the
//! administration API (see `admin.rs`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use serde_json::Value;

// Callers that only know a socket path (the pool commands) use these.
use crate::api_client::{call, ApiArgs, Endpoint};
#[allow(unused_imports)]
pub use crate::api_client::{request, DEFAULT_SOCKET};
use crate::output::{print_json, toml_to_json, Format};

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Print the running configuration.
    Show {
        #[command(flatten)]
        format: Format,
    },
    /// List the running devices, targets, groups and LUN mappings.
    List {
        #[command(flatten)]
        format: Format,
    },
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
        /// Also make changes that replace data a LUN serves (a RAM
        /// device re-created or dropped, a device of another kind, file
        /// or volume); the answer says what is lost.
        #[arg(long)]
        force: bool,
    },
    /// Write the running configuration to the daemon's configuration file.
    Save,
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

fn run_inner(api: &Endpoint, cmd: ConfigCommand) -> anyhow::Result<ExitCode> {
    let read = |file: &Path| {
        std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))
    };
    let (status, json) = match &cmd {
        ConfigCommand::Show { .. } => call(api, "GET", "/v1/config", b"", None)?,
        ConfigCommand::List { .. } => call(api, "GET", "/v1/objects", b"", None)?,
        ConfigCommand::Diff { file } => call(
            api,
            "POST",
            "/v1/config/diff",
            &read(file)?,
            Some(&file.display().to_string()),
        )?,
        ConfigCommand::Apply { file, force } => call(
            api,
            "POST",
            if *force {
                "/v1/config/apply?force=true"
            } else {
                "/v1/config/apply"
            },
            &read(file)?,
            Some(&file.display().to_string()),
        )?,
        ConfigCommand::Save => call(api, "POST", "/v1/config/save", b"", None)?,
    };
    if status != 200 {
        let message = json["error"].as_str().unwrap_or("unknown error");
        eprintln!("{message}");
        return Ok(ExitCode::FAILURE);
    }
    match cmd {
        ConfigCommand::Show { format } => {
            let text = json["toml"].as_str().unwrap_or("");
            if format.json {
                print_json(&serde_json::json!({
                    "path": json["path"],
                    "config": toml_to_json(text).context("the daemon's configuration")?,
                }));
            } else {
                print!("{text}");
            }
        }
        ConfigCommand::List { format } if format.json => print_json(&json),
        ConfigCommand::List { .. } => print!("{}", listing(&json)),
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
            if let Some(note) = json["note"].as_str() {
                println!("note: {note}");
            }
        }
        ConfigCommand::Save => {
            println!("saved to {}", json["path"].as_str().unwrap_or("?"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(api: &ApiArgs, cmd: ConfigCommand) -> ExitCode {
    api.run(|e| run_inner(e, cmd))
}
