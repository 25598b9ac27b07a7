//! The client side of the administration API (hyper): one request per
//! connection, over the daemon's unix socket or over TCP with a token.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context};
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};

pub use daemon::admin::DEFAULT_SOCKET;

/// Names the administration socket when `--socket` is not given.
pub const SOCKET_ENV: &str = "OPENARRAY_SOCKET";

/// A change may flush devices; this is only a bound against a hung daemon.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(300);

/// Largest answer read (the configuration text, the statistics).
const MAX_ANSWER: usize = 64 << 20;

/// How the daemon is reached.
#[derive(Clone, Debug)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp { addr: String, token: String },
}

/// The options that say which daemon to talk to.
#[derive(Args, Clone, Debug)]
pub struct ApiArgs {
    /// The daemon's administration socket.
    #[arg(long, global = true, value_name = "PATH", env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Use the daemon's TCP API at this address instead of the socket
    /// (or set OPENARRAY_API).
    #[arg(long, global = true, value_name = "ADDR:PORT")]
    pub api: Option<String>,
    /// The file holding the TCP API's token (or set OPENARRAY_TOKEN_FILE).
    #[arg(long, global = true, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

impl ApiArgs {
    /// Runs `command` against the daemon these options name: its exit
    /// status, or 2 with the error printed when the daemon could not be
    /// asked or its answer not read.
    pub fn run(&self, command: impl FnOnce(&Endpoint) -> anyhow::Result<ExitCode>) -> ExitCode {
        match self.endpoint().and_then(|e| command(&e)) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("openarray: {e:#}");
                ExitCode::from(2)
            }
        }
    }

    pub fn endpoint(&self) -> anyhow::Result<Endpoint> {
        let from_env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let api = self
            .api
            .clone()
            .or_else(|| from_env("OPENARRAY_API").map(|v| v.to_string_lossy().into_owned()));
        let Some(addr) = api else {
            return Ok(Endpoint::Unix(self.socket.clone()));
        };
        let token_file = self
            .token_file
            .clone()
            .or_else(|| from_env("OPENARRAY_TOKEN_FILE").map(PathBuf::from))
            .ok_or_else(|| anyhow!("--api needs --token-file (or OPENARRAY_TOKEN_FILE)"))?;
        let token = std::fs::read_to_string(&token_file)
            .with_context(|| format!("cannot read the token file {}", token_file.display()))?;
        Ok(Endpoint::Tcp {
            addr,
            token: token.trim().to_string(),
        })
    }
}

/// One request to the daemon's unix socket; the HTTP status and the JSON
/// body.
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: &[u8],
    origin: Option<&str>,
) -> anyhow::Result<(u16, Value)> {
    call(
        &Endpoint::Unix(socket.to_path_buf()),
        method,
        path,
        body,
        origin,
    )
}

/// One request to the daemon at `endpoint`; the HTTP status and the JSON
/// body.
pub fn call(
    endpoint: &Endpoint,
    method: &str,
    path: &str,
    body: &[u8],
    origin: Option<&str>,
) -> anyhow::Result<(u16, Value)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the client runtime")?;
    let (status, answer) = runtime.block_on(async {
        tokio::time::timeout(
            ANSWER_TIMEOUT,
            exchange(endpoint, method, path, body, origin),
        )
        .await
        .map_err(|_| unreachable(format!("the daemon did not answer in {ANSWER_TIMEOUT:?}")))?
    })?;
    let json = serde_json::from_slice(&answer).context("malformed JSON from the daemon")?;
    Ok((status, json))
}

fn unreachable(message: String) -> anyhow::Error {
    anyhow::Error::new(crate::output::Usage(message))
}

async fn exchange(
    endpoint: &Endpoint,
    method: &str,
    path: &str,
    body: &[u8],
    origin: Option<&str>,
) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, "openarray")
        .header(CONTENT_TYPE, "application/json");
    if let Some(origin) = origin {
        // Header values are one line of visible characters.
        let clean: String = origin
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() || c == ' ' {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        request = request.header("X-Config-Origin", clean);
    }
    match endpoint {
        Endpoint::Unix(socket) => {
            let stream = tokio::net::UnixStream::connect(socket)
                .await
                .map_err(|e| {
                    unreachable(format!(
                        "cannot reach the daemon at {} (is `openarray serve --admin-socket` running?): {e}",
                        socket.display()
                    ))
                })?;
            send(stream, request, body).await
        }
        Endpoint::Tcp { addr, token } => {
            let bearer = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| anyhow!("the token holds characters a header cannot carry"))?;
            request = request.header(AUTHORIZATION, bearer);
            let stream = tokio::net::TcpStream::connect(addr.as_str())
                .await
                .map_err(|e| {
                    unreachable(format!("cannot reach the daemon's API at {addr}: {e}"))
                })?;
            send(stream, request, body).await
        }
    }
}

async fn send<S>(
    stream: S,
    request: hyper::http::request::Builder,
    body: &[u8],
) -> anyhow::Result<(u16, Vec<u8>)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(format!("cannot talk HTTP to the daemon: {e}")))?;
    let driver = tokio::spawn(connection);
    let request = request
        .body(Full::new(Bytes::copy_from_slice(body)))
        .context("cannot build the request")?;
    let answer = sender
        .send_request(request)
        .await
        .context("the daemon closed the connection")?;
    let status = answer.status().as_u16();
    let limited = http_body_util::Limited::new(answer.into_body(), MAX_ANSWER);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| anyhow!("reading the daemon's answer: {e}"))?
        .to_bytes();
    driver.abort();
    Ok((status, bytes.to_vec()))
}
