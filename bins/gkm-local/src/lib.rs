//! gkm on a local control plane: the real components (etcd, kube-apiserver,
//! kube-controller-manager, kwok, a Distribution registry) on loopback,
//! simulated GPU nodes and real ones (kubelet, containerd, runc), and gkm
//! either installed by its Helm chart onto a real node ([`Stack::start_for_chart`])
//! or run from its binaries as processes under its ServiceAccounts
//! ([`Stack::start`]). Simulated (kwok) nodes run no containers, so their
//! agents and CSI drivers are always processes.
//!
//! `gkm-local` (the binary) runs this for people; the end-to-end tests drive
//! it step by step.

pub mod chart;
pub mod cosign;
pub mod dra;
pub mod kubelet;
pub mod node_token;
pub mod soak;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use gkm_oci::{BuildOptions, ImageRef, RegistryOptions};
use gkm_testenv::{
    ControlPlane, ControlPlaneOptions, Kwok, Process, RealNode, RealNodeOptions, Registry,
    Scheduler, workspace_binary, yaml_documents,
};

/// The namespace gkm's own components run in.
pub const SYSTEM_NAMESPACE: &str = "gkm-system";

/// A simulated GPU node: its name and the simulated inventory its agent reads.
#[derive(Debug, Clone)]
pub struct SimulatedNode {
    /// The Node's name.
    pub name: String,
    /// The inventory file's YAML (`gkm_gpu::simulate` format).
    pub inventory: String,
}

impl SimulatedNode {
    /// A node named `name` with `inventory` YAML.
    pub fn new(name: &str, inventory: &str) -> SimulatedNode {
        SimulatedNode {
            name: name.into(),
            inventory: inventory.into(),
        }
    }
}

/// Three nodes: an NVIDIA T4 (sm75), an AMD MI210 (gfx90a), and one without GPUs.
pub fn default_nodes() -> Vec<SimulatedNode> {
    vec![
        SimulatedNode::new("node-sm75", "gpus:\n- profile: T4\n"),
        SimulatedNode::new("node-gfx90a", "gpus:\n- profile: MI210\n"),
        SimulatedNode::new("node-cpu", "gpus: []\n"),
    ]
}

/// The repository root (for `deploy/`), and the fixture caches shipped
/// beside it (`../shared/fixtures/caches`), as the test kit finds them.
pub use gkm_testenv::{fixture_cache as fixture, repo_root};

/// A busybox pod on `node` (container `triton`) mounting the cache that
/// `attributes` name (`csi.gkm.io` volume attributes) read-only at
/// `mount_path`, which `TRITON_CACHE_DIR` points at, and running `script`
/// with `sh -c`.
pub fn cache_pod(
    namespace: &str,
    name: &str,
    node: &str,
    mount_path: &str,
    attributes: serde_json::Value,
    script: &str,
) -> anyhow::Result<k8s_openapi::api::core::v1::Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "triton",
                "image": gkm_testenv::BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "env": [{"name": "TRITON_CACHE_DIR", "value": mount_path}],
                "command": ["/bin/sh", "-c", script],
                "volumeMounts": [{"name": "kernels", "mountPath": mount_path, "readOnly": true}],
            }],
            "volumes": [{"name": "kernels", "csi": {"driver": "csi.gkm.io", "readOnly": true,
                         "volumeAttributes": attributes}}],
        }
    }))?)
}

/// A busybox pod on `node` (container `main`, `HOME=/tmp`) running
/// `command` once (`restartPolicy: Never`) with `volumes` mounted as
/// `mounts`.
pub fn once_pod(
    namespace: &str,
    name: &str,
    node: &str,
    command: serde_json::Value,
    mounts: serde_json::Value,
    volumes: serde_json::Value,
) -> anyhow::Result<k8s_openapi::api::core::v1::Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main",
                "image": gkm_testenv::BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": command,
                "env": [{"name": "HOME", "value": "/tmp"}],
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        }
    }))?)
}

/// A busybox pod on `node` running real Triton 3.6 once (container `main`;
/// `hack/ci/components.sh triton`: the host's Python and the Triton
/// virtualenv, mounted read-only) with the cache volume `kernels` (a
/// pod volume's JSON, named `kernels`) mounted at the path `fixture`'s
/// kernels were compiled at (inside the pod only: nothing is placed on the
/// host), read-only or not as `read_only` says:
/// `hack/fixtures/triton_fleet.py check` compiles the fixture's kernels for
/// `target` and prints which Triton had to compile and where it read each.
pub fn real_triton_pod(
    namespace: &str,
    name: &str,
    node: &str,
    (fixture, target): (&gkm_testenv::triton::FleetTarget, &str),
    (kernels, read_only): (serde_json::Value, bool),
) -> anyhow::Result<k8s_openapi::api::core::v1::Pod> {
    use serde_json::json;
    let compiled_at = fixture.compiled_at.display().to_string();
    let venv = std::fs::canonicalize(gkm_testenv::tools_bin_dir().join("../triton-3.6.0"))
        .map_err(|e| {
            anyhow::anyhow!(
                "Triton is not installed ({e}); install it with `hack/ci/components.sh triton`"
            )
        })?;
    let hack = repo_root().join("hack").canonicalize()?;
    let host = |name: &str, path: &str, kind: &str| json!({"name": name, "hostPath": {"path": path, "type": kind}});
    let (venv, hack) = (venv.display().to_string(), hack.display().to_string());
    once_pod(
        namespace,
        name,
        node,
        json!([
            "/tmp/gkm-triton-3.6.0/bin/python",
            format!("{hack}/fixtures/triton_fleet.py"),
            "check",
            "--target",
            target,
            "--cache",
            &compiled_at
        ]),
        json!([
            {"name": "usr", "mountPath": "/usr", "readOnly": true},
            {"name": "lib", "mountPath": "/lib", "readOnly": true},
            {"name": "lib64", "mountPath": "/lib64", "readOnly": true},
            {"name": "ld-cache", "mountPath": "/etc/ld.so.cache", "readOnly": true},
            {"name": "venv", "mountPath": "/tmp/gkm-triton-3.6.0", "readOnly": true},
            {"name": "hack", "mountPath": hack, "readOnly": true},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "kernels", "mountPath": compiled_at, "readOnly": read_only},
        ]),
        json!([
            host("usr", "/usr", "Directory"),
            host("lib", "/usr/lib", "Directory"),
            host("lib64", "/usr/lib64", "Directory"),
            host("ld-cache", "/etc/ld.so.cache", "File"),
            host("venv", &venv, "Directory"),
            host("hack", &hack, "Directory"),
            {"name": "tmp", "emptyDir": {}},
            kernels,
        ]),
    )
}

/// The label of the nodes gkm-local starts as real nodes. The chart's pods
/// are placed on them only: kwok nodes run no containers (kwok would report
/// a DaemonSet's pod there Running without any process behind it), so gkm
/// runs there as processes instead.
pub const REAL_NODE_LABEL: &str = "gkm.io/real-node";

/// Everything running, stopped when dropped (gkm's processes first, then
/// the real nodes, with the pods the chart runs on them, then the rest).
pub struct Stack {
    operator: Option<Process>,
    agents: BTreeMap<String, Process>,
    drivers: BTreeMap<String, Process>,
    scheduler: Option<Scheduler>,
    chart: Option<chart::SandboxChart>,
    gpu_path: dra::GpuPath,
    dra_trees: BTreeMap<String, gkm_k8s_devices::NodePaths>,
    real_nodes: BTreeMap<String, RealNode>,
    /// Simulated nodes.
    pub kwok: Kwok,
    /// The OCI registry.
    pub registry: Registry,
    /// etcd, kube-apiserver, kube-controller-manager.
    pub plane: ControlPlane,
    dir: PathBuf,
    nodes: Vec<SimulatedNode>,
    operator_kubeconfig: PathBuf,
    agent_kubeconfig: PathBuf,
    /// Per node, the agent's kubeconfig with a token bound to its Node
    /// (once the chart's admission policy asks for one).
    agent_node_kubeconfigs: BTreeMap<String, PathBuf>,
    operator_args: Vec<String>,
    agent_args: Vec<String>,
    /// More chart values (`--set-json KEY=JSON`) for [`Stack::install_chart`].
    chart_values: Vec<String>,
}

impl Stack {
    /// Starts the control plane, kwok and the registry in `dir`, installs
    /// the CRDs and `deploy/rbac`, and creates the simulated `nodes`. gkm's
    /// own processes are started separately.
    pub async fn start(dir: &Path, nodes: Vec<SimulatedNode>) -> anyhow::Result<Stack> {
        Stack::start_with_controllers(dir, nodes, &[]).await
    }

    /// A stack with Jobs (kube-controller-manager's `job-controller`) and
    /// one real node named `node` with a T4 (sm75, what the Triton fixture
    /// caches fit), and no simulated node.
    pub async fn start_with_real_t4(dir: &Path, node: &str) -> anyhow::Result<Stack> {
        let mut stack = Stack::start_with_controllers(dir, Vec::new(), &["job-controller"]).await?;
        stack
            .add_real_node(SimulatedNode::new(node, "gpus:\n- profile: T4\n"))
            .await?;
        Ok(stack)
    }

    /// Like [`Stack::start`], with more kube-controller-manager controllers
    /// (`job-controller`, `persistentvolume-binder-controller`…).
    pub async fn start_with_controllers(
        dir: &Path,
        nodes: Vec<SimulatedNode>,
        controllers: &[&str],
    ) -> anyhow::Result<Stack> {
        let options = ControlPlaneOptions {
            controller_manager: true,
            extra_controllers: controllers.iter().map(|c| c.to_string()).collect(),
            ..ControlPlaneOptions::default()
        };
        let stack = Stack::start_plane(dir, nodes, options).await?;
        let plane = &stack.plane;
        plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
        let deploy = repo_root().join("deploy");
        plane.apply_file(&deploy.join("namespace.yaml")).await?;
        for file in ["operator.yaml", "agent.yaml", "csi.yaml"] {
            plane.apply_file(&deploy.join("rbac").join(file)).await?;
        }
        // The CSIDriver object, as deploy/ ships it (real kubelets read it).
        for doc in yaml_documents(&deploy.join("manifests/csi.yaml"))? {
            if doc["kind"] == "CSIDriver" {
                plane.apply_object(&doc, false).await?;
            }
        }
        Ok(stack)
    }

    /// Starts the control plane with the controllers and the scheduler that
    /// turn the chart's Deployment and DaemonSets into pods (and its capture
    /// and fill Jobs into pods, and bind claims to the volumes its operator
    /// makes), kwok and the registry in `dir`, and creates the simulated
    /// `nodes`. Nothing of gkm
    /// is installed: [`Stack::install_chart`] installs it all (CRDs, RBAC,
    /// its components) once a real node is added.
    pub async fn start_for_chart(dir: &Path, nodes: Vec<SimulatedNode>) -> anyhow::Result<Stack> {
        Stack::start_for_chart_with(dir, nodes, dra::GpuPath::DevicePlugin).await
    }

    /// Like [`Stack::start_for_chart`], with the real node's GPUs reaching
    /// pods by `gpu_path`. With [`dra::GpuPath::Dra`] the resource claim
    /// controller also runs (it makes the claims of pods' claim templates),
    /// and each real node gets a simulated T4 for the DRA plugin to read
    /// ([`dra::simulated_t4`]).
    pub async fn start_for_chart_with(
        dir: &Path,
        nodes: Vec<SimulatedNode>,
        gpu_path: dra::GpuPath,
    ) -> anyhow::Result<Stack> {
        // Capture and fill Jobs and their pods; claims bound to the
        // operator's volumes.
        let mut extra_controllers: Vec<String> = [
            "job-controller",
            "persistentvolume-binder-controller",
            "persistentvolumeclaim-protection-controller",
            "persistentvolume-protection-controller",
        ]
        .map(String::from)
        .to_vec();
        if gpu_path == dra::GpuPath::Dra {
            extra_controllers.push("resourceclaim-controller".to_string());
        }
        let options = ControlPlaneOptions {
            controller_manager: true,
            workload_controllers: true,
            extra_controllers,
            ..ControlPlaneOptions::default()
        };
        let mut stack = Stack::start_plane(dir, nodes, options).await?;
        stack.gpu_path = gpu_path;
        stack.scheduler = Some(Scheduler::start(
            &stack.plane,
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n",
        )?);
        Ok(stack)
    }

    /// The control plane, kwok with the simulated `nodes`, the registry.
    async fn start_plane(
        dir: &Path,
        nodes: Vec<SimulatedNode>,
        options: ControlPlaneOptions,
    ) -> anyhow::Result<Stack> {
        std::fs::create_dir_all(dir.join("registry"))?;
        let plane = ControlPlane::start_in_dir(dir, options).await?;
        let client = plane.client().await?;
        let mut kwok = Kwok::start(&plane)?;
        for node in &nodes {
            let labels = BTreeMap::from([("gkm.io/simulated".to_string(), "true".to_string())]);
            kwok.create_node(&client, &node.name, &labels, &BTreeMap::new())
                .await?;
            let node_dir = dir.join("nodes").join(&node.name);
            std::fs::create_dir_all(node_dir.join("store"))?;
            std::fs::write(node_dir.join("gpus.yaml"), &node.inventory)?;
        }
        let registry = Registry::start_in_dir(&dir.join("registry"))?;
        let operator_kubeconfig =
            plane.kubeconfig_for_service_account(SYSTEM_NAMESPACE, "gkm-operator")?;
        let agent_kubeconfig =
            plane.kubeconfig_for_service_account(SYSTEM_NAMESPACE, "gkm-agent")?;
        Ok(Stack {
            operator: None,
            agents: BTreeMap::new(),
            drivers: BTreeMap::new(),
            scheduler: None,
            chart: None,
            gpu_path: dra::GpuPath::DevicePlugin,
            dra_trees: BTreeMap::new(),
            real_nodes: BTreeMap::new(),
            kwok,
            registry,
            plane,
            dir: dir.to_path_buf(),
            nodes,
            operator_kubeconfig,
            agent_kubeconfig,
            agent_node_kubeconfigs: BTreeMap::new(),
            operator_args: vec![
                "--resolve-interval=2s".into(),
                // The test namespaces' caches name their own signers.
                "--tenant-signer-namespaces=team-a,team-b,team-c".into(),
            ],
            agent_args: vec!["--resync=2s".into(), "--gc-grace=0s".into()],
            chart_values: Vec::new(),
        })
    }

    /// Extra flags for the operator and agents started from now on (as
    /// processes, or by [`Stack::install_chart`]).
    pub fn set_args(&mut self, operator: Vec<String>, agent: Vec<String>) {
        self.operator_args = operator;
        self.agent_args = agent;
    }

    /// Sets the chart value `key` (a dotted path, as `helm --set-json`
    /// takes it) to `value` for [`Stack::install_chart`].
    pub fn set_chart_value(&mut self, key: &str, value: &serde_json::Value) {
        self.chart_values.push(format!("{key}={value}"));
    }

    /// Adds a real node (kubelet, containerd, runc) named like `node`, whose
    /// agent reads `node`'s simulated inventory, and waits until it is Ready.
    /// On the DRA path its DRA plugin reads a simulated T4 (whatever the
    /// inventory says; the chart's agent still reads the inventory).
    /// Its CSI driver registers with its kubelet, which then calls it for
    /// pods' `csi.gkm.io` volumes.
    pub async fn add_real_node(&mut self, node: SimulatedNode) -> anyhow::Result<()> {
        let labels = BTreeMap::from([
            ("gkm.io/simulated".to_string(), "true".to_string()),
            (REAL_NODE_LABEL.to_string(), "true".to_string()),
        ]);
        let options = RealNodeOptions {
            name: node.name.clone(),
            labels,
            images: Vec::new(),
        };
        let real = RealNode::start(&self.plane, options).await?;
        let node_dir = self.dir.join("nodes").join(&node.name);
        std::fs::create_dir_all(node_dir.join("store"))?;
        std::fs::write(node_dir.join("gpus.yaml"), &node.inventory)?;
        if self.gpu_path == dra::GpuPath::Dra {
            let tree = dra::simulated_t4(&node_dir.join("tree"))?;
            self.dra_trees
                .insert(node.name.clone(), tree.paths().clone());
        }
        self.real_nodes.insert(node.name.clone(), real);
        self.nodes.push(node);
        Ok(())
    }

    /// The real node `name`, if it is one.
    pub fn real_node(&self, name: &str) -> Option<&RealNode> {
        self.real_nodes.get(name)
    }

    /// The real node `name`, to restart its kubelet.
    pub fn real_node_mut(&mut self, name: &str) -> Option<&mut RealNode> {
        self.real_nodes.get_mut(name)
    }

    /// The nodes, simulated and real.
    pub fn nodes(&self) -> &[SimulatedNode] {
        &self.nodes
    }

    /// A node's store directory.
    pub fn store_dir(&self, node: &str) -> PathBuf {
        match &self.chart {
            Some(chart) if self.real_nodes.contains_key(node) => chart.store().to_path_buf(),
            _ => self.dir.join("nodes").join(node).join("store"),
        }
    }

    /// A node's directory (store, CSI socket, logs, pod volumes).
    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(node)
    }

    /// A node's CSI socket: in a real node's kubelet plugins directory, where
    /// the kubelet is told to find it.
    pub fn csi_socket(&self, node: &str) -> PathBuf {
        match self.real_nodes.get(node) {
            Some(real) => real.plugins_dir().join("csi.gkm.io/csi.sock"),
            None => self.dir.join("nodes").join(node).join("csi.sock"),
        }
    }

    /// Starts (or restarts) the operator, as its ServiceAccount.
    pub fn start_operator(&mut self) -> anyhow::Result<()> {
        self.operator = None;
        let mut cmd = Command::new(workspace_binary("gkm-operator")?);
        cmd.arg(format!(
            "--kubeconfig={}",
            self.operator_kubeconfig.display()
        ))
        .arg("--metrics-addr=127.0.0.1:0")
        .arg("--insecure-registry")
        .args(&self.operator_args)
        .env("GKM_LOG", "info,kube=warn");
        self.operator = Some(Process::spawn(
            "gkm-operator",
            cmd,
            &self.dir.join("gkm-operator.log"),
        )?);
        Ok(())
    }

    /// Kills the operator (SIGKILL: no chance to clean up).
    pub fn kill_operator(&mut self) {
        if let Some(mut p) = self.operator.take() {
            p.kill();
        }
    }

    /// Starts (or restarts) the agent of `node`, as its ServiceAccount.
    pub fn start_agent(&mut self, node: &str) -> anyhow::Result<()> {
        self.agents.remove(node);
        let node_dir = self.dir.join("nodes").join(node);
        // A real node's kubelet says which pods hold which GPUs; a kwok node
        // has no kubelet to ask.
        let pod_resources = self
            .real_nodes
            .get(node)
            .map(RealNode::pod_resources_socket)
            .unwrap_or_default();
        let kubeconfig = self
            .agent_node_kubeconfigs
            .get(node)
            .unwrap_or(&self.agent_kubeconfig);
        let mut cmd = Command::new(workspace_binary("gkm-agent")?);
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--node-name={node}"))
            .arg(format!("--store={}", node_dir.join("store").display()))
            .arg(format!(
                "--simulate={}",
                node_dir.join("gpus.yaml").display()
            ))
            .arg("--metrics-addr=127.0.0.1:0")
            .arg(format!(
                "--pod-resources-socket={}",
                pod_resources.display()
            ))
            .arg("--insecure-registry")
            .arg(gkm_testenv::AGENT_KEEP_FREE_ARG)
            .args(&self.agent_args)
            .env("GKM_LOG", "info,kube=warn");
        let process = Process::spawn("gkm-agent", cmd, &node_dir.join("gkm-agent.log"))?;
        self.agents.insert(node.to_string(), process);
        Ok(())
    }

    /// Kills the CSI driver of `node` (SIGKILL).
    pub fn kill_csi(&mut self, node: &str) {
        if let Some(mut p) = self.drivers.remove(node) {
            p.kill();
        }
    }

    /// Kills the agent of `node` (SIGKILL).
    pub fn kill_agent(&mut self, node: &str) {
        if let Some(mut p) = self.agents.remove(node) {
            p.kill();
        }
    }

    /// Starts the CSI driver of `node` on [`Stack::csi_socket`].
    pub fn start_csi(&mut self, node: &str) -> anyhow::Result<()> {
        self.drivers.remove(node);
        let node_dir = self.dir.join("nodes").join(node);
        let mut cmd = Command::new(workspace_binary("gkm-csi")?);
        cmd.arg(format!(
            "--endpoint=unix://{}",
            self.csi_socket(node).display()
        ))
        .arg(format!("--node-name={node}"))
        .arg(format!("--store={}", node_dir.join("store").display()))
        // A tree whose capture was deleted goes at once.
        .arg("--capture-orphan-grace=0s")
        // The machine's disk keeps little of its size free
        // (gkm_testenv::AGENT_KEEP_FREE_ARG says why).
        .arg(gkm_testenv::CSI_KEEP_FREE_ARG)
        .env("GKM_LOG", "info,kube=warn");
        if let Some(real) = self.real_nodes.get(node) {
            cmd.arg(format!(
                "--kubelet-registration-path={}",
                self.csi_socket(node).display()
            ))
            .arg(format!(
                "--plugin-registration-dir={}",
                real.plugins_registry_dir().display()
            ));
        }
        let process = Process::spawn("gkm-csi", cmd, &node_dir.join("gkm-csi.log"))?;
        self.drivers.insert(node.to_string(), process);
        Ok(())
    }

    /// Starts what the chart does not run: the operator, unless the chart
    /// installed it, and an agent and a CSI driver on every node the chart
    /// does not serve (all of them without the chart; the kwok nodes with it).
    pub fn start_gkm(&mut self) -> anyhow::Result<()> {
        if self.chart.is_none() {
            self.start_operator()?;
        }
        let names: Vec<String> = self
            .nodes
            .iter()
            .map(|n| n.name.clone())
            .filter(|n| self.chart.is_none() || !self.real_nodes.contains_key(n))
            .collect();
        for node in names {
            self.start_agent(&node)?;
            self.start_csi(&node)?;
        }
        Ok(())
    }

    /// Builds gkm's images with `hack/images/build.sh` (into `<dir>/images`) from
    /// the binaries already built, and imports them into every real node's
    /// containerd.
    pub fn import_images(&self) -> anyhow::Result<()> {
        let nodes: Vec<&RealNode> = self.real_nodes.values().collect();
        // The chart's components, and the gkm command line's image its
        // capture Jobs run.
        let mut images = chart::components(self.gpu_path).to_vec();
        images.push("gkm");
        chart::build_and_import(&self.dir.join("images"), &nodes, &images)
    }

    /// Installs gkm's chart (`helm install`) onto the one real node, with
    /// the images [`Stack::import_images`] imported, and waits until its pods
    /// are Ready: the CRDs, RBAC, the operator (with the operator's extra
    /// flags of [`Stack::set_args`]) and, on the real node only
    /// ([`REAL_NODE_LABEL`]), the agent (with the agents' extra flags), the
    /// CSI driver and the device plugin, or on the DRA path the DRA plugin
    /// (reading the node's simulated tree), the chart's DeviceClasses and
    /// the operator's per-cache ones. Its agent reads the node's simulated
    /// inventory. Returns helm's output.
    ///
    /// The agents [`Stack::start_gkm`] then starts for the simulated nodes
    /// authenticate with tokens bound to their Nodes, as the chart's
    /// admission policy requires of every agent.
    ///
    /// One real node only: the chart's `kubeletDir` is one directory for all
    /// nodes, and each real node here has its own.
    pub async fn install_chart(&mut self) -> anyhow::Result<String> {
        anyhow::ensure!(
            self.real_nodes.len() == 1,
            "the chart is installed onto exactly one real node; there are {}",
            self.real_nodes.len()
        );
        let Some(node) = self.real_nodes.values().next() else {
            anyhow::bail!("no real node to install the chart onto");
        };
        let sandbox = chart::SandboxChart::for_node_with(
            &self.plane,
            node,
            &self.dir.join("chart"),
            &self.dir.join("nodes"),
            self.dra_trees.get(node.name()),
        )?;
        let real_nodes = serde_json::json!({ REAL_NODE_LABEL: "true" }).to_string();
        let gpu_plugin = match self.gpu_path {
            dra::GpuPath::DevicePlugin => "devicePlugin",
            dra::GpuPath::Dra => "dra",
        };
        let mut values = Vec::new();
        for component in ["operator", "agent", "csi", gpu_plugin] {
            values.push(format!("{component}.nodeSelector={real_nodes}"));
        }
        if self.gpu_path == dra::GpuPath::Dra {
            values.push("devicePlugin.enabled=false".to_string());
            values.push("dra.enabled=true".to_string());
        }
        values.push(format!(
            "operator.extraArgs={}",
            serde_json::to_string(&self.operator_args)?
        ));
        values.push(format!(
            "agent.extraArgs={}",
            serde_json::to_string(&self.agent_args)?
        ));
        values.extend(self.chart_values.iter().cloned());
        let chart_dir = chart::chart_dir().display().to_string();
        let mut args = vec![
            "install",
            chart::RELEASE,
            chart_dir.as_str(),
            "--create-namespace",
        ];
        for value in &values {
            args.extend(["--set-json", value.as_str()]);
        }
        args.extend(sandbox.args());
        let output = chart::helm(self.plane.kubeconfig(), &args)
            .map_err(|e| e.context(chart::pods_report(self.plane.kubeconfig())))?;
        self.chart = Some(sandbox);
        for node in &self.nodes {
            if self.real_nodes.contains_key(&node.name) {
                continue;
            }
            let dest = self.node_dir(&node.name).join("agent-kubeconfig.yaml");
            let kubeconfig = node_token::node_bound_kubeconfig(
                &self.plane,
                SYSTEM_NAMESPACE,
                "gkm-agent",
                &node.name,
                &dest,
            )
            .await?;
            self.agent_node_kubeconfigs
                .insert(node.name.clone(), kubeconfig);
        }
        Ok(output)
    }

    /// Fails if a gkm process or the scheduler died, with the end of its log.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(p) = self.operator.as_mut() {
            p.check_running()?;
        }
        if let Some(s) = self.scheduler.as_mut() {
            s.check_running()?;
        }
        for p in self.agents.values_mut().chain(self.drivers.values_mut()) {
            p.check_running()?;
        }
        Ok(())
    }

    /// Builds the cache in `cache_dir` into `repository:tag` in the registry
    /// and returns the image reference and digest.
    pub async fn push_cache(
        &self,
        cache_dir: &Path,
        repository: &str,
        tag: &str,
    ) -> anyhow::Result<(String, String)> {
        push_cache(&self.registry, cache_dir, repository, tag).await
    }

    /// Builds the cache in `cache_dir` into `repository:tag`, signs its
    /// digest with `key` (cosign), and returns the image reference and digest.
    pub async fn push_signed_cache(
        &self,
        cache_dir: &Path,
        repository: &str,
        tag: &str,
        key: &cosign::CosignKey,
    ) -> anyhow::Result<(String, String)> {
        push_signed_cache(&self.registry, cache_dir, repository, tag, key).await
    }

    /// Makes a cosign key pair at `key_path`, builds the fixture cache
    /// `fixture_name` into `repository:tag` and signs it; returns the key,
    /// the image reference and its digest.
    pub async fn push_signed_fixture(
        &self,
        key_path: &Path,
        fixture_name: &str,
        repository: &str,
        tag: &str,
    ) -> anyhow::Result<(cosign::CosignKey, String, String)> {
        let key = cosign::generate_key_pair(key_path)?;
        let (image, digest) = self
            .push_signed_cache(&fixture(fixture_name), repository, tag, &key)
            .await?;
        Ok((key, image, digest))
    }

    /// [`gkm_testenv::eventually`]: polls `check` until it returns `Some`;
    /// an error (`check`'s, or `what` not holding after `timeout`) carries
    /// the operator's last log lines.
    pub async fn eventually<T, F, Fut>(
        &self,
        what: &str,
        timeout: std::time::Duration,
        check: F,
    ) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
    {
        gkm_testenv::eventually(what, timeout, check)
            .await
            .with_context(|| {
                format!(
                    "{what}; operator log:\n{}",
                    self.log_tail("operator", None, 30)
                )
            })
    }

    /// The last lines of a gkm process's log (`operator`, or `agent`/`csi` of a node).
    pub fn log_tail(&self, which: &str, node: Option<&str>, lines: usize) -> String {
        let path = match node {
            Some(n) => self
                .dir
                .join("nodes")
                .join(n)
                .join(format!("gkm-{which}.log")),
            None => self.dir.join(format!("gkm-{which}.log")),
        };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// Builds the cache in `cache_dir` into `repository:tag` in `registry` and
/// returns the image reference and digest.
pub async fn push_cache(
    registry: &Registry,
    cache_dir: &Path,
    repository: &str,
    tag: &str,
) -> anyhow::Result<(String, String)> {
    let reference = format!("{}/{repository}:{tag}", registry.addr());
    let dest: ImageRef = reference.parse()?;
    let options = RegistryOptions {
        insecure: true,
        ..RegistryOptions::default()
    };
    let built = gkm_oci::build(cache_dir, &dest, &BuildOptions::default(), &options)
        .await
        .with_context(|| format!("building {} into {reference}", cache_dir.display()))?;
    Ok((reference, built.digest.to_string()))
}

/// Builds the cache in `cache_dir` into `repository:tag` in `registry`,
/// signs its digest with `key` (cosign), and returns the image reference and
/// digest.
pub async fn push_signed_cache(
    registry: &Registry,
    cache_dir: &Path,
    repository: &str,
    tag: &str,
    key: &cosign::CosignKey,
) -> anyhow::Result<(String, String)> {
    let (image, digest) = push_cache(registry, cache_dir, repository, tag).await?;
    let repository = image.rsplit_once(':').map_or(image.as_str(), |(r, _)| r);
    cosign::sign(key, &format!("{repository}@{digest}"))?;
    Ok((image, digest))
}
