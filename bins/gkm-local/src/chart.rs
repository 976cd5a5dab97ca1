//! gkm installed the way users install it: its images, built by
//! `hack/images/build.sh` from binaries already built and imported into a real
//! node's containerd, and the chart `deploy/helm/gkm`, installed with `helm`.
//!
//! [`SandboxChart`] holds the flags that the machine this runs on forces on
//! the chart (through a Helm post-renderer); users install the chart as it
//! is.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use gkm_testenv::{Component, ControlPlane, RealNode, find_binary, free_port, workspace_binary};

use gkm_k8s_devices::NodePaths;

use crate::dra::GpuPath;
use crate::{SYSTEM_NAMESPACE, repo_root};

/// The release name gkm's chart is installed under.
pub const RELEASE: &str = "gkm";

/// The components the chart runs by default, by their image names.
pub const COMPONENTS: [&str; 4] = ["gkm-agent", "gkm-csi", "gkm-device-plugin", "gkm-operator"];

/// The components the chart runs with DRA instead of the device plugin
/// (`dra.enabled`, `devicePlugin.enabled=false`), by their image names.
pub const DRA_COMPONENTS: [&str; 4] = ["gkm-agent", "gkm-csi", "gkm-dra-plugin", "gkm-operator"];

/// The components the chart runs when the real node's GPUs reach pods by
/// `gpu_path`.
pub fn components(gpu_path: GpuPath) -> [&'static str; 4] {
    match gpu_path {
        GpuPath::DevicePlugin => COMPONENTS,
        GpuPath::Dra => DRA_COMPONENTS,
    }
}

/// The chart, in the repository.
pub fn chart_dir() -> PathBuf {
    repo_root().join("deploy/helm/gkm")
}

/// Runs `helm args` against the cluster of `kubeconfig`; its stdout, or an
/// error with its output.
pub fn helm(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(find_binary(Component::Helm)?)
        .args(args)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "helm {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What the chart's pods, the events of its namespace and the logs of its
/// containers that are not ready say, for an install that did not become
/// ready in time; what could not be read says why instead.
pub fn pods_report(kubeconfig: &Path) -> String {
    let kubectl = |args: &[&str]| -> String {
        let run = find_binary(Component::Kubectl).and_then(|kubectl| {
            let out = Command::new(kubectl)
                .args(args)
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .output()?;
            Ok(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        });
        run.unwrap_or_else(|e| format!("(kubectl {}: {e:#})", args.join(" ")))
    };
    // The last words of each container that is not ready: those of its
    // previous run when it restarted (a crash loop says why it exits there).
    let not_ready = kubectl(&[
        "get",
        "pods",
        "-n",
        SYSTEM_NAMESPACE,
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[*].ready}{"\n"}{end}"#,
    ]);
    let mut logs = String::new();
    for line in not_ready.lines() {
        let mut fields = line.split_whitespace();
        let Some(pod) = fields.next() else { continue };
        let ready: Vec<&str> = fields.collect();
        if !ready.is_empty() && ready.iter().all(|r| *r == "true") {
            continue;
        }
        for previous in ["--previous=true", "--previous=false"] {
            logs.push_str(&format!(
                "\nlogs of {pod} ({previous}):\n{}",
                kubectl(&[
                    "logs",
                    "-n",
                    SYSTEM_NAMESPACE,
                    pod,
                    "--all-containers",
                    "--tail=40",
                    previous
                ])
            ));
        }
    }
    format!(
        "the chart's pods:\n{}\nevents in {SYSTEM_NAMESPACE}:\n{}{logs}",
        kubectl(&["get", "pods", "-n", SYSTEM_NAMESPACE, "-o", "wide"]),
        kubectl(&[
            "get",
            "events",
            "-n",
            SYSTEM_NAMESPACE,
            "--sort-by=.lastTimestamp"
        ]),
    )
}

/// Builds the [`COMPONENTS`]' images with `hack/images/build.sh` into
/// `out`, from the binaries built beside this program (debug builds,
/// stripped), and imports them into the containerd of each of `nodes`.
pub fn build_and_import_images(out: &Path, nodes: &[&RealNode]) -> anyhow::Result<()> {
    build_and_import(out, nodes, &COMPONENTS)
}

/// Builds the images of `components` with `hack/images/build.sh` into
/// `out`, from the binaries built beside this program (debug builds,
/// stripped), and imports them into the containerd of each of `nodes`.
pub fn build_and_import(
    out: &Path,
    nodes: &[&RealNode],
    components: &[&str],
) -> anyhow::Result<()> {
    let bin_dir = workspace_binary("gkm-operator")?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let script = repo_root().join(IMAGES_SCRIPT);
    let mut cmd = Command::new(&script);
    cmd.args(["--profile", "dev", "--bin-dir"])
        .arg(&bin_dir)
        .arg("--out")
        .arg(out);
    for node in nodes {
        cmd.arg("--import").arg(node.containerd_socket());
    }
    let run = cmd
        .args(components)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    anyhow::ensure!(
        run.status.success(),
        "{IMAGES_SCRIPT}: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    Ok(())
}

/// The script that builds gkm's images, in the repository.
const IMAGES_SCRIPT: &str = "hack/images/build.sh";

/// The apiserver's port, from its URL.
fn apiserver_port(plane: &ControlPlane) -> anyhow::Result<u16> {
    plane
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no port in {}", plane.url()))
}

/// `helm install`/`upgrade` flags that install the chart onto one real node
/// of this machine, and where that node's store ends up.
pub struct SandboxChart {
    args: Vec<String>,
    store: PathBuf,
}

impl SandboxChart {
    /// Flags for `node` of `plane`, writing the post-renderer into
    /// `work_dir`; the agent reads its simulated GPUs from
    /// `<gpus_dir>/<node name>/gpus.yaml`.
    ///
    /// The images are the ones [`build_and_import_images`] imported (never
    /// pulled); the kubelet's directories are the node's own; the store lives
    /// inside the node's kubelet directory, because this machine's `/` is not
    /// a shared mount and the kubelet directory is (the CSI driver's
    /// `HostToContainer` propagation needs one). The release waits for its
    /// pods to be Ready.
    pub fn for_node(
        plane: &ControlPlane,
        node: &RealNode,
        work_dir: &Path,
        gpus_dir: &Path,
    ) -> anyhow::Result<SandboxChart> {
        SandboxChart::for_node_with(plane, node, work_dir, gpus_dir, None)
    }

    /// Like [`SandboxChart::for_node`]; with `dra_tree` (the chart's
    /// `dra.enabled`), its DRA plugin reads the simulated node tree at those
    /// paths, without NVML, and writes its CDI specs where the node's
    /// containerd reads them.
    pub fn for_node_with(
        plane: &ControlPlane,
        node: &RealNode,
        work_dir: &Path,
        gpus_dir: &Path,
        dra_tree: Option<&NodePaths>,
    ) -> anyhow::Result<SandboxChart> {
        let post_renderer = sandbox_post_renderer(
            &work_dir.join("post-render"),
            apiserver_port(plane)?,
            gpus_dir,
            dra_tree,
        )?;
        let store = node.kubelet_dir().join("gkm");
        let mut args = vec![
            "--namespace".into(),
            SYSTEM_NAMESPACE.into(),
            "--set".into(),
            "image.pullPolicy=Never".into(),
            "--set".into(),
            format!("kubeletDir={}", node.kubelet_dir().display()),
            "--set".into(),
            format!(
                "devicePlugin.devicePluginsDir={}",
                node.device_plugins_dir().display()
            ),
            "--set".into(),
            format!("storeDir={}", store.display()),
            // On the host network (below) two operator replicas on one
            // node would bind the same ports: one is enough here.
            "--set".into(),
            "operator.replicas=1".into(),
            // The machine's disk keeps little of its size free
            // (gkm_testenv::AGENT_KEEP_FREE_ARG says why).
            "--set".into(),
            format!("views.relocation.keepFree={}", gkm_testenv::CSI_KEEP_FREE),
            "--post-renderer".into(),
            post_renderer,
            "--wait".into(),
            "--timeout=4m".into(),
        ];
        if dra_tree.is_some() {
            args.extend([
                "--set".into(),
                format!("dra.cdiDir={}", node.cdi_spec_dir().display()),
                "--set-json".into(),
                r#"dra.extraArgs=["--no-nvml"]"#.into(),
                // The apiserver cannot reach a Service here (no
                // kube-proxy), so it cannot call the operator's webhook,
                // which checks the binds of pods that kube-scheduler places
                // (as it places pods with claims).
                "--set".into(),
                "webhook.enabled=false".into(),
            ]);
        }
        Ok(SandboxChart {
            args,
            store: store.join("store"),
        })
    }

    /// The flags, for `helm install` and `helm upgrade`.
    pub fn args(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }

    /// The node store the chart's agent extracts into.
    pub fn store(&self) -> &Path {
        &self.store
    }
}

/// JSON patch operations pointing the chart's DRA plugin at the simulated
/// node tree `tree`: each root mounted read-only at its own path, and the
/// plugin's root flags (which the `test` operations check are where the
/// chart puts them) naming those paths.
fn dra_tree_ops(tree: &NodePaths) -> Vec<String> {
    let mut ops = Vec::new();
    for (index, (flag, chart_path, path)) in [
        ("sysfs-root", "/host/sys", &tree.sysfs_root),
        ("proc-root", "/host/proc", &tree.proc_root),
        ("dev-root", "/dev", &tree.dev_root),
    ]
    .into_iter()
    .enumerate()
    {
        let arg = format!("/spec/template/spec/containers/0/args/{}", index + 3);
        ops.push(format!(
            r#"{{"op": "test", "path": "{arg}", "value": "--{flag}={chart_path}"}}"#
        ));
        ops.push(format!(
            r#"{{"op": "replace", "path": "{arg}", "value": "--{flag}={}"}}"#,
            path.display()
        ));
        let volume = format!("simulated-{flag}");
        ops.push(format!(
            r#"{{"op": "add", "path": "/spec/template/spec/volumes/-", "value": {{"name": "{volume}", "hostPath": {{"path": "{}", "type": "Directory"}}}}}}"#,
            path.display()
        ));
        ops.push(format!(
            r#"{{"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-", "value": {{"name": "{volume}", "mountPath": "{}", "readOnly": true}}}}"#,
            path.display()
        ));
    }
    ops
}

/// Writes a Helm post-renderer (kustomize, through `kubectl kustomize`) into
/// `dir` and returns its path.
///
/// Everything it changes is forced by the machine this runs on, not by gkm
/// or Kubernetes: this control plane has no kube-proxy and its apiserver and
/// registry listen on loopback only (plain HTTP), so the pods that call them
/// share the host's network, are pointed at the apiserver's loopback address
/// and allow an insecure registry; on the host network the operator's and
/// the agent's metrics need ports of their own (and a new operator pod
/// cannot start beside the old one); the machine has no GPU, so the agent
/// reads the simulated inventory `<gpus_dir>/<its node>/gpus.yaml`, and the
/// DRA plugin (with `dra_tree`) the simulated node tree at those paths,
/// mounted at the same paths (the device paths in its CDI specs are host
/// paths).
fn sandbox_post_renderer(
    dir: &Path,
    apiserver_port: u16,
    gpus_dir: &Path,
    dra_tree: Option<&NodePaths>,
) -> anyhow::Result<String> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let api_env = [
        r#"{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}"#.to_string(),
        format!(r#"{{"name": "KUBERNETES_SERVICE_PORT", "value": "{apiserver_port}"}}"#),
    ];
    let mut patches = String::new();
    let gpu_plugin = if dra_tree.is_some() {
        "gkm-dra-plugin"
    } else {
        "gkm-device-plugin"
    };
    for (kind, name, metrics_port) in [
        ("Deployment", "gkm-operator", Some(free_port()?)),
        ("DaemonSet", "gkm-agent", Some(free_port()?)),
        ("DaemonSet", gpu_plugin, None),
    ] {
        let mut ops = vec![
            r#"{"op": "add", "path": "/spec/template/spec/hostNetwork", "value": true}"#
                .to_string(),
        ];
        for env in &api_env {
            ops.push(format!(
                r#"{{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {env}}}"#
            ));
        }
        if kind == "Deployment" {
            // On the host network a new operator pod cannot start beside the
            // old one (their ports collide): replace it instead.
            ops.push(
                r#"{"op": "add", "path": "/spec/strategy", "value": {"type": "Recreate"}}"#
                    .to_string(),
            );
        }
        if name != gpu_plugin {
            // The local registry speaks plain HTTP.
            ops.push(
                r#"{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {"name": "GKM_INSECURE_REGISTRY", "value": "true"}}"#
                    .to_string(),
            );
        }
        if name == "gkm-agent" {
            // The node has no GPU: the agent reads a simulated one instead
            // (NODE_NAME is the chart's first variable of the agent).
            ops.push(format!(
                r#"{{"op": "add", "path": "/spec/template/spec/volumes/-", "value": {{"name": "gpus", "hostPath": {{"path": "{}", "type": "Directory"}}}}}}"#,
                gpus_dir.display()
            ));
            ops.push(
                r#"{"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-", "value": {"name": "gpus", "mountPath": "/simulated", "readOnly": true}}"#
                    .to_string(),
            );
            ops.push(
                r#"{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {"name": "GKM_SIMULATE", "value": "/simulated/$(NODE_NAME)/gpus.yaml"}}"#
                    .to_string(),
            );
            // The machine's disk keeps little of its size free
            // (gkm_testenv::AGENT_KEEP_FREE_ARG says why).
            ops.push(format!(
                r#"{{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "{}"}}"#,
                gkm_testenv::AGENT_KEEP_FREE_ARG
            ));
        }
        if let (Some(tree), "gkm-dra-plugin") = (dra_tree, name) {
            ops.extend(dra_tree_ops(tree));
        }
        if let Some(port) = metrics_port {
            ops.push(format!(
                r#"{{"op": "replace", "path": "/spec/template/spec/containers/0/args/2", "value": "--metrics-addr=0.0.0.0:{port}"}}"#
            ));
            ops.push(format!(
                r#"{{"op": "replace", "path": "/spec/template/spec/containers/0/ports/0/containerPort", "value": {port}}}"#
            ));
        }
        patches.push_str(&format!(
            "  - target: {{kind: {kind}, name: {name}}}\n    patch: '[{}]'\n",
            ops.join(", ")
        ));
    }
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!("resources: [rendered.yaml]\npatches:\n{patches}"),
    )?;
    let script = dir.join("post-render.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -eu\ncat > '{dir}/rendered.yaml'\nexec '{kubectl}' kustomize '{dir}'\n",
            dir = dir.display(),
            kubectl = find_binary(Component::Kubectl)?.display()
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok(script.display().to_string())
}
