//! The routes device kinds bring (`/v1/raid/...`, `/v1/caches/...`): found
//! in the registry of kinds, given what they may use of the daemon.

use std::sync::Arc;

use block::BlockDevice;
use control::kinds::{api_for, ApiError, ApiRequest, ApiResult, Daemon, Spec};
use serde_json::Value;

use super::{error, Admin};

pub(crate) fn route(admin: &Admin, method: &str, path: &str, body: &[u8]) -> Option<(u16, Value)> {
    let (api, name, action) = api_for(path)?;
    let request = ApiRequest {
        method,
        name,
        action,
        body,
    };
    Some(match (api.route)(admin, &request) {
        Ok(answer) => (200, answer),
        Err(e) => error(e.status(), e),
    })
}

impl Daemon for Admin {
    fn settings(&self, name: &str) -> Option<Spec> {
        Some(self.lock().config.device(name)?.spec.clone())
    }

    fn open_device(&self, name: &str) -> Option<Arc<dyn BlockDevice>> {
        self.lock().runtime.open_device(name)
    }

    fn open_unused(&self, name: &str) -> Result<Arc<dyn BlockDevice>, ApiError> {
        let current = self.lock();
        if current.config.device(name).is_none() {
            return Err(ApiError::not_found(format!("no device `{name}`")));
        }
        if current.runtime.open_device(name).is_some() {
            return Err(ApiError::conflict(format!("device `{name}` is in use")));
        }
        control::open_device(&current.config, name)
            .map_err(|e| ApiError::conflict(format!("device `{name}`: {e}")))
    }

    fn edit(&self, edit: &control::Edit) -> ApiResult {
        match super::edit_running(self, edit, false) {
            (200, answer) => Ok(answer),
            (status, answer) => Err(ApiError::from_status(
                status,
                answer["error"].as_str().unwrap_or("the change was refused"),
            )),
        }
    }
}
