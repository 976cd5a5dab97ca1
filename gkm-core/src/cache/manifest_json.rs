//! The JSON shape of `manifest.json` every kind shares: its entries under
//! the kind's name, then the facts it carries; and Go's `null` lists.

use serde::{Deserialize, Deserializer, Serialize};

use super::CacheManifest;

/// A list that Go writes as `null` when it is empty.
pub(crate) fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// `manifest.json` bytes, pretty-printed: `entries` (the kind's form of
/// them) under the kind's name, then `format` and `torch` when set.
pub(crate) fn write<E: Serialize + ?Sized>(manifest: &CacheManifest, entries: &E) -> Vec<u8> {
    struct Doc<'a, E: ?Sized> {
        manifest: &'a CacheManifest,
        entries: &'a E,
    }
    impl<E: Serialize + ?Sized> Serialize for Doc<'_, E> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut map = s.serialize_map(None)?;
            map.serialize_entry(self.manifest.kind.as_str(), self.entries)?;
            if let Some(format) = &self.manifest.format {
                map.serialize_entry("format", format)?;
            }
            if let Some(torch) = &self.manifest.torch {
                map.serialize_entry("torch", torch)?;
            }
            map.end()
        }
    }
    // Serialising these types cannot fail: every map key is a string.
    serde_json::to_vec_pretty(&Doc { manifest, entries }).unwrap_or_default()
}
