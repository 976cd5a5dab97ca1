//! The node store: no work for a stored digest, no partial trees, leftovers
//! cleaned at open, unreferenced digests collected.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;

use gkm_oci::{BuildOptions, ExtractPolicy, Image, ImageRef, RegistryOptions, Repo, Store, build};
use gkm_testenv::fixture_cache;

async fn built(work: &std::path::Path, name: &str) -> (ImageRef, gkm_oci::Digest) {
    let dest: ImageRef = format!("oci:{}/layout:{name}", work.display())
        .parse()
        .expect("ref");
    let b = build(
        &fixture_cache(name),
        &dest,
        &BuildOptions::default(),
        &RegistryOptions::default(),
    )
    .await
    .expect("build");
    (dest, b.digest)
}

#[tokio::test(flavor = "multi_thread")]
async fn second_request_does_no_work() {
    let work = tempfile::tempdir().expect("tempdir");
    let (dest, digest) = built(work.path(), "triton-vector-add-cuda-sm75").await;
    let opts = RegistryOptions::default();
    let store = Store::open(work.path().join("store")).expect("open");
    let first = store
        .ensure(
            &Repo::open(&dest, &opts).expect("repo"),
            &ExtractPolicy::default(),
            None,
        )
        .await
        .expect("ensure");
    assert!(first.extracted.is_some());
    assert_eq!(store.list().expect("list"), vec![digest.clone()]);

    // Remove the layer blob: a second request must not need it.
    let repo = Repo::open(&dest, &opts).expect("repo");
    let image = Image::fetch(&repo).await.expect("fetch");
    let layer = image.cache_layer().expect("layer").digest.clone();
    std::fs::remove_file(
        gkm_oci::Layout::open(work.path().join("layout"))
            .expect("layout")
            .blob_path(&layer),
    )
    .expect("rm blob");
    let again = store
        .ensure(&repo, &ExtractPolicy::default(), None)
        .await
        .expect("ensure again");
    assert_eq!(again.extracted, None);
    assert_eq!(again.path, first.path);

    // Pinned by digest, it does not even read the manifest.
    let layout_gone = dest.with_digest(&digest);
    std::fs::remove_dir_all(work.path().join("layout")).expect("rm layout");
    std::fs::create_dir_all(work.path().join("layout")).expect("mkdir");
    std::fs::write(
        work.path().join("layout/oci-layout"),
        b"{\"imageLayoutVersion\":\"1.0.0\"}",
    )
    .expect("marker");
    let third = store
        .ensure(
            &Repo::open(&layout_gone, &opts).expect("repo"),
            &ExtractPolicy::default(),
            None,
        )
        .await
        .expect("pinned");
    assert_eq!(third.extracted, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn leftovers_cleaned_and_gc() {
    let work = tempfile::tempdir().expect("tempdir");
    let root = work.path().join("store");
    let store = Store::open(&root).expect("open");
    // What a process killed mid-extraction leaves: a staging tree and its
    // (no longer held) lock.
    let leftover = root.join("staging/0123456789ab-999-0-0");
    std::fs::create_dir_all(leftover.join("io.triton.cache/partial")).expect("mkdir");
    std::fs::write(
        leftover.join("io.triton.cache/partial/kernel.cubin"),
        b"half",
    )
    .expect("write");
    std::fs::write(leftover.with_extension("lock"), b"").expect("lock");
    // A live extraction's staging directory, whose lock is held, stays.
    let live = root.join("staging/live");
    std::fs::create_dir_all(&live).expect("mkdir");
    let lock = std::fs::File::create(live.with_extension("lock")).expect("lock");
    lock.lock().expect("take lock");
    drop(store);

    let store = Store::open(&root).expect("reopen");
    assert!(!leftover.exists(), "leftover staging tree survived");
    assert!(!leftover.with_extension("lock").exists());
    assert!(live.exists(), "a held staging directory was removed");
    assert!(
        store.list().expect("list").is_empty(),
        "a partial tree is visible"
    );
    drop(lock);

    let opts = RegistryOptions::default();
    let (a, da) = built(work.path(), "triton-vector-add-cuda-sm75").await;
    let (b, db) = built(work.path(), "triton-vector-add-rocm-gfx90a").await;
    for r in [&a, &b] {
        store
            .ensure(
                &Repo::open(r, &opts).expect("repo"),
                &ExtractPolicy::default(),
                None,
            )
            .await
            .expect("ensure");
    }
    let mut both = vec![da.clone(), db.clone()];
    both.sort();
    assert_eq!(store.list().expect("list"), both);
    let removed = store.gc(&HashSet::from([da.clone()])).expect("gc");
    assert_eq!(removed, vec![db.clone()]);
    assert_eq!(store.list().expect("list"), vec![da.clone()]);
    assert!(store.get(&db).is_none());
    assert!(store.get(&da).is_some());
    assert!(store.remove(&da).expect("remove"));
    assert!(
        !store.remove(&da).expect("remove again"),
        "no longer stored"
    );
    assert!(store.list().expect("list").is_empty());
}
