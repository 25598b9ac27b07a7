//! The web console: pages served by the daemon on the TCP API's listener,
//! reached at `/console/` with a session cookie got by logging in with an
//! API token (docs/console.md).
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /`, `GET /console` | a redirect to `/console/` |
//! | `GET /favicon.ico` | the console's icon |
//! | `GET /console/` | the console, or a redirect to the login page without a session |
//! | `GET /console/login`, `POST /console/login` (form `token=`) | the login page; a session cookie for a good token |
//! | `POST /console/logout` | the session ended |
//! | `GET /console/assets/NAME` | the embedded scripts and styles |
//! | `/console/api/v1/...` | the API route `/v1/...`, for the session's role; changes need `X-Console: 1` |
//!
//! The live numbers are the API's `GET /v1/stats/live` (Server-Sent
//! Events, `live.rs`), which the daemon answers with [`Console::live_stream`].
//!
//! The daemon gives the console what it needs through [`Daemon`]: token
//! checks (with the API's back-off for wrong ones) and API answers, so the
//! console shows and does only what the documented API does.

mod assets;
mod events;
mod live;
mod login;
mod responses;
mod role;
mod sessions;

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use serde_json::Value;

pub use live::{Live, Sampler};
pub use responses::{full, json};
use responses::{json_error, redirect};
pub use role::{Role, READ_ONLY_REFUSAL};
use sessions::Sessions;

/// The body of every answer: whole, or streamed for events.
pub type Body = BoxBody<Bytes, Infallible>;

/// The API route of the live numbers, a stream of Server-Sent Events.
pub const LIVE_PATH: &str = "/v1/stats/live";

/// Largest request body the console reads (a configuration file).
pub const MAX_BODY: usize = 4 << 20;

/// The header the console's own scripts send with every change: a form
/// on another site cannot set it, so a cookie alone never makes a change.
pub const CSRF_HEADER: &str = "x-console";

/// An API request the console makes for a session.
pub struct ApiRequest {
    pub method: String,
    /// The API path, `/v1/...`.
    pub path: String,
    pub query: String,
    /// `X-Config-Origin`, as the API takes it.
    pub origin: Option<String>,
    pub body: Vec<u8>,
}

/// What the console needs of the daemon.
pub trait Daemon: Send + Sync + 'static {
    /// The role `token` grants when `peer` presents it, after the same
    /// back-off and logging as a bearer token on the API; `Err` with the
    /// reason to show otherwise.
    fn check_token<'a>(
        &'a self,
        peer: IpAddr,
        token: &'a [u8],
    ) -> Pin<Box<dyn Future<Output = Result<Role, String>> + Send + 'a>>;

    /// The API's answer to `request` (called off the I/O threads).
    fn api(&self, request: ApiRequest) -> (u16, Value);
}

/// The console of one daemon: its sessions and live statistics.
pub struct Console {
    daemon: Arc<dyn Daemon>,
    sessions: Sessions,
    live: Arc<Live>,
    /// How long a caller has to send a request body.
    body_deadline: Duration,
}

impl Console {
    /// Starts sampling `stats` (on the current tokio runtime) for the
    /// live graphs.
    pub fn new(
        daemon: Arc<dyn Daemon>,
        stats: Arc<stats::Registry>,
        body_deadline: Duration,
    ) -> Arc<Console> {
        Arc::new(Console {
            daemon,
            sessions: Sessions::default(),
            live: Live::start(stats),
            body_deadline,
        })
    }

    /// Whether a request for `path` is the console's to answer.
    pub fn owns(path: &str) -> bool {
        matches!(path, "/" | "/console" | "/favicon.ico") || path.starts_with("/console/")
    }

    /// The answer to a request from `peer` for a path it [`owns`].
    ///
    /// [`owns`]: Console::owns
    pub async fn answer(&self, peer: IpAddr, req: Request<Incoming>) -> Response<Body> {
        let method = req.method().as_str().to_string();
        let path = req.uri().path().to_string();
        let role = self.sessions.role(req.headers());
        match (method.as_str(), path.as_str(), role) {
            ("GET", "/" | "/console", _) => redirect("/console/"),
            // Browsers ask for it unbidden: answered here, it never counts
            // as a request without a token.
            ("GET", "/favicon.ico", _) => assets::asset("/console/assets/icon.svg"),
            ("GET", "/console/login", _) => login::page(None, 200),
            ("POST", "/console/login", _) => match self.read_body(req).await {
                Ok(body) => self.log_in(peer, &body).await,
                Err(refused) => refused,
            },
            ("POST", "/console/logout", _) => login::logged_out(&self.sessions, req.headers()),
            ("GET", "/console/", Some(role)) => assets::app(role),
            ("GET", "/console/", None) => redirect("/console/login"),
            ("GET", asset, _) if asset.starts_with("/console/assets/") => assets::asset(asset),
            (_, p, None) if p.starts_with("/console/api/") => {
                json_error(401, "log in to the console first: no live session")
            }
            (_, p, Some(role)) if p.starts_with("/console/api/") => self.api(role, req).await,
            _ => json_error(404, &format!("no such page {path}")),
        }
    }

    async fn log_in(&self, peer: IpAddr, body: &[u8]) -> Response<Body> {
        let token = match login::token_of(body) {
            Ok(token) => token,
            Err(why) => return login::page(Some(&why), 400),
        };
        match self.daemon.check_token(peer, token.as_bytes()).await {
            Ok(role) => {
                tracing::info!(%peer, role = role.name(), "console: logged in");
                login::logged_in(&self.sessions, role)
            }
            Err(why) => {
                tracing::warn!(%peer, "console: login refused: {why}");
                login::page(Some(&why), 401)
            }
        }
    }

    /// `/console/api/v1/...` answered as `/v1/...`.
    async fn api(&self, role: Role, req: Request<Incoming>) -> Response<Body> {
        let method = req.method().as_str().to_string();
        if !role.may(&method) {
            return json_error(403, READ_ONLY_REFUSAL);
        }
        let csrf = req.headers().get(CSRF_HEADER).map(|v| v.as_bytes());
        if !matches!(method.as_str(), "GET" | "HEAD") && csrf != Some(b"1") {
            return json_error(
                403,
                "a change from the console must carry the header `X-Console: 1`",
            );
        }
        let path = req
            .uri()
            .path()
            .trim_start_matches("/console/api")
            .to_string();
        // A stream, so the daemon's JSON routes cannot answer it.
        if path == LIVE_PATH {
            return self.live_stream(&method);
        }
        let query = req.uri().query().unwrap_or("").to_string();
        let origin = req
            .headers()
            .get("x-config-origin")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let body = match self.read_body(req).await {
            Ok(body) => body,
            Err(refused) => return refused,
        };
        let request = ApiRequest {
            method,
            path,
            query,
            origin,
            body,
        };
        let daemon = self.daemon.clone();
        let (status, value) = tokio::task::spawn_blocking(move || daemon.api(request))
            .await
            .unwrap_or_else(|e| (500, serde_json::json!({ "error": e.to_string() })));
        json(status, &value)
    }

    /// `GET /v1/stats/live`: the samples kept, then one a second.
    pub fn live_stream(&self, method: &str) -> Response<Body> {
        match method {
            "GET" => events::stream(&self.live),
            _ => json_error(405, "method not allowed"),
        }
    }

    /// The whole body, at most [`MAX_BODY`], within the deadline.
    async fn read_body(&self, req: Request<Incoming>) -> Result<Vec<u8>, Response<Body>> {
        let collected = tokio::time::timeout(
            self.body_deadline,
            Limited::new(req.into_body(), MAX_BODY).collect(),
        )
        .await;
        match collected {
            Ok(Ok(body)) => Ok(body.to_bytes().to_vec()),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                Err(json_error(413, "body too large"))
            }
            Ok(Err(e)) => Err(json_error(400, &e.to_string())),
            Err(_) => Err(json_error(408, "the request body did not arrive in time")),
        }
    }
}

/// A body of `bytes` for any answer.
pub fn body(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}
