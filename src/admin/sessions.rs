//! The live sessions of the administration API: iSCSI sessions, and NBD
//! connections in transmission beside them (`"transport": "nbd"`, ids
//! `nbd-N`).
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /v1/sessions` | `{"sessions": [session]}`, iSCSI ones first |
//! | `GET /v1/sessions/{id}` | the session (`nbd-N` for an NBD one) |
//! | `POST /v1/sessions/{id}/logout` | asks the session to log out (Async Message), closing it if it has not after the logout timeout; `{"id", "logout_requested": true, "logout_timeout_seconds"}` |
//!
//! Unknown ids answer 404. An NBD session ends when its export is removed
//! or changed, not by logout.

use std::time::{SystemTime, UNIX_EPOCH};

use iscsi::{Digest, SessionInfo};
use serde_json::{json, Value};

use super::{error, Admin};

/// Answers `/v1/sessions...`; `None` for any other path.
pub(crate) fn route(admin: &Admin, method: &str, path: &str) -> Option<(u16, Value)> {
    let rest = path.strip_prefix("/v1/sessions")?;
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    if !rest.is_empty() && !rest.starts_with('/') {
        return None;
    }
    let id = |text: &str| text.parse::<u64>().ok();
    Some(match (method, parts.as_slice()) {
        ("GET", []) => {
            let now = SystemTime::now();
            let iscsi = admin.server.sessions();
            let nbd = admin.nbd.sessions();
            let list: Vec<Value> = iscsi
                .iter()
                .map(|s| session_json(s, now))
                .chain(nbd.iter().map(|s| nbd_session_json(s, now)))
                .collect();
            (200, json!({ "sessions": list }))
        }
        ("GET", [n]) if n.starts_with(NBD_PREFIX) => {
            let wanted = n[NBD_PREFIX.len()..].parse::<u64>().ok();
            match admin.nbd.sessions().iter().find(|s| Some(s.id) == wanted) {
                Some(s) => (200, nbd_session_json(s, SystemTime::now())),
                None => error(404, format!("no session {n}")),
            }
        }
        ("GET", [n]) => match id(n).and_then(|n| admin.server.session(n)) {
            Some(s) => (200, session_json(&s, SystemTime::now())),
            None => error(404, format!("no session {n}")),
        },
        ("POST", [n, "logout"]) if n.starts_with(NBD_PREFIX) => {
            let wanted = n[NBD_PREFIX.len()..].parse::<u64>().ok();
            match wanted.filter(|id| admin.nbd.end_session(*id)) {
                // NBD has no logout to ask for: the connection is closed.
                Some(_) => (200, json!({ "id": n, "closed": true })),
                None => error(404, format!("no session {n}")),
            }
        }
        ("POST", [n, "logout"]) => match id(n) {
            Some(n) if admin.server.request_logout(n) => (
                200,
                json!({
                    "id": n,
                    "logout_requested": true,
                    "logout_timeout_seconds": admin.server.logout_timeout().as_secs_f64(),
                }),
            ),
            _ => error(404, format!("no session {n}")),
        },
        (_, [] | [_] | [_, "logout"]) => error(405, "method not allowed"),
        _ => error(404, format!("no such resource {path}")),
    })
}

/// What an NBD session's id starts with, apart from iSCSI ones.
const NBD_PREFIX: &str = "nbd-";

/// One NBD connection in transmission as the API shows it.
pub(crate) fn nbd_session_json(s: &nbd::Session, now: SystemTime) -> Value {
    let since = s.since.duration_since(UNIX_EPOCH).unwrap_or_default();
    json!({
        "id": format!("{NBD_PREFIX}{}", s.id),
        "transport": "nbd",
        "peer": s.peer,
        "export": s.export,
        "tls": s.tls,
        "structured_replies": s.structured_replies,
        "extended_headers": s.extended_headers,
        "login_time": utc(since.as_secs()),
        "login_time_unix": since.as_secs(),
        "connected_seconds": now.duration_since(s.since).unwrap_or_default().as_secs(),
    })
}

fn digest(d: Digest) -> &'static str {
    match d {
        Digest::None => "None",
        Digest::Crc32c => "CRC32C",
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A persistent reservation type's name (SPC-4 table 188).
fn reservation_name(code: u8) -> String {
    match code {
        1 => "write exclusive".into(),
        3 => "exclusive access".into(),
        5 => "write exclusive, registrants only".into(),
        6 => "exclusive access, registrants only".into(),
        7 => "write exclusive, all registrants".into(),
        8 => "exclusive access, all registrants".into(),
        other => format!("type {other}"),
    }
}

/// One session as the API shows it.
pub(crate) fn session_json(s: &SessionInfo, now: SystemTime) -> Value {
    let p = &s.params;
    let since = s.login_time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let connected = now.duration_since(s.login_time).unwrap_or_default();
    let first = s.connections.first();
    json!({
        "id": s.id,
        "transport": "iscsi",
        "tsih": s.tsih,
        "isid": hex(&s.isid),
        "initiator": s.initiator,
        "initiator_alias": s.initiator_alias,
        "target": s.target,
        "type": if s.target.is_some() { "normal" } else { "discovery" },
        "portal": first.map(|c| c.portal.to_string()),
        "peer": first.map(|c| c.peer.to_string()),
        "connections": s.connections.iter().map(|c| json!({
            "cid": c.cid,
            "portal": c.portal.to_string(),
            "peer": c.peer.to_string(),
        })).collect::<Vec<_>>(),
        "login_time": utc(since.as_secs()),
        "login_time_unix": since.as_secs(),
        "connected_seconds": connected.as_secs(),
        "header_digest": digest(p.header_digest),
        "data_digest": digest(p.data_digest),
        "max_recv_data_segment_length": {
            "initiator": p.initiator_mrdsl,
            "target": p.target_mrdsl,
        },
        "max_burst_length": p.max_burst_length,
        "first_burst_length": p.first_burst_length,
        "immediate_data": p.immediate_data,
        "initial_r2t": p.initial_r2t,
        "max_outstanding_r2t": p.max_outstanding_r2t,
        "error_recovery_level": p.error_recovery_level,
        "luns_used": s.luns_used,
        "luns": s.luns.iter().map(|l| json!({
            "lun": l.lun,
            "read_only": l.read_only,
            "registered_key": l.registered_key.map(|k| format!("{k:#018x}")),
            "reservation": l.reservation_type.map(reservation_name),
            "reserved": l.reserved,
        })).collect::<Vec<_>>(),
        "logout_requested": s.logout_requested,
    })
}

/// Seconds since 1970 as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_795_624_385), "2026-11-25T16:33:05Z");
        assert_eq!(utc(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    #[test]
    fn reservation_names() {
        assert_eq!(reservation_name(1), "write exclusive");
        assert_eq!(reservation_name(8), "exclusive access, all registrants");
        assert_eq!(reservation_name(2), "type 2");
    }
}
