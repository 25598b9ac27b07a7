//! HTTP/1.1 (hyper) for the administration API and the metrics listener:
//! one request per connection, a bounded head and body, the bearer token
//! on TCP, and the answer as JSON or Prometheus text.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};

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

/// The secret a TCP caller must present as `Authorization: Bearer <token>`.
pub struct Token(Vec<u8>);

impl Token {
    pub fn new(token: &str) -> Token {
        Token(token.as_bytes().to_vec())
    }

    /// Whether the header carries the token. The comparison takes the same
    /// time wherever the first difference is, so timing tells nothing.
    fn admits(&self, header: Option<&HeaderValue>) -> bool {
        let Some(given) = header
            .map(HeaderValue::as_bytes)
            .and_then(|h| h.strip_prefix(b"Bearer "))
        else {
            return false;
        };
        bool::from(given.ct_eq(&self.0))
    }
}

/// What the callers of one listener may do.
#[derive(Clone)]
enum Service {
    /// The whole API; `token` is required on TCP (the unix socket is
    /// guarded by its file mode instead).
    Admin {
        admin: Arc<Admin>,
        token: Option<Arc<Token>>,
    },
    /// `GET /metrics` only: the statistics carry no secrets.
    Metrics(Arc<stats::Registry>),
}

/// Answer requests on the unix socket until the task is dropped.
pub async fn serve_unix(admin: Arc<Admin>, listener: UnixListener, deadlines: Deadlines) {
    let service = Service::Admin { admin, token: None };
    loop {
        match listener.accept().await {
            Ok((stream, _)) => spawn_connection(stream, service.clone(), deadlines),
            Err(e) => accept_failed("admin socket", e).await,
        }
    }
}

/// Answer requests bearing `token` on a TCP listener until the task is dropped.
pub async fn serve_tcp(
    admin: Arc<Admin>,
    listener: TcpListener,
    token: Token,
    deadlines: Deadlines,
) {
    let service = Service::Admin {
        admin,
        token: Some(Arc::new(token)),
    };
    loop {
        match listener.accept().await {
            Ok((stream, _)) => spawn_connection(stream, service.clone(), deadlines),
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
            Ok((stream, _)) => spawn_connection(stream, service.clone(), deadlines),
            Err(e) => accept_failed("metrics listener", e).await,
        }
    }
}

/// Out of descriptors and similar: back off, keep serving.
async fn accept_failed(what: &str, e: std::io::Error) {
    tracing::warn!(error = %e, "{what}: accept failed");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn spawn_connection<S>(stream: S, service: Service, deadlines: Deadlines)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let handler = service_fn(move |req| {
            let service = service.clone();
            async move { Ok::<_, Infallible>(answer(&service, req, deadlines.body).await) }
        });
        // hyper times the head from the start of the connection.
        let served = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(deadlines.head)
            .max_buf_size(MAX_HEAD)
            .keep_alive(false)
            .serve_connection(TokioIo::new(stream), handler)
            .await;
        match served {
            Err(e) if e.is_timeout() => {
                tracing::info!(deadline = ?deadlines.head, "admin request dropped: its head did not arrive in time");
            }
            Err(e) => tracing::debug!(error = %e, "admin request failed"),
            Ok(()) => {}
        }
    });
}

fn response(status: u16, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut answer = Response::new(Full::new(Bytes::from(body)));
    *answer.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    answer
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    answer
}

fn json_response(status: u16, body: &Value) -> Response<Full<Bytes>> {
    response(status, "application/json", body.to_string())
}

fn error_response(status: u16, message: &str) -> Response<Full<Bytes>> {
    json_response(status, &json!({ "error": message }))
}

/// `GET /metrics`; any other method is refused.
fn metrics(stats: &Arc<stats::Registry>, method: &Method) -> Response<Full<Bytes>> {
    if method != Method::GET {
        return error_response(405, "method not allowed");
    }
    response(200, METRICS_TYPE, stats::prometheus::encode_text(stats))
}

async fn answer(
    service: &Service,
    req: hyper::Request<Incoming>,
    body_deadline: Duration,
) -> Response<Full<Bytes>> {
    let (admin, token) = match service {
        Service::Metrics(stats) => {
            return match req.uri().path() {
                "/metrics" => metrics(stats, req.method()),
                path => error_response(404, &format!("no such resource {path}")),
            }
        }
        Service::Admin { admin, token } => (admin, token),
    };
    if let Some(token) = token {
        if !token.admits(req.headers().get(AUTHORIZATION)) {
            let mut refused =
                error_response(401, "a valid `Authorization: Bearer` token is required");
            refused
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return refused;
        }
    }
    if req.uri().path() == "/metrics" {
        return metrics(&admin.stats, req.method());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_must_match_exactly() {
        let token = Token::new("s3cret-token");
        let header = |v: &str| HeaderValue::from_str(v).unwrap();
        assert!(token.admits(Some(&header("Bearer s3cret-token"))));
        assert!(!token.admits(None));
        assert!(!token.admits(Some(&header("Bearer s3cret-toke"))));
        assert!(!token.admits(Some(&header("Bearer s3cret-token2"))));
        assert!(!token.admits(Some(&header("Basic s3cret-token"))));
        assert!(!token.admits(Some(&header("s3cret-token"))));
        assert!(!token.admits(Some(&header("Bearer "))));
    }
}
