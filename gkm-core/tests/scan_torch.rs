//! Scanning PyTorch's caches: Inductor trees and Mega-Cache blobs, laid out
//! as torch 2.11 writes them (`torch/_inductor/codecache.py` `get_path`,
//! `FxGraphCache._get_tmp_dir_for_key`;
//! `torch/_functorch/_aot_autograd/autograd_cache.py`
//! `AOTAutogradCache._get_tmp_dir_for_key`;
//! `torch/_inductor/runtime/cache_dir_utils.py` `triton_cache_dir`;
//! `torch/utils/_appending_byte_serializer.py` and
//! `torch/compiler/_cache.py` for the Mega-Cache container).
// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::Path;

use base64::Engine as _;
use common::{CUDA_KEY, artefact, cuda_kernel_json, write};
use gkm_core::cache::{
    CacheError, CacheKind, CacheManifest, Declared, TorchFacts, scan, tree_build_path,
};
use gkm_testenv::fixture_cache;

/// Where the trees below were compiled (`TORCHINDUCTOR_CACHE_DIR`).
const BUILT_AT: &str = "/tmp/torchinductor_root";

/// An Inductor tree as torch 2.11 writes it for a CUDA `torch.compile`:
/// one FX graph entry, one AOTAutograd entry, a generated Python module,
/// a C++ kernel, a lock and the Triton kernel in `triton/0/<key>/`,
/// its group recording the kernel's files under [`BUILT_AT`].
fn inductor_tree(root: &Path) {
    write(
        &root.join("fxgraph/ol/folrutsavtmb6yxw77hzsaz2lk43l5bzjn5wrm7b4zms4yyczgc6/xcyego2suxd3nrct5mvmt6wld4ufkhogfe2u6kgxmt26xpg6ra7"),
        &artefact(&[&cuda_kernel_json()]),
    );
    write(
        &root.join("aotautograd/azesfsf6dwkbtsdprulpyhlmpj3oybiigkhsksbbvolaq545gbbp/o6ab3xsdrkjnyzauzudv67wg4ro4a3fk662m6yqbwnmdgtp3lyy"),
        b"\x80\x05pickle",
    );
    write(
        &root.join("7k/c7kk4her5ls6dlka6vn4ios4v4jppok6f6votbncehjdf2whbqb6.py"),
        b"# generated\n",
    );
    write(
        &root.join("uv/cuvgtcatumc5iecwj2f6gdubjqqbvs5yrqrxl3w5tp4ja2glxwq7.main.cpp"),
        b"extern \"C\" void kernel() {}\n",
    );
    // A real library Inductor built (fixtures/torch): gkm refuses one that
    // is not a whole ELF file.
    let library = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/torch/inductor/ht/chtw5l77yxhgzkni3bo4jtkxyxriuzy6rjaji72aehdvpmcb6iex.main.so");
    write(
        &root.join("uv/cuvgtcatumc5iecwj2f6gdubjqqbvs5yrqrxl3w5tp4ja2glxwq7.main.so"),
        &fs::read(library).unwrap(),
    );
    write(
        &root.join("locks/cuvgtcatumc5iecwj2f6gdubjqqbvs5yrqrxl3w5tp4ja2glxwq7.lock"),
        b"",
    );
    let fixture = fixture_cache("triton-vector-add-cuda-sm75").join(CUDA_KEY);
    let key = root.join("triton/0").join(CUDA_KEY);
    let mut children = serde_json::Map::new();
    for entry in fs::read_dir(&fixture).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.starts_with("__grp__") {
            continue;
        }
        let mut bytes = fs::read(fixture.join(&name)).unwrap();
        if name == "add_kernel.json" {
            // Triton 3.x states its version in the kernel's metadata.
            let mut meta: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            meta["triton_version"] = "3.6.0".into();
            bytes = serde_json::to_vec(&meta).unwrap();
        }
        write(&key.join(&name), &bytes);
        children.insert(
            name.clone(),
            format!("{BUILT_AT}/triton/0/{CUDA_KEY}/{name}").into(),
        );
    }
    write(
        &key.join("__grp__add_kernel.json"),
        &serde_json::to_vec(&serde_json::json!({ "child_paths": children })).unwrap(),
    );
}

/// One artefact type: its name and (key, content) pairs.
type Record<'a> = (&'a str, &'a [(&'a str, &'a [u8])]);

/// A Mega-Cache blob as `AppendingByteSerializer` writes it.
fn mega_cache(records: &[Record<'_>]) -> Vec<u8> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let mut body = 1u64.to_be_bytes().to_vec();
    let bytes = |body: &mut Vec<u8>, b: &[u8]| {
        body.extend((b.len() as u64).to_be_bytes());
        body.extend(b);
    };
    for (kind, artefacts) in records {
        bytes(&mut body, b64(kind).as_bytes());
        body.extend((artefacts.len() as u64).to_be_bytes());
        for (key, content) in *artefacts {
            bytes(&mut body, b64(key).as_bytes());
            bytes(&mut body, content);
        }
    }
    let mut out = crc32(&body).to_be_bytes().to_vec();
    out.extend(body);
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in data {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

#[test]
fn an_inductor_tree_is_scanned_with_its_triton_kernels_and_parts_counted() {
    let dir = tempfile::tempdir().unwrap();
    inductor_tree(dir.path());
    let manifest = scan(dir.path()).expect("an Inductor tree scans");
    assert_eq!(manifest.kind(), CacheKind::Inductor);
    assert_eq!(manifest.entries().len(), 1);
    assert_eq!(manifest.entries()[0].key(), format!("triton/0/{CUDA_KEY}"));
    assert_eq!(manifest.summary().to_string(), "cuda/75/32");
    let torch = manifest.facts::<TorchFacts>().expect("torch facts");
    let counts: Vec<(&str, u64)> = torch.counts.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        counts,
        [
            ("aotautograd", 1),
            ("cpp", 1),
            ("fxgraph", 1),
            ("python", 1),
            ("triton", 1)
        ]
    );
    assert_eq!(
        manifest.triton_versions(),
        ["3.6.0"],
        "read from Triton's JSON"
    );
    // The tree's build path is the Inductor root its Triton groups were
    // recorded under: what relocation moves them from.
    assert_eq!(
        tree_build_path(dir.path()).unwrap().as_deref(),
        Some(Path::new(BUILT_AT))
    );
    // The manifest keeps the kind and facts through its JSON.
    let back = CacheManifest::from_json(&manifest.to_json()).unwrap();
    assert_eq!(back, manifest);
}

#[test]
fn an_inductor_tree_whose_triton_group_names_a_missing_child_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    inductor_tree(dir.path());
    fs::remove_file(
        dir.path()
            .join("triton/0")
            .join(CUDA_KEY)
            .join("add_kernel.cubin"),
    )
    .unwrap();
    let err = scan(dir.path()).unwrap_err();
    assert!(
        matches!(&err, CacheError::TornGroup { entry, .. } if entry == "add_kernel.cubin"),
        "{err}"
    );
}

#[test]
fn a_file_inductor_does_not_write_refuses_the_tree_naming_it() {
    for foreign in ["notes.txt", "models/weights.bin", "fxgraph/ol/stray"] {
        let dir = tempfile::tempdir().unwrap();
        inductor_tree(dir.path());
        write(&dir.path().join(foreign), b"x");
        let err = scan(dir.path()).unwrap_err();
        let named = foreign
            .split('/')
            .take(if foreign.starts_with("models") { 1 } else { 3 });
        let named = named.collect::<Vec<_>>().join("/");
        assert!(
            matches!(&err, CacheError::Foreign { path, .. } if path.ends_with(&named)),
            "{foreign}: {err}"
        );
    }
}

#[test]
fn a_cpu_only_inductor_tree_has_no_targets_and_records_what_its_builder_declared() {
    let dir = tempfile::tempdir().unwrap();
    inductor_tree(dir.path());
    fs::remove_dir_all(dir.path().join("triton")).unwrap();
    let mut manifest = scan(dir.path()).unwrap();
    assert_eq!(manifest.kind(), CacheKind::Inductor);
    assert!(manifest.summary().targets.is_empty());
    let declared = Declared {
        torch_version: Some("2.11.0+cpu".into()),
        cpu_isa: Some("avx512".into()),
        ..Default::default()
    };
    manifest.declare(dir.path(), &declared).unwrap();
    let torch = manifest.facts::<TorchFacts>().unwrap();
    assert_eq!(torch.declared_torch_version.as_deref(), Some("2.11.0+cpu"));
    assert_eq!(torch.declared_cpu_isa.as_deref(), Some("avx512"));
    let bad = Declared {
        cpu_isa: Some("sse9".into()),
        ..Default::default()
    };
    assert!(
        manifest
            .declare(dir.path(), &bad)
            .unwrap_err()
            .to_string()
            .contains("sse9")
    );
    // A Triton cache takes no PyTorch facts.
    let sm75 = fixture_cache("triton-vector-add-cuda-sm75");
    let mut triton = scan(&sm75).unwrap();
    let err = triton.declare(&sm75, &declared).unwrap_err().to_string();
    assert!(
        err.contains(
            "--torch-version describes Inductor and Mega-Cache caches, not a Triton cache"
        ),
        "{err}"
    );
}

#[test]
fn a_mega_cache_blob_is_read_from_its_container_and_its_bundled_kernels_found() {
    let dir = tempfile::tempdir().unwrap();
    let fx = artefact(&[&cuda_kernel_json()]);
    let blob = mega_cache(&[
        (
            "inductor",
            &[("folrutsavtmb6yxw77hzsaz2lk43l5bzjn5wrm7b4zms4yyczgc6", &fx)],
        ),
        (
            "aot_autograd",
            &[(
                "azesfsf6dwkbtsdprulpyhlmpj3oybiigkhsksbbvolaq545gbbp",
                b"\x80\x05pickle",
            )],
        ),
    ]);
    let path = dir.path().join("mega-cache.bin");
    fs::write(&path, blob).unwrap();
    for scanned in [path.as_path(), dir.path()] {
        let manifest = scan(scanned).expect("a Mega-Cache blob scans");
        assert_eq!(manifest.kind(), CacheKind::MegaCache);
        assert_eq!(manifest.summary().to_string(), "cuda/75/32");
        assert_eq!(
            manifest.entries()[0].key(),
            "mega-cache.bin:inductor/folrutsavtmb6yxw77hzsaz2lk43l5bzjn5wrm7b4zms4yyczgc6"
        );
        let counts = &manifest.facts::<TorchFacts>().unwrap().counts;
        assert_eq!(counts["inductor"], 1);
        assert_eq!(counts["aot_autograd"], 1);
        assert_eq!(counts["triton"], 1);
    }
}

#[test]
fn a_file_that_is_not_a_mega_cache_blob_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("model.pt");
    fs::write(&junk, b"\x80\x05not a mega-cache").unwrap();
    let err = scan(&junk).unwrap_err();
    assert!(
        matches!(&err, CacheError::NotACache { path, expected } if *path == junk && expected.contains("checksum")),
        "{err}"
    );
    // A blob whose content does not match its checksum.
    let corrupt = dir.path().join("corrupt.bin");
    let mut blob = mega_cache(&[("pgo", &[("k", b"v")])]);
    let last = blob.len() - 1;
    blob[last] ^= 1;
    fs::write(&corrupt, blob).unwrap();
    let err = scan(&corrupt).unwrap_err();
    assert!(
        err.to_string().contains("does not match its content"),
        "{err}"
    );
    fs::remove_file(&corrupt).unwrap();
    // Next to a blob, the stranger is named.
    fs::write(
        dir.path().join("mega-cache.bin"),
        mega_cache(&[("pgo", &[("k", b"v")])]),
    )
    .unwrap();
    let err = scan(dir.path()).unwrap_err();
    assert!(
        matches!(&err, CacheError::Foreign { path, .. } if *path == junk),
        "{err}"
    );
}

#[test]
fn an_inductor_tree_mounted_elsewhere_gets_its_triton_groups_rewritten_for_that_path() {
    // torch skips writing a bundled kernel whose directory exists
    // (`TritonBundler.read_and_emit`), so an image carrying `triton/` keeps
    // its own groups: relocation is what makes them hit at another path.
    let dir = tempfile::tempdir().unwrap();
    inductor_tree(dir.path());
    let moved =
        gkm_core::cache::relocated_groups(dir.path(), Path::new("/cache/inductor")).unwrap();
    assert_eq!(moved.len(), 1);
    let (group, bytes) = &moved[0];
    assert_eq!(
        group,
        &Path::new("triton/0")
            .join(CUDA_KEY)
            .join("__grp__add_kernel.json")
    );
    let doc: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    assert_eq!(
        doc["child_paths"]["add_kernel.cubin"],
        format!("/cache/inductor/triton/0/{CUDA_KEY}/add_kernel.cubin")
    );
}
