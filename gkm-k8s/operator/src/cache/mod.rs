//! The cache controller: one generic controller for `GKMCache` and
//! `ClusterGKMCache`.
//!
//! For each cache it resolves `spec.image` to a digest (again every
//! `resolveInterval`, so a moved tag rolls out unless `tag_follow` holds
//! it back), verifies the signature against the administrator's signers
//! (a cache's own only where [`TenantSigners`] lets them count) as the
//! operator's [`PolicyFloor`] allows, records the verdict the agents act on
//! (the release), rolls the node agents' reports up into counts,
//! conditions and the Status column, and writes status once per real
//! change. Its delivery modes: the node agents' (the release they read), a
//! cache with `storageClassName` gets GKM's claims and fill Jobs
//! ([`pvc`]), and with DRA every cache gets a DeviceClass selecting the
//! GPUs it fits ([`device_class`]). Deleting a cache waits until no pod
//! uses its claims and no node uses or reports it, removes what it made,
//! then releases the finalizer.
//!
//! The decisions are pure functions the reconcile feeds, such as the rollup
//! of node reports into a cache's counts and state:
//!
//! ```
//! use gkm_k8s_api::crd::CacheState;
//! use gkm_k8s_operator::cache::rollup::{Entry, rollup};
//! let extracted = Entry { state: Some(CacheState::Extracted), ..Entry::default() };
//! let mounted = Entry { state: Some(CacheState::Running), pods: 2, ..Entry::default() };
//! let nodes = [
//!     vec![("sha256:aa".to_string(), extracted)],
//!     vec![("sha256:aa".to_string(), mounted)],
//! ];
//! let (counts, state) = rollup(Some("sha256:aa"), false, &nodes);
//! assert_eq!(state, CacheState::Running);
//! assert_eq!((counts.node_in_use_cnt, counts.node_not_in_use_cnt), (1, 1));
//! assert_eq!(counts.pod_running_cnt, 2);
//! ```

pub mod device_class;
mod pending_writes;
pub mod pvc;
mod reconcile;
mod release;
mod release_watch;
mod resolutions;
pub mod rollup;
mod status;
mod status_owners;
mod tag_follow;
mod tenant_signers;
mod variants;
mod verdict;
mod verifier;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tracing::warn;

pub use reconcile::FINALIZER;
pub use tenant_signers::{NotANamespace, TenantSigners};
pub use verdict::PolicyFloor;
pub use verifier::{ImageVerifier, RegistryVerifier};

use crate::config::OperatorConfig;
use crate::metrics::{ControllerKind, Metrics};
use crate::report_index::ReportIndex;
use gkm_k8s_api::cache_object::CacheObject;
use gkm_k8s_api::crd::{ClusterGKMCache, GKMCache};

/// What every reconcile shares.
pub(crate) struct Context {
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

/// Runs the cache controllers of both scopes until the process is asked
/// to stop.
pub(crate) async fn run(
    client: Client,
    config: OperatorConfig,
    verifier: Arc<dyn ImageVerifier>,
    metrics: Arc<Metrics>,
) {
    let reporter = Reporter {
        controller: "gkm-operator".into(),
        instance: Some(config.instance.clone()),
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
    );
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
        for key in caches {
            let cache = ObjectRef::<K>::new(key.name());
            let cache = match key.namespace() {
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
            .map(|c| {
                crate::cache_metrics::CacheFigures::of(
                    c.namespace().as_deref(),
                    &c.name_any(),
                    c.cache_status(),
                )
            })
            .collect()
    });
    let metrics = ctx.metrics.clone();
    crate::runner::run(
        controller,
        ControllerKind::Cache(K::SCOPE),
        metrics,
        ctx,
        move |cache, ctx| reconcile::reconcile(cache, ctx, reports.clone()),
    )
    .await;
}
