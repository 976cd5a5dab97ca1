//! Which namespace each relocation layer was made for, so that one
//! namespace's pods cannot take every layer the node allows.
//!
//! A layer belongs to its digest and mount path, and pods of any namespace
//! that may mount the digest reuse it; it counts against the namespace
//! whose pod made it. The driver keeps one empty marker file per layer
//! made, `<store>/csi/relocation-owners/<namespace>/<hex>.<path key>`,
//! where no pod reaches. A marker whose layer is gone (its entry collected
//! or quarantined) is removed when its namespace's layers are counted.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use gkm_k8s_node::relocation::RELOCATIONS_DIR;

/// The directory below the store root holding the markers.
pub const OWNERS_DIR: &str = "csi/relocation-owners";

/// The marker of the layer at `layer` (`<store>/relocations/<hex>/<key>`)
/// for `namespace`, below the store root `store`.
fn marker(store: &Path, namespace: &str, layer: &Path) -> Option<PathBuf> {
    let key = layer.file_name()?.to_str()?;
    let hex = layer.parent()?.file_name()?.to_str()?;
    Some(
        store
            .join(OWNERS_DIR)
            .join(namespace)
            .join(format!("{hex}.{key}")),
    )
}

/// Marks the layer at `layer` as made for `namespace`.
pub fn mark(store: &Path, namespace: &str, layer: &Path) -> io::Result<()> {
    let marker = marker(store, namespace, layer).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a relocation layer", layer.display()),
        )
    })?;
    if let Some(dir) = marker.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::File::create(&marker).map(drop)
}

/// How many layers made for `namespace` are still there; the markers of
/// those gone are removed.
pub fn count(store: &Path, namespace: &str) -> io::Result<u64> {
    let dir = store.join(OWNERS_DIR).join(namespace);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut held = 0;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let layer = name
            .to_str()
            .and_then(|n| n.split_once('.'))
            .map(|(hex, key)| store.join(RELOCATIONS_DIR).join(hex).join(key));
        match layer {
            Some(layer) if layer.is_dir() => held += 1,
            _ => fs::remove_file(entry.path())?,
        }
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_counts_the_layers_made_for_it_that_are_still_there() {
        let store = tempfile::tempdir().expect("tempdir");
        let layer = |hex: &str, key: &str| {
            let dir = store.path().join(RELOCATIONS_DIR).join(hex).join(key);
            fs::create_dir_all(&dir).expect("layer");
            dir
        };
        let (a, b) = (layer("aa", "k1"), layer("bb", "k2"));
        mark(store.path(), "team", &a).expect("marked");
        mark(store.path(), "team", &b).expect("marked");
        mark(store.path(), "other", &b).expect("marked");
        assert_eq!(count(store.path(), "team").expect("count"), 2);
        assert_eq!(count(store.path(), "nobody").expect("count"), 0);
        // A layer collected with its entry no longer counts, nor is marked.
        fs::remove_dir_all(store.path().join(RELOCATIONS_DIR).join("aa")).expect("collected");
        assert_eq!(count(store.path(), "team").expect("count"), 1);
        let markers = fs::read_dir(store.path().join(OWNERS_DIR).join("team"))
            .expect("markers")
            .count();
        assert_eq!(markers, 1, "the collected layer's marker is removed");
        assert_eq!(count(store.path(), "other").expect("count"), 1);
    }
}
