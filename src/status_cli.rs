//! `openarray status`: a running daemon on one screen (`GET /v1/status`),
//! exit status 0 when healthy, 1 when something is degraded, 2 when some
//! data cannot be served (a failed array, a cache with writes stranded)
//! or the daemon could not be asked.

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use crate::api_client::{call, ApiArgs};

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The API's JSON instead of the summary.
    #[arg(long)]
    json: bool,
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// Bytes with a binary unit, one decimal.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}B")
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

/// The status page as text.
fn summary(s: &Value) -> String {
    [
        health(s),
        portals_and_targets(s),
        sessions(s),
        nbd_exports(s),
        transports(s),
        pools(s),
        schedules(s),
    ]
    .concat()
}

/// The verdict and each problem.
fn health(s: &Value) -> String {
    let mut out = String::new();
    let degraded = list(&s["degraded"]);
    out.push_str(&format!(
        "state: {}\n",
        if degraded.is_empty() {
            "healthy".to_string()
        } else {
            let word = if s["failed"] == true {
                "FAILED"
            } else {
                "DEGRADED"
            };
            format!("{word} ({} problem(s))", degraded.len())
        }
    ));
    for d in degraded {
        let failed = if d["severity"] == "failed" {
            "FAILED "
        } else {
            ""
        };
        out.push_str(&format!(
            "  {failed}{} {}: {}\n",
            text(&d["kind"]),
            text(&d["name"]),
            text(&d["problem"])
        ));
    }
    out
}

/// Portals and the targets' LUNs.
fn portals_and_targets(s: &Value) -> String {
    let mut out = String::new();
    out.push_str("portals:\n");
    for p in list(&s["portals"]) {
        out.push_str(&format!(
            "  {:<24} {:<14} {} session(s)\n",
            text(&p["address"]),
            if p["listening"] == true {
                "listening"
            } else {
                "NOT LISTENING"
            },
            text(&p["sessions"])
        ));
    }
    out.push_str("targets:\n");
    for t in list(&s["targets"]) {
        out.push_str(&format!(
            "  {} ({} session(s))\n",
            text(&t["name"]),
            text(&t["sessions"])
        ));
        for l in list(&t["luns"]) {
            let group = l["group"]
                .as_str()
                .map(|g| format!("group {g} "))
                .unwrap_or_default();
            let mut line = format!(
                "    {group}LUN {} -> {}{}{}",
                text(&l["lun"]),
                text(&l["device"]),
                l["pool"]
                    .as_str()
                    .map(|p| format!(" (pool {p})"))
                    .unwrap_or_default(),
                if l["read_only"] == true {
                    " read-only"
                } else {
                    ""
                }
            );
            if let Some(p) = l["problem"].as_str() {
                line.push_str(&format!("  DEGRADED: {p}"));
            }
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// The sessions, one line each.
fn sessions(s: &Value) -> String {
    let mut out = String::new();
    out.push_str("sessions:\n");
    for x in list(&s["sessions"]) {
        out.push_str(&format!(
            "  {:>4} {} -> {} from {}\n",
            text(&x["id"]),
            text(&x["initiator"]),
            x["target"].as_str().unwrap_or("(discovery)"),
            text(&x["peer"])
        ));
    }
    out
}

/// NBD exports, when there are.
fn nbd_exports(s: &Value) -> String {
    let mut out = String::new();
    let exports = list(&s["nbd_exports"]);
    if !exports.is_empty() {
        out.push_str("nbd exports:\n");
    }
    for e in exports {
        let ro = if e["read_only"] == true {
            " read-only"
        } else {
            ""
        };
        let mut line = format!(
            "  {} -> {}{ro} ({} session(s))",
            text(&e["name"]),
            text(&e["device"]),
            text(&e["sessions"])
        );
        if let Some(p) = e["problem"].as_str() {
            line.push_str(&format!("  DEGRADED: {p}"));
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// NVMe/TCP's subsystems, and what other transports tell of themselves.
fn transports(s: &Value) -> String {
    let mut out = String::new();
    let nvmf = &s["transports"]["nvme-tcp"];
    if !list(&nvmf["subsystems"]).is_empty() {
        let listen: Vec<String> = list(&nvmf["listen"]).iter().map(text).collect();
        out.push_str(&format!(
            "nvme-tcp subsystems (on {}):\n",
            listen.join(", ")
        ));
    }
    for sub in list(&nvmf["subsystems"]) {
        let namespaces: Vec<String> = list(&sub["namespaces"])
            .iter()
            .map(|n| {
                let failed = if n["state"] == "ok" { "" } else { " FAILED" };
                format!("{}={}{failed}", text(&n["nsid"]), text(&n["device"]))
            })
            .collect();
        out.push_str(&format!(
            "  {} namespaces {} ({} controller(s))\n",
            text(&sub["nqn"]),
            namespaces.join(" "),
            text(&sub["controllers"])
        ));
    }
    // Transports the CLI has no layout for: their summary as they give it.
    if let Some(all) = s["transports"].as_object() {
        for (name, summary) in all.iter().filter(|(name, _)| *name != "nvme-tcp") {
            out.push_str(&format!("{name}: {summary}\n"));
        }
    }
    out
}

/// Pools and their space.
fn pools(s: &Value) -> String {
    let mut out = String::new();
    out.push_str("pools:\n");
    for p in list(&s["pools"]) {
        let use_ = match (p["size"].as_u64(), p["used"].as_u64()) {
            (Some(size), Some(used)) => format!(
                "{} of {} used ({}%), {} volume(s)",
                human(used),
                human(size),
                text(&p["used_percent"]),
                text(&p["volumes"])
            ),
            _ => String::new(),
        };
        out.push_str(&format!(
            "  {:<16} {:<12} {use_}\n",
            text(&p["name"]),
            text(&p["state"])
        ));
    }
    out
}

/// Snapshot schedules, when there are.
fn schedules(s: &Value) -> String {
    let mut out = String::new();
    let schedules = list(&s["schedules"]);
    if !schedules.is_empty() {
        out.push_str("schedules:\n");
    }
    for x in schedules {
        let waiting = list(&x["waiting"]);
        out.push_str(&format!(
            "  {}/{:<12} every {}s, keep {}, newest {}{}\n",
            text(&x["pool"]),
            text(&x["volume"]),
            text(&x["every_seconds"]),
            text(&x["keep"]),
            x["newest_snapshot"].as_str().unwrap_or("(none yet)"),
            if waiting.is_empty() {
                String::new()
            } else {
                format!(", waiting to refresh {}", waiting.len())
            }
        ));
    }
    out
}

pub fn run(args: StatusArgs) -> ExitCode {
    let answer = args
        .api
        .endpoint()
        .and_then(|e| call(&e, "GET", "/v1/status", b"", None));
    let (status, s) = match answer {
        Ok(a) => a,
        Err(e) => {
            eprintln!("openarray: {e:#}");
            return ExitCode::from(2);
        }
    };
    if status != 200 {
        eprintln!("{}", s["error"].as_str().unwrap_or("unknown error"));
        return ExitCode::from(2);
    }
    if args.json {
        match serde_json::to_string_pretty(&s) {
            Ok(t) => println!("{t}"),
            Err(e) => {
                eprintln!("openarray: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        print!("{}", summary(&s));
    }
    exit_code(&s)
}

/// As mdadm's `--detail --test`: 0 healthy, 1 degraded, 2 failed (some
/// data cannot be served).
fn exit_code(s: &Value) -> ExitCode {
    if s["failed"] == true {
        ExitCode::from(2)
    } else if s["healthy"] == true {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512B");
        assert_eq!(human(4 << 20), "4.0M");
        assert_eq!(human(3 << 29), "1.5G");
    }

    #[test]
    fn the_summary_leads_with_what_is_degraded() {
        let s = json!({
            "healthy": false,
            "degraded": [{"kind": "pool", "name": "tank", "problem": "95.0% used"}],
            "portals": [{"address": "127.0.0.1:3260", "listening": true, "sessions": 1}],
            "targets": [{"name": "iqn.t", "sessions": 1, "luns": [
                {"lun": 0, "group": null, "device": "v", "pool": "tank", "read_only": false, "problem": null},
                {"lun": 1, "group": "esx", "device": "f", "pool": null, "read_only": true,
                 "problem": "gone"}]}],
            "sessions": [{"id": 2, "initiator": "iqn.i", "target": "iqn.t", "peer": "127.0.0.1:5"}],
            "pools": [{"name": "tank", "state": "degraded", "size": 8388608, "used": 7969177,
                       "used_percent": 95.0, "volumes": 1}],
        });
        let t = summary(&s);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "state: DEGRADED (1 problem(s))");
        assert_eq!(lines[1], "  pool tank: 95.0% used");
        assert!(t.contains("LUN 0 -> v (pool tank)"), "{t}");
        assert!(
            t.contains("group esx LUN 1 -> f read-only  DEGRADED: gone"),
            "{t}"
        );
        assert!(t.contains("7.6M of 8.0M used (95.0%), 1 volume(s)"), "{t}");
        assert!(t.contains("2 iqn.i -> iqn.t from 127.0.0.1:5"), "{t}");
    }
}
