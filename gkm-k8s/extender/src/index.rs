//! The in-memory index every decision is made from: nodes, what pods hold,
//! quotas, and the agents' reports on caches. The watches feed it; filter,
//! prioritize and bind read it; only bind (through [`Index::reserve`]) adds
//! to it outside the watches.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{Node, Pod};

use super::CORES_PER_GPU;
use super::cache::{self, CacheFit, CacheOnNode};
use super::hold::{Amount, Hold, Share, amount_of, split_shares};
use super::node::NodeGpus;
use super::request::{CacheUse, GpuRequest};
use gkm_core::Refusal;
use gkm_k8s_api::cache_object::{CacheKey, Scope};
use gkm_k8s_api::crd::{CacheNodeStatus, GpuModelLimit, GpuModelUse};

/// What the index reads from nodes and pods.
pub type IndexConfig = gkm_k8s_api::gpu_request::GpuReading;

/// Where a pod fits on a node, and how well.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The device shares it would get.
    pub shares: Vec<Share>,
    /// How full the node's asked-for GPUs would be with the pod, 0 to 1.
    pub packing: f64,
    /// How the node suits the pod's caches.
    pub cache: CacheFit,
}

/// What is used on one node.
#[derive(Debug, Clone, Default)]
struct NodeUse {
    whole: BTreeMap<String, i64>,
    devices: HashMap<String, (i64, i64)>,
}

/// The index. Not synchronised: the caller holds it behind a lock.
#[derive(Debug, Default)]
pub struct Index {
    config: IndexConfig,
    nodes: HashMap<String, NodeGpus>,
    holds: HashMap<String, Hold>,
    by_node: HashMap<String, HashSet<String>>,
    node_use: HashMap<String, NodeUse>,
    /// Use per namespace, per model.
    quota_use: HashMap<String, HashMap<String, Amount>>,
    /// Quotas per namespace, per name.
    quotas: HashMap<String, BTreeMap<String, Vec<GpuModelLimit>>>,
    reports: HashMap<(Option<String>, String), BTreeMap<String, CacheOnNode>>,
    claims: HashMap<(String, String), String>,
    resolved: HashMap<CacheKey, String>,
}

impl Index {
    /// An empty index.
    pub fn new(config: IndexConfig) -> Index {
        Index {
            config,
            ..Index::default()
        }
    }

    /// The configuration.
    pub fn config(&self) -> &IndexConfig {
        &self.config
    }

    /// Adds or updates a node.
    pub fn upsert_node(&mut self, node: &Node) {
        let Some(name) = node.metadata.name.clone() else {
            return;
        };
        let gpus =
            NodeGpus::from_node(node, &self.config.whole_resources, &self.config.model_label);
        let model = gpus.model.clone();
        let previous = self.nodes.insert(name.clone(), gpus);
        if previous.map(|p| p.model) != Some(model.clone()) {
            self.recount_node(&name, model);
        }
    }

    /// Forgets a node (its pods' holds stay until the pods go).
    pub fn remove_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    /// Keeps only the nodes named in `names` (after a relist).
    pub fn retain_nodes(&mut self, names: &HashSet<String>) {
        self.nodes.retain(|n, _| names.contains(n));
    }

    /// Whether the index knows `node`.
    pub fn has_node(&self, node: &str) -> bool {
        self.nodes.contains_key(node)
    }

    /// Counts a pod as the watch shows it: bound pods hold their GPUs,
    /// finished pods hold none. An unbound pod keeps a reservation a bind
    /// call made for it.
    pub fn upsert_pod(&mut self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        match Hold::of_pod(pod, &self.config.whole_resources) {
            Some(hold) => self.put_hold(&uid, hold),
            None => {
                let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_ref());
                let reserved = self.holds.get(&uid).is_some_and(|h| h.reserved);
                if bound.is_some() || !reserved {
                    self.remove_hold(&uid);
                }
            }
        }
    }

    /// Forgets a deleted pod, and any reservation for it.
    pub fn remove_pod(&mut self, uid: &str) {
        self.remove_hold(uid);
    }

    /// Keeps only the holds of the pods whose UIDs are in `uids`.
    pub fn retain_pods(&mut self, uids: &HashSet<String>) {
        let gone: Vec<String> = self
            .holds
            .keys()
            .filter(|uid| !uids.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            self.remove_hold(&uid);
        }
    }

    /// Adds or updates the quota `namespace/name`.
    pub fn upsert_quota(&mut self, namespace: &str, name: &str, limits: Vec<GpuModelLimit>) {
        self.quotas
            .entry(namespace.to_string())
            .or_default()
            .insert(name.to_string(), limits);
    }

    /// Forgets a quota.
    pub fn remove_quota(&mut self, namespace: &str, name: &str) {
        if let Some(quotas) = self.quotas.get_mut(namespace) {
            quotas.remove(name);
            if quotas.is_empty() {
                self.quotas.remove(namespace);
            }
        }
    }

    /// Keeps only the quotas in `keys` (`(namespace, name)`).
    pub fn retain_quotas(&mut self, keys: &HashSet<(String, String)>) {
        for (namespace, quotas) in self.quotas.iter_mut() {
            quotas.retain(|name, _| keys.contains(&(namespace.clone(), name.clone())));
        }
        self.quotas.retain(|_, quotas| !quotas.is_empty());
    }

    /// Adds or updates a node report: `namespace` for a `GKMCacheNode`,
    /// `None` for a `ClusterGKMCacheNode`; `node` is the report's name.
    pub fn upsert_report(&mut self, namespace: Option<&str>, node: &str, status: &CacheNodeStatus) {
        for (claim_ns, claim, cache) in cache::claims(status) {
            if namespace == Some(claim_ns.as_str()) {
                self.claims.insert((claim_ns, claim), cache);
            }
        }
        self.reports.insert(
            (namespace.map(str::to_string), node.to_string()),
            cache::summarize(status),
        );
    }

    /// Forgets a node report.
    pub fn remove_report(&mut self, namespace: Option<&str>, node: &str) {
        self.reports
            .remove(&(namespace.map(str::to_string), node.to_string()));
    }

    /// Keeps only the reports in `keys` of one kind (`cluster`: the
    /// `ClusterGKMCacheNode`s, else the `GKMCacheNode`s).
    pub fn retain_reports(&mut self, cluster: bool, keys: &HashSet<(Option<String>, String)>) {
        self.reports
            .retain(|k, _| k.0.is_none() != cluster || keys.contains(k));
    }

    /// Records the digest a cache resolves to now (`None`: not resolved).
    pub fn upsert_cache(&mut self, key: CacheKey, digest: Option<String>) {
        match digest {
            Some(digest) => self.resolved.insert(key, digest),
            None => self.resolved.remove(&key),
        };
    }

    /// Keeps only the caches of one scope that are in `keys`.
    pub fn retain_caches(&mut self, scope: Scope, keys: &HashSet<CacheKey>) {
        self.resolved
            .retain(|k, _| k.scope() != scope || keys.contains(k));
    }

    /// Whether `request` fits `node` for a pod of `namespace` (UID `uid`),
    /// and how; or why not, in words for the pod's events.
    pub fn check(
        &self,
        uid: &str,
        namespace: &str,
        request: &GpuRequest,
        node: &str,
    ) -> Result<Choice, Refusal> {
        self.placer(uid, namespace, request).check(node)
    }

    /// What checks one pod against many nodes, with what is the same for
    /// every node looked up once.
    pub fn placer<'a>(
        &'a self,
        uid: &str,
        namespace: &'a str,
        request: &'a GpuRequest,
    ) -> Placer<'a> {
        Placer {
            index: self,
            namespace,
            request,
            asked: amount_of(request),
            own: self.holds.get(uid),
            quotas: self.quotas.get(namespace),
            used: self.quota_use.get(namespace),
        }
    }

    /// Checks `request` on `node` and, when it fits, holds the room for the
    /// pod until the watch shows it bound: the check and the hold happen
    /// together, so concurrent binds never overcommit a node or a quota.
    /// A pod already holding room on `node` gets the same shares again.
    pub fn reserve(
        &mut self,
        uid: &str,
        name: &str,
        namespace: &str,
        request: &GpuRequest,
        node: &str,
    ) -> Result<Vec<Share>, Refusal> {
        if let Some(hold) = self.holds.get(uid) {
            if hold.node == node {
                return Ok(hold.shares.clone());
            }
            if !hold.reserved {
                return Err(format!("the pod is already bound to {}", hold.node).into());
            }
            self.remove_hold(uid);
        }
        let choice = self.check(uid, namespace, request, node)?;
        let hold = Hold::new(namespace, name, node, request, choice.shares.clone(), true);
        self.put_hold(uid, hold);
        Ok(choice.shares)
    }

    /// Drops the reservation of pod `uid` (a bind that failed); a hold the
    /// watch confirmed stays.
    pub fn release(&mut self, uid: &str) {
        if self.holds.get(uid).is_some_and(|h| h.reserved) {
            self.remove_hold(uid);
        }
    }

    /// What `namespace` holds of each model `limits` names.
    pub fn quota_use(&self, namespace: &str, limits: &[GpuModelLimit]) -> Vec<GpuModelUse> {
        let used = self.quota_use.get(namespace);
        limits
            .iter()
            .map(|limit| {
                let amount = used
                    .and_then(|u| u.get(&limit.model))
                    .copied()
                    .unwrap_or_default();
                GpuModelUse {
                    model: limit.model.clone(),
                    gpus: amount.gpus,
                    cores: amount.cores,
                    memory: amount.memory,
                }
            })
            .collect()
    }

    /// Every quota, as `(namespace, name)`, with its use per model.
    pub fn quota_statuses(&self) -> Vec<((String, String), Vec<GpuModelUse>)> {
        self.quotas
            .iter()
            .flat_map(|(namespace, quotas)| {
                quotas.iter().map(move |(name, limits)| {
                    let key = (namespace.clone(), name.clone());
                    (key, self.quota_use(namespace, limits))
                })
            })
            .collect()
    }

    /// Pods holding GPUs, reservations included.
    pub fn holds(&self) -> impl Iterator<Item = (&String, &Hold)> {
        self.holds.iter()
    }

    fn cache_fit(&self, node: &str, request: &GpuRequest) -> Result<CacheFit, String> {
        let mut fit = None;
        for used in &request.caches {
            let key = match used {
                CacheUse::Volume(key) => key.clone(),
                CacheUse::Claim { namespace, claim } => {
                    let Some(name) = self.claims.get(&(namespace.clone(), claim.clone())) else {
                        continue;
                    };
                    CacheKey::namespaced(namespace.clone(), name.clone())
                }
            };
            let report = self
                .reports
                .get(&(key.namespace().map(str::to_string), node.to_string()))
                .and_then(|r| r.get(key.name()));
            let this = match report {
                None => CacheFit::Unknown,
                Some(c) => match c.fits {
                    Some(false) => {
                        return Err(format!(
                            "gkm: {key} does not fit this node's GPUs ({})",
                            c.reasons
                        ));
                    }
                    None => CacheFit::Unknown,
                    Some(true) => {
                        let ready = match self.resolved.get(&key) {
                            Some(digest) => c.extracted.contains(digest),
                            None => !c.extracted.is_empty(),
                        };
                        if ready {
                            CacheFit::Ready
                        } else {
                            CacheFit::Compatible
                        }
                    }
                },
            };
            fit = Some(fit.map_or(this, |f: CacheFit| f.min(this)));
        }
        Ok(fit.unwrap_or(CacheFit::Unknown))
    }

    fn put_hold(&mut self, uid: &str, mut hold: Hold) {
        self.remove_hold(uid);
        hold.model = self.nodes.get(&hold.node).and_then(|n| n.model.clone());
        self.account(&hold, 1);
        self.by_node
            .entry(hold.node.clone())
            .or_default()
            .insert(uid.to_string());
        self.holds.insert(uid.to_string(), hold);
    }

    fn remove_hold(&mut self, uid: &str) {
        if let Some(hold) = self.holds.remove(uid) {
            self.account(&hold, -1);
            if let Some(uids) = self.by_node.get_mut(&hold.node) {
                uids.remove(uid);
                if uids.is_empty() {
                    self.by_node.remove(&hold.node);
                }
            }
        }
    }

    /// Adds (`sign` 1) or removes (-1) a hold from the node's and the
    /// quota's use.
    fn account(&mut self, hold: &Hold, sign: i64) {
        let used = self.node_use.entry(hold.node.clone()).or_default();
        for (resource, n) in &hold.whole {
            *used.whole.entry(resource.clone()).or_default() += sign * n;
        }
        for share in hold.shares.iter().filter(|s| !s.device.is_empty()) {
            let device = used.devices.entry(share.device.clone()).or_default();
            device.0 += sign * share.cores;
            device.1 += sign * share.memory;
        }
        if let Some(model) = &hold.model {
            let quota = self
                .quota_use
                .entry(hold.namespace.clone())
                .or_default()
                .entry(model.clone())
                .or_default();
            if sign > 0 {
                *quota += hold.amount;
            } else {
                *quota -= hold.amount;
            }
        }
    }

    /// Counts the holds on `node` again under its new model.
    fn recount_node(&mut self, node: &str, model: Option<String>) {
        let uids: Vec<String> = self
            .by_node
            .get(node)
            .map(|u| u.iter().cloned().collect())
            .unwrap_or_default();
        for uid in uids {
            if let Some(mut hold) = self.holds.get(&uid).cloned() {
                self.remove_hold(&uid);
                hold.model = model.clone();
                self.put_hold(&uid, hold);
            }
        }
    }
}

/// One pod's checks against nodes; see [`Index::placer`].
pub struct Placer<'a> {
    index: &'a Index,
    namespace: &'a str,
    request: &'a GpuRequest,
    asked: Amount,
    own: Option<&'a Hold>,
    quotas: Option<&'a BTreeMap<String, Vec<GpuModelLimit>>>,
    used: Option<&'a HashMap<String, Amount>>,
}

impl Placer<'_> {
    /// Whether the pod fits `node`, and how; or why not, in words for the
    /// pod's events.
    pub fn check(&self, node: &str) -> Result<Choice, Refusal> {
        let index = self.index;
        let request = self.request;
        let gpus = index
            .nodes
            .get(node)
            .ok_or_else(|| Refusal::new("gkm: the extender has not seen this node yet"))?;
        let empty = NodeUse::default();
        let used = index.node_use.get(node).unwrap_or(&empty);
        let cache = index.cache_fit(node, request)?;
        if let Some(own) = self.own.filter(|h| h.node == node) {
            // Room is already held here (a retried bind).
            return Ok(Choice {
                shares: own.shares.clone(),
                packing: packing(gpus, used, &GpuRequest::default()),
                cache,
            });
        }
        for (resource, &asked) in &request.whole {
            let allocatable = gpus.whole.get(resource).copied().unwrap_or(0);
            let taken = used.whole.get(resource).copied().unwrap_or(0);
            if taken + asked > allocatable {
                return Err(Refusal::new(format!(
                    "gkm: {} of {allocatable} {resource} free, the pod asks {asked}",
                    (allocatable - taken).max(0)
                )));
            }
        }
        let shares = if request.is_shared() {
            choose_devices(gpus, used, request)?
        } else {
            Vec::new()
        };
        if let Some(model) = gpus.model.as_deref() {
            self.check_quota(model)?;
        }
        Ok(Choice {
            shares,
            packing: packing(gpus, used, request),
            cache,
        })
    }

    /// Whether the pod stays within every quota of its namespace on a node
    /// of `model`.
    fn check_quota(&self, model: &str) -> Result<(), String> {
        let Some(quotas) = self.quotas else {
            return Ok(());
        };
        let namespace = self.namespace;
        let mut used = self
            .used
            .and_then(|u| u.get(model))
            .copied()
            .unwrap_or_default();
        if let Some(own) = self
            .own
            .filter(|h| h.namespace == namespace && h.model.as_deref() == Some(model))
        {
            used -= own.amount;
        }
        let quotas = quotas.iter().map(|(n, l)| (n.as_str(), l.as_slice()));
        gkm_k8s_api::quota::check(namespace, model, quotas, used, self.asked)
            .map_err(|e| e.to_string())
    }
}

/// The devices a shared-GPU request gets on a node: the share of one device
/// that leaves the least capacity stranded (fewest cores, then least memory,
/// left over), or whole free devices for more than 100 cores.
fn choose_devices(
    gpus: &NodeGpus,
    used: &NodeUse,
    request: &GpuRequest,
) -> Result<Vec<Share>, String> {
    if let Some(e) = &gpus.devices_error {
        return Err(format!("gkm: {e}"));
    }
    let count = if request.cores > CORES_PER_GPU {
        request.cores / CORES_PER_GPU
    } else {
        1
    };
    let cores = request.cores.min(CORES_PER_GPU);
    // The first device takes what does not divide: the most any one needs.
    let memory = split_shares(
        &vec![String::new(); usize::try_from(count).unwrap_or(1)],
        cores,
        request.memory,
    )
    .first()
    .map_or(0, |s| s.memory);
    let mut free: Vec<(i64, i64, &str)> = gpus
        .devices
        .iter()
        .map(|d| {
            let (c, m) = used.devices.get(&d.id).copied().unwrap_or((0, 0));
            (d.cores - c, d.memory - m, d.id.as_str())
        })
        .collect();
    let most = free.iter().map(|f| (f.0, f.1)).max();
    free.retain(|&(c, m, _)| c >= cores && m >= memory);
    free.sort_by_key(|&(c, m, id)| (c - cores, m - memory, id));
    let chosen: Vec<String> = free
        .iter()
        .take(usize::try_from(count).unwrap_or(usize::MAX))
        .map(|f| f.2.to_string())
        .collect();
    if i64::try_from(chosen.len()).unwrap_or(0) < count || chosen.is_empty() {
        let most = most.map_or_else(
            || "the node has no shared GPUs".to_string(),
            |(c, m)| format!("the freest has {c}% cores and {m} MiB"),
        );
        return Err(if count > 1 {
            format!(
                "gkm: {} of the {count} whole GPUs the pod asks are free",
                chosen.len()
            )
        } else {
            format!("gkm: no GPU has {cores}% cores and {memory} MiB free ({most})")
        });
    }
    Ok(split_shares(&chosen, request.cores, request.memory))
}

/// How full the asked-for GPUs of the node would be with `request` placed:
/// whole GPUs of the asked resources (all of the node's for a pod asking
/// none), and the cores of shared devices; the mean when both count.
fn packing(gpus: &NodeGpus, used: &NodeUse, request: &GpuRequest) -> f64 {
    let (mut sum, mut parts) = (0.0, 0.0);
    if !request.whole.is_empty() || !request.is_shared() {
        let (mut total, mut taken) = (0, request.gpus());
        for (resource, allocatable) in &gpus.whole {
            if request.whole.is_empty() || request.whole.contains_key(resource) {
                total += allocatable;
                taken += used.whole.get(resource).copied().unwrap_or(0);
            }
        }
        if total > 0 {
            sum += taken as f64 / total as f64;
            parts += 1.0;
        }
    }
    let cores: i64 = gpus.devices.iter().map(|d| d.cores).sum();
    if cores > 0 && request.is_shared() {
        let taken: i64 = used.devices.values().map(|d| d.0).sum();
        sum += (taken + request.cores) as f64 / cores as f64;
        parts += 1.0;
    }
    if parts == 0.0 {
        return 0.0;
    }
    (sum / parts).clamp(0.0, 1.0)
}
