//! What can go wrong reading or writing the node files.

use std::path::PathBuf;

/// A node file could not be read or written, or a name cannot become a path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file operation failed, or a file holds what gkm does not read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A cache or namespace name is not a Kubernetes object name, so it
    /// cannot name a file.
    #[error("invalid name: {0}")]
    InvalidName(String),
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
