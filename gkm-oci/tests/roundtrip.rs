//! Build → push → inspect → pull → extract gives back the same tree, on an
//! OCI layout and on a real registry, for every fixture cache.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{FIXTURES, assert_same_tree};
use gkm_oci::{
    BuildOptions, Compression, ExtractPolicy, Image, ImageRef, RegistryOptions, Repo, Store,
    UnpackOptions, build, copy_image, extract_to_dir,
};
use gkm_testenv::fixture_cache;

fn expected_targets(name: &str) -> Vec<String> {
    let scanned = gkm_core::cache::scan(&fixture_cache(name)).expect("scan fixture");
    let mut t: Vec<String> = scanned
        .summary()
        .targets
        .iter()
        .map(ToString::to_string)
        .collect();
    match name {
        "triton-vector-add-cuda-sm75" => assert!(t.contains(&"cuda/75/32".to_string()), "{t:?}"),
        "triton-vector-add-rocm-gfx90a" => {
            assert!(t.contains(&"hip/gfx90a/64".to_string()), "{t:?}")
        }
        _ => {}
    }
    t.sort();
    t
}

async fn inspect(image: &ImageRef, opts: &RegistryOptions) -> (Image, Vec<String>) {
    let repo = Repo::open(image, opts).expect("open");
    let img = Image::fetch(&repo).await.expect("fetch image");
    let cache = img.cache().expect("cache labels");
    let mut t: Vec<String> = cache
        .summary
        .targets
        .iter()
        .map(ToString::to_string)
        .collect();
    t.sort();
    // The summary is readable without the config too.
    let from_annotations =
        gkm_oci::CacheLabels::read(&img.manifest.annotations).expect("annotations");
    assert_eq!(from_annotations.summary, cache.summary);
    (img, t)
}

async fn extract_and_compare(
    name: &str,
    image: &ImageRef,
    opts: &RegistryOptions,
    work: &std::path::Path,
) {
    let src = fixture_cache(name);
    let repo = Repo::open(image, opts).expect("open");
    let img = Image::fetch(&repo).await.expect("fetch");
    let out = work.join(format!("out-{}", img.digest.hex()));
    extract_to_dir(&repo, &img, &out, &UnpackOptions::default())
        .await
        .expect("extract");
    assert_same_tree(&src, &out);

    let store = Store::open(work.join("store")).expect("store");
    let stored = store
        .ensure(&repo, &ExtractPolicy::default(), None)
        .await
        .expect("store");
    let layout = gkm_oci::labels::KindLayout::of(img.cache().expect("labels").kind);
    assert_same_tree(&src, &stored.path.join(layout.cache_dir));
    let manifest = std::fs::read(stored.path.join(layout.manifest_path())).expect("manifest.json");
    let manifest =
        gkm_core::cache::CacheManifest::from_json(&manifest).expect("parse manifest.json");
    assert_eq!(manifest, gkm_core::cache::scan(&src).expect("scan"));
}

#[tokio::test(flavor = "multi_thread")]
async fn layout_round_trip() {
    let work = tempfile::tempdir().expect("tempdir");
    let opts = RegistryOptions::default();
    for name in FIXTURES {
        for compression in [Compression::Zstd, Compression::Gzip] {
            let built_ref: ImageRef = format!("oci:{}/built:{name}", work.path().display())
                .parse()
                .expect("ref");
            let built = build(
                &fixture_cache(name),
                &built_ref,
                &BuildOptions {
                    compression,
                    title: None,
                    ..BuildOptions::default()
                },
                &opts,
            )
            .await
            .expect("build");
            let (img, targets) = inspect(&built_ref, &opts).await;
            assert_eq!(img.digest, built.digest);
            assert_eq!(targets, expected_targets(name));
            assert_eq!(
                img.cache_layer()
                    .expect("layer")
                    .compression()
                    .expect("compression"),
                compression
            );

            let pulled: ImageRef = format!("oci:{}/pulled:{name}", work.path().display())
                .parse()
                .expect("ref");
            let src = Repo::open(&built_ref, &opts).expect("open");
            let dst = Repo::create(&pulled, &opts).expect("create");
            assert_eq!(
                copy_image(&src, &dst, None).await.expect("copy"),
                built.digest
            );
            extract_and_compare(name, &pulled, &opts, work.path()).await;
        }
    }
}

/// Build fixture `name` to `remote`, then check that inspect reports its
/// targets and that extraction under `work` gives back the fixture.
async fn build_and_read_back(
    name: &str,
    remote: &ImageRef,
    opts: &RegistryOptions,
    work: &std::path::Path,
) -> gkm_oci::Built {
    let built = build(&fixture_cache(name), remote, &BuildOptions::default(), opts)
        .await
        .expect("build+push");
    let (img, targets) = inspect(remote, opts).await;
    assert_eq!(img.digest, built.digest);
    let repo = Repo::open(remote, opts).expect("open");
    let resolved = Image::resolve(&repo).await.expect("resolve");
    assert_eq!(
        resolved, built.digest,
        "resolve gives the digest fetch gives"
    );
    assert_eq!(targets, expected_targets(name));
    extract_and_compare(name, remote, opts, work).await;
    built
}

#[tokio::test(flavor = "multi_thread")]
async fn registry_round_trip() {
    let registry = gkm_testenv::Registry::shared()
        .expect("start docker-registry (apt-get install -y docker-registry)");
    let work = tempfile::tempdir().expect("tempdir");
    let opts = RegistryOptions {
        insecure: true,
        ..Default::default()
    };
    for name in FIXTURES {
        let remote: ImageRef = format!("{}/roundtrip/{name}:v1", registry.addr())
            .parse()
            .expect("ref");
        let built = build_and_read_back(name, &remote, &opts, work.path()).await;

        let pulled: ImageRef = format!("oci:{}/pulled:{name}", work.path().display())
            .parse()
            .expect("ref");
        let digest = copy_image(
            &Repo::open(&remote, &opts).expect("open"),
            &Repo::create(&pulled, &opts).expect("create"),
            None,
        )
        .await
        .expect("pull");
        assert_eq!(digest, built.digest);
        extract_and_compare(name, &pulled, &opts, &work.path().join("from-layout")).await;
    }
}

/// A registry that wants credentials: build pushes with them, inspect and
/// extract read with them; without them, or with a wrong password, gkm says
/// it was not authorized.
#[tokio::test(flavor = "multi_thread")]
async fn registry_with_credentials() {
    let registry = gkm_testenv::Registry::start_with_basic_auth("builder", "s3cret")
        .expect("start docker-registry (apt-get install -y docker-registry)");
    let work = tempfile::tempdir().expect("tempdir");
    let with = |username: &str, password: &str| RegistryOptions {
        insecure: true,
        credentials: gkm_oci::Credentials::Basic {
            username: username.into(),
            password: password.into(),
        },
        ..RegistryOptions::default()
    };
    let opts = with("builder", "s3cret");
    let name = FIXTURES[0];
    let remote: ImageRef = format!("{}/private/{name}:v1", registry.addr())
        .parse()
        .expect("ref");
    build_and_read_back(name, &remote, &opts, work.path()).await;

    let anonymous = RegistryOptions {
        insecure: true,
        credentials: gkm_oci::Credentials::Anonymous,
        ..RegistryOptions::default()
    };
    for (who, opts) in [
        ("anonymous", anonymous),
        ("wrong password", with("builder", "guess")),
    ] {
        let err = Repo::open(&remote, &opts)
            .expect("open")
            .fetch_manifest()
            .await
            .expect_err(who);
        assert!(
            err.to_string().to_lowercase().contains("authoriz"),
            "{who}: {err}"
        );
    }
}
