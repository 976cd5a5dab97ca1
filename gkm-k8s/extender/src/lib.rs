//! gkm's kube-scheduler extender: GPU fit (whole and shared GPUs), quotas
//! per namespace and GPU model, packing against fragmentation, and
//! placement by where a pod's kernel caches fit and are extracted.
//!
//! The decisions are pure functions of an in-memory [`Index`] that
//! watches fill (`watch`); the HTTP verbs (`server`) read it. Filter and
//! prioritize never write anything. Bind reserves room in the index (check
//! and reservation under one lock, so concurrent binds never overshoot a
//! node or a quota), writes the device assignment annotation
//! ([`gkm_core::assignment`]) and binds the pod; every step may be retried.
//!
//! # Resources
//!
//! - Whole GPUs: the extended resources in [`IndexConfig`]
//!   (`nvidia.com/gpu` and `amd.com/gpu` by default; passthrough resources
//!   are added by flag), counted per node from allocatable minus what bound
//!   pods and reservations hold.
//! - Shared GPUs: [`GPU_CORES`] (percent of one GPU, 100 per GPU) and
//!   [`GPU_MEMORY`] (MiB). A node's GPUs come from its annotation
//!   [`DEVICES_ANNOTATION`], which gkm's device plugin publishes under the
//!   IDs it offers their units by ([`gkm_core::assignment`] holds the one
//!   naming both sides use); a node without it takes no shared-GPU pod.
//!   The extender picks the GPU and records it; enforcing the fraction
//!   inside the container is not the extender's job.
//!
//! # Quotas
//!
//! A [`gkm_k8s_api::crd::GKMGPUQuota`] caps what a namespace holds per GPU model,
//! the model being the node label [`DEFAULT_MODEL_LABEL`] that gkm's agent
//! writes.
//!
//! What a pod asks for, read as the scheduler reads it:
//!
//! ```
//! use gkm_k8s_extender::request::GpuRequest;
//! let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
//!     "metadata": {"name": "infer", "namespace": "ml"},
//!     "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
//! })).unwrap();
//! let request = GpuRequest::from_pod(&pod, &["nvidia.com/gpu".to_string()]).unwrap();
//! assert_eq!(request.gpus(), 2);
//! assert!(!request.is_shared());
//! ```

mod bind;
mod cache;
mod hold;
mod index;
mod latency;
mod node;
pub mod protocol;
pub use gkm_k8s_api::gpu_request as request;
mod server;
mod status;
mod verbs;
mod watch;

#[cfg(test)]
mod tests;

pub use cache::CacheFit;
pub use gkm_core::Refusal;
pub use gkm_k8s_api::quota::amount_of;
pub use hold::Share;
pub use index::{Choice, Index, IndexConfig};
pub use server::{Extender, LATENCY_PATH, MAX_BODY_BYTES, MAX_IN_FLIGHT, URL_PREFIX};

pub use gkm_k8s_api::gpu_request::{
    CORES_PER_GPU, DEFAULT_MODEL_LABEL, DEFAULT_WHOLE_RESOURCES, GPU_CORES, GPU_MEMORY,
};
/// The node annotation listing a node's shared-GPU devices:
/// `[{"id": "GPU-…", "cores": 100, "memory": 16384}]`.
pub const DEVICES_ANNOTATION: &str = gkm_core::assignment::NODE_GPUS_ANNOTATION;

/// Sets up the extender against `client`: the extender to serve (see
/// [`gkm_k8s_runtime::endpoints::Endpoints::with_routes`]) and the work to run beside it
/// (the watches, and the quota status writer every `status_period`). The
/// watches register their readiness checks in `readiness`; filter answers
/// with an error until all are ready.
pub fn start(
    client: kube::Client,
    config: IndexConfig,
    readiness: &gkm_k8s_runtime::readiness::Readiness,
    status_period: std::time::Duration,
) -> (
    std::sync::Arc<Extender>,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (store, writer) = kube::runtime::reflector::store();
    let extender = std::sync::Arc::new(Extender::new(
        config,
        Some(client.clone()),
        Some(store),
        readiness.clone(),
    ));
    let watches = watch::run(client.clone(), extender.clone(), writer, readiness);
    let status = status::run(client, extender.clone(), status_period);
    (extender, async move {
        futures::join!(watches, status);
    })
}
