//! `openarray target|portal|group|initiator|lun ...`: the iSCSI side of
//! the configuration (targets, the portals they listen on, their
//! initiator groups and LUN maps), changed through the same
//! `POST /v1/edit` as every other object and listed from
//! `GET /v1/objects`.

use std::collections::BTreeMap;

use anyhow::anyhow;
use clap::Subcommand;
use control::Edit;
use serde_json::Value;

use crate::edit_cli::{items, list, plain, s, setting, settings_map, Action};
use crate::output::Format;

#[derive(Subcommand)]
pub enum TargetOp {
    List {
        #[command(flatten)]
        format: Format,
    },
    /// Print the target's configuration, groups and LUNs (secrets masked).
    Show {
        iqn: String,
        #[command(flatten)]
        format: Format,
    },
    Add {
        iqn: String,
        /// TargetAlias reported at login.
        #[arg(long)]
        alias: Option<String>,
    },
    /// Remove a target; its sessions are asked to log out.
    Remove {
        iqn: String,
        /// Accept losing the data the change replaces (said in the answer).
        #[arg(long)]
        force: bool,
    },
    /// Change keys of [[target]], e.g. `alias=lab`.
    Modify {
        iqn: String,
        #[arg(value_name = "KEY=VALUE", value_parser = setting, required = true)]
        settings: Vec<(String, String)>,
    },
}

#[derive(Subcommand)]
pub enum PortalOp {
    List {
        #[command(flatten)]
        format: Format,
    },
    /// Start listening on ADDR:PORT (IPv6 as [::1]:3260).
    Add { listen: String },
    /// Stop accepting on ADDR:PORT.
    Remove { listen: String },
}

#[derive(Subcommand)]
pub enum GroupOp {
    List {
        target: String,
        #[command(flatten)]
        format: Format,
    },
    /// Add a group with its first members (a group named `default` has
    /// none: it serves initiators no other group names).
    Add {
        target: String,
        group: String,
        #[arg(value_name = "INITIATOR")]
        initiators: Vec<String>,
    },
    Remove {
        target: String,
        group: String,
        /// Accept losing the data the change replaces (said in the answer).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
pub enum InitiatorOp {
    List {
        target: String,
        group: String,
        #[command(flatten)]
        format: Format,
    },
    /// Add an initiator name, or a pattern with `*` and `?`.
    Add {
        target: String,
        group: String,
        initiator: String,
    },
    Remove {
        target: String,
        group: String,
        initiator: String,
    },
}

#[derive(Subcommand)]
pub enum LunOp {
    List {
        target: String,
        /// The group's map instead of the target's own.
        #[arg(long)]
        group: Option<String>,
        #[command(flatten)]
        format: Format,
    },
    /// Map DEVICE as LUN of the target (or of --group).
    Add {
        target: String,
        lun: u64,
        device: String,
        /// Map it in this group instead of the target's own map.
        #[arg(long)]
        group: Option<String>,
        /// Writes through this mapping fail with DATA PROTECT.
        #[arg(long)]
        read_only: bool,
    },
    /// Make a mapping read-only or writable again.
    Modify {
        target: String,
        lun: u64,
        /// The mapping in this group instead of the target's own map.
        #[arg(long)]
        group: Option<String>,
        /// Refuse writes through the mapping.
        #[arg(
            long,
            conflicts_with = "read_write",
            required_unless_present = "read_write"
        )]
        read_only: bool,
        /// Allow writes again.
        #[arg(long)]
        read_write: bool,
    },
    /// Unmap a LUN; I/O in flight on it finishes or is aborted, and the
    /// initiators that still see the target are told REPORTED LUNS DATA
    /// HAS CHANGED.
    Remove {
        target: String,
        lun: u64,
        /// The mapping in this group instead of the target's own map.
        #[arg(long)]
        group: Option<String>,
        /// Accept losing the data the change replaces (said in the answer).
        #[arg(long)]
        force: bool,
    },
}

pub fn target(op: TargetOp) -> Action {
    match op {
        TargetOp::List { format } => {
            list(format, |o| Ok(o["targets"].clone()), |t, _| s(&t["name"]))
        }
        TargetOp::Show { iqn, format } => Action::Show {
            kind: "target",
            name: iqn,
            format,
        },
        TargetOp::Add { iqn, alias } => {
            let mut settings = BTreeMap::new();
            if let Some(alias) = alias {
                settings.insert("alias".to_string(), format!("\"{alias}\""));
            }
            plain(Edit::TargetAdd {
                name: iqn,
                settings,
            })
        }
        TargetOp::Remove { iqn, force } => Action::Edit(Edit::TargetRemove { name: iqn }, force),
        TargetOp::Modify { iqn, settings } => plain(Edit::TargetModify {
            name: iqn,
            settings: settings_map(settings),
        }),
    }
}

pub fn portal(op: PortalOp) -> Action {
    match op {
        PortalOp::List { format } => list(format, |o| Ok(o["portals"].clone()), |p, _| s(p)),
        PortalOp::Add { listen } => plain(Edit::PortalAdd { listen }),
        PortalOp::Remove { listen } => plain(Edit::PortalRemove { listen }),
    }
}

pub fn group(op: GroupOp) -> Action {
    match op {
        GroupOp::List { target, format } => list(
            format,
            move |o| Ok(find(&o["targets"], &target)?["groups"].clone()),
            |g, _| {
                let members: Vec<String> = items(&g["initiators"]).iter().map(s).collect();
                format!("{}: {}", s(&g["name"]), members.join(", "))
            },
        ),
        GroupOp::Add {
            target,
            group,
            initiators,
        } => plain(Edit::GroupAdd {
            target,
            group,
            initiators,
        }),
        GroupOp::Remove {
            target,
            group,
            force,
        } => Action::Edit(Edit::GroupRemove { target, group }, force),
    }
}

pub fn initiator(op: InitiatorOp) -> Action {
    match op {
        InitiatorOp::List {
            target,
            group,
            format,
        } => list(
            format,
            move |o| Ok(group_in(o, &target, &group)?["initiators"].clone()),
            |i, _| s(i),
        ),
        InitiatorOp::Add {
            target,
            group,
            initiator,
        } => plain(Edit::InitiatorAdd {
            target,
            group,
            initiator,
        }),
        InitiatorOp::Remove {
            target,
            group,
            initiator,
        } => plain(Edit::InitiatorRemove {
            target,
            group,
            initiator,
        }),
    }
}

pub fn lun(op: LunOp) -> Action {
    match op {
        LunOp::List {
            target,
            group,
            format,
        } => list(
            format,
            move |o| match &group {
                Some(g) => Ok(group_in(o, &target, g)?["luns"].clone()),
                None => Ok(find(&o["targets"], &target)?["luns"].clone()),
            },
            |l, _| {
                let ro = if l["read_only"].as_bool() == Some(true) {
                    " (read-only)"
                } else {
                    ""
                };
                format!("{} -> {}{ro}", l["lun"], s(&l["device"]))
            },
        ),
        LunOp::Add {
            target,
            lun,
            device,
            group,
            read_only,
        } => plain(Edit::LunAdd {
            target,
            group,
            lun,
            device,
            read_only,
        }),
        LunOp::Modify {
            target,
            lun,
            group,
            read_only,
            ..
        } => plain(Edit::LunModify {
            target,
            group,
            lun,
            read_only,
        }),
        LunOp::Remove {
            target,
            lun,
            group,
            force,
        } => Action::Edit(Edit::LunRemove { target, group, lun }, force),
    }
}

/// The entry of `list` named `name` (names compare without case).
fn find(list: &Value, name: &str) -> anyhow::Result<Value> {
    items(list)
        .into_iter()
        .find(|i| s(&i["name"]).eq_ignore_ascii_case(name))
        .ok_or_else(|| anyhow!("no `{name}` in the running configuration"))
}

/// Group `group` of target `target` in `GET /v1/objects`.
fn group_in(objects: &Value, target: &str, group: &str) -> anyhow::Result<Value> {
    find(&find(&objects["targets"], target)?["groups"], group)
}
