//! What the web console (the `console` crate) is given of the daemon: the
//! API's token checks and its routes.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use web_console::{ApiRequest, Console, Role};

use super::guard::{ApiGuard, Refused};
use super::{route, Admin, Request};

struct Daemon {
    admin: Arc<Admin>,
    guard: Arc<ApiGuard>,
}

impl web_console::Daemon for Daemon {
    fn check_token<'a>(
        &'a self,
        peer: IpAddr,
        token: &'a [u8],
    ) -> Pin<Box<dyn Future<Output = Result<Role, String>> + Send + 'a>> {
        Box::pin(async move {
            self.guard
                .check_token(peer, token)
                .await
                .map_err(|refused| {
                    match refused {
                        Refused::Delayed => "too many wrong tokens from this address: retry later",
                        _ => "wrong token",
                    }
                    .to_string()
                })
        })
    }

    fn api(&self, r: ApiRequest) -> (u16, Value) {
        let request = Request {
            method: r.method,
            path: r.path,
            query: r.query,
            origin: r.origin,
            body: r.body,
        };
        route(&self.admin, request)
    }
}

/// The console of the TCP listener guarded by `guard`.
pub fn start(admin: &Arc<Admin>, guard: &Arc<ApiGuard>, body_deadline: Duration) -> Arc<Console> {
    let daemon = Daemon {
        admin: admin.clone(),
        guard: guard.clone(),
    };
    Console::new(Arc::new(daemon), admin.stats.clone(), body_deadline)
}
