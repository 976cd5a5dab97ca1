//! Why a workload's new cache entries missed the delivered cache.
//!
//! A workload on a writable view writes every cache miss as a new entry.
//! [`explain`] takes the entries of the delivered tree and of the tree the
//! workload wrote ([`Keyed`]: where each is filed, its kernel's name and the
//! fields of its key), lists each entry of the workload's tree that the
//! delivered one lacks (a [`Miss`]), finds the nearest delivered entry of
//! the same kernel (the one with the fewest differing key fields) and names
//! every field that differs, with both values, and one sentence saying what
//! to change ([`Miss::advice`]). [`explain_trees`] reads both trees.
//!
//! # The key fields
//!
//! An entry's fields are read by its kind's rule ([`fields()`]). Every kind
//! gkm knows files Triton kernels, so today one rule serves them all: the
//! kernel's `<kernel>.json` metadata, read whole (nested objects flattened
//! to `target.arch`), or, for a kernel bundled inside a single-file
//! artefact, the fields its [`TritonKernel`] records. The fields that are
//! results of a compile rather than inputs to it are left out
//! ([`RESULT_FIELDS`]): they cannot be why a key differs. A kind whose
//! entries are keyed on something else adds its rule to [`fields()`] (its
//! entries' facts read through [`CacheEntry::facts`]) and, when some of its
//! fields call for their own advice, a case in [`advice`].
//!
//! A PyTorch tree's compiled graphs are entries too ([`graphs`]): Inductor
//! keys its FX graphs and C++ kernels by hashes that name no shape, so a
//! graph compiled for another input shape is found by its output code,
//! named by its kernels, with a `shape.<input>` field per input; the
//! advice for a shape says to capture the workload or compile with dynamic
//! shapes.
//!
//! [`TritonKernel`]: crate::cache::TritonKernel
//! [`CacheEntry::facts`]: crate::cache::CacheEntry::facts

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::cache::CacheError;

mod fields;
mod graphs;

pub use fields::{fields, keyed_entries};
pub use graphs::{MAX_GRAPHS, MAX_OUTPUT_CODE_BYTES, SHAPE_FIELD, graph_of, graphs};

/// Fields of Triton's kernel metadata that are results of a compile, not
/// inputs to its key, and so never named as a difference: the key itself
/// (`hash`), the kernel's name (what entries are matched by), where gkm
/// files it (`dummy_key`), and the resources the compiled kernel uses
/// (`shared`, `tmem_size`, the scratch sizes and alignments).
pub const RESULT_FIELDS: &[&str] = &[
    "hash",
    "name",
    "dummy_key",
    "shared",
    "tmem_size",
    "global_scratch_size",
    "global_scratch_align",
    "profile_scratch_size",
    "profile_scratch_align",
];

/// One entry of a tree, as [`explain`] compares it.
#[derive(Debug, Clone, PartialEq)]
pub struct Keyed {
    /// Where its kind files it ([`CacheEntry::key`](crate::cache::CacheEntry::key)).
    pub key: String,
    /// The kernel (or graph) it compiles: entries of the same name are
    /// compared.
    pub name: String,
    /// The fields of its key, by name (nested ones as `a.b`), results left
    /// out ([`RESULT_FIELDS`]).
    pub fields: BTreeMap<String, Value>,
}

/// Why a workload's entries missed a delivered cache.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// How many entries the workload's tree holds.
    pub entries: usize,
    /// How many of them the delivered tree holds too.
    pub delivered: usize,
    /// The rest: each entry the delivered tree lacks, in key order.
    pub misses: Vec<Miss>,
}

impl Explanation {
    /// The first `n` distinct sentences saying what to change, in the
    /// misses' order: what a status or an Event has room for.
    ///
    /// ```
    /// use gkm_core::explain::{Keyed, explain};
    /// let entry = |key: &str, warps: u32| Keyed {
    ///     key: key.into(),
    ///     name: "add_kernel".into(),
    ///     fields: [("num_warps".to_string(), warps.into())].into(),
    /// };
    /// let why = explain(&[entry("A", 4)], &[entry("B", 8), entry("C", 8)]);
    /// // Two misses for the same reason: said once.
    /// assert_eq!(why.reasons(3).len(), 1);
    /// ```
    pub fn reasons(&self, n: usize) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for miss in &self.misses {
            if out.len() == n {
                break;
            }
            if !out.contains(&miss.advice) {
                out.push(miss.advice.clone());
            }
        }
        out
    }
}

/// An entry of the workload's tree that the delivered tree lacks.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Miss {
    /// The kernel (or graph).
    pub kernel: String,
    /// Where the workload's tree files it.
    pub key: String,
    /// The delivered entry of the same kernel with the fewest differing
    /// fields; `None` when the delivered tree has no entry of it.
    pub nearest: Option<Nearest>,
    /// What to change, in one sentence.
    pub advice: String,
}

/// The delivered entry nearest a miss, and how its key differs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Nearest {
    /// Where the delivered tree files it.
    pub key: String,
    /// Each differing field, by name.
    pub differences: Vec<Difference>,
}

/// A key field whose value differs between a miss and its nearest entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    /// The field (`num_warps`, `target.arch`, `triton_version`…).
    pub field: String,
    /// Its value in the workload's entry (`null` when it has none).
    pub workload: Value,
    /// Its value in the delivered entry (`null` when it has none).
    pub delivered: Value,
}

/// Explains the entries of `workload` that `delivered` lacks. An entry is
/// delivered when the delivered tree files an entry of the same name under
/// the same key.
///
/// ```
/// use gkm_core::explain::{Keyed, explain};
/// let entry = |key: &str, warps: u32| Keyed {
///     key: key.into(),
///     name: "add_kernel".into(),
///     fields: [("num_warps".to_string(), warps.into())].into(),
/// };
/// let why = explain(&[entry("A", 4)], &[entry("A", 4), entry("B", 8)]);
/// assert_eq!((why.entries, why.delivered, why.misses.len()), (2, 1, 1));
/// let diff = &why.misses[0].nearest.as_ref().unwrap().differences[0];
/// assert_eq!((diff.field.as_str(), &diff.workload, &diff.delivered), ("num_warps", &8.into(), &4.into()));
/// assert!(why.misses[0].advice.contains("num_warps"), "{}", why.misses[0].advice);
/// ```
pub fn explain(delivered: &[Keyed], workload: &[Keyed]) -> Explanation {
    let filed: BTreeSet<(&str, &str)> = delivered
        .iter()
        .map(|e| (e.key.as_str(), e.name.as_str()))
        .collect();
    let mut misses: Vec<Miss> = workload
        .iter()
        .filter(|e| !filed.contains(&(e.key.as_str(), e.name.as_str())))
        .map(|entry| {
            let nearest = delivered
                .iter()
                .filter(|d| d.name == entry.name)
                .map(|d| Nearest {
                    key: d.key.clone(),
                    differences: differences(entry, d),
                })
                .min_by(|a, b| (a.differences.len(), &a.key).cmp(&(b.differences.len(), &b.key)));
            Miss {
                kernel: entry.name.clone(),
                key: entry.key.clone(),
                advice: advice(&entry.name, nearest.as_ref()),
                nearest,
            }
        })
        .collect();
    misses.sort_by(|a, b| (&a.key, &a.kernel).cmp(&(&b.key, &b.kernel)));
    Explanation {
        entries: workload.len(),
        delivered: workload.len() - misses.len(),
        misses,
    }
}

/// Reads the delivered tree and the workload's tree (a cache directory the
/// workload wrote, or a writable view's upper) and explains the workload's
/// misses ([`explain`]). A tree that is not a cache, or a file in it that
/// cannot be read, is refused naming it.
pub fn explain_trees(delivered: &Path, workload: &Path) -> Result<Explanation, CacheError> {
    Ok(explain(
        &keyed_entries(delivered)?,
        &keyed_entries(workload)?,
    ))
}

/// The fields whose values differ between `workload` and `delivered`, by
/// name; a field one of them lacks counts as `null`.
fn differences(workload: &Keyed, delivered: &Keyed) -> Vec<Difference> {
    let names: BTreeSet<&String> = workload
        .fields
        .keys()
        .chain(delivered.fields.keys())
        .collect();
    names
        .into_iter()
        .filter_map(|name| {
            let w = workload.fields.get(name).unwrap_or(&Value::Null);
            let d = delivered.fields.get(name).unwrap_or(&Value::Null);
            (w != d).then(|| Difference {
                field: name.clone(),
                workload: w.clone(),
                delivered: d.clone(),
            })
        })
        .collect()
}

/// What a field is to the advice: the first kind of difference found, in
/// this order, decides the sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cause {
    /// The compiler's or framework's version.
    Version,
    /// The GPU target.
    Target,
    /// A path baked into the key (Triton's `extern_libs`: where Triton is
    /// installed).
    Path,
    /// An input's shape (an Inductor graph's, [`graphs`]).
    Shape,
    /// A compile option (`num_warps`, `num_stages`, `debug`…).
    Option,
}

/// Which [`Cause`] a differing field is.
fn cause(field: &str) -> Cause {
    match field {
        "triton_version" => Cause::Version,
        "backend_name" | "arch" | "warp_size" | "ptx_version" | "backend" => Cause::Target,
        f if f.starts_with("target.") => Cause::Target,
        "extern_libs" => Cause::Path,
        f if f.starts_with(SHAPE_FIELD) => Cause::Shape,
        _ => Cause::Option,
    }
}

/// A value as a sentence shows it: strings without quotes.
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The sentence saying what to change for a miss of `kernel` whose nearest
/// delivered entry is `nearest`.
fn advice(kernel: &str, nearest: Option<&Nearest>) -> String {
    let Some(nearest) = nearest else {
        return format!("no cached entry of kernel {kernel}: capture this workload");
    };
    let Some(first) = nearest
        .differences
        .iter()
        .min_by_key(|d| (cause(&d.field), d.field.clone()))
    else {
        return format!(
            "the cached {kernel} has the same options: its source or constant arguments \
             differ; capture this workload"
        );
    };
    let (w, d) = (shown(&first.workload), shown(&first.delivered));
    match cause(&first.field) {
        Cause::Version => format!(
            "the workload runs Triton {w}, the cache was built with Triton {d}: \
             rebuild the cache with Triton {w}"
        ),
        Cause::Target => format!(
            "the workload compiles {kernel} for {} {w}, the cache holds {d}: rebuild the \
             cache for the workload's GPU",
            first.field
        ),
        Cause::Path => format!(
            "the workload's Triton is installed elsewhere ({} {w}, the cache's {d}): run it \
             from the path the cache was built with, or capture this workload",
            first.field
        ),
        Cause::Shape => format!(
            "the workload runs {kernel} with input {} of size {w}, the cache holds it for {d}: \
             capture this workload for its shapes, or compile with dynamic shapes \
             (torch.compile(dynamic=True), or torch._dynamo.mark_dynamic on that input)",
            first.field.trim_start_matches(SHAPE_FIELD)
        ),
        Cause::Option => {
            let all: Vec<String> = nearest
                .differences
                .iter()
                .filter(|d| cause(&d.field) == Cause::Option)
                .map(|d| {
                    format!(
                        "{}={} (cached {})",
                        d.field,
                        shown(&d.workload),
                        shown(&d.delivered)
                    )
                })
                .collect();
            format!(
                "the workload compiles {kernel} with {}: capture this workload, or rebuild \
                 the cache with its options",
                all.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, name: &str, fields: &[(&str, Value)]) -> Keyed {
        Keyed {
            key: key.into(),
            name: name.into(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    #[test]
    fn the_nearest_entry_is_the_one_with_fewest_differences() {
        let cached = [
            entry(
                "A",
                "k",
                &[("num_warps", 2.into()), ("num_stages", 2.into())],
            ),
            entry(
                "B",
                "k",
                &[("num_warps", 4.into()), ("num_stages", 3.into())],
            ),
            entry(
                "C",
                "other",
                &[("num_warps", 8.into()), ("num_stages", 3.into())],
            ),
        ];
        let workload = [entry(
            "D",
            "k",
            &[("num_warps", 8.into()), ("num_stages", 3.into())],
        )];
        let why = explain(&cached, &workload);
        let nearest = why.misses[0].nearest.as_ref().unwrap();
        assert_eq!(nearest.key, "B");
        assert_eq!(nearest.differences.len(), 1);
        assert_eq!(
            why.misses[0].advice,
            "the workload compiles k with num_warps=8 (cached 4): capture this workload, \
             or rebuild the cache with its options"
        );
    }

    #[test]
    fn a_version_decides_the_advice_over_options() {
        let cached = [entry(
            "A",
            "k",
            &[("num_warps", 4.into()), ("triton_version", "3.5.1".into())],
        )];
        let workload = [entry(
            "B",
            "k",
            &[("num_warps", 8.into()), ("triton_version", "3.6.0".into())],
        )];
        let why = explain(&cached, &workload);
        assert!(
            why.misses[0]
                .advice
                .contains("rebuild the cache with Triton 3.6.0"),
            "{}",
            why.misses[0].advice
        );
    }

    #[test]
    fn a_kernel_never_cached_is_captured_and_an_absent_field_is_null() {
        let cached = [entry("A", "k", &[("num_warps", 4.into())])];
        let workload = [entry("B", "new", &[]), entry("C", "k", &[])];
        let why = explain(&cached, &workload);
        assert_eq!(
            why.misses[0].advice,
            "no cached entry of kernel new: capture this workload"
        );
        assert_eq!(why.misses[0].nearest, None);
        let diff = &why.misses[1].nearest.as_ref().unwrap().differences[0];
        assert_eq!((&diff.workload, &diff.delivered), (&Value::Null, &4.into()));
    }
}
