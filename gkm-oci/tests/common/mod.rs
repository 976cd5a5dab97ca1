//! Helpers shared by gkm-oci's integration tests.
#![allow(dead_code)]
// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The three fixture caches, by name.
pub const FIXTURES: [&str; 3] = [
    "triton-vector-add-cuda-sm75",
    "triton-vector-add-rocm-gfx90a",
    "vllm-torch-compile-inductor",
];

/// One node of a tree: a directory, or a file's bytes and exec bit.
#[derive(Debug, PartialEq, Eq)]
pub enum Node {
    Dir,
    File { bytes: Vec<u8>, exec: bool },
}

/// Every path below `root` with what it holds; fails on anything else.
pub fn tree(root: &Path) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let entry = entry.expect("dir entry");
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .expect("below root")
                .to_string_lossy()
                .into_owned();
            let meta = std::fs::symlink_metadata(&path).expect("metadata");
            if meta.is_dir() {
                out.insert(rel, Node::Dir);
                stack.push(path);
            } else if meta.is_file() {
                let exec = meta.permissions().mode() & 0o111 != 0;
                out.insert(
                    rel,
                    Node::File {
                        bytes: std::fs::read(&path).expect("read"),
                        exec,
                    },
                );
            } else {
                panic!("{} is neither a file nor a directory", path.display());
            }
        }
    }
    out
}

/// Assert two trees hold the same paths, bytes and exec bits.
pub fn assert_same_tree(expected: &Path, actual: &Path) {
    let (a, b) = (tree(expected), tree(actual));
    let names_a: Vec<_> = a.keys().collect();
    let names_b: Vec<_> = b.keys().collect();
    assert_eq!(
        names_a,
        names_b,
        "{} and {} list different paths",
        expected.display(),
        actual.display()
    );
    for (k, v) in &a {
        assert!(
            b.get(k) == Some(v),
            "{k} differs between {} and {}",
            expected.display(),
            actual.display()
        );
    }
}
