//! Property tests: the parsers never panic on any input, what gkm writes it
//! reads back, and the compatibility rules hold for any target and GPU.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gkm_core::cache::{
    CacheKind, CacheManifest, Facts, Summary, Target, TritonKernel, VllmFacts, VllmFormat,
    VllmKernel, ptx_isa_version,
};
use gkm_core::compat::{self, CheckOptions, CudaArchRule, Reason};
use gkm_core::{Arch, Backend, Gpu};
use proptest::prelude::*;

fn backend() -> impl Strategy<Value = Backend> {
    prop_oneof![
        Just(Backend::Cuda),
        Just(Backend::Hip),
        Just(Backend::Xpu),
        Just(Backend::Hpu)
    ]
}

fn arch() -> impl Strategy<Value = Arch> {
    let cuda = (
        1u32..=12,
        0u32..=9,
        prop_oneof![Just(""), Just("a"), Just("f")],
    )
        .prop_map(|(major, minor, suffix)| format!("{major}{minor}{suffix}"));
    let gfx = prop_oneof![
        Just("900".to_string()),
        Just("90a".to_string()),
        Just("942".to_string()),
        Just("1100".to_string()),
        "[0-9a-z]{1,6}"
    ]
    .prop_map(|s| format!("gfx{s}"));
    prop_oneof![cuda, gfx].prop_map(|s| s.parse::<Arch>().expect("generated architectures parse"))
}

fn version() -> impl Strategy<Value = String> {
    (0u32..20, 0u32..20, 0u32..20).prop_map(|(a, b, c)| format!("{a}.{b}.{c}"))
}

fn target() -> impl Strategy<Value = Target> {
    (
        backend(),
        arch(),
        prop_oneof![Just(32u32), Just(64u32), 1u32..=1024],
        proptest::option::of(60u32..=99),
        proptest::option::of(version()),
        proptest::option::of(version()),
    )
        .prop_map(
            |(backend, arch, warp_size, ptx_version, cuda_version, triton_version)| Target {
                backend,
                arch,
                warp_size,
                ptx_version,
                cuda_version,
                triton_version,
            },
        )
}

fn entry() -> impl Strategy<Value = VllmKernel> {
    (
        target(),
        "[0-9a-f]{1,64}",
        "[A-Z2-7]{0,52}",
        (any::<u32>(), any::<u32>(), any::<bool>()),
        proptest::option::of("[a-z_0-9]{1,30}"),
        proptest::option::of("[0-9a-f]{10}"),
        proptest::option::of(prop_oneof![
            Just(VllmFormat::Triton),
            Just(VllmFormat::Binary),
            Just(VllmFormat::AotCompile)
        ]),
    )
        .prop_map(
            |(
                t,
                hash,
                dummy_key,
                (num_stages, num_warps, debug),
                name,
                vllm_hash,
                cache_format,
            )| {
                VllmKernel {
                    kernel: TritonKernel {
                        hash,
                        dummy_key,
                        ptx_version: t.ptx_version,
                        num_stages,
                        num_warps,
                        debug,
                        backend: t.backend,
                        arch: t.arch,
                        warp_size: t.warp_size,
                        triton_version: t.triton_version,
                        name,
                    },
                    vllm_hash,
                    cache_format,
                }
            },
        )
}

fn manifest() -> impl Strategy<Value = CacheManifest> {
    let triton = proptest::collection::vec(entry(), 0..8).prop_map(|entries| {
        let kernels = entries.into_iter().map(|e| e.kernel);
        CacheManifest::of_kind(CacheKind::Triton, kernels, Facts::none())
    });
    let vllm = (
        proptest::collection::vec(entry(), 0..8),
        proptest::option::of(Just(VllmFormat::Binary)),
    )
        .prop_map(|(entries, format)| {
            let facts = VllmFacts {
                format,
                artefacts: Vec::new(),
            };
            CacheManifest::of_kind(CacheKind::Vllm, entries, Facts::of(facts))
        });
    prop_oneof![triton, vllm]
}

/// A GPU that is exactly what a target was compiled for.
fn gpu_for(target: &Target) -> Gpu {
    Gpu {
        product: "generated".into(),
        backend: Some(target.backend),
        arch: Some(target.arch.clone()),
        warp_size: Some(target.warp_size),
        ..Default::default()
    }
}

fn gpu() -> impl Strategy<Value = Gpu> {
    (
        0u32..16,
        proptest::option::of(backend()),
        proptest::option::of(arch()),
        proptest::option::of(prop_oneof![Just(32u32), Just(64u32), 0u32..=2048]),
        proptest::option::of(prop_oneof![version(), ".*"]),
    )
        .prop_map(|(index, backend, arch, warp_size, toolkit_version)| Gpu {
            index,
            product: "generated".into(),
            backend,
            arch,
            warp_size,
            toolkit_version,
            ..Default::default()
        })
}

/// JSON shaped like the documents gkm reads, with fields of any type.
fn json_like() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|n| format!("{n:?}")),
        ".{0,12}".prop_map(|s| serde_json::Value::String(s).to_string()),
        prop_oneof![
            Just("cuda"),
            Just("hip"),
            Just("rocm"),
            Just("75"),
            Just("sm_90a"),
            Just("gfx90a")
        ]
        .prop_map(|s| format!("\"{s}\"")),
    ];
    let keys = prop_oneof![
        Just("hash"),
        Just("target"),
        Just("backend"),
        Just("arch"),
        Just("warp_size"),
        Just("ptx_version"),
        Just("num_warps"),
        Just("num_stages"),
        Just("debug"),
        Just("name"),
        Just("triton_version"),
        Just("backend_name"),
        Just("triton"),
        Just("vllm"),
        Just("format"),
        Just("vllmHash"),
        Just("cacheFormat"),
        Just("targets"),
        Just("dummy_key"),
    ];
    leaf.prop_recursive(4, 48, 8, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6)
                .prop_map(|v| format!("[{}]", v.join(","))),
            proptest::collection::vec((keys.clone(), inner), 0..8).prop_map(|kv| {
                let fields: Vec<String> = kv
                    .into_iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect();
                format!("{{{}}}", fields.join(","))
            }),
        ]
    })
}

proptest! {
    #[test]
    fn parsers_never_panic_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = CacheManifest::from_json(&bytes);
        let _ = TritonKernel::from_kernel_json(&bytes);
        let _ = Summary::from_label(&String::from_utf8_lossy(&bytes));
        let _ = ptx_isa_version(&bytes);
    }

    #[test]
    fn what_parses_reads_back_the_same(json in json_like()) {
        if let Ok(manifest) = CacheManifest::from_json(json.as_bytes()) {
            prop_assert_eq!(CacheManifest::from_json(&manifest.to_json()).unwrap(), manifest);
        }
        if let Ok(summary) = Summary::from_label(&json) {
            prop_assert_eq!(Summary::from_label(&summary.to_label()).unwrap(), summary);
        }
        let _ = TritonKernel::from_kernel_json(json.as_bytes());
    }

    #[test]
    fn summary_labels_read_back(targets in proptest::collection::vec(target(), 0..8)) {
        let summary = Summary::new(targets);
        prop_assert_eq!(Summary::from_label(&summary.to_label()).unwrap(), summary);
    }

    #[test]
    fn manifests_read_back(manifest in manifest()) {
        let read = CacheManifest::from_json(&manifest.to_json()).unwrap();
        prop_assert_eq!(read.kind(), manifest.kind());
        prop_assert_eq!(read.summary(), manifest.summary());
        prop_assert_eq!(read.entries().len(), manifest.entries().len());
        prop_assert_eq!(read.to_json(), manifest.to_json());
    }

    #[test]
    fn kernel_metadata_reads_what_triton_writes(e in entry().prop_map(|e| e.kernel)) {
        let json = serde_json::json!({
            "hash": e.hash,
            "target": {"backend": e.backend.as_str(), "arch": e.arch.as_str(), "warp_size": e.warp_size},
            "num_warps": e.num_warps,
            "num_stages": e.num_stages,
            "debug": e.debug,
            "ptx_version": e.ptx_version,
            "triton_version": e.triton_version,
            "name": e.name,
        });
        let read = TritonKernel::from_kernel_json(json.to_string().as_bytes()).unwrap();
        prop_assert_eq!(read.target(), e.target());
        prop_assert_eq!((read.num_warps, read.num_stages, read.debug), (e.num_warps, e.num_stages, e.debug));
        prop_assert_eq!(read.name, e.name);
    }

    #[test]
    fn a_gpu_built_from_a_target_is_compatible_with_it(
        t in target(),
        rule in prop_oneof![Just(CudaArchRule::Exact), Just(CudaArchRule::BinaryCompatible)],
    ) {
        let options = CheckOptions { triton_version: t.triton_version.clone(), cuda_arch_rule: rule };
        prop_assert_eq!(compat::check_target(&t, &gpu_for(&t), &options), vec![]);
        let report = compat::check_summary(&Summary::new([t.clone()]), &[gpu_for(&t)], &options);
        prop_assert!(report.compatible);
        prop_assert_eq!(&report.gpus[0].matching_targets, &vec![t]);
    }

    #[test]
    fn the_driver_refuses_only_a_ptx_of_a_newer_cuda_major(
        t in target(),
        driver in prop_oneof![Just("11.8"), Just("12.1"), Just("12.4"), Just("12.6"), Just("13.0")],
        delta in -3i64..=3,
    ) {
        // CUDA's minor version compatibility: a driver loads the cubins of
        // any toolkit of its major version, whatever PTX ISA they came from.
        // Since CUDA 11 the PTX ISA major version is the CUDA major minus 4.
        let max = compat::max_ptx_version(driver).unwrap();
        let ptx = u32::try_from(i64::from(max) + delta).unwrap();
        let t = Target { backend: Backend::Cuda, ptx_version: Some(ptx), cuda_version: None, ..t };
        let gpu = Gpu { toolkit_version: Some(driver.to_string()), ..gpu_for(&t) };
        let options = CheckOptions { triton_version: t.triton_version.clone(), ..Default::default() };
        let reasons = compat::check_target(&t, &gpu, &options);
        let driver_major: u32 = driver.split('.').next().unwrap().parse().unwrap();
        let expected = if ptx / 10 + 4 > driver_major {
            vec![Reason::PtxNewerThanDriver {
                ptx_version: ptx,
                max_ptx_version: max,
                driver_cuda_version: driver.to_string(),
            }]
        } else {
            vec![]
        };
        prop_assert_eq!(reasons, expected);
    }

    #[test]
    fn the_driver_refuses_only_a_newer_cuda_major(
        t in target(),
        built in (11u32..=14, 0u32..=9),
        driver in (11u32..=14, 0u32..=9),
    ) {
        let t = Target { backend: Backend::Cuda, ptx_version: None, cuda_version: Some(format!("{}.{}", built.0, built.1)), ..t };
        let gpu = Gpu { toolkit_version: Some(format!("{}.{}", driver.0, driver.1)), ..gpu_for(&t) };
        let options = CheckOptions { triton_version: t.triton_version.clone(), ..Default::default() };
        let reasons = compat::check_target(&t, &gpu, &options);
        let refused = reasons.iter().any(|r| matches!(r, Reason::CudaNewerThanDriver { .. }));
        prop_assert_eq!(refused, built.0 > driver.0, "{:?}", reasons);
        prop_assert_eq!(reasons.len(), usize::from(refused));
    }

    #[test]
    fn another_backend_is_always_a_mismatch(t in target(), other in backend()) {
        prop_assume!(other != t.backend);
        let gpu = Gpu { backend: Some(other), ..gpu_for(&t) };
        let reasons = compat::check_target(&t, &gpu, &CheckOptions::default());
        let expected = Reason::BackendMismatch { cache: t.backend, gpu: other };
        prop_assert!(reasons.contains(&expected), "{:?}", reasons);
        let report = compat::check_summary(&Summary::new([t]), &[gpu], &CheckOptions::default());
        prop_assert!(!report.compatible);
    }

    #[test]
    fn another_warp_size_is_always_a_mismatch(t in target(), warp in 1u32..=2048) {
        prop_assume!(warp != t.warp_size);
        let gpu = Gpu { warp_size: Some(warp), ..gpu_for(&t) };
        let reasons = compat::check_target(&t, &gpu, &CheckOptions::default());
        let expected = Reason::WarpSizeMismatch { cache: t.warp_size, gpu: warp };
        prop_assert!(reasons.contains(&expected), "{:?}", reasons);
    }

    #[test]
    fn reports_are_consistent(
        targets in proptest::collection::vec(target(), 0..5),
        gpus in proptest::collection::vec(gpu(), 0..5),
        triton in proptest::option::of(version()),
    ) {
        let options = CheckOptions { triton_version: triton, ..Default::default() };
        let summary = Summary::new(targets);
        let report = compat::check_summary(&summary, &gpus, &options);
        prop_assert_eq!(report.gpus.len(), gpus.len());
        prop_assert_eq!(report.compatible, report.gpus.iter().any(|g| g.compatible));
        prop_assert_eq!(gpus.is_empty(), report.reasons.contains(&Reason::NoGpus));
        for (gpu, verdict) in gpus.iter().zip(&report.gpus) {
            prop_assert_eq!(verdict.index, gpu.index);
            prop_assert_eq!(verdict.compatible, !verdict.matching_targets.is_empty());
            if verdict.compatible {
                prop_assert!(verdict.reasons.is_empty() && verdict.mismatches.is_empty());
            } else if !summary.targets.is_empty() {
                prop_assert!(verdict.all_reasons().next().is_some(), "{:?}", verdict);
            }
            for t in &verdict.matching_targets {
                prop_assert!(compat::check_target(t, gpu, &options).is_empty());
            }
            for m in &verdict.mismatches {
                prop_assert!(!m.reasons.is_empty());
                for r in &m.reasons {
                    prop_assert!(!r.to_string().is_empty());
                }
            }
        }
        let json = serde_json::to_string(&report).unwrap();
        prop_assert_eq!(serde_json::from_str::<compat::Report>(&json).unwrap(), report);
    }
}
