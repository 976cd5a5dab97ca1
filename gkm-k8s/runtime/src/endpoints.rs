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

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::registry::Registry;
use tracing::warn;

use super::readiness::Readiness;

/// The content type of `/metrics`.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long a client may take to send its request head.
pub(super) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A response being computed.
pub type ResponseFuture<'a> = Pin<Box<dyn Future<Output = Response<Full<Bytes>>> + Send + 'a>>;

/// Paths a daemon serves beside `/healthz`, `/readyz` and `/metrics`.
pub trait Routes: Send + Sync {
    /// Whether these routes answer `path`.
    fn serves(&self, path: &str) -> bool;
    /// The response to `method` on `path` with the request `body` (at most
    /// [`MAX_BODY_BYTES`]).
    fn respond<'a>(&'a self, method: &'a Method, path: &'a str, body: Bytes) -> ResponseFuture<'a>;
}

/// The largest request body a [`Routes`] path accepts.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// What the server answers with: the metrics registry, the readiness
/// checks and any extra routes.
pub struct Endpoints {
    registry: Registry,
    readiness: Readiness,
    routes: Option<Arc<dyn Routes>>,
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
        self.routes = Some(routes);
        self
    }

    /// Answers `request`: from the extra routes when they serve its path.
    pub(super) async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let Some(routes) = self
            .routes
            .as_ref()
            .filter(|r| r.serves(request.uri().path()))
        else {
            return self.respond(&request);
        };
        let (parts, body) = request.into_parts();
        match Limited::new(body, MAX_BODY_BYTES).collect().await {
            Ok(body) => {
                routes
                    .respond(&parts.method, parts.uri.path(), body.to_bytes())
                    .await
            }
            Err(e) => text(
                StatusCode::BAD_REQUEST,
                format!("reading the request body: {e}\n"),
            ),
        }
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
