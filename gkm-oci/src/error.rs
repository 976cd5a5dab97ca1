//! The one error type of this crate.

use std::path::PathBuf;

use crate::store::rejection::Rejection;

/// Everything that can go wrong building, moving, reading or extracting an
/// image.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An image reference could not be parsed.
    #[error("invalid image reference {input:?}: {reason}")]
    Reference {
        /// What was given.
        input: String,
        /// What was wrong with it.
        reason: String,
    },
    /// The registry refused or failed a request.
    #[error("registry {reference}: {source}")]
    Registry {
        /// The image being accessed.
        reference: String,
        /// The client's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// An image, tag or blob does not exist.
    #[error("{what} not found in {location}")]
    NotFound {
        /// What was looked for (a tag, a digest).
        what: String,
        /// Where (a registry reference or a layout path).
        location: String,
    },
    /// Content did not hash to the digest that named it.
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        /// The blob or manifest.
        what: String,
        /// The digest it was named by.
        expected: String,
        /// The digest of what arrived.
        actual: String,
    },
    /// A manifest, index, config or label is not what gkm reads.
    #[error("invalid {what}: {reason}")]
    Format {
        /// Which document.
        what: String,
        /// What was wrong.
        reason: String,
    },
    /// The cache directory could not be scanned.
    #[error(transparent)]
    Cache(#[from] gkm_core::cache::CacheError),
    /// The directory to build from is not something gkm can package.
    #[error("{path}: {reason}")]
    Unpackable {
        /// The offending file.
        path: PathBuf,
        /// Why it cannot be packaged.
        reason: String,
    },
    /// The layer broke the extraction policy; nothing was kept.
    #[error("{0}")]
    Rejected(#[from] Rejection),
    /// The destination is not usable (for example a non-empty directory).
    #[error("{path}: {reason}")]
    Destination {
        /// The destination.
        path: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
    /// A registry host file (`hosts.toml`) cannot be used.
    #[error("{path}: {reason}")]
    HostsConfig {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The reference names a multi-target image where one variant must be
    /// read: the caller chooses it ([`crate::MultiTarget`]).
    #[error(
        "{location} is a multi-target image of {variants} variant(s): read one by its digest, or choose one for GPUs"
    )]
    MultiTarget {
        /// The image.
        location: String,
        /// How many variants it lists.
        variants: usize,
    },
    /// A background task panicked or was cancelled.
    #[error("background task failed: {0}")]
    Task(String),
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// A malformed document.
    pub(crate) fn format(what: impl Into<String>, reason: impl std::fmt::Display) -> Error {
        Error::Format {
            what: what.into(),
            reason: reason.to_string(),
        }
    }

    /// A registry error for `reference`.
    pub(crate) fn registry(
        reference: impl std::fmt::Display,
        source: oci_client::errors::OciDistributionError,
    ) -> Error {
        Error::Registry {
            reference: reference.to_string(),
            source: Box::new(source),
        }
    }
}

impl From<gkm_core::digest::InvalidDigest> for Error {
    fn from(e: gkm_core::digest::InvalidDigest) -> Error {
        Error::Reference {
            input: e.input,
            reason: e.reason.to_string(),
        }
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Error {
        Error::Task(e.to_string())
    }
}
