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
    /// Some of the node's reports could not be written (the others were).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Reports(Vec<crate::reports::ReportFailure>),
}

impl From<Panicked> for Error {
    fn from(p: Panicked) -> Error {
        Error::Panicked(p.0)
    }
}

/// The cause the apiserver gives for refusing new objects in a namespace
/// being terminated (`v1.NamespaceTerminatingCause`).
const NAMESPACE_TERMINATING_CAUSE: &str = "NamespaceTerminating";

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

    /// How long the apiserver asked to wait when it throttled the request
    /// (`429 Too Many Requests`; zero when it named no time); `None` when
    /// it did not throttle. For failed reports, the longest any asked.
    pub fn throttled(&self) -> Option<std::time::Duration> {
        match self {
            Error::Kube(kube::Error::Api(status)) if status.code == 429 => {
                let seconds = status.details.as_ref().map_or(0, |d| d.retry_after_seconds);
                Some(std::time::Duration::from_secs(seconds.into()))
            }
            Error::Reports(failures) => failures.iter().filter_map(|f| f.error.throttled()).max(),
            _ => None,
        }
    }

    /// Whether the apiserver refused to create an object because its
    /// namespace is being terminated.
    pub fn is_namespace_terminating(&self) -> bool {
        let Error::Kube(kube::Error::Api(status)) = self else {
            return false;
        };
        status.code == 403
            && status.details.as_ref().is_some_and(|d| {
                d.causes
                    .iter()
                    .any(|c| c.reason == NAMESPACE_TERMINATING_CAUSE)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::{Status, response::StatusCause, response::StatusDetails};

    fn refused(code: u16, cause: &str) -> Error {
        let status = Status {
            code,
            details: Some(StatusDetails {
                causes: vec![StatusCause {
                    reason: cause.into(),
                    message: "namespace ns is being terminated".into(),
                    field: "metadata.namespace".into(),
                }],
                name: "node-a".into(),
                group: "gkm.io".into(),
                kind: "gkmcachenodes".into(),
                uid: String::new(),
                retry_after_seconds: 0,
            }),
            ..Status::default()
        };
        Error::Kube(kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn only_the_apiservers_terminating_cause_marks_a_namespace_terminating() {
        assert!(refused(403, "NamespaceTerminating").is_namespace_terminating());
        assert!(!refused(403, "FieldValueForbidden").is_namespace_terminating());
        assert!(!refused(404, "NamespaceTerminating").is_namespace_terminating());
        assert!(!Error::Gpu("x".into()).is_namespace_terminating());
    }
}
