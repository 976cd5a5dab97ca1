//! `gkm build`, `inspect` and `check` on real vLLM CPU cache roots, as a
//! user runs them: `hack/fixtures/vllm-roots/{llama,qwen3}.tar.zst`, the
//! `VLLM_CACHE_ROOT`s vLLM CPU 0.32.0 (torch 2.13.0, GCC 12) wrote on its
//! first start of each model (`hack/vllm/roots.sh`). Their
//! `torch_compile_cache/torch_aot_compile/<sha256>/inductor_cache/` holds
//! the 17 C++ kernel libraries Inductor built (7 kernels, 10 ISA probes),
//! which the next start reuses: the cache is those C++ kernels, judged by
//! the CPU ISA they were compiled for (`amx_tile` on the machine that wrote
//! them), read from the libraries themselves.

// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};

use gkm_core::cache::{CacheKind, CacheManifest, VllmCppKernel, scan};
use gkm_core::compat::host_cpu_isa;

mod support;

use support::{gkm_in, gkm_ok, text};

/// The ISA the fixtures' kernels were compiled for.
const FIXTURE_ISA: &str = "amx_tile";

/// The C++ kernel libraries in each fixture root (`cpp_kernels_built` in
/// `hack/fixtures/vllm-roots/<arch>.json`).
const CPP_KERNELS: usize = 17;

/// `<arch>.tar.zst` extracted into `into`: the cache root.
fn extracted(arch: &str, into: &Path) -> PathBuf {
    let archive = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../hack/fixtures/vllm-roots")
        .join(format!("{arch}.tar.zst"));
    let file = fs::File::open(&archive).unwrap();
    let root = into.join(arch);
    tar::Archive::new(zstd::Decoder::new(file).unwrap())
        .unpack(&root)
        .unwrap();
    root
}

/// The one `inductor_cache/` of a fixture root.
fn inductor_cache(root: &Path) -> PathBuf {
    let aot = root.join("torch_compile_cache/torch_aot_compile");
    let hash = fs::read_dir(&aot).unwrap().next().unwrap().unwrap().path();
    hash.join("inductor_cache")
}

#[test]
fn a_real_vllm_cpu_root_is_a_cache_of_cpp_kernels_that_fits_the_cpu_they_were_built_for() {
    let dir = tempfile::tempdir().unwrap();
    let host = host_cpu_isa();
    for arch in ["llama", "qwen3"] {
        let root = extracted(arch, dir.path());
        let image = format!("oci:{}:{arch}", dir.path().join("layout").display());

        // Its manifest lists the C++ kernels and reads back as written.
        let manifest = scan(&root).unwrap();
        let cpp: Vec<&VllmCppKernel> = manifest
            .entries()
            .iter()
            .filter_map(|e| e.facts())
            .collect();
        assert_eq!(cpp.len(), CPP_KERNELS);
        assert_eq!(cpp.iter().filter(|k| k.kernel.isa_check).count(), 10);
        assert!(
            cpp.iter()
                .all(|k| k.kernel.key.starts_with("inductor_cache/"))
        );
        assert_eq!(
            CacheManifest::from_json(&manifest.to_json()).unwrap(),
            manifest
        );

        let built = gkm_ok(&["build", root.to_str().unwrap(), "-t", &image], dir.path());
        eprintln!("gkm build ({arch}):\n{built}");
        assert!(
            built.contains(&format!(
                "(vllm cache): {CPP_KERNELS} kernels, ")
            ) && built.contains(&format!(
                "targets: none (no GPU kernel); {CPP_KERNELS} C++ kernels, CPU ISA {FIXTURE_ISA} (read from the kernels)"
            )),
            "{built}"
        );

        let inspected = gkm_ok(&["inspect", &image], dir.path());
        eprintln!("gkm inspect ({arch}):\n{inspected}");
        assert!(
            inspected.contains("Format:      aot_compile"),
            "{inspected}"
        );
        assert!(
            inspected.contains(&format!("C++ kernels: {CPP_KERNELS}\n")),
            "{inspected}"
        );
        assert!(
            inspected.contains(&format!(
                "CPU ISA:     {FIXTURE_ISA} (read from the kernels)"
            )),
            "{inspected}"
        );
        let doc: serde_json::Value =
            serde_json::from_str(&gkm_ok(&["inspect", "--json", &image], dir.path())).unwrap();
        assert_eq!(doc["labels"]["cache.vllm.image/cpu-isa"], FIXTURE_ISA);
        assert_eq!(
            doc["labels"]["cache.vllm.image/cpp-kernel-count"],
            CPP_KERNELS.to_string()
        );
        assert_eq!(doc["cpu"]["isaDeclared"], false);

        // On this machine, and on nodes of either ISA, from the root and
        // from the image alike.
        for target in [root.to_str().unwrap(), &image] {
            let here = gkm_in(&["check", target], dir.path());
            eprintln!("gkm check {target}:\n{}", text(&here));
            assert_eq!(
                here.status.success(),
                host.as_deref() == Some(FIXTURE_ISA),
                "compatible exactly where Inductor picks {FIXTURE_ISA} (this CPU: {host:?}): {}",
                text(&here)
            );
            let fits = gkm_ok(&["check", target, "--cpu-isa", FIXTURE_ISA], dir.path());
            assert!(
                fits.contains(&format!(
                    "CPU {FIXTURE_ISA}: compatible ({CPP_KERNELS} C++ kernels built for {FIXTURE_ISA})"
                )),
                "{fits}"
            );
            let other = gkm_in(&["check", target, "--cpu-isa", "avx512"], dir.path());
            assert_eq!(other.status.code(), Some(3), "{}", text(&other));
            assert!(
                text(&other).contains(&format!(
                    "the C++ kernels were built for {FIXTURE_ISA}; Inductor picks avx512"
                )),
                "{}",
                text(&other)
            );
        }
    }
}

#[test]
fn a_foreign_file_or_a_torn_kernel_in_a_vllm_inductor_cache_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let image = format!("oci:{}:refused", dir.path().join("layout").display());

    let root = extracted("llama", &dir.path().join("foreign"));
    let foreign = inductor_cache(&root).join("notes.txt");
    fs::write(&foreign, b"not Inductor's").unwrap();
    let out = gkm_in(&["build", root.to_str().unwrap(), "-t", &image], dir.path());
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!(
            "{} is not part of an Inductor cache",
            foreign.display()
        )),
        "{}",
        text(&out)
    );

    let root = extracted("llama", &dir.path().join("torn"));
    let code = inductor_cache(&root).join("xz");
    let library = fs::read_dir(&code)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".main.so"))
        .unwrap();
    let bytes = fs::read(&library).unwrap();
    fs::write(&library, &bytes[..bytes.len() / 2]).unwrap();
    let out = gkm_in(&["build", root.to_str().unwrap(), "-t", &image], dir.path());
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!("{} is a torn entry", library.display())),
        "{}",
        text(&out)
    );
    fs::write(&library, b"").unwrap();
    let out = gkm_in(&["check", root.to_str().unwrap()], dir.path());
    assert!(
        text(&out).contains("is a torn entry: a C++ kernel library that is empty"),
        "{}",
        text(&out)
    );
}

#[test]
fn inductors_locks_in_a_vllm_root_are_scratch() {
    let vllm = CacheKind::Vllm.rules();
    let hash = "torch_compile_cache/torch_aot_compile/cb62a28c/inductor_cache";
    assert!(vllm.scratch(&format!("{hash}/locks"), true).is_some());
    assert!(
        vllm.scratch(&format!("{hash}/locks/cabc.lock"), false)
            .is_some()
    );
    assert!(
        vllm.scratch(&format!("{hash}/xz/cxz.main.so"), false)
            .is_none()
    );
}
