//! The content-addressed node store: one read-only tree per image digest at
//! `<root>/sha256/<hex>`, made visible only when complete and sealed
//! ([`crate::store::seal`]); an entry whose tree changed is quarantined
//! ([`Store::quarantine`]) and extracted again.
//!
//! What it is built from, each also used on its own: the hardened tar
//! extractor ([`extract`], refusing a layer with a [`rejection`], its
//! headers bounded by [`tar_guard`]) streamed from the registry
//! ([`pipeline`]) within the disk limits ([`disk`]); the seal
//! ([`seal`]); extraction into a plain directory ([`unpack`]); and the same
//! rules applied to a tree on disk ([`tree_check`]).

pub mod disk;
pub(crate) mod extract;
pub(crate) mod pipeline;
pub(crate) mod rejection;
pub mod seal;
pub(crate) mod tar_guard;
pub mod tree_check;
pub(crate) mod unpack;

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::error::{Error, Result};
use crate::image::Image;
use crate::progress::{Progress, step};
use crate::registry::layout::tmp_name;
use crate::registry::repo::Repo;
use crate::store::disk::check_free_space;
use crate::store::extract::{ExtractPolicy, ExtractStats, Mapping};
use crate::store::pipeline::{extract_layers, sync_dir, sync_filesystem};
use crate::store::seal::SealCheck;
use gkm_core::digest::Digest;
use gkm_core::store_layout::StoreLayout;

/// A node's store of extracted caches.
///
/// Each entry is the image's whole layer (`io.triton.cache/…` and
/// `io.triton.manifest/manifest.json`, or the vLLM equivalents) under the
/// image digest. Extraction happens in `<root>/staging/`; entries appear by
/// one atomic rename. Staging leftovers of a killed process are removed when
/// the store is next opened.
#[derive(Debug, Clone)]
pub struct Store {
    layout: StoreLayout,
    durable: bool,
}

/// A cache in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The image digest.
    pub digest: Digest,
    /// Its directory, `<root>/sha256/<hex>`.
    pub path: PathBuf,
    /// What extraction wrote; `None` when it was already stored.
    pub extracted: Option<ExtractStats>,
}

/// An entry taken out of service ([`Store::quarantine`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// The image digest it held.
    pub digest: Digest,
    /// When it was taken out: pods that mounted the digest before then may
    /// still see it.
    pub since: SystemTime,
    /// Where it is, `<root>/quarantine/<hex>.<unix nanoseconds>`.
    pub path: PathBuf,
}

impl Quarantined {
    fn from_path(path: PathBuf) -> Option<Quarantined> {
        let name = path.file_name()?.to_str()?;
        let (hex, nanos) = name.split_once('.')?;
        let nanos: u64 = nanos.parse().ok()?;
        Some(Quarantined {
            digest: Digest::from_hex(hex)?,
            since: SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(nanos),
            path,
        })
    }
}

/// A staging directory and the lock that marks it in use.
struct Staging {
    dir: PathBuf,
    lock_path: PathBuf,
    _lock: File,
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
        let _ = fs::remove_file(&self.lock_path);
    }
}

impl Store {
    /// Open (creating if needed) the store at `root`, removing staging
    /// directories no live process holds.
    pub fn open(root: impl Into<PathBuf>) -> Result<Store> {
        let layout = StoreLayout::new(root);
        layout
            .create()
            .map_err(|e| Error::io(layout.entries_dir(), e))?;
        // Private, whatever the umask: only this process reads the staging.
        let staging = layout.root().join("staging");
        fs::create_dir_all(&staging).map_err(|e| Error::io(&staging, e))?;
        fs::set_permissions(&staging, fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io(&staging, e))?;
        let store = Store {
            layout,
            durable: true,
        };
        store.clean_staging()?;
        Ok(store)
    }

    /// Skip the `syncfs` before entries are renamed into place (tests and
    /// benchmarks; a crash may then leave an entry with lost data).
    pub fn with_durability(mut self, durable: bool) -> Store {
        self.durable = durable;
        self
    }

    /// Where this store keeps its entries, for readers.
    pub fn layout(&self) -> &StoreLayout {
        &self.layout
    }

    /// The store's root.
    pub fn root(&self) -> &Path {
        self.layout.root()
    }

    /// Where `digest` is (or would be) stored.
    pub fn path_of(&self, digest: &Digest) -> PathBuf {
        self.layout.path_of(digest)
    }

    /// The stored tree of `digest`, if present.
    pub fn get(&self, digest: &Digest) -> Option<PathBuf> {
        self.layout.get(digest)
    }

    /// The bytes the stored tree of `digest` takes, counted as the byte
    /// budget of [`ExtractPolicy::byte_budget`] counts them
    /// ([`crate::store::disk::tree_usage`]); `None` when it is not stored.
    pub fn usage(&self, digest: &Digest) -> Result<Option<u64>> {
        match self.get(digest) {
            Some(path) => crate::store::disk::tree_usage(&path).map(Some),
            None => Ok(None),
        }
    }

    /// Every stored digest.
    pub fn list(&self) -> Result<Vec<Digest>> {
        self.layout
            .list()
            .map_err(|e| Error::io(self.layout.entries_dir(), e))
    }

    fn clean_staging(&self) -> Result<()> {
        let staging = self.root().join("staging");
        let entries = fs::read_dir(&staging).map_err(|e| Error::io(&staging, e))?;
        for entry in entries.filter_map(|e| e.ok()) {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "lock") {
                continue;
            }
            let lock_path = path.with_extension("lock");
            let held = match OpenOptions::new().write(true).open(&lock_path) {
                Ok(f) => matches!(f.try_lock(), Err(fs::TryLockError::WouldBlock)),
                Err(_) => false,
            };
            if held {
                continue;
            }
            tracing::info!(path = %path.display(), "removing leftover staging directory");
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.map_err(|e| Error::io(&path, e))?;
            let _ = fs::remove_file(&lock_path);
        }
        // Lock files whose directory is gone.
        let entries = fs::read_dir(&staging).map_err(|e| Error::io(&staging, e))?;
        for entry in entries.filter_map(|e| e.ok()) {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "lock")
                && !path.with_extension("").exists()
                && let Ok(f) = File::open(&path)
                && f.try_lock().is_ok()
            {
                let _ = fs::remove_file(&path);
            }
        }
        Ok(())
    }

    fn staging(&self, digest: &Digest) -> Result<Staging> {
        let name = tmp_name(&format!("{}-", &digest.hex()[..12]));
        let dir = self.root().join("staging").join(&name);
        let lock_path = dir.with_extension("lock");
        let lock = File::create(&lock_path).map_err(|e| Error::io(&lock_path, e))?;
        lock.lock().map_err(|e| Error::io(&lock_path, e))?;
        // Private while it is being filled.
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Error::io(&dir, e))?;
        Ok(Staging {
            dir,
            lock_path,
            _lock: lock,
        })
    }

    /// Make sure the image `repo` names is stored. A reference pinned by a
    /// stored digest does no network work; otherwise the manifest and the
    /// layer are read, and the config only when the manifest's annotations
    /// lack the cache labels ([`Image::fetch_annotated`]).
    pub async fn ensure(
        &self,
        repo: &Repo,
        policy: &ExtractPolicy,
        progress: Option<Progress>,
    ) -> Result<Stored> {
        if let Some(digest) = repo.image().pinned_digest()
            && let Some(path) = self.get(&digest)
        {
            return Ok(Stored {
                digest,
                path,
                extracted: None,
            });
        }
        let image = Image::fetch_annotated(repo).await?;
        self.ensure_image(repo, &image, policy, progress).await
    }

    /// Make sure `image` (read from `repo`) is stored.
    pub async fn ensure_image(
        &self,
        repo: &Repo,
        image: &Image,
        policy: &ExtractPolicy,
        progress: Option<Progress>,
    ) -> Result<Stored> {
        let digest = image.digest.clone();
        if let Some(path) = self.get(&digest) {
            return Ok(Stored {
                digest,
                path,
                extracted: None,
            });
        }
        let layers = image.cache_layers()?.to_vec();
        check_free_space(
            &self.root().join("staging"),
            image,
            policy.byte_budget,
            policy.free_space_reserve,
        )?;
        let staging = self.staging(&digest)?;
        let mut stats = extract_layers(
            repo,
            &layers,
            &staging.dir,
            Mapping::Layer,
            policy,
            progress.clone(),
        )
        .await?;
        step(progress.as_ref(), "storing the tree", None);
        let final_path = self.path_of(&digest);
        let dir = staging.dir.clone();
        let durable = self.durable;
        let sha_dir = self.root().join("sha256");
        let seal_bytes = tokio::task::spawn_blocking(move || -> Result<u64> {
            // Sealed before it is visible: an entry without a seal is never
            // delivered.
            crate::store::seal::seal(&dir).map_err(|e| Error::io(&dir, e))?;
            let seal_path = dir.join(crate::store::seal::SEAL_FILE);
            let seal_bytes = fs::metadata(&seal_path)
                .map_err(|e| Error::io(&seal_path, e))?
                .len();
            if durable {
                sync_filesystem(&dir)?;
            }
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
                .map_err(|e| Error::io(&dir, e))?;
            match fs::rename(&dir, &final_path) {
                Ok(()) => {}
                // Another extraction of the same digest won: same content.
                Err(e)
                    if final_path.is_dir()
                        && matches!(
                            e.kind(),
                            io::ErrorKind::AlreadyExists | io::ErrorKind::DirectoryNotEmpty
                        ) => {}
                Err(e) => return Err(Error::io(&final_path, e)),
            }
            if durable {
                sync_dir(&sha_dir)?;
            }
            Ok(seal_bytes)
        })
        .await??;
        // The seal takes its block in the store like any file, as
        // [`Store::usage`] counts it.
        stats.disk_bytes += crate::store::disk::blocks(seal_bytes);
        drop(staging);
        Ok(Stored {
            path: self.path_of(&digest),
            digest,
            extracted: Some(stats),
        })
    }

    /// Remove every stored digest not in `referenced`; returns what was
    /// removed. Each entry disappears atomically, as [`Store::remove`] does.
    ///
    /// It lists the store itself, so while another task extracts into the
    /// same store, a digest whose extraction ends between the caller's
    /// decision and this call is removed too. A long-running owner of a
    /// store (gkm's agent) decides from one listing and calls
    /// [`Store::remove`] per digest instead.
    pub fn gc(&self, referenced: &HashSet<Digest>) -> Result<Vec<Digest>> {
        let mut removed = Vec::new();
        for digest in self.list()? {
            if !referenced.contains(&digest) && self.remove(&digest)? {
                removed.push(digest);
            }
        }
        Ok(removed)
    }

    /// Whether the stored tree of `digest` is still the one extracted
    /// ([`crate::store::seal::check`]); `None` when it is not stored.
    pub fn check_seal(&self, digest: &Digest) -> Option<SealCheck> {
        self.get(digest)
            .map(|path| crate::store::seal::check(&path))
    }

    /// Takes the stored `digest` out of service: its entry is renamed into
    /// the quarantine directory at once (a pod that mounts it keeps what it
    /// sees), so the digest is no longer stored and is extracted afresh when
    /// needed. [`Store::quarantined`] lists it until
    /// [`Store::remove_quarantined`] removes it. Returns where it went, or
    /// `None` when it was not stored.
    pub fn quarantine(&self, digest: &Digest) -> Result<Option<Quarantined>> {
        let from = self.path_of(digest);
        if !from.is_dir() {
            return Ok(None);
        }
        let dir = self.layout.quarantine_dir();
        fs::DirBuilder::new()
            .mode(0o755)
            .recursive(true)
            .create(&dir)
            .map_err(|e| Error::io(&dir, e))?;
        let since = SystemTime::now();
        let nanos = since
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let to = dir.join(format!("{}.{nanos}", digest.hex()));
        match fs::rename(&from, &to) {
            Ok(()) => Ok(Some(Quarantined {
                digest: digest.clone(),
                since,
                path: to,
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(&from, e)),
        }
    }

    /// Every quarantined entry, oldest first.
    pub fn quarantined(&self) -> Result<Vec<Quarantined>> {
        let dir = self.layout.quarantine_dir();
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(&dir, e)),
        };
        let mut out: Vec<Quarantined> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| Quarantined::from_path(e.path()))
            .collect();
        out.sort_by_key(|q| q.since);
        Ok(out)
    }

    /// Removes a quarantined entry (once no pod mounts it).
    pub fn remove_quarantined(&self, entry: &Quarantined) -> Result<()> {
        match fs::remove_dir_all(&entry.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(Error::io(&entry.path, e)),
            _ => Ok(()),
        }
    }

    /// Remove the stored `digest`: it disappears atomically (renamed into
    /// staging, then deleted). Returns whether it was stored.
    pub fn remove(&self, digest: &Digest) -> Result<bool> {
        let from = self.path_of(digest);
        if !from.is_dir() {
            return Ok(false);
        }
        let staging = self.staging(digest)?;
        // The staging directory exists and is empty; rename replaces it.
        match fs::rename(&from, &staging.dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io(&from, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarantined_entry_is_no_longer_stored_and_waits_until_removed() {
        let root = tempfile::tempdir().expect("tempdir");
        let store = Store::open(root.path()).expect("store");
        let digest = Digest::of(b"cache");
        let entry = store.path_of(&digest);
        fs::create_dir_all(entry.join("io.triton.cache/KEY")).expect("tree");
        assert_eq!(store.check_seal(&digest), Some(SealCheck::Missing));

        let taken = store
            .quarantine(&digest)
            .expect("quarantine")
            .expect("it was stored");
        assert_eq!(store.get(&digest), None, "no longer stored");
        assert!(
            taken.path.join("io.triton.cache/KEY").is_dir(),
            "kept whole"
        );
        assert_eq!(store.quarantined().expect("list"), vec![taken.clone()]);
        assert_eq!(store.quarantine(&digest).expect("again"), None);

        store.remove_quarantined(&taken).expect("remove");
        assert!(!taken.path.exists());
        assert_eq!(store.quarantined().expect("list"), Vec::new());
        // Anything else in the quarantine directory is left alone.
        fs::write(store.layout().quarantine_dir().join("notes"), b"").expect("write");
        assert_eq!(store.quarantined().expect("list"), Vec::new());
    }
}
