//! HTTP/1.1 (hyper) for the administration API and the metrics listener:
//! one request per connection, a bounded head and body, the bearer token
//! on TCP (`guard.rs`), and the answer as JSON or Prometheus text. On TCP
//! the web console (the `console` crate) answers `/` and `/console/...`.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use peer_limits::PreLoginTicket;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use web_console::{Body, Console};

use super::guard::{ApiGuard, Refused};
use super::{route, Admin, Request};

/// Largest request head (hyper's read buffer) and body accepted.
const MAX_HEAD: usize = 16 * 1024;
pub const MAX_BODY: usize = 4 << 20;

/// How long a caller has to send its request: the head from the moment it
/// connects, the body from the end of the head. A caller that stalls is
/// dropped; others are served meanwhile (one task per connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    pub head: Duration,
    pub body: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            head: Duration::from_secs(10),
            body: Duration::from_secs(10),
        }
    }
}

/// The content type of the Prometheus text the encoder writes.
const METRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the callers of one listener may do.
#[derive(Clone)]
enum Service {
    /// The whole API; `guard` (the token) on TCP, where `peer` is the
    /// caller's address (the unix socket is guarded by its file mode).
    Admin {
        admin: Arc<Admin>,
        guard: Option<(Arc<ApiGuard>, IpAddr)>,
        /// The web console, on TCP.
        console: Option<Arc<Console>>,
    },
    /// `GET /metrics` only: the statistics carry no secrets.
    Metrics(Arc<stats::Registry>),
}

/// Answer requests on the unix socket until the task is dropped.
pub async fn serve_unix(admin: Arc<Admin>, listener: UnixListener, deadlines: Deadlines) {
    let service = Service::Admin {
        admin,
        guard: None,
        console: None,
    };
    loop {
        match listener.accept().await {
            Ok((stream, _)) => spawn_connection(stream, service.clone(), deadlines, None),
            Err(e) => accept_failed("admin socket", e).await,
        }
    }
}

/// Answer requests bearing the token of `guard` on a TCP listener until
/// the task is dropped.
pub async fn serve_tcp(
    admin: Arc<Admin>,
    listener: TcpListener,
    guard: ApiGuard,
    deadlines: Deadlines,
) {
    let guard = Arc::new(guard);
    let console = super::console::start(&admin, &guard, deadlines.body);
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Some(ticket) = guard.admit(peer.ip()) else {
                    continue;
                };
                let service = Service::Admin {
                    admin: admin.clone(),
                    guard: Some((guard.clone(), peer.ip())),
                    console: Some(console.clone()),
                };
                spawn_connection(stream, service, deadlines, Some(ticket));
            }
            Err(e) => accept_failed("admin API listener", e).await,
        }
    }
}

/// `--metrics-listen`: a TCP listener that answers `GET /metrics` only.
pub async fn serve_metrics(
    stats: Arc<stats::Registry>,
    listener: TcpListener,
    deadlines: Deadlines,
) {
    let service = Service::Metrics(stats);
    loop {
        match listener.accept().await {
            Ok((stream, _)) => spawn_connection(stream, service.clone(), deadlines, None),
            Err(e) => accept_failed("metrics listener", e).await,
        }
    }
}

/// Out of descriptors and similar: back off, keep serving.
async fn accept_failed(what: &str, e: std::io::Error) {
    tracing::warn!(error = %e, "{what}: accept failed");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Serves one connection; `ticket`, its place in a budget of connections,
/// ends it early when the budget evicts it for a newer one.
fn spawn_connection<S>(
    stream: S,
    service: Service,
    deadlines: Deadlines,
    ticket: Option<PreLoginTicket>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let handler = service_fn(move |req| {
            let service = service.clone();
            async move { Ok::<_, Infallible>(answer(&service, req, deadlines.body).await) }
        });
        // hyper times the head from the start of the connection.
        let serving = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(deadlines.head)
            .max_buf_size(MAX_HEAD)
            .keep_alive(false)
            .serve_connection(TokioIo::new(stream), handler);
        let evicted = async {
            match &ticket {
                Some(t) => t.evicted().await,
                None => std::future::pending().await,
            }
        };
        let served = tokio::select! {
            served = serving => served,
            _ = evicted => {
                tracing::debug!("admin connection closed to make room for a newer one");
                return;
            }
        };
        match served {
            Err(e) if e.is_timeout() => {
                tracing::info!(deadline = ?deadlines.head, "admin request dropped: its head did not arrive in time");
            }
            Err(e) => tracing::debug!(error = %e, "admin request failed"),
            Ok(()) => {}
        }
    });
}

fn response(status: u16, content_type: &'static str, body: String) -> Response<Body> {
    let mut answer = Response::new(web_console::body(body));
    *answer.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    answer
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    answer
}

fn json_response(status: u16, body: &Value) -> Response<Body> {
    response(status, "application/json", body.to_string())
}

fn error_response(status: u16, message: &str) -> Response<Body> {
    json_response(status, &json!({ "error": message }))
}

/// `GET /metrics`; any other method is refused.
fn metrics(stats: &Arc<stats::Registry>, method: &Method) -> Response<Body> {
    if method != Method::GET {
        return error_response(405, "method not allowed");
    }
    response(200, METRICS_TYPE, stats::prometheus::encode_text(stats))
}

fn refusal(refused: Refused) -> Response<Body> {
    let (status, message, header) = match refused {
        Refused::Ambiguous => (400, "more than one Authorization header", None),
        Refused::WrongToken => (
            401,
            "a valid `Authorization: Bearer` token is required",
            Some((WWW_AUTHENTICATE, "Bearer")),
        ),
        Refused::Delayed => (
            429,
            "too many wrong tokens from this address: retry later",
            Some((RETRY_AFTER, "5")),
        ),
    };
    let mut answer = error_response(status, message);
    if let Some((name, value)) = header {
        answer
            .headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    answer
}

async fn answer(
    service: &Service,
    req: hyper::Request<Incoming>,
    body_deadline: Duration,
) -> Response<Body> {
    let (admin, guard, console) = match service {
        Service::Metrics(stats) => {
            return match req.uri().path() {
                "/metrics" => metrics(stats, req.method()),
                path => error_response(404, &format!("no such resource {path}")),
            }
        }
        Service::Admin {
            admin,
            guard,
            console,
        } => (admin, guard, console),
    };
    if let (Some(console), Some((_, peer))) = (console, guard) {
        if Console::owns(req.uri().path()) {
            return console.answer(*peer, req).await;
        }
    }
    if let Some((guard, peer)) = guard {
        match guard.check(*peer, req.headers()).await {
            Err(refused) => return refusal(refused),
            Ok(role) if !role.may(req.method().as_str()) => {
                return error_response(403, web_console::READ_ONLY_REFUSAL)
            }
            Ok(_) => {}
        }
    }
    if req.uri().path() == "/metrics" {
        return metrics(&admin.stats, req.method());
    }
    // The live numbers are a stream that the console's sampler feeds; the
    // unix socket has no console, so it has no sampler either.
    if req.uri().path() == web_console::LIVE_PATH {
        return match console {
            Some(console) => console.live_stream(req.method().as_str()),
            None => error_response(
                404,
                "the live stream is served on the TCP API listener ([daemon] api_listen)",
            ),
        };
    }
    // A declared length over the limit is refused before any of it is read.
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return error_response(413, "body too large");
    }
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let origin = req
        .headers()
        .get("x-config-origin")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    // hyper has no deadline for bodies.
    let collected = tokio::time::timeout(
        body_deadline,
        Limited::new(req.into_body(), MAX_BODY).collect(),
    )
    .await;
    let body = match collected {
        Ok(Ok(body)) => body.to_bytes().to_vec(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return error_response(413, "body too large")
        }
        Ok(Err(e)) => return error_response(400, &e.to_string()),
        Err(_) => {
            tracing::info!(
                deadline = ?body_deadline,
                "admin request dropped: its body did not arrive in time"
            );
            return error_response(408, "the request body did not arrive in time");
        }
    };
    let request = Request {
        method,
        path,
        query,
        origin,
        body,
    };
    // Changes open devices and write files: off the I/O threads.
    let admin = admin.clone();
    let (status, body) = tokio::task::spawn_blocking(move || route(&admin, request))
        .await
        .unwrap_or_else(|e| (500, json!({ "error": e.to_string() })));
    json_response(status, &body)
}
