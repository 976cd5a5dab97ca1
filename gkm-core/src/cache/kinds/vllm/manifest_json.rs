//! vLLM's shapes of `manifest.json` and the summary label: MCV's grouped
//! entries with their artefact records, and `sm_XY` architecture names.

use serde::{Deserialize, Deserializer, Serialize};

use super::{VllmCppKernel, VllmKernel};
use crate::cache::kinds::inductor::CppKernel;
use crate::cache::manifest_json::null_as_empty;
use crate::cache::{
    AotModel, BinaryArtefacts, CacheEntry, Summary, TritonKernel, VllmArtefacts, VllmFormat,
};
use crate::gpu::Backend;

/// `"vllm"`: kernel entries written as MCV's groups, one per vLLM hash and
/// layout.
mod vllm_groups {
    use serde::de::Error as _;

    use super::*;

    /// One group as MCV writes it (its artefact records are read by
    /// [`artefacts_of`](super::artefacts_of)).
    #[derive(Deserialize)]
    struct Group {
        #[serde(rename = "vllmHash", default)]
        vllm_hash: String,
        #[serde(rename = "cacheFormat", default, deserialize_with = "known_format")]
        cache_format: Option<VllmFormat>,
        #[serde(default, deserialize_with = "null_as_empty")]
        triton: Vec<VllmKernel>,
        #[serde(default, deserialize_with = "null_as_empty")]
        cpp: Vec<CppKernel>,
    }

    /// A layout name; one gkm does not know (a newer MCV's) reads as `None`.
    fn known_format<'de, D: Deserializer<'de>>(d: D) -> Result<Option<VllmFormat>, D::Error> {
        let value = Option::<serde_json::Value>::deserialize(d)?;
        Ok(value.and_then(|v| VllmFormat::deserialize(v).ok()))
    }

    /// The Triton and C++ kernels of a `"vllm"` member.
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<(Vec<VllmKernel>, Vec<VllmCppKernel>), D::Error> {
        let Some(elements) = Option::<Vec<serde_json::Value>>::deserialize(d)? else {
            return Ok((Vec::new(), Vec::new()));
        };
        let mut entries = Vec::new();
        let mut cpp = Vec::new();
        for (i, element) in elements.into_iter().enumerate() {
            let context = |e: serde_json::Error| D::Error::custom(format!("vllm[{i}]: {e}"));
            let is_group = element.as_object().is_some_and(|o| !o.contains_key("hash"));
            if !is_group {
                entries.push(VllmKernel::deserialize(element).map_err(context)?);
                continue;
            }
            let group = Group::deserialize(element).map_err(context)?;
            let hash = Some(group.vllm_hash.clone()).filter(|h| !h.is_empty());
            cpp.extend(group.cpp.into_iter().map(|kernel| VllmCppKernel {
                vllm_hash: hash.clone(),
                kernel,
                cache_format: group.cache_format,
            }));
            for mut entry in group.triton {
                if entry.vllm_hash.as_deref().is_none_or(str::is_empty) {
                    entry.vllm_hash = Some(group.vllm_hash.clone());
                }
                entry.cache_format = entry.cache_format.or(group.cache_format);
                entries.push(entry);
            }
        }
        // No hash and an empty one are written alike; read them alike.
        for entry in &mut entries {
            entry.vllm_hash = entry.vllm_hash.take().filter(|h| !h.is_empty());
        }
        Ok((entries, cpp))
    }
}

/// The entries of a `"vllm"` member: MCV's groups, or a flat list; `null`
/// reads as an empty list.
pub(super) fn read_groups(
    value: serde_json::Value,
) -> Result<Option<Vec<CacheEntry>>, serde_json::Error> {
    let (kernels, cpp) = vllm_groups::deserialize(value)?;
    let entries = kernels
        .into_iter()
        .map(CacheEntry::new)
        .chain(cpp.into_iter().map(CacheEntry::new));
    Ok(Some(entries.collect()))
}

/// One `"vllm"` group as written: a hash directory's kernels in one layout
/// and, for the `binary` and `aot_compile` layouts, its artefact records.
#[derive(Serialize)]
pub(super) struct GroupOut<'a> {
    #[serde(rename = "vllmHash")]
    vllm_hash: &'a str,
    #[serde(rename = "cacheFormat", skip_serializing_if = "Option::is_none")]
    cache_format: Option<VllmFormat>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    triton: Vec<&'a TritonKernel>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    cpp: Vec<&'a CppKernel>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    binary: &'a [BinaryArtefacts],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    aot_compile: &'a [AotModel],
}

/// The `"vllm"` groups of `entries`, one per hash directory and layout, in
/// the entries' order; each hash directory's artefact records join its
/// group of the matching layout, or a group of their own when it has no
/// kernel of that layout.
pub(super) fn groups<'a>(
    entries: &'a [CacheEntry],
    artefacts: &'a [VllmArtefacts],
) -> Vec<GroupOut<'a>> {
    let mut groups: Vec<GroupOut<'a>> = Vec::new();
    for entry in entries.iter().filter_map(CacheEntry::facts::<VllmKernel>) {
        let hash = entry.vllm_hash.as_deref().unwrap_or_default();
        let bare = &entry.kernel;
        match groups
            .iter_mut()
            .find(|g| g.vllm_hash == hash && g.cache_format == entry.cache_format)
        {
            Some(group) => group.triton.push(bare),
            None => groups.push(GroupOut {
                vllm_hash: hash,
                cache_format: entry.cache_format,
                triton: vec![bare],
                cpp: Vec::new(),
                binary: &[],
                aot_compile: &[],
            }),
        }
    }
    for entry in entries
        .iter()
        .filter_map(CacheEntry::facts::<VllmCppKernel>)
    {
        let hash = entry.vllm_hash.as_deref().unwrap_or_default();
        match groups
            .iter_mut()
            .find(|g| g.vllm_hash == hash && g.cache_format == entry.cache_format)
        {
            Some(group) => group.cpp.push(&entry.kernel),
            None => groups.push(GroupOut {
                vllm_hash: hash,
                cache_format: entry.cache_format,
                triton: Vec::new(),
                cpp: vec![&entry.kernel],
                binary: &[],
                aot_compile: &[],
            }),
        }
    }
    for records in artefacts {
        for (format, binary, aot_compile) in [
            (VllmFormat::Binary, &records.binary[..], &[][..]),
            (VllmFormat::AotCompile, &[][..], &records.aot_compile[..]),
        ] {
            if binary.is_empty() && aot_compile.is_empty() {
                continue;
            }
            let hash = records.vllm_hash.as_str();
            let found = groups
                .iter_mut()
                .find(|g| g.vllm_hash == hash && g.cache_format == Some(format));
            match found {
                Some(group) => {
                    group.binary = binary;
                    group.aot_compile = aot_compile;
                }
                None => groups.push(GroupOut {
                    vllm_hash: hash,
                    cache_format: Some(format),
                    triton: Vec::new(),
                    cpp: Vec::new(),
                    binary,
                    aot_compile,
                }),
            }
        }
    }
    groups
}

/// The artefact records of a `manifest.json`'s `"vllm"` groups. Lenient: a
/// record that does not parse is left out (the kernels are what gkm reads;
/// the records are informational).
pub(super) fn artefacts_of(bytes: &[u8]) -> Vec<VllmArtefacts> {
    #[derive(Deserialize)]
    struct Doc {
        #[serde(default)]
        vllm: Option<Vec<serde_json::Value>>,
    }
    let Ok(Doc { vllm: Some(groups) }) = serde_json::from_slice::<Doc>(bytes) else {
        return Vec::new();
    };
    let list = |group: &serde_json::Value, key: &str| -> Vec<serde_json::Value> {
        group
            .get(key)
            .and_then(serde_json::Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let mut out: Vec<VllmArtefacts> = Vec::new();
    for group in &groups {
        let hash = group
            .get("vllmHash")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        let binary: Vec<BinaryArtefacts> = list(group, "binary")
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect();
        let aot_compile: Vec<AotModel> = list(group, "aot_compile")
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect();
        if binary.is_empty() && aot_compile.is_empty() {
            continue;
        }
        match out.iter_mut().find(|a| a.vllm_hash == hash) {
            Some(records) => {
                records.binary.extend(binary);
                records.aot_compile.extend(aot_compile);
            }
            None => out.push(VllmArtefacts {
                vllm_hash: hash.to_string(),
                binary,
                aot_compile,
            }),
        }
    }
    out
}

/// A summary label whose CUDA architectures are named `sm_XY`, fields in
/// the order [`Summary::to_label`] writes them.
pub(super) fn sm_summary_label(summary: &Summary) -> String {
    #[derive(Serialize)]
    struct Target<'a> {
        backend: &'a Backend,
        arch: String,
        warp_size: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        ptx_version: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cuda_version: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        triton_version: Option<&'a str>,
    }
    #[derive(Serialize)]
    struct Label<'a> {
        targets: Vec<Target<'a>>,
    }
    let targets = summary
        .targets
        .iter()
        .map(|t| Target {
            backend: &t.backend,
            arch: t.arch.sm_name().unwrap_or_else(|| t.arch.to_string()),
            warp_size: t.warp_size,
            ptx_version: t.ptx_version,
            cuda_version: t.cuda_version.as_deref(),
            triton_version: t.triton_version.as_deref(),
        })
        .collect();
    // Serialising these types cannot fail: every map key is a string.
    serde_json::to_string(&Label { targets }).unwrap_or_default()
}
