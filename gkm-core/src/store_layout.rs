//! Where a node's content-addressed store keeps each extracted cache:
//! `<root>/sha256/<hex>`. The writer (`gkm-oci`'s `Store`) and the readers
//! (the CSI driver, tools) share this one definition.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::digest::Digest;

/// The file in each entry, beside its cache tree and manifest, holding the
/// fingerprint its tree had when it was extracted (`gkm-oci`'s `seal`): an
/// entry without one is not delivered.
pub const SEAL_FILE: &str = "io.gkm.seal";

/// The directory of the store's root holding entries taken out of service
/// because their tree changed or was never sealed, until no pod mounts them.
pub const QUARANTINE_DIR: &str = "quarantine";

/// The read side of a node store: paths only, nothing created or changed.
///
/// ```
/// use gkm_core::{Digest, store_layout::StoreLayout};
/// let store = StoreLayout::new("/var/lib/gkm/store");
/// let digest = Digest::of(b"x");
/// assert_eq!(
///     store.path_of(&digest),
///     std::path::Path::new("/var/lib/gkm/store/sha256").join(digest.hex())
/// );
/// assert_eq!(store.get(&digest), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreLayout {
    root: PathBuf,
}

impl StoreLayout {
    /// The store rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> StoreLayout {
        StoreLayout { root: root.into() }
    }

    /// Creates the entries directory (and the root) if missing, readable by
    /// all whatever the umask: readers in other containers need the entries.
    pub fn create(&self) -> io::Result<()> {
        let dir = self.entries_dir();
        fs::create_dir_all(&dir)?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
    }

    /// The store's root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory holding every entry, `<root>/sha256`.
    pub fn entries_dir(&self) -> PathBuf {
        self.root.join("sha256")
    }

    /// Where `digest` is (or would be) stored.
    pub fn path_of(&self, digest: &Digest) -> PathBuf {
        self.entries_dir().join(digest.hex())
    }

    /// The stored tree of `digest`, if present.
    pub fn get(&self, digest: &Digest) -> Option<PathBuf> {
        let p = self.path_of(digest);
        p.is_dir().then_some(p)
    }

    /// Whether the stored entry at `entry` (a path [`StoreLayout::get`]
    /// gave) carries its seal.
    pub fn is_sealed(entry: &Path) -> bool {
        entry.join(SEAL_FILE).is_file()
    }

    /// Where quarantined entries wait until no pod mounts them.
    pub fn quarantine_dir(&self) -> PathBuf {
        self.root.join(QUARANTINE_DIR)
    }

    /// Every stored digest, sorted.
    pub fn list(&self) -> io::Result<Vec<Digest>> {
        let mut out: Vec<Digest> = fs::read_dir(self.entries_dir())?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().and_then(Digest::from_hex))
            .collect();
        out.sort();
        Ok(out)
    }
}
