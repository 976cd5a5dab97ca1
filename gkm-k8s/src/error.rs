//! The error type of gkm-k8s.

/// What can go wrong in the controllers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An apiserver request failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An image could not be resolved, read or extracted.
    #[error(transparent)]
    Oci(#[from] gkm_oci::Error),
    /// GPU discovery failed.
    #[error("GPU discovery: {0}")]
    Gpu(String),
    /// A cache's spec cannot be acted on.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    /// Deletion waits for nodes still using or reporting the cache.
    #[error("waiting for nodes: {0}")]
    WaitingForNodes(String),
    /// A finalizer operation failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// A local file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Reconciling one object panicked; the others go on.
    #[error("reconcile panicked: {0}")]
    Panicked(String),
    /// A serialisation failed.
    #[error("serialisation: {0}")]
    Json(#[from] serde_json::Error),
    /// The kubelet's pod-resources API could not be asked.
    #[error("kubelet pod-resources API at {socket}: {message}")]
    PodResources {
        /// The kubelet's socket.
        socket: std::path::PathBuf,
        /// What went wrong.
        message: String,
    },
}

impl Error {
    /// Whether the apiserver answered that the object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(s)) if s.code == 404)
    }
}

/// gkm-k8s's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs the blocking filesystem `work` on the runtime's blocking threads, so
/// it never holds up the async tasks; a panic in it becomes
/// [`Error::Panicked`] saying `what` it was doing.
pub(crate) async fn blocking<T, F>(what: &str, work: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Panicked(format!("{what}: {e}")))?
}

/// `work`, with a panic turned into [`Error::Panicked`]: one object's
/// reconcile (or one agent pass) can never stop the controller, and every
/// other cache with it.
pub(crate) async fn contained<T, F>(work: F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
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
            Err(Error::Panicked(what))
        }
    }
}
