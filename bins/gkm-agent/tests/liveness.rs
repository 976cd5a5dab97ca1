//! `gkm-agent`'s `/healthz` says when its passes stop: against a real
//! kube-apiserver of its own, which the test freezes (SIGSTOP: it accepts
//! connections and never answers, as a wedged apiserver or a dead network
//! path does) while the agent has a report to write. Its health fails
//! within `--stall-after`, so the kubelet would restart it, and comes back
//! once the apiserver answers again.

use std::process::Command;
use std::time::Duration;

use gkm_k8s_api::cache_object::CacheKey;
use gkm_k8s_api::crd::{GKMCache, GKMCacheNode};
use gkm_k8s_node::mount_records::{MountRecord, MountRecords, PodRef};
use gkm_oci::Digest;
use gkm_testenv::{ControlPlane, Process, http_get};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

mod support;

use support::{until, until_some};

/// Sends SIGSTOP to a process, and SIGCONT when dropped (or on `resume`).
struct Frozen(u32);

impl Frozen {
    fn freeze(pid: u32) -> Frozen {
        // SAFETY: kill(2) with a pid this test started.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

async fn health(port: u16) -> Option<(u16, String)> {
    tokio::time::timeout(Duration::from_secs(5), http_get(port, "/healthz"))
        .await
        .ok()
        .flatten()
}

#[tokio::test(flavor = "multi_thread")]
async fn health_fails_when_passes_stop_and_recovers_when_they_resume() -> anyhow::Result<()> {
    let plane = ControlPlane::start().await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    let (node, namespace) = ("liveness-node", "liveness");
    plane.ensure_node(node).await?;
    plane.ensure_namespace(namespace).await?;
    let client = plane.client().await?;
    let dir = gkm_testenv::temp_dir()?;
    let gpus = dir.path().join("gpus.yaml");
    std::fs::write(&gpus, "gpus:\n  - profile: T4\n")?;
    let store = dir.path().join("store");

    // A cache this node reports (refused: not verified, no registry needed).
    let digest = format!("sha256:{}", "7".repeat(64));
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), namespace);
    let cache: GKMCache = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "c", "namespace": namespace},
        "spec": {"image": "registry.invalid/c:v1"},
    }))?;
    caches
        .patch("c", &PatchParams::apply("gkm-test"), &Patch::Apply(&cache))
        .await?;
    support::publish_release(
        &client,
        namespace,
        "c",
        "registry.invalid/c:v1",
        &digest,
        Err("no signature"),
    )
    .await?;

    let port = gkm_testenv::free_port()?;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-agent"));
    cmd.arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
        .arg(format!("--node-name={node}"))
        .arg(format!("--store={}", store.display()))
        .arg(gkm_testenv::AGENT_KEEP_FREE_ARG)
        .arg(format!("--simulate={}", gpus.display()))
        .arg(format!("--metrics-addr=127.0.0.1:{port}"))
        .arg("--resync=1s")
        .arg("--start-jitter=0s")
        .arg("--stall-after=4s");
    let mut agent = Process::spawn("agent-liveness", cmd, &dir.path().join("agent.log"))?;
    let reports: Api<GKMCacheNode> = Api::namespaced(client.clone(), namespace);
    until(
        &mut agent,
        "the node's report",
        Duration::from_secs(60),
        || {
            let reports = reports.clone();
            async move { Ok(reports.get_opt(node).await?.is_some()) }
        },
    )
    .await?;
    assert_eq!(health(port).await, Some((200, "ok\n".into())));

    // The apiserver stops answering, and a pod starts using an older digest
    // of the cache: the report must change, and the pass waits on the
    // apiserver.
    let frozen = Frozen::freeze(plane.pids()[0]);
    MountRecords::new(&store).record(&MountRecord {
        volume_id: "vol-1".into(),
        pod: PodRef {
            namespace: namespace.into(),
            name: "reader".into(),
            uid: None,
        },
        cache: CacheKey::namespaced(namespace, "c"),
        digest: Digest::of(b"older"),
        target_path: dir.path().join("target"),
        mount_path: None,
        published: jiff::Timestamp::now(),
    })?;
    let stalled = until_some(
        &mut agent,
        "/healthz failing with the apiserver frozen",
        Duration::from_secs(30),
        || async move {
            Ok(match health(port).await {
                Some((503, body)) => Some(body),
                _ => None,
            })
        },
    )
    .await?;
    assert!(stalled.contains("no agent pass has ended"), "{stalled}");

    // The apiserver answers again: passes resume, and so does health.
    drop(frozen);
    until(
        &mut agent,
        "/healthz recovering",
        Duration::from_secs(60),
        || async move { Ok(health(port).await == Some((200, "ok\n".into()))) },
    )
    .await?;
    agent.terminate(Duration::from_secs(15))?;
    Ok(())
}
