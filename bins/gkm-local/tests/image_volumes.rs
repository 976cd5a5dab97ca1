//! Image-volume delivery on a real node (kubelet 1.36, containerd 2.4,
//! runc): a pod whose `image` volume names a cache by the placeholder
//! `gkm.invalid/cache/<name>` is rewritten by the operator's
//! `image-volume.gkm.io` webhook (called by the apiserver, trusting the
//! operator's self-issued CA) to the verified digest and kept to the nodes
//! whose GPUs fit; the scheduler places it there without gkm's extender,
//! containerd pulls the image gkm built from the loopback registry (a
//! `hosts.toml` trusting it, as an administrator writes one), and the
//! container reads the cache tree read-only: copied out through a hostPath,
//! it is the fixture's tree byte for byte. A cache whose image is not signed
//! by the policy's signer, a `ClusterGKMCache` whose `workloadNamespaces`
//! leave the pod's namespace out, and a cache that does not exist are
//! refused at admission with the reason.
//!
//! Every target of the Triton fleet goes the same way: one pod with an
//! image volume per target's real Triton cache, each mounted where its
//! kernels were compiled, copied out, and reused by real Triton with nothing
//! compiled.
//!
//! Beside the real node (an NVIDIA T4, which the sm75 fixture fits, then one
//! GPU of every other fleet target) a kwok node with an H100 (which the sm75
//! fixture does not fit) is a candidate the scheduler would otherwise be
//! free to pick.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gkm_k8s_api::crd::{ClusterGKMCache, GKMCache, GKMCacheNode};
use gkm_local::{SimulatedNode, Stack, cosign, fixture, push_cache};
use gkm_testenv::{Scheduler, pod_log, wait_for_pod};
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

mod support;

const TIMEOUT: Duration = Duration::from_secs(120);
const NODE: &str = "real-sm75";
const KWOK_NODE: &str = "kwok-h100";
const NS: &str = "team-a";

/// A busybox pod (not pinned to a node) mounting the image volume that
/// names cache `cache` at `/cache` (the image's `io.triton.cache` directory,
/// by `subPath`), copying it into the hostPath `out`, then waiting.
fn image_volume_pod(name: &str, cache: &str, out: &Path) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "triton", "image": gkm_testenv::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "env": [{"name": "TRITON_CACHE_DIR", "value": "/cache"}],
                "command": ["/bin/sh", "-c",
                    "cp -R /cache/. /out/ && echo COPIED; \
                     if touch /cache/written 2>/dev/null; then echo WRITABLE; else echo READ-ONLY; fi; \
                     echo DONE; exec sleep 100000"],
                "volumeMounts": [
                    {"name": "kernels", "mountPath": "/cache", "subPath": "io.triton.cache",
                     "readOnly": true},
                    {"name": "out", "mountPath": "/out"},
                ],
            }],
            "volumes": [
                {"name": "kernels", "image": {"reference": format!("gkm.invalid/cache/{cache}"),
                                              "pullPolicy": "IfNotPresent"}},
                {"name": "out", "hostPath": {"path": out, "type": "DirectoryOrCreate"}},
            ],
        }
    }))?)
}

/// Every file under `root`, by path relative to it, with its bytes.
fn tree(root: &Path) -> anyhow::Result<BTreeMap<PathBuf, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                dirs.push(path);
            } else {
                out.insert(
                    path.strip_prefix(root)?.to_path_buf(),
                    std::fs::read(&path)?,
                );
            }
        }
    }
    Ok(out)
}

/// The node constraints the webhook gave the pod: each required
/// node-affinity field selector's key and values.
fn required_nodes(spec: &PodSpec) -> Vec<(String, Vec<String>)> {
    spec.affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default()
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .map(|f| (f.key.clone(), f.values.clone().unwrap_or_default()))
        .collect()
}

/// Applies a `GKMCache` `name` of `image` (verified by the operator's
/// default policy).
async fn apply_cache(caches: &Api<GKMCache>, name: &str, image: &str) -> anyhow::Result<()> {
    let cache = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"image": image, "resolveInterval": "10s"},
    });
    caches
        .patch(
            name,
            &PatchParams::apply("image-volumes").force(),
            &Patch::Apply(&cache),
        )
        .await?;
    Ok(())
}

/// The admission refusal of `pod`, failing when it is admitted.
async fn refusal(pods: &Api<Pod>, pod: &Pod) -> anyhow::Result<String> {
    match pods.create(&PostParams::default(), pod).await {
        Ok(p) => anyhow::bail!("admitted: {:?}", p.spec),
        Err(kube::Error::Api(e)) => Ok(e.message),
        Err(e) => Err(e.into()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn image_volumes_mount_the_verified_digest_on_fitting_nodes() -> anyhow::Result<()> {
    let tmp = gkm_testenv::temp_dir()?;
    let mut stack = Stack::start_with_controllers(
        tmp.path(),
        vec![SimulatedNode::new(KWOK_NODE, "gpus:\n- profile: H100\n")],
        // Lifts the not-ready taint once the kubelet reports Ready.
        &["node-lifecycle-controller"],
    )
    .await?;
    stack
        .add_real_node(SimulatedNode::new(NODE, &support::fleet_inventory()))
        .await?;
    stack
        .real_node(NODE)
        .ok_or_else(|| anyhow::anyhow!("no real node {NODE}"))?
        .trust_plain_http_registry(stack.registry.addr())?;
    let _scheduler = Scheduler::start(
        &stack.plane,
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n",
    )?;
    let client = stack.plane.client().await?;
    stack.plane.ensure_namespace(NS).await?;

    let key = cosign::generate_key_pair(&tmp.path().join("keys/release"))?;
    let cache_dir = fixture("triton-vector-add-cuda-sm75");
    let (image, digest) = stack
        .push_signed_cache(&cache_dir, "gkm/vector-add", "cuda", &key)
        .await?;
    // The same cache, never signed.
    let (unsigned, _) = push_cache(&stack.registry, &cache_dir, "gkm/unsigned", "cuda").await?;
    let webhook_port = gkm_testenv::free_port()?;
    let policy = tmp.path().join("default-policy.yaml");
    std::fs::write(
        &policy,
        serde_yaml::to_string(&json!({"signers": [{"key": {"publicKey": key.public_pem}}]}))?,
    )?;
    stack.set_args(
        vec![
            format!("--default-policy={}", policy.display()),
            // The apiserver calls the webhook on loopback, trusting the
            // operator's self-issued CA from the configuration's caBundle.
            format!("--webhook-listen=127.0.0.1:{webhook_port}"),
            format!("--webhook-url=https://127.0.0.1:{webhook_port}"),
        ],
        vec!["--resync=2s".into()],
    );
    stack.start_gkm()?;

    let caches: Api<GKMCache> = Api::namespaced(client.clone(), NS);
    apply_cache(&caches, "vector-add", &image).await?;
    apply_cache(&caches, "unsigned", &unsigned).await?;
    let reports: Api<GKMCacheNode> = Api::namespaced(client.clone(), NS);
    let reported = stack
        .eventually("the T4 node reports the digest on it", TIMEOUT, || {
            let reports = reports.clone();
            let digest = digest.clone();
            async move {
                let on_node = reports
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .any(|r| {
                        r.status
                            .as_ref()
                            .and_then(|s| s.caches.as_ref())
                            .and_then(|c| c.get("vector-add"))
                            .and_then(|d| d.get(&digest))
                            .and_then(|e| e.state)
                            .is_some_and(|s| s.is_on_node())
                            && r.status.as_ref().map(|s| s.node_name.as_str()) == Some(NODE)
                    });
                Ok(on_node.then_some(()))
            }
        })
        .await;
    if let Err(e) = reported {
        let cache = caches.get("vector-add").await?;
        let all = reports.list(&ListParams::default()).await?;
        anyhow::bail!(
            "{e}\ncache status: {:?}\nreports: {:?}",
            cache.status,
            all.items.iter().map(|r| &r.status).collect::<Vec<_>>()
        );
    }
    stack
        .eventually("the unsigned cache has its verdict", TIMEOUT, || {
            let caches = caches.clone();
            async move {
                let cache = caches.get("unsigned").await?;
                let status = cache.status.unwrap_or_default();
                Ok((status.resolved_digest.is_some()
                    && status.verification.as_ref().is_some_and(|v| !v.verified))
                .then_some(()))
            }
        })
        .await?;

    // The verified cache: pinned, kept to the T4 node, mounted read-only.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let out = tmp.path().join("copied");
    let created = pods
        .create(
            &PostParams::default(),
            &image_volume_pod("reader", "vector-add", &out)?,
        )
        .await?;
    let spec = created.spec.clone().unwrap_or_default();
    let reference = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "kernels")
        .and_then(|v| v.image.as_ref())
        .and_then(|i| i.reference.clone());
    let repository = image.rsplit_once(':').map_or(image.as_str(), |(r, _)| r);
    assert_eq!(reference, Some(format!("{repository}@{digest}")));
    assert_eq!(
        required_nodes(&spec),
        [("metadata.name".to_string(), vec![NODE.to_string()])],
        "only the node whose GPUs fit"
    );
    let running = wait_for_pod(&pods, "reader", TIMEOUT, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
    .await?;
    assert_eq!(
        running.spec.and_then(|s| s.node_name).as_deref(),
        Some(NODE)
    );
    let log = stack
        .eventually("the reader copies the cache", TIMEOUT, || {
            let pods = pods.clone();
            async move {
                let log = pod_log(&pods, "reader", "triton").await?;
                Ok(log.contains("DONE").then_some(log))
            }
        })
        .await?;
    assert!(log.contains("COPIED"), "{log}");
    assert!(log.contains("READ-ONLY"), "{log}");
    let copied = tree(&out)?;
    let want = tree(&cache_dir)?;
    assert_eq!(
        copied.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the mounted tree holds the cache's files"
    );
    assert!(copied == want, "every file's bytes are the cache's");

    // Every fleet target: the pod's image volumes pinned to their verified
    // digests, kept to the node whose GPUs fit them all (the kwok H100 fits
    // only one), each cache reused whole by real Triton.
    let fleet_began = std::time::Instant::now();
    let fleet = support::push_signed_fleet(&stack, &key).await?;
    support::apply_fleet_caches(&client, NS, &fleet, &json!({"resolveInterval": "10s"})).await?;
    support::wait_on_node(&stack, &client, NS, NODE, &fleet, TIMEOUT).await?;
    let volumes: Vec<_> = fleet
        .iter()
        .map(|p| {
            let reference = format!("gkm.invalid/cache/{}", support::cache_name(&p.target));
            (
                &p.target,
                json!({"image": {"reference": reference, "pullPolicy": "IfNotPresent"}}),
            )
        })
        .collect();
    let fleet_out = tmp.path().join("fleet-copied");
    let fleet_pod = support::fleet_reader(
        NS,
        "fleet",
        None,
        &fleet_out,
        &volumes,
        Some("io.triton.cache"),
    )?;
    let targets: Vec<_> = fleet.iter().map(|p| &p.target).collect();
    let reports =
        support::triton_reuses_what_the_pod_read(&pods, &fleet_pod, &fleet_out, &targets, TIMEOUT)
            .await?;
    assert_eq!(reports.len(), 11, "{reports:#?}");
    eprintln!(
        "the fleet through image volumes: {:.1}s",
        fleet_began.elapsed().as_secs_f64()
    );
    let placed = pods.get("fleet").await?.spec.unwrap_or_default();
    assert_eq!(
        required_nodes(&placed),
        [("metadata.name".to_string(), vec![NODE.to_string()])],
        "only the node whose GPUs fit every volume's cache"
    );
    assert_eq!(placed.node_name.as_deref(), Some(NODE));
    for (volume, pushed) in placed.volumes.iter().flatten().skip(1).zip(&fleet) {
        let repository = pushed
            .image
            .rsplit_once(':')
            .map_or(pushed.image.as_str(), |(r, _)| r);
        assert_eq!(
            volume.image.as_ref().and_then(|i| i.reference.clone()),
            Some(format!("{repository}@{}", pushed.digest)),
            "{}",
            volume.name
        );
    }

    // Refusals, with the reason.
    let message = refusal(&pods, &image_volume_pod("unverified", "unsigned", &out)?).await?;
    assert!(
        message.contains("image volume \"kernels\" names gkm cache unsigned")
            && message.contains("is not verified"),
        "{message}"
    );
    // A ClusterGKMCache serves only its workloadNamespaces, as through CSI.
    Api::<ClusterGKMCache>::all(client.clone())
        .patch(
            "shared",
            &PatchParams::apply("image-volumes").force(),
            &Patch::Apply(&json!({
                "apiVersion": "gkm.io/v1alpha1", "kind": "ClusterGKMCache",
                "metadata": {"name": "shared"},
                "spec": {"image": image, "workloadNamespaces": ["team-b"]},
            })),
        )
        .await?;
    let message = refusal(&pods, &image_volume_pod("elsewhere", "shared", &out)?).await?;
    assert!(
        message.contains(
            "ClusterGKMCache shared's workloadNamespaces (team-b) do not include namespace team-a"
        ),
        "{message}"
    );
    let message = refusal(&pods, &image_volume_pod("missing", "nope", &out)?).await?;
    assert!(
        message.contains(&format!("there is no GKMCache nope in namespace {NS}")),
        "{message}"
    );
    Ok(())
}
