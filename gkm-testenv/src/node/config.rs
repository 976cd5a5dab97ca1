//! The configuration files of a real node: containerd's, the kubelet's and
//! the CNI network's. Pure functions of the node's paths and ports.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// Where a node keeps everything, all under one directory.
#[derive(Debug, Clone)]
pub struct NodePaths {
    /// The node's directory.
    pub dir: PathBuf,
}

impl NodePaths {
    /// containerd's persistent root.
    pub fn containerd_root(&self) -> PathBuf {
        self.dir.join("containerd/root")
    }
    /// containerd's state (sockets of shims, netns mounts, rootfs mounts).
    pub fn containerd_state(&self) -> PathBuf {
        self.dir.join("containerd/state")
    }
    /// containerd's gRPC socket.
    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }
    /// containerd's configuration file.
    pub fn containerd_config(&self) -> PathBuf {
        self.dir.join("containerd/config.toml")
    }
    /// containerd's registry host directory (the CRI image service's
    /// `registry.config_path`): `<host>/hosts.toml` per registry, read at
    /// each pull.
    pub fn containerd_registry_hosts(&self) -> PathBuf {
        self.dir.join("containerd/certs.d")
    }
    /// runc's state root (`runc --root`), so teardown finds every container.
    pub fn runc_root(&self) -> PathBuf {
        self.dir.join("runc")
    }
    /// The CNI network configuration directory.
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("cni/net.d")
    }
    /// host-local IPAM's allocation records.
    pub fn cni_ipam_dir(&self) -> PathBuf {
        self.dir.join("cni/ipam")
    }
    /// The kubelet's `--root-dir`.
    pub fn kubelet_root(&self) -> PathBuf {
        self.dir.join("kubelet")
    }
    /// The device-plugin directory, bind-mounted on the kubelet's
    /// `/var/lib/kubelet/device-plugins` in its own mount namespace.
    pub fn device_plugins(&self) -> PathBuf {
        self.dir.join("device-plugins")
    }
    /// The kubelet's configuration file.
    pub fn kubelet_config(&self) -> PathBuf {
        self.dir.join("kubelet.json")
    }
    /// The kubelet's kubeconfig (user `system:node:<name>`).
    pub fn kubelet_kubeconfig(&self) -> PathBuf {
        self.dir.join("kubelet.kubeconfig")
    }
    /// The kubelet's serving certificate.
    pub fn kubelet_cert(&self) -> PathBuf {
        self.dir.join("pki/kubelet.crt")
    }
    /// The kubelet's serving key.
    pub fn kubelet_key(&self) -> PathBuf {
        self.dir.join("pki/kubelet.key")
    }
    /// The CDI spec directory containerd reads (`cdi_spec_dirs`), where DRA
    /// plugins write their specs.
    pub fn cdi_spec_dir(&self) -> PathBuf {
        self.dir.join("cdi")
    }
    /// Container logs (the kubelet's `podLogsDir`).
    pub fn pod_logs(&self) -> PathBuf {
        self.dir.join("pod-logs")
    }
}

/// containerd's configuration (version 3, containerd 2.x).
///
/// Everything lives under the node's directory, network namespaces
/// included (`netns_mounts_under_state_dir`), so nodes do not see each
/// other's state and teardown finds every mount. NRI is off (its socket
/// is machine-wide).
///
/// `restrict_oom_score_adj` is forced by the test ground: inside this
/// sandbox no process may lower its `oom_score_adj`, and the kubelet asks for
/// -998 on pod sandboxes, which runc then fails to set. containerd's own
/// option clamps the value to containerd's, which is what a real node with
/// that restriction would do. It does not change what gkm is tested for.
pub fn containerd_toml(paths: &NodePaths, runc: &Path, pause_image: &str) -> String {
    let q = |p: PathBuf| toml_string(&p.display().to_string());
    format!(
        r#"version = 3
root = {root}
state = {state}
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  enable_cdi = true
  cdi_spec_dirs = [{cdi}]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = {runc}
        Root = {runc_root}
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = {cni_conf}

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {pause}
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = {hosts}

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
        root = q(paths.containerd_root()),
        state = q(paths.containerd_state()),
        socket = q(paths.containerd_socket()),
        ttrpc = q(paths.dir.join("containerd/containerd.sock.ttrpc")),
        runc = toml_string(&runc.display().to_string()),
        runc_root = q(paths.runc_root()),
        cni_conf = q(paths.cni_conf_dir()),
        cdi = q(paths.cdi_spec_dir()),
        pause = toml_string(pause_image),
        hosts = q(paths.containerd_registry_hosts()),
    )
}

/// containerd's `hosts.toml` for a registry served over plain HTTP at
/// `addr` (`host:port`): pulls and resolves go to `http://addr`.
pub fn plain_http_hosts_toml(addr: &str) -> String {
    let server = toml_string(&format!("http://{addr}"));
    format!(
        "server = {server}\n\n[host.{server}]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n"
    )
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

/// The CNI network: the node's own bridge (made by the harness, holding the
/// node's IP), no gateway and no masquerading, so nothing else on the host
/// (routes, iptables, forwarding) changes.
pub fn cni_conflist(paths: &NodePaths, bridge: &str, subnet: &str) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "gkm-test",
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": false,
            "ipMasq": false,
            "hairpinMode": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": subnet}]],
                "dataDir": paths.cni_ipam_dir(),
            },
        }],
    })
}

/// The kubelet's configuration; it serves on `address` (the node's IP).
///
/// Settings this machine needs: cgroup v1 allowed (`failCgroupV1: false`),
/// no QoS cgroups or node-allocatable enforcement, cgroupfs, swap
/// tolerated. The kubelet serves on loopback with a certificate the
/// apiserver trusts, authenticates callers by the control plane's CA and
/// asks the apiserver to authorize them, as a production kubelet does.
/// Image garbage collection is off (images are imported, not pulled) and
/// eviction thresholds are low, since the machine's disk is shared.
pub fn kubelet_config(paths: &NodePaths, ca: &Path, address: &str, port: u16) -> Value {
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "tlsCertFile": paths.kubelet_cert(),
        "tlsPrivateKeyFile": paths.kubelet_key(),
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": ca},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": format!("unix://{}", paths.containerd_socket().display()),
        "podLogsDir": paths.pod_logs(),
        "volumePluginDir": paths.dir.join("volume-plugins"),
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": false,
        "enforceNodeAllocatable": [],
        "failSwapOn": false,
        "failCgroupV1": false,
        "protectKernelDefaults": false,
        "resolvConf": "/etc/resolv.conf",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "100Mi",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "100Mi",
        },
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "serializeImagePulls": false,
        "maxPods": 50,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_of_a_node_is_inside_its_directory() {
        let paths = NodePaths {
            dir: PathBuf::from("/tmp/gkm-test-x/node-a"),
        };
        let toml = containerd_toml(&paths, Path::new("/tools/runc"), "gkm.test/pause:1");
        for line in toml.lines().filter(|l| l.contains('/')) {
            assert!(
                line.contains("/tmp/gkm-test-x/node-a/")
                    || line.contains("/tools/runc")
                    || line.contains("/usr/lib/cni")
                    || line.contains("gkm.test/"),
                "{line}"
            );
        }
        assert!(toml.contains("restrict_oom_score_adj = true"));
        assert!(toml.contains("config_path = \"/tmp/gkm-test-x/node-a/containerd/certs.d\""));
        assert_eq!(
            plain_http_hosts_toml("127.0.0.1:5000"),
            "server = \"http://127.0.0.1:5000\"\n\n[host.\"http://127.0.0.1:5000\"]\n  \
             capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n"
        );
        let kubelet = kubelet_config(&paths, Path::new("/ca.crt"), "10.128.0.17", 10250);
        assert_eq!(
            kubelet["containerRuntimeEndpoint"],
            "unix:///tmp/gkm-test-x/node-a/containerd/containerd.sock"
        );
        let cni = cni_conflist(&paths, "gkmb1n0", "10.90.0.0/24");
        assert_eq!(cni["plugins"][0]["ipMasq"], false);
        assert_eq!(cni["plugins"][0]["isGateway"], false);
    }
}
