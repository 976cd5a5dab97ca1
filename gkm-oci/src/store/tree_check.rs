//! The safety rules a directory must pass before it is packed into a cache
//! image: the rules extraction applies to a layer ([`ExtractPolicy`],
//! [`Rule`]), applied by the same checks to the tree on disk, so nothing a
//! node would refuse to extract is ever packed, signed or pushed.
//!
//! A tree passes when it holds only directories and regular files (no
//! symbolic links, devices, fifos or sockets), no file has a hard link
//! outside the tree, and its paths, file sizes, sum of sizes and entry count
//! are within the policy's limits. The walk never follows a link and stops
//! at the first entry that breaks a rule, so an oversized or hostile tree
//! costs no more than the limits.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::store::extract::{
    ExtractPolicy, check_entry_count, check_entry_size, check_kind, check_total, components, reject,
};
use crate::store::rejection::{Rejection, Rule};

/// What a tree that passed holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TreeStats {
    /// Directories and files below the root.
    pub entries: u64,
    /// Regular files.
    pub files: u64,
    /// Sum of the files' sizes.
    pub bytes: u64,
    /// The longest path below the root, in bytes (a layer puts it under a
    /// prefix, which must still fit the policy's path limit).
    pub longest_path: usize,
}

/// A file with more than one link: how many it has, how many the walk met.
struct Linked {
    nlink: u64,
    seen: u64,
    first: String,
}

/// Checks the tree below `root` (a directory; `root` itself may be a link
/// to one) against `policy`, links always refused. A refusal is
/// [`Error::Rejected`] naming the entry, relative to `root`, and the rule.
pub fn check_tree(root: &Path, policy: &ExtractPolicy) -> Result<TreeStats> {
    let policy = ExtractPolicy {
        // Images hold files and directories only, whatever the policy
        // allows a layer to carry.
        allow_in_tree_links: false,
        ..policy.clone()
    };
    let meta = fs::metadata(root).map_err(|e| Error::io(root, e))?;
    if !meta.is_dir() {
        return Err(Error::Cache(gkm_core::cache::CacheError::NotACache {
            path: root.to_path_buf(),
            expected: "a directory".into(),
        }));
    }
    let mut stats = TreeStats::default();
    let mut linked: HashMap<(u64, u64), Linked> = HashMap::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(rel_dir) = pending.pop() {
        let mut children = Vec::new();
        let dir = root.join(&rel_dir);
        for child in fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))? {
            let child = child.map_err(|e| Error::io(&dir, e))?;
            check_entry_count(
                stats.entries + children.len() as u64 + 1,
                &policy,
                &shown(&rel_dir.join(child.file_name())),
            )?;
            children.push(child.file_name());
        }
        children.sort();
        // Directories are pushed in reverse so they are walked in order.
        let mut subdirs = Vec::new();
        for name in children {
            let rel = rel_dir.join(&name);
            let Some(rel_str) = rel.to_str() else {
                return reject(&shown(&rel), Rule::NonUtf8Name, "path is not UTF-8");
            };
            components(rel_str, rel_str, &policy)?;
            stats.entries += 1;
            stats.longest_path = stats.longest_path.max(rel_str.len());
            let path = root.join(&rel);
            let meta = fs::symlink_metadata(&path).map_err(|e| Error::io(&path, e))?;
            let ft = meta.file_type();
            if ft.is_dir() {
                subdirs.push(rel);
                continue;
            }
            check_kind(entry_type(&ft), &policy, rel_str)
                .map_err(|e| with_link_target(e, &path, ft.is_symlink()))?;
            check_entry_size(meta.len(), &policy, rel_str)?;
            check_total(stats.bytes, meta.len(), &policy, rel_str)?;
            stats.files += 1;
            stats.bytes += meta.len();
            if meta.nlink() > 1 {
                linked
                    .entry((meta.dev(), meta.ino()))
                    .or_insert_with(|| Linked {
                        nlink: meta.nlink(),
                        seen: 0,
                        first: rel_str.to_string(),
                    })
                    .seen += 1;
            }
        }
        pending.extend(subdirs.into_iter().rev());
    }
    let mut escaping: Vec<&Linked> = linked.values().filter(|l| l.seen < l.nlink).collect();
    escaping.sort_by(|a, b| a.first.cmp(&b.first));
    if let Some(l) = escaping.first() {
        return reject(
            &l.first,
            Rule::LinkEscape,
            format!(
                "a hard link to a file outside the tree: it has {} links, {} of them inside",
                l.nlink, l.seen
            ),
        );
    }
    Ok(stats)
}

/// Checks that the longest path of a checked tree still fits the policy's
/// path limit under `prefix`, the directory a layer puts the tree in.
pub fn check_prefixed_paths(stats: &TreeStats, prefix: &str, policy: &ExtractPolicy) -> Result<()> {
    let longest = prefix.len() + 1 + stats.longest_path;
    if stats.longest_path > 0 && longest > policy.max_path_len {
        return reject(
            &format!("{prefix}/…"),
            Rule::NameTooLong,
            format!(
                "the longest path is {longest} bytes in the image, limit {}",
                policy.max_path_len
            ),
        );
    }
    Ok(())
}

/// The tar entry type a file of type `ft` would be packed as, for
/// [`check_kind`].
fn entry_type(ft: &fs::FileType) -> tar::EntryType {
    if ft.is_file() {
        tar::EntryType::Regular
    } else if ft.is_symlink() {
        tar::EntryType::Symlink
    } else if ft.is_block_device() {
        tar::EntryType::Block
    } else if ft.is_char_device() {
        tar::EntryType::Char
    } else if ft.is_fifo() {
        tar::EntryType::Fifo
    } else {
        // A socket (tar has no type for one).
        tar::EntryType::new(b's')
    }
}

/// A refused link's rejection, saying where it points.
fn with_link_target(e: Error, path: &Path, is_link: bool) -> Error {
    match (e, is_link) {
        (Error::Rejected(r), true) => {
            let target = fs::read_link(path)
                .map(|t| t.display().to_string())
                .unwrap_or_else(|_| "an unreadable target".into());
            Error::Rejected(Rejection {
                detail: format!(
                    "a symbolic link to {target}: cache images hold regular files and directories only"
                ),
                ..r
            })
        }
        (e, _) => e,
    }
}

/// A path as rejections show it.
fn shown(rel: &Path) -> String {
    rel.to_string_lossy().escape_debug().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(result: Result<TreeStats>) -> (Rule, String, String) {
        match result {
            Err(Error::Rejected(r)) => (r.rule, r.entry, r.detail),
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join("KEY");
        fs::create_dir(&key).expect("mkdir");
        fs::write(key.join("k.json"), b"{}").expect("write");
        fs::write(key.join("k.cubin"), vec![0u8; 100]).expect("write");
        dir
    }

    #[test]
    fn an_ordinary_tree_passes_with_its_counts() {
        let dir = tree();
        let stats = check_tree(dir.path(), &ExtractPolicy::default()).expect("passes");
        assert_eq!(
            stats,
            TreeStats {
                entries: 3,
                files: 2,
                bytes: 102,
                longest_path: "KEY/k.cubin".len(),
            }
        );
    }

    #[test]
    fn a_symbolic_link_is_refused_naming_its_target() {
        let dir = tree();
        std::os::unix::fs::symlink("/etc", dir.path().join("KEY/etc")).expect("symlink");
        let (rule, entry, detail) = rule(check_tree(dir.path(), &ExtractPolicy::default()));
        assert_eq!((rule, entry.as_str()), (Rule::LinkNotAllowed, "KEY/etc"));
        assert!(detail.contains("symbolic link to /etc"), "{detail}");
    }

    #[test]
    fn a_fifo_is_refused_as_a_special_file() {
        let dir = tree();
        let fifo = dir.path().join("KEY/pipe");
        let c = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (rule, entry, _) = rule(check_tree(dir.path(), &ExtractPolicy::default()));
        assert_eq!((rule, entry.as_str()), (Rule::SpecialFile, "KEY/pipe"));
    }

    #[test]
    fn a_hard_link_out_of_the_tree_is_refused_and_one_inside_passes() {
        let outside = tempfile::tempdir().expect("tempdir");
        let dir = tree();
        fs::hard_link(dir.path().join("KEY/k.cubin"), dir.path().join("KEY/copy"))
            .expect("link inside");
        check_tree(dir.path(), &ExtractPolicy::default()).expect("links inside pass");
        // The same filesystem (both are temporary directories).
        let secret = outside.path().join("secret");
        fs::write(&secret, b"s").expect("write");
        if fs::hard_link(&secret, dir.path().join("KEY/secret")).is_err() {
            return;
        }
        let (rule, entry, detail) = rule(check_tree(dir.path(), &ExtractPolicy::default()));
        assert_eq!((rule, entry.as_str()), (Rule::LinkEscape, "KEY/secret"));
        assert!(detail.contains("outside the tree"), "{detail}");
    }

    #[test]
    fn sizes_and_counts_over_the_policy_are_refused() {
        let dir = tree();
        let small = ExtractPolicy {
            max_total_size: 101,
            ..ExtractPolicy::default()
        };
        assert_eq!(rule(check_tree(dir.path(), &small)).0, Rule::TotalTooLarge);
        let one_file = ExtractPolicy {
            max_entry_size: 99,
            ..ExtractPolicy::default()
        };
        assert_eq!(
            rule(check_tree(dir.path(), &one_file)).0,
            Rule::EntryTooLarge
        );
        let few = ExtractPolicy {
            max_entries: 2,
            ..ExtractPolicy::default()
        };
        assert_eq!(rule(check_tree(dir.path(), &few)).0, Rule::TooManyEntries);
        let short = ExtractPolicy {
            max_name_len: 4,
            ..ExtractPolicy::default()
        };
        assert_eq!(rule(check_tree(dir.path(), &short)).0, Rule::NameTooLong);
    }

    #[test]
    fn a_file_is_not_a_cache() {
        let dir = tree();
        let err = check_tree(&dir.path().join("KEY/k.json"), &ExtractPolicy::default())
            .expect_err("a file");
        assert!(matches!(err, Error::Cache(_)), "{err}");
        assert!(err.to_string().contains("expected a directory"), "{err}");
    }

    #[test]
    fn the_prefix_counts_toward_the_path_limit() {
        let dir = tree();
        let stats = check_tree(dir.path(), &ExtractPolicy::default()).expect("passes");
        let policy = ExtractPolicy {
            max_path_len: "io.triton.cache/KEY/k.cubin".len(),
            ..ExtractPolicy::default()
        };
        check_prefixed_paths(&stats, "io.triton.cache", &policy).expect("fits");
        let err = check_prefixed_paths(&stats, "io.vllm.cache/torch_compile_cache", &policy)
            .expect_err("too long");
        assert!(err.to_string().contains("name-too-long"), "{err}");
    }
}
