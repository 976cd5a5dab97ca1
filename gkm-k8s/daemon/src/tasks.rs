//! Work a daemon runs beside its async tasks: blocking filesystem work on
//! the runtime's blocking threads, and one object's work whose panic must
//! not stop the others.

use std::future::Future;

/// Work that panicked (or was cancelled), with what it was doing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Panicked(pub String);

/// Runs the blocking filesystem `work` on the runtime's blocking threads, so
/// it never holds up the async tasks; a panic in it becomes [`Panicked`]
/// saying `what` it was doing.
pub async fn blocking<T, E, F>(what: &str, work: F) -> Result<T, E>
where
    T: Send + 'static,
    E: From<Panicked> + Send + 'static,
    F: FnOnce() -> Result<T, E> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| E::from(Panicked(format!("{what}: {e}"))))?
}

/// `work`, with a panic turned into [`Panicked`]: one object's reconcile
/// (or one agent pass) can never stop the controller, and every other cache
/// with it.
pub async fn contained<T, E, F>(work: F) -> Result<T, E>
where
    E: From<Panicked>,
    F: Future<Output = Result<T, E>>,
{
    use futures::FutureExt as _;
    match std::panic::AssertUnwindSafe(work).catch_unwind().await {
        Ok(outcome) => outcome,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            Err(E::from(Panicked(what)))
        }
    }
}
