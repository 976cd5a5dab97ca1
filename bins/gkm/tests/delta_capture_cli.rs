//! `gkm capture --delta-of` as a user (or the capture Job) runs it, against
//! a real registry and real Triton: the upper of a writable view, holding
//! one new real Triton kernel beside lock files and Triton temporaries,
//! becomes a signed image of the base's layers plus one layer of exactly
//! the new kernel, which `gkm extract` and `gkm check` read whole and Triton
//! reuses without compiling anything.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Output;

use gkm_oci::{Image, ImageRef, RegistryOptions, Repo};
use gkm_testenv::triton::{check_delivered, fleet_target_named, key_dir};
use gkm_testenv::{Registry, copy_tree, tree_files};

mod support;

use support::{gkm_in as gkm, text};

/// Where the workload's pod saw the cache: its group files record it.
const POD_MOUNT: &str = "/workspace/triton-cache";

/// Every file below `root`, relative, sorted.
fn files(root: &Path) -> Vec<String> {
    let mut out: Vec<String> = tree_files(root)
        .expect("tree")
        .into_iter()
        .map(|(p, _)| p.to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

fn ok(args: &[&str], dir: &Path) -> String {
    let out = gkm(args, dir);
    assert_eq!(out.status.code(), Some(0), "gkm {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `gkm capture TREE -t TARGET --key KEY --insecure`, then `extra`.
fn capture(tree: &Path, target: &str, key: &str, extra: &[&str], dir: &Path) -> Output {
    let tree = tree.display().to_string();
    let mut args = vec!["capture", &tree, "-t", target, "--key", key, "--insecure"];
    args.extend_from_slice(extra);
    gkm(&args, dir)
}

/// [`capture`] that succeeds: what it printed.
fn captured(tree: &Path, target: &str, key: &str, extra: &[&str], dir: &Path) -> String {
    let out = capture(tree, target, key, extra, dir);
    assert_eq!(
        out.status.code(),
        Some(0),
        "gkm capture {}: {}",
        tree.display(),
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The regular files of a gzip layer blob, with their bytes.
fn layer_files(blob: &Path) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(blob).expect("blob");
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes.as_slice()));
    let mut out = Vec::new();
    for entry in archive.entries().expect("tar") {
        let mut entry = entry.expect("entry");
        if entry.header().entry_type().is_file() {
            let path = entry.path().expect("path").to_string_lossy().into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).expect("read");
            out.push((path, data));
        }
    }
    out.sort();
    out
}

async fn fetch(image: &str) -> Image {
    let options = RegistryOptions {
        insecure: true,
        ..RegistryOptions::default()
    };
    let image: ImageRef = image.parse().expect("ref");
    Image::fetch(&Repo::open(&image, &options).expect("open"))
        .await
        .expect("fetch")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delta_capture_holds_the_base_layers_and_one_layer_of_exactly_the_new_kernel() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let keys = support::key_pair(&dir.join("keys"));
    let key = keys.join("cosign.key").display().to_string();

    // The base: the real Triton sm75 fleet fixture but its first kernel,
    // captured and signed.
    let target = fleet_target_named("cuda-75-32").expect("fleet");
    let base_tree = dir.join("base");
    copy_tree(&target.fixture, &base_tree).expect("copy");
    let mut kernels: Vec<String> = std::fs::read_dir(&base_tree)
        .expect("base")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    kernels.sort();
    let new = kernels[0].clone();
    std::fs::remove_dir_all(base_tree.join(&new)).expect("remove");
    let base_target = format!("{}/delta-cli/base:v1", registry.addr());
    let base = captured(&base_tree, &base_target, &key, &[], dir);

    // The upper of the workload's writable view: the new kernel, compiled
    // where the pod mounted the cache (its group file records that path),
    // a lock directory, a stray lock file and a Triton temporary.
    let upper = dir.join("upper");
    copy_tree(&target.fixture.join(&new), &upper.join(&new)).expect("kernel");
    for (group, bytes) in
        gkm_core::cache::relocated_groups(&upper, Path::new(POD_MOUNT)).expect("relocate")
    {
        std::fs::write(upper.join(group), bytes).expect("group");
    }
    std::fs::create_dir_all(upper.join("locks")).expect("locks");
    std::fs::write(upper.join("locks/compile.lock"), b"").expect("lock");
    std::fs::write(upper.join(format!("{new}.lock")), b"").expect("lock file");
    let tmp = upper.join(&new).join("tmp.pid_31_77");
    std::fs::create_dir(&tmp).expect("tmp");
    std::fs::write(tmp.join("partial.cubin"), b"half").expect("tmp file");

    let whole_target = format!("{}/delta-cli/whole:v1", registry.addr());
    let json = captured(
        &upper,
        &whole_target,
        &key,
        &["--delta-of", &base, "--json"],
        dir,
    );
    let doc: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(doc["base"], base.as_str(), "{doc}");
    let kernel_files: Vec<String> = files(&target.fixture.join(&new))
        .into_iter()
        .map(|f| format!("{new}/{f}"))
        .collect();
    assert_eq!(
        doc["delta"]["files"],
        serde_json::json!(kernel_files),
        "exactly the new kernel: {doc}"
    );
    let pinned = doc["image"].as_str().expect("image").to_string();

    // The manifest: the base's layers, unchanged, then one layer.
    let base_image = fetch(&base).await;
    let whole = fetch(&pinned).await;
    assert_eq!(
        whole.manifest.layers.len(),
        base_image.manifest.layers.len() + 1
    );
    assert_eq!(
        whole.manifest.layers[..base_image.manifest.layers.len()],
        base_image.manifest.layers[..]
    );
    let delta = whole.manifest.layers.last().expect("delta layer");
    assert_eq!(doc["delta"]["digest"], delta.digest.to_string(), "{doc}");
    let cache = whole.cache().expect("labels");
    assert_eq!(
        cache.entry_count,
        Some(target.kernels as u64),
        "labels of the whole"
    );
    assert_eq!(
        cache.build_path.as_deref(),
        Some(target.compiled_at.to_str().expect("utf-8"))
    );

    // The delta layer holds exactly the new kernel's files, its group file
    // recording the base's build path, not the pod's.
    let layer = layer_files(&registry.blob_data_path(delta.digest.as_str()));
    let names: Vec<String> = layer.iter().map(|(p, _)| p.clone()).collect();
    let expected: Vec<String> = kernel_files
        .iter()
        .map(|f| format!("io.triton.cache/{f}"))
        .collect();
    assert_eq!(names, expected);
    let (_, group) = layer
        .iter()
        .find(|(p, _)| p.contains("/__grp__"))
        .expect("a group file");
    let group: serde_json::Value = serde_json::from_slice(group).expect("group JSON");
    let recorded = target.compiled_at.join(&new).display().to_string();
    for child in group["child_paths"].as_object().expect("children").values() {
        let child = child.as_str().expect("path");
        assert!(child.starts_with(&recorded), "{child} under {recorded}");
    }

    // The Job's form: the base read from the CSI driver's record gives the
    // same image.
    let record = dir.join("base.json");
    std::fs::write(
        &record,
        serde_json::json!({"image": base, "buildPath": target.compiled_at}).to_string(),
    )
    .expect("record");
    let record_arg = record.display().to_string();
    let again = captured(
        &upper,
        &whole_target,
        &key,
        &["--delta-base-record", &record_arg],
        dir,
    );
    assert_eq!(again, pinned, "deterministic");

    // `gkm check` and `gkm extract` read the whole: base ∪ delta.
    let t4 = dir.join("t4.yaml");
    std::fs::write(&t4, "gpus:\n  - profile: T4\n").expect("inventory");
    ok(
        &[
            "check",
            &pinned,
            "--gpus",
            &t4.display().to_string(),
            "--insecure",
        ],
        dir,
    );
    let out: PathBuf = dir.join("extracted");
    ok(
        &[
            "extract",
            &pinned,
            "-o",
            &out.display().to_string(),
            "--insecure",
        ],
        dir,
    );
    assert_eq!(files(&out), files(&target.fixture), "base ∪ delta");

    // Real Triton compiles nothing against the extracted tree: it reads
    // every kernel from it, the new one too.
    let reports = check_delivered(&[(&target, out)]).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        reports[0]
            .kernels
            .iter()
            .any(|k| key_dir(&k.hash).expect("hash") == new && !k.compiled),
        "the new kernel is a hit: {:#?}",
        reports[0]
    );
}

/// The capture Job's case: a base the platform signed, a delta signed with
/// a tenant's key. By hand (`--delta-of`) the base must verify with the
/// tenant's key; through the CSI driver's record it is the digest the node
/// delivered under the cache's own policy, and the delta is taken.
#[tokio::test(flavor = "multi_thread")]
async fn a_platform_signed_base_takes_a_tenants_delta_through_the_drivers_record_but_not_by_hand() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let platform = support::key_pair(&dir.join("platform"))
        .join("cosign.key")
        .display()
        .to_string();
    let tenant = support::key_pair(&dir.join("tenant"))
        .join("cosign.key")
        .display()
        .to_string();

    let target = fleet_target_named("cuda-75-32").expect("fleet");
    let base_tree = dir.join("base");
    copy_tree(&target.fixture, &base_tree).expect("copy");
    let mut kernels: Vec<String> = std::fs::read_dir(&base_tree)
        .expect("base")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    kernels.sort();
    let new = kernels[0].clone();
    std::fs::remove_dir_all(base_tree.join(&new)).expect("remove");
    let base_target = format!("{}/delta-cli/platform-base:v1", registry.addr());
    let base = captured(&base_tree, &base_target, &platform, &[], dir);
    let upper = dir.join("upper");
    copy_tree(&target.fixture.join(&new), &upper.join(&new)).expect("kernel");
    let delta_target = format!("{}/delta-cli/tenant:v1", registry.addr());

    let by_hand = capture(
        &upper,
        &delta_target,
        &tenant,
        &["--delta-of", &base, "--json"],
        dir,
    );
    let refused = text(&by_hand);
    assert_ne!(by_hand.status.code(), Some(0), "{refused}");
    assert!(refused.contains("NotVerified"), "{refused}");

    let record = dir.join("delta-base.json");
    std::fs::write(
        &record,
        serde_json::json!({"image": base, "buildPath": target.compiled_at}).to_string(),
    )
    .expect("record");
    let json = captured(
        &upper,
        &delta_target,
        &tenant,
        &[
            "--delta-base-record",
            &record.display().to_string(),
            "--json",
        ],
        dir,
    );
    let doc: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(doc["base"], base.as_str(), "{doc}");
    assert_eq!(
        doc["verified"]["digest"], doc["digest"],
        "signed with the tenant's key and verified: {doc}"
    );
    let whole = fetch(doc["image"].as_str().expect("image")).await;
    assert_eq!(
        whole.manifest.layers.len(),
        fetch(&base).await.manifest.layers.len() + 1
    );
}
