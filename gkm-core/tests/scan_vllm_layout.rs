//! vLLM caches laid out as vLLM 0.33.0 writes them (the current release,
//! read in its wheel `vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl`,
//! commit g4ba787ec9), each path below naming the vLLM file, function and
//! lines that write it:
//!
//! - the hash directory: `vllm/compilation/backends.py`,
//!   `VllmBackend.__call__`, lines 1086-1098: `VLLM_CACHE_ROOT/
//!   torch_compile_cache/<sha256(factors)[:10]>`, the factors being the
//!   env, config, code and compiler hashes (line 1092);
//! - the rank and prefix directories: same function, lines 1103-1106:
//!   `rank_<rank>_<data_parallel_index>/<prefix>`, the prefix the model tag
//!   (`backbone`, line 804; `eagle_head`…);
//! - `cache_key_factors.json` (lines 1153-1166) and `computation_graph.py`
//!   (line 1292) in the prefix directory;
//! - `vllm_compile_cache.py`: `CompilerManager.initialize_cache`, line
//!   194, written by `save_to_file` (lines 231-237) only when AOT compile
//!   is on;
//! - Inductor standalone artefacts: key `artifact_compile_range_<start>_
//!   <end>_subgraph_<i>` (`PiecewiseBackend`, lines 325-327), saved by
//!   `vllm/compilation/compiler_interface.py`,
//!   `InductorStandaloneAdaptor.compile`, lines 415 and 437, as
//!   `CompiledArtifact.save(format=VLLM_COMPILE_CACHE_SAVE_FORMAT)`,
//!   `binary` by default (`vllm/envs.py` line 311): one file (torch 2.11
//!   `torch/_inductor/standalone_compile.py`, `CacheCompiledArtifact.save`:
//!   a CRC-checked `BytesWriter` record of the header
//!   `CacheCompiledArtifact`, `torch_key()`, the key and a Mega-Cache blob)
//!   or, `unpacked`, a directory laid out as an Inductor cache;
//! - `inductor_cache/` and `triton_cache/` in the rank directory
//!   (`initialize_inductor_cache`, `compiler_interface.py` lines 29-42,
//!   called at line 293 when AOT compile is off): `TORCHINDUCTOR_CACHE_DIR`
//!   and `TRITON_CACHE_DIR`;
//! - AOT compile, on by default with torch ≥ 2.10 (`vllm/envs.py`
//!   `use_aot_compile`, lines 379-388): `vllm/compilation/decorators.py`,
//!   lines 556-594: `torch_compile_cache/torch_aot_compile/<sha256
//!   (factors)>/` holding `inductor_cache/` (`TORCHINDUCTOR_CACHE_DIR`,
//!   shared by the ranks) and `rank_<rank>_<dp>/model` (the compiled
//!   function, `save_compiled_function`, line 749; with
//!   `VLLM_USE_MEGA_AOT_ARTIFACT`, on by default with torch ≥ 2.12, the
//!   whole backend is serialised into the same `model` file).
//!
//! What ties a tree to its path: the Triton group files in `triton_cache/`
//! and in `inductor_cache/triton/<device>/` record absolute paths (gkm's
//! relocation rewrites them); standalone artefacts are found relative to
//! the prefix directory (`InductorStandaloneAdaptor.load`, line 452) and
//! the AOT `model` relative to `VLLM_CACHE_ROOT`, so neither records one.
// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::Path;

use base64::Engine as _;
use common::{CUDA_KEY, artefact, cuda_kernel_json, vllm, write};
use gkm_core::cache::kinds::vllm as vllm_kind;
use gkm_core::cache::{VllmFacts, VllmFormat, scan, tree_build_path};
use gkm_testenv::fixture_cache;

/// `VLLM_CACHE_ROOT` where the trees were compiled.
const ROOT: &str = "/root/.cache/vllm";

/// The CUDA fixture's kernel as a Triton cache directory at `key_dir`,
/// its group recording it at `recorded` (the same place below [`ROOT`]).
fn triton_key_dir(key_dir: &Path, recorded: &str) {
    let fixture = fixture_cache("triton-vector-add-cuda-sm75").join(CUDA_KEY);
    let mut children = serde_json::Map::new();
    for entry in fs::read_dir(&fixture).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !name.starts_with("__grp__") {
            write(
                &key_dir.join(&name),
                &fs::read(fixture.join(&name)).unwrap(),
            );
            children.insert(name.clone(), format!("{recorded}/{name}").into());
        }
    }
    write(
        &key_dir.join("__grp__add_kernel.json"),
        &serde_json::to_vec(&serde_json::json!({ "child_paths": children })).unwrap(),
    );
}

/// An Inductor tree (what `TORCHINDUCTOR_CACHE_DIR` and an `unpacked`
/// artefact hold) at `dir`, recorded at `recorded`.
fn inductor_tree(dir: &Path, recorded: &str) {
    write(
        &dir.join("fxgraph/ab/fabc/entry"),
        &artefact(&[&cuda_kernel_json()]),
    );
    write(&dir.join("aotautograd/aabc/entry"), b"\x80\x05pickle");
    write(&dir.join("7k/c7kk.py"), b"# generated\n");
    triton_key_dir(
        &dir.join("triton/0").join(CUDA_KEY),
        &format!("{recorded}/triton/0/{CUDA_KEY}"),
    );
}

/// torch's `BytesWriter`: a CRC-32 of the body, then the records.
fn bytes_writer(parts: &[&[u8]]) -> Vec<u8> {
    let mut body = Vec::new();
    for part in parts {
        body.extend((part.len() as u64).to_be_bytes());
        body.extend(*part);
    }
    let mut crc = !0u32;
    for byte in &body {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    let mut out = (!crc).to_be_bytes().to_vec();
    out.extend(body);
    out
}

/// A `binary` standalone artefact: `CacheCompiledArtifact.save`'s record
/// around a Mega-Cache blob bundling the kernel.
fn binary_artefact() -> Vec<u8> {
    let key = base64::engine::general_purpose::STANDARD.encode("aabc");
    bytes_writer(&[
        b"CacheCompiledArtifact",
        b"torch-key-digest",
        key.as_bytes(),
        &artefact(&[&cuda_kernel_json()]),
    ])
}

#[test]
fn a_vllm_tree_laid_out_as_vllm_writes_it_is_scanned() {
    // AOT compile (the default with torch >= 2.10).
    let dir = tempfile::tempdir().unwrap();
    let aot_hash = "3f1c9a0e5b7d2c4e6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6";
    let aot = dir
        .path()
        .join("torch_compile_cache/torch_aot_compile")
        .join(aot_hash);
    inductor_tree(
        &aot.join("inductor_cache"),
        &format!("{ROOT}/torch_compile_cache/torch_aot_compile/{aot_hash}/inductor_cache"),
    );
    write(
        &aot.join("rank_0_0/model"),
        &bytes_writer(&[
            b"AOTCompiledArtifact",
            b"torch-key",
            &artefact(&[&cuda_kernel_json()]),
        ]),
    );
    let prefix = dir
        .path()
        .join("torch_compile_cache/8d2e41b09c/rank_0_0/backbone");
    write(
        &prefix.join("cache_key_factors.json"),
        br#"{"code_hash": "c0de", "compiler_hash": "5a1e", "config_hash": "cf9", "env": {}}"#,
    );
    write(&prefix.join("computation_graph.py"), b"# graph\n");
    write(&prefix.join("vllm_compile_cache.py"), b"{}\n");

    let manifest = scan(dir.path()).expect("vLLM 0.33's AOT layout scans");
    assert_eq!(
        vllm_kind::format_label(&manifest).as_deref(),
        Some("aot_compile")
    );
    let keys: Vec<&str> = manifest.entries().iter().map(|e| e.key()).collect();
    // Kernels of Triton cache directories are filed under their key (as
    // MCV files them), bundled ones under the file that bundles them.
    assert_eq!(keys, [CUDA_KEY, "rank_0_0/model"]);
    assert!(
        manifest
            .entries()
            .iter()
            .all(|e| vllm(e).vllm_hash.as_deref() == Some(aot_hash))
    );
    assert!(
        manifest
            .summary()
            .targets
            .iter()
            .all(|t| t.to_string() == "cuda/75/32")
    );
    assert_eq!(
        tree_build_path(dir.path()).unwrap().as_deref(),
        Some(Path::new(ROOT))
    );

    // AOT compile off, standalone artefacts saved `binary` (the default
    // format) and `unpacked`, Triton's and Inductor's caches in the rank
    // directory.
    for unpacked in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let rank = dir.path().join("torch_compile_cache/8d2e41b09c/rank_0_0");
        let recorded = format!("{ROOT}/torch_compile_cache/8d2e41b09c/rank_0_0");
        write(
            &rank.join("inductor_cache/fxgraph/ab/fabc/entry"),
            b"\x80\x05pickle",
        );
        triton_key_dir(
            &rank.join("triton_cache").join(CUDA_KEY),
            &format!("{recorded}/triton_cache/{CUDA_KEY}"),
        );
        let prefix = rank.join("backbone");
        write(
            &prefix.join("cache_key_factors.json"),
            br#"{"code_hash": "c0de"}"#,
        );
        write(&prefix.join("computation_graph.py"), b"# graph\n");
        let name = "artifact_compile_range_1_8192_subgraph_0";
        if unpacked {
            inductor_tree(&prefix.join(name), &format!("{recorded}/backbone/{name}"));
        } else {
            write(&prefix.join(name), &binary_artefact());
        }
        let manifest = scan(dir.path()).expect("vLLM 0.33's standalone layout scans");
        assert_eq!(
            vllm_kind::formats(&manifest),
            [VllmFormat::Binary],
            "unpacked: {unpacked}"
        );
        let keys: Vec<&str> = manifest.entries().iter().map(|e| e.key()).collect();
        let artefact_key = if unpacked {
            CUDA_KEY.to_string()
        } else {
            format!("rank_0_0/backbone/{name}")
        };
        assert!(keys.contains(&CUDA_KEY), "{keys:?}");
        assert!(keys.contains(&artefact_key.as_str()), "{keys:?}");
        let records = &manifest.facts::<VllmFacts>().unwrap().artefacts[0].binary[0];
        assert_eq!(
            (records.rank.as_str(), records.prefix.as_str()),
            ("rank_0_0", "backbone")
        );
        assert_eq!(records.artifact_names, [name]);
        assert_eq!(
            tree_build_path(dir.path()).unwrap().as_deref(),
            Some(Path::new(ROOT))
        );
    }
}

#[test]
fn the_older_vllm_fixture_without_a_prefix_directory_still_scans() {
    // `vllm-torch-compile-inductor` is the layout of vLLM before the
    // prefix directory (`InductorAdaptor`, md5-based hash, everything in
    // `rank_0_0/`): not what 0.33 writes, still read.
    let manifest = scan(&fixture_cache("vllm-torch-compile-inductor")).unwrap();
    assert_eq!(
        vllm_kind::format_label(&manifest).as_deref(),
        Some("triton")
    );
    assert!(!manifest.entries().is_empty());
}
