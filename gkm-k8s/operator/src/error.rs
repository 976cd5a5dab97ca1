//! What can go wrong in the operator's reconciles.

use gkm_k8s_runtime::tasks::Panicked;

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An apiserver request failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An image could not be resolved, read or verified.
    #[error(transparent)]
    Oci(#[from] gkm_oci::Error),
    /// A cache's spec cannot be acted on.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    /// Deletion waits for nodes still using or reporting the cache.
    #[error("waiting for nodes: {0}")]
    WaitingForNodes(String),
    /// A watch the reconcile reads from has not listed yet.
    #[error("not watched yet: {0}")]
    NotWatched(String),
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
}

impl From<Panicked> for Error {
    fn from(p: Panicked) -> Error {
        Error::Panicked(p.0)
    }
}

/// The operator's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
