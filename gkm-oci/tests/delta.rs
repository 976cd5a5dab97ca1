//! Delta cache images against a real registry and real overlayfs mounts:
//! the upper of a writable view over a signed base becomes the base's
//! layers plus one layer of new files, which a node store extracts as one
//! sealed tree; an upper that deletes or changes a base file is refused
//! naming it; a layer that would overwrite an earlier one is refused at
//! extraction, leaving nothing behind.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::assert_same_tree;
use gkm_core::policy::Policy;
use gkm_oci::capture::{CaptureError, CaptureOptions, FailureReason, capture};
use gkm_oci::delta::{BASE_LABEL, BaseCheck, capture_delta};
use gkm_oci::sign::SigningKey;
use gkm_oci::{
    Error, ExtractPolicy, Image, ImageRef, Layout, RegistryOptions, Repo, Rule, Selector, Store,
    UnpackOptions, extract_to_dir,
};
use gkm_testenv::triton::fleet_target_named;
use gkm_testenv::{Registry, copy_tree};

fn plain() -> RegistryOptions {
    RegistryOptions {
        insecure: true,
        ..RegistryOptions::default()
    }
}

/// The real Triton sm75 fleet fixture split in two: `base`, every kernel
/// but the first, and the first kernel's directory name (the new kernel a
/// workload compiles on top of the base).
fn split_fixture(work: &Path) -> (PathBuf, PathBuf, String) {
    let fixture = fleet_target_named("cuda-75-32").expect("fleet").fixture;
    let base = work.join("base");
    copy_tree(&fixture, &base).expect("copy");
    let mut keys: Vec<String> = std::fs::read_dir(&base)
        .expect("base")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    keys.sort();
    let new = keys[0].clone();
    std::fs::remove_dir_all(base.join(&new)).expect("remove");
    (fixture, base, new)
}

/// Captures `tree` as a signed base image `repo:v1`; returns it pinned.
async fn signed_base(tree: &Path, repo: &str, key: &SigningKey) -> ImageRef {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let target: ImageRef = format!("{}/{repo}:v1", registry.addr())
        .parse()
        .expect("ref");
    let captured = capture(
        tree,
        &target,
        key,
        &CaptureOptions::default(),
        &plain(),
        None,
    )
    .await
    .expect("capture the base");
    captured.pinned
}

fn trusting(key: &SigningKey) -> Policy {
    Policy::keys(vec![key.public_key().clone()]).expect("policy")
}

/// An overlayfs view: `lower` read-only, the upper and work directories on
/// a tmpfs of their own (an upper cannot sit on the overlay root this
/// runs on), unmounted on drop.
struct Overlay {
    root: PathBuf,
    merged: PathBuf,
    upper: PathBuf,
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Overlay {
    fn mount(lower: &Path, root: &Path) -> Overlay {
        std::fs::create_dir_all(root).expect("root");
        run(Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(root));
        let (upper, work, merged) = (root.join("upper"), root.join("work"), root.join("merged"));
        for d in [&upper, &work, &merged] {
            std::fs::create_dir(d).expect("mkdir");
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        run(Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(&merged));
        Overlay {
            root: root.to_path_buf(),
            merged,
            upper,
        }
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.merged).status();
        let _ = Command::new("umount").arg(&self.root).status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_extracts_a_delta_image_of_a_real_overlay_upper_as_one_sealed_tree() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = gkm_testenv::temp_dir().expect("tempdir");
    let (fixture, base_tree, new) = split_fixture(work.path());
    let (key, _) = SigningKey::generate_p256().expect("key");
    let base = signed_base(&base_tree, "delta/store-base", &key).await;

    // The workload, through a writable view of the base: compiles the new
    // kernel (its files written in), takes a lock, leaves a Triton
    // temporary, and changes the mode of a base file (an identical
    // copy-up).
    let view = Overlay::mount(&base_tree, &work.path().join("view"));
    copy_tree(&fixture.join(&new), &view.merged.join(&new)).expect("compile");
    std::fs::create_dir_all(view.merged.join("locks")).expect("locks");
    std::fs::write(view.merged.join("locks/kernel.lock"), b"").expect("lock");
    let tmp = view.merged.join(&new).join("tmp.pid_17_4242");
    std::fs::create_dir(&tmp).expect("tmp");
    std::fs::write(tmp.join("half.cubin"), b"partial").expect("tmp file");
    let (some_key, some_file) = gkm_testenv::tree_files(&base_tree)
        .expect("base")
        .into_iter()
        .map(|(p, _)| p)
        .find_map(|p| {
            let key = p.iter().next()?.to_string_lossy().into_owned();
            Some((key, p))
        })
        .expect("a base file");
    run(Command::new("chmod")
        .arg("0600")
        .arg(view.merged.join(&some_file)));
    assert!(view.upper.join(&some_key).is_dir(), "copied up");

    let target: ImageRef = format!("{}/delta/store:v1", registry.addr())
        .parse()
        .expect("ref");
    let captured = capture_delta(
        &view.upper,
        &base,
        None,
        BaseCheck::Signed(&trusting(&key)),
        &target,
        &key,
        &CaptureOptions::default(),
        &plain(),
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let delta = captured.delta.as_ref().expect("a delta");
    assert!(
        delta
            .files
            .iter()
            .all(|f| f.starts_with(&format!("{new}/"))),
        "only the new kernel: {:?}",
        delta.files
    );
    assert_eq!(
        delta.files.len(),
        std::fs::read_dir(fixture.join(&new))
            .expect("kernel")
            .count()
    );

    // A node store extracts base ∪ delta as one sealed tree: the whole
    // fixture, nothing else.
    let store_dir = work.path().join("store");
    let store = Store::open(&store_dir).expect("store");
    let repo = Repo::open(&captured.pinned, &plain()).expect("open");
    let stored = store
        .ensure(&repo, &ExtractPolicy::default(), None)
        .await
        .expect("the store extracts the delta image");
    assert_eq!(stored.digest, captured.digest);
    assert_same_tree(&fixture, &stored.path.join("io.triton.cache"));
    assert!(
        matches!(
            store.check_seal(&captured.digest),
            Some(gkm_oci::seal::SealCheck::Intact)
        ),
        "the multi-layer tree is sealed as extracted"
    );
    let image = Image::fetch(&repo).await.expect("image");
    assert_eq!(image.manifest.layers.len(), 2);
    assert_eq!(image.labels.get(BASE_LABEL), Some(&base.to_string()));
}

/// What a workload does to the files of its view.
type Change<'a> = Box<dyn Fn(&Path) + 'a>;

/// Captures the upper of `view` over `base` to `repo:v1`; it must fail.
async fn refused_delta(
    view: &Overlay,
    base: &ImageRef,
    key: &SigningKey,
    repo: &str,
) -> CaptureError {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let target: ImageRef = format!("{}/{repo}:v1", registry.addr())
        .parse()
        .expect("ref");
    let err = capture_delta(
        &view.upper,
        base,
        None,
        BaseCheck::Signed(&trusting(key)),
        &target,
        key,
        &CaptureOptions::default(),
        &plain(),
        None,
    )
    .await
    .expect_err("refused");
    assert!(
        !registry.repository_dir(repo).exists(),
        "nothing may be pushed to {repo}"
    );
    err
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delta_that_deletes_or_changes_a_base_file_is_refused_naming_it() {
    let work = gkm_testenv::temp_dir().expect("tempdir");
    let (fixture, base_tree, new) = split_fixture(work.path());
    let (key, _) = SigningKey::generate_p256().expect("key");
    let base = signed_base(&base_tree, "delta/refusals-base", &key).await;
    let files: Vec<PathBuf> = gkm_testenv::tree_files(&base_tree)
        .expect("base")
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    let file = files[0].clone();
    let dir = file.iter().next().expect("a kernel dir").to_owned();
    let shown = |p: &Path| p.to_string_lossy().into_owned();

    // Each on real overlayfs, with a new kernel beside it.
    let cases: [(&str, Change, String); 3] = [
        (
            "deleted",
            Box::new(|m: &Path| std::fs::remove_file(m.join(&file)).expect("rm")),
            shown(&file),
        ),
        (
            "opaque",
            Box::new(|m: &Path| {
                std::fs::remove_dir_all(m.join(&dir)).expect("rm -r");
                std::fs::create_dir(m.join(&dir)).expect("mkdir");
            }),
            shown(Path::new(&dir)),
        ),
        (
            "changed",
            Box::new(|m: &Path| {
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(m.join(&file))
                    .expect("open");
                f.write_all(b" ").expect("append");
            }),
            shown(&file),
        ),
    ];
    for (name, change, entry) in cases {
        let view = Overlay::mount(&base_tree, &work.path().join(name));
        copy_tree(&fixture.join(&new), &view.merged.join(&new)).expect("compile");
        change(&view.merged);
        let err = refused_delta(&view, &base, &key, &format!("delta/{name}")).await;
        assert_eq!(
            err.reason(),
            FailureReason::DeltaChangesBase,
            "{name}: {err}"
        );
        let message = err.to_string();
        assert!(
            message.contains(&format!("{entry:?}")),
            "{name}: names {entry}: {message}"
        );
    }

    // A base not signed by a trusted key is not built upon.
    let (other, _) = SigningKey::generate_p256().expect("key");
    let view = Overlay::mount(&base_tree, &work.path().join("untrusted"));
    copy_tree(&fixture.join(&new), &view.merged.join(&new)).expect("compile");
    let err = refused_delta(&view, &base, &other, "delta/untrusted").await;
    assert_eq!(err.reason(), FailureReason::NotVerified, "{err}");
}

/// A two-layer image in an OCI layout at `dir`: the base built from
/// `tree`, then a layer of `extra` tar entries (`(path, bytes)`).
fn two_layer_image(tree: &Path, dir: &Path, extra: &[(&str, &[u8])]) -> ImageRef {
    let layout = Layout::create(dir).expect("layout");
    let built =
        gkm_oci::build::build_into_layout(tree, &layout, None, "two", gkm_oci::Compression::Gzip)
            .expect("build");
    let mut tar = tar::Builder::new(Vec::new());
    for (path, bytes) in extra {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, path, *bytes).expect("append");
    }
    let layer = tar.into_inner().expect("tar");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&layer).expect("gzip");
    let blob = gz.finish().expect("gzip");
    let digest = layout.write_blob(&blob).expect("blob");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&built.manifest.bytes).expect("manifest");
    manifest["layers"]
        .as_array_mut()
        .expect("layers")
        .push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": digest.to_string(),
            "size": blob.len(),
        }));
    let bytes = serde_json::to_vec(&manifest).expect("json");
    let digest = layout.write_blob(&bytes).expect("manifest blob");
    ImageRef::Layout {
        path: dir.to_path_buf(),
        selector: Selector::Digest(digest),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_layer_that_overwrites_an_earlier_one_is_refused_at_extract() {
    let work = gkm_testenv::temp_dir().expect("tempdir");
    let fixture = fleet_target_named("cuda-75-32").expect("fleet").fixture;
    let file = gkm_testenv::tree_files(&fixture).expect("fixture")[0]
        .0
        .to_string_lossy()
        .into_owned();
    let overwrite = format!("io.triton.cache/{file}");
    let whiteout = format!(
        "io.triton.cache/{}/.wh.{}",
        Path::new(&file).parent().expect("dir").display(),
        Path::new(&file)
            .file_name()
            .expect("name")
            .to_string_lossy()
    );
    let cases = [
        (
            "overwrite",
            overwrite.as_str(),
            Rule::OverwritesEarlierLayer,
            file.clone(),
        ),
        (
            "whiteout",
            whiteout.as_str(),
            Rule::DeletesEarlierLayer,
            whiteout["io.triton.cache/".len()..].to_string(),
        ),
    ];
    for (name, path, rule, entry) in cases {
        let image = two_layer_image(&fixture, &work.path().join(name), &[(path, b"evil")]);
        let repo = Repo::open(&image, &plain()).expect("open");
        let fetched = Image::fetch(&repo).await.expect("image");

        // `gkm extract` (and the fill Job): refused, nothing left.
        let out = work.path().join(format!("{name}-out"));
        let err = extract_to_dir(&repo, &fetched, &out, &UnpackOptions::default())
            .await
            .expect_err("refused");
        match &err {
            Error::Rejected(r) => {
                assert_eq!(r.rule, rule, "{name}: {err}");
                assert_eq!(r.entry, entry, "{name}: {err}");
            }
            other => panic!("{name}: expected a rejection, got {other}"),
        }
        assert!(!out.exists(), "{name}: nothing extracted");
        let left: Vec<_> = std::fs::read_dir(work.path())
            .expect("work")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".gkm-staging-"))
            .collect();
        assert!(left.is_empty(), "{name}: staging left: {left:?}");

        // A node store: refused, nothing stored.
        let store = Store::open(work.path().join(format!("{name}-store"))).expect("store");
        let err = store
            .ensure_image(&repo, &fetched, &ExtractPolicy::default(), None)
            .await
            .expect_err("refused");
        assert!(
            matches!(&err, Error::Rejected(r) if r.rule == rule),
            "{name}: {err}"
        );
        assert!(
            store.list().expect("list").is_empty(),
            "{name}: nothing stored"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delta_of_a_delta_keeps_every_layer_and_extracts_whole() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = gkm_testenv::temp_dir().expect("tempdir");
    let (fixture, base_tree, first) = split_fixture(work.path());
    // The base holds neither the first nor the second kernel.
    let second = std::fs::read_dir(&base_tree)
        .expect("base")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .min()
        .expect("a second kernel");
    std::fs::remove_dir_all(base_tree.join(&second)).expect("remove");
    let (key, _) = SigningKey::generate_p256().expect("key");
    let base = signed_base(&base_tree, "delta/chain-base", &key).await;

    let mut on = base;
    for (step, kernel) in [first, second].iter().enumerate() {
        let upper = work.path().join(format!("upper-{step}"));
        copy_tree(&fixture.join(kernel), &upper.join(kernel)).expect("kernel");
        let target: ImageRef = format!("{}/delta/chain-{step}:v1", registry.addr())
            .parse()
            .expect("ref");
        let captured = capture_delta(
            &upper,
            &on,
            None,
            BaseCheck::Signed(&trusting(&key)),
            &target,
            &key,
            &CaptureOptions::default(),
            &plain(),
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("delta {step}: {e}"));
        assert_eq!(
            captured.delta.as_ref().expect("delta").base_layers,
            step + 1
        );
        on = captured.pinned;
    }

    let repo = Repo::open(&on, &plain()).expect("open");
    let image = Image::fetch(&repo).await.expect("image");
    assert_eq!(
        image.manifest.layers.len(),
        3,
        "base, first delta, second delta"
    );
    let out = work.path().join("out");
    extract_to_dir(&repo, &image, &out, &UnpackOptions::default())
        .await
        .expect("extract");
    assert_same_tree(&fixture, &out);
}
