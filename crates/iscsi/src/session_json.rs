//! An iSCSI session as the admin API lists it.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::{Digest, SessionInfo};

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
pub fn session_json(s: &SessionInfo, now: SystemTime) -> Value {
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
        "login_time": export::utc(since.as_secs()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_names() {
        assert_eq!(reservation_name(1), "write exclusive");
        assert_eq!(reservation_name(8), "exclusive access, all registrants");
        assert_eq!(reservation_name(2), "type 2");
    }
}
