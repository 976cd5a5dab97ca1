//! What a pod compiled into its writable view, counted when the view goes:
//! the walk of its upper ([`walk_upper`]), bounded, and the account the
//! driver records and counts ([`Views::account_ended_view`]).
//!
//! Counting never fails an unpublish: a tree that cannot be read is
//! logged and left uncounted. What counts as a new entry or as scratch is
//! the cache kind's ([`gkm_core::usage`]).
//!
//! [`Views::account_ended_view`]: super::Views::account_ended_view

use std::fs;
use std::io;
use std::path::Path;

use gkm_core::cache::CacheKind;
use gkm_core::usage::{Walked, Written, descends};

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

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_core::usage::account;

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
}
