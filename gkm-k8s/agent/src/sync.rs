//! One pass of the agent over every cache: read, plan, act, report.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use gkm_core::Gpu;
use gkm_core::compat::{CheckOptions, NODE_CHECK};
use gkm_gpu::Inventory;
use gkm_oci::{Digest, ImageRef, Repo, Store};
use k8s_openapi::api::core::v1::Node;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store as Reflected};
use kube::{Client, ResourceExt};
use tokio::sync::Notify;
use tracing::info;

use super::AgentConfig;
use super::batching::WriteDebouncer;
use super::extractions::{Extractions, tree_size};
use super::gc::Unreferenced;
use super::plan::{CacheInput, DeliveryChange, NodeView, held_digest, plan_cache};
use super::reports::{NodeReports, ReportFailure, gpu_statuses};
use super::slots::Scope;
use super::workloads::Workloads;
use crate::error::{Error, Result, blocking};
use gkm_k8s_api::cache_object::{CacheKey, ReleaseObject};
use gkm_k8s_api::crd::WorkloadUsage;
use gkm_k8s_api::crd::{CacheRelease, ClusterGKMCacheRelease, GKMCacheRelease, NodeCacheStatus};
use gkm_k8s_node::delivery::DeliveryIndex;
use gkm_k8s_node::mount_records::{MountRecords, PodRef};
use gkm_k8s_node::relocation;
use gkm_k8s_node::usage::UsageRecords;

/// What the agent knows of one image digest. A digest's content never
/// changes, so each fact is measured once.
#[derive(Default)]
struct DigestFacts {
    /// Bytes of its files in the store, once extracted or measured.
    size: Option<i64>,
    /// Bytes it takes in the store counted as the byte caps count them
    /// ([`gkm_oci::tree_usage`]), once measured.
    usage: Option<u64>,
}

/// What the agent watches: the releases of both cache kinds and its own
/// Node.
pub(super) struct Watched {
    /// Every `GKMCacheRelease`.
    pub(super) namespaced: Reflected<GKMCacheRelease>,
    /// Every `ClusterGKMCacheRelease`.
    pub(super) cluster: Reflected<ClusterGKMCacheRelease>,
    /// This node's Node, its metadata only.
    pub(super) node: Reflected<PartialObjectMeta<Node>>,
}

/// What the agent keeps on the node's disk: the store, the delivery index
/// it writes for the CSI driver, and the mount and usage records it reads.
struct NodeFiles {
    store: Store,
    index: DeliveryIndex,
    mounts: MountRecords,
    usage: UsageRecords,
}

/// What this node's pods do with one cache, per digest: the pods mounting
/// it, and what the workloads whose writable views of it ended compiled.
struct OnNode<'a> {
    pods: &'a BTreeMap<Digest, Vec<PodRef>>,
    usage: &'a BTreeMap<Digest, Vec<WorkloadUsage>>,
}

/// The agent's state between passes.
pub(super) struct Agent {
    client: Client,
    config: AgentConfig,
    inventory: Inventory,
    gpus: Vec<Gpu>,
    watched: Watched,
    files: NodeFiles,
    reports: NodeReports,
    /// The workloads of the node's pods and what they compiled.
    workloads: Workloads,
    /// When the reports that changed are written.
    batching: WriteDebouncer,
    /// What is known of each image digest this node deals with.
    facts: HashMap<Digest, DigestFacts>,
    /// Pulls and extractions, off the agent's loop.
    extractions: Extractions,
    /// Since when each stored digest has been unreferenced.
    unreferenced: Unreferenced,
    labelled: Option<BTreeMap<String, String>>,
}

impl Agent {
    pub(super) fn new(
        client: Client,
        config: AgentConfig,
        inventory: Inventory,
        watched: Watched,
        changed: Arc<Notify>,
    ) -> Result<Agent> {
        let store = Store::open(&config.store_dir)?;
        let quarantined = super::seals::quarantine_unsealed(&store)?;
        config.metrics.quarantined(quarantined.len());
        let gpus = inventory.usable_gpus().cloned().collect();
        let extractions = Extractions::new(
            store.clone(),
            config.extract_policy.clone(),
            super::budget::Caps {
                node: config.store_max_bytes,
                namespace: config.namespace_max_bytes,
            },
            config.extract_deadline,
            config.slow_extraction,
            config.metrics.clone(),
            changed,
        );
        Ok(Agent {
            files: NodeFiles {
                index: DeliveryIndex::new(store.root()),
                mounts: MountRecords::new(store.root()),
                usage: UsageRecords::new(store.root()),
                store,
            },
            workloads: Workloads::new(client.clone(), &config.node_name),
            reports: NodeReports::new(
                client.clone(),
                &config.node_name,
                gpu_statuses(&inventory),
                inventory.cpu_isa.clone(),
            ),
            batching: WriteDebouncer::new(config.report_batch_window),
            client,
            config,
            inventory,
            gpus,
            watched,
            facts: HashMap::new(),
            extractions,
            unreferenced: Unreferenced::default(),
            labelled: None,
        })
    }

    /// When a failed step is due to be tried again.
    pub(super) fn next_retry(&self) -> Option<Instant> {
        self.extractions.next_due()
    }

    /// When the reports that changed are due to be written
    /// ([`Agent::write_reports`]).
    pub(super) fn reports_due(&self) -> Option<Instant> {
        self.batching.due()
    }

    /// Writes the reports the last pass computed, when they changed.
    pub(super) async fn write_reports(&mut self) -> Result<()> {
        let failures = self.write_staged().await;
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::Reports(failures))
        }
    }

    async fn write_staged(&mut self) -> Vec<ReportFailure> {
        self.batching.attempted();
        self.reports.write_staged().await
    }

    /// Brings every cache on this node in step and reports.
    pub(super) async fn sync_once(&mut self) -> Result<()> {
        for (digest, size) in self.extractions.harvest() {
            self.facts.entry(digest).or_default().size = Some(size);
        }
        let node_labels = self.label_node().await?;
        let records = self.files.mounts.clone();
        let usage = self.files.usage.clone();
        let (mounts, ended) = blocking("reading the mount and usage records", move || {
            Ok((records.list()?, usage.list()?))
        })
        .await?;
        self.workloads.follow(&mounts, &ended).await;
        self.workloads.announce(&ended).await;
        let mut usage = self.workloads.usage(&ended);
        // What the store holds, listed once for the whole pass.
        let mark = self.extractions.mark_listing();
        let store = self.files.store.clone();
        let stored: HashSet<Digest> = blocking("listing the store", move || Ok(store.list()?))
            .await?
            .into_iter()
            .collect();
        let mounted: Vec<(Digest, SystemTime)> = mounts
            .iter()
            .map(|r| (r.digest.clone(), SystemTime::from(r.published)))
            .collect();
        let mut pods: HashMap<CacheKey, BTreeMap<Digest, Vec<PodRef>>> = HashMap::new();
        let mut referenced: HashSet<Digest> = HashSet::new();
        // The stored digests each namespace's caches and pods use, for the
        // byte caps.
        let mut uses: HashMap<Scope, HashSet<Digest>> = HashMap::new();
        for record in mounts {
            referenced.insert(record.digest.clone());
            uses.entry(record.cache.namespace().map(str::to_string))
                .or_default()
                .insert(record.digest.clone());
            pods.entry(record.cache)
                .or_default()
                .entry(record.digest)
                .or_default()
                .push(record.pod);
        }

        let mut keys = HashSet::new();
        let mut reports: BTreeMap<
            Option<String>,
            BTreeMap<String, BTreeMap<String, NodeCacheStatus>>,
        > = BTreeMap::new();
        let caches: Vec<Box<dyn Cache>> = self
            .watched
            .namespaced
            .state()
            .into_iter()
            .map(|c| Box::new(c) as Box<dyn Cache>)
            .chain(
                self.watched
                    .cluster
                    .state()
                    .into_iter()
                    .map(|c| Box::new(c) as Box<dyn Cache>),
            )
            .collect();
        let check = NODE_CHECK;
        for cache in &caches {
            let key = cache.key();
            let held = self.held(cache.release(), &node_labels, &check);
            if let Some(digest) = held.clone()
                && stored.contains(&digest)
            {
                uses.entry(key.namespace().map(str::to_string))
                    .or_default()
                    .insert(digest);
            }
            let cache_pods = pods.remove(&key).unwrap_or_default();
            let cache_usage = usage.remove(&key).unwrap_or_default();
            let (entries, kept) = self
                .plan_and_act(
                    cache.as_ref(),
                    &key,
                    &node_labels,
                    OnNode {
                        pods: &cache_pods,
                        usage: &cache_usage,
                    },
                    &stored,
                )
                .await?;
            referenced.extend(kept);
            let listed = entries.keys().filter_map(|d| d.parse::<Digest>().ok());
            for digest in listed.chain(held) {
                if stored.contains(&digest) {
                    referenced.insert(digest);
                }
            }
            if !entries.is_empty() {
                reports
                    .entry(key.namespace().map(str::to_string))
                    .or_default()
                    .insert(key.name().to_string(), entries);
            }
            keys.insert(key);
        }
        let namespaces: HashSet<Option<String>> = keys
            .iter()
            .map(|k| k.namespace().map(str::to_string))
            .collect();
        // Delivery entries of caches that are gone.
        let index = self.files.index.clone();
        blocking("pruning the delivery index", move || {
            for (key, _) in index.list()? {
                if !keys.contains(&key) {
                    index.remove(&key)?;
                }
            }
            Ok(())
        })
        .await?;
        // Reports that changed are written once changes pause
        // ([`WriteDebouncer`]); one namespace's report failing leaves the
        // others and garbage collection to run; the pass reports the
        // failures at its end.
        let now = Instant::now();
        let unwritten = self.reports.stage(reports, namespaces);
        let failures = match self.batching.offer(now, unwritten) {
            Some(due) if due <= now => self.write_staged().await,
            _ => Vec::new(),
        };
        let stored = self.collect_garbage(&referenced, &stored).await?;
        self.release_quarantine(mounted).await?;
        // Facts of digests no cache resolves to and the store does not hold
        // are of no further use (a tag moved on).
        let resolved: HashSet<Digest> = caches
            .iter()
            .flat_map(|c| {
                let release = c.release();
                let variants = release.variants.iter().flatten();
                let variants = variants.filter_map(|v| v.digest.parse::<Digest>().ok());
                release.resolved().into_iter().chain(variants)
            })
            .collect();
        self.facts.retain(|digest, _| {
            resolved.contains(digest)
                || stored.contains(digest)
                || self.extractions.is_running(digest)
        });
        self.measure_store(&stored).await?;
        let bytes = stored
            .iter()
            .filter_map(|d| Some((d.clone(), self.facts.get(d)?.usage?)))
            .collect();
        for digests in uses.values_mut() {
            digests.retain(|d| stored.contains(d));
        }
        self.extractions.stored(mark, bytes, uses);
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::Reports(failures))
        }
    }

    /// Sets the store metrics, measuring (off the loop) the digests whose
    /// size is not known yet, such as those extracted before a restart.
    async fn measure_store(&mut self, stored: &[Digest]) -> Result<()> {
        let unknown: Vec<(Digest, std::path::PathBuf)> = stored
            .iter()
            .filter(|d| {
                self.facts
                    .get(d)
                    .is_none_or(|f| f.size.is_none() || f.usage.is_none())
            })
            .filter_map(|d| self.files.store.get(d).map(|path| (d.clone(), path)))
            .collect();
        if !unknown.is_empty() {
            let measured = blocking("measuring the store", move || {
                Ok(unknown
                    .into_iter()
                    .map(|(digest, path)| {
                        // Measured again next pass if it cannot be now.
                        (digest, tree_size(&path), gkm_oci::tree_usage(&path).ok())
                    })
                    .collect::<Vec<_>>())
            })
            .await?;
            for (digest, size, usage) in measured {
                let facts = self.facts.entry(digest).or_default();
                facts.size = Some(size);
                facts.usage = usage;
            }
        }
        let bytes = stored.iter().filter_map(|d| self.size_of(d)).sum();
        self.config.metrics.store(stored.len(), bytes);
        Ok(())
    }

    /// Plans one cache, with the pods mounting it and what the workloads
    /// whose views of it ended compiled, and acts on the plan: publishes
    /// the delivery decision and starts (off the pass) the extraction the
    /// plan needs;
    /// returns the report entries and the stored digest served on meanwhile
    /// ([`Plan::keep`](crate::plan::Plan::keep)). Never waits for a registry.
    async fn plan_and_act(
        &mut self,
        cache: &dyn Cache,
        key: &CacheKey,
        node_labels: &BTreeMap<String, String>,
        on_node: OnNode<'_>,
        in_store: &HashSet<Digest>,
    ) -> Result<(BTreeMap<String, NodeCacheStatus>, Option<Digest>)> {
        let check = NODE_CHECK;
        let release = cache.release();
        let scope: Scope = key.namespace().map(str::to_string);
        // The digest this node holds: the variant its GPUs get of a
        // multi-target image.
        let held: Option<Digest> = self
            .held(release, node_labels, &check)
            .or_else(|| release.resolved());
        let known = held.as_ref().and_then(|d| self.facts.get(d));
        let extract_failed = held
            .as_ref()
            .and_then(|d| self.extractions.waiting(&scope, d));
        let stored = match &held {
            Some(d) if in_store.contains(d) => Ok(true),
            Some(_) => extract_failed.as_deref().map_or(Ok(false), Err),
            None => Ok(false),
        };
        let (index, index_key) = (self.files.index.clone(), key.clone());
        let serving = blocking("reading the delivery index", move || {
            Ok(index.get(&index_key)?)
        })
        .await?
        .filter(|d| d.is_deliverable() && in_store.contains(&d.digest))
        .map(|d| d.digest);
        let input = CacheInput {
            release,
            stored,
            size: known.and_then(|f| f.size),
            pods: on_node.pods,
            usage: on_node.usage,
            serving: serving.as_ref(),
        };
        let node = NodeView {
            labels: node_labels,
            gpus: &self.gpus,
            check: &check,
            cpu_isa: self.inventory.cpu_isa.as_deref(),
        };
        let plan = plan_cache(&input, &node);
        let (index, key) = (self.files.index.clone(), key.clone());
        blocking("writing the delivery index", move || match &plan.delivery {
            DeliveryChange::Publish(delivery) => Ok(index.publish(&key, delivery)?),
            DeliveryChange::Remove => Ok(index.remove(&key).map(drop)?),
            DeliveryChange::Unchanged => Ok(()),
        })
        .await?;
        if let Some(digest) = plan.extract {
            // Off the pass: the next pass plans again with the outcome.
            self.start_extraction(&scope, &release.image, digest);
        }
        Ok((plan.entries, plan.keep))
    }

    /// The digest this node holds for `release` ([`held_digest`]).
    fn held(
        &self,
        release: &CacheRelease,
        labels: &BTreeMap<String, String>,
        check: &CheckOptions,
    ) -> Option<Digest> {
        let node = NodeView {
            labels,
            gpus: &self.gpus,
            check,
            cpu_isa: self.inventory.cpu_isa.as_deref(),
        };
        held_digest(release, &node)
    }

    fn size_of(&self, digest: &Digest) -> Option<i64> {
        self.facts.get(digest).and_then(|f| f.size)
    }

    /// Pulls and extracts `digest` of `image` for a cache of `scope`
    /// (unless already under way: [`Extractions::start`]).
    fn start_extraction(&mut self, scope: &Scope, image: &str, digest: Digest) {
        match self.repo(image, &digest) {
            Ok(repo) => self.extractions.start(scope, repo, digest),
            Err(e) => self.extractions.failed(scope, &digest, e.to_string()),
        }
    }

    fn repo(&self, image: &str, digest: &Digest) -> Result<Repo> {
        let reference: ImageRef = image
            .parse()
            .map_err(|e: gkm_oci::Error| Error::InvalidSpec(format!("{image}: {e}")))?;
        Ok(Repo::open(
            &reference.with_digest(digest),
            &self.config.registry,
        )?)
    }

    /// Removes the digests of `stored` (this pass's listing of the store)
    /// that nothing references, not being extracted either, once they have
    /// been unreferenced for the grace period; returns the digests the store
    /// still holds. The removals run off the async runtime.
    async fn collect_garbage(
        &mut self,
        referenced: &HashSet<Digest>,
        stored: &HashSet<Digest>,
    ) -> Result<Vec<Digest>> {
        let mut keep = referenced.clone();
        keep.extend(self.extractions.running().cloned());
        let expired =
            self.unreferenced
                .expired(stored, &keep, Instant::now(), self.config.gc_grace);
        let store = self.files.store.clone();
        let removed = blocking("removing unreferenced caches from the store", move || {
            let mut removed = Vec::new();
            for digest in expired {
                if store.remove(&digest)? {
                    let root = store.root();
                    relocation::remove_layers(root, &digest).map_err(|source| Error::Io {
                        path: relocation::layers_of(root, &digest),
                        source,
                    })?;
                    removed.push(digest);
                }
            }
            Ok(removed)
        })
        .await?;
        for digest in &removed {
            info!(%digest, "removed unreferenced cache from the store");
            self.unreferenced.removed(digest);
            if let Some(facts) = self.facts.get_mut(digest) {
                facts.size = None;
                facts.usage = None;
            }
        }
        let mut left: Vec<Digest> = stored
            .iter()
            .filter(|d| !removed.contains(d))
            .cloned()
            .collect();
        left.sort();
        Ok(left)
    }

    /// Removes the quarantined entries no pod can see any more
    /// ([`super::seals::releasable`]).
    async fn release_quarantine(&self, mounted: Vec<(Digest, SystemTime)>) -> Result<()> {
        let store = self.files.store.clone();
        blocking("removing quarantined store entries", move || {
            let quarantined = store.quarantined()?;
            for entry in super::seals::releasable(&quarantined, &mounted) {
                store.remove_quarantined(entry)?;
                info!(digest = %entry.digest, path = %entry.path.display(), "removed a quarantined store entry no pod mounts");
            }
            Ok(())
        })
        .await
    }

    /// Applies the GPU labels to this node's Node object (when it changed)
    /// and returns the node's labels.
    async fn label_node(&mut self) -> Result<BTreeMap<String, String>> {
        let Some(node) = self
            .watched
            .node
            .get(&ObjectRef::new(&self.config.node_name))
        else {
            return Ok(BTreeMap::new());
        };
        self.reports.set_node_uid(node.metadata.uid.clone());
        let mut labels = node.labels().clone();
        if !self.config.label_node {
            return Ok(labels);
        }
        let wanted = gkm_gpu::labels::node_labels(&self.inventory, &self.config.label_options);
        if self.labelled.as_ref() == Some(&wanted) {
            return Ok(labels);
        }
        labels =
            super::labels::apply_node_labels(&self.client, &self.config.node_name, &wanted).await?;
        self.labelled = Some(wanted);
        Ok(labels)
    }
}

/// The releases of both cache kinds, behind one type.
trait Cache: Send + Sync {
    fn key(&self) -> CacheKey;
    fn release(&self) -> &CacheRelease;
}

impl<R: ReleaseObject> Cache for Arc<R> {
    fn key(&self) -> CacheKey {
        ReleaseObject::key(self.as_ref())
    }
    fn release(&self) -> &CacheRelease {
        ReleaseObject::release(self.as_ref())
    }
}
