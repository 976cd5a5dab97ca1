//! A cluster for the extender's tests and benchmark: etcd, kube-apiserver,
//! kube-controller-manager, kwok, `gkm-scheduler-extender` under its shipped
//! RBAC, and kube-scheduler configured with the shipped example
//! configuration pointing at it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gkm_testenv::{ControlPlane, ControlPlaneOptions, Kwok, Process, Scheduler};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// How long a pod may take to be scheduled or refused.
pub const SETTLE: Duration = Duration::from_secs(90);

/// The running cluster.
pub struct Cluster {
    // Field order is drop order.
    pub scheduler: Option<Scheduler>,
    pub extender: Option<Process>,
    pub kwok: Kwok,
    pub plane: ControlPlane,
    pub client: kube::Client,
    pub extender_addr: String,
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The shipped example scheduler configuration, calling the extender at `addr`.
pub fn scheduler_config(addr: &str) -> anyhow::Result<String> {
    let path = workspace_root().join("deploy/scheduler-extender/kube-scheduler-config.yaml");
    let text = std::fs::read_to_string(&path)?;
    let shipped = "http://gkm-scheduler-extender.gkm-system.svc:8888/scheduler";
    anyhow::ensure!(
        text.contains(shipped),
        "{} no longer calls {shipped}",
        path.display()
    );
    Ok(text.replace(shipped, &format!("http://{addr}/scheduler")))
}

/// A scheduler configuration without extenders.
pub const PLAIN_SCHEDULER: &str =
    "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n";

impl Cluster {
    /// Starts the control plane, kwok, the CRDs and the extender's RBAC;
    /// nothing schedules yet.
    pub async fn start() -> anyhow::Result<Cluster> {
        let plane = ControlPlane::start_with(ControlPlaneOptions {
            controller_manager: true,
            ..Default::default()
        })
        .await?;
        let kwok = Kwok::start(&plane)?;
        let client = plane.client().await?;
        plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
        let deploy = workspace_root().join("deploy");
        plane.apply_file(&deploy.join("namespace.yaml")).await?;
        plane
            .apply_file(&deploy.join("scheduler-extender/rbac.yaml"))
            .await?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        Ok(Cluster {
            scheduler: None,
            extender: None,
            kwok,
            plane,
            client,
            extender_addr: format!("127.0.0.1:{port}"),
        })
    }

    /// Starts the `gkm-scheduler-extender` this crate's tests were built with
    /// as its ServiceAccount and waits until it is ready.
    pub async fn start_extender(&mut self) -> anyhow::Result<()> {
        let binary = option_env!("CARGO_BIN_EXE_gkm-scheduler-extender")
            .map(PathBuf::from)
            .ok_or_else(|| anyhow::anyhow!("not built as a test: name the extender binary"))?;
        self.start_extender_from(&binary).await
    }

    /// Starts the extender `binary` as its ServiceAccount and waits until it
    /// is ready.
    pub async fn start_extender_from(&mut self, binary: &Path) -> anyhow::Result<()> {
        self.spawn_extender(binary, &[]).await
    }

    /// Starts this crate's extender serving HTTPS with a certificate for
    /// 127.0.0.1 and returns the CA certificate (PEM) that signed it. Waits
    /// only until it accepts connections.
    pub async fn start_extender_tls(&mut self) -> anyhow::Result<String> {
        let binary = option_env!("CARGO_BIN_EXE_gkm-scheduler-extender")
            .map(PathBuf::from)
            .ok_or_else(|| anyhow::anyhow!("not built as a test: name the extender binary"))?;
        let (ca, cert, key) = serving_certificate()?;
        let dir = self.plane.dir();
        let (cert_path, key_path) = (dir.join("extender.crt"), dir.join("extender.key"));
        std::fs::write(&cert_path, cert)?;
        std::fs::write(&key_path, key)?;
        let flags = [
            format!("--tls-cert-file={}", cert_path.display()),
            format!("--tls-key-file={}", key_path.display()),
        ];
        self.spawn_extender(&binary, &flags).await?;
        Ok(ca)
    }

    async fn spawn_extender(&mut self, binary: &Path, flags: &[String]) -> anyhow::Result<()> {
        let kubeconfig = self
            .plane
            .kubeconfig_for_service_account("gkm-system", "gkm-scheduler-extender")?;
        let mut cmd = Command::new(binary);
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--address={}", self.extender_addr))
            .arg("--quota-status-interval=1s")
            .args(flags)
            .env("GKM_LOG", "info");
        let log = self.plane.dir().join("gkm-scheduler-extender.log");
        let mut process = Process::spawn("gkm-scheduler-extender", cmd, &log)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            process.check_running()?;
            let up = if flags.is_empty() {
                http_get(&self.extender_addr, "/readyz")
                    .await
                    .is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
            } else {
                tokio::net::TcpStream::connect(&self.extender_addr)
                    .await
                    .is_ok()
            };
            if up {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the extender is not ready after 60s:\n{}",
                process.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.extender = Some(process);
        Ok(())
    }

    /// Starts kube-scheduler with `config`, replacing a running one.
    pub fn start_scheduler(&mut self, config: &str) -> anyhow::Result<()> {
        self.scheduler = None;
        self.scheduler = Some(Scheduler::start(&self.plane, config)?);
        Ok(())
    }

    /// Makes namespace `ns` and waits for its default ServiceAccount.
    pub async fn namespace(&self, ns: &str) -> anyhow::Result<()> {
        self.plane.ensure_namespace(ns).await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        let deadline = Instant::now() + Duration::from_secs(60);
        while accounts.get_opt("default").await?.is_none() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "no default ServiceAccount in {ns}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// A kwok node with GPU `model`, `capacity` and `annotations`.
    pub async fn gpu_node(
        &mut self,
        name: &str,
        model: &str,
        capacity: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        let labels = BTreeMap::from([("gkm.io/gpu.product".to_string(), model.to_string())]);
        let capacity = capacity
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.kwok
            .create_node(&self.client, name, &labels, &capacity)
            .await?;
        if !annotations.is_empty() {
            let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
            let nodes: Api<Node> = Api::all(self.client.clone());
            let patch = json!({"metadata": {"annotations": annotations}});
            nodes
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Ok(())
    }

    /// Creates a pod from `spec` (the pod's `spec`, to which a container is
    /// added when it has none) in `ns`.
    pub async fn pod(&self, ns: &str, name: &str, mut spec: Value) -> anyhow::Result<Pod> {
        if spec.get("containers").is_none() {
            spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
        }
        spec["automountServiceAccountToken"] = json!(false);
        // No node lifecycle controller runs to lift the taint the apiserver
        // puts on new nodes.
        spec["tolerations"] = json!([{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}]);
        spec["terminationGracePeriodSeconds"] = json!(0);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        }))?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        Ok(pods.create(&PostParams::default(), &pod).await?)
    }

    /// The extender's and the scheduler's log ends, for failure messages.
    pub fn logs(&self) -> String {
        format!(
            "extender log:\n{}\nscheduler log:\n{}",
            self.extender
                .as_ref()
                .map(|p| p.log_tail(20))
                .unwrap_or_default(),
            self.scheduler
                .as_ref()
                .map(|s| s.log_tail(20))
                .unwrap_or_default()
        )
    }
}

/// A container asking for `limits`.
pub fn asking(limits: Value) -> Value {
    json!([{"name": "c", "image": "busybox", "resources": {"limits": limits}}])
}

/// Where a pod stands: bound to a node, or the scheduler's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Bound to this node.
    Bound(String),
    /// Not bound; the PodScheduled condition's message.
    Pending(String),
}

/// The pod's outcome now.
pub fn outcome(pod: &Pod) -> Outcome {
    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
        return Outcome::Bound(node);
    }
    let message = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    Outcome::Pending(message)
}

/// Waits until `done` holds for the pod's outcome, returning it (or the last
/// one seen when [`SETTLE`] passes).
pub async fn wait_for(
    client: &kube::Client,
    ns: &str,
    name: &str,
    done: impl Fn(&Outcome) -> bool,
) -> anyhow::Result<Outcome> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + SETTLE;
    loop {
        let now = outcome(&pods.get(name).await?);
        if done(&now) || Instant::now() > deadline {
            return Ok(now);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One HTTP/1.1 GET, the whole reply as text.
pub async fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await?;
    Ok(reply)
}

/// A CA and a serving certificate for 127.0.0.1 it signed: (CA PEM,
/// certificate PEM, key PEM).
fn serving_certificate() -> anyhow::Result<(String, String, String)> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["localhost".to_string()])?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    let cert = params.signed_by(&key, &Issuer::from_params(&ca, &ca_key))?;
    Ok((ca_pem, cert.pem(), key.serialize_pem()))
}

/// `config` (a scheduler configuration calling the extender over HTTP)
/// calling it over HTTPS, trusting `ca_pem`.
pub fn over_tls(config: &str, ca_pem: &str) -> anyhow::Result<String> {
    use base64::Engine as _;
    let mut value: serde_yaml::Value = serde_yaml::from_str(config)?;
    let extender = value
        .get_mut("extenders")
        .and_then(|e| e.get_mut(0))
        .and_then(|e| e.as_mapping_mut())
        .ok_or_else(|| anyhow::anyhow!("the configuration has no extender"))?;
    let url = extender
        .get("urlPrefix")
        .and_then(|u| u.as_str())
        .unwrap_or_default()
        .replacen("http://", "https://", 1);
    extender.insert("urlPrefix".into(), url.into());
    extender.insert("enableHTTPS".into(), true.into());
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let tls = serde_yaml::to_value(BTreeMap::from([("caData", ca)]))?;
    extender.insert("tlsConfig".into(), tls);
    Ok(serde_yaml::to_string(&value)?)
}
