//! The JSON shapes of `manifest.json` and the summary label that differ from
//! the Rust types: MCV's grouped vLLM entries and Go's `null` lists.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{CacheEntry, VllmFormat};

/// A list that Go writes as `null` when it is empty.
pub(super) fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// `"vllm"`: kernel entries written as MCV's groups, one per vLLM hash and
/// layout.
pub(super) mod vllm_groups {
    use serde::de::Error as _;

    use super::*;

    /// One group as MCV writes it.
    #[derive(Serialize, Deserialize)]
    struct Group {
        #[serde(rename = "vllmHash", default)]
        vllm_hash: String,
        #[serde(
            rename = "cacheFormat",
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "known_format"
        )]
        cache_format: Option<VllmFormat>,
        #[serde(default, deserialize_with = "null_as_empty")]
        triton: Vec<CacheEntry>,
    }

    /// A layout name; one gkm does not know (a newer MCV's) reads as `None`.
    fn known_format<'de, D: Deserializer<'de>>(d: D) -> Result<Option<VllmFormat>, D::Error> {
        let value = Option::<serde_json::Value>::deserialize(d)?;
        Ok(value.and_then(|v| VllmFormat::deserialize(v).ok()))
    }

    pub(in crate::cache) fn serialize<S: Serializer>(
        entries: &Option<Vec<CacheEntry>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let Some(entries) = entries else {
            return s.serialize_none();
        };
        let mut groups: Vec<Group> = Vec::new();
        for entry in entries {
            let hash = entry.vllm_hash.clone().unwrap_or_default();
            let mut bare = entry.clone();
            bare.vllm_hash = None;
            bare.cache_format = None;
            match groups
                .iter_mut()
                .find(|g| g.vllm_hash == hash && g.cache_format == entry.cache_format)
            {
                Some(group) => group.triton.push(bare),
                None => groups.push(Group {
                    vllm_hash: hash,
                    cache_format: entry.cache_format,
                    triton: vec![bare],
                }),
            }
        }
        groups.serialize(s)
    }

    pub(in crate::cache) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<CacheEntry>>, D::Error> {
        let Some(elements) = Option::<Vec<serde_json::Value>>::deserialize(d)? else {
            return Ok(Some(Vec::new()));
        };
        let mut entries = Vec::new();
        for (i, element) in elements.into_iter().enumerate() {
            let context = |e: serde_json::Error| D::Error::custom(format!("vllm[{i}]: {e}"));
            let is_group = element.as_object().is_some_and(|o| !o.contains_key("hash"));
            if !is_group {
                entries.push(CacheEntry::deserialize(element).map_err(context)?);
                continue;
            }
            let group = Group::deserialize(element).map_err(context)?;
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
        Ok(Some(entries))
    }
}
