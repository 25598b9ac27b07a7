//! Pool and volume operations on a running daemon: the `/v1/pools` and
//! `/v1/volumes` resources of the administration API.

use serde_json::Value;

use crate::admin::Admin;

/// Answers requests under `/v1/pools` and `/v1/volumes`; `None` for any
/// other path, so the caller can answer 404.
pub fn route(_admin: &Admin, _method: &str, path: &str, _body: &[u8]) -> Option<(u16, Value)> {
    if !(path.starts_with("/v1/pools") || path.starts_with("/v1/volumes")) {
        return None;
    }
    Some((
        501,
        serde_json::json!({ "error": "pool operations on a running daemon are not available yet" }),
    ))
}
