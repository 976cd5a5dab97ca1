//! Checking the real fixture caches against GPUs as discovery reports them.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gkm_core::cache;
use gkm_core::compat::{CheckOptions, CudaArchRule, Reason, check_manifest, check_summary};
use gkm_core::{Backend, Gpu, Vendor};
use gkm_testenv::fixture_cache;

fn nvidia(index: u32, product: &str, arch: &str, cuda: &str) -> Gpu {
    Gpu {
        index,
        vendor: Vendor::Nvidia,
        product: product.into(),
        backend: Some(Backend::Cuda),
        arch: Some(arch.parse().unwrap()),
        warp_size: Some(32),
        toolkit_version: Some(cuda.into()),
        uuid: Some(format!("GPU-{index:08}")),
        ..Default::default()
    }
}

fn amd(index: u32, product: &str, arch: &str) -> Gpu {
    Gpu {
        index,
        vendor: Vendor::Amd,
        product: product.into(),
        backend: Some(Backend::Hip),
        arch: Some(arch.parse().unwrap()),
        warp_size: Some(64),
        ..Default::default()
    }
}

fn node() -> Vec<Gpu> {
    vec![
        nvidia(0, "Tesla T4", "7.5", "12.4"),
        nvidia(1, "NVIDIA A100-SXM4-80GB", "8.0", "12.4"),
        nvidia(2, "Tesla T4", "7.5", "12.2"),
        amd(3, "AMD Instinct MI210", "gfx90a"),
        Gpu {
            index: 4,
            vendor: Vendor::Nvidia,
            product: "Tesla T4".into(),
            kernel_driver: Some("vfio-pci".into()),
            ..Default::default()
        },
        nvidia(5, "Tesla T4", "7.5", "11.8"),
    ]
}

#[test]
fn cuda_cache_on_a_mixed_node() {
    let manifest = cache::scan(&fixture_cache("triton-vector-add-cuda-sm75")).unwrap();
    let report = check_manifest(&manifest, &node(), &CheckOptions::default());
    assert!(report.compatible);
    let compatible: Vec<u32> = report.compatible_gpus().map(|g| g.index).collect();
    assert_eq!(
        compatible,
        [0, 2],
        "the T4s whose driver is CUDA 12 (PTX ISA 8.4 is CUDA 12.4's), not the 11.8 one"
    );
    insta::assert_snapshot!(report.to_string());
    insta::assert_json_snapshot!(report);
}

#[test]
fn binary_compatibility_lets_sm75_kernels_run_on_sm75_only() {
    let manifest = cache::scan(&fixture_cache("triton-vector-add-cuda-sm75")).unwrap();
    let options = CheckOptions {
        cuda_arch_rule: CudaArchRule::BinaryCompatible,
        ..Default::default()
    };
    let gpus = [
        nvidia(0, "RTX 2080", "7.5", "12.4"),
        nvidia(1, "RTX 3090", "8.6", "12.4"),
    ];
    let report = check_manifest(&manifest, &gpus, &options);
    assert!(report.gpus[0].compatible);
    // 7.5 → 8.6 crosses a major version: no binary compatibility.
    assert!(matches!(
        report.gpus[1].mismatches[0].reasons[..],
        [Reason::ArchMismatch { .. }]
    ));
}

#[test]
fn rocm_cache_checks_the_triton_version_it_records() {
    let manifest = cache::scan(&fixture_cache("triton-vector-add-rocm-gfx90a")).unwrap();
    let gpus = [
        amd(0, "AMD Instinct MI210", "gfx90a"),
        amd(1, "AMD Instinct MI300X", "gfx942"),
    ];
    let same = CheckOptions {
        triton_version: Some("3.2.0".into()),
        ..Default::default()
    };
    let report = check_manifest(&manifest, &gpus, &same);
    assert_eq!(
        report
            .compatible_gpus()
            .map(|g| g.index)
            .collect::<Vec<_>>(),
        [0]
    );

    let other = CheckOptions {
        triton_version: Some("3.3.1".into()),
        ..Default::default()
    };
    let report = check_manifest(&manifest, &gpus, &other);
    assert!(!report.compatible);
    insta::assert_snapshot!(report.to_string());
}

#[test]
fn vllm_cache_and_empty_inputs() {
    let manifest = cache::scan(&fixture_cache("vllm-torch-compile-inductor")).unwrap();
    let report = check_manifest(
        &manifest,
        &[amd(0, "AMD Instinct MI250X", "gfx90a")],
        &CheckOptions::default(),
    );
    assert!(report.compatible);

    let report = check_manifest(&manifest, &[], &CheckOptions::default());
    assert!(!report.compatible);
    assert_eq!(report.reasons, [Reason::NoGpus]);

    let report = check_summary(
        &cache::Summary::default(),
        &node(),
        &CheckOptions::default(),
    );
    assert!(!report.compatible);
    assert_eq!(report.reasons, [Reason::NoTargets]);
    assert_eq!(
        report.to_string().lines().next(),
        Some("incompatible: the cache holds no compiled kernel")
    );
}

#[test]
fn mcv_labels_with_a_toolkit_version() {
    // MCV's vLLM binary summaries write `sm_` architectures and the CUDA
    // toolkit the cache was built with.
    let label =
        r#"{"targets":[{"backend":"cuda","arch":"sm_90","warp_size":32,"cuda_version":"13.0"}]}"#;
    let summary = cache::Summary::from_label(label).unwrap();
    let gpus = [
        nvidia(0, "NVIDIA H100", "9.0", "12.8"),
        nvidia(1, "NVIDIA H100", "9.0", "13.0"),
    ];
    let report = check_summary(&summary, &gpus, &CheckOptions::default());
    assert_eq!(
        report
            .compatible_gpus()
            .map(|g| g.index)
            .collect::<Vec<_>>(),
        [1]
    );
    assert_eq!(
        report.gpus[0]
            .all_reasons()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["the kernels were built with CUDA 13.0, newer than the driver's CUDA 12.8"]
    );
}

/// The repository's own fixtures (`fixtures/` at the workspace root).
fn repo_fixture(path: &str) -> std::path::PathBuf {
    gkm_testenv::repo_root().join("fixtures").join(path)
}

#[test]
fn triton_36_cubins_load_on_an_older_minor_driver_of_the_same_major() {
    // Recorded on an H100 by Triton 3.6.0: PTX ISA 8.7, assembled by the
    // ptxas of CUDA 12.8 that Triton bundles. Triton loads the cubin, which
    // CUDA's minor version compatibility lets any 12.x driver run.
    let manifest = cache::scan(&repo_fixture("caches/triton-vector-add-cuda-sm90")).unwrap();
    assert_eq!(manifest.summary().targets[0].ptx_version, Some(87));
    let gpus = [
        nvidia(0, "NVIDIA H100 80GB HBM3", "9.0", "12.4"),
        nvidia(1, "NVIDIA H100 80GB HBM3", "9.0", "12.0"),
        nvidia(2, "NVIDIA H100 80GB HBM3", "9.0", "13.0"),
        nvidia(3, "NVIDIA H100 80GB HBM3", "9.0", "11.8"),
    ];
    let report = check_manifest(&manifest, &gpus, &CheckOptions::default());
    assert_eq!(
        report
            .compatible_gpus()
            .map(|g| g.index)
            .collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert_eq!(
        report.gpus[3]
            .all_reasons()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [
            "PTX ISA 8.7 comes from a newer CUDA major version than the driver's \
             (CUDA 11.8: up to PTX ISA 7.8); minor version compatibility stops at the major version"
        ]
    );
}

#[test]
fn a_ptx_of_a_newer_major_or_kernels_that_need_ptx_jit_do_not_load() {
    // PTX ISA 9.0 is CUDA 13's: a 12.9 driver, the newest of 12, cannot load
    // its cubins; a 13.0 driver can.
    let cuda13 = cache::Summary::from_label(
        r#"{"targets":[{"backend":"cuda","arch":"90","warp_size":32,"ptx_version":90}]}"#,
    )
    .unwrap();
    let gpus = [
        nvidia(0, "NVIDIA H200", "9.0", "12.9"),
        nvidia(1, "NVIDIA H200", "9.0", "13.0"),
    ];
    let report = check_summary(&cuda13, &gpus, &CheckOptions::default());
    assert_eq!(
        report
            .compatible_gpus()
            .map(|g| g.index)
            .collect::<Vec<_>>(),
        [1]
    );
    assert!(matches!(
        report.gpus[0].mismatches[0].reasons[..],
        [Reason::PtxNewerThanDriver {
            ptx_version: 90,
            max_ptx_version: 88,
            ..
        }]
    ));

    // An sm_80 cubin does not run on sm_90: only a JIT of its PTX would, and
    // Triton compiles the kernel again instead. Refused under either
    // architecture rule, even by a driver that knows the PTX ISA. On sm_86
    // the sm_80 cubin runs as it is (binary compatibility, no JIT).
    let sm80 = cache::Summary::from_label(
        r#"{"targets":[{"backend":"cuda","arch":"80","warp_size":32,"ptx_version":87}]}"#,
    )
    .unwrap();
    let gpus = [
        nvidia(0, "NVIDIA H100 80GB HBM3", "9.0", "12.8"),
        nvidia(1, "NVIDIA A10", "8.6", "12.4"),
    ];
    for rule in [CudaArchRule::Exact, CudaArchRule::BinaryCompatible] {
        let options = CheckOptions {
            cuda_arch_rule: rule,
            ..Default::default()
        };
        let report = check_summary(&sm80, &gpus, &options);
        assert!(
            matches!(
                report.gpus[0].mismatches[0].reasons[..],
                [Reason::ArchMismatch { .. }]
            ),
            "{rule:?}: {report}"
        );
        assert_eq!(
            report.gpus[1].compatible,
            rule == CudaArchRule::BinaryCompatible,
            "{rule:?}: {report}"
        );
    }
}
