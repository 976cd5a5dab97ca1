//! gkm's main job end to end, on real components: etcd, kube-apiserver,
//! kube-controller-manager, kwok nodes, a Distribution registry, cosign, and
//! gkm's operator, agents and CSI drivers as processes running under the
//! shipped RBAC.
//!
//! One test walks the whole story in order, because each step builds on the
//! last: convergence (with the operator and an agent killed mid-way), a
//! second namespace sharing the digest, CSI publishing, a moved tag, deletion
//! while in use, and images that must never be extracted.

use std::cell::RefCell;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gkm_k8s_api::crd::{
    CacheState, ClusterGKMCache, ClusterGKMCacheNode, GKMCache, GKMCacheNode, NodeCacheStatus,
};
use gkm_local::kubelet::{self, PodVolume};
use gkm_local::{Stack, cosign, default_nodes, fixture};
use gkm_testenv::{TimedOut, eventually};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);

/// Polls `probe` until it yields a value, failing after [`TIMEOUT`] with
/// `what` and the last thing seen, or as soon as a gkm process dies.
async fn wait_for<T, F, Fut>(stack: &mut Stack, what: &str, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Result<T, String>>>,
{
    let last = RefCell::new(String::new());
    let last_seen = &last;
    let waited = eventually(what, TIMEOUT, || {
        let running = stack.check_running();
        let answer = probe();
        async move {
            running?;
            let seen = match answer.await {
                Ok(Ok(value)) => return Ok(Some(value)),
                Ok(Err(seen)) => seen,
                Err(e) => format!("error: {e:#}"),
            };
            *last_seen.borrow_mut() = seen;
            Ok(None)
        }
    })
    .await;
    match waited {
        Err(e) if e.is::<TimedOut>() => Err(anyhow::anyhow!(
            "{e}; last seen: {}\n--- operator log ---\n{}",
            last.borrow(),
            stack.log_tail("operator", None, 30)
        )),
        other => other,
    }
}

fn stored_digests(store: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(store.join("sha256"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| format!("sha256:{}", e.file_name().to_string_lossy()))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn find_file(root: &Path, name: &str) -> Option<PathBuf> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if entry.file_name() == name {
                return Some(path);
            }
        }
    }
    None
}

async fn apply_cache(
    client: &kube::Client,
    ns: &str,
    name: &str,
    image: &str,
    public_pem: &str,
) -> anyhow::Result<()> {
    let cache = json!({
        "apiVersion": "gkm.io/v1alpha1",
        "kind": "GKMCache",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "image": image,
            // Resolved again every 2s: the stack's operator default (a
            // cache may ask for no less than 10s).
            "signature": {"signers": [{"key": {"publicKey": public_pem}}]}
        }
    });
    Api::<GKMCache>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&cache),
        )
        .await?;
    Ok(())
}

/// The entry of `cache` for `digest` in `node`'s report in `ns`.
async fn node_entry(
    client: &kube::Client,
    ns: &str,
    node: &str,
    cache: &str,
    digest: &str,
) -> anyhow::Result<Option<NodeCacheStatus>> {
    let report = Api::<GKMCacheNode>::namespaced(client.clone(), ns)
        .get_opt(node)
        .await?;
    Ok(report
        .and_then(|r| r.status)
        .and_then(|s| s.caches)
        .and_then(|c| c.get(cache).and_then(|d| d.get(digest)).cloned()))
}

async fn cache_status(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<Option<GKMCache>> {
    Ok(Api::<GKMCache>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?)
}

/// A pod on `node` with an inline `csi.gkm.io` volume of `cache`, run by kwok.
async fn create_pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    node: &str,
    cache: &str,
) -> anyhow::Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai",
                            "volumeMounts": [{"name": "kernels", "mountPath": "/root/.triton/cache", "readOnly": true}]}],
            "volumes": [{"name": "kernels", "csi": {"driver": "csi.gkm.io", "readOnly": true,
                         "volumeAttributes": {"csi.gkm.io/GKMCache": cache, "csi.gkm.io/namespace": ns}}}]
        }
    }))?;
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn cache_pipeline_end_to_end() -> anyhow::Result<()> {
    let tmp = gkm_testenv::temp_dir()?;
    let mut stack = Stack::start(tmp.path(), default_nodes()).await?;
    let client = stack.plane.client().await?;
    for ns in ["team-a", "team-b"] {
        stack.plane.ensure_namespace(ns).await?;
    }

    // Images from the fixtures, in the local registry, signed with cosign.
    let key = cosign::generate_key_pair(&tmp.path().join("keys/release"))?;
    let stranger = cosign::generate_key_pair(&tmp.path().join("keys/stranger"))?;
    let (cuda, cuda_digest) = stack
        .push_cache(
            &fixture("triton-vector-add-cuda-sm75"),
            "gkm/vector-add",
            "cuda",
        )
        .await?;
    let repository = cuda
        .rsplit_once(':')
        .map(|(r, _)| r.to_string())
        .unwrap_or_default();
    cosign::sign(&key, &format!("{repository}@{cuda_digest}"))?;

    stack.start_gkm()?;
    apply_cache(&client, "team-a", "vector-add", &cuda, &key.public_pem).await?;

    // Kill the operator and the sm75 agent mid-convergence, then restart them.
    tokio::time::sleep(Duration::from_millis(700)).await;
    stack.kill_operator();
    stack.kill_agent("node-sm75");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stack.start_operator()?;
    stack.start_agent("node-sm75")?;

    // --- Convergence: sm75 extracted, gfx90a incompatible, no-GPU node has no compatible GPU.
    let c = client.clone();
    let converged = wait_for(
        &mut stack,
        "team-a/vector-add to converge on 3 nodes",
        || {
            let c = c.clone();
            async move {
                let Some(cache) = cache_status(&c, "team-a", "vector-add").await? else {
                    return Ok(Err("absent".into()));
                };
                let status = cache.status.clone().unwrap_or_default();
                if status.state == Some(CacheState::Extracted) && settled(&status, 3) {
                    Ok(Ok(cache))
                } else {
                    Ok(Err(format!("{:?} {:?}", status.state, status.counts)))
                }
            }
        },
    )
    .await?;
    let status = converged.status.expect("status");
    assert_eq!(
        status.resolved_digest.as_deref(),
        Some(cuda_digest.as_str())
    );
    let verification = status.verification.expect("verification recorded");
    assert!(verification.verified, "{verification:?}");
    assert_eq!(
        (
            status.counts.node_not_in_use_cnt,
            status.counts.node_error_cnt,
            status.counts.node_incompatible_cnt
        ),
        (1, 0, 2),
        "{:?}",
        status.counts
    );
    let ready = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    assert_eq!(ready.status, "True", "{ready:?}");

    let sm75 = node_entry(&client, "team-a", "node-sm75", "vector-add", &cuda_digest)
        .await?
        .expect("sm75 entry");
    assert_eq!(sm75.state, Some(CacheState::Extracted));
    assert_eq!(sm75.compatible_gpus.as_deref(), Some(&[0][..]));
    let gfx = node_entry(&client, "team-a", "node-gfx90a", "vector-add", &cuda_digest)
        .await?
        .expect("gfx90a entry");
    assert_eq!(gfx.state, Some(CacheState::Incompatible));
    assert_eq!(gfx.incompatible_gpus.as_deref(), Some(&[0][..]));
    let reasons = gfx
        .incompatible_reasons
        .expect("reasons")
        .remove(0)
        .reasons
        .join("; ");
    assert!(
        reasons.contains("backend"),
        "gfx90a reasons name the backend: {reasons}"
    );
    let cpu = node_entry(&client, "team-a", "node-cpu", "vector-add", &cuda_digest)
        .await?
        .expect("cpu entry");
    assert_eq!(cpu.state, Some(CacheState::Incompatible));
    assert!(
        cpu.message.as_deref().unwrap_or("").contains("no GPUs"),
        "{:?}",
        cpu.message
    );
    let reports = Api::<GKMCacheNode>::namespaced(client.clone(), "team-a")
        .list(&ListParams::default())
        .await?;
    let mut names: Vec<String> = reports
        .items
        .iter()
        .filter_map(|r| r.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["node-cpu", "node-gfx90a", "node-sm75"],
        "one report per node, no duplicates"
    );
    assert_eq!(
        stored_digests(&stack.store_dir("node-sm75")),
        std::slice::from_ref(&cuda_digest)
    );
    assert!(stored_digests(&stack.store_dir("node-gfx90a")).is_empty());
    assert!(stored_digests(&stack.store_dir("node-cpu")).is_empty());
    let store_dir = stack
        .store_dir("node-sm75")
        .join("sha256")
        .join(cuda_digest.trim_start_matches("sha256:"));
    let extracted_at = std::fs::metadata(&store_dir)?.modified()?;

    // --- A second namespace with the same digest: no second extraction.
    apply_cache(&client, "team-b", "vector-add", &cuda, &key.public_pem).await?;
    let c = client.clone();
    let digest = cuda_digest.clone();
    wait_for(
        &mut stack,
        "team-b/vector-add extracted on node-sm75",
        || {
            let (c, digest) = (c.clone(), digest.clone());
            async move {
                let entry = node_entry(&c, "team-b", "node-sm75", "vector-add", &digest).await?;
                Ok(match entry.and_then(|e| e.state) {
                    Some(CacheState::Extracted) => Ok(()),
                    other => Err(format!("{other:?}")),
                })
            }
        },
    )
    .await?;
    assert_eq!(
        stored_digests(&stack.store_dir("node-sm75")),
        std::slice::from_ref(&cuda_digest),
        "one store directory per digest"
    );
    assert_eq!(
        std::fs::metadata(&store_dir)?.modified()?,
        extracted_at,
        "the digest was not extracted again"
    );

    // --- CSI: a pod on sm75 mounts the cache; on gfx90a the mount is refused with the reason.
    create_pod(&client, "team-a", "infer-0", "node-sm75", "vector-add").await?;
    let volume = PodVolume::gkmcache("team-a", "infer-0", "team-a", "vector-add");
    let target = kubelet::target_path(&stack.node_dir("node-sm75"), &volume);
    kubelet::publish(&stack.csi_socket("node-sm75"), &target, &volume).await?;
    let cubin =
        find_file(&target, "add_kernel.cubin").expect("the cache is visible in the pod's volume");
    assert!(
        std::fs::write(cubin.with_extension("new"), b"x").is_err(),
        "the volume is read-only"
    );

    let refused_volume = PodVolume::gkmcache("team-a", "infer-1", "team-a", "vector-add");
    let refused_target = kubelet::target_path(&stack.node_dir("node-gfx90a"), &refused_volume);
    let refusal = kubelet::publish(
        &stack.csi_socket("node-gfx90a"),
        &refused_target,
        &refused_volume,
    )
    .await
    .expect_err("publishing on gfx90a must fail");
    assert_eq!(
        refusal.code(),
        tonic::Code::FailedPrecondition,
        "{refusal:?}"
    );
    assert!(
        refusal.message().contains("backend"),
        "the refusal says why: {}",
        refusal.message()
    );

    let c = client.clone();
    wait_for(&mut stack, "team-a/vector-add Running with 1 pod", || {
        let c = c.clone();
        async move {
            let status = cache_status(&c, "team-a", "vector-add")
                .await?
                .and_then(|c| c.status)
                .unwrap_or_default();
            Ok(
                if status.state == Some(CacheState::Running) && status.counts.pod_running_cnt == 1 {
                    Ok(())
                } else {
                    Err(format!("{:?} {:?}", status.state, status.counts))
                },
            )
        }
    })
    .await?;

    // --- The tag moves to a new image: it rolls out, and the pod on the old digest is outdated.
    let (_, moved_digest) = {
        let dest: gkm_oci::ImageRef = cuda.parse()?;
        let registry = gkm_oci::RegistryOptions {
            insecure: true,
            ..Default::default()
        };
        // The same files with the other layer compression: a new digest.
        let options = gkm_oci::BuildOptions {
            compression: gkm_oci::Compression::Zstd,
            ..Default::default()
        };
        let built = gkm_oci::build(
            &fixture("triton-vector-add-cuda-sm75"),
            &dest,
            &options,
            &registry,
        )
        .await?;
        (cuda.clone(), built.digest.to_string())
    };
    assert_ne!(moved_digest, cuda_digest);
    cosign::sign(&key, &format!("{repository}@{moved_digest}"))?;
    let c = client.clone();
    let (old, new) = (cuda_digest.clone(), moved_digest.clone());
    wait_for(
        &mut stack,
        "the moved tag to roll out with the pod outdated",
        || {
            let (c, old, new) = (c.clone(), old.clone(), new.clone());
            async move {
                let status = cache_status(&c, "team-a", "vector-add")
                    .await?
                    .and_then(|c| c.status)
                    .unwrap_or_default();
                let on_new = node_entry(&c, "team-a", "node-sm75", "vector-add", &new)
                    .await?
                    .and_then(|e| e.state);
                let on_old = node_entry(&c, "team-a", "node-sm75", "vector-add", &old)
                    .await?
                    .and_then(|e| e.state);
                Ok(
                    if status.resolved_digest.as_deref() == Some(new.as_str())
                        && status.state == Some(CacheState::Outdated)
                        && status.counts.pod_outdated_cnt == 1
                        && on_new == Some(CacheState::Extracted)
                        && on_old == Some(CacheState::Outdated)
                    {
                        Ok(())
                    } else {
                        Err(format!(
                            "{:?} {:?} {:?} new={on_new:?} old={on_old:?}",
                            status.resolved_digest, status.state, status.counts
                        ))
                    },
                )
            }
        },
    )
    .await?;

    // --- Deleting while in use waits for the pod, then leaves nothing behind.
    Api::<GKMCache>::namespaced(client.clone(), "team-a")
        .delete("vector-add", &DeleteParams::default())
        .await?;
    let c = client.clone();
    wait_for(&mut stack, "team-a/vector-add Deleting", || {
        let c = c.clone();
        async move {
            let state = cache_status(&c, "team-a", "vector-add")
                .await?
                .and_then(|c| c.status)
                .and_then(|s| s.state);
            Ok(if state == Some(CacheState::Deleting) {
                Ok(())
            } else {
                Err(format!("{state:?}"))
            })
        }
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = cache_status(&client, "team-a", "vector-add")
        .await?
        .expect("held by its finalizer while in use");
    assert!(
        held.metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == "gkm.io/cleanup")
    );
    kubelet::unpublish(&stack.csi_socket("node-sm75"), &target, &volume).await?;
    Api::<Pod>::namespaced(client.clone(), "team-a")
        .delete("infer-0", &DeleteParams::default())
        .await?;
    let c = client.clone();
    let store = stack.store_dir("node-sm75");
    let (old, new) = (cuda_digest.clone(), moved_digest.clone());
    wait_for(
        &mut stack,
        "the deleted cache to leave nothing behind",
        || {
            let (c, store, old, new) = (c.clone(), store.clone(), old.clone(), new.clone());
            async move {
                let gone = cache_status(&c, "team-a", "vector-add").await?.is_none();
                let reports = Api::<GKMCacheNode>::namespaced(c.clone(), "team-a")
                    .list(&ListParams::default())
                    .await?;
                let stored = stored_digests(&store);
                // team-b still uses the moved tag's digest on this node.
                Ok(
                    if gone && reports.items.is_empty() && !stored.contains(&old) {
                        Ok(())
                    } else {
                        Err(format!(
                            "gone={gone} reports={} stored={stored:?} (new {new})",
                            reports.items.len()
                        ))
                    },
                )
            }
        },
    )
    .await?;

    // --- Unsigned and wrongly signed images are never extracted.
    let (unsigned, unsigned_digest) = stack
        .push_cache(
            &fixture("triton-vector-add-rocm-gfx90a"),
            "gkm/unsigned",
            "v1",
        )
        .await?;
    let (forged, forged_digest) = stack
        .push_cache(&fixture("vllm-torch-compile-inductor"), "gkm/forged", "v1")
        .await?;
    let forged_repository = forged
        .rsplit_once(':')
        .map(|(r, _)| r.to_string())
        .unwrap_or_default();
    cosign::sign(&stranger, &format!("{forged_repository}@{forged_digest}"))?;
    apply_cache(&client, "team-b", "unsigned", &unsigned, &key.public_pem).await?;
    apply_cache(&client, "team-b", "forged", &forged, &key.public_pem).await?;
    for (name, digest) in [
        ("unsigned", unsigned_digest.clone()),
        ("forged", forged_digest.clone()),
    ] {
        let c = client.clone();
        let verification = wait_for(
            &mut stack,
            &format!("team-b/{name} verification to fail"),
            || {
                let (c, digest) = (c.clone(), digest.clone());
                async move {
                    let status = cache_status(&c, "team-b", name)
                        .await?
                        .and_then(|c| c.status)
                        .unwrap_or_default();
                    let entry = node_entry(&c, "team-b", "node-gfx90a", name, &digest).await?;
                    Ok(match (status.verification, entry) {
                        (Some(v), Some(e)) if !v.verified && e.state == Some(CacheState::Error) => {
                            Ok((v, e, status.conditions))
                        }
                        (v, e) => Err(format!("{v:?} {e:?}")),
                    })
                }
            },
        )
        .await?;
        let (result, entry, conditions) = verification;
        let verified = conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Verified")
            .expect("Verified condition");
        assert_eq!(verified.status, "False");
        assert!(
            !verified.message.is_empty(),
            "the condition says why: {verified:?}"
        );
        assert!(result.message.is_some(), "{result:?}");
        assert!(
            entry
                .message
                .as_deref()
                .unwrap_or("")
                .contains("not verified"),
            "{entry:?}"
        );
        for node in ["node-sm75", "node-gfx90a", "node-cpu"] {
            assert!(
                !stored_digests(&stack.store_dir(node)).contains(&digest),
                "{name} was extracted on {node}"
            );
        }
    }

    // --- A cluster cache: the same pipeline through ClusterGKMCache and its node reports.
    let (rocm, rocm_digest) = stack
        .push_cache(
            &fixture("triton-vector-add-rocm-gfx90a"),
            "gkm/vector-add",
            "rocm",
        )
        .await?;
    cosign::sign(&key, &format!("{repository}@{rocm_digest}"))?;
    let cluster_cache = json!({
        "apiVersion": "gkm.io/v1alpha1",
        "kind": "ClusterGKMCache",
        "metadata": {"name": "vector-add-rocm"},
        "spec": {
            "image": rocm,
            "workloadNamespaces": ["team-b"],
            "signature": {"signers": [{"key": {"publicKey": key.public_pem}}]}
        }
    });
    Api::<ClusterGKMCache>::all(client.clone())
        .patch(
            "vector-add-rocm",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&cluster_cache),
        )
        .await?;
    let c = client.clone();
    let digest = rocm_digest.clone();
    wait_for(&mut stack, "the cluster cache to converge", || {
        let (c, digest) = (c.clone(), digest.clone());
        async move {
            let status = Api::<ClusterGKMCache>::all(c.clone())
                .get("vector-add-rocm")
                .await?
                .status
                .unwrap_or_default();
            let report = Api::<ClusterGKMCacheNode>::all(c.clone())
                .get_opt("node-gfx90a")
                .await?;
            let entry = report
                .and_then(|r| r.status)
                .and_then(|s| s.caches)
                .and_then(|caches| {
                    caches
                        .get("vector-add-rocm")
                        .and_then(|d| d.get(&digest))
                        .cloned()
                });
            Ok(match entry.and_then(|e| e.state) {
                Some(CacheState::Extracted)
                    if status.state == Some(CacheState::Extracted) && settled(&status, 3) =>
                {
                    Ok(status.counts)
                }
                other => Err(format!("{other:?} {:?} {:?}", status.state, status.counts)),
            })
        }
    })
    .await
    .map(|counts| {
        assert_eq!(
            (
                counts.node_not_in_use_cnt,
                counts.node_error_cnt,
                counts.node_incompatible_cnt
            ),
            (1, 0, 2),
            "{counts:?}"
        )
    })?;
    assert!(stored_digests(&stack.store_dir("node-gfx90a")).contains(&rocm_digest));
    Ok(())
}

/// Whether `nodes` nodes reported the cache and each settled.
fn settled(status: &gkm_k8s_api::crd::CacheStatus, nodes: i32) -> bool {
    status.counts.node_cnt == nodes && status.counts.all_settled()
}
