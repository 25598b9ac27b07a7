//! `openarray device ...`: the commands, `device fault` and `device rbd`, and
//! the device tree `device show` prints: the device graph as it runs.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::{json, Value};

use crate::output::Format;

/// `openarray device ...`: what each command asks.
#[derive(Subcommand)]
pub enum DeviceOp {
    List {
        #[command(flatten)]
        format: Format,
    },
    /// Print the device's configuration, then the devices under it with
    /// each one's state.
    Show {
        name: String,
        #[command(flatten)]
        format: Format,
    },
    /// Inject a fault into a `faulty` device, live.
    Fault {
        name: String,
        #[command(subcommand)]
        fault: crate::device_cli::FaultArg,
    },
    /// Snapshot, clone or grow the image of an `rbd` device, live.
    Rbd {
        name: String,
        #[command(subcommand)]
        op: crate::device_cli::RbdArg,
    },
    /// Add a device, e.g. `add vm1 --kind file --path /srv/vm1.img --size 10G`.
    Add {
        name: String,
        /// file, mem, null or volume.
        #[arg(long)]
        kind: String,
        /// For `file`: the file or block device.
        #[arg(long)]
        path: Option<PathBuf>,
        /// Bytes, or with a unit: 512M, 10G.
        #[arg(long)]
        size: Option<String>,
        /// Serve the device read-only to everyone.
        #[arg(long)]
        read_only: bool,
        /// Any other key of [[device]], e.g. `--set block_size=4096`.
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = crate::edit_cli::setting)]
        settings: Vec<(String, String)>,
    },
    /// Remove a device no LUN or NBD export serves any more.
    Remove { name: String },
    /// Change keys of [[device]]: `modify vm1 product_id=VM1 read_only=true`
    /// (`KEY=` removes the key). Identity, read-only and write cache
    /// change around the open device; a change that would replace its
    /// data (a RAM device's size or block size, the kind, the file or
    /// volume) is refused without --force.
    Modify {
        name: String,
        #[arg(value_name = "KEY=VALUE", value_parser = crate::edit_cli::setting, required = true)]
        settings: Vec<(String, String)>,
        /// Accept losing the data the change replaces (said in the answer).
        #[arg(long)]
        force: bool,
    },
}

/// A fault to inject into a `faulty` device.
#[derive(Subcommand, Clone, Debug)]
pub enum FaultArg {
    /// Fail I/O with an error (reads and writes unless one is named).
    Fail {
        /// Fail reads only.
        #[arg(long, conflicts_with = "writes")]
        reads: bool,
        /// Fail writes only.
        #[arg(long)]
        writes: bool,
    },
    /// Clear every failure and corruption.
    Heal,
    /// Make LEN bytes at OFFSET read back corrupted until rewritten
    /// (bytes, or with a unit: 4K, 1M).
    Corrupt { offset: String, len: String },
    /// Lose every write no flush has covered, as a power cut would.
    DropUnflushed,
}

/// An operation on the image of an `rbd` device.
#[derive(Subcommand, Clone, Debug)]
pub enum RbdArg {
    /// Take an RBD snapshot of the image.
    Snapshot { snapshot: String },
    /// Make a layered clone IMAGE (same Ceph pool) of SNAPSHOT.
    Clone { snapshot: String, image: String },
    /// Grow the image to SIZE (bytes, or with a unit: 10G).
    Resize { size: String },
}

/// The request body for `POST /v1/devices/{name}/rbd`.
pub fn rbd_body(op: &RbdArg) -> anyhow::Result<Value> {
    Ok(match op {
        RbdArg::Snapshot { snapshot } => json!({ "op": "snapshot", "snapshot": snapshot }),
        RbdArg::Clone { snapshot, image } => {
            json!({ "op": "clone", "snapshot": snapshot, "image": image })
        }
        RbdArg::Resize { size } => {
            let size = control::parse_size(size).map_err(|e| anyhow::anyhow!("`{size}`: {e}"))?;
            json!({ "op": "resize", "size": size })
        }
    })
}

/// The request body for `POST /v1/devices/{name}/fault`.
pub fn fault_body(fault: &FaultArg) -> anyhow::Result<Value> {
    let bytes =
        |text: &str| control::parse_size(text).map_err(|e| anyhow::anyhow!("`{text}`: {e}"));
    Ok(match fault {
        FaultArg::Fail { reads: true, .. } => json!({ "fault": "fail-reads" }),
        FaultArg::Fail { writes: true, .. } => json!({ "fault": "fail-writes" }),
        FaultArg::Fail { .. } => json!({ "fault": "fail" }),
        FaultArg::Heal => json!({ "fault": "heal" }),
        FaultArg::Corrupt { offset, len } => {
            json!({ "fault": "corrupt", "offset": bytes(offset)?, "len": bytes(len)? })
        }
        FaultArg::DropUnflushed => json!({ "fault": "drop-unflushed" }),
    })
}

/// The tree of `GET /v1/devices/{name}` as indented lines: each device
/// with its kind, size, settings and state.
pub fn tree_lines(node: &Value, format: &Format) -> Vec<String> {
    let mut out = Vec::new();
    walk(node, format, "", "", &mut out);
    out
}

fn walk(node: &Value, format: &Format, lead: &str, rest: &str, out: &mut Vec<String>) {
    let mut line = format!("{lead}{} ({}", s(&node["name"]), s(&node["kind"]));
    match node["size"].as_u64() {
        Some(size) => line.push_str(&format!(", {}", format.size(size))),
        None => line.push_str(", not open"),
    }
    line.push(')');
    let fields: Vec<String> = [&node["settings"], &node["state"]]
        .iter()
        .filter_map(|m| m.as_object())
        .flat_map(|m| m.iter().map(|(k, v)| format!("{k} {}", s(v))))
        .collect();
    if !fields.is_empty() {
        line.push_str(": ");
        line.push_str(&fields.join(", "));
    }
    out.push(line);
    let children = node["children"].as_array().cloned().unwrap_or_default();
    for (i, child) in children.iter().enumerate() {
        let last = i + 1 == children.len();
        let (here, below) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        walk(
            child,
            format,
            &format!("{rest}{here}"),
            &format!("{rest}{below}"),
            out,
        );
    }
}

fn s(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_prints_each_node_under_its_parent() {
        let leaf = json!({"name": "disk0", "kind": "file", "size": 1048576,
            "settings": {"path": "/d"}, "state": {}, "children": []});
        let mid = json!({"name": "slow0", "kind": "delay", "size": 1048576,
            "settings": {"latency": "8ms"}, "state": {}, "children": [leaf]});
        let top = json!({"name": "flaky0", "kind": "faulty", "size": null,
            "settings": {}, "state": {}, "children": [mid]});
        let lines = tree_lines(&top, &Format::default());
        assert_eq!(
            lines,
            [
                "flaky0 (faulty, not open)",
                "└─ slow0 (delay, 1M): latency 8ms",
                "   └─ disk0 (file, 1M): path /d",
            ]
        );
    }

    #[test]
    fn faults_become_request_bodies() {
        let body = fault_body(&FaultArg::Corrupt {
            offset: "4K".into(),
            len: "512".into(),
        })
        .unwrap();
        assert_eq!(
            body,
            json!({"fault": "corrupt", "offset": 4096, "len": 512})
        );
        let reads = FaultArg::Fail {
            reads: true,
            writes: false,
        };
        assert_eq!(fault_body(&reads).unwrap()["fault"], "fail-reads");
        assert!(fault_body(&FaultArg::Corrupt {
            offset: "x".into(),
            len: "1".into()
        })
        .is_err());
    }
}
