//! The bodies of gkm's fuzz targets (`fuzz/`), also run on stable as
//! property tests. Each must return without panicking whatever the input.

use std::path::Path;

use crate::extract::{ExtractPolicy, Mapping, extract_tar};

/// Extract arbitrary bytes as a layer tar into a fresh directory below
/// `scratch` under a small policy, then check nothing escaped: the only
/// thing in `scratch` afterwards is that directory, and it holds no links
/// (links are rejected by default). Returns whether the archive was accepted.
pub fn tar_extraction(data: &[u8], scratch: &Path) -> bool {
    let policy = ExtractPolicy {
        max_entry_size: 1 << 20,
        max_total_size: 4 << 20,
        max_entries: 1_000,
        ratio_grace_bytes: 1 << 20,
        ..ExtractPolicy::default()
    };
    let dest = scratch.join("dest");
    if std::fs::create_dir(&dest).is_err() {
        return false;
    }
    let accepted = extract_tar(data, &dest, Mapping::Layer, &policy).is_ok();
    assert_only_dest(scratch, &dest);
    let _ = std::fs::remove_dir_all(&dest);
    accepted
}

fn assert_only_dest(scratch: &Path, dest: &Path) {
    let names: Vec<_> = std::fs::read_dir(scratch)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert_eq!(
        names,
        vec![dest.to_path_buf()],
        "extraction wrote outside its directory"
    );
    let mut stack = vec![dest.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let ft = entry
                .file_type()
                .map(|t| (t.is_dir(), t.is_file()))
                .unwrap_or((false, false));
            match ft {
                (true, _) => stack.push(entry.path()),
                (_, true) => {}
                _ => panic!(
                    "extraction created {:?}, which is neither file nor directory",
                    entry.path()
                ),
            }
        }
    }
}

/// Parse arbitrary bytes as `manifest.json`; what parses must round-trip.
pub fn manifest_json(data: &[u8]) {
    if let Ok(m) = gkm_core::cache::CacheManifest::from_json(data) {
        let again = gkm_core::cache::CacheManifest::from_json(&m.to_json());
        assert!(again.is_ok(), "a manifest gkm wrote does not read back");
    }
}

/// Parse an arbitrary string as a summary label; what parses must
/// round-trip.
pub fn summary_label(data: &str) {
    if let Ok(s) = gkm_core::cache::Summary::from_label(data) {
        assert_eq!(
            gkm_core::cache::Summary::from_label(&s.to_label()).ok(),
            Some(s)
        );
    }
}

/// Parse an arbitrary string as an image reference; what parses must
/// print to something that parses to the same reference.
pub fn image_reference(data: &str) {
    if let Ok(r) = data.parse::<crate::ImageRef>() {
        let printed = r.to_string();
        let again = printed.parse::<crate::ImageRef>();
        assert!(again.is_ok(), "{printed:?} (from {data:?}) does not parse");
        if let Ok(again) = again {
            assert_eq!(again.to_string(), printed);
        }
    }
}
