//! The HTTP/1.1 endpoint: `/metrics`, `/status`, `/healthz`, `/pause`, `/resume`.
//!
//! A deliberately small server: one request per connection (`Connection: close`), no
//! keep-alive, no chunked bodies. Everything is bounded so that a scraper gone wrong, or
//! anyone who can reach the port, costs the daemon a fixed amount of memory and time:
//!
//! | what | bound ([`HttpLimits`]) |
//! |---|---|
//! | request head (request line and headers) | `max_head_bytes`, 8 KiB; more gets `400` |
//! | request body (`POST /pause`) | `max_body_bytes`, 1 KiB; more gets `413` |
//! | reading head and body | `read_timeout`, 5 s from accept, however slowly bytes trickle in; then `408` |
//! | writing the answer | `write_timeout`, 5 s |
//! | connections served at once | `max_connections`, 32; later ones wait in the kernel's accept queue until a slot frees, which every slot does within the two timeouts (plus 1 s draining a refused request) |
//!
//! A bad request gets its answer and its connection closed; the server keeps serving.
//!
//! `POST /pause` and `POST /resume` are allowed from loopback, or with the bearer token of
//! `metrics.control_token_file`, and only with a `Host` and `Origin` (when sent) that name
//! this daemon; anything else gets `403` and changes nothing (see [`super::control`]).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::control::{ControlRequest, ControlToken, authorize};
use super::request::{BadRequest, RequestHead, find_head_end, parse_head};
use super::{Metrics, ObserveError, StatusBoard};

/// How much the endpoint accepts and how long it waits. [`Default`] gives the documented
/// limits; tests shorten the timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HttpLimits {
    /// Largest request head, in bytes.
    pub(crate) max_head_bytes: usize,
    /// Largest request body, in bytes.
    pub(crate) max_body_bytes: usize,
    /// Time from accepting a connection until its whole request has arrived.
    pub(crate) read_timeout: Duration,
    /// Time to write the answer.
    pub(crate) write_timeout: Duration,
    /// Connections served at once.
    pub(crate) max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            max_head_bytes: 8 * 1024,
            max_body_bytes: 1024,
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            max_connections: 32,
        }
    }
}

/// After a refused request, unread bytes the server still drains (so closing does not reset
/// the connection before the client reads the answer), and for how long at most.
const LINGER_BYTES: usize = 64 * 1024;
const LINGER_TIME: Duration = Duration::from_secs(1);
/// Pause after a failed accept (out of file descriptors), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The running endpoint.
#[derive(Debug)]
pub(crate) struct ObserveServer {
    local_addr: SocketAddr,
    task: JoinHandle<()>,
}

impl ObserveServer {
    /// The address bound, with the port the system chose when the config said port 0.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Waits until the server has stopped (after the shutdown signal, open connections
    /// are cut).
    pub(crate) async fn stopped(self) {
        if let Err(e) = self.task.await {
            tracing::error!("the metrics and status endpoint stopped abnormally: {e}");
        }
    }
}

struct Shared {
    metrics: Metrics,
    board: StatusBoard,
    limits: HttpLimits,
    control_token: Option<ControlToken>,
}

/// Binds `addr` and serves the endpoints on the current tokio runtime until `shutdown`
/// completes; `control_token` lets non-loopback clients pause and resume.
pub(crate) async fn serve(
    addr: SocketAddr,
    limits: HttpLimits,
    control_token: Option<ControlToken>,
    metrics: Metrics,
    board: StatusBoard,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<ObserveServer, ObserveError> {
    let bind_error = |source| ObserveError::Bind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let local_addr = listener.local_addr().map_err(bind_error)?;
    let shared = Arc::new(Shared {
        metrics,
        board,
        limits,
        control_token,
    });
    tracing::info!("serving /metrics, /status and /healthz on http://{local_addr}");
    let task = tokio::spawn(accept_loop(listener, shared, shutdown));
    Ok(ObserveServer { local_addr, task })
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let slots = Arc::new(Semaphore::new(shared.limits.max_connections));
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
        // A slot first, then the connection: beyond the limit, clients wait in the accept
        // queue rather than costing a task each.
        let slot = tokio::select! {
            () = &mut shutdown => break,
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_closed) => break,
            },
        };
        let (stream, client) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, client)) => (stream, client),
                Err(e) => {
                    tracing::warn!("metrics endpoint: accepting a connection failed: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let shared = Arc::clone(&shared);
        connections.spawn(async move {
            serve_connection(stream, client, &shared).await;
            drop(slot);
        });
    }
    connections.shutdown().await;
    tracing::debug!("metrics endpoint stopped");
}

/// How reading a request ended, when it did not yield one.
enum ReadFailure {
    /// The client closed or the socket failed: nobody to answer.
    Gone,
    /// Over the read timeout.
    TimedOut,
    /// No end of head within the limit.
    HeadTooLarge,
}

async fn serve_connection(mut stream: TcpStream, client: SocketAddr, shared: &Shared) {
    let limits = &shared.limits;
    let deadline = Instant::now() + limits.read_timeout;
    let mut buf = vec![0u8; limits.max_head_bytes];
    // After a refusal the client may still be sending; drain it before closing (below).
    let (response, then_drain) = match read_request(&mut stream, &mut buf, deadline, limits).await {
        Ok(request) => {
            // The address the client reached, which its `Host` must name; unknown only if
            // the socket already failed, and then nothing is allowed to match it.
            let local = stream
                .local_addr()
                .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
            (respond(&request, client, local, shared), false)
        }
        Err(Refused::Bad(bad)) => (Response::refuse(&bad), true),
        Err(Refused::Read(ReadFailure::Gone)) => return,
        // A client this slow has had its chance; its slot is freed at once.
        Err(Refused::Read(ReadFailure::TimedOut)) => (Response::timed_out(), false),
        Err(Refused::Read(ReadFailure::HeadTooLarge)) => {
            let bad = BadRequest::HeadTooLarge {
                limit: limits.max_head_bytes,
            };
            (Response::refuse(&bad), true)
        }
    };
    let bytes = response.to_bytes();
    let write = async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    };
    if tokio::time::timeout(limits.write_timeout, write)
        .await
        .is_err()
    {
        return;
    }
    if then_drain {
        linger(&mut stream).await;
    }
}

enum Refused {
    Bad(BadRequest),
    Read(ReadFailure),
}

/// A request whose head parsed and whose body (if any) has been read and discarded.
struct Request {
    method: String,
    path: String,
    host: Option<String>,
    origin: Option<String>,
    authorization: Option<String>,
}

async fn read_request(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    limits: &HttpLimits,
) -> Result<Request, Refused> {
    let mut filled = 0;
    let head_end = loop {
        if let Some(end) = find_head_end(&buf[..filled]) {
            break end;
        }
        if filled == buf.len() {
            return Err(Refused::Read(ReadFailure::HeadTooLarge));
        }
        filled += read_some(stream, &mut buf[filled..], deadline).await?;
    };
    let head: RequestHead<'_> = parse_head(&buf[..head_end]).map_err(Refused::Bad)?;
    if head.content_length > limits.max_body_bytes {
        return Err(Refused::Bad(BadRequest::BodyTooLarge {
            limit: limits.max_body_bytes,
        }));
    }
    // The body is not used; it is read so that closing does not reset the connection.
    let already = filled - (head_end + 4);
    let mut left = head.content_length.saturating_sub(already);
    let request = Request {
        method: head.method.to_owned(),
        path: head.path.to_owned(),
        host: head.host.map(str::to_owned),
        origin: head.origin.map(str::to_owned),
        authorization: head.authorization.map(str::to_owned),
    };
    while left > 0 {
        let n = read_some(stream, buf, deadline).await?;
        left = left.saturating_sub(n);
    }
    Ok(request)
}

/// Reads at least one byte into `buf` before `deadline`.
async fn read_some(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<usize, Refused> {
    match tokio::time::timeout_at(deadline, stream.read(buf)).await {
        Err(_elapsed) => Err(Refused::Read(ReadFailure::TimedOut)),
        Ok(Ok(0) | Err(_)) => Err(Refused::Read(ReadFailure::Gone)),
        Ok(Ok(n)) => Ok(n),
    }
}

/// Drains what the client still sends, briefly, so its answer is not lost to a reset.
async fn linger(stream: &mut TcpStream) {
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    let deadline = Instant::now() + LINGER_TIME;
    while drained < LINGER_BYTES {
        match tokio::time::timeout_at(deadline, stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            _ => break,
        }
    }
}

fn respond(request: &Request, client: SocketAddr, local: SocketAddr, shared: &Shared) -> Response {
    let head_only = request.method == "HEAD";
    let get = matches!(request.method.as_str(), "GET" | "HEAD");
    let post = request.method == "POST";
    let response = match request.path.as_str() {
        "/metrics" if get => {
            shared.metrics.refresh_from(&shared.board);
            let mut body = Vec::with_capacity(16 * 1024);
            match shared.metrics.encode_text(&mut body) {
                Ok(()) => Response::ok(PROMETHEUS_TEXT, body),
                Err(e) => {
                    tracing::error!("{e}");
                    Response::error(500, "Internal Server Error", &e.to_string())
                }
            }
        }
        "/status" if get => {
            let net = &shared.metrics.network;
            let report = shared
                .board
                .report(net.counters(), &net.bandwidth(), net.bootstrap());
            match serde_json::to_vec(&report) {
                Ok(body) => Response::ok(JSON, body),
                Err(e) => Response::error(500, "Internal Server Error", &e.to_string()),
            }
        }
        "/healthz" if get => Response::ok(PLAIN_TEXT, b"ok".to_vec()),
        "/pause" | "/resume" if post => control(request, client, local, shared),
        "/metrics" | "/status" | "/healthz" => Response::not_allowed("GET, HEAD"),
        "/pause" | "/resume" => Response::not_allowed("POST"),
        _ => Response::error(
            404,
            "Not Found",
            "no such endpoint; try /metrics, /status or /healthz",
        ),
    };
    if head_only {
        response.without_body()
    } else {
        response
    }
}

/// `POST /pause` or `/resume`: checked (see [`super::control`]), then applied.
fn control(request: &Request, client: SocketAddr, local: SocketAddr, shared: &Shared) -> Response {
    let check = ControlRequest {
        client,
        local,
        host: request.host.as_deref(),
        origin: request.origin.as_deref(),
        authorization: request.authorization.as_deref(),
    };
    if let Err(why) = authorize(&check, shared.control_token.as_ref()) {
        tracing::warn!(
            client = %client,
            endpoint = %request.path,
            reason = %why,
            "control request refused"
        );
        return Response::error(403, "Forbidden", &why.to_string());
    }
    let paused = request.path == "/pause";
    if shared.board.set_paused(paused) {
        tracing::info!(
            client = %client,
            "training {} over HTTP",
            if paused { "paused" } else { "resumed" }
        );
    }
    Response::ok(JSON, format!("{{\"paused\":{paused}}}").into_bytes())
}

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
const JSON: &str = "application/json";
const PLAIN_TEXT: &str = "text/plain; charset=utf-8";

/// One answer, written whole.
struct Response {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    allow: Option<&'static str>,
    body: Vec<u8>,
    /// `Content-Length` when the body is left out (a `HEAD` request).
    length: usize,
}

impl Response {
    fn ok(content_type: &'static str, body: Vec<u8>) -> Response {
        Response {
            status: 200,
            reason: "OK",
            content_type,
            allow: None,
            length: body.len(),
            body,
        }
    }

    fn error(status: u16, reason: &'static str, message: &str) -> Response {
        let body = format!("{message}\n").into_bytes();
        Response {
            status,
            reason,
            content_type: PLAIN_TEXT,
            allow: None,
            length: body.len(),
            body,
        }
    }

    fn refuse(bad: &BadRequest) -> Response {
        match bad {
            BadRequest::BodyTooLarge { .. } => {
                Response::error(413, "Content Too Large", &bad.to_string())
            }
            _ => Response::error(400, "Bad Request", &bad.to_string()),
        }
    }

    fn timed_out() -> Response {
        Response::error(408, "Request Timeout", "the request did not arrive in time")
    }

    fn not_allowed(allow: &'static str) -> Response {
        let mut response = Response::error(405, "Method Not Allowed", "method not allowed");
        response.allow = Some(allow);
        response
    }

    fn without_body(mut self) -> Response {
        self.body.clear();
        self
    }

    fn to_bytes(&self) -> Vec<u8> {
        let allow = self
            .allow
            .map(|a| format!("Allow: {a}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}\
             Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            self.status, self.reason, self.content_type, self.length,
        );
        let mut bytes = Vec::with_capacity(head.len() + self.body.len());
        bytes.extend_from_slice(head.as_bytes());
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
