//! What a pod compiled into its writable view, counted when the view goes:
//! the walk of its upper ([`walk_upper`]), bounded, the account the
//! driver records and counts ([`Views::account_ended_view`]), and the
//! entries the delivered tree holds, counted by the same rules
//! ([`DeliveredEntries`]).
//!
//! Counting never fails an unpublish: a tree that cannot be read is
//! logged and left uncounted. What counts as a new entry or as scratch is
//! the cache kind's ([`gkm_core::usage`]).
//!
//! [`Views::account_ended_view`]: super::Views::account_ended_view

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use gkm_core::Digest;
use gkm_core::cache::CacheKind;
use gkm_core::explain::{Keyed, explain, keyed_entries};
use gkm_core::usage::{Walked, Written, account, descends};

/// The most entries of an upper walked; what lies beyond is not counted
/// (an upper holds at most the tmpfs' inodes, 1 Mi by default).
pub const MAX_WALKED: usize = 100_000;

/// The regular files and directories of `upper`, below it, `/`-separated,
/// not descending into `kind`'s scratch directories; at most
/// [`MAX_WALKED`] entries. Links and special files are left out (a
/// capture refuses them; here they are simply not entries).
pub fn walk_upper(upper: &Path, kind: CacheKind) -> io::Result<Vec<Walked>> {
    let mut out = Vec::new();
    let mut dirs = vec![String::new()];
    while let Some(rel) = dirs.pop() {
        let dir = if rel.is_empty() {
            upper.to_path_buf()
        } else {
            upper.join(&rel)
        };
        for entry in fs::read_dir(&dir)? {
            if out.len() >= MAX_WALKED {
                return Ok(out);
            }
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let meta = entry.metadata()?;
            if meta.is_dir() {
                if descends(kind, &path) {
                    dirs.push(path.clone());
                }
                out.push(Walked::Dir(path));
            } else if meta.is_file() {
                out.push(Walked::File(Written {
                    path,
                    bytes: meta.len(),
                }));
            }
        }
    }
    Ok(out)
}

/// What the driver knows of each stored digest's tree, read once per
/// digest and kept (a digest's tree never changes): the entries it holds,
/// by its kind's rules (the rules that count a pod's new entries, applied
/// to the delivered tree), which a pod's misses are compared with; and,
/// once a pod missed, its entries' keys, which explain why
/// ([`gkm_core::explain`]). A tree that cannot be read is logged and not
/// counted.
#[derive(Debug, Default)]
pub struct DeliveredEntries {
    counted: Mutex<HashMap<Digest, u64>>,
    keyed: Mutex<HashMap<Digest, Arc<Vec<Keyed>>>>,
}

/// The most reasons a usage record keeps for its pod's misses.
pub const MAX_REASONS: usize = 3;

impl DeliveredEntries {
    /// The entries `tree`, the tree of `digest` (the layer directory of
    /// `kind` in its store entry), holds, counted now when not yet known.
    pub fn of(&self, digest: &Digest, tree: &Path, kind: CacheKind) -> Option<u64> {
        if let Some(known) = locked(&self.counted).get(digest) {
            return Some(*known);
        }
        match walk_upper(tree, kind) {
            Ok(walked) => {
                let entries = account(kind, &walked).new_entries;
                locked(&self.counted).insert(digest.clone(), entries);
                Some(entries)
            }
            Err(e) => {
                tracing::warn!(tree = %tree.display(), error = %e, "could not count the delivered tree's entries");
                None
            }
        }
    }

    /// Why the new entries a pod wrote into `upper` missed `tree`, the
    /// tree of `digest`: the first [`MAX_REASONS`] distinct sentences of
    /// [`gkm_core::explain`]. Empty when either tree cannot be read as a
    /// cache (logged).
    pub fn reasons(&self, digest: &Digest, tree: &Path, upper: &Path) -> Vec<String> {
        let delivered = match self.keyed(digest, tree) {
            Ok(keyed) => keyed,
            Err(e) => {
                tracing::warn!(digest = %digest, error = %e, "could not read the delivered tree's keys");
                return Vec::new();
            }
        };
        match keyed_entries(upper) {
            Ok(workload) => explain(&delivered, &workload).reasons(MAX_REASONS),
            Err(e) => {
                tracing::debug!(upper = %upper.display(), error = %e, "the pod's new entries are not a tree explain reads");
                Vec::new()
            }
        }
    }

    /// The delivered tree's entries with their keys' fields, read now when
    /// not yet known.
    fn keyed(&self, digest: &Digest, tree: &Path) -> Result<Arc<Vec<Keyed>>, String> {
        if let Some(known) = locked(&self.keyed).get(digest) {
            return Ok(known.clone());
        }
        let keyed = Arc::new(keyed_entries(tree).map_err(|e| e.to_string())?);
        locked(&self.keyed).insert(digest.clone(), keyed.clone());
        Ok(keyed)
    }
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upper_walk_counts_new_kernels_and_not_the_scratch_below_a_lock_dir() {
        let upper = tempfile::tempdir().unwrap();
        let root = upper.path();
        fs::create_dir_all(root.join("KEY")).unwrap();
        fs::write(root.join("KEY/add_kernel.json"), "{}").unwrap();
        fs::write(root.join("KEY/add_kernel.cubin"), "cubin").unwrap();
        fs::create_dir_all(root.join("locks/deep")).unwrap();
        fs::write(root.join("locks/deep/a.lock"), "").unwrap();
        let walked = walk_upper(root, CacheKind::Inductor).unwrap();
        assert!(
            !walked
                .iter()
                .any(|w| matches!(w, Walked::File(f) if f.path.starts_with("locks/"))),
            "{walked:?}"
        );
        let usage = account(CacheKind::Inductor, &walked);
        assert_eq!((usage.new_entries, usage.scratch), (1, 1));
        assert_eq!(usage.named[0].name.as_deref(), Some("add_kernel"));
    }

    #[test]
    fn a_delivered_trees_entries_are_counted_once_by_the_kinds_rules() {
        let entry = tempfile::tempdir().unwrap();
        let tree = entry.path().join(gkm_core::image_layout::TRITON.cache_dir);
        for key in ["KEY1", "KEY2"] {
            fs::create_dir_all(tree.join(key)).unwrap();
            fs::write(tree.join(key).join("add_kernel.json"), "{}").unwrap();
            fs::write(tree.join(key).join("add_kernel.cubin"), "cubin").unwrap();
        }
        let digest: Digest = format!("sha256:{}", "1".repeat(64)).parse().unwrap();
        let delivered = DeliveredEntries::default();
        assert_eq!(delivered.of(&digest, &tree, CacheKind::Triton), Some(2));
        // Kept: a later change to the directory (there is none in a store)
        // is not walked again.
        fs::remove_dir_all(tree.join("KEY1")).unwrap();
        assert_eq!(delivered.of(&digest, &tree, CacheKind::Triton), Some(2));
        // A tree that cannot be walked is not counted.
        let nothing = tempfile::tempdir().unwrap();
        let other: Digest = format!("sha256:{}", "2".repeat(64)).parse().unwrap();
        assert_eq!(
            delivered.of(&other, &nothing.path().join("gone"), CacheKind::Triton),
            None
        );
    }

    #[test]
    fn a_pods_misses_of_another_gpu_are_explained_by_the_target() {
        // The T4's real kernels delivered; a pod wrote the sm80 ones.
        let t4 = gkm_testenv::triton::fleet_target_named("cuda-75-32").unwrap();
        let a100 = gkm_testenv::triton::fleet_target_named("cuda-80-32").unwrap();
        let entry = tempfile::tempdir().unwrap();
        let tree = entry.path().join(gkm_core::image_layout::TRITON.cache_dir);
        gkm_testenv::copy_tree(&t4.fixture, &tree).unwrap();
        let upper = tempfile::tempdir().unwrap();
        gkm_testenv::copy_tree(&a100.fixture, upper.path()).unwrap();
        let digest: Digest = format!("sha256:{}", "3".repeat(64)).parse().unwrap();
        let delivered = DeliveredEntries::default();
        let reasons = delivered.reasons(&digest, &tree, upper.path());
        assert!(
            !reasons.is_empty() && reasons.len() <= MAX_REASONS,
            "{reasons:?}"
        );
        assert!(
            reasons
                .iter()
                .all(|r| r.ends_with("rebuild the cache for the workload's GPU")),
            "{reasons:?}"
        );
        // A pod's tree that is no cache is not explained, and fails nothing.
        let scratch = tempfile::tempdir().unwrap();
        fs::write(scratch.path().join("notes.txt"), "x").unwrap();
        assert!(delivered.reasons(&digest, &tree, scratch.path()).is_empty());
    }
}
