//! `openarray export list|add|remove`: the devices offered to NBD clients,
//! changed through the same `POST /v1/edit` as LUNs (validated against
//! the whole configuration, written atomically, applied live).

use clap::Subcommand;
use control::Edit;
use serde_json::Value;

use crate::edit_cli::{items, list, plain, s, Action};
use crate::output::Format;

#[derive(Subcommand)]
pub enum ExportOp {
    /// Every NBD export: name, device, mode and who may connect.
    List {
        #[command(flatten)]
        format: Format,
    },
    /// Offer a device to NBD clients, e.g. `add vm1 --device vm1 --allow
    /// 10.0.0.0/8` (an `[nbd]` section listening on 127.0.0.1:10809 is
    /// created if there is none).
    Add {
        /// The name clients ask for (nbd://HOST/NAME).
        name: String,
        /// The configured device or volume served.
        #[arg(long)]
        device: String,
        /// Refuse writes through this export.
        #[arg(long)]
        read_only: bool,
        /// A client address, CIDR network or `unix`; repeatable. Without
        /// any, every client may connect.
        #[arg(long = "allow", value_name = "ADDR|CIDR|unix")]
        allow: Vec<String>,
        /// Shown to clients listing the exports.
        #[arg(long)]
        description: Option<String>,
    },
    /// Stop offering an export; its sessions end once their requests in
    /// flight are answered.
    Remove {
        name: String,
        /// Accept losing the data of a RAM device nothing else serves.
        #[arg(long)]
        force: bool,
    },
}

pub fn action(op: ExportOp) -> Action {
    match op {
        ExportOp::List { format } => list(
            format,
            |o| {
                Ok(o["nbd"]["exports"]
                    .as_array()
                    .cloned()
                    .map_or(Value::Array(Vec::new()), Value::Array))
            },
            line,
        ),
        ExportOp::Add {
            name,
            device,
            read_only,
            allow,
            description,
        } => plain(Edit::NbdExportAdd {
            name,
            device,
            read_only,
            allow,
            description,
        }),
        ExportOp::Remove { name, force } => Action::Edit(Edit::NbdExportRemove { name }, force),
    }
}

/// `vm1 -> disk1 (read-only) allow 10.0.0.0/8, unix`.
fn line(e: &Value, _: &Format) -> String {
    let ro = if e["read_only"].as_bool() == Some(true) {
        " (read-only)"
    } else {
        ""
    };
    let allow: Vec<String> = items(&e["allow"]).iter().map(s).collect();
    let allow = if allow.is_empty() {
        "every client".to_string()
    } else {
        allow.join(", ")
    };
    format!("{} -> {}{ro} allow {allow}", s(&e["name"]), s(&e["device"]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_export_line_says_device_mode_and_access() {
        let f = Format::default();
        let e = json!({"name": "vm1", "device": "d1", "read_only": true, "allow": ["10.0.0.0/8", "unix"]});
        assert_eq!(line(&e, &f), "vm1 -> d1 (read-only) allow 10.0.0.0/8, unix");
        let e = json!({"name": "all", "device": "d2", "read_only": false, "allow": []});
        assert_eq!(line(&e, &f), "all -> d2 allow every client");
    }

    #[test]
    fn add_makes_the_edit_the_daemon_applies() {
        let Action::Edit(edit, force) = action(ExportOp::Add {
            name: "vm1".into(),
            device: "d1".into(),
            read_only: false,
            allow: vec!["127.0.0.1".into()],
            description: None,
        }) else {
            panic!("not an edit")
        };
        assert!(!force);
        assert_eq!(
            serde_json::to_value(&edit).unwrap(),
            json!({"op": "nbd_export_add", "name": "vm1", "device": "d1", "read_only": false,
                   "allow": ["127.0.0.1"], "description": null})
        );
    }
}
