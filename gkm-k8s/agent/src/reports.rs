//! The node's reports: a `GKMCacheNode` per namespace with caches and one
//! `ClusterGKMCacheNode`, each named after the node and written only when
//! they change.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use gkm_gpu::Inventory;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use crate::error::{Error, Result};
use gkm_k8s_api::crd::{
    CacheCounts, CacheNodeStatus, CacheState, ClusterGKMCacheNode, GKMCacheNode, GpuStatus,
    NodeCacheStatus,
};

/// Entries per cache name, per digest.
pub(super) type CacheEntries = BTreeMap<String, BTreeMap<String, NodeCacheStatus>>;

const MANAGER: &str = "gkm-agent";

/// Writes this node's reports.
pub(super) struct NodeReports {
    client: Client,
    node: String,
    gpus: Vec<GpuStatus>,
    /// The vector ISA PyTorch Inductor picks on the node's CPU.
    cpu_isa: Option<String>,
    /// What was last written, per namespace (`None`: the cluster report).
    written: HashMap<Option<String>, CacheNodeStatus>,
    /// Namespaces holding a report of this node, found at start.
    discovered: bool,
    /// The reports whose object (name, owner) this process has applied:
    /// from then on only their status is written.
    applied: HashSet<Option<String>>,
    /// The Node's uid: reports are owned by their Node, so they go when it
    /// goes (where the garbage collector runs).
    node_uid: Option<String>,
    /// Namespaces the apiserver said are being terminated: nothing new may
    /// be created there, so no report is written until their caches are
    /// gone (a tenant's finalizer can keep them for ever).
    terminating: HashSet<String>,
    /// What the last pass computed and [`NodeReports::write_staged`] writes.
    staged: Option<Staged>,
}

/// A pass's reports, not written yet.
struct Staged {
    /// Entries per namespace (`None`: the cluster report).
    entries: BTreeMap<Option<String>, CacheEntries>,
    /// The namespaces with caches.
    namespaces: HashSet<Option<String>>,
}

/// A report that could not be written: the other namespaces' were.
#[derive(Debug)]
pub struct ReportFailure {
    /// The report's namespace; `None` for the cluster report.
    pub namespace: Option<String>,
    /// Why.
    pub error: Error,
}

impl std::fmt::Display for ReportFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "the report in namespace {ns}: {}", self.error),
            None => write!(f, "the cluster report: {}", self.error),
        }
    }
}

impl NodeReports {
    /// Reports of `node`, whose GPUs are `gpus` and whose CPU ISA (as
    /// Inductor picks it) is `cpu_isa`.
    pub(super) fn new(
        client: Client,
        node: &str,
        gpus: Vec<GpuStatus>,
        cpu_isa: Option<String>,
    ) -> NodeReports {
        NodeReports {
            client,
            node: node.to_string(),
            gpus,
            cpu_isa,
            written: HashMap::new(),
            discovered: false,
            applied: HashSet::new(),
            node_uid: None,
            terminating: HashSet::new(),
            staged: None,
        }
    }

    /// Records the Node's uid, once known; reports written from then on name
    /// the Node as their owner.
    pub(super) fn set_node_uid(&mut self, uid: Option<String>) {
        if self.node_uid != uid {
            self.node_uid = uid;
            // Write every report again, with its owner.
            self.written.clear();
            self.applied.clear();
            self.discovered = false;
        }
    }

    /// Keeps what a pass computed, `entries` of the caches of `namespaces`,
    /// to write with [`NodeReports::write_staged`]; returns `None` when
    /// writing them would change nothing, else a fingerprint of them.
    pub(super) fn stage(
        &mut self,
        entries: BTreeMap<Option<String>, CacheEntries>,
        namespaces: HashSet<Option<String>>,
    ) -> Option<u64> {
        let written = |scope: &Option<String>| {
            scope
                .as_ref()
                .is_some_and(|ns| self.terminating.contains(ns))
                || self.written.get(scope)
                    == Some(&self.status(entries.get(scope).cloned().unwrap_or_default()))
        };
        let current = self.discovered
            && written(&None)
            && namespaces.iter().all(written)
            && self
                .written
                .keys()
                .all(|s| s.is_none() || namespaces.contains(s));
        let print = (!current).then(|| {
            let mut scopes: Vec<&Option<String>> = namespaces.iter().collect();
            scopes.sort();
            let mut hasher = DefaultHasher::new();
            serde_json::to_string(&(&entries, scopes))
                .unwrap_or_default()
                .hash(&mut hasher);
            hasher.finish()
        });
        self.staged = Some(Staged {
            entries,
            namespaces,
        });
        print
    }

    /// Writes what was last staged ([`NodeReports::stage`]), as
    /// [`NodeReports::write`] does.
    pub(super) async fn write_staged(&mut self) -> Vec<ReportFailure> {
        match self.staged.take() {
            Some(staged) => self.write(staged.entries, &staged.namespaces).await,
            None => Vec::new(),
        }
    }

    /// A report's status, of `caches`.
    fn status(&self, caches: CacheEntries) -> CacheNodeStatus {
        CacheNodeStatus {
            node_name: self.node.clone(),
            counts: node_counts(&caches),
            gpus: Some(self.gpus.clone()),
            cpu_isa: self.cpu_isa.clone(),
            caches: Some(caches),
            conditions: None,
        }
    }

    /// Writes a report per namespace in `namespaces` (and the cluster
    /// report), removes this node's reports from namespaces that have no
    /// cache any more. Each namespace stands alone: one whose report cannot
    /// be written is returned among the failures (and tried again at the
    /// next pass) while the others are written; a namespace being
    /// terminated is skipped.
    async fn write(
        &mut self,
        mut entries: BTreeMap<Option<String>, CacheEntries>,
        namespaces: &HashSet<Option<String>>,
    ) -> Vec<ReportFailure> {
        let mut failures = Vec::new();
        if !self.discovered
            && let Err(error) = self.discover_existing().await
        {
            // Stale reports are found at a later pass; this one's are written.
            warn!(%error, "listing this node's reports");
        }
        // A terminating namespace with no cache left is gone, or soon is.
        self.terminating
            .retain(|ns| namespaces.contains(&Some(ns.clone())));
        let mut wanted: HashSet<Option<String>> = namespaces.clone();
        wanted.insert(None);
        for scope in &wanted {
            if scope
                .as_ref()
                .is_some_and(|ns| self.terminating.contains(ns))
            {
                continue;
            }
            let caches = entries.remove(scope).unwrap_or_default();
            let status = self.status(caches);
            if self.written.get(scope) == Some(&status) {
                continue;
            }
            let with_object = !self.applied.contains(scope);
            let written = match scope {
                Some(ns) => {
                    self.apply::<GKMCacheNode>(
                        Api::namespaced(self.client.clone(), ns),
                        &status,
                        with_object,
                    )
                    .await
                }
                None => {
                    self.apply::<ClusterGKMCacheNode>(
                        Api::all(self.client.clone()),
                        &status,
                        with_object,
                    )
                    .await
                }
            };
            match written {
                Ok(()) => {
                    self.applied.insert(scope.clone());
                    self.written.insert(scope.clone(), status);
                }
                Err(error) => {
                    if let Some(ns) = scope
                        && error.is_namespace_terminating()
                    {
                        info!(namespace = %ns, "not reporting in a namespace being terminated");
                        self.terminating.insert(ns.clone());
                        self.written.remove(scope);
                        self.applied.remove(scope);
                        continue;
                    }
                    // The report was deleted behind this process: the next
                    // write applies its object again. Other failures
                    // (throttled, timed out) leave the object as it was.
                    if error.is_not_found() {
                        self.applied.remove(scope);
                    }
                    failures.push(ReportFailure {
                        namespace: scope.clone(),
                        error,
                    });
                }
            }
        }
        let stale: Vec<Option<String>> = self
            .written
            .keys()
            .filter(|s| !wanted.contains(*s))
            .cloned()
            .collect();
        for scope in stale {
            if let Some(ns) = &scope {
                let api: Api<GKMCacheNode> = Api::namespaced(self.client.clone(), ns);
                match api.delete(&self.node, &DeleteParams::default()).await {
                    Ok(_) => {
                        info!(namespace = %ns, "removed this node's report: no cache left in the namespace")
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        // Kept as written: removed at a later pass.
                        failures.push(ReportFailure {
                            namespace: scope.clone(),
                            error: e.into(),
                        });
                        continue;
                    }
                }
            }
            self.written.remove(&scope);
            self.applied.remove(&scope);
        }
        failures
    }

    /// Finds this node's reports left from an earlier run, so that those in
    /// namespaces without caches are removed too.
    async fn discover_existing(&mut self) -> Result<()> {
        let api: Api<GKMCacheNode> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!("metadata.name={}", self.node));
        for report in api.list(&params).await? {
            self.written.insert(
                report.namespace(),
                report.status.clone().unwrap_or_default(),
            );
        }
        self.discovered = true;
        Ok(())
    }

    /// Applies the report's status, and first its object (name, owner)
    /// when `with_object`: the object does not change between writes, so it
    /// is applied once per process rather than with every status.
    async fn apply<K>(&self, api: Api<K>, status: &CacheNodeStatus, with_object: bool) -> Result<()>
    where
        K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    {
        let (api_version, kind) = (K::api_version(&()).to_string(), K::kind(&()).to_string());
        let params = PatchParams::apply(MANAGER).force();
        let mut metadata = json!({ "name": self.node });
        if let Some(uid) = &self.node_uid {
            metadata["ownerReferences"] =
                json!([{ "apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid }]);
        }
        if with_object {
            let object = json!({ "apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": {} });
            api.patch(&self.node, &params, &Patch::Apply(&object))
                .await?;
        }
        let status = json!({ "apiVersion": api_version, "kind": kind, "status": status });
        api.patch_status(&self.node, &params, &Patch::Apply(&status))
            .await?;
        Ok(())
    }
}

/// The node's GPUs grouped by type, as GKM reports them.
pub(super) fn gpu_statuses(inventory: &Inventory) -> Vec<GpuStatus> {
    let mut groups: Vec<GpuStatus> = Vec::new();
    for gpu in &inventory.gpus {
        let kind = GpuStatus {
            gpu_type: Some(gpu.product.clone()),
            driver_version: gpu.driver_version.clone(),
            ids: None,
            backend: gpu.backend.map(|b| b.to_string()),
            arch: gpu.arch.as_ref().map(ToString::to_string),
            warp_size: gpu.warp_size.map(|w| w as i32),
        };
        let index = gpu.index as i32;
        match groups.iter_mut().find(|g| {
            GpuStatus {
                ids: None,
                ..(*g).clone()
            } == kind
        }) {
            Some(group) => group.ids.get_or_insert_with(Vec::new).push(index),
            None => groups.push(GpuStatus {
                ids: Some(vec![index]),
                ..kind
            }),
        }
    }
    groups
}

/// A node report's counts: over its caches, how many are in use, extracted
/// but unused, incompatible or in error here, and the pods by digest state.
fn node_counts(caches: &CacheEntries) -> CacheCounts {
    let mut counts = CacheCounts {
        node_cnt: 1,
        ..CacheCounts::default()
    };
    for entries in caches.values() {
        for entry in entries.values() {
            let pods = entry.pods.as_ref().map_or(0, Vec::len) as i32;
            match entry.state {
                Some(CacheState::Running) => {
                    counts.node_in_use_cnt += 1;
                    counts.pod_running_cnt += pods;
                }
                Some(CacheState::Extracted) => counts.node_not_in_use_cnt += 1,
                Some(CacheState::Error | CacheState::NoNamespace) => counts.node_error_cnt += 1,
                Some(CacheState::Incompatible) => counts.node_incompatible_cnt += 1,
                Some(CacheState::Outdated) => counts.pod_outdated_cnt += pods,
                Some(CacheState::Deleting) => counts.pod_deleting_cnt += pods,
                Some(CacheState::Pending | CacheState::Downloading) | None => {}
            }
        }
    }
    counts
}
