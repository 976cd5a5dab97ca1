//! `gkm-operator` as it is deployed: two replicas with `--leader-elect`,
//! running as the `gkm-operator` ServiceAccount with the shipped RBAC against
//! a real kube-apiserver. One leads and reconciles, the other stands by
//! ready; SIGTERM stops the leader cleanly and the standby takes over at once.
//! Every replica serves the pvc-mutation webhook with a certificate of one
//! shared CA, so a labelled pod is admitted whichever replica the apiserver
//! reaches, across a rolling update and a CA rotation; the webhook's
//! configuration is the chart's. Also what a user sees for bad flags.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gkm_k8s_operator::admission::{CONFIGURATION_NAME, Endpoint, certs, configuration, shared_ca};
use gkm_testenv::{ControlPlane, Process, free_port, http_get as get};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde::Deserialize as _;
use serde_json::json;

const SYSTEM: &str = "gkm-system";

fn deploy_dir() -> PathBuf {
    gkm_testenv::repo_root().join("deploy")
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

/// Waits until `probe` holds, failing after `limit` or when `process`
/// exits; returns how long it took.
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
    let waited = gkm_testenv::eventually(what, limit, || {
        let running = process.check_running();
        let holds = probe();
        async move {
            running?;
            Ok(holds.await.then_some(()))
        }
    })
    .await;
    match waited {
        Ok(()) => Ok(began.elapsed()),
        Err(e) if e.is::<gkm_testenv::TimedOut>() => {
            Err(e.context(format!("log:\n{}", process.log_tail(30))))
        }
        Err(e) => Err(e),
    }
}

fn replica(dir: &Path, kubeconfig: &Path, identity: &str, port: u16) -> anyhow::Result<Process> {
    replica_with(dir, kubeconfig, identity, port, &[])
}

fn replica_with(
    dir: &Path,
    kubeconfig: &Path,
    identity: &str,
    port: u16,
    args: &[String],
) -> anyhow::Result<Process> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-operator"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--leader-elect")
        .arg(format!("--leader-identity={identity}"))
        .arg("--lease-duration=4s")
        .arg(format!("--metrics-addr=127.0.0.1:{port}"))
        .args(args)
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
    let _serial = REPLICA_TESTS.lock().await;
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
        (
            "--job-image-pull-policy=Sometimes",
            "\"Sometimes\" is not an imagePullPolicy (Always, IfNotPresent or Never)",
        ),
    ] {
        let (ok, err) = run(&[flag])?;
        assert!(!ok, "{flag}");
        assert!(err.contains(says), "{flag}: {err}");
        assert!(!err.contains("panicked"), "{flag}: {err}");
    }
    for (flags, says) in [
        (
            [
                "--webhook-cert-validity=1h",
                "--webhook-service=gkm-system/gkm-operator-webhook:443",
            ],
            "--webhook-cert-validity must be at least",
        ),
        (
            [
                "--webhook-ca-check-interval=48h",
                "--webhook-service=gkm-system/gkm-operator-webhook:443",
            ],
            "--webhook-ca-check-interval must be from",
        ),
        (
            [
                "--webhook-service=gkm-operator-webhook",
                "--webhook-ca-check-interval=1m",
            ],
            "--webhook-service: \"gkm-operator-webhook\": not NAMESPACE/NAME:PORT",
        ),
    ] {
        let (ok, err) = run(&[&["--webhook-listen=127.0.0.1:0"], &flags[..]].concat())?;
        assert!(!ok, "{flags:?}");
        assert!(err.contains(says), "{flags:?}: {err}");
    }
    let (ok, err) = run(&["--tenant-signer-namespaces=team-a,Team B"])?;
    assert!(!ok);
    assert!(
        err.contains("--tenant-signer-namespaces: \"Team B\" is not a namespace name"),
        "{err}"
    );
    let (ok, err) = run(&["--metrics-addr=everywhere"])?;
    assert!(!ok);
    assert!(err.contains("--metrics-addr"), "{err}");
    let (ok, err) = run(&["--kubeconfig=/nonexistent/kubeconfig"])?;
    assert!(!ok);
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
    Ok(())
}

// --- The pvc-mutation webhook across replicas.

/// One test at a time runs replicas: they share the Lease, and the webhook
/// tests one cluster-wide configuration and one Secret.
static REPLICA_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The namespace the labelled pods are created in.
const TENANT: &str = "webhook-tenant";

/// What a Service does for the replicas' webhook ports: each TCP connection
/// goes to one backend, here the one the test picks; picking another closes
/// the connections open, so the apiserver's next call reaches the new one.
struct Front {
    port: u16,
    target: tokio::sync::watch::Sender<u16>,
    task: tokio::task::JoinHandle<()>,
}

impl Front {
    async fn start(first: u16) -> anyhow::Result<Front> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (target, routes) = tokio::sync::watch::channel(first);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut routes = routes.clone();
                let backend = *routes.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", backend)).await
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = routes.changed() => {}
                    }
                });
            }
        });
        Ok(Front { port, target, task })
    }

    fn route_to(&self, backend: u16) {
        self.target.send_replace(backend);
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The operator's namespace and RBAC, a tenant namespace, and no webhook
/// configuration or shared CA left by another test.
async fn webhook_ground(plane: &ControlPlane) -> anyhow::Result<(kube::Client, PathBuf)> {
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    plane
        .apply_file(&deploy_dir().join("namespace.yaml"))
        .await?;
    plane
        .apply_file(&deploy_dir().join("rbac/operator.yaml"))
        .await?;
    plane.ensure_namespace(TENANT).await?;
    let admin = plane.client().await?;
    // Pods run as a ServiceAccount (no controller-manager makes `default`).
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default", "namespace": TENANT}}))?;
    Api::<ServiceAccount>::namespaced(admin.clone(), TENANT)
        .patch(
            "default",
            &PatchParams::apply("gkm-test"),
            &Patch::Apply(&account),
        )
        .await?;
    let configs = Api::<MutatingWebhookConfiguration>::all(admin.clone());
    let secrets = Api::<Secret>::namespaced(admin.clone(), SYSTEM);
    let _ = configs
        .delete(CONFIGURATION_NAME, &DeleteParams::default())
        .await;
    let _ = secrets
        .delete(shared_ca::SECRET_NAME, &DeleteParams::default())
        .await;
    gkm_testenv::eventually(
        "the last test's webhook gone",
        Duration::from_secs(15),
        || async {
            let gone = configs.get_opt(CONFIGURATION_NAME).await?.is_none()
                && secrets.get_opt(shared_ca::SECRET_NAME).await?.is_none();
            Ok(gone.then_some(()))
        },
    )
    .await?;
    let kubeconfig = plane.kubeconfig_for_service_account(SYSTEM, "gkm-operator")?;
    Ok((admin, kubeconfig))
}

/// A replica serving the webhook on `hook_port`, reached at the front's URL.
fn webhook_replica(
    dir: &Path,
    kubeconfig: &Path,
    identity: &str,
    (metrics_port, hook_port): (u16, u16),
    front: &Front,
    extra: &[&str],
) -> anyhow::Result<Process> {
    let mut args = vec![
        format!("--webhook-listen=127.0.0.1:{hook_port}"),
        format!("--webhook-url=https://127.0.0.1:{}", front.port),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    replica_with(dir, kubeconfig, identity, metrics_port, &args)
}

async fn ready(process: &mut Process, port: u16) -> anyhow::Result<()> {
    until(process, "ready", Duration::from_secs(30), || async {
        get(port, "/readyz").await.is_some_and(|(s, _)| s == 200)
    })
    .await?;
    Ok(())
}

/// The CA bundle the apiserver trusts for the webhook (PEM), once it has one.
async fn ca_bundle(admin: &kube::Client) -> anyhow::Result<Option<String>> {
    let config = Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .get_opt(CONFIGURATION_NAME)
        .await?;
    Ok(config
        .and_then(|c| c.webhooks?.into_iter().next())
        .and_then(|w| w.client_config.ca_bundle)
        .map(|b| String::from_utf8_lossy(&b.0).into_owned()))
}

/// The shared CA's signing certificate.
async fn shared_ca_cert(admin: &kube::Client) -> anyhow::Result<String> {
    let secret = Api::<Secret>::namespaced(admin.clone(), SYSTEM)
        .get(shared_ca::SECRET_NAME)
        .await?;
    let data = secret.data.unwrap_or_default();
    let cert = data
        .get("ca.crt")
        .ok_or_else(|| anyhow::anyhow!("the shared CA Secret has no ca.crt"))?;
    Ok(String::from_utf8_lossy(&cert.0).into_owned())
}

/// Creates (dry run) `count` pods labelled for the webhook; returns why
/// each refused one was refused.
async fn refusals(admin: &kube::Client, count: usize, tag: &str) -> anyhow::Result<Vec<String>> {
    let pods = Api::<Pod>::namespaced(admin.clone(), TENANT);
    let mut refused = Vec::new();
    for i in 0..count {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("{tag}-{i}"),
                         "labels": {"gkm.io/pvc-mutation": "true"}},
            "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:v1"}]},
        }))?;
        let params = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        if let Err(e) = pods.create(&params, &pod).await {
            refused.push(e.to_string());
        }
    }
    Ok(refused)
}

/// Routes the front to each replica in turn and creates labelled pods;
/// fails naming every replica whose pods were refused.
async fn every_replica_admits(
    admin: &kube::Client,
    front: &Front,
    replicas: &[(&str, u16)],
    tag: &str,
) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    for (name, port) in replicas {
        front.route_to(*port);
        // Let the apiserver see its pooled connections closed, as it would
        // a Service endpoint going away, rather than write into one.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let refused = refusals(admin, 3, &format!("{tag}-{name}")).await?;
        if !refused.is_empty() {
            failed.push(format!("{name}: {}", refused.join("; ")));
        }
    }
    anyhow::ensure!(
        failed.is_empty(),
        "labelled pods refused:\n{}",
        failed.join("\n")
    );
    Ok(())
}

/// Waits until the configuration's bundle holds `cert`.
async fn bundle_holds(admin: &kube::Client, cert: &str) -> anyhow::Result<()> {
    let waited = gkm_testenv::eventually(
        "the webhook configuration's caBundle holding the CA",
        Duration::from_secs(15),
        || async {
            Ok(ca_bundle(admin)
                .await?
                .is_some_and(|b| b.contains(cert))
                .then_some(()))
        },
    )
    .await;
    if let Err(e) = waited {
        anyhow::bail!("{e}: {:?}", ca_bundle(admin).await?);
    }
    // The apiserver's own view of webhook configurations follows a watch.
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(())
}

#[tokio::test]
async fn replicas_share_one_webhook_ca_so_every_labelled_pod_is_admitted() -> anyhow::Result<()> {
    let _serial = REPLICA_TESTS.lock().await;
    let plane = ControlPlane::shared().await?;
    let (admin, kubeconfig) = webhook_ground(plane).await?;
    let dir = gkm_testenv::temp_dir()?;
    let (a_ports, b_ports) = ((free_port()?, free_port()?), (free_port()?, free_port()?));
    let front = Front::start(a_ports.1).await?;

    let mut a = webhook_replica(dir.path(), &kubeconfig, "hook-a", a_ports, &front, &[])?;
    ready(&mut a, a_ports.0).await?;
    let mut b = webhook_replica(dir.path(), &kubeconfig, "hook-b", b_ports, &front, &[])?;
    ready(&mut b, b_ports.0).await?;
    let ca = shared_ca_cert(&admin).await?;
    bundle_holds(&admin, &ca).await?;
    let replicas = [("hook-a", a_ports.1), ("hook-b", b_ports.1)];
    every_replica_admits(&admin, &front, &replicas, "two").await?;

    // A rolling update: a replica replaced by a new one keeps the CA, so the
    // other one's certificate stays trusted.
    let exit = a.terminate(Duration::from_secs(15))?;
    assert!(exit.success(), "hook-a exited with {exit}");
    let mut a = webhook_replica(dir.path(), &kubeconfig, "hook-a2", a_ports, &front, &[])?;
    ready(&mut a, a_ports.0).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(shared_ca_cert(&admin).await?, ca, "the shared CA changed");
    every_replica_admits(&admin, &front, &replicas, "rolled").await?;
    a.check_running()?;
    b.check_running()?;
    Ok(())
}

#[tokio::test]
async fn a_due_webhook_ca_rotates_across_replicas_without_refusing_a_pod() -> anyhow::Result<()> {
    let _serial = REPLICA_TESTS.lock().await;
    let plane = ControlPlane::shared().await?;
    let (admin, kubeconfig) = webhook_ground(plane).await?;
    let dir = gkm_testenv::temp_dir()?;

    // A shared CA issued for 72h that enters the last third of its life
    // (rotation) ten seconds from now.
    let mut old = certs::issue_ca(Duration::from_secs(2 * 86_400))?;
    let now = jiff::Timestamp::now();
    old.not_after = now.checked_add(jiff::SignedDuration::from_secs(24 * 3600 + 10))?;
    let seeded = shared_ca::SharedCa::new(old.clone(), now);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": shared_ca::SECRET_NAME, "namespace": SYSTEM},
        "stringData": seeded.to_data(),
    }))?;
    Api::<Secret>::namespaced(admin.clone(), SYSTEM)
        .create(&PostParams::default(), &secret)
        .await?;

    let (a_ports, b_ports) = ((free_port()?, free_port()?), (free_port()?, free_port()?));
    let front = Front::start(a_ports.1).await?;
    let flags = [
        "--webhook-cert-validity=72h",
        "--webhook-ca-check-interval=1s",
    ];
    let mut a = webhook_replica(dir.path(), &kubeconfig, "rot-a", a_ports, &front, &flags)?;
    let mut b = webhook_replica(dir.path(), &kubeconfig, "rot-b", b_ports, &front, &flags)?;
    ready(&mut a, a_ports.0).await?;
    ready(&mut b, b_ports.0).await?;
    bundle_holds(&admin, &old.cert_pem).await?;
    let replicas = [("rot-a", a_ports.1), ("rot-b", b_ports.1)];

    // Pods keep being admitted by both replicas while the CA is rotated
    // and each replica moves to a certificate of the new one.
    let began = Instant::now();
    let mut round = 0;
    while began.elapsed() < Duration::from_secs(18) {
        every_replica_admits(&admin, &front, &replicas, &format!("rot{round}")).await?;
        round += 1;
    }
    let new = shared_ca_cert(&admin).await?;
    assert_ne!(new, old.cert_pem, "the due CA was never rotated");
    let bundle = ca_bundle(&admin).await?.unwrap_or_default();
    assert!(
        bundle.starts_with(&new) && bundle.contains(&old.cert_pem),
        "the bundle does not trust both the new CA and the one it replaced: {bundle}"
    );
    for process in [&mut a, &mut b] {
        process.check_running()?;
        let log = process.log_tail(200);
        assert!(
            log.contains("serving a certificate of the new webhook CA"),
            "a replica still serves the replaced CA's certificate:\n{log}"
        );
    }
    every_replica_admits(&admin, &front, &replicas, "after").await?;
    Ok(())
}

/// The chart's rendering with `args` (the pinned helm).
fn helm_template(args: &[&str]) -> anyhow::Result<Vec<serde_json::Value>> {
    let helm = gkm_testenv::find_binary(gkm_testenv::Component::Helm)?;
    let chart = deploy_dir().join("helm/gkm");
    let out = Command::new(helm)
        .args(["template", "gkm"])
        .arg(&chart)
        .args(["--namespace", SYSTEM])
        .args(args)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_json::Value::deserialize(doc)?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

fn find<'a>(
    docs: &'a [serde_json::Value],
    kind: &str,
    name: &str,
) -> Option<&'a serde_json::Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

#[tokio::test]
async fn the_chart_owns_the_webhook_configuration_so_disabling_the_webhook_removes_it()
-> anyhow::Result<()> {
    // Enabled (the default), the chart renders the configuration the
    // operator would, pointing at the chart's Service.
    let docs = helm_template(&[])?;
    let rendered = find(&docs, "MutatingWebhookConfiguration", CONFIGURATION_NAME)
        .ok_or_else(|| anyhow::anyhow!("the chart renders no {CONFIGURATION_NAME}"))?
        .clone();
    let service = Endpoint::Service {
        namespace: SYSTEM.into(),
        name: "gkm-operator-webhook".into(),
        port: 443,
    };
    assert_eq!(
        rendered["webhooks"],
        configuration(&service, None)["webhooks"],
        "the chart's webhook differs from the operator's"
    );
    assert!(find(&docs, "Service", "gkm-operator-webhook").is_some());
    // Disabled, neither the configuration nor the Service it names is
    // rendered, so `helm upgrade` deletes both.
    let disabled = helm_template(&["--set", "webhook.enabled=false"])?;
    assert!(
        find(
            &disabled,
            "MutatingWebhookConfiguration",
            CONFIGURATION_NAME
        )
        .is_none()
    );
    assert!(find(&disabled, "Service", "gkm-operator-webhook").is_none());
    let operator = find(&disabled, "Deployment", "gkm-operator")
        .ok_or_else(|| anyhow::anyhow!("no operator Deployment"))?;
    assert!(!operator.to_string().contains("--webhook-listen"));

    // Against the apiserver: the chart's configuration gets the shared CA
    // from a replica behind the chart's Service; deleted (what an upgrade
    // disabling the webhook does), no replica brings it back.
    let _serial = REPLICA_TESTS.lock().await;
    let plane = ControlPlane::shared().await?;
    let (admin, kubeconfig) = webhook_ground(plane).await?;
    plane.apply_object(&rendered, false).await?;
    let dir = gkm_testenv::temp_dir()?;
    let (metrics_port, hook_port) = (free_port()?, free_port()?);
    let args = [
        format!("--webhook-listen=127.0.0.1:{hook_port}"),
        format!("--webhook-service={SYSTEM}/gkm-operator-webhook:443"),
        "--webhook-ca-check-interval=1s".to_string(),
    ];
    let mut replica = replica_with(dir.path(), &kubeconfig, "chart-hook", metrics_port, &args)?;
    ready(&mut replica, metrics_port).await?;
    let ca = shared_ca_cert(&admin).await?;
    bundle_holds(&admin, &ca).await?;
    let live = Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .get(CONFIGURATION_NAME)
        .await?;
    let mut webhook = serde_json::to_value(&live.webhooks.unwrap_or_default()[0])?;
    webhook["clientConfig"]
        .as_object_mut()
        .map(|c| c.remove("caBundle"));
    let mut expected = rendered["webhooks"][0].clone();
    // Defaulted by the apiserver.
    for (key, value) in [
        ("matchPolicy", json!("Equivalent")),
        ("namespaceSelector", json!({})),
    ] {
        expected[key] = value;
    }
    assert_eq!(
        webhook, expected,
        "the operator changed more of the chart's configuration than its caBundle"
    );

    Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .delete(CONFIGURATION_NAME, &DeleteParams::default())
        .await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    replica.check_running()?;
    assert!(
        Api::<MutatingWebhookConfiguration>::all(admin.clone())
            .get_opt(CONFIGURATION_NAME)
            .await?
            .is_none(),
        "the operator recreated the webhook configuration the chart removed"
    );
    Ok(())
}
