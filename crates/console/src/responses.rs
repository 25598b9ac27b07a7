//! Answers with the headers every console answer carries.

use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, LOCATION};
use hyper::{Response, StatusCode};
use serde_json::{json as json_value, Value};

use crate::{body, Body};

/// Only the daemon's own scripts, styles and API: nothing inline, nothing
/// from elsewhere, never framed.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                      connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// `bytes` as `content_type` with `status`.
pub fn full(
    status: u16,
    content_type: &'static str,
    bytes: impl Into<hyper::body::Bytes>,
) -> Response<Body> {
    let mut answer = Response::new(body(bytes));
    *answer.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = answer.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("content-security-policy", HeaderValue::from_static(POLICY));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    answer
}

pub fn json(status: u16, value: &Value) -> Response<Body> {
    full(status, "application/json", value.to_string())
}

pub fn json_error(status: u16, message: &str) -> Response<Body> {
    json(status, &json_value!({ "error": message }))
}

/// 303 to `location` (after a form, the browser follows with a GET).
pub fn redirect(location: &'static str) -> Response<Body> {
    let mut answer = full(303, "text/plain; charset=utf-8", location);
    answer
        .headers_mut()
        .insert(LOCATION, HeaderValue::from_static(location));
    answer
}
