//! Whether a delivered cache was used, told per workload, on a real node
//! (kubelet, containerd, runc calling gkm's CSI driver, the agent and the
//! operator as their ServiceAccounts): real Triton 3.6 runs in Jobs on a
//! writable CSI view of a T4 cache that lacks two of the fixture's four
//! kernels, at the path the kernels were compiled at.
//!
//! - A Job compiling for the T4 hits the two kernels the cache holds and
//!   compiles the two it lacks: the node report and the cache's status count
//!   two new entries for `Job/warmup` and name both kernels, the cache is not
//!   `Inert`, and an Event on the Job names the cache and the count.
//! - A Job compiling for another GPU (sm80) hits nothing: its four new
//!   entries are more than the two the cache holds, and the cache is
//!   `Inert`, naming that Job.
//! - A Job on a read-only volume fails on its first miss and is never
//!   counted: a read-only view cannot see misses.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use gkm_k8s_api::crd::{GKMCache, GKMCacheNode, WorkloadUsage};
use gkm_local::{Stack, cosign, real_triton_pod};
use gkm_testenv::triton::{FleetTarget, TritonReport, fleet_target_named, key_dir};
use gkm_testenv::{copy_tree, pod_log};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(300);
const NODE: &str = "real-hits";
const NS: &str = "ml";
const CACHE: &str = "hits";
/// A target the cache holds no kernel for.
const OTHER_TARGET: &str = "cuda/80/32";

/// A Job on the real node running real Triton 3.6 over its cache `CACHE`
/// delivered through a writable CSI volume at the path `fixture`'s kernels
/// were compiled at ([`gkm_local::real_triton_pod`]), compiling the
/// fixture's kernels for `target`.
fn triton_job(name: &str, fixture: &FleetTarget, target: &str) -> anyhow::Result<Job> {
    job_of(name, fixture, target, false)
}

/// [`triton_job`], its volume read-only when `read_only` says so.
fn job_of(name: &str, fixture: &FleetTarget, target: &str, read_only: bool) -> anyhow::Result<Job> {
    let kernels = json!({"name": "kernels", "csi": {"driver": "csi.gkm.io", "readOnly": read_only,
        "volumeAttributes": {"csi.gkm.io/GKMCache": CACHE}}});
    let pod = real_triton_pod(NS, name, NODE, (fixture, target), (kernels, read_only))?;
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"backoffLimit": 0, "template": {"spec": pod.spec}},
    }))?)
}

/// The fixture without two of its kernels of different names: the tree at
/// `to`, and the removed kernels' (key directory, kernel name).
fn without_two_kernels(fixture: &FleetTarget, to: &Path) -> anyhow::Result<Vec<(String, String)>> {
    copy_tree(&fixture.fixture, to)?;
    let mut keys: Vec<String> = std::fs::read_dir(to)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    keys.sort();
    let mut removed: Vec<(String, String)> = Vec::new();
    for key in keys {
        let name = std::fs::read_dir(to.join(&key))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .find_map(|f| {
                let stem = f.strip_suffix(".json")?;
                (!stem.starts_with("__grp__")).then(|| stem.to_string())
            });
        if let Some(name) = name
            && removed.len() < 2
            && !removed.iter().any(|(_, n)| *n == name)
        {
            std::fs::remove_dir_all(to.join(&key))?;
            removed.push((key, name));
        }
    }
    anyhow::ensure!(
        removed.len() == 2,
        "{} has fewer than two kernel names",
        fixture.name
    );
    Ok(removed)
}

/// Runs the Job `job` to its end and returns the Triton report its pod
/// printed; fails unless it succeeded.
async fn run_job(client: &kube::Client, job: Job) -> anyhow::Result<TritonReport> {
    let (name, phase, log) = end_job(client, job).await?;
    anyhow::ensure!(
        phase.as_deref() == Some("Succeeded"),
        "Job {name}'s pod {phase:?}:\n{log}"
    );
    serde_json::from_str(log.trim()).map_err(|e| anyhow::anyhow!("{e}: {log}"))
}

/// Runs the Job `job` to its end: its name, its pod's phase and log.
async fn end_job(
    client: &kube::Client,
    job: Job,
) -> anyhow::Result<(String, Option<String>, String)> {
    let name = job.metadata.name.clone().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    jobs.create(&PostParams::default(), &job).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let selector = ListParams::default().labels(&format!("job-name={name}"));
    let pod = gkm_testenv::eventually(&format!("the pod of Job {name} ended"), TIMEOUT, || {
        let (pods, selector) = (&pods, &selector);
        async move {
            let list = pods.list(selector).await?;
            Ok(list.items.into_iter().find(|p| {
                matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
            }))
        }
    })
    .await?;
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let log = pod_log(&pods, &pod_name, "main").await?;
    eprintln!("{name}:\n{log}");
    let phase = pod.status.and_then(|s| s.phase);
    Ok((name, phase, log))
}

/// The cache's status entry for `workload`, once it counts `pods` pods.
async fn counted(
    stack: &Stack,
    caches: &Api<GKMCache>,
    workload: &str,
) -> anyhow::Result<(WorkloadUsage, GKMCache)> {
    stack
        .eventually(
            &format!("{workload} counted in the cache's status"),
            TIMEOUT,
            || async {
                let cache = caches.get(CACHE).await?;
                let usage = cache
                    .status
                    .as_ref()
                    .and_then(|s| s.workloads.as_ref())
                    .and_then(|w| w.iter().find(|u| u.workload == workload).cloned());
                Ok(usage.map(|u| (u, cache)))
            },
        )
        .await
}

/// The cache's condition `type_`: its status, reason and message.
fn condition(cache: &GKMCache, type_: &str) -> Option<(String, String, String)> {
    let conditions = cache.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_workloads_misses_are_counted_named_and_told_on_a_real_node() -> anyhow::Result<()> {
    let tmp = gkm_testenv::temp_dir()?;
    let mut stack = Stack::start_with_real_t4(tmp.path(), NODE).await?;
    stack.set_args(
        // The cache's own signer counts in its namespace.
        vec![
            "--resolve-interval=2s".to_string(),
            format!("--tenant-signer-namespaces={NS}"),
        ],
        vec!["--resync=2s".to_string()],
    );
    stack.start_csi(NODE)?;
    stack.start_agent(NODE)?;
    stack.start_operator()?;
    stack.plane.ensure_namespace(NS).await?;
    let client = stack.plane.client().await?;

    // The T4's fixture, two kernels short, signed.
    let fixture = fleet_target_named("cuda-75-32")?;
    let tree = tmp.path().join("partial");
    let removed = without_two_kernels(&fixture, &tree)?;
    let key = cosign::generate_key_pair(&tmp.path().join("keys"))?;
    let (image, digest) = stack
        .push_signed_cache(&tree, "gkm/hits", "t4", &key)
        .await?;
    let cache: GKMCache = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": CACHE, "namespace": NS},
        "spec": {"image": image,
                 "signature": {"signers": [{"key": {"publicKey": key.public_pem}}]}},
    }))?;
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), NS);
    caches.create(&PostParams::default(), &cache).await?;
    let extracted = stack
        .eventually("the cache extracted on the node", TIMEOUT, || async {
            let cache = caches.get(CACHE).await?;
            let ready = condition(&cache, "Ready").is_some_and(|(s, _, _)| s == "True");
            Ok(ready.then_some(()))
        })
        .await;
    if let Err(e) = extracted {
        anyhow::bail!(
            "{e:#}\nthe cache: {:#?}\nthe agent's log:\n{}",
            caches.get(CACHE).await?.status,
            stack.log_tail("agent", Some(NODE), 40)
        );
    }
    // Before any pod ends, nothing is counted, and the status says what
    // can be.
    let (status, reason, message) = condition(&caches.get(CACHE).await?, "Inert")
        .ok_or_else(|| anyhow::anyhow!("no Inert condition"))?;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NotCounted"),
        "{message}"
    );

    // The T4's workload: two hits, two misses, compiled into its view.
    let report = run_job(&client, triton_job("warmup", &fixture, &fixture.target)?).await?;
    assert_eq!(report.kernels.len(), fixture.kernels, "{report:#?}");
    let compiled: BTreeSet<String> = report
        .kernels
        .iter()
        .filter(|k| k.compiled)
        .map(|k| key_dir(&k.hash))
        .collect::<anyhow::Result<_>>()?;
    let missing: BTreeSet<String> = removed.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(
        compiled, missing,
        "Triton compiled what the cache lacks, and only that"
    );

    let (warmup, cache) = counted(&stack, &caches, "Job/warmup").await?;
    eprintln!("status.workloads: {warmup:#?}");
    let names: BTreeSet<&str> = warmup.new_entry_names.iter().map(String::as_str).collect();
    let expected: BTreeSet<&str> = removed.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(warmup.namespace, NS);
    assert_eq!(warmup.kind, "triton");
    assert_eq!(
        (warmup.pods_ended, warmup.pods_compiling),
        (1, 1),
        "{warmup:#?}"
    );
    assert_eq!(warmup.new_entries, 2, "{warmup:#?}");
    assert_eq!(names, expected, "the new entries, by kernel name");
    assert_eq!(
        warmup.entries_delivered,
        Some(fixture.kernels as i64 - 2),
        "{warmup:#?}"
    );
    assert_eq!(warmup.nodes, Some(1));
    // Why: a kernel the cache holds no entry of at all is one to capture.
    let (add_key, add_name) = removed
        .iter()
        .find(|(_, name)| name == "add_kernel")
        .ok_or_else(|| anyhow::anyhow!("the fixture's add_kernel was not removed: {removed:?}"))?;
    assert!(
        warmup
            .reasons
            .iter()
            .any(|r| r == &format!("no cached entry of kernel {add_name}: capture this workload")),
        "{add_key}: {warmup:#?}"
    );
    let (status, reason, message) =
        condition(&cache, "Inert").ok_or_else(|| anyhow::anyhow!("no Inert condition"))?;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "WorkloadsHit"),
        "{message}"
    );

    // The node's report carries it for the digest it holds.
    let report: GKMCacheNode = Api::namespaced(client.clone(), NS).get(NODE).await?;
    let entry = report
        .status
        .as_ref()
        .and_then(|s| s.caches.as_ref()?.get(CACHE)?.get(&digest).cloned())
        .ok_or_else(|| anyhow::anyhow!("no report entry for {digest}: {report:#?}"))?;
    let on_node = entry.workloads.unwrap_or_default();
    assert!(
        on_node
            .iter()
            .any(|u| u.workload == "Job/warmup" && u.new_entries == 2),
        "{on_node:#?}"
    );

    // An Event on the Job names the cache and the count.
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let note = stack
        .eventually("an Event on Job warmup", TIMEOUT, || async {
            let list = events.list(&ListParams::default()).await?;
            Ok(list.items.into_iter().find_map(|e| {
                let regarding = e.regarding.as_ref()?;
                (regarding.kind.as_deref() == Some("Job")
                    && regarding.name.as_deref() == Some("warmup")
                    && e.reason.as_deref() == Some("CompiledNewEntries"))
                .then(|| e.note.clone().unwrap_or_default())
            }))
        })
        .await?;
    eprintln!("the Event on Job/warmup: {note}");
    assert!(
        note.contains(&format!(
            "compiled 2 new triton entries that GKMCache {NS}/{CACHE}"
        )),
        "{note}"
    );
    for (_, name) in &removed {
        assert!(note.contains(name.as_str()), "{note}");
    }

    // The same workload on a read-only volume: Triton cannot write its
    // first miss and fails, and a read-only view counts nothing.
    let (_, phase, log) = end_job(
        &client,
        job_of("read-only", &fixture, &fixture.target, true)?,
    )
    .await?;
    assert_eq!(phase.as_deref(), Some("Failed"), "{log}");

    // A workload for another GPU compiles every kernel: more than the cache
    // holds, so the cache does not serve it, and its status says which.
    let other = run_job(&client, triton_job("other-gpu", &fixture, OTHER_TARGET)?).await?;
    assert_eq!(other.compiled, fixture.kernels, "{other:#?}");
    let (usage, cache) = counted(&stack, &caches, "Job/other-gpu").await?;
    assert_eq!(usage.new_entries, fixture.kernels as i64, "{usage:#?}");
    // Why: the kernels the cache holds were compiled for the T4, not sm80.
    assert!(
        usage
            .reasons
            .iter()
            .any(|r| r.ends_with("rebuild the cache for the workload's GPU")),
        "{usage:#?}"
    );
    let cache = if condition(&cache, "Inert").is_some_and(|(s, _, _)| s == "True") {
        cache
    } else {
        stack
            .eventually("the cache Inert", TIMEOUT, || async {
                let cache = caches.get(CACHE).await?;
                Ok(condition(&cache, "Inert")
                    .is_some_and(|(s, _, _)| s == "True")
                    .then_some(cache))
            })
            .await?
    };
    let (_, reason, message) =
        condition(&cache, "Inert").ok_or_else(|| anyhow::anyhow!("no Inert condition"))?;
    eprintln!("Inert: {message}");
    assert_eq!(reason, "WorkloadsCompile", "{message}");
    assert!(
        message.starts_with(&format!(
            "the last pod of Job/other-gpu in {NS} compiled {} new entries",
            fixture.kernels
        )),
        "{message}"
    );
    // The read-only Job, which ended before it, was never counted.
    let counted_workloads: Vec<&str> = cache
        .status
        .iter()
        .flat_map(|s| s.workloads.iter().flatten())
        .map(|u| u.workload.as_str())
        .collect();
    assert!(
        !counted_workloads.contains(&"Job/read-only"),
        "{counted_workloads:?}"
    );
    // Still delivered: an inert cache is one its workloads do not use.
    assert_eq!(
        condition(&cache, "Ready").map(|(s, _, _)| s),
        Some("True".to_string())
    );
    stack.check_running()?;
    Ok(())
}
