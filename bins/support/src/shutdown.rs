//! Stopping on SIGTERM (Kubernetes stopping the pod) or SIGINT (Ctrl-C), with
//! a grace period for the work in flight.

use std::future::Future;
use std::time::Duration;

use tracing::{info, warn};

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
