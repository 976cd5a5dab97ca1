//! Serving [`Endpoints`] on a socket: plain HTTP/1.1 or TLS, in the
//! foreground ([`serve`], [`serve_with`]) or in the background
//! ([`EndpointServer`]).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
pub use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use super::endpoints::{Endpoints, HEADER_READ_TIMEOUT};
use super::readiness::Readiness;

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

/// A certificate, key or TLS configuration that cannot serve, with why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

impl TlsError {
    /// An error saying `message`.
    pub fn new(message: impl Into<String>) -> TlsError {
        TlsError(message.into())
    }
}

/// A TLS acceptor serving the PEM certificate chain `cert` with the PEM
/// private key `key` (TLS 1.2 and 1.3, aws-lc-rs), to any client.
pub fn tls_acceptor(cert: &[u8], key: &[u8]) -> Result<TlsAcceptor, TlsError> {
    acceptor(cert, key, None)
}

/// Like [`tls_acceptor`], for clients presenting a certificate that the PEM
/// CA certificates `client_ca` signed (mutual TLS): a client without one,
/// or with another CA's, fails the handshake and never sends a request.
pub fn mtls_acceptor(cert: &[u8], key: &[u8], client_ca: &[u8]) -> Result<TlsAcceptor, TlsError> {
    acceptor(cert, key, Some(client_ca))
}

fn acceptor(cert: &[u8], key: &[u8], client_ca: Option<&[u8]>) -> Result<TlsAcceptor, TlsError> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError(format!("the certificate is not PEM: {e}")))?;
    if chain.is_empty() {
        return Err(TlsError::new("the certificate file holds no certificate"));
    }
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|e| TlsError(format!("the key is not a PEM private key: {e}")))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("no TLS protocol version to serve: {e}")))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(client_ca) => builder.with_client_cert_verifier(client_verifier(client_ca)?),
    };
    let config = builder.with_single_cert(chain, key).map_err(|e| {
        TlsError(format!(
            "the certificate and key do not make a TLS configuration: {e}"
        ))
    })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A verifier of client certificates that the PEM CA certificates
/// `client_ca` signed: a client without one, or with another CA's, fails
/// the TLS handshake ([`mtls_acceptor`] and any server with a certificate
/// of its own use it).
pub fn client_verifier(
    client_ca: &[u8],
) -> Result<Arc<dyn tokio_rustls::rustls::server::danger::ClientCertVerifier>, TlsError> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::CertificateDer;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::server::WebPkiClientVerifier;

    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(client_ca) {
        let ca = ca.map_err(|e| TlsError(format!("the client CA is not PEM: {e}")))?;
        roots
            .add(ca)
            .map_err(|e| TlsError(format!("the client CA is not a usable certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(TlsError::new("the client CA file holds no certificate"));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| TlsError(format!("the client CA cannot verify clients: {e}")))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for localhost and its key, in PEM.
    fn self_signed() -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("a key");
        let params =
            rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("parameters");
        let cert = params.self_signed(&key).expect("a certificate");
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_client_ca_that_is_no_certificate_is_refused_by_name() {
        let (cert, key) = self_signed();
        let (ca, _) = self_signed();
        assert!(mtls_acceptor(cert.as_bytes(), key.as_bytes(), ca.as_bytes()).is_ok());
        let err = mtls_acceptor(cert.as_bytes(), key.as_bytes(), b"not a certificate")
            .err()
            .expect("no client CA");
        assert_eq!(err.to_string(), "the client CA file holds no certificate");
        let err = mtls_acceptor(cert.as_bytes(), key.as_bytes(), key.as_bytes())
            .err()
            .expect("a key is no CA");
        assert_eq!(err.to_string(), "the client CA file holds no certificate");
    }
}
