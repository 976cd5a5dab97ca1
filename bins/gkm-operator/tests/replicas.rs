//! `gkm-operator` as it is deployed: two replicas with `--leader-elect`,
//! running as the `gkm-operator` ServiceAccount with the shipped RBAC against
//! a real kube-apiserver. One leads and reconciles, the other stands by
//! ready; SIGTERM stops the leader cleanly and the standby takes over at once.
//! Also what a user sees for bad flags.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gkm_testenv::{ControlPlane, Process, free_port, http_get as get};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

const SYSTEM: &str = "gkm-system";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The sum of the samples `name` (with any labels) on `/metrics`; `None`
/// when there is none.
async fn metric(port: u16, name: &str) -> Option<f64> {
    let (_, body) = get(port, "/metrics").await?;
    body.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?.1,
                None => rest.strip_prefix(' ')?,
            };
            value.parse::<f64>().ok()
        })
        .reduce(|a, b| a + b)
}

/// Polls `probe` every 100 ms until it holds, failing after `limit` or when
/// `process` exits; returns how long it took.
async fn until<F, Fut>(
    process: &mut Process,
    what: &str,
    limit: Duration,
    mut probe: F,
) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let began = Instant::now();
    loop {
        process.check_running()?;
        if probe().await {
            return Ok(began.elapsed());
        }
        if began.elapsed() > limit {
            anyhow::bail!(
                "{what}: not within {limit:?}; log:\n{}",
                process.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn replica(dir: &Path, kubeconfig: &Path, identity: &str, port: u16) -> anyhow::Result<Process> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-operator"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--leader-elect")
        .arg(format!("--leader-identity={identity}"))
        .arg("--lease-duration=4s")
        .arg(format!("--metrics-addr=127.0.0.1:{port}"))
        .env("GKM_LOG", "info");
    Process::spawn(identity, cmd, &dir.join(format!("{identity}.log")))
}

async fn holder(client: &kube::Client) -> anyhow::Result<Option<String>> {
    let lease = Api::<Lease>::namespaced(client.clone(), SYSTEM)
        .get("gkm-operator")
        .await?;
    Ok(lease.spec.and_then(|s| s.holder_identity))
}

#[tokio::test]
async fn one_replica_leads_and_a_clean_stop_hands_over() -> anyhow::Result<()> {
    let plane = ControlPlane::shared().await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    plane
        .apply_file(&deploy_dir().join("namespace.yaml"))
        .await?;
    plane
        .apply_file(&deploy_dir().join("rbac/operator.yaml"))
        .await?;
    let kubeconfig = plane.kubeconfig_for_service_account(SYSTEM, "gkm-operator")?;
    let admin = plane.client().await?;
    let dir = gkm_testenv::temp_dir()?;

    // A cache for the controllers to reconcile.
    let apply = PatchParams::apply("gkm-test");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "replicas"}}))?;
    Api::<Namespace>::all(admin.clone())
        .patch("replicas", &apply, &Patch::Apply(&ns))
        .await?;
    let cache: gkm_k8s_api::crd::GKMCache = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "cache", "namespace": "replicas"},
        "spec": {"image": "registry.invalid/caches/triton:v1"},
    }))?;
    Api::<gkm_k8s_api::crd::GKMCache>::namespaced(admin.clone(), "replicas")
        .patch("cache", &apply, &Patch::Apply(&cache))
        .await?;

    let (port_a, port_b) = (free_port()?, free_port()?);
    let mut a = replica(dir.path(), &kubeconfig, "replica-a", port_a)?;
    let limit = Duration::from_secs(30);
    until(&mut a, "replica-a ready", limit, || async {
        get(port_a, "/readyz").await.is_some_and(|(s, _)| s == 200)
    })
    .await?;
    until(&mut a, "replica-a leads", limit, || async {
        metric(port_a, "gkm_leader").await == Some(1.0)
    })
    .await?;
    until(&mut a, "replica-a reconciles", limit, || async {
        metric(port_a, "gkm_operator_reconciles_total")
            .await
            .is_some_and(|n| n >= 1.0)
    })
    .await?;
    assert_eq!(holder(&admin).await?.as_deref(), Some("replica-a"));
    assert_eq!(get(port_a, "/healthz").await.map(|(s, _)| s), Some(200));

    // The second replica is ready (so rollouts proceed) but stands by.
    let mut b = replica(dir.path(), &kubeconfig, "replica-b", port_b)?;
    until(&mut b, "replica-b ready", limit, || async {
        get(port_b, "/readyz").await.is_some_and(|(s, _)| s == 200)
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    b.check_running()?;
    assert_eq!(
        metric(port_b, "gkm_leader").await,
        Some(0.0),
        "{}",
        b.log_tail(20)
    );
    assert_eq!(
        metric(port_b, "gkm_operator_reconciles_total").await,
        Some(0.0)
    );
    assert_eq!(holder(&admin).await?.as_deref(), Some("replica-a"));

    // SIGTERM: the leader stops by itself, successfully, and releases the
    // Lease, so the standby takes over well within the lease duration.
    let stopped = Instant::now();
    let exit = a.terminate(Duration::from_secs(15))?;
    assert!(exit.success(), "replica-a exited with {exit}");
    let took = until(
        &mut b,
        "replica-b takes over",
        Duration::from_secs(4),
        || async { metric(port_b, "gkm_leader").await == Some(1.0) },
    )
    .await?;
    eprintln!(
        "SIGTERM to replica-a exited in {:?}; replica-b led {took:?} later",
        stopped.elapsed() - took
    );
    assert_eq!(holder(&admin).await?.as_deref(), Some("replica-b"));
    until(&mut b, "replica-b reconciles", limit, || async {
        metric(port_b, "gkm_operator_reconciles_total")
            .await
            .is_some_and(|n| n >= 1.0)
    })
    .await?;
    Ok(())
}

#[test]
fn bad_flags_are_named() -> anyhow::Result<()> {
    let run = |args: &[&str]| -> anyhow::Result<(bool, String)> {
        let out = Command::new(env!("CARGO_BIN_EXE_gkm-operator"))
            .args(args)
            .output()?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    let (ok, err) = run(&["--resolve-interval=soon"])?;
    assert!(!ok);
    assert!(err.contains("\"soon\" is not a duration"), "{err}");
    // Out of range or overflowing: an error naming the flag, never a panic.
    for (flag, says) in [
        ("--resolve-interval=0s", "--resolve-interval must be from"),
        ("--resolve-interval=9999999999999999h", "is not a duration"),
        (
            "--reverify-interval=18446744073709551615m",
            "is not a duration",
        ),
        (
            "--allowed-signature-modes=Enforce,Sometimes",
            "\"Sometimes\" is not a signature mode: use Enforce, Audit or Off",
        ),
    ] {
        let (ok, err) = run(&[flag])?;
        assert!(!ok, "{flag}");
        assert!(err.contains(says), "{flag}: {err}");
        assert!(!err.contains("panicked"), "{flag}: {err}");
    }
    let (ok, err) = run(&["--metrics-addr=everywhere"])?;
    assert!(!ok);
    assert!(err.contains("--metrics-addr"), "{err}");
    let (ok, err) = run(&["--kubeconfig=/nonexistent/kubeconfig"])?;
    assert!(!ok);
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
    Ok(())
}
