//! The live sessions of every transport (`"transport": "iscsi"`, `"nbd"`;
//! NBD ids are `nbd-N`), as each transport lists them through
//! `export::Frontend`.
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /v1/sessions` | `{"sessions": [session]}`, iSCSI ones first |
//! | `GET /v1/sessions/{id}` | the session (`nbd-N` for an NBD one) |
//! | `POST /v1/sessions/{id}/logout` | iSCSI asks the session to log out (Async Message), closing it if it has not after the logout timeout: `{"id", "logout_requested": true, "logout_timeout_seconds"}`; NBD closes the connection: `{"id", "closed": true}` |
//!
//! Unknown ids answer 404.

use serde_json::{json, Value};

use super::{error, Admin};

/// Every transport's sessions, in the order the transports are listed.
pub(crate) fn all(admin: &Admin) -> Vec<Value> {
    admin.frontends.iter().flat_map(|f| f.sessions()).collect()
}

/// A session's id as its path segment reads (a number or `nbd-N`).
fn id_text(session: &Value) -> String {
    match &session["id"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Answers `/v1/sessions...`; `None` for any other path.
pub(crate) fn route(admin: &Admin, method: &str, path: &str) -> Option<(u16, Value)> {
    let rest = path.strip_prefix("/v1/sessions")?;
    if !rest.is_empty() && !rest.starts_with('/') {
        return None;
    }
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    Some(match (method, parts.as_slice()) {
        ("GET", []) => (200, json!({ "sessions": all(admin) })),
        ("GET", [n]) => match all(admin).into_iter().find(|s| id_text(s) == *n) {
            Some(s) => (200, s),
            None => error(404, format!("no session {n}")),
        },
        ("POST", [n, "logout"]) => match admin.frontends.iter().find_map(|f| f.end_session(n)) {
            Some(answer) => (200, answer),
            None => error(404, format!("no session {n}")),
        },
        (_, [] | [_] | [_, "logout"]) => error(405, "method not allowed"),
        _ => error(404, format!("no such resource {path}")),
    })
}
