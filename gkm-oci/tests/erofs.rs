//! EROFS twins of cache layers (`BuildOptions::erofs`): deterministic, the
//! tar layer's tree exactly, kept beside the image in a registry, and
//! checked before a node would mount one.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::{FIXTURES, Node, assert_same_tree, tree};
use gkm_oci::erofs::superblock;
use gkm_oci::erofs::write::ErofsWriter;
use gkm_oci::{
    BuildOptions, Compression, Image, ImageRef, RegistryOptions, Repo, UnpackOptions, build,
    copy_image, extract_to_dir,
};
use gkm_testenv::{Component, copy_tree_in_order, find_binary, fixture_cache};

fn writer() -> ErofsWriter {
    ErofsWriter {
        program: find_binary(Component::MkfsErofs).unwrap_or_else(|e| panic!("{e:#}")),
        ..ErofsWriter::default()
    }
}

fn options(compression: Compression) -> BuildOptions {
    BuildOptions {
        compression,
        // The same title whatever the layout is called.
        title: Some("erofs".into()),
        erofs: Some(writer()),
        ..BuildOptions::default()
    }
}

fn layout_ref(dir: &Path, tag: &str) -> ImageRef {
    format!("oci:{}:{tag}", dir.display()).parse().unwrap()
}

fn blob(layout: &Path, digest: &gkm_oci::Digest) -> PathBuf {
    layout.join("blobs/sha256").join(digest.hex())
}

/// The files of the EROFS image at `image`, extracted by erofs-utils'
/// fsck.erofs (which checks every file's encoding) into `out`.
fn erofs_files(image: &Path, out: &Path) {
    let fsck = find_binary(Component::FsckErofs).unwrap_or_else(|e| panic!("{e:#}"));
    let status = std::process::Command::new(fsck)
        .arg(format!("--extract={}", out.display()))
        .arg(image)
        .status()
        .expect("run fsck.erofs");
    assert!(
        status.success(),
        "fsck.erofs --extract of {}",
        image.display()
    );
}

/// Makes `root`'s files differ from the fixture in what an image ignores:
/// mtimes, and permissions beyond the exec bit.
fn perturb(root: &Path, when: SystemTime) {
    for (rel, node) in tree(root) {
        let path = root.join(&rel);
        if let Node::File { exec, .. } = node {
            let f = std::fs::File::options().read(true).open(&path).unwrap();
            f.set_modified(when).unwrap();
            let mode = if exec { 0o700 } else { 0o600 };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_tree_gives_the_same_erofs_bytes_holding_the_tar_layer_s_files() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let registry = RegistryOptions::default();
    for name in FIXTURES {
        let a = w.join(format!("{name}-a"));
        let b = w.join(format!("{name}-b"));
        copy_tree_in_order(&fixture_cache(name), &a, false).unwrap();
        copy_tree_in_order(&fixture_cache(name), &b, true).unwrap();
        perturb(&b, SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000));
        let mut built = Vec::new();
        for (dir, layout) in [(&a, "one"), (&b, "two")] {
            let dest = layout_ref(&w.join(layout), name);
            built.push(
                build(dir, &dest, &options(Compression::Zstd), &registry)
                    .await
                    .unwrap(),
            );
        }
        let (one, two) = (&built[0], &built[1]);
        let twin = one.erofs.clone().expect("an EROFS twin");
        assert_eq!(Some(&twin), two.erofs.as_ref(), "{name}: the twins differ");
        assert_eq!(one.digest, two.digest, "{name}: the image digests differ");
        let (blob_one, blob_two) = (
            blob(&w.join("one"), &twin.digest),
            blob(&w.join("two"), &twin.digest),
        );
        assert_eq!(
            std::fs::read(&blob_one).unwrap(),
            std::fs::read(&blob_two).unwrap()
        );
        assert_eq!(std::fs::metadata(&blob_one).unwrap().len(), twin.size);

        // The twin holds what the tar layer holds: the cache tree and its
        // manifest, the same bytes and exec bits.
        let files = w.join(format!("{name}-erofs"));
        erofs_files(&blob_one, &files);
        let repo = Repo::open(&layout_ref(&w.join("one"), name), &registry).unwrap();
        let image = Image::fetch(&repo).await.unwrap();
        assert_eq!(image.cache_layer().unwrap().erofs.as_ref(), Some(&twin));
        let extracted = w.join(format!("{name}-tar"));
        extract_to_dir(&repo, &image, &extracted, &UnpackOptions::default())
            .await
            .unwrap();
        let layout = gkm_oci::labels::KindLayout::of(image.cache().unwrap().kind);
        let under_cache = files.join(layout.cache_dir);
        assert_same_tree(&extracted, &under_cache);
        assert_same_tree(&fixture_cache(name), &under_cache);
        let manifest = std::fs::read(files.join(layout.manifest_path())).unwrap();
        assert_eq!(
            gkm_core::cache::CacheManifest::from_json(&manifest).unwrap(),
            gkm_core::cache::scan(&fixture_cache(name)).unwrap()
        );

        // A changed byte changes the twin: the comparison can fail.
        let some_file = tree(&b)
            .into_iter()
            .find_map(|(k, v)| {
                (matches!(v, Node::File { .. }) && !k.ends_with(".json")).then_some(k)
            })
            .unwrap();
        let mut bytes = std::fs::read(b.join(&some_file)).unwrap();
        bytes.push(b'!');
        std::fs::write(b.join(&some_file), bytes).unwrap();
        let changed = build(
            &b,
            &layout_ref(&w.join("three"), name),
            &options(Compression::Zstd),
            &registry,
        )
        .await
        .unwrap();
        assert_ne!(changed.erofs.unwrap().digest, twin.digest);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pushed_image_keeps_its_twin_in_the_registry_and_its_tar_layer_for_readers() {
    let server = gkm_testenv::Registry::shared()
        .unwrap_or_else(|e| panic!("{e:#}: install it with `hack/ci/components.sh debian`"));
    let registry = RegistryOptions {
        insecure: true,
        ..RegistryOptions::default()
    };
    let work = tempfile::tempdir().unwrap();
    let name = FIXTURES[0];
    let remote: ImageRef = format!("{}/erofs/{name}:v1", server.addr())
        .parse()
        .unwrap();
    let built = build(
        &fixture_cache(name),
        &remote,
        &options(Compression::Gzip),
        &registry,
    )
    .await
    .unwrap();
    let twin = built.erofs.clone().unwrap();
    let repo = Repo::open(&remote, &registry).unwrap();
    let image = Image::fetch(&repo).await.unwrap();
    // The tar layer stays the image's only layer, the twin named in its
    // descriptor, so the signed manifest names the twin's digest.
    let layer = image.cache_layer().unwrap();
    assert_eq!(layer.compression().unwrap(), Compression::Gzip);
    assert_eq!(layer.erofs.as_ref(), Some(&twin));
    assert!(repo.has_blob(&twin.digest).await.unwrap());
    // The referrer that keeps the twin: the image as its subject.
    let referrer = gkm_oci::erofs::referrer(&image.raw, &image.manifest.layers)
        .unwrap()
        .unwrap();
    let stored = repo.fetch_manifest_digest(&referrer.digest).await.unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&stored.bytes).unwrap();
    assert_eq!(doc["subject"]["digest"], image.digest.as_str());
    assert_eq!(doc["layers"][0]["digest"], twin.digest.as_str());
    assert_eq!(doc["artifactType"], gkm_oci::erofs::MEDIA_TYPE);

    // Pulled into a layout, the twin comes along; the tar layer still
    // extracts to the fixture.
    let pulled = layout_ref(&work.path().join("pulled"), "v1");
    copy_image(&repo, &Repo::create(&pulled, &registry).unwrap(), None)
        .await
        .unwrap();
    let head = std::fs::read(blob(&work.path().join("pulled"), &twin.digest)).unwrap();
    superblock::check(&head[..superblock::HEAD_LEN], twin.size).unwrap();
    let out = work.path().join("out");
    extract_to_dir(&repo, &image, &out, &UnpackOptions::default())
        .await
        .unwrap();
    assert_same_tree(&fixture_cache(name), &out);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_mkfs_erofs_fails_the_build_naming_the_install_and_tags_nothing() {
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("layout");
    let options = BuildOptions {
        erofs: Some(ErofsWriter {
            program: work.path().join("no-such-mkfs.erofs"),
            ..ErofsWriter::default()
        }),
        ..BuildOptions::default()
    };
    let err = build(
        &fixture_cache(FIXTURES[0]),
        &layout_ref(&layout, "v1"),
        &options,
        &RegistryOptions::default(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("no-such-mkfs.erofs") && err.contains("apt-get install erofs-utils"),
        "{err}"
    );
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    assert_eq!(
        index["manifests"],
        serde_json::json!([]),
        "a tag was written"
    );
    let left: Vec<_> = std::fs::read_dir(&layout)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".gkm-tmp"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_twin_that_is_not_what_gkm_writes_is_refused_before_mounting() {
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("layout");
    let built = build(
        &fixture_cache(FIXTURES[1]),
        &layout_ref(&layout, "v1"),
        &options(Compression::Zstd),
        &RegistryOptions::default(),
    )
    .await
    .unwrap();
    let twin = built.erofs.unwrap();
    let bytes = std::fs::read(blob(&layout, &twin.digest)).unwrap();
    let head = &bytes[..superblock::HEAD_LEN];
    let sb = superblock::check(head, twin.size).unwrap();
    assert_eq!(u64::from(sb.blocks) * 4096, twin.size);
    assert_eq!(sb.feature_incompat & !superblock::ACCEPTED_INCOMPAT, 0);

    // The tar layer is no EROFS image; a blob cut short or one byte of the
    // superblock changed are refused, each naming why.
    let tar = std::fs::read(blob(&layout, &built.layer.digest)).unwrap();
    let mut tar_head = tar.clone();
    tar_head.resize(superblock::HEAD_LEN, 0);
    let err = superblock::check(&tar_head, tar.len() as u64)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not an EROFS image"), "{err}");
    let err = superblock::check(head, twin.size - 4096)
        .unwrap_err()
        .to_string();
    assert!(err.contains("but the blob is"), "{err}");
    let mut changed = head.to_vec();
    changed[superblock::SUPERBLOCK_OFFSET + 80] |= 0x40;
    let err = superblock::check(&changed, twin.size)
        .unwrap_err()
        .to_string();
    assert!(err.contains("checksum"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn each_variant_of_a_multi_target_image_carries_its_own_twin() {
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("multi");
    let dirs = [fixture_cache(FIXTURES[0]), fixture_cache(FIXTURES[1])];
    let registry = RegistryOptions::default();
    let multi = gkm_oci::build::build_multi(
        &dirs,
        &layout_ref(&layout, "v1"),
        &options(Compression::Zstd),
        &registry,
        None,
    )
    .await
    .unwrap();
    assert_eq!(multi.variants.len(), 2);
    let mut twins = Vec::new();
    for variant in &multi.variants {
        let repo = Repo::open(&layout_ref(&layout, "v1"), &registry).unwrap();
        let raw = repo.fetch_manifest_digest(&variant.digest).await.unwrap();
        let manifest = gkm_oci::Manifest::parse(&raw.bytes).unwrap();
        let twin = manifest.layers[0].erofs.clone().expect("a twin");
        assert!(
            blob(&layout, &twin.digest).is_file(),
            "{}: no twin blob",
            variant.digest
        );
        let referrer = gkm_oci::erofs::referrer(&raw, &manifest.layers)
            .unwrap()
            .unwrap();
        assert!(
            blob(&layout, &referrer.digest).is_file(),
            "{}: no referrer",
            variant.digest
        );
        twins.push(twin.digest);
    }
    assert_ne!(twins[0], twins[1], "two trees, one twin");
}
