//! Caches of PyTorch Inductor's C++ kernels (no GPU kernel) are judged by
//! the node's CPU as `gkm check` judges them: a node delivers one when the
//! vector ISA Inductor picks on its CPU is the one the cache was declared
//! built for, and reports it incompatible, naming both ISAs, elsewhere.
//! Real kube-apiserver, real registry, the real Inductor cache of
//! `fixtures/torch/inductor` (compiled by torch 2.11.0 on an AVX2 CPU).

use std::path::{Path, PathBuf};
use std::time::Duration;

use gkm_core::cache::Declared;
use gkm_k8s_api::crd::GKMCacheNode;
use gkm_oci::{BuildOptions, Compression, ImageRef, build};
use gkm_testenv::{Process, Registry};
use kube::api::Api;

mod support;

/// The namespace of the test's caches.
const NAMESPACE: &str = "cpu-isa";

use support::{Node, push, registry_options, until_some};

/// `fixtures/torch/inductor` of this repository.
fn inductor_fixture() -> PathBuf {
    gkm_testenv::repo_root().join("fixtures/torch/inductor")
}

/// Waits, while `agent` runs, until `node`'s report says `cache` (in
/// [`NAMESPACE`]) at `digest` is in `state`; returns the entry's message
/// and the CPU ISA the node reports.
async fn until_state(
    node: &Node,
    agent: &mut Process,
    cache: &str,
    digest: &str,
    state: &str,
) -> anyhow::Result<(String, Option<String>)> {
    let api: Api<GKMCacheNode> = Api::namespaced(node.client.clone(), NAMESPACE);
    let what = format!("{cache} {state} on {}", node.name);
    until_some(agent, &what, Duration::from_secs(60), || async {
        let Some(status) = api.get_opt(&node.name).await?.and_then(|r| r.status) else {
            return Ok(None);
        };
        let entry = status
            .caches
            .and_then(|c| c.get(cache).cloned())
            .and_then(|e| e.get(digest).cloned())
            .filter(|e| e.state.is_some_and(|s| format!("{s:?}") == state));
        Ok(entry.map(|e| (e.message.unwrap_or_default(), status.cpu_isa)))
    })
    .await
}

/// How many compiled C++ kernels (`.so` files) the store at `store` holds.
fn kernels_in(store: &Path) -> std::io::Result<usize> {
    if !store.exists() {
        return Ok(0);
    }
    Ok(gkm_testenv::tree_files(store)?
        .iter()
        .filter(|(path, _)| path.extension().is_some_and(|e| e == "so"))
        .count())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cpu_only_inductor_cache_is_extracted_on_a_node_whose_cpu_isa_fits_and_incompatible_elsewhere()
-> anyhow::Result<()> {
    let registry = Registry::shared()?;
    let fits = Node::new("cpu-isa-avx2").await?;
    let other = Node::new("cpu-isa-avx512").await?;
    // Nodes without GPUs, whose CPUs Inductor sees as AVX2 and AVX-512.
    std::fs::write(
        fits.dir.path().join("gpus.yaml"),
        "gpus: []\ncpuIsa: avx2\n",
    )?;
    std::fs::write(
        other.dir.path().join("gpus.yaml"),
        "gpus: []\ncpuIsa: avx512\n",
    )?;

    // What `gkm build --cpu-isa avx2 --torch-version 2.11.0` builds.
    let layout: ImageRef =
        format!("oci:{}:v1", fits.dir.path().join("layout").display()).parse()?;
    let options = BuildOptions {
        compression: Compression::None,
        declared: Declared {
            torch_version: Some("2.11.0".into()),
            cpu_isa: Some("avx2".into()),
            ..Default::default()
        },
        ..BuildOptions::default()
    };
    let digest = build(&inductor_fixture(), &layout, &options, &registry_options())
        .await?
        .digest
        .to_string();
    let remote = format!("{}/agent/inductor-cpu:v1", registry.addr());
    push(&layout, &remote).await?;

    fits.plane.ensure_namespace(NAMESPACE).await?;
    fits.cache(NAMESPACE, "inductor-avx2", &remote, &digest, true)
        .await?;
    other
        .cache(NAMESPACE, "inductor-avx512", &remote, &digest, true)
        .await?;
    let mut fits_agent = fits.agent(gkm_testenv::free_port()?, &[])?;
    let mut other_agent = other.agent(gkm_testenv::free_port()?, &[])?;

    let (_, isa) = until_state(
        &fits,
        &mut fits_agent,
        "inductor-avx2",
        &digest,
        "Extracted",
    )
    .await?;
    assert_eq!(isa.as_deref(), Some("avx2"));
    assert!(
        kernels_in(&fits.store())? > 0,
        "the C++ kernels are in the AVX2 node's store"
    );

    let (message, isa) = until_state(
        &other,
        &mut other_agent,
        "inductor-avx512",
        &digest,
        "Incompatible",
    )
    .await?;
    assert_eq!(isa.as_deref(), Some("avx512"));
    assert!(
        message.contains("avx2") && message.contains("avx512"),
        "the reason names both ISAs: {message}"
    );
    assert_eq!(
        kernels_in(&other.store())?,
        0,
        "nothing pulled on the AVX-512 node"
    );
    Ok(())
}
