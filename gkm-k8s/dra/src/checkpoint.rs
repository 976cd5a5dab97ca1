//! Prepared claims on disk, so preparing is idempotent across kubelet and
//! plugin restarts: the checkpoint (`<state dir>/prepared-claims.json`)
//! lists every claim prepared and not yet unprepared, with its CDI spec;
//! each spec is also a file in the CDI spec directory. Every file is
//! written whole or not at all (a temporary file, fsync, rename, fsync of
//! the directory).
//!
//! Its device metadata files ([`crate::metadata`]) live under
//! `<state dir>/dra-device-metadata/`.
//!
//! Order: a claim's metadata files and spec file are written before the
//! checkpoint names it, and removed before the checkpoint forgets it. On
//! open, the files of claims the checkpoint names are rewritten if
//! missing, and spec files and metadata directories of claims it does not
//! name (left by a crash between the writes) are removed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cdi;
use crate::error::{Error, Result};
use crate::metadata;
use crate::prepare::PreparedClaim;

/// The checkpoint's file name in the state directory.
pub const CHECKPOINT_FILE: &str = "prepared-claims.json";

/// The checkpoint's format version.
const VERSION: u32 = 1;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Checkpoint {
    version: u32,
    /// Claim UID → what was prepared.
    claims: BTreeMap<String, PreparedClaim>,
}

/// The prepared claims, kept on disk.
#[derive(Debug)]
pub struct ClaimStore {
    checkpoint: PathBuf,
    cdi_dir: PathBuf,
    metadata_dir: PathBuf,
    claims: BTreeMap<String, PreparedClaim>,
}

impl ClaimStore {
    /// Opens the store in `state_dir` (created if missing), writing specs to
    /// `cdi_dir`, and puts the spec directory in line with the checkpoint.
    pub fn open(state_dir: &Path, cdi_dir: &Path) -> Result<ClaimStore> {
        for dir in [state_dir, cdi_dir] {
            std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
        }
        let checkpoint = state_dir.join(CHECKPOINT_FILE);
        let claims = match std::fs::read(&checkpoint) {
            Ok(bytes) => {
                let read: Checkpoint =
                    serde_json::from_slice(&bytes).map_err(|source| Error::Checkpoint {
                        path: checkpoint.clone(),
                        source,
                    })?;
                if read.version != VERSION {
                    return Err(Error::CheckpointVersion {
                        path: checkpoint,
                        found: read.version,
                        known: VERSION,
                    });
                }
                read.claims
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(Error::io(&checkpoint)(e)),
        };
        let store = ClaimStore {
            checkpoint,
            cdi_dir: cdi_dir.to_path_buf(),
            metadata_dir: state_dir.join(metadata::HOST_SUBDIR),
            claims,
        };
        store.reconcile_specs()?;
        Ok(store)
    }

    /// Where device metadata files go
    /// (`<state dir>/dra-device-metadata`).
    pub fn metadata_dir(&self) -> &Path {
        &self.metadata_dir
    }

    /// What was prepared for claim `uid`.
    pub fn get(&self, uid: &str) -> Option<&PreparedClaim> {
        self.claims.get(uid)
    }

    /// The UIDs of the prepared claims.
    #[cfg(test)]
    pub fn uids(&self) -> impl Iterator<Item = &str> {
        self.claims.keys().map(String::as_str)
    }

    /// Records claim `uid` as prepared: its spec file, then the checkpoint.
    pub fn insert(&mut self, uid: &str, claim: PreparedClaim) -> Result<()> {
        let written = self
            .write_metadata(&claim)
            .and_then(|()| self.write_spec(uid, &claim));
        if let Err(e) = written {
            // Nothing half-done is left: the claim is prepared again.
            let _ = self.remove_metadata(&claim);
            return Err(e);
        }
        self.claims.insert(uid.to_string(), claim);
        if let Err(e) = self.save() {
            if let Some(claim) = self.claims.remove(uid) {
                let _ = self.remove_metadata(&claim);
            }
            let _ = std::fs::remove_file(self.spec_path(uid));
            return Err(e);
        }
        Ok(())
    }

    /// Forgets claim `uid`: its spec file, then the checkpoint. A claim not
    /// prepared here is fine (unpreparing is idempotent).
    pub fn remove(&mut self, uid: &str) -> Result<()> {
        let spec = self.spec_path(uid);
        match std::fs::remove_file(&spec) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&spec)(e)),
        }
        if let Some(claim) = self.claims.get(uid) {
            self.remove_metadata(claim)?;
        }
        if let Some(claim) = self.claims.remove(uid)
            && let Err(e) = self.save()
        {
            self.claims.insert(uid.to_string(), claim);
            return Err(e);
        }
        Ok(())
    }

    fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_dir.join(cdi::spec_file_name(uid))
    }

    fn write_spec(&self, uid: &str, claim: &PreparedClaim) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(&claim.spec).map_err(|source| Error::Checkpoint {
            path: self.spec_path(uid),
            source,
        })?;
        write_atomically(&self.spec_path(uid), &bytes)
    }

    fn write_metadata(&self, claim: &PreparedClaim) -> Result<()> {
        for file in &claim.metadata {
            let bytes = file.bytes().map_err(|source| Error::Checkpoint {
                path: file.host_path.clone(),
                source,
            })?;
            if let Some(dir) = file.host_path.parent() {
                std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
            }
            write_atomically(&file.host_path, &bytes)?;
        }
        Ok(())
    }

    /// Removes claim `claim`'s metadata directory (fine when missing).
    fn remove_metadata(&self, claim: &PreparedClaim) -> Result<()> {
        let dir = metadata::claim_dir(&self.metadata_dir, &claim.namespace, &claim.name);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&dir)(e)),
        }
    }

    fn save(&self) -> Result<()> {
        let checkpoint = Checkpoint {
            version: VERSION,
            claims: self.claims.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&checkpoint).map_err(|source| Error::Checkpoint {
            path: self.checkpoint.clone(),
            source,
        })?;
        write_atomically(&self.checkpoint, &bytes)
    }

    /// Rewrites missing specs and metadata files of prepared claims;
    /// removes this driver's specs and metadata of claims not prepared.
    fn reconcile_specs(&self) -> Result<()> {
        for (uid, claim) in &self.claims {
            if claim.metadata.iter().any(|f| !f.host_path.exists()) {
                tracing::info!(claim = %uid, "rewriting the missing metadata files of a prepared claim");
                self.write_metadata(claim)?;
            }
            if !self.spec_path(uid).exists() {
                tracing::info!(claim = %uid, "rewriting the missing CDI spec of a prepared claim");
                self.write_spec(uid, claim)?;
            }
        }
        let entries = std::fs::read_dir(&self.cdi_dir).map_err(Error::io(&self.cdi_dir))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(uid) = name.to_str().and_then(cdi::claim_of_spec_file) else {
                continue;
            };
            if !self.claims.contains_key(uid) {
                tracing::info!(claim = %uid, "removing the CDI spec of a claim not prepared");
                let path = entry.path();
                std::fs::remove_file(&path).map_err(Error::io(&path))?;
            }
        }
        let kept: Vec<PathBuf> = self
            .claims
            .values()
            .map(|c| metadata::claim_dir(&self.metadata_dir, &c.namespace, &c.name))
            .collect();
        if let Ok(entries) = std::fs::read_dir(&self.metadata_dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                if !kept.contains(&path) {
                    tracing::info!(dir = %path.display(), "removing the metadata of a claim not prepared");
                    std::fs::remove_dir_all(&path).map_err(Error::io(&path))?;
                }
            }
        }
        Ok(())
    }
}

/// Writes `path` whole or not at all: a temporary file beside it, synced,
/// renamed over it, and the directory synced.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(path)(e));
    }
    Ok(())
}
