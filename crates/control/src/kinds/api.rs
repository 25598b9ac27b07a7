//! A kind's own routes in the daemon's API, under `/v1/{prefix}/{name}`:
//! the daemon finds them in the registry ([`api_for`]) and hands them
//! what they may use of it ([`Daemon`]). Errors are one type whose kind
//! maps to an HTTP status here, and nowhere else.

use std::fmt;
use std::sync::Arc;

use block::BlockDevice;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Spec, KINDS};
use crate::Edit;

/// What went wrong with a request, as its answer's status says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiErrorKind {
    /// The request is malformed: 400.
    BadRequest,
    /// What it names does not exist: 404.
    NotFound,
    /// The resource takes no such method: 405.
    MethodNotAllowed,
    /// The state of things refuses it: 409.
    Conflict,
    /// It was taken and failed on the way: 500.
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub kind: ApiErrorKind,
    pub message: String,
}

impl ApiError {
    pub fn new(kind: ApiErrorKind, message: impl fmt::Display) -> ApiError {
        ApiError {
            kind,
            message: message.to_string(),
        }
    }

    pub fn bad_request(message: impl fmt::Display) -> ApiError {
        ApiError::new(ApiErrorKind::BadRequest, message)
    }

    pub fn not_found(message: impl fmt::Display) -> ApiError {
        ApiError::new(ApiErrorKind::NotFound, message)
    }

    pub fn conflict(message: impl fmt::Display) -> ApiError {
        ApiError::new(ApiErrorKind::Conflict, message)
    }

    pub fn failed(message: impl fmt::Display) -> ApiError {
        ApiError::new(ApiErrorKind::Failed, message)
    }

    /// The HTTP status of the answer.
    pub fn status(&self) -> u16 {
        match self.kind {
            ApiErrorKind::BadRequest => 400,
            ApiErrorKind::NotFound => 404,
            ApiErrorKind::MethodNotAllowed => 405,
            ApiErrorKind::Conflict => 409,
            ApiErrorKind::Failed => 500,
        }
    }

    /// The error an answer of `status` stands for.
    pub fn from_status(status: u16, message: impl fmt::Display) -> ApiError {
        let kind = match status {
            400 => ApiErrorKind::BadRequest,
            404 => ApiErrorKind::NotFound,
            405 => ApiErrorKind::MethodNotAllowed,
            409 => ApiErrorKind::Conflict,
            _ => ApiErrorKind::Failed,
        };
        ApiError::new(kind, message)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

pub type ApiResult = Result<Value, ApiError>;

/// A request to a kind's routes: `{method} /v1/{prefix}/{name}[/{action}]`.
pub struct ApiRequest<'a> {
    pub method: &'a str,
    pub name: &'a str,
    pub action: Option<&'a str>,
    pub body: &'a [u8],
}

impl ApiRequest<'_> {
    /// The body as `T`; an empty body is `T`'s default.
    pub fn json<T: DeserializeOwned + Default>(&self) -> Result<T, ApiError> {
        if self.body.is_empty() {
            return Ok(T::default());
        }
        serde_json::from_slice(self.body)
            .map_err(|e| ApiError::bad_request(format!("the body is not a valid request: {e}")))
    }

    /// The answer to an action this resource does not have.
    pub fn unknown(&self, actions: &[&str]) -> ApiError {
        match self.action {
            Some(a) if !actions.contains(&a) => {
                ApiError::not_found(format!("no such resource {}/{a}", self.name))
            }
            _ => ApiError::new(ApiErrorKind::MethodNotAllowed, "method not allowed"),
        }
    }
}

/// What a kind's routes may use of the daemon.
pub trait Daemon {
    /// The running configuration's settings of device `name`.
    fn settings(&self, name: &str) -> Option<Spec>;

    /// Device `name` as the running configuration has it open.
    fn open_device(&self, name: &str) -> Option<Arc<dyn BlockDevice>>;

    /// A configured device nothing has open, opened afresh.
    fn open_unused(&self, name: &str) -> Result<Arc<dyn BlockDevice>, ApiError>;

    /// `edit` made to the running configuration through the daemon's one
    /// transaction (validated, built, saved, then live), as `POST /v1/edit`.
    fn edit(&self, edit: &Edit) -> ApiResult;
}

/// A kind's routes.
pub struct KindApi {
    /// The path segment after `/v1/`.
    pub prefix: &'static str,
    pub route: fn(&dyn Daemon, &ApiRequest<'_>) -> ApiResult,
}

/// The kind routes that `path` belongs to, with the device name and the
/// action that follow the prefix.
pub fn api_for(path: &str) -> Option<(&'static KindApi, &str, Option<&str>)> {
    let rest = path.strip_prefix("/v1/")?;
    KINDS.iter().filter_map(|k| k.api).find_map(|api| {
        let rest = rest.strip_prefix(api.prefix)?.strip_prefix('/')?;
        Some(match rest.split_once('/') {
            Some((name, action)) => (api, name, Some(action)),
            None => (api, rest, None),
        })
    })
}

/// Device `name` as it is open now, with its settings as kind `T`;
/// `noun` names the kind in the errors ("cache", "mirror").
pub fn open_of_kind<T: Clone + 'static>(
    daemon: &dyn Daemon,
    name: &str,
    noun: &str,
) -> Result<(std::sync::Arc<dyn block::BlockDevice>, T), ApiError> {
    let spec = daemon
        .settings(name)
        .ok_or_else(|| ApiError::not_found(format!("no device `{name}`")))?;
    let settings = spec.as_kind::<T>().cloned().ok_or_else(|| {
        ApiError::conflict(format!(
            "device `{name}` is a `{}` device, not a {noun}",
            spec.kind()
        ))
    })?;
    let device = daemon.open_device(name).ok_or_else(|| {
        ApiError::conflict(format!(
            "{noun} `{name}` is not open (no LUN or pool uses it)"
        ))
    })?;
    Ok((device, settings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_routes_are_found_by_prefix() {
        let (api, name, action) = api_for("/v1/raid/r5/fail").unwrap();
        assert_eq!((api.prefix, name, action), ("raid", "r5", Some("fail")));
        let (api, name, action) = api_for("/v1/caches/hot").unwrap();
        assert_eq!((api.prefix, name, action), ("caches", "hot", None));
        assert!(api_for("/v1/raidx/r5").is_none());
        assert!(api_for("/v1/devices/r5").is_none());
    }

    #[test]
    fn error_kinds_map_to_statuses_and_back() {
        for status in [400, 404, 405, 409, 500] {
            assert_eq!(ApiError::from_status(status, "x").status(), status);
        }
    }
}
