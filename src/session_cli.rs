//! `openarray session list|show|kill`: the live sessions of a running
//! daemon (`/v1/sessions`): iSCSI sessions, and NBD connections beside
//! them.

use std::process::ExitCode;

use clap::Subcommand;
use serde_json::Value;

use crate::api_client::{call, ApiArgs, Endpoint};

#[derive(Subcommand)]
pub enum SessionCommand {
    /// Every session: transport, initiator, target or NBD export,
    /// addresses, login time.
    List {
        /// The API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One session: negotiated parameters, LUNs and reservations.
    Show {
        /// The session's id (the `ID` column of `session list`).
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Ask an iSCSI session to log out (the daemon closes it if it has not
    /// after its logout timeout), or close an NBD one (`nbd-N`).
    Kill {
        /// The session's id (the `ID` column of `session list`).
        id: String,
    },
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// iSCSI sessions have a layout of their own (and name their transport
/// only since other transports joined).
fn is_iscsi(s: &Value) -> bool {
    s["transport"].as_str().is_none_or(|t| t == "iscsi")
}

/// `session list` as a table.
fn table(sessions: &[Value]) -> String {
    let mut out = format!(
        "{:>6} {:<9} {:>5} {:<40} {:<40} {:<21} {:<21} {:<20} {}\n",
        "ID",
        "TRANSPORT",
        "TSIH",
        "INITIATOR",
        "TARGET / EXPORT",
        "PEER",
        "PORTAL",
        "LOGIN (UTC)",
        "LUNS USED"
    );
    for s in sessions {
        if !is_iscsi(s) {
            // What every transport names: who, what, from where, since.
            let first = |keys: &[&str]| {
                keys.iter()
                    .map(|k| &s[*k])
                    .find(|v| !v.is_null())
                    .map_or_else(|| "-".to_string(), text)
            };
            let line = format!(
                "{:>6} {:<9} {:>5} {:<40} {:<40} {:<21} {:<21} {:<20} -",
                text(&s["id"]),
                text(&s["transport"]),
                "-",
                first(&["initiator", "host_nqn"]),
                first(&["target", "export", "subsystem"]),
                text(&s["peer"]),
                "-",
                text(&s["login_time"]),
            );
            out.push_str(&line);
            out.push('\n');
            continue;
        }
        let mut initiator = text(&s["initiator"]);
        if let Some(alias) = s["initiator_alias"].as_str() {
            initiator = format!("{initiator} ({alias})");
        }
        let target = match s["target"].as_str() {
            Some(t) => t.to_string(),
            None => "(discovery)".into(),
        };
        let used: Vec<String> = s["luns_used"]
            .as_array()
            .map(|a| a.iter().map(text).collect())
            .unwrap_or_default();
        let mut line = format!(
            "{:>6} {:<9} {:>5} {:<40} {:<40} {:<21} {:<21} {:<20} {}",
            text(&s["id"]),
            "iscsi",
            text(&s["tsih"]),
            initiator,
            target,
            text(&s["peer"]),
            text(&s["portal"]),
            text(&s["login_time"]),
            if used.is_empty() {
                "-".into()
            } else {
                used.join(",")
            }
        );
        if s["logout_requested"] == true {
            line.push_str("  (logging out)");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `session show` as `key: value` lines.
fn details(s: &Value) -> String {
    let mut out = String::new();
    let mut put = |k: &str, v: String| out.push_str(&format!("{k:<26}{v}\n"));
    if s["transport"] == "nbd" {
        for key in [
            "id",
            "transport",
            "export",
            "peer",
            "tls",
            "structured_replies",
            "extended_headers",
            "login_time",
            "connected_seconds",
        ] {
            put(&format!("{key}:"), text(&s[key]));
        }
        return out;
    }
    if !is_iscsi(s) {
        // A transport the CLI has no layout for: every field it gives.
        if let Some(fields) = s.as_object() {
            for (key, value) in fields {
                put(&format!("{key}:"), text(value));
            }
        }
        return out;
    }
    for key in [
        "id",
        "tsih",
        "isid",
        "initiator",
        "initiator_alias",
        "target",
        "type",
        "portal",
        "peer",
        "login_time",
        "connected_seconds",
        "header_digest",
        "data_digest",
    ] {
        put(&format!("{key}:"), text(&s[key]));
    }
    let mrdsl = &s["max_recv_data_segment_length"];
    put(
        "max_recv_data_segment:",
        format!(
            "initiator {} target {}",
            text(&mrdsl["initiator"]),
            text(&mrdsl["target"])
        ),
    );
    for key in [
        "max_burst_length",
        "first_burst_length",
        "immediate_data",
        "initial_r2t",
        "max_outstanding_r2t",
        "error_recovery_level",
        "logout_requested",
    ] {
        put(&format!("{key}:"), text(&s[key]));
    }
    put(
        "connections:",
        text(&Value::from(
            s["connections"].as_array().map_or(0, Vec::len),
        )),
    );
    let used: Vec<String> = s["luns_used"]
        .as_array()
        .map(|a| a.iter().map(text).collect())
        .unwrap_or_default();
    put(
        "luns_used:",
        if used.is_empty() {
            "-".into()
        } else {
            used.join(", ")
        },
    );
    out.push_str("luns:\n");
    for l in s["luns"].as_array().into_iter().flatten() {
        let mut line = format!("  LUN {}", text(&l["lun"]));
        if l["read_only"] == true {
            line.push_str(" read-only");
        }
        if let Some(k) = l["registered_key"].as_str() {
            line.push_str(&format!(" registered key {k}"));
        }
        if let Some(r) = l["reservation"].as_str() {
            line.push_str(&format!(" holds {r} reservation"));
        }
        if l["reserved"] == true {
            line.push_str(" holds RESERVE(6/10)");
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn run_inner(api: &Endpoint, cmd: SessionCommand) -> anyhow::Result<ExitCode> {
    let (status, answer) = match &cmd {
        SessionCommand::List { .. } => call(api, "GET", "/v1/sessions", b"", None)?,
        SessionCommand::Show { id, .. } => {
            call(api, "GET", &format!("/v1/sessions/{id}"), b"", None)?
        }
        SessionCommand::Kill { id } => {
            call(api, "POST", &format!("/v1/sessions/{id}/logout"), b"", None)?
        }
    };
    if status != 200 {
        eprintln!("{}", answer["error"].as_str().unwrap_or("unknown error"));
        return Ok(ExitCode::FAILURE);
    }
    match cmd {
        SessionCommand::List { json: true } | SessionCommand::Show { json: true, .. } => {
            println!("{}", serde_json::to_string_pretty(&answer)?);
        }
        SessionCommand::List { json: false } => {
            let empty = Vec::new();
            print!("{}", table(answer["sessions"].as_array().unwrap_or(&empty)));
        }
        SessionCommand::Show { json: false, .. } => print!("{}", details(&answer)),
        SessionCommand::Kill { id } if answer["closed"] == true => {
            println!("session {id} closed")
        }
        SessionCommand::Kill { id } => println!(
            "session {id} asked to log out; closed after {}s if it does not",
            text(&answer["logout_timeout_seconds"])
        ),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(api: &ApiArgs, cmd: SessionCommand) -> ExitCode {
    api.run(|e| run_inner(e, cmd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_table_names_alias_discovery_and_luns() {
        let sessions = [
            json!({"id": 3, "tsih": 2, "initiator": "iqn.a", "initiator_alias": "host a",
                   "target": "iqn.t", "peer": "127.0.0.1:4000", "portal": "127.0.0.1:3260",
                   "login_time": "2026-11-25T17:00:00Z", "luns_used": [0, 5],
                   "logout_requested": true}),
            json!({"id": 4, "tsih": 3, "initiator": "iqn.b", "initiator_alias": null,
                   "target": null, "peer": "127.0.0.1:4001", "portal": "127.0.0.1:3260",
                   "login_time": "2026-11-25T17:00:01Z", "luns_used": []}),
        ];
        let nbd = json!({"id": "nbd-0", "transport": "nbd", "export": "vm1",
                         "peer": "127.0.0.1", "login_time": "2026-11-25T17:00:02Z"});
        let nvme = json!({"id": "nvmf-1", "transport": "nvme-tcp", "host_nqn": "nqn.h",
                          "subsystem": "nqn.s", "peer": "127.0.0.1:5000",
                          "login_time": "2026-11-25T17:00:03Z"});
        let t = table(&[sessions[0].clone(), sessions[1].clone(), nbd, nvme.clone()]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5);
        assert!(
            lines[4].contains(" nvme-tcp ")
                && lines[4].contains("nqn.h")
                && lines[4].contains("nqn.s"),
            "{}",
            lines[4]
        );
        assert!(details(&nvme).contains("host_nqn:"));
        assert!(lines[1].contains(" iscsi "));
        assert!(
            lines[3].contains("nbd-0") && lines[3].contains(" nbd ") && lines[3].contains("vm1")
        );
        assert!(lines[1].contains("iqn.a (host a)") && lines[1].contains("0,5"));
        assert!(lines[1].ends_with("(logging out)"));
        assert!(lines[2].contains("(discovery)") && lines[2].ends_with('-'));
    }

    #[test]
    fn details_show_reservations() {
        let s = json!({"id": 3, "max_recv_data_segment_length": {"initiator": 65536, "target": 262144},
                       "luns_used": [0], "luns": [
                           {"lun": 0, "read_only": false, "registered_key": "0x00000000000000aa",
                            "reservation": "write exclusive", "reserved": false},
                           {"lun": 1, "read_only": true, "registered_key": null,
                            "reservation": null, "reserved": true}]});
        let d = details(&s);
        assert!(d.contains("initiator 65536 target 262144"), "{d}");
        assert!(
            d.contains("LUN 0 registered key 0x00000000000000aa holds write exclusive reservation")
        );
        assert!(d.contains("LUN 1 read-only holds RESERVE(6/10)"));
    }
}
