//! The operator: one generic controller for `GKMCache` and `ClusterGKMCache`.
//!
//! For each cache it resolves `spec.image` to a digest (again every
//! `resolveInterval`, so a moved tag rolls out unless [`tag_follow`] holds
//! it back), verifies the signature against the administrator's signers
//! (a cache's own only where [`TenantSigners`] lets them count) as the
//! operator's [`PolicyFloor`] allows, records the verdict the agents act on, rolls the node
//! agents' reports up into counts, conditions and the Status column, and
//! writes status once per real change. A cache with `storageClassName` also
//! gets GKM's claims and fill Jobs ([`crate::pvc`]); with DRA, every cache
//! gets a DeviceClass selecting the GPUs it fits ([`device_class`]).
//! Deleting a cache waits
//! until no pod uses its claims and no node uses or reports it, removes what
//! it made, then releases the finalizer.
//!
//! The decisions are pure functions the reconcile feeds, such as the rollup
//! of node reports into a cache's counts and state:
//!
//! ```
//! use gkm_k8s_api::crd::CacheState;
//! use gkm_k8s_operator::rollup::{Entry, rollup};
//! let extracted = Entry { state: Some(CacheState::Extracted), pods: 0, variant: None };
//! let mounted = Entry { state: Some(CacheState::Running), pods: 2, variant: None };
//! let nodes = [
//!     vec![("sha256:aa".to_string(), extracted)],
//!     vec![("sha256:aa".to_string(), mounted)],
//! ];
//! let (counts, state) = rollup(Some("sha256:aa"), false, &nodes);
//! assert_eq!(state, CacheState::Running);
//! assert_eq!((counts.node_in_use_cnt, counts.node_not_in_use_cnt), (1, 1));
//! assert_eq!(counts.pod_running_cnt, 2);
//! ```

pub mod capture;
pub mod device_class;
mod error;
pub mod image_volume;
mod metrics;
mod pending_writes;
pub mod pvc;
mod reconcile;
mod release;
mod release_watch;
mod report_index;
mod resolutions;
pub mod rollup;
mod status;
mod status_owners;
pub mod tag_follow;
pub mod tenant_signers;
mod variants;
mod verdict;
mod verifier;
mod watched_index;
pub mod webhook;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use gkm_oci::RegistryOptions;
use k8s_openapi::api::core::v1::Node;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client};
use tracing::{info, warn};

pub use error::{Error, Result};
pub use metrics::{Metrics, OperatorCollector};
pub use reconcile::FINALIZER;
pub use tenant_signers::TenantSigners;
pub use verdict::PolicyFloor;
pub use verifier::{ImageVerifier, RegistryVerifier};

use gkm_k8s_api::cache_object::CacheObject;
use gkm_k8s_api::crd::{ClusterGKMCache, GKMCache, SignaturePolicy};
use report_index::ReportIndex;

/// How the operator runs.
#[derive(Clone)]
pub struct OperatorConfig {
    /// How to reach registries.
    pub registry: RegistryOptions,
    /// The administrator's policy: for caches without `spec.signature`, and
    /// the signers of every cache whose own signers do not count
    /// ([`TenantSigners`]). Without one, such caches are never verified, so
    /// never delivered.
    pub default_policy: Option<SignaturePolicy>,
    /// The namespaces whose caches' own `spec.signature` signers count
    /// (none by default: only the administrator's signers do).
    pub tenant_signers: TenantSigners,
    /// How often tags are resolved again when a cache does not say.
    pub resolve_interval: Duration,
    /// What every cache's signature policy must meet.
    pub floor: PolicyFloor,
    /// How long a verified image stays verified before its signatures are
    /// checked again (also when nothing changed).
    pub reverify_interval: Duration,
    /// The name events are reported under.
    pub instance: String,
    /// How PVC-mode caches get their claims, volumes and fill Jobs.
    pub pvc: crate::pvc::PvcOptions,
    /// Whether each cache gets a DeviceClass selecting the gpu.gkm.io
    /// devices it fits ([`device_class`]); needs DRA and the rights on
    /// DeviceClasses the chart grants with it.
    pub device_classes: bool,
    /// The capture controller's options; `None` runs no capture controller
    /// (the `GKMCacheCapture` CRD need not be installed).
    pub capture: Option<capture::controller::CaptureControllerOptions>,
}

/// An [`OperatorConfig`] the operator cannot run with, naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidConfig {
    /// `resolve_interval` is outside what the operator accepts.
    #[error("must be from {min:?} to {max:?}, not {got:?} (the resolve interval)")]
    ResolveInterval {
        /// The shortest allowed.
        min: Duration,
        /// The longest allowed.
        max: Duration,
        /// What was given.
        got: Duration,
    },
    /// `reverify_interval` is too short.
    #[error("must be at least {min:?}, not {got:?} (the re-verify interval)")]
    ReverifyInterval {
        /// The shortest allowed.
        min: Duration,
        /// What was given.
        got: Duration,
    },
    /// `floor.required` names no signer, so it would require nothing.
    #[error("must name at least one signer (the required signers)")]
    NoRequiredSigner,
    /// `floor.allowed_modes` is empty.
    #[error("must name at least one mode (the allowed signature modes; Enforce is always allowed)")]
    NoAllowedMode,
}

impl OperatorConfig {
    /// The shortest resolve and re-verify interval: shorter than a cache
    /// may ask for (tests, labs), never zero, which would spin against the
    /// registry.
    pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

    /// Checks what [`run`] relies on; the binary's flags go through this too.
    pub fn validate(&self) -> std::result::Result<(), InvalidConfig> {
        let (min, max) = (Self::MIN_INTERVAL, gkm_k8s_api::crd::MAX_RESOLVE_INTERVAL);
        if self.resolve_interval < min || self.resolve_interval > max {
            return Err(InvalidConfig::ResolveInterval {
                min,
                max,
                got: self.resolve_interval,
            });
        }
        if self.reverify_interval < min {
            return Err(InvalidConfig::ReverifyInterval {
                min,
                got: self.reverify_interval,
            });
        }
        if self.floor.allowed_modes.is_empty() {
            return Err(InvalidConfig::NoAllowedMode);
        }
        if self
            .floor
            .required
            .as_ref()
            .is_some_and(|p| p.signers.as_ref().is_none_or(Vec::is_empty))
        {
            return Err(InvalidConfig::NoRequiredSigner);
        }
        Ok(())
    }
}

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            registry: RegistryOptions::default(),
            default_policy: None,
            tenant_signers: TenantSigners::default(),
            resolve_interval: Duration::from_secs(300),
            floor: PolicyFloor::default(),
            reverify_interval: Duration::from_secs(3600),
            instance: "gkm-operator".into(),
            pvc: crate::pvc::PvcOptions::default(),
            device_classes: false,
            capture: None,
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    /// The apiserver client.
    pub client: Client,
    /// Configuration.
    pub config: OperatorConfig,
    /// Signature verification.
    pub verifier: Arc<dyn ImageVerifier>,
    /// Event recorder.
    pub recorder: Recorder,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Tag resolutions, reused within each cache's resolve interval.
    pub resolutions: resolutions::Resolutions,
    /// Status writes the controllers' caches do not show yet.
    pub pending_writes: pending_writes::PendingWrites,
    /// The images' variants, read once per digest.
    pub variants: variants::Variants,
    /// The releases written last, per cache.
    pub releases: release::Releases,
    /// The caches' DeviceClasses written last.
    pub device_classes: device_class::DeviceClasses,
    /// The cluster's Nodes, their names and uids only: whether a node that
    /// reports still exists, without a request per report.
    pub nodes: reflector::Store<PartialObjectMeta<Node>>,
    /// What PVC delivery reads, watched: gkm's Jobs, claims and volumes,
    /// the namespaces, and the pods using claims.
    pub pvc_watches: Arc<pvc::Watches>,
}

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
    let reporter = Reporter {
        controller: "gkm-operator".into(),
        instance: Some(config.instance.clone()),
    };
    let captures = config
        .capture
        .clone()
        .map(|options| capture::controller::run(client.clone(), options));
    let captures = async move {
        if let Some(captures) = captures {
            captures.await;
        }
    };
    let nodes = watch_nodes(&client).await;
    let pvc_watches = pvc::Watches::start(&client).await;
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        config,
        verifier,
        metrics,
        resolutions: resolutions::Resolutions::default(),
        pending_writes: pending_writes::PendingWrites::default(),
        variants: variants::Variants::default(),
        releases: release::Releases::default(),
        device_classes: device_class::DeviceClasses::default(),
        nodes,
        pvc_watches,
    });
    futures::join!(
        controller::<GKMCache>(ctx.clone()),
        controller::<ClusterGKMCache>(ctx),
        captures
    );
    Ok(())
}

/// The node reports of `K`'s kind, indexed by a watch of their own (as
/// long as the index lives), and a stream naming the caches whose entries
/// each event changed.
fn watch_reports<K: CacheObject>(
    client: &Client,
) -> (
    Arc<ReportIndex>,
    impl futures::Stream<Item = ObjectRef<K>> + Send + 'static,
) {
    let (changed, triggers) = futures::channel::mpsc::unbounded();
    let index = ReportIndex::watched::<K::NodeReport>(client, move |caches| {
        for (namespace, name) in caches {
            let cache = ObjectRef::<K>::new(&name);
            let cache = match &namespace {
                Some(ns) => cache.within(ns),
                None => cache,
            };
            // The receiver lives as long as the controller.
            let _ = changed.unbounded_send(cache);
        }
    });
    (Arc::new(index), triggers)
}

/// A store of the cluster's Nodes, once it has listed them all. Only names
/// and uids are kept: at a thousand nodes, their labels, annotations and
/// managed fields would be most of the operator's memory.
async fn watch_nodes(client: &Client) -> reflector::Store<PartialObjectMeta<Node>> {
    let api: Api<PartialObjectMeta<Node>> = Api::all(client.clone());
    let (reader, writer) = reflector::store();
    let reflect = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(|node| {
                let meta = &mut node.metadata;
                (meta.labels, meta.annotations, meta.managed_fields) = (None, None, None);
            }),
    )
    .for_each(|event| {
        if let Err(e) = event {
            warn!(error = %e, "watching nodes");
        }
        futures::future::ready(())
    });
    tokio::spawn(reflect);
    // The stream retries for ever; its store only drops with the process.
    let _ = reader.wait_until_ready().await;
    reader
}

async fn controller<K: CacheObject>(ctx: Arc<Context>) {
    let caches: Api<K> = Api::all(ctx.client.clone());
    let (reports, changed) = watch_reports::<K>(&ctx.client);
    reports.wait_until_listed().await;
    // `reconcile_on` (kube-runtime's `unstable-runtime-reconcile-on`): the
    // one watch of the reports feeds the index and names the caches whose
    // entries changed. `watches` would need a second watch of every report,
    // and would trigger every cache a report mentions on each of its writes.
    let controller = Controller::new(caches, watcher::Config::default());
    // Changes to what PVC delivery reads (its Jobs, claims, volumes, the
    // pods using them, namespaces) trigger the caches they concern.
    let pvc_changed = ctx.pvc_watches.triggers(controller.store());
    // A release deleted or changed by another hand is written again.
    let restored = release_watch::watch_releases::<K>(ctx.clone());
    let controller = controller
        .reconcile_on(changed)
        .reconcile_on(pvc_changed)
        .reconcile_on(restored)
        .shutdown_on_signal();
    let cached = controller.store();
    ctx.metrics.count_caches(move || {
        cached
            .state()
            .iter()
            .map(|c| c.cache_status().and_then(|s| s.state))
            .collect()
    });
    controller
        .run(
            move |cache, ctx| {
                let reports = reports.clone();
                async move {
                    let began = Instant::now();
                    let outcome =
                        crate::error::contained(reconcile::reconcile(cache, ctx.clone(), reports))
                            .await;
                    ctx.metrics
                        .reconciled(K::SCOPE, began.elapsed(), outcome.as_ref().err());
                    outcome
                }
            },
            reconcile::error_policy,
            ctx,
        )
        .for_each(|result| async move {
            match result {
                Ok((cache, _)) => info!(cache = %cache.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile"),
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::error::contained;
    use crate::{InvalidConfig, OperatorConfig};
    use gkm_k8s_api::crd::SignaturePolicy;
    use kube::runtime::controller::Action;

    #[test]
    fn a_config_is_checked_before_the_operator_runs() {
        assert_eq!(OperatorConfig::default().validate(), Ok(()));
        let spinning = OperatorConfig {
            resolve_interval: Duration::ZERO,
            ..OperatorConfig::default()
        };
        let err = spinning.validate().expect_err("a zero interval spins");
        assert!(
            matches!(err, InvalidConfig::ResolveInterval { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("must be from 1s"), "{err}");
        let never_reverified = OperatorConfig {
            reverify_interval: Duration::from_millis(10),
            ..OperatorConfig::default()
        };
        assert!(matches!(
            never_reverified.validate(),
            Err(InvalidConfig::ReverifyInterval { .. })
        ));
        let mut empty_floor = OperatorConfig::default();
        empty_floor.floor.required = Some(SignaturePolicy::default());
        assert_eq!(empty_floor.validate(), Err(InvalidConfig::NoRequiredSigner));
        let mut no_mode = OperatorConfig::default();
        no_mode.floor.allowed_modes.clear();
        assert_eq!(no_mode.validate(), Err(InvalidConfig::NoAllowedMode));
    }

    #[tokio::test]
    async fn a_panicking_reconcile_is_an_error_not_the_end() {
        let outcome = contained(async {
            let values: Vec<u64> = Vec::new();
            if values.is_empty() {
                panic!("reconcile met an impossible object");
            }
            Ok(Action::await_change())
        })
        .await;
        let err = outcome.expect_err("a panic is an error");
        assert!(err.to_string().contains("impossible object"), "{err}");
        assert!(
            contained(async { Ok(Action::await_change()) })
                .await
                .is_ok()
        );
    }
}
