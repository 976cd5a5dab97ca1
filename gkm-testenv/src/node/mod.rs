//! Real Kubernetes nodes: a kubelet with its own containerd and runc,
//! registered with a [`ControlPlane`], running pods in real containers.
//!
//! Each [`RealNode`] lives in a directory of its own: containerd's root and
//! state (network namespaces included), runc's state, the kubelet's
//! `--root-dir` (so `plugins_registry/`, `plugins/`, `device-plugins/` and
//! `pod-resources/` are the node's own), its certificates and logs, and a
//! CNI bridge of its own with no gateway, so the host's routes and iptables
//! are untouched. Kubelets serve on loopback with a certificate the
//! apiserver trusts; the apiserver reaches them with a client certificate
//! (so pod logs and exec work as on any cluster) and authorizes them with
//! the Node authorizer.
//!
//! Images come from [`TestImage`] archives imported with `ctr`: every node
//! has [`BUSYBOX_IMAGE`], which is also its pause image. Test pods should use
//! `imagePullPolicy: Never` (or `IfNotPresent`).
//!
//! Teardown (on drop, and at exit for nodes kept in statics) kills the
//! containers, the shims, containerd and the kubelet, unmounts everything
//! under the node's directory, deletes the bridge and the kubelet's log
//! links, and removes the directory. Real nodes and kwok nodes share one
//! cluster without trouble.

mod config;
mod image;
mod teardown;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

pub use config::NodePaths;
pub use image::TestImage;
pub use teardown::mounts_under;

use crate::binaries::{Component, find_binary};
use crate::control_plane::ControlPlane;
use crate::ports::free_port;
use crate::process::{Process, at_exit, remove_at_exit};

/// Static busybox, every node's general-purpose test image (and its pause
/// image): `/bin/sh`, `ls`, `cat`, `sha256sum`… run by default `sleep`.
pub const BUSYBOX_IMAGE: &str = "gkm.test/busybox:1";
/// The pod sandbox ("pause") image of every node.
pub const PAUSE_IMAGE: &str = "gkm.test/pause:1";

/// Where the kubelet serves device plugins, whatever its `--root-dir`.
const DEVICE_PLUGINS_DIR: &str = "/var/lib/kubelet/device-plugins";

/// How long a node may take to become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct RealNodeOptions {
    /// The Node's name.
    pub name: String,
    /// Labels the kubelet registers the Node with (`--node-labels`).
    pub labels: BTreeMap<String, String>,
    /// Images to import besides busybox.
    pub images: Vec<TestImage>,
}

/// A running kubelet + containerd pair registered as a Node; torn down when
/// dropped (see the [module docs](self)).
pub struct RealNode {
    name: String,
    paths: NodePaths,
    kubelet: Option<Process>,
    kubelet_bin: PathBuf,
    kubelet_args: Vec<OsString>,
    containerd: Option<Process>,
    ctr: PathBuf,
    admin_kubeconfig: PathBuf,
    started_in: Duration,
    teardown: Arc<dyn Fn() + Send + Sync>,
}

/// Nodes started by this process, for unique bridge names and subnets.
static NODES: AtomicU32 = AtomicU32::new(0);

impl RealNode {
    /// Starts a node registered with `plane` and waits until it is Ready.
    pub async fn start(plane: &ControlPlane, options: RealNodeOptions) -> anyhow::Result<RealNode> {
        let began = Instant::now();
        let name = options.name.clone();
        if name.is_empty() {
            bail!("a real node needs a name");
        }
        let kubelet_bin = find_binary(Component::Kubelet)?;
        let containerd_bin = find_binary(Component::Containerd)?;
        let runc = find_binary(Component::Runc)?;
        let ctr = sibling(&containerd_bin, "ctr")?;
        sibling(&containerd_bin, "containerd-shim-runc-v2")?;

        let dir = crate::temp_dir()?.keep();
        remove_at_exit(&dir);
        let paths = NodePaths { dir: dir.clone() };
        let index = NODES.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let bridge = format!("gkmb{:x}n{index}", pid % 0x10_0000);
        let subnet = format!("10.{}.{}.0/24", 64 + index % 64, pid % 256);
        let node_ip = node_address(pid, index);

        let teardown: Arc<dyn Fn() + Send + Sync> = {
            let done = AtomicBool::new(false);
            let (dir, runc, runc_root, bridge) =
                (dir.clone(), runc.clone(), paths.runc_root(), bridge.clone());
            Arc::new(move || {
                if !done.swap(true, Ordering::SeqCst) {
                    teardown::teardown(&dir, &runc, &runc_root, &bridge);
                    let _ = std::fs::remove_dir_all(&dir);
                }
            })
        };
        {
            let teardown = teardown.clone();
            at_exit(Box::new(move || teardown()));
        }

        // The node's IP: the kubelet refuses a loopback one, and this machine
        // may not have a dummy link type, so it sits on the node's own bridge.
        make_bridge(&bridge, node_ip)?;
        std::fs::create_dir_all(paths.device_plugins())?;
        std::fs::create_dir_all(paths.kubelet_root())?;
        make_shared(&paths.kubelet_root())?;
        for sub in [
            paths.cni_conf_dir(),
            paths.cni_ipam_dir(),
            paths.kubelet_root(),
            paths.pod_logs(),
            paths.cdi_spec_dir(),
            dir.join("pki"),
        ] {
            std::fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
        }
        write(
            &paths.cni_conf_dir().join("10-gkm.conflist"),
            &serde_json::to_string_pretty(&config::cni_conflist(&paths, &bridge, &subnet))?,
        )?;
        write(
            &paths.containerd_config(),
            &config::containerd_toml(&paths, &runc, PAUSE_IMAGE),
        )?;

        let mut node = RealNode {
            name: name.clone(),
            paths: paths.clone(),
            kubelet: None,
            kubelet_bin,
            kubelet_args: Vec::new(),
            containerd: None,
            ctr,
            admin_kubeconfig: plane.kubeconfig().to_path_buf(),
            started_in: Duration::ZERO,
            teardown,
        };

        let mut containerd = Command::new(&containerd_bin);
        containerd
            .arg("--config")
            .arg(paths.containerd_config())
            .args(["--log-level", "warn"])
            .env("PATH", search_path(&containerd_bin));
        node.containerd = Some(Process::spawn(
            "containerd",
            containerd,
            &dir.join("containerd.log"),
        )?);
        node.wait_containerd(Duration::from_secs(30))?;

        let mut images = vec![TestImage::busybox(&[BUSYBOX_IMAGE, PAUSE_IMAGE])?];
        images.extend(options.images.iter().cloned());
        for image in &images {
            node.import_image(image)?;
        }

        let serving = plane
            .authority()
            .serving_for(&name, &[IpAddr::V4(node_ip)])?;
        write(&paths.kubelet_cert(), &serving.cert)?;
        write(&paths.kubelet_key(), &serving.key)?;
        let kubeconfig = plane.kubeconfig_for(&format!("system:node:{name}"), &["system:nodes"])?;
        std::fs::copy(&kubeconfig, paths.kubelet_kubeconfig())?;
        let kubelet_config = config::kubelet_config(
            &paths,
            &plane.dir().join("pki/ca.crt"),
            &node_ip.to_string(),
            free_port()?,
        );
        write(
            &paths.kubelet_config(),
            &serde_json::to_string_pretty(&kubelet_config)?,
        )?;
        let labels: Vec<String> = options
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        node.kubelet_args = [
            format!("--config={}", paths.kubelet_config().display()),
            format!("--kubeconfig={}", paths.kubelet_kubeconfig().display()),
            format!("--root-dir={}", paths.kubelet_root().display()),
            format!("--hostname-override={name}"),
            format!("--node-ip={node_ip}"),
            format!("--node-labels={}", labels.join(",")),
            "--v=1".to_string(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        node.spawn_kubelet()?;
        node.wait_ready(SystemTime::UNIX_EPOCH).await?;
        node.started_in = began.elapsed();
        tracing::info!(node = %name, seconds = node.started_in.as_secs_f64(), "real node ready");
        Ok(node)
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the node keeps everything.
    pub fn paths(&self) -> &NodePaths {
        &self.paths
    }

    /// The kubelet's `--root-dir` (the `/var/lib/kubelet` of this node).
    pub fn kubelet_dir(&self) -> PathBuf {
        self.paths.kubelet_root()
    }

    /// The kubelet's plugin registry (`plugins_registry/`), watched for
    /// registration sockets.
    pub fn plugins_registry_dir(&self) -> PathBuf {
        self.kubelet_dir().join("plugins_registry")
    }

    /// The kubelet's plugins directory (`plugins/`), where CSI drivers keep
    /// their sockets.
    pub fn plugins_dir(&self) -> PathBuf {
        self.kubelet_dir().join("plugins")
    }

    /// The device-plugin directory, holding the kubelet's `kubelet.sock`
    /// (the kubelet's `/var/lib/kubelet/device-plugins`, see [`NodePaths::device_plugins`]).
    pub fn device_plugins_dir(&self) -> PathBuf {
        self.paths.device_plugins()
    }

    /// The kubelet's pod-resources socket.
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.kubelet_dir().join("pod-resources/kubelet.sock")
    }

    /// The CDI spec directory the node's containerd reads.
    pub fn cdi_spec_dir(&self) -> PathBuf {
        self.paths.cdi_spec_dir()
    }

    /// Where pods' volumes are mounted (`pods/<uid>/volumes/…`).
    pub fn pods_dir(&self) -> PathBuf {
        self.kubelet_dir().join("pods")
    }

    /// containerd's socket.
    pub fn containerd_socket(&self) -> PathBuf {
        self.paths.containerd_socket()
    }

    /// How long the start took, until the Node was Ready.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The last `lines` lines of the kubelet's log.
    pub fn kubelet_log_tail(&self, lines: usize) -> String {
        self.kubelet
            .as_ref()
            .map(|k| k.log_tail(lines))
            .unwrap_or_default()
    }

    /// Imports `image` into the node's containerd (namespace `k8s.io`).
    pub fn import_image(&self, image: &TestImage) -> anyhow::Result<()> {
        let archive = self
            .paths
            .dir
            .join(format!("image-{}.tar", sanitize(&image.names()[0])));
        image.write_archive(&archive)?;
        let out = Command::new(&self.ctr)
            .arg("--address")
            .arg(self.containerd_socket())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(&archive)
            .output()
            .with_context(|| format!("running {}", self.ctr.display()))?;
        let _ = std::fs::remove_file(&archive);
        if !out.status.success() {
            bail!(
                "ctr images import {:?} on node {}: {}{}",
                image.names(),
                self.name,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Lets the node's containerd pull from the plain-HTTP registry at
    /// `addr` (`host:port`, the test ground's loopback registry), as an
    /// administrator's `hosts.toml` does; containerd reads it at the next
    /// pull, no restart.
    pub fn trust_plain_http_registry(&self, addr: &str) -> anyhow::Result<()> {
        let dir = self.paths.containerd_registry_hosts().join(addr);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let file = dir.join("hosts.toml");
        std::fs::write(&file, config::plain_http_hosts_toml(addr))
            .with_context(|| format!("writing {}", file.display()))
    }

    /// Stops the kubelet (SIGTERM) and starts it again with the same
    /// configuration, waiting until it serves again: its device-plugin
    /// socket is new and the Node is Ready. Pods and their mounts stay.
    pub async fn restart_kubelet(&mut self) -> anyhow::Result<()> {
        self.stop_kubelet();
        self.start_kubelet().await
    }

    /// Stops the kubelet, as a crash or an upgrade would; see
    /// [`RealNode::start_kubelet`].
    pub fn stop_kubelet(&mut self) {
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop(Duration::from_secs(10));
        }
    }

    /// Starts the kubelet again after [`RealNode::stop_kubelet`] and waits
    /// until it serves.
    pub async fn start_kubelet(&mut self) -> anyhow::Result<()> {
        let restarted = SystemTime::now();
        self.spawn_kubelet()?;
        self.wait_ready(restarted).await
    }

    /// Starts the kubelet in a mount namespace of its own, where the node's
    /// device-plugin directory is bind-mounted on
    /// `/var/lib/kubelet/device-plugins`: the kubelet serves device plugins
    /// there whatever its `--root-dir`, so two kubelets on one machine would
    /// otherwise share (and wipe) one directory. Its root directory is a
    /// shared mount, so the volumes it mounts reach containerd and the CSI
    /// driver's mounts reach it.
    fn spawn_kubelet(&mut self) -> anyhow::Result<()> {
        let script = format!(
            "mkdir -p {DEVICE_PLUGINS_DIR} && mount --bind \"$0\" {DEVICE_PLUGINS_DIR} && exec \"$@\""
        );
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "unchanged",
            "--",
            "/bin/sh",
            "-c",
            &script,
        ])
        .arg(self.paths.device_plugins())
        .arg(&self.kubelet_bin)
        .args(&self.kubelet_args)
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
        let log = self.paths.dir.join("kubelet.log");
        // Keep the log of an earlier run beside the new one.
        if log.exists() {
            let _ = std::fs::rename(&log, self.paths.dir.join("kubelet.previous.log"));
        }
        self.kubelet = Some(Process::spawn("kubelet", cmd, &log)?);
        Ok(())
    }

    fn wait_containerd(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(containerd) = self.containerd.as_mut() {
                containerd.check_running()?;
            }
            let ok = Command::new(&self.ctr)
                .arg("--address")
                .arg(self.containerd_socket())
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "containerd of node {} not serving after {timeout:?}; log:\n{}",
                    self.name,
                    self.containerd
                        .as_ref()
                        .map(|c| c.log_tail(30))
                        .unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the kubelet has (re)created its device-plugin socket
    /// after `since` and the Node is Ready.
    async fn wait_ready(&mut self, since: SystemTime) -> anyhow::Result<()> {
        let client = crate::control_plane::client_from_kubeconfig(&self.admin_kubeconfig).await?;
        let nodes: Api<Node> = Api::all(client);
        let socket = self.device_plugins_dir().join("kubelet.sock");
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last: String;
        loop {
            if let Some(kubelet) = self.kubelet.as_mut() {
                kubelet.check_running()?;
            }
            let fresh_socket = std::fs::metadata(&socket)
                .and_then(|m| m.modified())
                .is_ok_and(|modified| modified >= since);
            if fresh_socket {
                match nodes.get_opt(&self.name).await {
                    Ok(Some(node)) => {
                        let ready = node
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
                        match ready {
                            Some(c) if c.status == "True" => return Ok(()),
                            Some(c) => {
                                last = format!(
                                    "Ready={} {}: {}",
                                    c.status,
                                    c.reason.clone().unwrap_or_default(),
                                    c.message.clone().unwrap_or_default()
                                )
                            }
                            None => last = "no Ready condition yet".to_string(),
                        }
                    }
                    Ok(None) => last = "no Node object yet".to_string(),
                    Err(e) => last = e.to_string(),
                }
            } else {
                last = format!("the kubelet has not (re)created {} yet", socket.display());
            }
            if Instant::now() > deadline {
                bail!(
                    "node {} not Ready after {READY_TIMEOUT:?} ({last}); kubelet log:\n{}",
                    self.name,
                    self.kubelet_log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop(Duration::from_secs(2));
        }
        // Idempotent: a node torn down already is left as it is.
        (self.teardown)();
        if let Some(mut containerd) = self.containerd.take() {
            containerd.kill();
        }
    }
}

/// The node's IP, unique per process and node: `10.128.0.0/9` holds the
/// process id (15 bits) and the node's index (4 bits).
fn node_address(pid: u32, index: u32) -> Ipv4Addr {
    let n = ((pid % 32_768) << 4) | (index & 0xf);
    Ipv4Addr::new(10, 128 + (n >> 16) as u8, (n >> 8) as u8, n as u8)
}

/// Makes `dir` a shared mount point (bound onto itself), so mounts below it
/// propagate between the kubelet's mount namespace and the host's.
fn make_shared(dir: &Path) -> anyhow::Result<()> {
    let dir = dir.to_string_lossy();
    for args in [vec!["--bind", &*dir, &*dir], vec!["--make-rshared", &*dir]] {
        let out = Command::new("mount")
            .args(&args)
            .output()
            .context("running mount (Debian package mount)")?;
        if !out.status.success() {
            bail!(
                "mount {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

/// Creates the bridge `name`, up, holding `ip`/32.
fn make_bridge(name: &str, ip: Ipv4Addr) -> anyhow::Result<()> {
    let _ = Command::new("ip").args(["link", "delete", name]).output();
    for args in [
        vec!["link", "add", "name", name, "type", "bridge"],
        vec!["addr", "add", &format!("{ip}/32"), "dev", name],
        vec!["link", "set", name, "up"],
    ] {
        let out = Command::new("ip")
            .args(&args)
            .output()
            .context("running ip (Debian package iproute2)")?;
        if !out.status.success() {
            bail!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

/// `name` in the directory of `binary` (the tools directory links each
/// component's binaries side by side).
fn sibling(binary: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let path = binary.with_file_name(name);
    if !path.is_file() {
        bail!(
            "{} is not installed beside {}; install it with `{}` from the repository root",
            name,
            binary.display(),
            Component::Containerd.install_command()
        );
    }
    Ok(path)
}

/// `PATH` for containerd: its own directory first (the shim), then the
/// system's.
fn search_path(containerd: &Path) -> OsString {
    let mut path = OsString::from(containerd.parent().unwrap_or(Path::new("/")));
    path.push(":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    path
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn write(path: &Path, contents: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}
