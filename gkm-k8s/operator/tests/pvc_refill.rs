//! Refilling a PVC under running readers, and who the fill runs as.
//!
//! - A refill (a moved tag) switches the claim from one digest's tree to
//!   the other's in one step: a reader reading a kernel in a tight loop
//!   while the claim is refilled, again and again, from a real registry,
//!   never finds it missing or different, and after each refill the claim
//!   lists exactly the new tree.
//! - The fill Job's pod is admitted in a namespace enforcing Pod Security
//!   `restricted`, by a real apiserver.

mod operator_support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use gkm_k8s_api::cache_object::CacheKey;
use gkm_k8s_api::crd::CacheSpec;
use gkm_k8s_operator::cache::pvc::objects::{self, PvcOptions};
use gkm_k8s_operator::cache::pvc::plan::ClaimPlan;
use gkm_oci::{BuildOptions, ImageRef, build};
use gkm_testenv::{ControlPlane, Registry};
use gkm_testenv::{copy_tree, fixture_cache};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use operator_support::registry_options;
use serde_json::json;

const KERNEL: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.cubin";
/// A directory of the fixture the second image leaves out.
const UTILS_DIR: &str = "NNIRBEH2OVXHBOQBWMZABZQUTHRBNTKPWP7Q45RX7SE5JGCMEUPA";

/// Builds `tree` into the registry as `repo:tag`; the reference pinned to
/// its digest.
async fn push(registry: &Registry, tree: &Path, repo: &str, tag: &str) -> anyhow::Result<ImageRef> {
    let reference: ImageRef = format!("{}/{repo}:{tag}", registry.addr()).parse()?;
    let built = build(
        tree,
        &reference,
        &BuildOptions::default(),
        &registry_options(),
    )
    .await?;
    Ok(format!("{}/{repo}@{}", registry.addr(), built.digest).parse()?)
}

/// The fixture without [`UTILS_DIR`], as a moved tag might publish it.
fn smaller_tree(dir: &Path) -> anyhow::Result<PathBuf> {
    let from = fixture_cache("triton-vector-add-cuda-sm75");
    let to = dir.join("smaller");
    copy_tree(&from, &to)?;
    std::fs::remove_dir_all(to.join(UTILS_DIR))?;
    Ok(to)
}

/// The names a reader listing the claim sees (hidden ones left out, as `ls`
/// does).
fn listing(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(root)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refill_never_shows_readers_a_missing_or_mixed_tree() -> anyhow::Result<()> {
    let registry = Registry::shared()?;
    let scratch = tempfile::tempdir()?;
    let full = push(
        registry,
        &fixture_cache("triton-vector-add-cuda-sm75"),
        "pvc-refill/cache",
        "full",
    )
    .await?;
    let smaller = push(
        registry,
        &smaller_tree(scratch.path())?,
        "pvc-refill/cache",
        "smaller",
    )
    .await?;
    let claim = scratch.path().join("claim");
    let options = registry_options();
    gkm_k8s_operator::cache::pvc::fill(&full, &claim, &options).await?;
    let kernel = std::fs::read(claim.join(KERNEL))?;
    let full_listing = listing(&claim)?;
    assert!(
        full_listing.contains(&UTILS_DIR.to_string()),
        "{full_listing:?}"
    );

    // A reader opening and reading the kernel as fast as it can.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, reads, path, kernel) = (
            stop.clone(),
            reads.clone(),
            claim.join(KERNEL),
            kernel.clone(),
        );
        std::thread::spawn(move || -> Result<(), String> {
            while !stop.load(Ordering::Relaxed) {
                match std::fs::read(&path) {
                    Ok(bytes) if bytes == kernel => {}
                    Ok(bytes) => {
                        return Err(format!("read {} bytes of another kernel", bytes.len()));
                    }
                    Err(e) => return Err(format!("{}: {e}", path.display())),
                }
                reads.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })
    };

    for round in 0..12 {
        let (image, want) = if round % 2 == 0 {
            (&smaller, {
                let mut l = full_listing.clone();
                l.retain(|n| n != UTILS_DIR);
                l
            })
        } else {
            (&full, full_listing.clone())
        };
        gkm_k8s_operator::cache::pvc::fill(image, &claim, &options).await?;
        assert_eq!(
            listing(&claim)?,
            want,
            "round {round}: the claim lists the new tree"
        );
        if reader.is_finished() {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let outcome = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the reader panicked"))?;
    if let Err(e) = outcome {
        panic!("a reader saw the claim half refilled: {e}");
    }
    assert!(
        reads.load(Ordering::Relaxed) > 100,
        "the reader kept reading"
    );

    // The claim keeps at most the tree served and the one before it.
    let trees = std::fs::read_dir(claim.join(".gkm"))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("sha256-"))
        .count();
    assert!(trees <= 2, "{trees} trees kept");
    Ok(())
}

/// The fill Job of a ReadOnlyMany claim, with a podTemplate.
fn fill_job() -> anyhow::Result<serde_json::Value> {
    let spec: CacheSpec = serde_json::from_value(json!({
        "image": "registry.example/caches/vector-add:v1",
        "storageClassName": "standard",
        "accessModes": ["ReadOnlyMany"],
        "podTemplate": {"metadata": {"labels": {"team": "ml"}},
                        "spec": {"nodeSelector": {"gpu": "yes"}}},
    }))?;
    let plan = ClaimPlan {
        namespace: "restricted-fill".into(),
        name: "vector-add".into(),
        node: None,
        volume: None,
        job: Some("vector-add-fill".into()),
        fill_digest: None,
    };
    let digest = format!("sha256:{}", "0".repeat(64));
    objects::job(
        &CacheKey::namespaced("restricted-fill", "vector-add"),
        &spec,
        &plan,
        &digest,
        &format!("registry.example/caches/vector-add@{digest}"),
        &PvcOptions::default(),
    )
    .ok_or_else(|| anyhow::anyhow!("no fill Job for a claim that names one"))
}

#[tokio::test]
async fn fill_pods_are_admitted_under_pod_security_restricted() -> anyhow::Result<()> {
    let plane = ControlPlane::shared().await?;
    let ns = "restricted-fill";
    plane
        .apply_object(
            &json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": ns, "labels": {
                        "pod-security.kubernetes.io/enforce": "restricted",
                        "pod-security.kubernetes.io/enforce-version": "latest"}}}),
            false,
        )
        .await?;
    // No controller makes the namespace's default ServiceAccount here.
    plane
        .apply_object(
            &json!({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "default", "namespace": ns}}),
            false,
        )
        .await?;
    let job = fill_job()?;
    let template = &job["spec"]["template"];
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "vector-add-fill-pod", "namespace": ns,
                     "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }))?;
    let client = plane.client().await?;
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    if let Err(e) = pods.create(&params, &pod).await {
        panic!("the fill pod is refused in a restricted namespace: {e}");
    }
    Ok(())
}
