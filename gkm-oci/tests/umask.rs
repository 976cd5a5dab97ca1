//! Extracted trees have the modes gkm sets, whatever the process umask: never
//! world-writable under umask 000, still readable by pods under umask 077.
//! One test in its own binary, as the umask belongs to the whole process.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::FIXTURES;
use gkm_oci::{
    BuildOptions, ExtractPolicy, Image, ImageRef, RegistryOptions, Repo, Store, UnpackOptions,
    build, extract_to_dir,
};
use gkm_testenv::fixture_cache;

/// Every directory and file below `root` with its permission bits.
fn modes(root: &Path) -> Vec<(String, bool, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let entry = entry.expect("entry");
            let meta = entry.metadata().expect("metadata");
            let mode = meta.permissions().mode() & 0o7777;
            out.push((entry.path().display().to_string(), meta.is_dir(), mode));
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn modes_do_not_depend_on_the_umask() {
    let work = tempfile::tempdir().expect("tempdir");
    let opts = RegistryOptions::default();
    let image: ImageRef = format!("oci:{}/built:v1", work.path().display())
        .parse()
        .expect("ref");
    build(
        &fixture_cache(FIXTURES[0]),
        &image,
        &BuildOptions::default(),
        &opts,
    )
    .await
    .expect("build");
    let repo = Repo::open(&image, &opts).expect("repo");
    let img = Image::fetch(&repo).await.expect("fetch");
    for umask in [0o000, 0o077] {
        // SAFETY: umask only sets the process's file mode creation mask.
        unsafe { libc::umask(umask) };
        let store = Store::open(work.path().join(format!("store-{umask:o}")))
            .expect("store")
            .with_durability(false);
        let stored = store
            .ensure(&repo, &ExtractPolicy::default(), None)
            .await
            .expect("ensure");
        let out = work.path().join(format!("out-{umask:o}/cache"));
        let options = UnpackOptions {
            no_sync: true,
            ..UnpackOptions::default()
        };
        extract_to_dir(&repo, &img, &out, &options)
            .await
            .expect("extract");
        let mut seen = modes(&stored.path);
        seen.extend(modes(&out));
        assert!(seen.len() > 4, "{seen:?}");
        for (path, is_dir, mode) in seen {
            let want = if is_dir { 0o755 } else { 0o644 };
            // Executables keep 0755; nothing else is allowed.
            assert!(
                mode == want || (!is_dir && mode == 0o755),
                "umask {umask:03o}: {path} has mode {mode:o}"
            );
        }
        let root = store.root().join("sha256");
        let root_mode = std::fs::metadata(&root).expect("meta").permissions().mode() & 0o777;
        assert_eq!(root_mode, 0o755, "umask {umask:03o}: {}", root.display());
    }
}
