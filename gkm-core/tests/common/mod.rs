//! Fixture paths and tree building shared by the integration tests.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};

/// The real cache fixtures (`shared/fixtures/caches`), found by walking up
/// from this crate.
pub fn fixtures() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .map(|dir| dir.join("shared/fixtures/caches"))
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| panic!("no shared/fixtures/caches above {}", here.display()))
}

/// One fixture cache.
pub fn fixture(name: &str) -> PathBuf {
    fixtures().join(name)
}

/// The CUDA fixture's kernel directory.
pub const CUDA_KEY: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";

/// The CUDA fixture's `add_kernel.json`.
pub fn cuda_kernel_json() -> Vec<u8> {
    fs::read(
        fixture("triton-vector-add-cuda-sm75")
            .join(CUDA_KEY)
            .join("add_kernel.json"),
    )
    .expect("reading the CUDA fixture's kernel metadata")
}

/// Copy a tree (files and directories), creating children in sorted or, with
/// `reverse`, reverse order, so tests can create the same tree in different
/// orders.
pub fn copy_tree(from: &Path, to: &Path, reverse: bool) {
    fs::create_dir_all(to).expect("creating a directory");
    let mut children: Vec<_> = fs::read_dir(from)
        .expect("listing a fixture")
        .map(|e| e.expect("listing a fixture").path())
        .collect();
    children.sort();
    if reverse {
        children.reverse();
    }
    for child in children {
        let dest = to.join(child.file_name().expect("a file name"));
        if child.is_dir() {
            copy_tree(&child, &dest, reverse);
        } else {
            fs::copy(&child, &dest).expect("copying a fixture file");
        }
    }
}

/// Write a file, creating its parent directories.
pub fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().expect("a parent")).expect("creating a directory");
    fs::write(path, bytes).expect("writing a file");
}

/// Bytes that look like a serialised artefact: binary noise around the
/// given kernel metadata documents, as pickle stores byte strings.
pub fn artefact(documents: &[&[u8]]) -> Vec<u8> {
    let mut blob = vec![0x80, 0x05, 0x95, 0x13, 0x00, 0xff, b'{', 0x8c];
    for doc in documents {
        blob.extend_from_slice(b"\x8c\x0eadd_kernel.json\x94C");
        blob.extend_from_slice(&(doc.len() as u32).to_le_bytes());
        blob.extend_from_slice(doc);
        blob.extend_from_slice(b"\x94\x00\x7f\xfe{\"hash\": \"fx-graph\", \"x\": 1}");
    }
    blob.extend_from_slice(&[0u8; 64]);
    blob
}
