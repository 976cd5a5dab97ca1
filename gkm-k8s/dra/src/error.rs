//! What can stop the DRA plugin.

use std::path::PathBuf;

/// Why the DRA plugin could not run, or could not keep a claim's state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The node's devices could not be read.
    #[error("GPU discovery: {0}")]
    Gpu(#[from] gkm_gpu::Error),
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The prepared-claims checkpoint is not one this plugin wrote.
    #[error("{path}: not a prepared-claims checkpoint: {source}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        source: serde_json::Error,
    },
    /// The prepared-claims checkpoint is of a format this plugin does not
    /// know (written by a newer one).
    #[error(
        "{path}: prepared-claims checkpoint version {found}, this plugin reads version {known}"
    )]
    CheckpointVersion {
        /// The file.
        path: PathBuf,
        /// The version it has.
        found: u32,
        /// The version this plugin reads.
        known: u32,
    },
    /// A socket could not be served.
    #[error(transparent)]
    Socket(#[from] gkm_k8s_kubelet::socket::SocketError),
    /// The apiserver refused or could not be reached.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The client's error.
        source: kube::Error,
    },
}

impl Error {
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |source| Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Api { what, source }
    }
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
