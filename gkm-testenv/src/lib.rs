//! Real components for gkm's tests, started on loopback and torn down after.
//!
//! - [`ControlPlane`]: etcd + kube-apiserver with generated certificates, RBAC
//!   authorization and an admin kubeconfig.
//! - [`Registry`]: a Distribution registry (`docker-registry`) on a free port.
//! - [`promlint`]: a metrics exposition checked by Prometheus's parser and
//!   promlint.
//! - [`RealNode`]: a real node (kubelet, containerd, runc, CNI) registered
//!   with a control plane, running pods in real containers.
//! - [`Scheduler`]: kube-scheduler with a configuration of the test's choosing.
//! - [`triton`]: real Triton checking that a delivered cache tree is reused,
//!   for every target of the fleet in `fixtures/triton`.
//! - [`cpu_seconds`], [`memory_mib`]: what a process has used, for benchmarks.
//!
//! Binaries come from `KUBEBUILDER_ASSETS` (the envtest convention) when it is
//! set, else from `$GKM_TOOLS_DIR/bin` (default `~/.cache/gkm-tools/bin`),
//! which `hack/ci/components.sh` fills. A missing binary is an error that names
//! the command installing it; nothing is ever faked.
//!
//! Every process is started with `PR_SET_PDEATHSIG` from a thread that lives
//! as long as the test process, and killed on drop and at exit, so no process
//! outlives `cargo test`, even when a test panics or the run is killed.
#![deny(missing_docs)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apply;
mod binaries;
mod certs;
mod claims;
mod containerd_restart;
mod control_plane;
mod control_plane_restart;
pub mod cutedsl;
pub mod deepgemm;
mod fixtures;
pub mod flashinfer;
mod kubelet_crash;
mod kwok;
mod metrics;
mod node;
mod pods;
mod poll;
mod ports;
mod process;
mod registry;
mod respawn;
mod scheduler;
mod service_account;
pub mod torch;
mod trees;
pub mod triton;
pub mod tvm_ffi;
mod usage;

pub use apply::{describe_object, field_managers, yaml_documents};
pub use binaries::{Component, find_binary, find_binary_in, tools_bin_dir, workspace_binary};
pub use claims::{AllocatedDevice, allocated_devices, pod_claim_name};
pub use containerd_restart::ContainerdRestarts;
pub use control_plane::{ControlPlane, ControlPlaneOptions};
pub use control_plane_restart::ControlPlaneRestarts;
pub use fixtures::{fixture_cache, fixture_caches, repo_root};
pub use kubelet_crash::crash_kubelet;
pub use kwok::{KWOK_NODE_ANNOTATION, Kwok};
pub use metrics::{Sample, dashboard_metrics, promlint, samples};
pub use node::{
    BUSYBOX_IMAGE, NodePaths, PAUSE_IMAGE, RealNode, RealNodeOptions, TestImage, mounts_under,
};
pub use pods::{pod_events, pod_log, running_pod_log, wait_for_pod};
pub use poll::{POLL_INTERVAL, TimedOut, eventually, settle, until};
pub use ports::{free_port, http_get};
pub use process::Process;
pub use registry::Registry;
pub use scheduler::Scheduler;
pub use service_account::{service_account_groups, service_account_user};
pub use trees::{copy_tree, copy_tree_in_order, tree_files};
pub use usage::{cpu_seconds, memory_mib};

/// A fresh temporary directory, removed on drop.
pub fn temp_dir() -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix("gkm-test-").tempdir()
}

/// The free-space reserve agents started by the tests keep (`--keep-free`).
///
/// Forced by the machine the tests run on, not by gkm: its disk reports a
/// size of which only a small share is ever available to it, so the
/// agent's default reserve, a share of the filesystem's size (the kubelet's
/// eviction threshold plus a margin), would measure the machine rather than
/// gkm. A fixed size keeps the reserve in force; `gkm-oci`'s
/// `disk_limits` tests show the share on a filesystem of their own.
pub const AGENT_KEEP_FREE_ARG: &str = "--keep-free=1GiB";

/// The free-space reserve CSI drivers started by the tests keep for
/// relocation layers (the chart's `views.relocation.keepFree`), for the
/// reason [`AGENT_KEEP_FREE_ARG`] gives.
pub const CSI_KEEP_FREE: &str = "1GiB";

/// [`CSI_KEEP_FREE`] as the `gkm-csi` flag.
pub const CSI_KEEP_FREE_ARG: &str = "--relocation-keep-free=1GiB";
