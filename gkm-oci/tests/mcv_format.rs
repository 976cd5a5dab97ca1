//! An image `gkm build` writes with its defaults is one MCV and GKM's
//! extractor (`gkm-extract`, which calls MCV's extraction) unpack unchanged.
//!
//! The images are built from the fixture caches and from a vLLM cache in
//! the `binary` layout, pushed to a real Distribution registry, and read
//! back over plain HTTP, the way any registry client sees them, without
//! gkm's reader. Each image is then checked against the rules MCV's
//! published image format (`mcv/docs/spec-compat.md` in GKM's repository)
//! and its extraction code (`mcv/pkg/fetcher/imgfetcher.go`,
//! `mcv/pkg/cache/cache.go`, `mcv/pkg/cache/types.go`,
//! `mcv/pkg/cache/vllm.go`, `mcv/pkg/preflightcheck/utils.go`) state:
//!
//! 1. The cache type comes from the image config's labels: a
//!    `cache.triton.image/summary` label makes a Triton image, a
//!    `cache.vllm.image/summary` one a vLLM image.
//! 2. Extraction takes every layer whose media type is
//!    `application/vnd.oci.image.layer.v1.tar+gzip` or
//!    `application/vnd.docker.image.rootfs.diff.tar.gzip`, whatever the
//!    manifest's own media type; an image with none is refused. The format
//!    recommends exactly one layer.
//! 3. Each such layer is opened as gzip, then read as a tar.
//! 4. Files under `io.triton.cache/` (`io.vllm.cache` for vLLM) are the
//!    cache, written below the extraction directory with that prefix
//!    stripped; `io.triton.manifest/manifest.json`
//!    (`io.vllm.manifest/manifest.json`) is the manifest; everything else
//!    is skipped. Only directories and regular files are written.
//! 5. `cache.<type>.image/cache-size-bytes` must equal the bytes of the
//!    regular files written from under the cache prefix.
//! 6. The labels `cache.<type>.image/entry-count` and
//!    `cache.<type>.image/summary` are set; the summary is
//!    `{"targets":[{"backend":string,"arch":string,"warp_size":int,
//!    "ptx_version"?:int,"cuda_version"?:string}]}`. In a vLLM cache with
//!    binary artefacts a CUDA arch is written `sm_XY`; comparisons strip
//!    the prefix, so `XY` and `sm_XY` both match.
//! 7. `manifest.json` is `{"triton":[entry]}` with `hash`, `backend`,
//!    `arch`, `warp_size` (and optional `dummy_key`, `ptx_version`,
//!    `num_stages`, `num_warps`, `debug`), or `{"vllm":[group]}` with
//!    groups `{"vllmHash","cacheFormat","triton"?,"binary"?,"aot_compile"?}`;
//!    a `binary` record has `rank`, `prefix`, `artifact_count` and optional
//!    `artifact_names`, hashes, `cache_save_format`, `target_device`, `env`.
//! 8. vLLM images carry `cache.vllm.image/format` (the layouts present,
//!    comma-separated, in the order `aot_compile`, `binary`, `triton`) and
//!    the `io.kserve.km/*` labels: `framework=vllm`,
//!    `cache-type=torch-compile`, `cache-hash` (the hash directories,
//!    comma-separated), `cache-mount-subpath` (`torch_compile_cache`, or
//!    `torch_compile_cache/torch_aot_compile`) and
//!    `cache-root-env=VLLM_CACHE_ROOT=/home/kserve/.cache/vllm`.
//!
//! Following rule 4 to the letter, the extracted tree must equal the cache
//! the image was built from.
//!
//! GKM's extractor is not published as a Go module that builds from the
//! module proxy (the proxy refuses `github.com/redhat-et/GKM/mcv`), so it is
//! not run itself. Instead each image is also read by `mcv-extract`
//! (`hack/tools/mcv-extract`, built by `hack/ci/components.sh mcv-extract`): a
//! small Go program on the stack MCV extracts with, the registry client
//! `go-containerregistry` at the version MCV pins (v0.20.7) with Go's
//! `compress/gzip`, `archive/tar` and `encoding/json`, applying the same
//! rules and decoding the summary and `manifest.json` into structs with
//! MCV's field types. What it extracts must equal the source cache too.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

use common::FIXTURES;
use gkm_oci::{BuildOptions, ImageRef, RegistryOptions, build};
use gkm_testenv::fixture_cache;
use serde_json::Value;

/// The layer media types MCV extracts (rule 2).
const GZIP_LAYERS: [&str; 2] = [
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
];

/// The manifest media types a registry client asks for.
const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// A plain HTTP/1.0 GET against the registry; the body of a 200 answer.
fn http_get(addr: &str, path: &str) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).expect("connect to the registry");
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: {ACCEPT}\r\n\r\n"
    )
    .expect("send request");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("read response");
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of headers");
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "GET {path}: {head}"
    );
    response[split + 4..].to_vec()
}

/// What MCV's extraction (rule 4) writes: cache files by path below the
/// extraction directory, and the manifest.
#[derive(Default)]
struct Extracted {
    files: BTreeMap<String, Vec<u8>>,
    dirs: Vec<String>,
    manifest: Option<Vec<u8>>,
    cache_bytes: u64,
}

/// Unpack a gzip layer as MCV does (rules 3 and 4).
fn extract_like_mcv(layer: &[u8], cache_prefix: &str, manifest_prefix: &str, out: &mut Extracted) {
    assert_eq!(&layer[..2], b"\x1f\x8b", "the layer is not gzip");
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(layer));
    for entry in archive.entries().expect("tar entries") {
        let mut entry = entry.expect("tar entry");
        let name = entry
            .path()
            .expect("entry path")
            .to_string_lossy()
            .into_owned();
        let manifest_file = format!("{manifest_prefix}manifest.json");
        let rel = if let Some(rel) = name.strip_prefix(cache_prefix) {
            rel.trim_start_matches('/')
                .trim_end_matches('/')
                .to_string()
        } else if name.starts_with(&manifest_file) {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).expect("manifest bytes");
            out.manifest = Some(bytes);
            continue;
        } else {
            continue;
        };
        if rel.is_empty() {
            continue;
        }
        match entry.header().entry_type() {
            tar::EntryType::Directory => out.dirs.push(rel),
            tar::EntryType::Regular => {
                let mut bytes = Vec::new();
                entry.read_to_end(&mut bytes).expect("file bytes");
                out.cache_bytes += entry.header().size().expect("size");
                out.files.insert(rel, bytes);
            }
            other => {
                panic!("{name}: {other:?} entries are skipped by MCV, so the cache would lose it")
            }
        }
    }
}

/// Every regular file below `root`, by relative path, and every directory.
fn source_tree(root: &Path) -> (BTreeMap<String, Vec<u8>>, Vec<String>) {
    let mut files = BTreeMap::new();
    let mut dirs = Vec::new();
    for (rel, node) in common::tree(root) {
        match node {
            common::Node::Dir => dirs.push(rel),
            common::Node::File { bytes, .. } => {
                files.insert(rel, bytes);
            }
        }
    }
    (files, dirs)
}

/// The string label `key`, failing with the labels when it is missing.
fn label<'a>(labels: &'a BTreeMap<String, String>, key: &str) -> &'a str {
    labels
        .get(key)
        .unwrap_or_else(|| panic!("no label {key} in {labels:#?}"))
}

/// Rule 6: the summary's shape, as MCV's `Summary` type reads it.
fn check_summary(summary: &str) -> Vec<(String, String, u64)> {
    let value: Value = serde_json::from_str(summary).expect("summary is JSON");
    let targets = value["targets"]
        .as_array()
        .expect("summary.targets is a list");
    assert!(!targets.is_empty(), "summary lists no target: {summary}");
    targets
        .iter()
        .map(|t| {
            let backend = t["backend"].as_str().expect("backend is a string");
            let arch = t["arch"].as_str().expect("arch is a string");
            let warp = t["warp_size"].as_u64().expect("warp_size is an integer");
            if let Some(ptx) = t.get("ptx_version") {
                assert!(ptx.is_u64(), "ptx_version is an integer: {summary}");
            }
            if let Some(cuda) = t.get("cuda_version") {
                assert!(cuda.is_string(), "cuda_version is a string: {summary}");
            }
            (backend.to_string(), arch.to_string(), warp)
        })
        .collect()
}

/// Rule 7: one Triton entry as MCV's `TritonCacheMetadata` reads it.
fn check_triton_entry(entry: &Value) {
    assert!(entry["hash"].is_string(), "hash: {entry}");
    assert!(entry["backend"].is_string(), "backend: {entry}");
    assert!(
        entry["arch"].is_string() || entry["arch"].is_u64(),
        "arch: {entry}"
    );
    assert!(entry["warp_size"].is_u64(), "warp_size: {entry}");
    for (key, ok) in [
        (
            "dummy_key",
            entry.get("dummy_key").is_none_or(Value::is_string),
        ),
        (
            "ptx_version",
            entry
                .get("ptx_version")
                .is_none_or(|v| v.is_u64() || v.is_null()),
        ),
        (
            "num_stages",
            entry.get("num_stages").is_none_or(Value::is_u64),
        ),
        (
            "num_warps",
            entry.get("num_warps").is_none_or(Value::is_u64),
        ),
        ("debug", entry.get("debug").is_none_or(Value::is_boolean)),
    ] {
        assert!(ok, "{key} has a type MCV cannot read: {entry}");
    }
}

/// Rule 7: the manifest's shape; the number of kernel entries it lists.
fn check_manifest(kind: &str, manifest: &[u8]) -> usize {
    let doc: Value = serde_json::from_slice(manifest).expect("manifest.json is JSON");
    let list = doc[kind]
        .as_array()
        .unwrap_or_else(|| panic!("manifest.json has no {kind} list"));
    if kind == "triton" {
        list.iter().for_each(check_triton_entry);
        return list.len();
    }
    let mut kernels = 0;
    for group in list {
        assert!(group["vllmHash"].is_string(), "vllmHash: {group}");
        let format = group["cacheFormat"]
            .as_str()
            .expect("cacheFormat is a string");
        assert!(
            ["triton", "binary", "aot_compile"].contains(&format),
            "{format}"
        );
        for entry in group
            .get("triton")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            check_triton_entry(entry);
            kernels += 1;
        }
        for record in group
            .get("binary")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            assert_eq!(
                format, "binary",
                "binary records sit in binary groups: {group}"
            );
            assert!(
                record["rank"].is_string() && record["prefix"].is_string(),
                "{record}"
            );
            let count = record["artifact_count"].as_u64().expect("artifact_count");
            let names = record["artifact_names"].as_array().expect("artifact_names");
            assert_eq!(count as usize, names.len(), "{record}");
            for key in [
                "code_hash",
                "config_hash",
                "compiler_hash",
                "cache_save_format",
                "target_device",
            ] {
                assert!(
                    record.get(key).is_none_or(Value::is_string),
                    "{key}: {record}"
                );
            }
            assert!(
                record.get("env").is_none_or(Value::is_object),
                "env: {record}"
            );
        }
    }
    kernels
}

/// Build `dir` with `gkm build`'s defaults, push it, and check every rule;
/// the extracted cache must equal the tree at `root` (`dir` itself, or the
/// vLLM cache root above it). Returns the labels for kind-specific checks.
async fn check_image(
    registry: &str,
    dir: &Path,
    root: &Path,
    repo: &str,
) -> BTreeMap<String, String> {
    let remote: ImageRef = format!("{registry}/{repo}:v1").parse().expect("ref");
    let opts = RegistryOptions {
        insecure: true,
        ..Default::default()
    };
    build(dir, &remote, &BuildOptions::default(), &opts)
        .await
        .expect("gkm build");

    let manifest: Value =
        serde_json::from_slice(&http_get(registry, &format!("/v2/{repo}/manifests/v1")))
            .expect("manifest JSON");
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .expect("config digest");
    let config: Value = serde_json::from_slice(&http_get(
        registry,
        &format!("/v2/{repo}/blobs/{config_digest}"),
    ))
    .expect("config JSON");
    let labels: BTreeMap<String, String> =
        serde_json::from_value(config["config"]["Labels"].clone()).expect("config labels");

    // Rule 1.
    let kind = if labels.contains_key("cache.triton.image/summary") {
        "triton"
    } else if labels.contains_key("cache.vllm.image/summary") {
        "vllm"
    } else {
        panic!("{repo}: no cache type label in {labels:#?}")
    };
    let (cache_prefix, manifest_prefix) = match kind {
        "triton" => ("io.triton.cache/", "io.triton.manifest/"),
        _ => ("io.vllm.cache", "io.vllm.manifest/"),
    };

    // Rule 2.
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(
        layers.len(),
        1,
        "{repo}: one layer, as the format recommends"
    );
    let mut extracted = Extracted::default();
    for layer in layers {
        let media_type = layer["mediaType"].as_str().expect("layer media type");
        assert!(
            GZIP_LAYERS.contains(&media_type),
            "{repo}: layer type {media_type}"
        );
        let digest = layer["digest"].as_str().expect("layer digest");
        // Rules 3 and 4.
        let blob = http_get(registry, &format!("/v2/{repo}/blobs/{digest}"));
        extract_like_mcv(&blob, cache_prefix, manifest_prefix, &mut extracted);
    }

    // Rule 4: the extracted cache is the source cache.
    let (files, dirs) = source_tree(root);
    assert_eq!(
        extracted.files, files,
        "{repo}: extracted files differ from the cache"
    );
    let mut got_dirs = extracted.dirs.clone();
    got_dirs.sort();
    assert_eq!(got_dirs, dirs, "{repo}: extracted directories differ");

    // Rule 5.
    let size: u64 = label(&labels, &format!("cache.{kind}.image/cache-size-bytes"))
        .parse()
        .expect("cache-size-bytes is a number");
    assert_eq!(
        size, extracted.cache_bytes,
        "{repo}: size validation would fail"
    );

    // Rules 6 and 7.
    let entry_count: usize = label(&labels, &format!("cache.{kind}.image/entry-count"))
        .parse()
        .expect("entry-count is a number");
    check_summary(label(&labels, &format!("cache.{kind}.image/summary")));
    let manifest_json = extracted.manifest.expect("the layer holds manifest.json");
    assert_eq!(check_manifest(kind, &manifest_json), entry_count, "{repo}");

    // The same rules on MCV's stack.
    let report = mcv_extract(&format!("{registry}/{repo}:v1"), root);
    assert_eq!(report["kind"], kind, "{repo}: {report}");
    assert_eq!(report["kernels"], entry_count, "{repo}: {report}");
    assert_eq!(report["cache_bytes"], size, "{repo}: {report}");
    labels
}

/// Runs `mcv-extract` on `image`, checks that it extracted exactly the
/// cache at `source`, and returns its report.
fn mcv_extract(image: &str, source: &Path) -> Value {
    let bin = gkm_testenv::tools_bin_dir().join("mcv-extract");
    assert!(
        bin.exists(),
        "{} is missing: run hack/ci/components.sh mcv-extract",
        bin.display()
    );
    let out = tempfile::tempdir().expect("tempdir");
    let run = std::process::Command::new(&bin)
        .args(["-insecure", image])
        .arg(out.path())
        .output()
        .expect("run mcv-extract");
    assert!(
        run.status.success(),
        "mcv-extract refused {image}: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        source_tree(&out.path().join("cache")),
        source_tree(source),
        "{image}: what mcv-extract wrote differs from the cache"
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("mcv-extract report")
}

/// A vLLM cache in the `binary` layout: two Inductor artefacts bundling the
/// CUDA fixture's kernel, next to `cache_key_factors.json`.
fn binary_vllm_cache(root: &Path) {
    let kernel = std::fs::read(
        fixture_cache("triton-vector-add-cuda-sm75")
            .join("5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.json"),
    )
    .expect("fixture kernel metadata");
    let prefix = root.join("torch_compile_cache/5e0f1a2b3c/rank_0_0/backbone");
    std::fs::create_dir_all(&prefix).expect("mkdir");
    std::fs::write(
        prefix.join("cache_key_factors.json"),
        br#"{"code_hash":"c0de","config_hash":"c0f1","compiler_hash":"c0c0","env":{"VLLM_TARGET_DEVICE":"cuda"}}"#,
    )
    .expect("write key factors");
    for i in 0..2 {
        let mut blob = b"\x80\x05\x95 bundled kernel follows ".to_vec();
        blob.extend_from_slice(&kernel);
        blob.extend_from_slice(&[0u8; 32]);
        std::fs::write(
            prefix.join(format!("artifact_compile_range_1_2048_subgraph_{i}")),
            blob,
        )
        .expect("write artefact");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn default_build_satisfies_mcv_extraction_rules() {
    let registry = gkm_testenv::Registry::shared()
        .expect("start docker-registry (apt-get install -y docker-registry)");
    let addr = registry.addr();

    for name in FIXTURES {
        let labels = check_image(
            addr,
            &fixture_cache(name),
            &fixture_cache(name),
            &format!("mcv-format/{name}"),
        )
        .await;
        if name.starts_with("vllm") {
            // Rule 8, triton layout.
            assert_eq!(label(&labels, "cache.vllm.image/format"), "triton");
            assert_eq!(label(&labels, "io.kserve.km/framework"), "vllm");
            assert_eq!(label(&labels, "io.kserve.km/cache-type"), "torch-compile");
            assert_eq!(label(&labels, "io.kserve.km/cache-hash"), "d4ec7c2a7d");
            assert_eq!(
                label(&labels, "io.kserve.km/cache-mount-subpath"),
                "torch_compile_cache"
            );
            assert_eq!(
                label(&labels, "io.kserve.km/cache-root-env"),
                "VLLM_CACHE_ROOT=/home/kserve/.cache/vllm"
            );
        } else {
            assert!(
                !labels.keys().any(|k| k.starts_with("io.kserve.km/")),
                "{name}: KServe labels are for vLLM caches"
            );
        }
        if name.contains("cuda") {
            // A Triton cache's arch is the bare number, as MCV writes it.
            let targets = check_summary(label(&labels, "cache.triton.image/summary"));
            assert_eq!(targets, [("cuda".into(), "75".into(), 32)]);
        }
    }

    // Built from below its root, a vLLM cache is still laid out from the
    // root, as MCV lays it out, so it extracts to a cache root.
    let vllm_root = fixture_cache("vllm-torch-compile-inductor");
    for (below, repo) in [
        ("torch_compile_cache", "mcv-format/vllm-compile-cache-dir"),
        ("torch_compile_cache/d4ec7c2a7d", "mcv-format/vllm-hash-dir"),
    ] {
        check_image(addr, &vllm_root.join(below), &vllm_root, repo).await;
    }

    let work = tempfile::tempdir().expect("tempdir");
    binary_vllm_cache(work.path());
    let labels = check_image(addr, work.path(), work.path(), "mcv-format/vllm-binary").await;
    // Rules 6 and 8, binary layout.
    let targets = check_summary(label(&labels, "cache.vllm.image/summary"));
    assert_eq!(targets, [("cuda".into(), "sm_75".into(), 32)]);
    assert_eq!(label(&labels, "cache.vllm.image/format"), "binary");
    assert_eq!(label(&labels, "io.kserve.km/cache-hash"), "5e0f1a2b3c");
    // Its `binary` record decodes into MCV's types.
    let report = mcv_extract(&format!("{addr}/mcv-format/vllm-binary:v1"), work.path());
    assert_eq!(report["records"], 1, "{report}");
}
