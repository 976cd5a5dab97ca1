//! Scanning a Triton cache directory (layout: see the
//! [`cache`](crate::cache) module).

use std::path::Path;

use crate::cache::files::{files, read_head, subdirs};
use crate::cache::group::{GROUP_PREFIX, check_group, groups_in};
use crate::cache::{CacheError, TritonKernel, ptx_isa_version};
use crate::gpu::Backend;

/// Extensions of the compiled binaries Triton stores next to a kernel's
/// metadata; one of them marks a `<kernel>.json` as kernel metadata even
/// without a group file.
const BINARY_EXTENSIONS: [&str; 5] = ["cubin", "hsaco", "spv", "ptx", "amdgcn"];

/// The largest kernel metadata file read (Triton's are a few KiB).
const MAX_METADATA_BYTES: u64 = 16 << 20;

/// How much of a `.ptx` file is read to find its `.version` directive.
const PTX_HEADER_BYTES: u64 = 8 * 1024;

/// What a Triton cache directory is expected to hold, for error messages.
pub(crate) const EXPECTED: &str = "a Triton cache: hash directories holding a kernel's \
    <kernel>.json metadata and __grp__<kernel>.json group file";

/// The kernels of a Triton cache rooted at `root`, sorted by cache key and
/// name. `Ok(None)` when no subdirectory holds a kernel.
pub(crate) fn scan_root(root: &Path) -> Result<Option<Vec<TritonKernel>>, CacheError> {
    let mut entries = Vec::new();
    let mut found = false;
    for dir in subdirs(root)? {
        let kernels = scan_key_dir(&dir)?;
        found |= !kernels.is_empty();
        entries.extend(kernels);
    }
    entries.sort_by(|a, b| (&a.dummy_key, &a.name, &a.hash).cmp(&(&b.dummy_key, &b.name, &b.hash)));
    Ok(found.then_some(entries))
}

/// The kernels in one cache-key directory, sorted by name; none for a
/// directory that holds no kernel metadata. A torn group file (see
/// [`crate::cache::group`]) refuses the directory.
pub(crate) fn scan_key_dir(dir: &Path) -> Result<Vec<TritonKernel>, CacheError> {
    let files = files(dir)?;
    for group in groups_in(dir, &files) {
        check_group(dir, &group, &files)?;
    }
    let key = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut entries = Vec::new();
    for name in kernel_names(&files) {
        let meta = dir.join(format!("{name}.json"));
        if !files.iter().any(|f| *f == format!("{name}.json")) {
            return Err(CacheError::BadMetadata {
                path: dir.join(format!("{GROUP_PREFIX}{name}.json")),
                reason: format!("group file without its kernel metadata {name}.json"),
            });
        }
        let bytes = read_head(&meta, MAX_METADATA_BYTES + 1)?;
        if bytes.len() as u64 > MAX_METADATA_BYTES {
            return Err(CacheError::BadMetadata {
                path: meta,
                reason: format!("larger than {MAX_METADATA_BYTES} bytes"),
            });
        }
        let mut entry = TritonKernel::from_kernel_json(&bytes).map_err(|e| match e {
            CacheError::Invalid { reason, .. } => CacheError::BadMetadata {
                path: meta.clone(),
                reason,
            },
            other => other,
        })?;
        entry.dummy_key.clone_from(&key);
        if entry.name.is_none() {
            entry.name = Some(name.clone());
        }
        if entry.backend == Backend::Cuda && entry.ptx_version.is_none() {
            let ptx = format!("{name}.ptx");
            if files.contains(&ptx) {
                entry.ptx_version = ptx_isa_version(&read_head(&dir.join(ptx), PTX_HEADER_BYTES)?);
            }
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// Names of the kernels whose metadata a directory holds: `<kernel>` for
/// every `__grp__<kernel>.json`, and for every `<kernel>.json` next to a
/// compiled binary of the same name. Sorted.
fn kernel_names(files: &[String]) -> Vec<String> {
    let mut names: Vec<String> = files
        .iter()
        .filter_map(|f| {
            if let Some(rest) = f.strip_prefix(GROUP_PREFIX) {
                return rest.strip_suffix(".json").map(str::to_string);
            }
            let stem = f.strip_suffix(".json")?;
            BINARY_EXTENSIONS
                .iter()
                .any(|ext| files.contains(&format!("{stem}.{ext}")))
                .then(|| stem.to_string())
        })
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(files: &[&str]) -> Vec<String> {
        kernel_names(&files.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn kernels_are_found_by_group_file_or_binary() {
        assert_eq!(names(&["__grp__k.json", "k.json", "k.cubin"]), ["k"]);
        assert_eq!(names(&["k.json", "k.hsaco"]), ["k"]);
        assert!(names(&["add_kernel.autotune.json", "cuda_utils.so"]).is_empty());
        assert!(names(&["__triton_launcher.so"]).is_empty());
    }
}
