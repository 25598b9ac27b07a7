//! `openarray device|target|portal|group|initiator|lun|chap|export ...`: the
//! imperative administration commands. Each change is one `POST /v1/edit`
//! that the daemon validates against the whole configuration, writes
//! atomically and applies live, exactly as `config apply` does; listings
//! read `GET /v1/objects` and `GET /v1/config`.
//!
//! The subcommands of the iSCSI objects (target, portal, group, initiator,
//! lun) are in `target_cli.rs`, of NBD exports in `export_cli.rs`.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use control::{ChapScope, Edit};
use serde_json::Value;

use crate::api_client::{call, ApiArgs, Endpoint};
pub use crate::device_cli::DeviceOp;
use crate::output::{print_json, toml_to_json, Format};
use crate::target_cli::{self, GroupOp, InitiatorOp, LunOp, PortalOp, TargetOp};

/// `KEY=VALUE` as typed; an empty value (`KEY=`) removes the key.
pub(crate) fn setting(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` is not KEY=VALUE"))?;
    if key.trim().is_empty() {
        return Err(format!("`{text}` has no key"));
    }
    Ok((key.trim().to_string(), value.to_string()))
}

#[derive(Subcommand)]
pub enum EditCommand {
    /// Block devices: list, show, add, remove, modify.
    Device {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        op: DeviceOp,
    },
    /// iSCSI targets: list, show, add, remove, modify.
    Target {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        op: TargetOp,
    },
    /// Portals (listening addresses): list, add, remove. Sessions on a
    /// removed portal keep running until they log out.
    Portal {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        op: PortalOp,
    },
    /// Initiator groups of a target: list, add, remove.
    Group {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        op: GroupOp,
    },
    /// Members of an initiator group: list, add, remove.
    Initiator {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        op: InitiatorOp,
    },
    /// LUN mappings of a target or of one of its groups.
    Lun {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        op: LunOp,
    },
    /// CHAP credentials of discovery, a target or a group. Secrets are
    /// read from files (or `-` for standard input), never from arguments.
    Chap {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        op: ChapOp,
    },
    /// NBD exports: list, add, remove.
    Export {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        op: crate::export_cli::ExportOp,
    },
}

/// Whose credentials: `--discovery`, `--target T` or `--target T --group G`.
#[derive(Args)]
pub struct ChapWhere {
    /// The credentials of discovery (SendTargets) sessions.
    #[arg(long, conflicts_with = "target", required_unless_present = "target")]
    discovery: bool,
    /// The credentials of logins to this target.
    #[arg(long)]
    target: Option<String>,
    /// Of this group of --target only (they take precedence over the target's).
    #[arg(long, requires = "target")]
    group: Option<String>,
}

impl ChapWhere {
    fn scope(&self) -> ChapScope {
        match (&self.target, &self.group) {
            (Some(target), Some(group)) => ChapScope::Group {
                target: target.clone(),
                group: group.clone(),
            },
            (Some(target), None) => ChapScope::Target {
                target: target.clone(),
            },
            (None, _) => ChapScope::Discovery,
        }
    }
}

#[derive(Subcommand)]
pub enum ChapOp {
    /// Set the credentials initiators must present (and, with
    /// --mutual-user, those the target answers with).
    Set {
        #[command(flatten)]
        at: ChapWhere,
        /// The name initiators present (CHAP_N).
        #[arg(long)]
        user: String,
        /// File holding the secret, or `-` for standard input.
        #[arg(long, value_name = "FILE")]
        secret_file: PathBuf,
        /// Mutual CHAP: the name the target answers with.
        #[arg(long, requires = "mutual_secret_file")]
        mutual_user: Option<String>,
        /// Mutual CHAP: file holding the target's secret (`-` for stdin).
        #[arg(long, value_name = "FILE", requires = "mutual_user")]
        mutual_secret_file: Option<PathBuf>,
    },
    /// Remove the credentials.
    Clear {
        #[command(flatten)]
        at: ChapWhere,
    },
}

/// A secret from a file, or from standard input for `-`; the trailing
/// newline is not part of it.
fn read_secret(path: &Path) -> anyhow::Result<String> {
    let mut text = String::new();
    if path == Path::new("-") {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the secret from standard input")?;
    } else {
        text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the secret file {}", path.display()))?;
    }
    let secret = text.trim_end_matches(['\r', '\n']).to_string();
    if secret.is_empty() {
        bail!("the secret in {} is empty", path.display());
    }
    Ok(secret)
}

/// Picks the listed array out of `GET /v1/objects`.
type Selector = Box<dyn Fn(&Value) -> anyhow::Result<Value>>;

/// What a command asks of the daemon.
pub(crate) enum Action {
    /// The change, and whether it may replace data a LUN serves.
    Edit(Edit, bool),
    /// Print the entries `select` picks from `GET /v1/objects`, one `line`
    /// each (or the array as JSON).
    List {
        select: Selector,
        line: fn(&Value, &Format) -> String,
        format: Format,
    },
    /// Print one object of the running configuration text.
    Show {
        kind: &'static str,
        name: String,
        format: Format,
    },
    /// Inject a fault into a `faulty` device.
    Fault { name: String, body: Value },
    /// An operation on an `rbd` device's image.
    Rbd { name: String, body: Value },
    /// A command whose arguments do not make a request.
    Invalid(anyhow::Error),
}

pub(crate) fn list(
    format: Format,
    select: impl Fn(&Value) -> anyhow::Result<Value> + 'static,
    line: fn(&Value, &Format) -> String,
) -> Action {
    Action::List {
        select: Box::new(select),
        line,
        format,
    }
}

/// A change that never replaces data a LUN serves.
pub(crate) fn plain(edit: Edit) -> Action {
    Action::Edit(edit, false)
}

pub(crate) fn settings_map(pairs: Vec<(String, String)>) -> BTreeMap<String, String> {
    pairs.into_iter().collect()
}

fn action(cmd: EditCommand) -> anyhow::Result<(ApiArgs, Action)> {
    Ok(match cmd {
        EditCommand::Device { api, op } => (api, device(op)),
        EditCommand::Target { api, op } => (api, target_cli::target(op)),
        EditCommand::Portal { api, op } => (api, target_cli::portal(op)),
        EditCommand::Group { api, op } => (api, target_cli::group(op)),
        EditCommand::Initiator { api, op } => (api, target_cli::initiator(op)),
        EditCommand::Lun { api, op } => (api, target_cli::lun(op)),
        EditCommand::Chap { api, op } => (api, chap(op)?),
        EditCommand::Export { api, op } => (api, crate::export_cli::action(op)),
    })
}

fn device(op: DeviceOp) -> Action {
    match op {
        DeviceOp::List { format } => list(
            format,
            |o| Ok(o["devices"].clone()),
            |d, f| match d["size"].as_u64() {
                Some(size) => format!("{} ({}, {})", s(&d["name"]), s(&d["kind"]), f.size(size)),
                None => format!("{} ({})", s(&d["name"]), s(&d["kind"])),
            },
        ),
        DeviceOp::Show { name, format } => Action::Show {
            kind: "device",
            name,
            format,
        },
        DeviceOp::Fault { name, fault } => match crate::device_cli::fault_body(&fault) {
            Ok(body) => Action::Fault { name, body },
            Err(e) => Action::Invalid(e),
        },
        DeviceOp::Rbd { name, op } => match crate::device_cli::rbd_body(&op) {
            Ok(body) => Action::Rbd { name, body },
            Err(e) => Action::Invalid(e),
        },
        DeviceOp::Add {
            name,
            kind,
            path,
            size,
            read_only,
            settings,
        } => {
            let mut map = settings_map(settings);
            map.insert("kind".into(), kind);
            if let Some(p) = path {
                map.insert("path".into(), format!("\"{}\"", p.display()));
            }
            if let Some(size) = size {
                map.insert("size".into(), size);
            }
            if read_only {
                map.insert("read_only".into(), "true".into());
            }
            plain(Edit::DeviceAdd {
                name,
                settings: map,
            })
        }
        DeviceOp::Remove { name } => Action::Edit(Edit::DeviceRemove { name }, false),
        DeviceOp::Modify {
            name,
            settings,
            force,
        } => Action::Edit(
            Edit::DeviceModify {
                name,
                settings: settings_map(settings),
            },
            force,
        ),
    }
}

fn chap(op: ChapOp) -> anyhow::Result<Action> {
    Ok(match op {
        ChapOp::Set {
            at,
            user,
            secret_file,
            mutual_user,
            mutual_secret_file,
        } => plain(Edit::ChapSet {
            scope: at.scope(),
            user,
            secret: read_secret(&secret_file)?,
            mutual_user,
            mutual_secret: mutual_secret_file.as_deref().map(read_secret).transpose()?,
        }),
        ChapOp::Clear { at } => plain(Edit::ChapClear { scope: at.scope() }),
    })
}

pub(crate) fn items(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

pub(crate) fn s(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

/// The daemon's answer, or its error message as an error.
fn answer(api: &Endpoint, method: &str, path: &str, body: &[u8]) -> anyhow::Result<Value> {
    let (status, json) = call(api, method, path, body, None)?;
    if status != 200 {
        return Err(anyhow!(
            "{}",
            json["error"].as_str().unwrap_or("the daemon refused")
        ));
    }
    Ok(json)
}

fn run_action(api: &Endpoint, action: Action) -> anyhow::Result<()> {
    match action {
        Action::Edit(edit, force) => {
            let body = serde_json::to_vec(&edit).context("cannot encode the change")?;
            let path = if force {
                "/v1/edit?force=true"
            } else {
                "/v1/edit"
            };
            let json = answer(api, "POST", path, &body)?;
            let changes = items(&json["changes"]);
            if changes.is_empty() {
                println!("no changes");
            }
            for change in changes {
                println!("{}", s(&change));
            }
            if let Some(note) = json["note"].as_str() {
                println!("note: {note}");
            }
        }
        Action::List {
            select,
            line,
            format,
        } => {
            let listed = select(&answer(api, "GET", "/v1/objects", b"")?)?;
            if format.json {
                print_json(&listed);
            } else {
                for entry in items(&listed) {
                    println!("{}", line(&entry, &format));
                }
            }
        }
        Action::Show { kind, name, format } => {
            let json = answer(api, "GET", "/v1/config", b"")?;
            let text = control::show_object(json["toml"].as_str().unwrap_or(""), kind, &name)
                .map_err(|e| anyhow!(e))?;
            let tree = if kind == "device" {
                let path = format!("/v1/devices/{}", daemon::volume_api::percent_encode(&name));
                Some(answer(api, "GET", &path, b"")?)
            } else {
                None
            };
            if format.json {
                let mut object = toml_to_json(&text)?;
                let mut shown = object[kind][0].take();
                if let Some(tree) = tree {
                    shown["tree"] = tree;
                }
                print_json(&shown);
            } else {
                print!("{text}");
                if let Some(tree) = tree {
                    println!();
                    for line in crate::device_cli::tree_lines(&tree, &format) {
                        println!("{line}");
                    }
                }
            }
        }
        Action::Fault { name, body } => {
            let path = format!(
                "/v1/devices/{}/fault",
                daemon::volume_api::percent_encode(&name)
            );
            let json = answer(api, "POST", &path, body.to_string().as_bytes())?;
            println!("{name}: {}", json["done"].as_str().unwrap_or("done"));
        }
        Action::Rbd { name, body } => {
            let path = format!(
                "/v1/devices/{}/rbd",
                daemon::volume_api::percent_encode(&name)
            );
            let json = answer(api, "POST", &path, body.to_string().as_bytes())?;
            println!("{name}: {}", json["done"].as_str().unwrap_or("done"));
        }
        Action::Invalid(e) => return Err(e),
    }
    Ok(())
}

/// Exit status 0 when done, 1 when the daemon refused (the message names
/// the field), 2 when it could not be asked.
pub fn run(cmd: EditCommand) -> ExitCode {
    let (api, action) = match action(cmd) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("openarray: {e:#}");
            return ExitCode::from(2);
        }
    };
    let endpoint = match api.endpoint() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("openarray: {e:#}");
            return ExitCode::from(2);
        }
    };
    match run_action(&endpoint, action) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e:#}");
            crate::output::exit_code(&e)
        }
    }
}

#[cfg(test)]
#[path = "edit_cli_tests.rs"]
mod tests;
