//! What can go wrong in the agent.

use gkm_k8s_runtime::tasks::Panicked;

/// Why an agent pass (or the agent) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An apiserver request failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An image could not be resolved, read or extracted.
    #[error(transparent)]
    Oci(#[from] gkm_oci::Error),
    /// A node file (delivery index, mount records) could not be used.
    #[error(transparent)]
    NodeFiles(#[from] gkm_k8s_node::Error),
    /// GPU discovery failed.
    #[error("GPU discovery: {0}")]
    Gpu(String),
    /// A cache's spec cannot be acted on.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    /// A watch the agent depends on stopped.
    #[error("watch stopped: {0}")]
    Watch(String),
    /// A local file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A pass panicked; the next one runs.
    #[error("panicked: {0}")]
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

/// The agent's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// [`gkm_k8s_runtime::tasks::blocking`] with this crate's error.
pub(crate) async fn blocking<T, F>(what: &str, work: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    gkm_k8s_runtime::tasks::blocking(what, work).await
}

impl Error {
    /// Whether the apiserver answered that the object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(s)) if s.code == 404)
    }
}
