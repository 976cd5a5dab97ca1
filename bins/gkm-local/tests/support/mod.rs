//! The Triton fleet through a real node, shared by the delivery tests: every
//! target's real Triton cache (`fixtures/triton`) pushed and signed, a node
//! with a GPU for each, and a pod that mounts the delivered caches where
//! their kernels were compiled (the `TRITON_CACHE_DIR` a workload would use)
//! and copies them out through a hostPath, so that real Triton checks on the
//! host what the container read.

// Each test binary uses its own part of it.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use gkm_k8s_api::crd::{GKMCache, GKMCacheNode};
use gkm_local::Stack;
use gkm_local::cosign::{self, CosignKey};
use gkm_testenv::triton::{FLEET_PROFILES, FleetTarget, TritonReport, check_delivered};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// A simulated inventory with one GPU of every fleet target, a T4 first.
pub fn fleet_inventory() -> String {
    let mut yaml = String::from("gpus:\n");
    for (_, profiles) in FLEET_PROFILES {
        yaml.push_str(&format!("- profile: {}\n", profiles[0]));
    }
    yaml
}

/// A fleet target delivered as an image.
pub struct Pushed {
    /// The target.
    pub target: FleetTarget,
    /// The image reference (`registry/gkm/fleet:<target>`).
    pub image: String,
    /// Its digest.
    pub digest: String,
}

/// Builds every fleet target's fixture into `gkm/fleet:<target>` and signs
/// it with `key`: the images pushed side by side, signed one after another
/// ([`cosign::sign`] holds one signature push at a time).
pub async fn push_signed_fleet(stack: &Stack, key: &CosignKey) -> anyhow::Result<Vec<Pushed>> {
    let fleet = gkm_testenv::triton::fleet()?;
    let pushed = futures::future::try_join_all(fleet.into_iter().map(|target| async move {
        let (image, digest) = stack
            .push_cache(&target.fixture, "gkm/fleet", &target.name)
            .await?;
        anyhow::Ok(Pushed {
            target,
            image,
            digest,
        })
    }))
    .await?;
    for p in &pushed {
        let repository = p
            .image
            .rsplit_once(':')
            .map_or(p.image.as_str(), |(r, _)| r);
        cosign::sign(key, &format!("{repository}@{}", p.digest))?;
    }
    Ok(pushed)
}

/// The name of the cache object delivering `target` (`fleet-cuda-90-32`).
pub fn cache_name(target: &FleetTarget) -> String {
    format!("fleet-{}", target.name)
}

/// Applies a `GKMCache` [`cache_name`] in `ns` for every pushed target: its
/// image, and the fields of `spec`.
pub async fn apply_fleet_caches(
    client: &kube::Client,
    ns: &str,
    fleet: &[Pushed],
    spec: &Value,
) -> anyhow::Result<()> {
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), ns);
    for pushed in fleet {
        let name = cache_name(&pushed.target);
        let mut spec = spec.clone();
        spec["image"] = json!(pushed.image);
        let cache = json!({
            "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        });
        caches
            .patch(
                &name,
                &PatchParams::apply("fleet").force(),
                &Patch::Apply(&cache),
            )
            .await?;
    }
    Ok(())
}

/// Waits until `node`'s agent reports every pushed target's digest on the
/// node (in `ns`).
pub async fn wait_on_node(
    stack: &Stack,
    client: &kube::Client,
    ns: &str,
    node: &str,
    fleet: &[Pushed],
    timeout: Duration,
) -> anyhow::Result<()> {
    let reports: Api<GKMCacheNode> = Api::namespaced(client.clone(), ns);
    stack
        .eventually(
            &format!("{node} reports every fleet target on it"),
            timeout,
            || {
                let reports = reports.clone();
                async move {
                    let caches = reports
                        .get_opt(node)
                        .await?
                        .and_then(|r| r.status)
                        .and_then(|s| s.caches)
                        .unwrap_or_default();
                    let all = fleet.iter().all(|p| {
                        caches
                            .get(&cache_name(&p.target))
                            .and_then(|d| d.get(&p.digest))
                            .and_then(|e| e.state)
                            .is_some_and(|s| s.is_on_node())
                    });
                    Ok(all.then_some(()))
                }
            },
        )
        .await
}

/// A busybox pod (on `node`, or placed by the scheduler) mounting each
/// target's volume (`volumes`: the target and the volume's source, e.g.
/// `{"csi": {...}}`) read-only at the target's compile path, with
/// `sub_path` when given, copying each into `out/<target>` (a hostPath),
/// printing `COPIED` and waiting.
pub fn fleet_reader(
    ns: &str,
    name: &str,
    node: Option<&str>,
    out: &Path,
    volumes: &[(&FleetTarget, Value)],
    sub_path: Option<&str>,
) -> anyhow::Result<Pod> {
    let mut mounts = vec![json!({"name": "out", "mountPath": "/out"})];
    let mut sources =
        vec![json!({"name": "out", "hostPath": {"path": out, "type": "DirectoryOrCreate"}})];
    let mut script = String::from("set -e; ");
    for (target, source) in volumes {
        let path = target.compiled_at.display().to_string();
        let mut mount = json!({"name": target.name, "mountPath": path, "readOnly": true});
        if let Some(sub_path) = sub_path {
            mount["subPath"] = json!(sub_path);
        }
        mounts.push(mount);
        let mut volume = source.clone();
        volume["name"] = json!(target.name);
        sources.push(volume);
        script.push_str(&format!(
            "mkdir -p /out/{0} && cp -R {path}/. /out/{0}/; ",
            target.name
        ));
    }
    script.push_str("echo COPIED; exec sleep 100000");
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 0,
        "containers": [{
            "name": "triton", "image": gkm_testenv::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", script],
            "volumeMounts": mounts,
        }],
        "volumes": sources,
    });
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))?)
}

/// Creates `pod` (a [`fleet_reader`]), waits until its container copied
/// every tree out, and checks with real Triton, one run for all, that each
/// copied tree is reused whole where its kernels were compiled: nothing
/// compiled, every kernel read from the delivered tree.
pub async fn triton_reuses_what_the_pod_read(
    pods: &Api<Pod>,
    pod: &Pod,
    out: &Path,
    fleet: &[&FleetTarget],
    timeout: Duration,
) -> anyhow::Result<Vec<TritonReport>> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let began = Instant::now();
    pods.create(&PostParams::default(), pod).await?;
    gkm_testenv::running_pod_log(pods, &name, "triton", "COPIED", timeout).await?;
    let copied = began.elapsed();
    let delivered: Vec<(&FleetTarget, std::path::PathBuf)> =
        fleet.iter().map(|t| (*t, out.join(&t.name))).collect();
    let reports = check_delivered(&delivered)?;
    eprintln!(
        "pod {name}: {} fleet caches mounted and copied out in {:.1}s, reused whole by real Triton in {:.1}s",
        fleet.len(),
        copied.as_secs_f64(),
        (began.elapsed() - copied).as_secs_f64()
    );
    Ok(reports)
}
