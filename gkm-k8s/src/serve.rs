//! The operator's and agent's HTTP endpoints: `/healthz`, `/readyz` and
//! `/metrics`.
//!
//! - `/healthz` answers `ok` while the process serves requests (liveness).
//! - `/readyz` answers `ok` once every registered [`ReadyCheck`] is set, and
//!   `503` listing the checks that are not, in kube-apiserver's `[+]`/`[-]`
//!   style; `/readyz?verbose` lists every check.
//! - `/metrics` is the Prometheus registry in the OpenMetrics text format.
//! - Any other path a daemon adds with [`Endpoints::with_routes`] (the
//!   scheduler extender's `POST` verbs).
//!
//! Plain HTTP, or TLS with [`serve_with`] and [`tls_acceptor`].
//!
//! Around them, what both long-running processes share: [`Sampled`] values
//! as metrics, a readiness check that waits for
//! the apiserver to serve a resource ([`ready_when_listable`]), and stopping
//! on SIGTERM/SIGINT ([`shutdown_signal`], [`until_signal`]).
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use std::sync::Arc;
//! use gkm_k8s::serve::{Endpoints, Readiness, serve};
//! use prometheus_client::registry::Registry;
//!
//! let readiness = Readiness::default();
//! let synced = readiness.check("caches-synced");
//! let endpoints = Arc::new(Endpoints::new(Registry::with_prefix("gkm"), readiness));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! tokio::spawn(serve(listener, endpoints, std::future::pending()));
//! // … once the controllers' caches are filled:
//! synced.set(true);
//! # Ok(())
//! # }
//! ```

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
pub use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

/// The content type of `/metrics`.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long a client may take to send its request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The named conditions `/readyz` waits for. Clones share the same checks.
#[derive(Clone, Default)]
pub struct Readiness {
    checks: Arc<Mutex<Vec<(String, ReadyCheck)>>>,
}

/// One readiness condition, not ready until [`ReadyCheck::set`] says so.
#[derive(Clone, Default)]
pub struct ReadyCheck {
    ready: Arc<AtomicBool>,
}

impl ReadyCheck {
    /// Marks the condition ready or not ready.
    pub fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Whether the condition is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

impl Readiness {
    /// Registers a condition named `name`, initially not ready, and returns
    /// the handle that sets it.
    pub fn check(&self, name: impl Into<String>) -> ReadyCheck {
        let check = ReadyCheck::default();
        self.lock().push((name.into(), check.clone()));
        check
    }

    /// Whether every registered condition is ready.
    pub fn is_ready(&self) -> bool {
        self.lock().iter().all(|(_, check)| check.is_ready())
    }

    /// The `/readyz` body: one `[+]name ok` or `[-]name not ready` line per
    /// check (only the failing ones unless `verbose`), then the verdict.
    fn report(&self, verbose: bool) -> (bool, String) {
        let checks = self.lock();
        let ready = checks.iter().all(|(_, check)| check.is_ready());
        let mut body = String::new();
        for (name, check) in checks.iter() {
            match check.is_ready() {
                true if verbose => body.push_str(&format!("[+]{name} ok\n")),
                true => {}
                false => body.push_str(&format!("[-]{name} not ready\n")),
            }
        }
        body.push_str(if ready {
            "ok\n"
        } else {
            "readyz check failed\n"
        });
        (ready, body)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, ReadyCheck)>> {
        // The list is only ever pushed to, so a poisoned lock still holds a
        // consistent list.
        self.checks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

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
    async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
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

/// Serves `endpoints` on `listener` (HTTP/1.1) until `shutdown` completes,
/// then closes the connections still open.
///
/// Errors of single connections are logged and do not stop the server.
pub async fn serve(
    listener: TcpListener,
    endpoints: Arc<Endpoints>,
    shutdown: impl Future<Output = ()>,
) {
    serve_with(listener, endpoints, None, shutdown).await;
}

/// Like [`serve`], over TLS when `tls` is given (see [`tls_acceptor`]).
pub async fn serve_with(
    listener: TcpListener,
    endpoints: Arc<Endpoints>,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    if let Ok(addr) = listener.local_addr() {
        let scheme = if tls.is_some() { "https" } else { "http" };
        info!(%addr, scheme, "serving /healthz, /readyz and /metrics");
    }
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let endpoints = endpoints.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            match tls {
                None => serve_connection(stream, endpoints, peer).await,
                // A client gets as long for its handshake as for its request head.
                Some(tls) => {
                    match tokio::time::timeout(HEADER_READ_TIMEOUT, tls.accept(stream)).await {
                        Ok(Ok(stream)) => serve_connection(stream, endpoints, peer).await,
                        Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake"),
                        Err(_) => debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    connections.shutdown().await;
}

async fn serve_connection(
    stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    endpoints: Arc<Endpoints>,
    peer: std::net::SocketAddr,
) {
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let endpoints = endpoints.clone();
        async move { Ok::<_, Infallible>(endpoints.handle(request).await) }
    });
    let result = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = result {
        debug!(%peer, error = %e, "serving a connection");
    }
}

/// A TLS acceptor serving the PEM certificate chain `cert` with the PEM
/// private key `key` (TLS 1.2 and 1.3, aws-lc-rs).
pub fn tls_acceptor(cert: &[u8], key: &[u8]) -> Result<TlsAcceptor, String> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the certificate is not PEM: {e}"))?;
    if chain.is_empty() {
        return Err("the certificate file holds no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|e| format!("the key is not a PEM private key: {e}"))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|e| format!("the certificate and key do not make a TLS configuration: {e}"))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Whether a sampled value is a counter or a gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleKind {
    /// Only ever grows; exposed as `NAME_total`.
    Counter,
    /// Goes up and down.
    Gauge,
}

type Read = Box<dyn Fn() -> u64 + Send + Sync>;

/// A metric whose value is read from elsewhere (an atomic, a channel) at
/// each scrape; register it with [`Registry::register_collector`].
pub struct Sampled {
    name: String,
    help: String,
    kind: SampleKind,
    read: Read,
}

impl Sampled {
    /// A metric `name` of `kind` described by `help`, whose value is `read()`.
    pub fn new(
        name: impl Into<String>,
        help: impl Into<String>,
        kind: SampleKind,
        read: impl Fn() -> u64 + Send + Sync + 'static,
    ) -> Self {
        Sampled {
            name: name.into(),
            help: help.into(),
            kind,
            read: Box::new(read),
        }
    }

    /// A gauge that is 1 while `flag` is set and 0 otherwise.
    pub fn flag(name: impl Into<String>, help: impl Into<String>, flag: Arc<AtomicBool>) -> Self {
        Self::new(name, help, SampleKind::Gauge, move || {
            u64::from(flag.load(Ordering::Relaxed))
        })
    }
}

impl fmt::Debug for Sampled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sampled")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .finish()
    }
}

impl Collector for Sampled {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let value = (self.read)();
        match self.kind {
            SampleKind::Counter => {
                let metric = ConstCounter::new(value);
                let out = encoder.encode_descriptor(
                    &self.name,
                    &self.help,
                    None,
                    metric.metric_type(),
                )?;
                metric.encode(out)
            }
            SampleKind::Gauge => {
                let metric = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
                let out = encoder.encode_descriptor(
                    &self.name,
                    &self.help,
                    None,
                    metric.metric_type(),
                )?;
                metric.encode(out)
            }
        }
    }
}

/// Registers `gkm_build_info{version="…"} 1` in `registry` (under its prefix).
pub fn register_build_info(registry: &mut Registry, component: &str, version: &str) {
    let labels = [
        ("component".to_string(), component.to_string()),
        ("version".to_string(), version.to_string()),
    ];
    registry.register(
        "build",
        "The component and its version",
        prometheus_client::metrics::info::Info::new(labels.to_vec()),
    );
}

/// Sets `check` once `api` answers a list: the apiserver is reachable, the
/// resource is served and this process may list it. Tries every 2 s, logging
/// what went wrong, until it succeeds.
pub async fn ready_when_listable<K>(api: kube::Api<K>, check: ReadyCheck)
where
    K: kube::Resource + Clone + fmt::Debug + serde::de::DeserializeOwned,
{
    let params = kube::api::ListParams::default().limit(1);
    let mut logged = false;
    loop {
        match api.list_metadata(&params).await {
            Ok(_) => {
                check.set(true);
                return;
            }
            Err(e) if !logged => {
                warn!(resource = %api.resource_url(), error = %e, "not ready: cannot list; retrying");
                logged = true;
            }
            Err(e) => debug!(resource = %api.resource_url(), error = %e, "not ready: cannot list"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Completes when the process gets SIGTERM (Kubernetes stopping the pod) or
/// SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            warn!(error = %e, "cannot watch SIGTERM; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Runs `work` until it finishes or the process gets SIGTERM/SIGINT; after a
/// signal, `work` (which may watch the signals itself, as kube-runtime
/// controllers do) gets `grace` to finish before it is dropped. Returns the
/// output when `work` finished.
pub async fn until_signal<T>(work: impl Future<Output = T>, grace: Duration) -> Option<T> {
    tokio::pin!(work);
    tokio::select! {
        output = &mut work => return Some(output),
        () = shutdown_signal() => info!(?grace, "stopping"),
    }
    match tokio::time::timeout(grace, work).await {
        Ok(output) => Some(output),
        Err(_) => {
            warn!(
                ?grace,
                "did not stop within the grace period; stopping anyway"
            );
            None
        }
    }
}

/// The endpoints server of a gkm daemon, running in the background.
pub struct EndpointServer {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl EndpointServer {
    /// Binds `addr` and serves `/healthz`, `/readyz` and `/metrics` from
    /// `registry` and `readiness` until [`EndpointServer::stop`].
    pub async fn start(
        addr: std::net::SocketAddr,
        registry: Registry,
        readiness: Readiness,
    ) -> std::io::Result<EndpointServer> {
        Self::start_endpoints(addr, Endpoints::new(registry, readiness), None).await
    }

    /// Binds `addr` and serves `endpoints` (over TLS when `tls` is given)
    /// until [`EndpointServer::stop`].
    pub async fn start_endpoints(
        addr: std::net::SocketAddr,
        endpoints: Endpoints,
        tls: Option<TlsAcceptor>,
    ) -> std::io::Result<EndpointServer> {
        let listener = TcpListener::bind(addr).await?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let endpoints = Arc::new(endpoints);
        let task = tokio::spawn(serve_with(listener, endpoints, tls, async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }));
        Ok(EndpointServer { stop, task })
    }

    /// Stops serving and waits for the server to finish.
    pub async fn stop(self) -> Result<(), tokio::task::JoinError> {
        let _ = self.stop.send(true);
        self.task.await
    }
}

/// Marks `readiness` ready for `gkmcaches` and `clustergkmcaches` once each
/// can be listed (in the background).
pub fn ready_when_caches_listable(client: &kube::Client, readiness: &Readiness) {
    tokio::spawn(ready_when_listable(
        kube::Api::<crate::crd::GKMCache>::all(client.clone()),
        readiness.check("gkmcaches"),
    ));
    tokio::spawn(ready_when_listable(
        kube::Api::<crate::crd::ClusterGKMCache>::all(client.clone()),
        readiness.check("clustergkmcaches"),
    ));
}
