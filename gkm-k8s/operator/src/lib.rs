//! gkm's controller manager: the controllers that act on gkm's custom
//! resources, the admission webhooks that answer for them, and what they
//! share.
//!
//! Where things live:
//!
//! - [`cache`]: the cache controller (`GKMCache` and `ClusterGKMCache`):
//!   resolves, verifies and releases each cache's image, rolls the node
//!   reports up into its status, and delivers it (the node agents' release,
//!   PVC delivery in [`cache::pvc`], DRA DeviceClasses).
//! - [`capture`]: the capture controller (`GKMCacheCapture`): runs the Job
//!   that captures a workload's cache into a signed image.
//! - [`admission`]: the webhooks (PVC mutation, image volumes, GPU quota),
//!   each with its decision and its server, and the server, certificates
//!   and configurations they share.
//! - Shared by them: [`names`] (object names, labels, the field manager),
//!   [`job_pod`] (the one restricted pod every Job runs), the controller
//!   runner (panic containment, metrics, retries), `report_index` (the
//!   node reports, indexed by cache), [`Metrics`] and [`Error`].
//!
//! A new controller gets a module of its own next to [`cache`] and
//! [`capture`]: pure decisions in submodules, a `run` that builds its
//! `kube` controller and hands it to the runner, and a line in [`run`]
//! below starting it (with its options in [`OperatorConfig`]).

pub mod admission;
pub mod cache;
pub mod cache_metrics;
pub mod capture;
mod config;
mod error;
pub mod job_pod;
mod metrics;
pub mod names;
mod report_index;
mod runner;

use std::sync::Arc;

use kube::Client;

pub use cache::{FINALIZER, ImageVerifier, PolicyFloor, RegistryVerifier, TenantSigners};
pub use config::{InvalidConfig, OperatorConfig};
pub use error::{Error, Result};
pub use metrics::{ControllerKind, Metrics, OperatorCollector};

/// Runs the cache controllers (and the capture controller, when
/// `config.capture` says so) until the process is asked to stop; refuses a
/// `config` that does not [validate](OperatorConfig::validate).
pub async fn run(
    client: Client,
    config: OperatorConfig,
    verifier: Arc<dyn ImageVerifier>,
    metrics: Arc<Metrics>,
) -> std::result::Result<(), InvalidConfig> {
    config.validate()?;
    let captures = config
        .capture
        .clone()
        .map(|options| capture::run(client.clone(), options, metrics.clone()));
    let captures = async move {
        if let Some(captures) = captures {
            captures.await;
        }
    };
    futures::join!(cache::run(client, config, verifier, metrics), captures);
    Ok(())
}
