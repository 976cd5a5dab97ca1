//! Real `torch.compile` reuses the PyTorch caches gkm delivers, on the CPU:
//! the fixture's Inductor cache (`fixtures/torch/inductor`, a small model
//! compiled cold by PyTorch 2.11, `hack/fixtures/torch.sh`) and its
//! Mega-Cache blob (`fixtures/torch/mega-cache.bin`) are each built into an
//! image with `gkm build` (which reads them as an Inductor cache and a
//! Mega-Cache), pushed to a real registry, extracted with `gkm
//! extract` at a path other than the one they were compiled at, and real
//! PyTorch (`hack/ci/components.sh torch`) compiles the same model against
//! them in a fresh process (`hack/fixtures/torch_model.py check`): by
//! Inductor's own counters every FX graph is a cache hit and none a miss,
//! and the outputs equal the cold run's bit for bit. One input shape the
//! cache never saw is exactly one miss among the hits.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use gkm_testenv::torch::{
    Check, CompileReport, FIXTURE_COMPILE_PATH, FIXTURE_GRAPHS, fixture, torch_check,
};
use gkm_testenv::{Registry, tree_files};
use serde_json::{Value, json};

mod support;

/// Runs `gkm` in `dir`, failing the test with its output unless it succeeds;
/// its standard output.
fn gkm(args: &[&str], dir: &Path) -> String {
    let out = support::gkm_in(args, dir);
    assert_eq!(
        out.status.code(),
        Some(0),
        "gkm {args:?}:\n{}",
        support::text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds `source` into `image`, pushes it, and extracts it at `dest`;
/// what `gkm inspect --json` says of the image.
fn deliver(source: &Path, image: &str, dest: &Path, dir: &Path) -> Value {
    let source = source.display().to_string();
    let built = gkm(&["build", &source, "-t", image, "--insecure"], dir);
    let inspect: Value =
        serde_json::from_str(&gkm(&["inspect", image, "--insecure", "--json"], dir))
            .expect("inspect JSON");
    let dest = dest.display().to_string();
    let extracted = gkm(&["extract", image, "-o", &dest, "--insecure"], dir);
    let digest = |out: &str| out.lines().last().unwrap_or_default().trim().to_string();
    assert_eq!(
        digest(&extracted),
        digest(&built),
        "extracted another image"
    );
    inspect
}

fn check(cache: &Path, mega_cache: Option<&Path>, new_shape: bool) -> CompileReport {
    let report = torch_check(Check {
        cache,
        mega_cache,
        new_shape,
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    println!(
        "torch.compile against {}{}: {}",
        cache.display(),
        if new_shape { " with a new shape" } else { "" },
        report.summary()
    );
    report
}

#[test]
fn torch_compile_hits_every_fx_graph_of_an_inductor_cache_gkm_delivered_at_another_path() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let fixture = fixture().unwrap_or_else(|e| panic!("{e:#}"));
    let image = format!("{}/torch/inductor:v1", registry.addr());
    let delivered = w.join("delivered/inductor");
    assert_ne!(delivered, Path::new(FIXTURE_COMPILE_PATH));
    let inspect = deliver(&fixture.inductor, &image, &delivered, w);
    // gkm read it as what it is: an Inductor cache of two FX graphs.
    assert_eq!(inspect["kind"], "inductor", "{inspect:#}");
    assert_eq!(
        inspect["entryCounts"]["fxgraph"],
        json!(FIXTURE_GRAPHS),
        "{inspect:#}"
    );
    assert_eq!(
        inspect["entryCounts"]["aotautograd"],
        json!(FIXTURE_GRAPHS),
        "{inspect:#}"
    );
    assert_eq!(
        tree_files(&delivered).expect("read the delivered tree"),
        tree_files(&fixture.inductor).expect("read the fixture"),
        "the delivered tree is not the fixture's"
    );

    let reused = check(&delivered, None, false);
    assert!(reused.all_hits(), "a graph was compiled: {reused:#?}");
    assert_eq!(reused.fxgraph_cache_hit, FIXTURE_GRAPHS, "{reused:#?}");
    assert_eq!(reused.autograd_cache_hit, FIXTURE_GRAPHS, "{reused:#?}");
    assert_eq!(reused.autograd_cache_miss, 0, "{reused:#?}");
    // Not one C++ kernel built: the delivered ones were loaded.
    assert_eq!(reused.cpp_kernels_compiled, 0, "{reused:#?}");
    assert!(reused.outputs_as_cold_run(), "{reused:#?}");

    // A shape the cache never saw: one miss, the rest still hits.
    let grown = check(&delivered, None, true);
    assert_eq!(grown.graphs, FIXTURE_GRAPHS + 1, "{grown:#?}");
    assert_eq!(grown.fxgraph_cache_hit, FIXTURE_GRAPHS, "{grown:#?}");
    assert_eq!(grown.fxgraph_cache_miss, 1, "{grown:#?}");
    assert!(grown.cpp_kernels_compiled > 0, "{grown:#?}");
    assert!(grown.outputs_as_cold_run(), "{grown:#?}");
}

#[test]
fn torch_compile_hits_every_fx_graph_of_a_mega_cache_blob_gkm_delivered() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let fixture = fixture().unwrap_or_else(|e| panic!("{e:#}"));
    // The blob as a workload saves it, alone in its directory.
    let saved = w.join("saved");
    std::fs::create_dir(&saved).expect("mkdir");
    std::fs::copy(&fixture.mega_cache, saved.join("mega-cache.bin")).expect("copy the blob");
    let image = format!("{}/torch/mega-cache:v1", registry.addr());
    let delivered = w.join("delivered");
    let inspect = deliver(&saved, &image, &delivered, w);
    assert_eq!(inspect["kind"], "megacache", "{inspect:#}");
    assert_eq!(
        inspect["entryCounts"]["inductor"],
        json!(FIXTURE_GRAPHS),
        "{inspect:#}"
    );
    let blob = delivered.join("mega-cache.bin");
    assert_eq!(
        std::fs::read(&blob).expect("read the delivered blob"),
        std::fs::read(&fixture.mega_cache).expect("read the fixture's blob"),
    );

    // Loaded into an empty Inductor cache, as a workload hot-loads it.
    let cache = w.join("inductor");
    std::fs::create_dir(&cache).expect("mkdir");
    let reused = check(&cache, Some(&blob), false);
    let loaded = reused.mega_cache_loaded.clone().unwrap_or_default();
    assert_eq!(loaded.get("inductor"), Some(&FIXTURE_GRAPHS), "{reused:#?}");
    assert!(reused.all_hits(), "a graph was compiled: {reused:#?}");
    assert_eq!(reused.autograd_cache_hit, FIXTURE_GRAPHS, "{reused:#?}");
    assert!(reused.outputs_as_cold_run(), "{reused:#?}");

    // The hits come from the blob: the cache directory was empty, and the
    // counters do count misses (the new shape of the Inductor test above
    // misses once; the cold run, 2 misses, is in fixtures/torch/PROVENANCE).
    // No cold compile here: it would double this test's time for nothing
    // the assertions above do not already show.
}
