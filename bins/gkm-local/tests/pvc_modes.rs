//! GKM's PVC delivery on two real nodes. One test walks the story in order:
//!
//! - ReadOnlyMany: a `GKMCache` in GKM's shape (StorageClass, access modes,
//!   `podTemplate`) gets a claim named like it and a fill Job whose
//!   container runs gkm's own extractor; the template's labels, nodeSelector
//!   and tolerations reach the Job's pod; a workload pod mounting
//!   `claimName: <cache>` reads the kernel. A `ClusterGKMCache` does the same
//!   per workload namespace and follows changes to that list (a missing
//!   namespace shows `NoNamespace` until it exists).
//! - ReadWriteOnce: a claim per node, each filled by a Job pinned to its
//!   node; a DaemonSet labelled `gkm.io/pvc-mutation: "true"` gets each
//!   pod's claim rewritten to its node's claim by the webhook the apiserver
//!   calls (the operator's self-issued CA in `caBundle`); unpinned pods and
//!   nodes without a claim are refused; unlabelled pods are left alone. A
//!   `ClusterGKMCache` in ReadWriteOnce does the same in its namespace.
//! - A moved tag refills the claims; pods started before count as outdated.
//! - Deleting a cache while a pod uses its claim waits for the pod, survives
//!   an operator restart, then leaves no Job, claim, volume or directory.
//! - Every target of the Triton fleet through a ReadOnlyMany claim: one pod
//!   mounts each target's claim where its kernels were compiled, copies it
//!   out (with the claim's `.gkm/current` links, which Triton's recorded
//!   paths resolve through), and real Triton reuses every copy with nothing
//!   compiled.
//!
//! The cluster has no provisioner: the operator makes the volumes
//! (`--pvc-volume-dir`, hostPath; this test ground's nodes share one
//! filesystem, which ReadOnlyMany volumes need).

use std::time::Duration;

use gkm_k8s_api::crd::{CacheState, ClusterGKMCache, GKMCache};
use gkm_local::{SimulatedNode, Stack, fixture};
use gkm_testenv::triton::copy_tree;
use gkm_testenv::{Scheduler, TestImage, pod_log, wait_for_pod, workspace_binary};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use sha2::{Digest as _, Sha256};

mod support;

const TIMEOUT: Duration = Duration::from_secs(180);
const NODE: &str = "real-sm75";
/// A second real node with the same GPU, for ReadWriteOnce's claim per node.
const NODE2: &str = "real-sm75-b";
const JOB_IMAGE: &str = "gkm.test/gkm-operator:pvc";
const KERNEL_DIR: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";
const CLASS: &str = "gkm-local";
/// A directory of the fixture holding no kernel; the moved tag's image leaves it out.
const UTILS_DIR: &str = "NNIRBEH2OVXHBOQBWMZABZQUTHRBNTKPWP7Q45RX7SE5JGCMEUPA";

/// A busybox pod on the real node mounting claim `claim` at `/cache`, listing
/// it and printing the kernel's sha256, then waiting.
fn claim_reader(ns: &str, name: &str, claim: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "triton", "image": gkm_testenv::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c",
                    "ls -1 /cache; sha256sum /cache/*/add_kernel.cubin; echo DONE; exec sleep 100000"],
                "volumeMounts": [{"name": "kernels", "mountPath": "/cache", "readOnly": true}],
            }],
            "volumes": [{"name": "kernels", "persistentVolumeClaim": {"claimName": claim, "readOnly": true}}],
        }
    }))?)
}

/// Starts a reader of `claim` in `ns` and returns its log once it printed
/// the kernel's checksum.
async fn read_claim(
    stack: &Stack,
    client: &Client,
    ns: &str,
    name: &str,
    claim: &str,
) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &claim_reader(ns, name, claim)?)
        .await?;
    wait_for_pod(&pods, name, TIMEOUT, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
    .await?;
    stack
        .eventually(&format!("{ns}/{name} prints the kernel"), TIMEOUT, || {
            let pods = pods.clone();
            async move {
                let log = pod_log(&pods, name, "triton").await?;
                Ok(log.contains("DONE").then_some(log))
            }
        })
        .await
}

async fn job_succeeded(client: &Client, ns: &str) -> anyhow::Result<Option<Job>> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    Ok(jobs
        .list(&ListParams::default().labels("gkm.io/cache"))
        .await?
        .items
        .into_iter()
        .find(|j| j.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0))
}

fn kernel_sha() -> anyhow::Result<String> {
    let path = fixture("triton-vector-add-cuda-sm75")
        .join(KERNEL_DIR)
        .join("add_kernel.cubin");
    Ok(hex::encode(Sha256::digest(std::fs::read(path)?)))
}

async fn owned_left(client: &Client, selector: &str) -> anyhow::Result<usize> {
    let lp = ListParams::default().labels(selector);
    Ok(Api::<Job>::all(client.clone()).list(&lp).await?.items.len()
        + Api::<PersistentVolumeClaim>::all(client.clone())
            .list(&lp)
            .await?
            .items
            .len()
        + Api::<PersistentVolume>::all(client.clone())
            .list(&lp)
            .await?
            .items
            .len())
}

/// Waits until the ReadWriteOnce claim of `cache` on each real node in `ns`
/// exists and its fill Job succeeded, and checks that each fill pod ran on
/// the node of its claim (gkm's placement kept).
async fn filled_on_each_node(
    stack: &Stack,
    client: &Client,
    ns: &str,
    cache: &str,
) -> anyhow::Result<()> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    for node in [NODE, NODE2] {
        let claim = gkm_k8s_operator::names::node_claim(cache, node);
        let selector = format!(
            "gkm.io/node={},gkm.io/cache={}",
            gkm_k8s_operator::names::label_value(node),
            gkm_k8s_operator::names::label_value(cache)
        );
        stack
            .eventually(
                &format!("the fill Job of {ns}/{claim} succeeds on {node}"),
                TIMEOUT,
                || {
                    let (jobs, client, claim, selector) = (
                        jobs.clone(),
                        client.clone(),
                        claim.clone(),
                        selector.clone(),
                    );
                    async move {
                        let done = jobs
                            .list(&ListParams::default().labels(&selector))
                            .await?
                            .items
                            .into_iter()
                            .any(|j| j.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0);
                        let bound = Api::<PersistentVolumeClaim>::namespaced(client, ns)
                            .get_opt(&claim)
                            .await?
                            .is_some();
                        Ok((done && bound).then_some(()))
                    }
                },
            )
            .await?;
        let fill_pods = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        assert!(!fill_pods.is_empty(), "the fill pods of {cache} on {node}");
        for pod in fill_pods {
            let ran_on = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            assert_eq!(ran_on, Some(node), "{}", pod.name_any());
        }
    }
    Ok(())
}

/// Applies a DaemonSet in `ns` labelled for mutation whose pods claim
/// `cache` by name, and checks that each pod's claim was rewritten to its
/// node's claim and that its container read the kernel (`sha`).
async fn daemonset_reads_node_claims(
    stack: &Stack,
    client: &Client,
    ns: &str,
    cache: &str,
    sha: &str,
) -> anyhow::Result<()> {
    let app = format!("{cache}-readers");
    let daemonset = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": app, "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app, "gkm.io/pvc-mutation": "true"}},
                "spec": {
                    "nodeSelector": {"gkm.io/real-node": "true"},
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "triton", "image": gkm_testenv::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c",
                            "sha256sum /cache/*/add_kernel.cubin; echo DONE; exec sleep 100000"],
                        "volumeMounts": [{"name": "kernels", "mountPath": "/cache", "readOnly": true}],
                    }],
                    "volumes": [{"name": "kernels", "persistentVolumeClaim": {"claimName": cache}}],
                },
            },
        },
    });
    stack.plane.apply_object(&daemonset, false).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = format!("app={app}");
    let readers = stack
        .eventually(
            &format!("a running {app} pod on each real node"),
            TIMEOUT,
            || {
                let (pods, selector) = (pods.clone(), selector.clone());
                async move {
                    let list = pods
                        .list(&ListParams::default().labels(&selector))
                        .await?
                        .items;
                    let running = list
                        .iter()
                        .filter(|p| {
                            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                        })
                        .count();
                    Ok((running == 2).then_some(list))
                }
            },
        )
        .await?;
    for pod in &readers {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let claim = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .and_then(|v| v.iter().find_map(|v| v.persistent_volume_claim.clone()))
            .map(|c| c.claim_name)
            .unwrap_or_default();
        assert_eq!(
            claim,
            gkm_k8s_operator::names::node_claim(cache, &node),
            "{}",
            pod.name_any()
        );
        let name = pod.name_any();
        let log = stack
            .eventually(&format!("{ns}/{name} prints the kernel"), TIMEOUT, || {
                let (pods, name) = (pods.clone(), name.clone());
                async move {
                    let log = pod_log(&pods, &name, "triton").await?;
                    Ok(log.contains("DONE").then_some(log))
                }
            })
            .await?;
        assert!(
            log.contains(&format!("{sha}  /cache/{KERNEL_DIR}/add_kernel.cubin")),
            "{name} on {node}: {log}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn pvc_delivery_on_a_real_node() -> anyhow::Result<()> {
    let tmp = gkm_testenv::temp_dir()?;
    let controllers = [
        "job-controller",
        "persistentvolume-binder-controller",
        "persistentvolumeclaim-protection-controller",
        "persistentvolume-protection-controller",
        // Lifts the not-ready taint once a kubelet reports Ready, so the
        // scheduler places the fill Jobs' pods.
        "node-lifecycle-controller",
        "daemonset-controller",
    ];
    let mut stack = Stack::start_with_controllers(tmp.path(), Vec::new(), &controllers).await?;
    let operator_image = TestImage::busybox(&[JOB_IMAGE])?
        .with_binary("/usr/bin/gkm-operator", &workspace_binary("gkm-operator")?)?
        .with_entrypoint(&["/usr/bin/gkm-operator"]);
    // Like any image of it, with the system's CA certificates (the registry
    // client loads them even for a plain-HTTP registry).
    let operator_image = operator_image.with_file(
        "/etc/ssl/certs/ca-certificates.crt",
        std::path::Path::new("/etc/ssl/certs/ca-certificates.crt"),
    )?;
    // NODE has a GPU of every fleet target too, so that each fleet cache
    // fits a node and its claim is filled.
    for (node, inventory) in [
        (NODE, support::fleet_inventory()),
        (NODE2, "gpus:\n- profile: T4\n".to_string()),
    ] {
        stack
            .add_real_node(SimulatedNode::new(node, &inventory))
            .await?;
        stack
            .real_node(node)
            .ok_or_else(|| anyhow::anyhow!("no real node {node}"))?
            .import_image(&operator_image)?;
    }
    let _scheduler = Scheduler::start(
        &stack.plane,
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n",
    )?;
    let client = stack.plane.client().await?;
    for ns in ["team-a", "team-b", "team-c"] {
        stack.plane.ensure_namespace(ns).await?;
    }
    // A StorageClass without a provisioner: the operator makes the volumes.
    stack
        .plane
        .apply_object(
            &json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                    "metadata": {"name": CLASS}, "provisioner": "kubernetes.io/no-provisioner",
                    "volumeBindingMode": "Immediate"}),
            false,
        )
        .await?;
    let (key, image, _digest) = stack
        .push_signed_fixture(
            &tmp.path().join("keys/release"),
            "triton-vector-add-cuda-sm75",
            "gkm/vector-add",
            "cuda",
        )
        .await?;
    // The directory --pvc-volume-dir names exists on the nodes, as an
    // administrator makes it; the operator makes each volume's directory in
    // it, owned by the non-root fill user.
    let volumes = tmp.path().join("volumes");
    std::fs::create_dir_all(&volumes)?;
    let webhook_port = gkm_testenv::free_port()?;
    let policy = tmp.path().join("default-policy.yaml");
    std::fs::write(
        &policy,
        serde_yaml::to_string(&json!({"signers": [{"key": {"publicKey": key.public_pem}}]}))?,
    )?;
    stack.set_args(
        vec![
            "--resolve-interval=2s".into(),
            format!("--default-policy={}", policy.display()),
            format!("--job-image={JOB_IMAGE}"),
            "--job-image-pull-policy=Never".into(),
            // The test registry listens on the host's loopback.
            "--job-host-network".into(),
            format!("--pvc-volume-dir={}", volumes.display()),
            // The apiserver calls the webhook on loopback, trusting the
            // operator's self-issued CA from the configuration's caBundle.
            format!("--webhook-listen=127.0.0.1:{webhook_port}"),
            format!("--webhook-url=https://127.0.0.1:{webhook_port}"),
        ],
        vec!["--resync=2s".into(), "--gc-grace=0s".into()],
    );
    stack.start_gkm()?;
    let sha = kernel_sha()?;

    // --- ROX GKMCache, in GKM's shape (no signature of its own: the
    // operator's default policy), with a podTemplate.
    let cache = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "vector-add", "namespace": "team-a"},
        "spec": {
            "image": image, "storageClassName": CLASS,
            "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
            "podTemplate": {
                "metadata": {"labels": {"team": "ml"}, "annotations": {"owner": "ml-infra"}},
                "spec": {"nodeSelector": {"gkm.io/real-node": "true"},
                         "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]},
            },
        },
    });
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), "team-a");
    stack.plane.apply_object(&cache, false).await?;
    let job = stack
        .eventually("the team-a fill Job succeeds", TIMEOUT, || {
            job_succeeded(&client, "team-a")
        })
        .await?;
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "team-a")
        .get("vector-add")
        .await?;
    assert_eq!(
        pvc.spec.as_ref().and_then(|s| s.access_modes.clone()),
        Some(vec!["ReadOnlyMany".to_string()])
    );
    let job_pod = Api::<Pod>::namespaced(client.clone(), "team-a")
        .list(&ListParams::default().labels(&format!("job-name={}", job.name_any())))
        .await?
        .items
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("the fill Job has no pod"))?;
    let pod_spec = job_pod.spec.clone().unwrap_or_default();
    // The fill runs as a non-root user (Pod Security `restricted`) and
    // still writes the gkm-made hostPath volume.
    let context = pod_spec.security_context.clone().unwrap_or_default();
    assert_eq!(context.run_as_non_root, Some(true), "{context:?}");
    assert_eq!(
        context.run_as_user,
        Some(gkm_k8s_operator::names::FILL_UID),
        "{context:?}"
    );
    assert!(
        [Some(NODE), Some(NODE2)].contains(&pod_spec.node_name.as_deref()),
        "scheduled onto a real node by the template's nodeSelector: {:?}",
        pod_spec.node_name
    );
    assert_eq!(
        pod_spec
            .node_selector
            .and_then(|s| s.get("gkm.io/real-node").cloned())
            .as_deref(),
        Some("true")
    );
    assert!(
        pod_spec
            .tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some("gpu")),
        "the template's toleration reaches the Job's pod"
    );
    assert_eq!(job_pod.labels().get("team").map(String::as_str), Some("ml"));
    assert_eq!(
        job_pod.labels().get("gkm.io/cache").map(String::as_str),
        Some("vector-add")
    );
    let job_log = pod_log(
        &Api::namespaced(client.clone(), "team-a"),
        &job_pod.name_any(),
        "fill",
    )
    .await?;
    assert!(
        job_log.contains("filled /cache from"),
        "the fill container's log:\n{job_log}"
    );

    let status = stack
        .eventually("GKMCache team-a/vector-add Extracted", TIMEOUT, || {
            let caches = caches.clone();
            async move {
                let c = caches.get("vector-add").await?;
                Ok(c.status.filter(|s| s.state == Some(CacheState::Extracted)))
            }
        })
        .await?;
    let pvc_status = status.pvc_status.unwrap_or_default();
    assert_eq!(
        pvc_status.get("team-a").and_then(|p| p.pvc_name.as_deref()),
        Some("vector-add"),
        "{pvc_status:?}"
    );
    // The claim serves the digest's tree through the `current` link a
    // refill switches in one rename.
    let team_a_dir = volumes.join(gkm_k8s_operator::names::volume(
        &gkm_k8s_api::cache_object::CacheKey::namespaced("team-a", "vector-add"),
        "team-a",
        None,
    ));
    let current = std::fs::read_link(team_a_dir.join(".gkm/current"))?;
    assert!(
        team_a_dir
            .join(".gkm")
            .join(&current)
            .join(KERNEL_DIR)
            .is_dir(),
        "{} serves {}",
        team_a_dir.display(),
        current.display()
    );
    let log = read_claim(&stack, &client, "team-a", "reader", "vector-add").await?;
    assert!(log.contains(KERNEL_DIR), "{log}");
    assert!(
        log.contains(&format!("{sha}  /cache/{KERNEL_DIR}/add_kernel.cubin")),
        "{log}"
    );
    assert!(
        !log.contains("io.triton"),
        "the image layout stays out of the claim: {log}"
    );
    stack
        .eventually("the cache counts the reader (Running)", TIMEOUT, || {
            let caches = caches.clone();
            async move {
                let c = caches.get("vector-add").await?;
                Ok(c.status.filter(|s| {
                    s.state == Some(CacheState::Running) && s.counts.pod_running_cnt == 1
                }))
            }
        })
        .await?;

    // --- ClusterGKMCache: a claim per workload namespace, following the list.
    let cluster = |namespaces: serde_json::Value| {
        json!({
            "apiVersion": "gkm.io/v1alpha1", "kind": "ClusterGKMCache",
            "metadata": {"name": "shared-add"},
            "spec": {"image": image, "storageClassName": CLASS, "accessModes": ["ReadOnlyMany"],
                     "workloadNamespaces": namespaces,
                     "podTemplate": {"spec": {"nodeSelector": {"gkm.io/real-node": "true"}}}},
        })
    };
    let clusters: Api<ClusterGKMCache> = Api::all(client.clone());
    stack
        .plane
        .apply_object(&cluster(json!(["team-b", "team-c"])), false)
        .await?;
    for ns in ["team-b", "team-c"] {
        stack
            .eventually(&format!("the {ns} fill Job succeeds"), TIMEOUT, || {
                job_succeeded(&client, ns)
            })
            .await?;
        let log = read_claim(&stack, &client, ns, "reader", "shared-add").await?;
        assert!(
            log.contains(&format!("{sha}  /cache/{KERNEL_DIR}/add_kernel.cubin")),
            "{ns}: {log}"
        );
    }
    stack
        .plane
        .apply_object(&cluster(json!(["team-b", "team-c", "team-d"])), false)
        .await?;
    stack
        .eventually(
            "a missing workload namespace shows NoNamespace",
            TIMEOUT,
            || {
                let clusters = clusters.clone();
                async move {
                    let c = clusters.get("shared-add").await?;
                    Ok(c.status
                        .filter(|s| s.state == Some(CacheState::NoNamespace)))
                }
            },
        )
        .await?;
    stack.plane.ensure_namespace("team-d").await?;
    stack
        .eventually("the team-d fill Job succeeds", TIMEOUT, || {
            job_succeeded(&client, "team-d")
        })
        .await?;
    let log = read_claim(&stack, &client, "team-d", "reader", "shared-add").await?;
    assert!(
        log.contains(&format!("{sha}  /cache/{KERNEL_DIR}/add_kernel.cubin")),
        "team-d: {log}"
    );

    // --- ReadWriteOnce: a claim per node, each filled by a Job pinned to it;
    // a DaemonSet labelled for mutation gets each pod's claim rewritten by
    // the webhook the apiserver calls.
    let rwo = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "rwo-add", "namespace": "team-a"},
        "spec": {"image": image, "storageClassName": CLASS},
    });
    stack.plane.apply_object(&rwo, false).await?;
    filled_on_each_node(&stack, &client, "team-a", "rwo-add").await?;
    daemonset_reads_node_claims(&stack, &client, "team-a", "rwo-add", &sha).await?;
    // GKM's cluster-scoped ReadWriteOnce shape: a ClusterGKMCache's node
    // claims in its workload namespace, served by the same webhook.
    let shared_rwo = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "ClusterGKMCache",
        "metadata": {"name": "shared-rwo"},
        "spec": {"image": image, "storageClassName": CLASS, "workloadNamespaces": ["team-b"]},
    });
    stack.plane.apply_object(&shared_rwo, false).await?;
    filled_on_each_node(&stack, &client, "team-b", "shared-rwo").await?;
    daemonset_reads_node_claims(&stack, &client, "team-b", "shared-rwo", &sha).await?;
    let pods_a: Api<Pod> = Api::namespaced(client.clone(), "team-a");
    // A labelled pod with no node to read, or on a node without a claim, is refused.
    let mut unpinned = claim_reader("team-a", "unpinned", "rwo-add")?;
    unpinned.metadata.labels =
        Some([("gkm.io/pvc-mutation".to_string(), "true".to_string())].into());
    if let Some(spec) = unpinned.spec.as_mut() {
        spec.node_name = None;
    }
    let refused = pods_a.create(&PostParams::default(), &unpinned).await;
    let message = format!("{:?}", refused.err());
    assert!(message.contains("cannot be determined"), "{message}");
    if let Some(spec) = unpinned.spec.as_mut() {
        spec.node_name = Some("no-such-node".into());
    }
    let refused = pods_a.create(&PostParams::default(), &unpinned).await;
    let message = format!("{:?}", refused.err());
    assert!(
        message.contains("node no-such-node has no claim of cache rwo-add"),
        "{message}"
    );
    // Unlabelled pods never reach the webhook: this one is created as written.
    let mut plain = claim_reader("team-a", "plain", "rwo-add")?;
    if let Some(spec) = plain.spec.as_mut() {
        spec.node_name = Some("no-such-node".into());
    }
    let created = pods_a.create(&PostParams::default(), &plain).await?;
    assert_eq!(
        created
            .spec
            .and_then(|s| s.volumes)
            .and_then(|v| v.into_iter().find_map(|v| v.persistent_volume_claim))
            .map(|c| c.claim_name)
            .as_deref(),
        Some("rwo-add")
    );
    pods_a
        .delete("plain", &DeleteParams::default().grace_period(0))
        .await?;

    // --- A moved tag: the claims are refilled from the new digest, and pods
    // started on the old content count as outdated.
    let moved = tmp.path().join("moved-cache");
    copy_tree(&fixture("triton-vector-add-cuda-sm75"), &moved)?;
    std::fs::remove_dir_all(moved.join(UTILS_DIR))?;
    let (_, new_digest) = stack
        .push_signed_cache(&moved, "gkm/vector-add", "cuda", &key)
        .await?;
    let refilled = stack
        .eventually(
            "the cluster cache is refilled and its readers outdated",
            TIMEOUT,
            || {
                let clusters = clusters.clone();
                let new_digest = new_digest.clone();
                async move {
                    let c = clusters.get("shared-add").await?;
                    Ok(c.status.filter(|s| {
                        s.resolved_digest.as_deref() == Some(new_digest.as_str())
                            && s.state == Some(CacheState::Outdated)
                            && s.counts.pod_outdated_cnt == 3
                    }))
                }
            },
        )
        .await?;
    assert_eq!(refilled.counts.pod_running_cnt, 0, "{:?}", refilled.counts);
    let log = read_claim(&stack, &client, "team-b", "late-reader", "shared-add").await?;
    assert!(
        log.contains(KERNEL_DIR) && !log.contains(UTILS_DIR),
        "a pod started after the refill reads the new digest's tree: {log}"
    );

    // --- Deleting while in use: Deleting until the reader goes; an operator
    // restart changes nothing; then nothing is left.
    caches
        .delete("vector-add", &DeleteParams::default())
        .await?;
    stack
        .eventually("the deleted cache shows Deleting", TIMEOUT, || {
            let caches = caches.clone();
            async move {
                let c = caches.get_opt("vector-add").await?;
                Ok(c.and_then(|c| c.status)
                    .filter(|s| s.state == Some(CacheState::Deleting)))
            }
        })
        .await?;
    stack.kill_operator();
    stack.start_operator()?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let selector = "gkm.io/cache=vector-add,gkm.io/cache-namespace=team-a";
    assert!(
        caches.get_opt("vector-add").await?.is_some(),
        "held while a pod uses its claim"
    );
    assert!(
        owned_left(&client, selector).await? >= 2,
        "claim and volume kept while in use"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team-a");
    pods.delete("reader", &DeleteParams::default().grace_period(0))
        .await?;
    stack
        .eventually("the cache and everything it made are gone", TIMEOUT, || {
            let (caches, client) = (caches.clone(), client.clone());
            async move {
                let gone = caches.get_opt("vector-add").await?.is_none()
                    && owned_left(&client, selector).await? == 0;
                Ok(gone.then_some(()))
            }
        })
        .await?;
    let dirs: Vec<_> = std::fs::read_dir(&volumes)?
        .filter_map(|e| e.ok())
        .collect();
    let deleted = gkm_k8s_api::cache_object::CacheKey::namespaced("team-a", "vector-add");
    let deleted_dir = volumes.join(gkm_k8s_operator::names::volume(&deleted, "team-a", None));
    assert!(
        !deleted_dir.exists(),
        "{} is removed",
        deleted_dir.display()
    );
    assert_eq!(
        dirs.len(),
        7,
        "only the volume directories of the other caches remain (three namespaces, 2 × two nodes)"
    );

    // --- Every fleet target through a ReadOnlyMany claim: real Triton
    // reuses what a container read from each claim, compiling nothing.
    let fleet_began = std::time::Instant::now();
    let fleet = support::push_signed_fleet(&stack, &key).await?;
    support::apply_fleet_caches(
        &client,
        "team-c",
        &fleet,
        &json!({"storageClassName": CLASS, "accessModes": ["ReadOnlyMany"]}),
    )
    .await?;
    let fleet_caches: Api<GKMCache> = Api::namespaced(client.clone(), "team-c");
    for pushed in &fleet {
        let name = support::cache_name(&pushed.target);
        stack
            .eventually(&format!("team-c/{name} filled"), TIMEOUT, || {
                let (caches, name) = (fleet_caches.clone(), name.clone());
                async move {
                    let c = caches.get(&name).await?;
                    Ok(c.status.filter(|s| s.state == Some(CacheState::Extracted)))
                }
            })
            .await?;
    }
    let volumes: Vec<_> = fleet
        .iter()
        .map(|p| {
            let claim = support::cache_name(&p.target);
            (
                &p.target,
                json!({"persistentVolumeClaim": {"claimName": claim, "readOnly": true}}),
            )
        })
        .collect();
    let out = tmp.path().join("fleet-copied");
    let pod = support::fleet_reader("team-c", "fleet", Some(NODE), &out, &volumes, None)?;
    let targets: Vec<_> = fleet.iter().map(|p| &p.target).collect();
    let pods_c: Api<Pod> = Api::namespaced(client.clone(), "team-c");
    let reports =
        support::triton_reuses_what_the_pod_read(&pods_c, &pod, &out, &targets, TIMEOUT).await?;
    assert_eq!(reports.len(), 11, "{reports:#?}");
    eprintln!(
        "the fleet through ReadOnlyMany claims: {:.1}s",
        fleet_began.elapsed().as_secs_f64()
    );
    stack.check_running()?;
    Ok(())
}
