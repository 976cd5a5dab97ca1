//! The node agent: one per node.
//!
//! It discovers the node's GPUs, labels the Node, serves the GPUs' readings
//! as metrics ([`telemetry`]), and keeps every cache of
//! either kind in step on this node, level-triggered: on any change to a
//! cache (and every `resync`) it
//!
//! 1. reads each cache's release, where the operator publishes the digest
//!    it resolved, its verdict and the image's variants with their GPU
//!    targets (read once by the operator, not by every node),
//! 2. checks those targets against the node's GPUs ([`gkm_core::compat`]),
//!    without a registry request,
//! 3. pulls and extracts compatible, verified caches into the content-addressed
//!    store ([`gkm_oci::Store`]: the manifest and the layer), never an
//!    unverified or incompatible one (off the pass, each under a total
//!    deadline, one per namespace at a time: a pass never waits for a
//!    registry),
//! 4. publishes its decision in the delivery index the CSI driver reads
//!    ([`gkm_k8s_node::delivery`]),
//! 5. reports in the node's `GKMCacheNode` (one per namespace) and
//!    `ClusterGKMCacheNode`, named after the node: GPUs, and per cache and
//!    digest the state, compatible and incompatible GPUs with reasons, size,
//!    and the pods using it (from the CSI driver's mount records); a report
//!    is written only when it changed, once changes pause for
//!    [`AgentConfig::report_batch_window`],
//! 6. removes store directories no cache or pod references, after a grace
//!    period.
//!
//! Beside the passes, it writes what the cluster says of the captures (every
//! pending one, and those whose trees are on the node) in the capture index
//! the CSI driver reads to publish and release capture trees
//! ([`gkm_k8s_node::captures`]).
//!
//! One namespace's failure stays in that namespace: a report that cannot
//! be written fails alone (one in a namespace being terminated is not
//! written at all), and the rest of the pass, garbage collection included,
//! runs. The first pass waits a delay fixed by the node's name
//! ([`start_delay`]), a pass the apiserver throttled delays the next as it
//! asked, and [`Liveness`] tells `/healthz` when passes stop.
//!
//! ```no_run
//! # async fn example(client: kube::Client) -> Result<(), gkm_k8s_agent::Error> {
//! let config = gkm_k8s_agent::AgentConfig::new("node-a", "/var/lib/gkm/store");
//! let ctrl_c = async {
//!     let _ = tokio::signal::ctrl_c().await;
//! };
//! gkm_k8s_agent::run(client, config, ctrl_c).await
//! # }
//! ```

pub mod allocations;
mod batching;
mod budget;
mod captures;
mod ended;
mod error;
mod extractions;
mod gc;
mod labels;
mod liveness;
mod metrics;
mod pacing;
mod plan;
mod reports;
mod retry;
mod seals;
mod slot_yield;
mod slots;
mod sync;
pub mod telemetry;
mod wakes;
mod workloads;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gkm_gpu::DiscoveryOptions;
use gkm_gpu::labels::LabelOptions;
use gkm_oci::{ExtractPolicy, FreeSpaceReserve, RegistryOptions};
use k8s_openapi::api::core::v1::Node;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;
use tracing::{info, warn};

use gkm_k8s_api::cache_object::ReleaseObject;
use gkm_k8s_api::crd::{ClusterGKMCacheRelease, GKMCacheRelease};

pub use crate::error::{Error, Result};

pub use labels::{FIELD_MANAGER as LABELS_FIELD_MANAGER, apply_node_labels};
pub use liveness::{Liveness, Stalled};
pub use metrics::AgentMetrics;
pub use pacing::start_delay;
pub use plan::{CacheInput, NodeView, plan_cache};
pub use reports::ReportFailure;
pub use slot_yield::SlowExtraction;
pub use telemetry::{GpuMetrics, TelemetryConfig};

/// The default cap on what one namespace's caches may hold in a node's
/// store: 64 GiB.
pub const DEFAULT_NAMESPACE_MAX_BYTES: u64 = 64 << 30;

/// How often the capture index is written while captured trees are on the
/// node, by default.
pub const DEFAULT_CAPTURE_INDEX_EVERY: Duration = Duration::from_secs(10);

/// How an agent runs.
#[derive(Clone)]
pub struct AgentConfig {
    /// The node this agent serves; its reports are named after it.
    pub node_name: String,
    /// The store root (`<store>/sha256/<hex>`, the delivery index, mount records).
    pub store_dir: PathBuf,
    /// Where the node's GPUs come from (sysfs + NVML, or a simulated file).
    pub discovery: DiscoveryOptions,
    /// How to reach registries.
    pub registry: RegistryOptions,
    /// Limits for extraction; by default it keeps the kubelet's eviction
    /// threshold plus a margin free on the store's filesystem
    /// ([`FreeSpaceReserve::KUBELET_EVICTION_PLUS_MARGIN`]).
    pub extract_policy: ExtractPolicy,
    /// The most bytes the node store may hold, counted as
    /// [`gkm_oci::tree_usage`] counts them; `None` (the default) for no cap
    /// beyond the free-space reserve.
    pub store_max_bytes: Option<u64>,
    /// The most bytes the caches of one namespace may hold in the node
    /// store (the cluster-scoped caches together count as one more
    /// namespace), so that one tenant cannot take the store from the
    /// others; a digest several namespaces use counts for each. Default
    /// [`DEFAULT_NAMESPACE_MAX_BYTES`]; `None` for no cap.
    pub namespace_max_bytes: Option<u64>,
    /// How long pulling and extracting one image may take in all.
    pub extract_deadline: Duration,
    /// When an extraction gives its slot up to waiting ones, cancelled and
    /// tried again later ([`SlowExtraction`]).
    pub slow_extraction: SlowExtraction,
    /// How long an unreferenced digest stays in the store.
    pub gc_grace: Duration,
    /// How often everything is checked even without a change.
    pub resync: Duration,
    /// How long reports that changed wait for no further change before
    /// they are written, so that releases arriving together make one write
    /// (at most ten windows after the first unwritten change, however long
    /// changes keep coming); `Duration::ZERO` writes at once.
    pub report_batch_window: Duration,
    /// The window the first pass is delayed within, by the node's name
    /// ([`start_delay`]), so that agents started together spread out.
    pub start_jitter: Duration,
    /// Whether to label the Node with its GPUs.
    pub label_node: bool,
    /// Which labels.
    pub label_options: LabelOptions,
    /// GPU metrics and their pod attribution; `None` for no GPU metrics.
    pub telemetry: Option<TelemetryConfig>,
    /// The agent's own metrics (store, extractions, passes).
    pub metrics: AgentMetrics,
    /// When passes last ended, for `/healthz`.
    pub liveness: Liveness,
    /// How often the capture index is written while captured trees are on
    /// the node, besides after each change to the node's captures; `None`
    /// for no capture index (the agent then reads no `GKMCacheCapture`, and
    /// the CSI driver keeps every captured tree).
    pub capture_index_every: Option<Duration>,
}

impl AgentConfig {
    /// A configuration for `node_name` with its store at `store_dir` and
    /// defaults for the rest.
    pub fn new(node_name: impl Into<String>, store_dir: impl Into<PathBuf>) -> AgentConfig {
        AgentConfig {
            node_name: node_name.into(),
            store_dir: store_dir.into(),
            discovery: DiscoveryOptions::default(),
            registry: RegistryOptions::default(),
            extract_policy: ExtractPolicy {
                free_space_reserve: FreeSpaceReserve::KUBELET_EVICTION_PLUS_MARGIN,
                ..ExtractPolicy::default()
            },
            store_max_bytes: None,
            namespace_max_bytes: Some(DEFAULT_NAMESPACE_MAX_BYTES),
            extract_deadline: Duration::from_secs(30 * 60),
            slow_extraction: SlowExtraction::DEFAULT,
            gc_grace: Duration::from_secs(600),
            resync: Duration::from_secs(30),
            report_batch_window: Duration::from_secs(1),
            start_jitter: Duration::from_secs(10),
            label_node: true,
            label_options: LabelOptions::default(),
            telemetry: None,
            metrics: AgentMetrics::default(),
            liveness: Liveness::default(),
            capture_index_every: Some(DEFAULT_CAPTURE_INDEX_EVERY),
        }
    }
}

/// Runs the agent until `shutdown` completes (the binary passes the
/// process's SIGTERM).
pub async fn run(
    client: Client,
    config: AgentConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let discovery = config.discovery.clone();
    let mut inventory = tokio::task::spawn_blocking(move || gkm_gpu::discover(&discovery))
        .await
        .map_err(|e| Error::Gpu(e.to_string()))?
        .map_err(|e| Error::Gpu(e.to_string()))?;
    // The CPU ISA caches of C++ kernels only are judged by: this host's, as
    // `gkm check` reads it, unless the inventory is simulated.
    if !inventory.simulated {
        inventory.cpu_isa = gkm_core::compat::host_cpu_isa();
    }
    info!(node = %config.node_name, gpus = inventory.gpus.len(), simulated = inventory.simulated, cpu_isa = ?inventory.cpu_isa, "GPUs discovered");
    for warning in &inventory.warnings {
        warn!(%warning, "GPU discovery");
    }
    if let Some(telemetry) = &config.telemetry {
        telemetry::start(
            telemetry,
            &config.node_name,
            &config.discovery,
            inventory.clone(),
        )
        .await;
    }

    // Agents started together (a rollout, a cluster restart) spread their
    // first lists and writes over the window.
    tokio::pin!(shutdown);
    let delay = pacing::start_delay(&config.node_name, config.start_jitter);
    info!(delay = ?delay, "first pass after a delay fixed by the node's name");
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = &mut shutdown => {
            info!("stopping");
            return Ok(());
        }
    }

    let _capture_index = config.capture_index_every.map(|every| {
        AbortOnDrop(captures::start(
            client.clone(),
            config.store_dir.clone(),
            every,
        ))
    });
    let changed = Arc::new(Notify::new());
    let namespaced = watch_releases::<GKMCacheRelease>(&client, &changed);
    let cluster = watch_releases::<ClusterGKMCacheRelease>(&client, &changed);
    // Its own Node's metadata only, as the kubelet watches its Node: no
    // read per pass, and a relabelling wakes the agent at once.
    let node = watch(
        watcher(
            Api::<PartialObjectMeta<Node>>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={}", config.node_name)),
        ),
        &changed,
        wakes::node_view,
    );
    let unwatched = |e: reflector::store::WriterDropped| Error::Watch(e.to_string());
    namespaced.wait_until_ready().await.map_err(unwatched)?;
    cluster.wait_until_ready().await.map_err(unwatched)?;
    node.wait_until_ready().await.map_err(unwatched)?;

    let mut agent = sync::Agent::new(
        client,
        config.clone(),
        inventory,
        sync::Watched {
            namespaced,
            cluster,
            node,
        },
        changed.clone(),
    )?;
    let mut tick = tokio::time::interval(config.resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut throttle = pacing::Throttle::default();
    loop {
        let retry = agent.next_retry();
        let due = sleep_until(retry);
        let reports_due = sleep_until(agent.reports_due());
        let pass = tokio::select! {
            _ = changed.notified() => true,
            _ = tick.tick() => true,
            _ = due => true,
            _ = reports_due => false,
            _ = &mut shutdown => {
                info!("stopping");
                return Ok(());
            }
        };
        let outcome = if pass {
            // Let a burst of events settle into one pass.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let started = std::time::Instant::now();
            let outcome = gkm_k8s_runtime::tasks::contained(agent.sync_once()).await;
            config.metrics.pass(outcome.is_ok(), started.elapsed());
            config.liveness.pass_ended();
            outcome
        } else {
            gkm_k8s_runtime::tasks::contained(agent.write_reports()).await
        };
        if let Err(e) = &outcome {
            warn!(error = %e, "sync failed; retrying at the next change or resync");
        }
        if let Some(wait) = throttle.after(outcome.as_ref().map(drop)) {
            warn!(wait = ?wait, "the apiserver throttled this pass; waiting as it asked");
            config.liveness.pass_deferred(wait);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = &mut shutdown => {
                    info!("stopping");
                    return Ok(());
                }
            }
        }
    }
}

/// A task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits until `at`; for ever when `None`.
async fn sleep_until(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Every release of kind `R` (one per cache), in a store; a change to what
/// one holds wakes the agent.
fn watch_releases<R: ReleaseObject>(client: &Client, changed: &Arc<Notify>) -> Store<R> {
    let events = watcher(Api::<R>::all(client.clone()), watcher::Config::default());
    watch(events, changed, wakes::release_view)
}

/// Keeps a store of what `events` shows, waking the agent (`changed`) when
/// an event changes what it reads of an object (`view`).
fn watch<K, S>(events: S, changed: &Arc<Notify>, view: fn(&K) -> serde_json::Value) -> Store<K>
where
    K: kube::Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
    S: futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
{
    let (reader, writer) = reflector::store();
    let changed = changed.clone();
    let mut seen = wakes::Seen::default();
    let stream = reflector::reflector(writer, events)
        .default_backoff()
        .for_each(move |event| {
            let wake = match &event {
                Ok(event) => seen.wakes(event, view),
                Err(e) => {
                    warn!(error = %e, "watching {}", K::kind(&Default::default()));
                    false
                }
            };
            if wake {
                changed.notify_one();
            }
            futures::future::ready(())
        });
    tokio::spawn(stream);
    reader
}
