//! What a gkm daemon answers over HTTP: `/healthz`, `/readyz`, `/metrics`
//! and the routes a daemon adds.
//!
//! - `/healthz` answers `ok` while the process serves requests (liveness).
//! - `/readyz` answers `ok` once every registered [`ReadyCheck`] is set, and
//!   `503` listing the checks that are not, in kube-apiserver's `[+]`/`[-]`
//!   style; `/readyz?verbose` lists every check.
//! - `/metrics` is the Prometheus registry in the OpenMetrics text format.
//! - Any other path a daemon adds with [`Endpoints::with_routes`] (the
//!   scheduler extender's `POST` verbs, the admission webhooks).
//!
//! [`ReadyCheck`]: super::readiness::ReadyCheck

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::registry::Registry;
use tokio::sync::Semaphore;
use tracing::warn;

use super::readiness::Readiness;

/// The content type of `/metrics`.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long a client may take to send its request head.
pub(super) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send a request body to [`Routes`].
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A response being computed.
pub type ResponseFuture<'a> = Pin<Box<dyn Future<Output = Response<Full<Bytes>>> + Send + 'a>>;

/// Paths a daemon serves beside `/healthz`, `/readyz` and `/metrics`.
pub trait Routes: Send + Sync {
    /// Whether these routes answer `path`.
    fn serves(&self, path: &str) -> bool;
    /// The largest request body these routes accept; a larger one is
    /// answered `413` without being read whole.
    fn max_body_bytes(&self) -> usize {
        MAX_BODY_BYTES
    }
    /// The largest request body `path` accepts ([`Routes::max_body_bytes`]
    /// unless a path says less); a larger one is answered `413` without
    /// being read whole.
    fn max_body_bytes_of(&self, path: &str) -> usize {
        let _ = path;
        self.max_body_bytes()
    }
    /// How many requests these routes answer at once, once their bodies
    /// are read (bodies being read take no permit: a slow client cannot
    /// hold one); one more is answered `503` with `Retry-After` at once.
    /// `None`: no limit.
    fn max_in_flight(&self) -> Option<usize> {
        None
    }
    /// How many bytes of request bodies these routes hold at once while
    /// they are being read, counted as they arrive (a client that declares
    /// a large body and sends it slowly holds only what it sent); a body
    /// arriving past it is answered `503` with `Retry-After`. By default
    /// [`Routes::max_in_flight`] bodies of [`Routes::max_body_bytes`]
    /// each; `None`, no limit, when there is no in-flight limit.
    fn max_buffered_bytes(&self) -> Option<usize> {
        self.max_in_flight()
            .map(|n| n.saturating_mul(self.max_body_bytes()))
    }
    /// How long a client may take to send a body to these routes
    /// ([`BODY_READ_TIMEOUT`] unless they say less).
    fn body_read_timeout(&self) -> Duration {
        BODY_READ_TIMEOUT
    }
    /// The response to `method` on `path` with the request `body` (at most
    /// [`Routes::max_body_bytes`]).
    fn respond<'a>(&'a self, method: &'a Method, path: &'a str, body: Bytes) -> ResponseFuture<'a>;
}

/// The largest request body a [`Routes`] path accepts unless it says less.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// Extra routes, the permits of their in-flight limit and the bytes their
/// bodies being read may hold.
struct Served {
    routes: Arc<dyn Routes>,
    in_flight: Option<Arc<Semaphore>>,
    buffered: Option<Arc<Semaphore>>,
}

/// What the server answers with: the metrics registry, the readiness
/// checks and any extra routes.
pub struct Endpoints {
    registry: Registry,
    readiness: Readiness,
    routes: Option<Served>,
}

impl Endpoints {
    /// Endpoints serving `registry` on `/metrics` and `readiness` on `/readyz`.
    pub fn new(registry: Registry, readiness: Readiness) -> Self {
        Endpoints {
            registry,
            readiness,
            routes: None,
        }
    }

    /// Also serves `routes`.
    pub fn with_routes(mut self, routes: Arc<dyn Routes>) -> Self {
        let in_flight = routes.max_in_flight().map(|n| Arc::new(Semaphore::new(n)));
        let buffered = routes
            .max_buffered_bytes()
            .map(|n| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS))));
        self.routes = Some(Served {
            routes,
            in_flight,
            buffered,
        });
        self
    }

    /// Answers `request`: from the extra routes when they serve its path.
    pub(super) async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let Some(served) = self
            .routes
            .as_ref()
            .filter(|s| s.routes.serves(request.uri().path()))
        else {
            return self.respond(&request);
        };
        let limit = served.routes.max_body_bytes_of(request.uri().path());
        let declared = request
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return too_large(limit);
        }
        let (parts, body) = request.into_parts();
        let timeout = served.routes.body_read_timeout();
        let read = tokio::time::timeout(timeout, read_body(body, limit, served.buffered.as_ref()));
        let body = match read.await {
            Ok(Ok(body)) => body,
            Ok(Err(BodyError::TooLarge)) => return too_large(limit),
            Ok(Err(BodyError::Buffered)) => {
                return busy_reading(served.routes.max_buffered_bytes().unwrap_or_default());
            }
            Ok(Err(BodyError::Read(e))) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("reading the request body: {e}\n"),
                );
            }
            Err(_) => {
                return text(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body took longer than {}s to send\n",
                        timeout.as_secs_f64()
                    ),
                );
            }
        };
        // Taken once the body is whole, held until the response is computed.
        let _permit = match &served.in_flight {
            None => None,
            Some(permits) => match permits.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => return busy(served.routes.max_in_flight().unwrap_or_default()),
            },
        };
        served
            .routes
            .respond(&parts.method, parts.uri.path(), body)
            .await
    }

    /// The readiness checks.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// The registry in the OpenMetrics text format, as `/metrics` serves it.
    pub fn metrics_text(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail; an encoding error would come from
        // a collector and leaves what was written so far.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            warn!(error = %e, "encoding metrics");
        }
        text
    }

    fn respond(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
        let head = request.method() == Method::HEAD;
        if request.method() != Method::GET && !head {
            let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
            response
                .headers_mut()
                .insert("allow", HeaderValue::from_static("GET, HEAD"));
            return response;
        }
        let verbose = request.uri().query().is_some_and(|q| {
            q.split('&')
                .any(|p| p == "verbose" || p.starts_with("verbose="))
        });
        let mut response = match request.uri().path() {
            "/healthz" | "/livez" => text(StatusCode::OK, "ok\n".into()),
            "/readyz" => {
                let (ready, body) = self.readiness.report(verbose);
                let status = if ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                text(status, body)
            }
            "/metrics" => {
                let mut response = text(StatusCode::OK, self.metrics_text());
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static(OPENMETRICS_CONTENT_TYPE),
                );
                response
            }
            path => text(
                StatusCode::NOT_FOUND,
                format!("{path}: not found; try /healthz, /readyz or /metrics\n"),
            ),
        };
        if head {
            *response.body_mut() = Full::new(Bytes::new());
        }
        response
    }
}

/// `413`: a request body over `limit` bytes.
fn too_large(limit: usize) -> Response<Full<Bytes>> {
    text(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body is larger than {limit} bytes, the most this path accepts\n"),
    )
}

/// Why a request body was not read whole.
enum BodyError {
    /// It is larger than its path accepts.
    TooLarge,
    /// The bodies being read already hold every byte the routes allow.
    Buffered,
    /// The connection failed while it was sent.
    Read(hyper::Error),
}

/// Reads `body`, at most `limit` bytes, taking a permit of `buffered` for
/// each byte as it arrives (released when the body is dropped: the bytes
/// are then the response's to hold, under the in-flight limit).
async fn read_body(
    mut body: Incoming,
    limit: usize,
    buffered: Option<&Arc<Semaphore>>,
) -> Result<Bytes, BodyError> {
    let mut bytes = Vec::new();
    let mut held = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(BodyError::Read)?.into_data() else {
            continue;
        };
        if bytes.len() + data.len() > limit {
            return Err(BodyError::TooLarge);
        }
        if let Some(buffered) = buffered {
            let n = u32::try_from(data.len()).map_err(|_| BodyError::TooLarge)?;
            held.push(
                buffered
                    .clone()
                    .try_acquire_many_owned(n)
                    .map_err(|_| BodyError::Buffered)?,
            );
        }
        bytes.extend_from_slice(&data);
    }
    drop(held);
    Ok(Bytes::from(bytes))
}

/// `503`: bodies being read already hold `limit` bytes.
fn busy_reading(limit: usize) -> Response<Full<Bytes>> {
    let mut response = text(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("{limit} bytes of request bodies are already being read; retry shortly\n"),
    );
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// `503`: `limit` requests are already in flight.
fn busy(limit: usize) -> Response<Full<Bytes>> {
    let mut response = text(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("{limit} requests are already being answered; retry shortly\n"),
    );
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// A plain-text response.
pub fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
