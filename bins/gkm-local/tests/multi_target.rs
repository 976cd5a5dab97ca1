//! One cache for a mixed GPU fleet: one multi-target tag (real Triton
//! caches for sm75, sm80, sm90 and gfx942 in one OCI index, signed once)
//! applied as one GKMCache on a cluster of a real sm75 node (kubelet,
//! containerd, runc) and simulated sm80, sm90 and gfx942 nodes. Each node
//! holds exactly the variant of its GPUs, a pod on the real node reads the
//! sm75 variant, the node reports say which variant each node holds, and
//! moving one variant in the index refills only the nodes of its target.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gkm_k8s_api::crd::{CacheState, CacheStatus, GKMCache, GKMCacheNode};
use gkm_local::{SimulatedNode, Stack, cosign, repo_root};
use gkm_oci::{BuildOptions, Digest, RegistryOptions, Store};
use gkm_testenv::{copy_tree, pod_log, wait_for_pod};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);
const NS: &str = "team-a";
const CACHE: &str = "fleet";
const REAL: &str = "real-sm75";

/// The nodes, their GPUs, and the fixture their variant is built from.
const FLEET: [(&str, &str, &str); 4] = [
    (REAL, "T4", "cuda-75-32"),
    ("kwok-sm80", "A100", "cuda-80-32"),
    ("kwok-sm90", "H100", "cuda-90-32"),
    ("kwok-gfx942", "MI300X", "hip-gfx942-64"),
];

fn triton(target: &str) -> PathBuf {
    repo_root().join("fixtures/triton").join(target)
}

/// Hash directories of a Triton cache.
fn kernel_dirs(cache: &Path) -> anyhow::Result<Vec<String>> {
    let mut dirs: Vec<String> = std::fs::read_dir(cache)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<anyhow::Result<_>>()?;
    dirs.sort();
    Ok(dirs)
}

/// Builds the caches `dirs` into one multi-target image at
/// `gkm/fleet:v1`, signs the index with `key`; returns the reference, the
/// index digest and the variant digests, in order.
async fn push_fleet(
    stack: &Stack,
    dirs: &[PathBuf],
    key: &cosign::CosignKey,
) -> anyhow::Result<(String, String, Vec<String>)> {
    let repository = format!("{}/gkm/fleet", stack.registry.addr());
    let image = format!("{repository}:v1");
    let options = RegistryOptions {
        insecure: true,
        ..RegistryOptions::default()
    };
    let multi = gkm_oci::build::build_multi(
        dirs,
        &image.parse()?,
        &BuildOptions::default(),
        &options,
        None,
    )
    .await?;
    cosign::sign(key, &format!("{repository}@{}", multi.digest()))?;
    let variants = multi
        .variants
        .iter()
        .map(|v| v.digest.to_string())
        .collect();
    Ok((image, multi.digest().to_string(), variants))
}

/// Per node, the variant its report says it holds for `index`, once Extracted
/// or Running there.
async fn held_variants(
    client: &kube::Client,
    index: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut held = BTreeMap::new();
    for report in Api::<GKMCacheNode>::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await?
    {
        let node = report.metadata.name.clone().unwrap_or_default();
        let entry = report
            .status
            .and_then(|s| s.caches)
            .and_then(|c| c.get(CACHE).and_then(|d| d.get(index)).cloned());
        if let Some(entry) = entry
            && matches!(
                entry.state,
                Some(CacheState::Extracted | CacheState::Running)
            )
            && let Some(variant) = entry.variant
        {
            held.insert(node, variant);
        }
    }
    Ok(held)
}

/// The digests a node's store holds.
fn stored(stack: &Stack, node: &str) -> anyhow::Result<Vec<String>> {
    let store = Store::open(stack.store_dir(node))?;
    Ok(store.list()?.iter().map(Digest::to_string).collect())
}

/// How many extractions the agent of `node` logged.
fn extractions(stack: &Stack, node: &str) -> usize {
    stack
        .log_tail("agent", Some(node), 100_000)
        .lines()
        .filter(|l| l.contains("extracted") && l.contains("elapsed"))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_tag_for_a_mixed_fleet_each_node_holds_its_variant() -> anyhow::Result<()> {
    let tmp = gkm_testenv::temp_dir()?;
    let simulated = FLEET[1..]
        .iter()
        .map(|(node, gpu, _)| SimulatedNode::new(node, &format!("gpus:\n- profile: {gpu}\n")))
        .collect();
    let mut stack = Stack::start(tmp.path(), simulated).await?;
    stack
        .add_real_node(SimulatedNode::new(REAL, "gpus:\n- profile: T4\n"))
        .await?;
    let client = stack.plane.client().await?;
    stack.plane.ensure_namespace(NS).await?;
    let key = cosign::generate_key_pair(&tmp.path().join("keys"))?;
    let dirs: Vec<PathBuf> = FLEET.iter().map(|(_, _, dir)| triton(dir)).collect();
    let (image, index, variants) = push_fleet(&stack, &dirs, &key).await?;
    stack.start_gkm()?;

    let cache = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": CACHE, "namespace": NS},
        "spec": {"image": image,
                 "signature": {"signers": [{"key": {"publicKey": key.public_pem}}]}},
    });
    Api::<GKMCache>::namespaced(client.clone(), NS)
        .patch(
            CACHE,
            &PatchParams::apply("multi-target").force(),
            &Patch::Apply(&cache),
        )
        .await?;

    // Each node holds exactly the variant of its GPUs.
    let expected: BTreeMap<String, String> = FLEET
        .iter()
        .zip(&variants)
        .map(|((node, _, _), variant)| (node.to_string(), variant.clone()))
        .collect();
    stack
        .eventually("every node holding its variant", TIMEOUT, || async {
            let held = held_variants(&client, &index).await?;
            Ok((held == expected).then_some(()))
        })
        .await?;
    for (node, variant) in &expected {
        assert_eq!(
            &stored(&stack, node)?,
            std::slice::from_ref(variant),
            "{node}"
        );
        assert_eq!(extractions(&stack, node), 1, "{node}");
    }

    // A pod on the real node reads the sm75 variant.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod = gkm_local::cache_pod(
        NS,
        "reader",
        REAL,
        "/cache",
        json!({"csi.gkm.io/GKMCache": CACHE}),
        "ls -1 \"$TRITON_CACHE_DIR\"; echo LISTED; exec sleep 100000",
    )?;
    pods.create(&PostParams::default(), &pod).await?;
    wait_for_pod(&pods, "reader", TIMEOUT, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
    .await?;
    let log = stack
        .eventually("the reader's listing", TIMEOUT, || async {
            let log = pod_log(&pods, "reader", "triton").await?;
            Ok(log.contains("LISTED").then_some(log))
        })
        .await?;
    let listed: Vec<String> = log
        .lines()
        .filter(|l| *l != "LISTED")
        .map(String::from)
        .collect();
    assert_eq!(listed, kernel_dirs(&triton("cuda-75-32"))?, "{log}");

    // The counts: four nodes hold the image, one of them with a pod, and
    // one node holds each variant.
    let status = stack
        .eventually("the cache's counts", TIMEOUT, || async {
            let cache = Api::<GKMCache>::namespaced(client.clone(), NS)
                .get(CACHE)
                .await?;
            let status = cache.status.unwrap_or_default();
            let counts = status.counts;
            Ok((counts.node_in_use_cnt == 1 && counts.node_not_in_use_cnt == 3).then_some(status))
        })
        .await?;
    assert_eq!(
        (status.counts.node_cnt, status.counts.pod_running_cnt),
        (4, 1)
    );
    assert_eq!(held_per_variant(&status), per_variant(&variants));

    // Move the sm90 variant: the same tag, a new sm90 cache (one kernel
    // fewer), the other variants as they were; signed again.
    let moved_sm90 = tmp.path().join("cuda-90-32-moved");
    copy_tree(&triton("cuda-90-32"), &moved_sm90)?;
    let dropped = kernel_dirs(&moved_sm90)?.remove(0);
    std::fs::remove_dir_all(moved_sm90.join(dropped))?;
    let mut moved_dirs = dirs.clone();
    moved_dirs[2] = moved_sm90;
    let (_, moved_index, moved_variants) = push_fleet(&stack, &moved_dirs, &key).await?;
    assert_ne!(moved_index, index);
    assert_eq!(
        (&moved_variants[..2], &moved_variants[3]),
        (&variants[..2], &variants[3])
    );
    assert_ne!(moved_variants[2], variants[2]);
    let expected: BTreeMap<String, String> = FLEET
        .iter()
        .zip(&moved_variants)
        .map(|((node, _, _), variant)| (node.to_string(), variant.clone()))
        .collect();
    stack
        .eventually("every node on the moved index", TIMEOUT, || async {
            let held = held_variants(&client, &moved_index).await?;
            Ok((held == expected).then_some(()))
        })
        .await?;
    // Only the sm90 node pulled and extracted again; the old sm90 variant
    // goes once nothing uses it.
    for (node, _, _) in FLEET {
        let wanted = if node == "kwok-sm90" { 2 } else { 1 };
        assert_eq!(extractions(&stack, node), wanted, "{node}");
    }
    stack
        .eventually(
            "the sm90 node holding only the moved variant",
            TIMEOUT,
            || async {
                Ok((stored(&stack, "kwok-sm90")? == [moved_variants[2].clone()]).then_some(()))
            },
        )
        .await?;
    for (node, variant) in expected.iter().filter(|(n, _)| *n != "kwok-sm90") {
        assert_eq!(
            &stored(&stack, node)?,
            std::slice::from_ref(variant),
            "{node}"
        );
    }
    // The reader's variant did not move: it is not outdated; each node
    // holds one variant of the moved index.
    let status = stack
        .eventually("the counts of the moved index", TIMEOUT, || async {
            let status = Api::<GKMCache>::namespaced(client.clone(), NS)
                .get(CACHE)
                .await?
                .status
                .unwrap_or_default();
            Ok((held_per_variant(&status) == per_variant(&moved_variants)).then_some(status))
        })
        .await?;
    assert_eq!(status.counts.pod_outdated_cnt, 0, "{:?}", status.counts);
    assert_eq!(
        status.resolved_digest.as_deref(),
        Some(moved_index.as_str())
    );
    Ok(())
}

/// The status's variants: digest, targets and nodes holding it.
fn held_per_variant(status: &CacheStatus) -> Vec<(String, String, i32)> {
    status
        .variants
        .iter()
        .flatten()
        .map(|v| (v.digest.clone(), v.targets.join(","), v.nodes))
        .collect()
}

/// `variants` (in [`FLEET`]'s order), each held by one node.
fn per_variant(variants: &[String]) -> Vec<(String, String, i32)> {
    let targets = ["cuda/75/32", "cuda/80/32", "cuda/90/32", "hip/gfx942/64"];
    variants
        .iter()
        .zip(targets)
        .map(|(digest, target)| (digest.clone(), target.to_string(), 1))
        .collect()
}
