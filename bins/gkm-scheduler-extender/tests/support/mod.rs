//! A cluster for the extender's tests and benchmark: etcd, kube-apiserver,
//! kube-controller-manager, kwok, `gkm-scheduler-extender` under its shipped
//! RBAC, and kube-scheduler configured with the shipped example
//! configuration pointing at it.

#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gkm_testenv::{ControlPlane, ControlPlaneOptions, Kwok, Process, Scheduler, eventually};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The flag that lets the extender serve its verbs without client
/// certificates, for the tests of what it does (not of who may call it).
pub const INSECURE: &str = "--insecure-no-client-auth";

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
    gkm_testenv::repo_root()
}

/// Where the shipped example scheduler configuration calls the extender.
const SHIPPED_URL: &str = "https://gkm-scheduler-extender.gkm-system.svc:8888/scheduler";

/// The shipped example scheduler configuration with its extender entry
/// changed by `change`, calling the extender at `addr` (over `scheme`).
fn shipped_config(
    addr: &str,
    scheme: &str,
    change: impl FnOnce(&mut serde_yaml::Mapping) -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    let path = workspace_root().join("deploy/scheduler-extender/kube-scheduler-config.yaml");
    let text = std::fs::read_to_string(&path)?;
    let mut value: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let extender = value
        .get_mut("extenders")
        .and_then(|e| e.get_mut(0))
        .and_then(|e| e.as_mapping_mut())
        .ok_or_else(|| anyhow::anyhow!("{} has no extender", path.display()))?;
    anyhow::ensure!(
        extender.get("urlPrefix").and_then(|u| u.as_str()) == Some(SHIPPED_URL),
        "{} no longer calls {SHIPPED_URL}",
        path.display()
    );
    extender.insert(
        "urlPrefix".into(),
        format!("{scheme}://{addr}/scheduler").into(),
    );
    change(extender)?;
    Ok(serde_yaml::to_string(&value)?)
}

/// The shipped example scheduler configuration, calling the extender at
/// `addr` over plain HTTP (an extender run with [`INSECURE`]).
pub fn scheduler_config(addr: &str) -> anyhow::Result<String> {
    shipped_config(addr, "http", |extender| {
        extender.insert("enableHTTPS".into(), false.into());
        extender.remove("tlsConfig");
        Ok(())
    })
}

/// The chart's documents, rendered for the namespace gkm-system with the
/// extender enabled and `values` (`--set` arguments) on top.
pub fn chart_documents(values: &[&str]) -> anyhow::Result<Vec<Value>> {
    let helm = gkm_testenv::find_binary(gkm_testenv::Component::Helm)?;
    let chart = workspace_root().join("deploy/helm/gkm");
    let out = Command::new(helm)
        .args(["template", "gkm"])
        .arg(&chart)
        .args([
            "--namespace",
            "gkm-system",
            "--set",
            "schedulerExtender.enabled=true",
        ])
        .args(values)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut docs = Vec::new();
    for doc in text.split("\n---\n") {
        let doc: Value = serde_yaml::from_str(doc)?;
        if !doc.is_null() {
            docs.push(doc);
        }
    }
    Ok(docs)
}

/// The document of `kind` named `name` in `docs`.
pub fn find_document<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

/// The extender container as the chart renders it.
pub struct ChartExtender {
    /// Its arguments.
    pub args: Vec<String>,
    /// Where the TLS Secret is mounted, when it is.
    pub tls_mount: Option<String>,
}

/// The extender container as the chart renders it with `values`.
pub fn chart_extender(values: &[&str]) -> anyhow::Result<ChartExtender> {
    let docs = chart_documents(values)?;
    let deployment = find_document(&docs, "Deployment", "gkm-scheduler-extender")
        .ok_or_else(|| anyhow::anyhow!("no extender Deployment"))?;
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args = container["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|a| a.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let secret_volumes: Vec<&str> = pod["volumes"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter(|v| v["secret"]["secretName"].is_string())
                .filter_map(|v| v["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    let tls_mount = container["volumeMounts"].as_array().and_then(|mounts| {
        mounts
            .iter()
            .find(|m| {
                m["name"]
                    .as_str()
                    .is_some_and(|n| secret_volumes.contains(&n))
            })
            .and_then(|m| m["mountPath"].as_str().map(String::from))
    });
    Ok(ChartExtender { args, tls_mount })
}

/// A scheduler configuration without extenders.
pub const PLAIN_SCHEDULER: &str =
    "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n";

impl Cluster {
    /// Starts the control plane, kwok, the CRDs and the extender's RBAC;
    /// nothing schedules yet.
    pub async fn start() -> anyhow::Result<Cluster> {
        Cluster::start_with_controllers(&[]).await
    }

    /// [`Cluster::start`], with these kube-controller-manager controllers
    /// besides the default ones (`resourceclaim-controller`…).
    pub async fn start_with_controllers(extra: &[&str]) -> anyhow::Result<Cluster> {
        let plane = ControlPlane::start_with(ControlPlaneOptions {
            controller_manager: true,
            extra_controllers: extra.iter().map(|c| c.to_string()).collect(),
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
        // Below the kernel's ephemeral range, which another test's outgoing
        // connections may take the port from before the extender binds it.
        let port = gkm_testenv::free_port()?;
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

    /// Starts the extender `binary` as its ServiceAccount, serving plain
    /// HTTP to any caller (`--insecure-no-client-auth`), and waits until it
    /// is ready.
    pub async fn start_extender_from(&mut self, binary: &Path) -> anyhow::Result<()> {
        self.spawn_extender(binary, &[INSECURE.to_string()]).await
    }

    /// Starts this crate's extender as the chart runs it by default: with
    /// the chart's arguments, over mutual TLS with the certificates of
    /// [`Certificates::issue`] where the chart mounts its TLS Secret. Waits
    /// only until it accepts connections.
    pub async fn start_extender_mtls(&mut self) -> anyhow::Result<Certificates> {
        let binary = option_env!("CARGO_BIN_EXE_gkm-scheduler-extender")
            .map(PathBuf::from)
            .ok_or_else(|| anyhow::anyhow!("not built as a test: name the extender binary"))?;
        let chart = chart_extender(&[])?;
        let mount = chart.tls_mount.ok_or_else(|| {
            anyhow::anyhow!(
                "the chart's defaults mount no TLS Secret into the extender: {:?}",
                chart.args
            )
        })?;
        let certificates = Certificates::issue(self.plane.dir())?;
        let secret = certificates.secret_dir.display().to_string();
        // The chart's arguments but for where to listen (the test's address)
        // and the Secret's files (the test's).
        let flags: Vec<String> = chart
            .args
            .iter()
            .filter(|a| !a.starts_with("--address=") && !a.starts_with("--metrics-address="))
            .map(|a| a.replace(&mount, &secret))
            .collect();
        self.spawn_extender(&binary, &flags).await?;
        Ok(certificates)
    }

    /// Starts this crate's extender with extra `flags`, serving plain HTTP
    /// to any caller (`--insecure-no-client-auth`), and waits only until it
    /// accepts connections.
    pub async fn start_extender_with(&mut self, flags: &[String]) -> anyhow::Result<()> {
        let binary = option_env!("CARGO_BIN_EXE_gkm-scheduler-extender")
            .map(PathBuf::from)
            .ok_or_else(|| anyhow::anyhow!("not built as a test: name the extender binary"))?;
        let mut flags = flags.to_vec();
        flags.push(INSECURE.to_string());
        self.spawn_extender(&binary, &flags).await
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
        let process = Process::spawn("gkm-scheduler-extender", cmd, &log)?;
        let plain = flags == [INSECURE];
        let addr = &self.extender_addr;
        let process = RefCell::new(process);
        eventually("the extender ready", Duration::from_secs(60), || async {
            process.borrow_mut().check_running()?;
            let up = if plain {
                http_get(addr, "/readyz")
                    .await
                    .is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
            } else {
                tokio::net::TcpStream::connect(addr).await.is_ok()
            };
            Ok(up.then_some(()))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}:\n{}", process.borrow().log_tail(30)))?;
        self.extender = Some(process.into_inner());
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
        eventually(
            &format!("the default ServiceAccount in {ns}"),
            Duration::from_secs(60),
            || async { Ok(accounts.get_opt("default").await?.map(|_| ())) },
        )
        .await
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
    let pods = &pods;
    gkm_testenv::settle(
        SETTLE,
        || async move { Ok(outcome(&pods.get(name).await?)) },
        done,
    )
    .await
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

/// The certificates of an extender run over mutual TLS: one CA that signed
/// the extender's serving certificate (for 127.0.0.1) and kube-scheduler's
/// client certificate, as cert-manager's CA issuer would; and, for callers
/// that must be refused, a client certificate of another CA.
pub struct Certificates {
    /// The CA (PEM): what the scheduler trusts and what the extender checks
    /// client certificates against.
    pub ca_pem: String,
    /// The extender's TLS Secret as files, one per key (`tls.crt`,
    /// `tls.key`, `ca.crt`), as the chart mounts it.
    pub secret_dir: PathBuf,
    /// The extender's serving certificate and key, in `secret_dir`.
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    /// kube-scheduler's client certificate and key (`tlsConfig.certFile`,
    /// `tlsConfig.keyFile`).
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A client certificate and key of another CA, in PEM.
    pub foreign_cert_pem: String,
    pub foreign_key_pem: String,
}

impl Certificates {
    /// Issues the certificates into files under `dir`.
    pub fn issue(dir: &Path) -> anyhow::Result<Certificates> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, SanType,
        };
        let ca = |name: &str| -> anyhow::Result<(CertificateParams, KeyPair, String)> {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            params.distinguished_name.push(DnType::CommonName, name);
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            let pem = params.self_signed(&key)?.pem();
            Ok((params, key, pem))
        };
        let client = |ca: &(CertificateParams, KeyPair, String), name: &str| {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let cert = params.signed_by(&key, &Issuer::from_params(&ca.0, &ca.1))?;
            anyhow::Ok((cert.pem(), key.serialize_pem()))
        };
        let ours = ca("gkm scheduler extender CA")?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec!["localhost".to_string()])?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving = params.signed_by(&key, &Issuer::from_params(&ours.0, &ours.1))?;
        let (client_pem, client_key_pem) = client(&ours, "system:kube-scheduler")?;
        let other = ca("another CA")?;
        let (foreign_cert_pem, foreign_key_pem) = client(&other, "system:kube-scheduler")?;

        let secret_dir = dir.join("gkm-scheduler-extender-tls");
        std::fs::create_dir_all(&secret_dir)?;
        let write = |path: PathBuf, text: &str| -> anyhow::Result<PathBuf> {
            std::fs::write(&path, text)?;
            Ok(path)
        };
        write(secret_dir.join("ca.crt"), &ours.2)?;
        Ok(Certificates {
            serving_cert: write(secret_dir.join("tls.crt"), &serving.pem())?,
            serving_key: write(secret_dir.join("tls.key"), &key.serialize_pem())?,
            client_cert: write(dir.join("scheduler-client.crt"), &client_pem)?,
            client_key: write(dir.join("scheduler-client.key"), &client_key_pem)?,
            secret_dir,
            ca_pem: ours.2,
            foreign_cert_pem,
            foreign_key_pem,
        })
    }

    /// kube-scheduler's client certificate and key, in PEM.
    pub fn client_pem(&self) -> anyhow::Result<(String, String)> {
        Ok((
            std::fs::read_to_string(&self.client_cert)?,
            std::fs::read_to_string(&self.client_key)?,
        ))
    }
}

/// The shipped example configuration calling the extender at `addr`: over
/// HTTPS with mutual TLS, trusting `certificates`' CA and presenting the
/// scheduler's client certificate from them (in place of the example's own
/// files).
pub fn scheduler_config_mtls(addr: &str, certificates: &Certificates) -> anyhow::Result<String> {
    use base64::Engine as _;
    shipped_config(addr, "https", |extender| {
        anyhow::ensure!(
            extender.get("enableHTTPS").and_then(|v| v.as_bool()) == Some(true),
            "the shipped example does not call the extender over HTTPS"
        );
        let tls = extender
            .get_mut("tlsConfig")
            .and_then(|t| t.as_mapping_mut())
            .ok_or_else(|| anyhow::anyhow!("the shipped example has no tlsConfig"))?;
        for key in ["certFile", "keyFile"] {
            anyhow::ensure!(
                tls.get(key).is_some(),
                "the shipped example's tlsConfig names no {key}: the scheduler would present no client certificate"
            );
        }
        let path = |p: &Path| serde_yaml::Value::from(p.display().to_string());
        tls.insert("certFile".into(), path(&certificates.client_cert));
        tls.insert("keyFile".into(), path(&certificates.client_key));
        tls.remove("caFile");
        let ca = base64::engine::general_purpose::STANDARD.encode(&certificates.ca_pem);
        tls.insert("caData".into(), ca.into());
        Ok(())
    })
}
