//! `gkm capture` as a user runs it, against a real registry and the real
//! cosign: a real Triton cache becomes an image whose signature cosign and
//! gkm accept, tagged only once verified; unsafe trees, trees that are not
//! caches and unreachable registries fail with a reason and push nothing.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gkm_testenv::{Component, Registry};

mod support;

use support::{gkm_in as gkm, text};

/// A cosign key pair in `dir`: the private and the public key's paths.
fn key_pair(dir: &Path) -> (String, String) {
    let dir = support::key_pair(dir);
    (
        dir.join("cosign.key").display().to_string(),
        dir.join("cosign.pub").display().to_string(),
    )
}

/// `gkm capture CACHE -t TARGET --key KEY EXTRA...` in `dir`, with the key
/// pair of `dir/keys`.
fn capture(cache: &Path, target: &str, extra: &[&str], dir: &Path) -> Output {
    let (key, _) = key_pair(&dir.join("keys"));
    let cache = cache.display().to_string();
    let mut args = vec!["capture", &cache, "-t", target, "--key", &key];
    args.extend_from_slice(extra);
    gkm(&args, dir)
}

/// A copy of the real Triton 3.6 sm75 cache (`fixtures/triton/cuda-75-32`)
/// at `dest`, as a workload would leave it.
fn triton_cache(dest: &Path) -> PathBuf {
    let src = gkm_testenv::repo_root().join("fixtures/triton/cuda-75-32");
    let out = Command::new("cp")
        .arg("-r")
        .arg(&src)
        .arg(dest)
        .output()
        .expect("cp");
    assert!(
        out.status.success(),
        "cp -r {}: {}",
        src.display(),
        text(&out)
    );
    dest.to_path_buf()
}

/// Output with the temporary directory, the registry address and digests
/// (the key's fingerprint among them) redacted.
fn redacted(s: &str, dir: &Path, registry: &str) -> String {
    support::redact(s, dir).replace(registry, "[REGISTRY]")
}

#[test]
fn a_real_triton_cache_is_captured_signed_verified_and_tagged_last() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let cache = triton_cache(&dir.join("cache"));
    let (_, public) = key_pair(&dir.join("keys"));
    let target = format!("{}/capture/t4:v1", registry.addr());

    let out = capture(&cache, &target, &["--gpu", "NVIDIA T4", "--insecure"], dir);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let pinned = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        pinned.starts_with(&format!("{}/capture/t4@sha256:", registry.addr())),
        "stdout is the pinned image: {pinned}"
    );
    let digest = pinned.rsplit('@').next().expect("digest").to_string();

    // The tag names the digest, and gkm and cosign both accept the
    // signature with the public key.
    let inspected = gkm(&["inspect", &target, "--insecure", "--json"], dir);
    assert_eq!(inspected.status.code(), Some(0), "{}", text(&inspected));
    let doc: serde_json::Value = serde_json::from_slice(&inspected.stdout).expect("JSON");
    assert_eq!(doc["digest"], digest.as_str(), "{doc}");
    assert_eq!(
        doc["labels"]["io.gkm.compiled-on-gpu"], "NVIDIA T4",
        "{doc}"
    );
    let verified = gkm(
        &["verify", &target, "--key", &public, "--insecure", "--json"],
        dir,
    );
    assert_eq!(verified.status.code(), Some(0), "{}", text(&verified));
    let doc: serde_json::Value = serde_json::from_slice(&verified.stdout).expect("JSON");
    assert_eq!(doc["result"]["digest"], digest.as_str(), "{doc}");
    let out_cosign = support::cosign_verify(Component::CosignV3, &public, &pinned, dir);
    assert!(
        out_cosign.status.success(),
        "cosign verify of the captured image: {}",
        text(&out_cosign)
    );
    insta::assert_snapshot!("capture-text", redacted(&text(&out), dir, registry.addr()));

    // --json, to another tag, the GPU found in the machine's inventory (a
    // T4 and an A100; the cache fits the T4): a different label, so another
    // digest; the same run again gives the same digest.
    let inventory = dir.join("gpus.yaml");
    std::fs::write(&inventory, "gpus:\n  - profile: A100\n  - profile: T4\n").expect("inventory");
    let inventory = inventory.display().to_string();
    let again = format!("{}/capture/t4:v2", registry.addr());
    let args = ["--gpus", inventory.as_str(), "--insecure", "--json"];
    let json = capture(&cache, &again, &args, dir);
    assert_eq!(json.status.code(), Some(0), "{}", text(&json));
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(doc["gpu"], "Tesla T4", "{doc}");
    assert_ne!(doc["digest"], digest.as_str(), "{doc}");
    // Again, as the on-cluster Job runs it: the outcome in a termination log.
    let log = dir.join("termination-log");
    let log_arg = log.display().to_string();
    let mut job_args = args.to_vec();
    job_args.extend(["--termination-log", &log_arg]);
    let rerun = capture(&cache, &again, &job_args, dir);
    assert_eq!(rerun.status.code(), Some(0), "{}", text(&rerun));
    let redo: serde_json::Value = serde_json::from_slice(&rerun.stdout).expect("JSON");
    assert_eq!(redo["digest"], doc["digest"], "deterministic: {redo}");
    let outcome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&log).expect("termination log")).expect("JSON");
    assert_eq!(
        outcome,
        serde_json::json!({"captured": true, "image": doc["image"], "digest": doc["digest"]})
    );
    insta::assert_snapshot!(
        "capture-json",
        support::json_snapshot(&String::from_utf8_lossy(&json.stdout), dir, registry.addr())
    );
}

/// Runs a capture of `cache` to `repo:v1` that must fail; returns its
/// `--json` document and checks nothing reached the repository.
fn refused(
    registry: &Registry,
    cache: &Path,
    repo: &str,
    extra: &[&str],
    code: i32,
    dir: &Path,
) -> serde_json::Value {
    let target = format!("{}/{repo}:v1", registry.addr());
    let mut args = vec!["--insecure", "--json"];
    args.extend_from_slice(extra);
    let out = capture(cache, &target, &args, dir);
    assert_eq!(out.status.code(), Some(code), "{}", text(&out));
    assert!(
        !registry.repository_dir(repo).exists(),
        "nothing may be pushed to {repo}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "--json prints a document on failure too ({e}): {}",
            text(&out)
        )
    });
    assert_eq!(doc["captured"], false, "{doc}");
    doc
}

#[test]
fn a_symbolic_link_to_etc_is_refused_before_packing() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let cache = triton_cache(&dir.join("cache"));
    let key_dir = std::fs::read_dir(&cache)
        .expect("cache")
        .next()
        .expect("a kernel directory")
        .expect("entry")
        .path();
    std::os::unix::fs::symlink("/etc", key_dir.join("etc")).expect("symlink");
    let log = dir.join("termination-log");
    let log_arg = log.display().to_string();
    let doc = refused(
        registry,
        &cache,
        "capture/symlink",
        &["--termination-log", &log_arg],
        4,
        dir,
    );
    let outcome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&log).expect("termination log")).expect("JSON");
    assert_eq!(
        outcome,
        serde_json::json!({"captured": false, "reason": "UnsafeTree", "message": doc["message"]})
    );
    assert_eq!(doc["reason"], "UnsafeTree", "{doc}");
    let message = doc["message"].as_str().expect("message");
    assert!(
        message.contains("link-not-allowed") && message.contains("symbolic link to /etc"),
        "{message}"
    );
    insta::assert_snapshot!(
        "capture-json-symlink",
        support::json_snapshot(&doc.to_string(), dir, registry.addr())
    );
}

#[test]
fn a_torn_triton_group_is_refused_before_packing_naming_the_entry() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let cache = triton_cache(&dir.join("cache"));
    let cubin = gkm_testenv::tree_files(&cache)
        .expect("the cache")
        .into_iter()
        .map(|(path, _)| path)
        .find(|p| p.extension().is_some_and(|e| e == "cubin"))
        .expect("a compiled kernel");
    std::fs::remove_file(cache.join(&cubin)).expect("remove");
    let doc = refused(registry, &cache, "capture/torn", &[], 4, dir);
    assert_eq!(doc["reason"], "UnsafeTree", "{doc}");
    let message = doc["message"].as_str().expect("message");
    let name = cubin.file_name().expect("name").to_string_lossy();
    assert!(
        message.contains("__grp__") && message.contains(&*name) && message.contains("missing"),
        "{message}"
    );
}

#[test]
fn a_tree_over_the_size_limit_is_refused_before_packing() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let cache = triton_cache(&dir.join("cache"));
    let doc = refused(
        registry,
        &cache,
        "capture/oversized",
        &["--max-bytes", "64KiB"],
        4,
        dir,
    );
    assert_eq!(doc["reason"], "UnsafeTree", "{doc}");
    let message = doc["message"].as_str().expect("message");
    assert!(
        message.contains("total-too-large") && message.contains("65536"),
        "{message}"
    );
    let doc = refused(
        registry,
        &cache,
        "capture/too-many-files",
        &["--max-files", "10"],
        4,
        dir,
    );
    let message = doc["message"].as_str().expect("message");
    assert!(message.contains("too-many-entries"), "{message}");
}

#[test]
fn a_directory_that_is_not_a_cache_is_refused_naming_what_was_expected() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let cache = dir.join("notes");
    std::fs::create_dir_all(cache.join("sub")).expect("mkdir");
    std::fs::write(cache.join("sub/readme.txt"), b"not a kernel").expect("write");
    let doc = refused(registry, &cache, "capture/not-a-cache", &[], 1, dir);
    assert_eq!(doc["reason"], "NotACache", "{doc}");
    insta::assert_snapshot!(
        "capture-json-not-a-cache",
        support::json_snapshot(&doc.to_string(), dir, registry.addr())
    );
}

#[test]
fn an_unreachable_registry_fails_with_a_clear_error() {
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let cache = triton_cache(&dir.join("cache"));
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let target = format!("127.0.0.1:{port}/capture/unreachable:v1");
    let started = std::time::Instant::now();
    let out = capture(&cache, &target, &["--insecure", "--json"], dir);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["reason"], "RegistryError", "{doc}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("127.0.0.1:{port}")) && stderr.contains("gkm: error:"),
        "the error names the registry: {stderr}"
    );
    assert!(
        stderr.contains("gkm capture: reaching") && !stderr.contains("gkm capture: packing"),
        "nothing is packed for a registry that cannot be reached: {stderr}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "a refused connection fails at once, took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_target_by_digest_or_layout_is_refused() {
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let cache = triton_cache(&dir.join("cache"));
    for target in [
        format!("127.0.0.1:5000/capture/x@sha256:{}", "0".repeat(64)),
        format!("oci:{}", dir.join("layout").display()),
    ] {
        let out = capture(&cache, &target, &["--json"], dir);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(doc["reason"], "InvalidTarget", "{doc}");
        assert!(!dir.join("layout").exists(), "nothing written for {target}");
    }
}

#[test]
fn a_vllm_cache_is_captured_as_a_vllm_image() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let cache = gkm_testenv::fixture_cache("vllm-torch-compile-inductor");
    let target = format!("{}/capture/vllm:v1", registry.addr());
    let out = capture(&cache, &target, &["--insecure", "--json"], dir);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["verified"]["digest"], doc["digest"], "{doc}");
    let inspected = gkm(&["inspect", &target, "--insecure", "--json"], dir);
    assert_eq!(inspected.status.code(), Some(0), "{}", text(&inspected));
    let image: serde_json::Value = serde_json::from_slice(&inspected.stdout).expect("JSON");
    assert_eq!(image["kind"], "vllm", "{image}");
    assert_eq!(image["digest"], doc["digest"], "{image}");
}
