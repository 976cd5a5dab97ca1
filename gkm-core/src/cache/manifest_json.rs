//! The JSON shape of `manifest.json` every kind shares: its entries under
//! the kind's name, then the facts it carries; and Go's `null` lists.

use serde::{Deserialize, Deserializer, Serialize};

/// A list that Go writes as `null` when it is empty.
pub(crate) fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// `manifest.json` bytes, pretty-printed: `entries` (the kind's form of
/// them) under the kind's `name`, then the kind's `facts` under their name
/// when it has any.
pub(crate) fn write<E: Serialize + ?Sized, F: Serialize>(
    name: &str,
    entries: &E,
    facts: Option<(&str, &F)>,
) -> Vec<u8> {
    struct Doc<'a, E: ?Sized, F> {
        name: &'a str,
        entries: &'a E,
        facts: Option<(&'a str, &'a F)>,
    }
    impl<E: Serialize + ?Sized, F: Serialize> Serialize for Doc<'_, E, F> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut map = s.serialize_map(None)?;
            map.serialize_entry(self.name, self.entries)?;
            if let Some((name, facts)) = self.facts {
                map.serialize_entry(name, facts)?;
            }
            map.end()
        }
    }
    // Serialising these types cannot fail: every map key is a string.
    serde_json::to_vec_pretty(&Doc {
        name,
        entries,
        facts,
    })
    .unwrap_or_default()
}
