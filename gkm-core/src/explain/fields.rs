//! Reading a tree's entries as [`Keyed`]: the rule of each kind for the
//! fields of an entry's key (see [the key fields](super#the-key-fields)).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{Keyed, RESULT_FIELDS};
use crate::cache::{CacheEntry, CacheError, scan};

/// The largest kernel metadata file read (Triton's are a few KiB).
const MAX_METADATA_BYTES: u64 = 16 << 20;

/// The entries of the cache tree at `dir` (any kind [`scan`] reads, or an
/// extracted image holding one), each with the fields of its key; and of a
/// PyTorch kind's tree (Inductor, Mega-Cache, vLLM), its compiled graphs
/// with their input shapes ([`graphs`](super::graphs)).
pub fn keyed_entries(dir: &Path) -> Result<Vec<Keyed>, CacheError> {
    let manifest = scan(dir)?;
    let root = cache_root(dir);
    let mut keyed = manifest
        .entries()
        .iter()
        .map(|entry| {
            let name = entry
                .kernel()
                .and_then(|k| k.name.clone())
                .unwrap_or_else(|| entry.key().to_string());
            Ok(Keyed {
                key: entry.key().to_string(),
                name,
                fields: fields(&root, entry)?,
            })
        })
        .collect::<Result<Vec<_>, CacheError>>()?;
    if manifest.kind().rules().compiles_graphs() {
        keyed.extend(super::graphs(&root)?);
    }
    Ok(keyed)
}

/// The fields of `entry`'s key, found in the tree rooted at `root`, results
/// left out ([`RESULT_FIELDS`]).
///
/// The rule for Triton kernels (the entries of every kind gkm knows): the
/// kernel's metadata `<key>/<name>.json` below `root`, every field of it,
/// when the tree holds it; else (a kernel bundled inside a single-file
/// artefact) the fields its record holds. An entry that is no Triton kernel
/// (a C++ kernel for the CPU) has none: it is matched by its key alone.
/// Metadata that is not a JSON object is refused, naming the file.
pub fn fields(root: &Path, entry: &CacheEntry) -> Result<BTreeMap<String, Value>, CacheError> {
    let Some(kernel) = entry.kernel() else {
        return Ok(BTreeMap::new());
    };
    let metadata = kernel
        .name
        .as_ref()
        .map(|name| root.join(entry.key()).join(format!("{name}.json")))
        .filter(|path| path.is_file());
    let value = match metadata {
        Some(path) => read_metadata(&path)?,
        None => serde_json::to_value(kernel).map_err(|e| CacheError::Invalid {
            what: "kernel metadata",
            reason: e.to_string(),
        })?,
    };
    let Value::Object(object) = value else {
        return Err(CacheError::Invalid {
            what: "kernel metadata",
            reason: "expected a JSON object".into(),
        });
    };
    let mut fields = BTreeMap::new();
    flatten("", object, &mut fields);
    Ok(fields)
}

/// The directory [`scan`] reads the cache of `dir` from: the cache
/// directory of an extracted image (`io.triton.cache/`…), else `dir`.
fn cache_root(dir: &Path) -> PathBuf {
    crate::image_layout::ALL
        .into_iter()
        .map(|layout| dir.join(layout.cache_dir))
        .find(|inner| inner.is_dir())
        .unwrap_or_else(|| dir.to_path_buf())
}

/// A kernel's metadata file, as JSON.
fn read_metadata(path: &Path) -> Result<Value, CacheError> {
    let bad = |reason: String| CacheError::BadMetadata {
        path: path.to_path_buf(),
        reason,
    };
    let io = |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_METADATA_BYTES {
        return Err(bad(format!("larger than {MAX_METADATA_BYTES} bytes")));
    }
    let bytes = std::fs::read(path).map_err(io)?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    if !value.is_object() {
        return Err(bad("expected a JSON object".into()));
    }
    Ok(value)
}

/// The members of `object` into `out`, nested objects' as `prefix.name`,
/// results left out at the top level.
fn flatten(prefix: &str, object: Map<String, Value>, out: &mut BTreeMap<String, Value>) {
    for (name, value) in object {
        if prefix.is_empty() && RESULT_FIELDS.contains(&name.as_str()) {
            continue;
        }
        let field = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}.{name}")
        };
        match value {
            Value::Object(inner) => flatten(&field, inner, out),
            other => {
                out.insert(field, other);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Triton cache in `dir` holding `add_kernel` under `key` with this
    /// metadata.
    fn kernel(dir: &Path, key: &str, metadata: &str) {
        let at = dir.join(key);
        std::fs::create_dir_all(&at).unwrap();
        std::fs::write(at.join("add_kernel.json"), metadata).unwrap();
        std::fs::write(at.join("__grp__add_kernel.json"), br#"{"child_paths": {}}"#).unwrap();
        std::fs::write(at.join("add_kernel.cubin"), b"\x7fELF").unwrap();
    }

    #[test]
    fn every_input_field_of_the_metadata_is_read_results_left_out() {
        let dir = tempfile::tempdir().unwrap();
        kernel(
            dir.path(),
            "K",
            r#"{"hash":"ab","name":"add_kernel","shared":1024,"num_warps":4,"maxnreg":null,
               "target":{"backend":"cuda","arch":90,"warp_size":32},"enable_fp_fusion":true}"#,
        );
        let entries = keyed_entries(dir.path()).unwrap();
        assert_eq!(entries.len(), 1);
        let names: Vec<&str> = entries[0].fields.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "enable_fp_fusion",
                "maxnreg",
                "num_warps",
                "target.arch",
                "target.backend",
                "target.warp_size"
            ]
        );
        assert_eq!(entries[0].name, "add_kernel");
        assert_eq!(entries[0].key, "K");
    }

    #[test]
    fn bad_metadata_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        kernel(dir.path(), "K", "{not json");
        let err = keyed_entries(dir.path()).unwrap_err().to_string();
        assert!(err.contains("add_kernel.json"), "{err}");
    }
}
