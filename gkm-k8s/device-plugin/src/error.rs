//! What can stop the device plugin.

use std::path::PathBuf;

/// Why the device plugin could not run or register.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The node's devices could not be read.
    #[error("GPU discovery: {0}")]
    Gpu(String),
    /// A socket or file could not be used, or the kubelet refused.
    #[error("{path}: {source}")]
    Io {
        /// The socket or file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
