//! gkm's Kubernetes API: the `gkm.io/v1alpha1` custom resources and what
//! every component reads of them.
//!
//! - [`crd`]: `GKMCache`, `ClusterGKMCache`, their node reports
//!   `GKMCacheNode` and `ClusterGKMCacheNode`, their releases
//!   `GKMCacheRelease` and `ClusterGKMCacheRelease`, and `GKMGPUQuota`, with the
//!   CRD manifests ([`crd::crds_yaml`]).
//! - [`cache_object`]: what both cache kinds share, so one generic
//!   controller serves both, and their key ([`CacheKey`]).
//! - [`conditions`]: status conditions that keep their transition time.
//! - [`NodeFit`]: whether a node serves or fits a digest, by its report.
//! - [`served`]: waiting until the apiserver serves the cache kinds.
//! - [`quota`]: the GPU-model quota decision, for the extender and the
//!   operator's admission webhook alike.
//! - [`workloads`]: whose pods a pod's cache misses are counted under, how
//!   they add up, and when a workload is one its cache does not serve.
//!
//! ```
//! use gkm_k8s_api::crd::{GKMCache, crds_yaml};
//! let cache: GKMCache = serde_yaml::from_str(r#"
//! apiVersion: gkm.io/v1alpha1
//! kind: GKMCache
//! metadata: {name: vector-add, namespace: ml}
//! spec: {image: "registry.example/caches/vector-add:sm90"}
//! "#).unwrap();
//! assert_eq!(cache.spec.cache.image, "registry.example/caches/vector-add:sm90");
//! assert!(crds_yaml().unwrap().contains("name: gkmcaches.gkm.io"));
//! ```

pub mod cache_object;
pub mod conditions;
pub mod crd;
pub mod dra;
pub mod gpu_request;
mod node_fit;
pub mod quota;
pub mod served;
pub mod workloads;

pub use cache_object::{CacheKey, CacheObject, NodeReport, ReleaseObject, Scope};
pub use node_fit::NodeFit;
