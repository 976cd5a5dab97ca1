//! etcd + kube-apiserver on loopback, envtest style.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::OnceCell;

use crate::binaries::{Component, find_binary};
use crate::certs::{self, Authority};
use crate::ports::free_port;
use crate::process::{Process, remove_at_exit};

/// Extra flags for the components, on top of gkm's defaults.
#[derive(Debug, Clone, Default)]
pub struct ControlPlaneOptions {
    /// Extra `kube-apiserver` flags (`--flag=value`); later flags win.
    pub apiserver_args: Vec<String>,
    /// Also run kube-controller-manager's service-account, token, namespace
    /// and garbage-collector controllers (needed to create pods: their
    /// namespace's `default` ServiceAccount must exist).
    pub controller_manager: bool,
    /// With `controller_manager`, also run the controllers that turn
    /// Deployments and DaemonSets into pods, publish the cluster's CA
    /// (`kube-root-ca.crt`) into every namespace for pods' API tokens, and
    /// lift a Ready node's `not-ready` taint (node lifecycle): what
    /// installing gkm's chart onto real nodes needs.
    pub workload_controllers: bool,
    /// More kube-controller-manager controllers to run (`job-controller`,
    /// `persistentvolume-binder-controller`…), with `controller_manager`.
    pub extra_controllers: Vec<String>,
}

/// A running etcd + kube-apiserver, stopped when dropped.
///
/// The apiserver serves TLS on a free loopback port, authorizes with RBAC and
/// authenticates clients by certificates signed by the control plane's CA.
/// [`ControlPlane::kubeconfig`] is an admin (`system:masters`) kubeconfig;
/// [`ControlPlane::kubeconfig_for`] makes one for any user.
pub struct ControlPlane {
    // Field order is drop order: controllers, then the apiserver, then etcd.
    controller_manager: Option<Process>,
    apiserver: Process,
    etcd: Process,
    dir: PathBuf,
    _tempdir: Option<tempfile::TempDir>,
    authority: Authority,
    url: String,
    kubeconfig: PathBuf,
    started_in: Duration,
}

static SHARED: OnceCell<ControlPlane> = OnceCell::const_new();

impl ControlPlane {
    /// Starts a control plane of its own, in a temporary directory.
    pub async fn start() -> anyhow::Result<ControlPlane> {
        Self::start_with(ControlPlaneOptions::default()).await
    }

    /// The control plane shared by every test of this test binary, started by
    /// the first caller. Each test should work in a namespace of its own.
    ///
    /// A `kube::Client` is bound to the tokio runtime that made it, so take a
    /// new one with [`ControlPlane::client`] in each test.
    pub async fn shared() -> anyhow::Result<&'static ControlPlane> {
        SHARED
            .get_or_try_init(|| async {
                let dir = crate::temp_dir()?.keep();
                remove_at_exit(&dir);
                Self::start_in(&dir, None, ControlPlaneOptions::default()).await
            })
            .await
    }

    /// Starts a control plane with extra flags, in a temporary directory.
    pub async fn start_with(options: ControlPlaneOptions) -> anyhow::Result<ControlPlane> {
        let tempdir = crate::temp_dir()?;
        let dir = tempdir.path().to_path_buf();
        Self::start_in(&dir, Some(tempdir), options).await
    }

    /// Starts a control plane whose state (certificates, etcd data, logs,
    /// kubeconfig) lives in `dir`, which must exist.
    pub async fn start_in_dir(dir: &Path, options: ControlPlaneOptions) -> anyhow::Result<Self> {
        Self::start_in(dir, None, options).await
    }

    async fn start_in(
        dir: &Path,
        tempdir: Option<tempfile::TempDir>,
        options: ControlPlaneOptions,
    ) -> anyhow::Result<ControlPlane> {
        let began = Instant::now();
        let etcd_bin = find_binary(Component::Etcd)?;
        let apiserver_bin = find_binary(Component::KubeApiserver)?;

        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki)?;
        let authority = Authority::new("gkm-local-ca")?;
        let serving = authority.serving("kube-apiserver")?;
        write(&pki.join("ca.crt"), &authority.cert_pem)?;
        write(&pki.join("apiserver.crt"), &serving.cert)?;
        write(&pki.join("apiserver.key"), &serving.key)?;
        let (sa_key, sa_pub) = certs::service_account_key()?;
        write(&pki.join("sa.key"), &sa_key)?;
        write(&pki.join("sa.pub"), &sa_pub)?;
        // The apiserver's identity towards kubelets (logs, exec, port-forward).
        let kubelet_client =
            authority.client("kube-apiserver-kubelet-client", &["system:masters"])?;
        write(
            &pki.join("apiserver-kubelet-client.crt"),
            &kubelet_client.cert,
        )?;
        write(
            &pki.join("apiserver-kubelet-client.key"),
            &kubelet_client.key,
        )?;

        let (client_port, peer_port, secure_port) = (free_port()?, free_port()?, free_port()?);
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut etcd = Command::new(etcd_bin);
        etcd.args([
            "--name=default",
            &format!("--data-dir={}", dir.join("etcd").display()),
            &format!("--listen-client-urls={client_url}"),
            &format!("--advertise-client-urls={client_url}"),
            &format!("--listen-peer-urls={peer_url}"),
            &format!("--initial-advertise-peer-urls={peer_url}"),
            &format!("--initial-cluster=default={peer_url}"),
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]);
        let etcd = Process::spawn("etcd", etcd, &dir.join("etcd.log"))?;

        let mut apiserver = Command::new(apiserver_bin);
        let p = |name: &str| pki.join(name).display().to_string();
        apiserver
            .args([
                format!("--etcd-servers={client_url}"),
                format!("--secure-port={secure_port}"),
                "--bind-address=127.0.0.1".to_string(),
                "--advertise-address=127.0.0.1".to_string(),
                format!("--cert-dir={}", p("")),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--client-ca-file={}", p("ca.crt")),
                "--service-cluster-ip-range=10.96.0.0/16".to_string(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                // Node: real nodes' kubelets are authorized as on any cluster.
                "--authorization-mode=Node,RBAC".to_string(),
                format!(
                    "--kubelet-client-certificate={}",
                    p("apiserver-kubelet-client.crt")
                ),
                format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
                format!("--kubelet-certificate-authority={}", p("ca.crt")),
                "--kubelet-preferred-address-types=InternalIP,Hostname".to_string(),
                "--allow-privileged=true".to_string(),
                "--enable-priority-and-fairness=false".to_string(),
                "--v=0".to_string(),
            ])
            .args(&options.apiserver_args);
        let apiserver =
            Process::spawn("kube-apiserver", apiserver, &dir.join("kube-apiserver.log"))?;

        let url = format!("https://127.0.0.1:{secure_port}");
        let mut plane = ControlPlane {
            controller_manager: None,
            apiserver,
            etcd,
            dir: dir.to_path_buf(),
            _tempdir: tempdir,
            authority,
            url,
            kubeconfig: PathBuf::new(),
            started_in: Duration::ZERO,
        };
        plane.kubeconfig = plane.kubeconfig_for("gkm-admin", &["system:masters"])?;
        plane.wait_ready(Duration::from_secs(90)).await?;
        if options.controller_manager {
            let mut kcm = Command::new(find_binary(Component::KubeControllerManager)?);
            let mut controllers =
                "serviceaccount,serviceaccount-token,namespace,garbagecollector".to_string();
            if options.workload_controllers {
                controllers.push_str(
                    ",deployment-controller,replicaset-controller,daemonset-controller,\
                     root-ca-certificate-publisher-controller,node-lifecycle-controller",
                );
            }
            for extra in &options.extra_controllers {
                controllers.push(',');
                controllers.push_str(extra);
            }
            // kube-controller-manager's own user name, as on a cluster
            // whose controllers share one identity (policies may name it:
            // only the Job controller makes pods a capture Job controls).
            let kcm_kubeconfig =
                plane.kubeconfig_for("system:kube-controller-manager", &["system:masters"])?;
            kcm.args([
                format!("--kubeconfig={}", kcm_kubeconfig.display()),
                format!("--controllers={controllers}"),
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                "--leader-elect=false".to_string(),
                "--secure-port=0".to_string(),
                "--v=0".to_string(),
            ]);
            plane.controller_manager = Some(Process::spawn(
                "kube-controller-manager",
                kcm,
                &dir.join("kube-controller-manager.log"),
            )?);
        }
        plane.started_in = began.elapsed();
        Ok(plane)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last_error = String::new();
        while Instant::now() < deadline {
            self.apiserver.check_running()?;
            match self.client().await {
                Ok(client) => {
                    let request = http::Request::get("/readyz").body(Vec::new())?;
                    match client.request_text(request).await {
                        Ok(body) if body.trim() == "ok" => return Ok(()),
                        Ok(body) => last_error = body,
                        Err(e) => last_error = e.to_string(),
                    }
                }
                Err(e) => last_error = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        anyhow::bail!(
            "kube-apiserver not ready after {timeout:?}: {last_error}\nlast log lines:\n{}",
            self.apiserver.log_tail(30)
        )
    }

    /// The control plane's certificate authority.
    pub(crate) fn authority(&self) -> &Authority {
        &self.authority
    }

    /// The apiserver's URL, `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The admin kubeconfig file (user `gkm-admin`, group `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory holding certificates, etcd data and component logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How long the start took, from spawning etcd to a ready apiserver.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The process ids of the components (apiserver, etcd, and the
    /// controller manager when it runs).
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = vec![self.apiserver.pid(), self.etcd.pid()];
        pids.extend(self.controller_manager.as_ref().map(Process::pid));
        pids
    }

    /// A new admin client, bound to the calling tokio runtime.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// Writes a kubeconfig authenticating as `user` in `groups` with a
    /// certificate signed by the control plane's CA, and returns its path.
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> anyhow::Result<PathBuf> {
        let pem = self.authority.client(user, groups)?;
        // Every call gets files of its own: tests sharing a plane ask for the
        // same user at once, and a process must never read one call's
        // certificate with another call's key.
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let safe: String = user
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .chain(format!("-{call}").chars())
            .collect();
        let pki = self.dir.join("pki");
        let (cert, key) = (
            pki.join(format!("{safe}.crt")),
            pki.join(format!("{safe}.key")),
        );
        write(&cert, &pem.cert)?;
        write(&key, &pem.key)?;
        let kubeconfig = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "gkm-local", "cluster": {
                "server": self.url,
                "certificate-authority": pki.join("ca.crt"),
            }}],
            "users": [{"name": user, "user": {"client-certificate": cert, "client-key": key}}],
            "contexts": [{"name": "gkm-local", "context": {"cluster": "gkm-local", "user": user}}],
            "current-context": "gkm-local",
        });
        let path = self.dir.join(format!("kubeconfig-{safe}.yaml"));
        write(&path, &serde_yaml::to_string(&kubeconfig)?)?;
        Ok(path)
    }

    /// A client authenticating as `user` in `groups` (for RBAC tests).
    pub async fn client_for(&self, user: &str, groups: &[&str]) -> anyhow::Result<kube::Client> {
        client_from_kubeconfig(&self.kubeconfig_for(user, groups)?).await
    }

    /// Makes sure the namespace `name` exists (server-side apply).
    pub async fn ensure_namespace(&self, name: &str) -> anyhow::Result<()> {
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client().await?);
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
        namespaces
            .patch(name, &PatchParams::apply("gkm-testenv"), &Patch::Apply(&ns))
            .await?;
        Ok(())
    }

    /// Makes sure namespace `name` exists with its `default` ServiceAccount,
    /// which pod admission looks up: no controller-manager runs here to
    /// make it, so a test that creates pods in a namespace of its own needs
    /// this rather than [`ControlPlane::ensure_namespace`].
    pub async fn ensure_pod_namespace(&self, name: &str) -> anyhow::Result<()> {
        self.ensure_namespace(name).await?;
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.client().await?, name);
        let account: k8s_openapi::api::core::v1::ServiceAccount = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "default", "namespace": name}}),
        )?;
        accounts
            .patch(
                "default",
                &PatchParams::apply("gkm-testenv"),
                &Patch::Apply(&account),
            )
            .await?;
        Ok(())
    }

    /// Makes sure a Node object named `name` exists (server-side apply), for
    /// tests of components that act on a Node without a kubelet behind it.
    pub async fn ensure_node(&self, name: &str) -> anyhow::Result<()> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client().await?);
        let node: k8s_openapi::api::core::v1::Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
        nodes
            .patch(
                name,
                &PatchParams::apply("gkm-testenv"),
                &Patch::Apply(&node),
            )
            .await?;
        Ok(())
    }

    /// Applies `crds` (server-side apply) and waits until each is Established.
    pub async fn install_crds(&self, crds: &[CustomResourceDefinition]) -> anyhow::Result<()> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client().await?);
        let params = PatchParams::apply("gkm-testenv").force();
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            api.patch(&name, &params, &Patch::Apply(crd)).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            loop {
                let current = api.get(&name).await?;
                let established = current
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|conds| {
                        conds
                            .iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    });
                if established {
                    break;
                }
                if Instant::now() > deadline {
                    anyhow::bail!("CRD {name} not Established after 30s: {:?}", current.status);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}

pub(crate) async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

fn write(path: &Path, contents: &str) -> anyhow::Result<()> {
    std::fs::write(path, contents).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}
