//! The same tree gives the same image digest, whatever its mtimes,
//! permissions (beyond the exec bit) and file creation order (Triton
//! trees: the kinds whose layers carry mtimes, `Kind::keeps_mtimes`, give
//! the same digest for the same mtimes).

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, SystemTime};

use common::{FIXTURES, tree};
use gkm_oci::{BuildOptions, Compression, ImageRef, RegistryOptions, build};
use gkm_testenv::{copy_tree_in_order, fixture_cache};

fn touch_all(root: &std::path::Path, when: SystemTime) {
    for rel in tree(root).keys() {
        let f = std::fs::File::options()
            .read(true)
            .open(root.join(rel))
            .expect("open");
        f.set_modified(when).expect("set mtime");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn same_tree_same_digest() {
    let work = tempfile::tempdir().expect("tempdir");
    let opts = RegistryOptions::default();
    for name in FIXTURES {
        for compression in [Compression::Zstd, Compression::Gzip] {
            let a = work.path().join(format!("{name}-a"));
            let b = work.path().join(format!("{name}-b"));
            copy_tree_in_order(&fixture_cache(name), &a, false).unwrap();
            copy_tree_in_order(&fixture_cache(name), &b, true).unwrap();
            touch_all(&a, SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000));
            touch_all(&b, SystemTime::now());
            let options = BuildOptions {
                compression,
                title: Some(name.to_string()),
                ..BuildOptions::default()
            };
            let mut digests = Vec::new();
            for (dir, layout) in [(&a, "one"), (&b, "two")] {
                let dest: ImageRef = format!("oci:{}/{layout}:{name}", work.path().display())
                    .parse()
                    .expect("ref");
                digests.push(build(dir, &dest, &options, &opts).await.expect("build"));
            }
            assert_eq!(
                digests[0].digest, digests[1].digest,
                "{name}: digests differ"
            );
            assert_eq!(digests[0].layer.digest, digests[1].layer.digest);

            // A changed byte changes the digest: the comparison can fail.
            let some_file = tree(&b)
                .into_iter()
                .find_map(|(k, v)| matches!(v, common::Node::File { .. }).then_some(k))
                .expect("a file");
            let mut bytes = std::fs::read(b.join(&some_file)).expect("read");
            bytes.push(b'\n');
            std::fs::write(b.join(&some_file), bytes).expect("write");
            let dest: ImageRef = format!("oci:{}/three:{name}", work.path().display())
                .parse()
                .expect("ref");
            let changed = build(&b, &dest, &options, &opts).await.expect("build");
            assert_ne!(changed.digest, digests[0].digest);
        }
    }
}
