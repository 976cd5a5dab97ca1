//! The crate's error type.

use std::path::PathBuf;

/// Everything that can stop GPU discovery or reading a simulated inventory.
///
/// Problems with one device (an unreadable file, a malformed value) do not
/// stop discovery: they become warnings in the [`crate::Inventory`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or directory could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// What was being read.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The sysfs root has no PCI bus to scan.
    #[error(
        "{path} is not a sysfs tree: it has no bus/pci/devices directory (pass the sysfs root, normally /sys)"
    )]
    NotSysfs {
        /// The directory given as sysfs root.
        path: PathBuf,
    },
    /// A simulated inventory file could not be parsed.
    #[error("invalid simulated inventory {path}: {message}")]
    Simulate {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the entry and field where known.
        message: String,
    },
    /// A simulated inventory names a profile gkm does not know.
    #[error("{path}: GPU entry {entry}: unknown profile {name:?}; known profiles: {known}")]
    UnknownProfile {
        /// The file.
        path: PathBuf,
        /// The entry's position in `gpus`, from 0.
        entry: usize,
        /// The name given.
        name: String,
        /// The profile names gkm knows, comma separated.
        known: String,
    },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
