//! The per-directory records a vLLM `manifest.json` group carries next to
//! its kernels, in MCV's shape: `binary` (one per directory of Inductor
//! standalone artefacts) and `aot_compile` (one per compiled model file).
//! They describe files, not kernels: no compatibility decision reads them.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::scan::is_rank_dir;
use crate::cache::CacheError;
use crate::cache::files::{files, read_head, subdirs};

/// The file next to Inductor standalone artefacts that records the hashes
/// and environment they were compiled with.
const KEY_FACTORS: &str = "cache_key_factors.json";

/// Largest `cache_key_factors.json` read; a larger one is recorded without
/// its hashes.
const KEY_FACTORS_LIMIT: u64 = 1 << 20;

/// The environment variable vLLM records its target device in.
const TARGET_DEVICE_ENV: &str = "VLLM_TARGET_DEVICE";

/// The artefacts of one `rank_<rank>_<dp_rank>/<prefix>/` directory (an
/// element of a group's `binary` list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BinaryArtefacts {
    /// The rank directory (`rank_0_0`).
    pub rank: String,
    /// The prefix directory below it (`backbone`, `eagle_head`).
    pub prefix: String,
    /// How many artefacts the directory holds.
    pub artifact_count: u64,
    /// Their names, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifact_names: Vec<String>,
    /// `code_hash` from `cache_key_factors.json`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub code_hash: String,
    /// `config_hash` from `cache_key_factors.json`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub config_hash: String,
    /// `compiler_hash` from `cache_key_factors.json`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub compiler_hash: String,
    /// `binary` when the first artefact is a single file, `unpacked` when
    /// it is a directory.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cache_save_format: String,
    /// `VLLM_TARGET_DEVICE` from the recorded environment (`cuda`, `rocm`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target_device: String,
    /// The environment `cache_key_factors.json` records.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, serde_json::Value>,
}

/// One `torch_aot_compile/<hash>/rank_*/model` file (an element of a
/// group's `aot_compile` list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AotModel {
    /// The hash directory's name.
    pub hash: String,
    /// The rank directory (`rank_0_0`).
    pub rank: String,
    /// The model file's name (`model`).
    pub model_file: String,
    /// Its size in bytes.
    pub file_size: u64,
}

/// The artefact records of one `torch_compile_cache/<hash>` directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VllmArtefacts {
    /// The hash directory's name.
    pub vllm_hash: String,
    /// Directories of Inductor standalone artefacts.
    pub binary: Vec<BinaryArtefacts>,
    /// Compiled model files.
    pub aot_compile: Vec<AotModel>,
}

impl VllmArtefacts {
    /// Whether it records nothing.
    pub fn is_empty(&self) -> bool {
        self.binary.is_empty() && self.aot_compile.is_empty()
    }

    /// Sort the records so equal trees give equal manifests.
    pub(crate) fn normalise(&mut self) {
        self.binary
            .sort_by(|a, b| (&a.rank, &a.prefix).cmp(&(&b.rank, &b.prefix)));
        self.aot_compile.sort_by(|a, b| a.rank.cmp(&b.rank));
    }
}

/// What `cache_key_factors.json` holds that the records keep.
#[derive(Deserialize, Default)]
struct KeyFactors {
    #[serde(default)]
    code_hash: String,
    #[serde(default)]
    config_hash: String,
    #[serde(default)]
    compiler_hash: String,
    #[serde(default)]
    env: BTreeMap<String, serde_json::Value>,
}

/// The records of the hash directory `hash_dir` (rank directories below
/// it); `aot` when it is a `torch_aot_compile/<hash>` directory.
pub(crate) fn of_hash_dir(
    hash_dir: &Path,
    vllm_hash: &str,
    aot: bool,
    is_artefact: impl Fn(&str) -> bool,
) -> Result<VllmArtefacts, CacheError> {
    let mut out = VllmArtefacts {
        vllm_hash: vllm_hash.to_string(),
        ..VllmArtefacts::default()
    };
    for rank_dir in subdirs(hash_dir)? {
        let Some(rank) = rank_dir
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| is_rank_dir(n))
        else {
            continue;
        };
        if aot {
            out.aot_compile
                .extend(aot_model(&rank_dir, vllm_hash, rank)?);
            continue;
        }
        for prefix_dir in subdirs(&rank_dir)? {
            out.binary
                .extend(binary_artefacts(&prefix_dir, rank, &is_artefact)?);
        }
    }
    out.normalise();
    Ok(out)
}

/// The `model` file of an `aot_compile` rank directory, if it has one.
fn aot_model(rank_dir: &Path, hash: &str, rank: &str) -> Result<Option<AotModel>, CacheError> {
    const MODEL: &str = "model";
    if !files(rank_dir)?.iter().any(|f| f == MODEL) {
        return Ok(None);
    }
    let path = rank_dir.join(MODEL);
    let meta = std::fs::metadata(&path).map_err(|source| CacheError::Io { path, source })?;
    Ok(Some(AotModel {
        hash: hash.to_string(),
        rank: rank.to_string(),
        model_file: MODEL.to_string(),
        file_size: meta.len(),
    }))
}

/// The record of a prefix directory holding `cache_key_factors.json` and
/// artefacts; `None` for any other directory.
fn binary_artefacts(
    prefix_dir: &Path,
    rank: &str,
    is_artefact: impl Fn(&str) -> bool,
) -> Result<Option<BinaryArtefacts>, CacheError> {
    let Some(prefix) = prefix_dir.file_name().and_then(|n| n.to_str()) else {
        return Ok(None);
    };
    let file_names = files(prefix_dir)?;
    if !file_names.iter().any(|f| f == KEY_FACTORS) {
        return Ok(None);
    }
    let dir_names: Vec<String> = subdirs(prefix_dir)?
        .iter()
        .filter_map(|d| d.file_name().and_then(|n| n.to_str()).map(str::to_string))
        .collect();
    let mut names: Vec<(String, bool)> = file_names
        .into_iter()
        .map(|n| (n, false))
        .chain(dir_names.into_iter().map(|n| (n, true)))
        .filter(|(n, _)| is_artefact(n))
        .collect();
    names.sort();
    let Some((_, first_is_dir)) = names.first() else {
        return Ok(None);
    };
    let cache_save_format = if *first_is_dir { "unpacked" } else { "binary" };
    let head = read_head(&prefix_dir.join(KEY_FACTORS), KEY_FACTORS_LIMIT)?;
    let factors: KeyFactors = serde_json::from_slice(&head).unwrap_or_default();
    let target_device = factors
        .env
        .get(TARGET_DEVICE_ENV)
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok(Some(BinaryArtefacts {
        rank: rank.to_string(),
        prefix: prefix.to_string(),
        artifact_count: names.len() as u64,
        cache_save_format: cache_save_format.to_string(),
        artifact_names: names.into_iter().map(|(n, _)| n).collect(),
        code_hash: factors.code_hash,
        config_hash: factors.config_hash,
        compiler_hash: factors.compiler_hash,
        target_device,
        env: factors.env,
    }))
}
