//! gkm's Kubernetes side in one dependency.
//!
//! Each component is a crate of its own, so a binary or an embedder links
//! only what it uses; this crate re-exports them, the components behind
//! features of the same name (all on by default):
//!
//! | module | crate | what |
//! | --- | --- | --- |
//! | [`api`] ([`crd`], [`cache_object`]) | `gkm-k8s-api` | the `gkm.io/v1alpha1` CRD types, their conditions |
//! | [`node`] | `gkm-k8s-node` | what the agent and the CSI driver share on a node's disk, the CSI volume attributes |
//! | [`kubelet`] | `gkm-k8s-kubelet` | the kubelet's gRPC APIs and unix socket plumbing |
//! | [`runtime`] | `gkm-k8s-runtime`, with `gkm-k8s-daemon` | endpoints, readiness, metrics (`gkm-k8s-daemon`'s, re-exported), leader election, the apiserver client |
//! | `operator` | `gkm-k8s-operator` | resolution, verification, status, PVC delivery, its webhook |
//! | `agent` | `gkm-k8s-agent` | the node agent |
//! | `csi` | `gkm-k8s-csi` | the CSI node driver: read-only and copy-on-write views of caches, capture trees, delta uppers |
//! | `device_plugin` | `gkm-k8s-device-plugin` | the kubelet device plugin |
//! | `dra` | `gkm-k8s-dra` | the kubelet DRA plugin (driver `gpu.gkm.io`) |
//! | `extender` | `gkm-k8s-extender` | the kube-scheduler extender |
//!
//! ```
//! let yaml = gkm_k8s::crd::crds_yaml().unwrap();
//! assert!(yaml.contains("name: gkmcaches.gkm.io"));
//! ```

pub use gkm_k8s_api as api;
pub use gkm_k8s_api::{cache_object, crd};
pub use gkm_k8s_kubelet as kubelet;
pub use gkm_k8s_node as node;
pub use gkm_k8s_runtime as runtime;

#[cfg(feature = "agent")]
pub use gkm_k8s_agent as agent;
#[cfg(feature = "csi")]
pub use gkm_k8s_csi as csi;
#[cfg(feature = "device-plugin")]
pub use gkm_k8s_device_plugin as device_plugin;
#[cfg(feature = "dra")]
pub use gkm_k8s_dra as dra;
#[cfg(feature = "extender")]
pub use gkm_k8s_extender as extender;
#[cfg(feature = "operator")]
pub use gkm_k8s_operator as operator;
