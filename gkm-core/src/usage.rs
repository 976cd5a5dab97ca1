//! What a pod wrote into its writable view of a cache, counted by the
//! cache kind's rules: the new entries it compiled (its misses), the
//! scratch it left (locks, temporary files) and their bytes.
//!
//! A pod on a writable view writes every miss into its own upper, never
//! into the verified tree; its hits write nothing. So the upper, read when
//! the pod's view goes, says what the delivered cache did not hold for that
//! workload. Each new file is filed under the entry its kind says it is of
//! ([`Kind::entry_of`](crate::cache::kinds::Kind::entry_of): a Triton kernel
//! directory, an Inductor FX graph or generated code file, a vLLM
//! artefact), so a kernel compiled as six files is one miss. What counts
//! is pure ([`account`]); reading the upper is the caller's.
//!
//! A read-only view cannot see misses: the workload's writes fail (or go
//! elsewhere), so nothing here is counted for it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cache::CacheKind;

/// The most entries an account names one by one; beyond them it counts.
pub const MAX_NAMED_ENTRIES: usize = 16;

/// One file a workload wrote into its view: its path below the view's
/// root, `/`-separated, and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Below the view's root.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// A new entry a workload compiled: one miss.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewEntry {
    /// Where it is below the view's root: its key (a Triton kernel's
    /// directory, an Inductor entry's path).
    pub key: String,
    /// The kernel's name, when its files say it (Triton's
    /// `<kernel>.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its files' bytes.
    pub bytes: u64,
}

impl NewEntry {
    /// How it is shown: its kernel's name, else its key.
    pub fn shown(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.key)
    }
}

/// What a pod wrote into its writable view.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ViewUsage {
    /// New entries compiled: the misses.
    pub new_entries: u64,
    /// The first [`MAX_NAMED_ENTRIES`] of them, by key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub named: Vec<NewEntry>,
    /// The bytes of the new entries' files.
    pub new_bytes: u64,
    /// Files of no entry (top-level files the kind files nowhere).
    #[serde(default)]
    pub other_files: u64,
    /// Scratch files and directories (locks, temporaries), by the kind's
    /// rules.
    #[serde(default)]
    pub scratch: u64,
    /// The scratch files' bytes.
    #[serde(default)]
    pub scratch_bytes: u64,
}

impl ViewUsage {
    /// Whether the pod compiled nothing the cache should have held.
    pub fn all_hits(&self) -> bool {
        self.new_entries == 0
    }
}

/// One entry of an upper as it was walked: a file or a directory, below
/// the view's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Walked {
    /// A regular file the workload wrote.
    File(Written),
    /// A directory (its contents are walked too).
    Dir(String),
}

/// Whether a walk of an upper goes into `dir`: not into a directory that
/// is `kind`'s scratch (it is counted as one scratch entry).
pub fn descends(kind: CacheKind, dir: &str) -> bool {
    kind.rules().scratch(dir, true).is_none()
}

/// Counts what `walked` (an upper's files and directories, as a walk that
/// does not [descend](descends) into scratch directories lists them) holds
/// by `kind`'s rules.
///
/// ```
/// use gkm_core::cache::CacheKind;
/// use gkm_core::usage::{Walked, Written, account};
/// let file = |path: &str, bytes| Walked::File(Written { path: path.into(), bytes });
/// let usage = account(CacheKind::Triton, &[
///     file("KEY/add_kernel.json", 10),
///     file("KEY/add_kernel.cubin", 90),
///     file("KEY/__grp__add_kernel.json", 5),
///     file("tmp.pid_1_2/add_kernel.cubin", 90),
/// ]);
/// assert_eq!(usage.new_entries, 1);
/// assert_eq!(usage.named[0].name.as_deref(), Some("add_kernel"));
/// assert_eq!((usage.new_bytes, usage.scratch), (105, 1));
/// ```
pub fn account(kind: CacheKind, walked: &[Walked]) -> ViewUsage {
    let rules = kind.rules();
    let mut usage = ViewUsage::default();
    let mut entries: BTreeMap<&str, NewEntry> = BTreeMap::new();
    for item in walked {
        let file = match item {
            Walked::Dir(dir) => {
                if rules.scratch(dir, true).is_some() {
                    usage.scratch += 1;
                }
                continue;
            }
            Walked::File(file) => file,
        };
        if in_scratch_dir(kind, &file.path) || rules.scratch(&file.path, false).is_some() {
            usage.scratch += 1;
            usage.scratch_bytes += file.bytes;
            continue;
        }
        let Some(key) = rules.entry_of(&file.path) else {
            usage.other_files += 1;
            continue;
        };
        let entry = entries.entry(key).or_insert_with(|| NewEntry {
            key: key.to_string(),
            name: None,
            bytes: 0,
        });
        entry.bytes += file.bytes;
        usage.new_bytes += file.bytes;
        if entry.name.is_none() {
            entry.name = kernel_name(&file.path[key.len()..]);
        }
    }
    usage.new_entries = entries.len() as u64;
    usage.named = entries.into_values().take(MAX_NAMED_ENTRIES).collect();
    usage
}

/// Whether a directory above `path` is `kind`'s scratch (a walk that
/// descends anyway lists its files).
fn in_scratch_dir(kind: CacheKind, path: &str) -> bool {
    let mut at = 0;
    while let Some(slash) = path[at..].find('/') {
        let dir = &path[..at + slash];
        if kind.rules().scratch(dir, true).is_some() {
            return true;
        }
        at += slash + 1;
    }
    false
}

/// The kernel a file of an entry names (`rest` is its path below the
/// entry, with the leading `/`): Triton's `<kernel>.json` metadata (not
/// its `__grp__<kernel>.json` group file).
fn kernel_name(rest: &str) -> Option<String> {
    let name = rest.trim_start_matches('/');
    let stem = name.strip_suffix(".json")?;
    (!stem.contains('/') && !stem.starts_with("__grp__") && !stem.is_empty())
        .then(|| stem.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, bytes: u64) -> Walked {
        Walked::File(Written {
            path: path.into(),
            bytes,
        })
    }

    #[test]
    fn a_triton_kernel_of_several_files_is_one_new_entry_named_by_its_metadata() {
        let usage = account(
            CacheKind::Triton,
            &[
                file("AAA/add_kernel.cubin", 100),
                file("AAA/add_kernel.json", 10),
                file("AAA/__grp__add_kernel.json", 5),
                file("BBB/__grp__mul_kernel.json", 5),
                file("BBB/mul_kernel.json", 10),
                Walked::Dir("AAA".into()),
            ],
        );
        assert_eq!(usage.new_entries, 2);
        assert_eq!(usage.new_bytes, 130);
        let names: Vec<_> = usage.named.iter().map(|e| e.name.as_deref()).collect();
        assert_eq!(names, [Some("add_kernel"), Some("mul_kernel")]);
        assert_eq!(usage.named[0].key, "AAA");
        assert!(!usage.all_hits());
    }

    #[test]
    fn scratch_and_top_level_files_are_no_entry() {
        let usage = account(
            CacheKind::Inductor,
            &[
                Walked::Dir("locks".into()),
                file("locks/ab.lock", 0),
                file("fxgraph/ab/KEY.lock", 0),
                file("stray", 3),
            ],
        );
        assert_eq!(usage.new_entries, 0);
        assert_eq!((usage.scratch, usage.other_files), (3, 1));
        assert!(usage.all_hits());
    }

    #[test]
    fn an_inductor_code_file_and_its_library_are_one_entry() {
        let usage = account(
            CacheKind::Inductor,
            &[
                file("ab/cabc.cpp", 1),
                file("ab/cabc.so", 2),
                file("ab/cabc.main.cpp", 1),
                file("cd/ccde.py", 4),
                file("fxgraph/xy/FXKEY/ENTRY", 8),
                file("triton/0/TKEY/k.json", 1),
                file("triton/0/TKEY/k.cubin", 1),
            ],
        );
        let keys: Vec<_> = usage.named.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            ["ab/cabc", "cd/ccde", "fxgraph/xy/FXKEY", "triton/0/TKEY"]
        );
        assert_eq!(usage.named[3].name.as_deref(), Some("k"));
    }

    #[test]
    fn a_vllm_root_files_its_inductor_cache_as_inductor_does() {
        let usage = account(
            CacheKind::Vllm,
            &[
                file("torch_compile_cache/H/inductor_cache/ju/cju.so", 5),
                file("torch_compile_cache/H/inductor_cache/ju/cju.cpp", 5),
                file("torch_compile_cache/H/rank_0_0/backbone/model", 5),
                file("torch_compile_cache/H/inductor_cache/locks/x.lock", 0),
            ],
        );
        let keys: Vec<_> = usage.named.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "torch_compile_cache/H/inductor_cache/ju/cju",
                "torch_compile_cache/H/rank_0_0/backbone",
            ]
        );
        assert_eq!(usage.scratch, 1);
    }

    #[test]
    fn an_account_names_a_bounded_number_of_entries_and_counts_the_rest() {
        let walked: Vec<_> = (0..100)
            .map(|i| file(&format!("K{i:03}/k.json"), 1))
            .collect();
        let usage = account(CacheKind::Triton, &walked);
        assert_eq!(usage.new_entries, 100);
        assert_eq!(usage.named.len(), MAX_NAMED_ENTRIES);
    }
}
