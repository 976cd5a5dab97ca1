//! What the node reports say about each cache, kept up to date as the
//! node report watch passes: a reconcile reads only its own cache's
//! entries, a report's change triggers only the caches whose entries it
//! changed, and the image-volume webhook reads which nodes a digest fits
//! without listing the reports.
//!
//! Only what the operator reads of an entry (its state and pod count,
//! [`Entry`], and whether the node's GPUs fit it, [`NodeFacts`]) is kept,
//! per cache and node; the reports themselves are not. At a thousand nodes
//! reporting fifty caches, the full reports (messages, GPU reasons, managed
//! fields, a map per cache) took most of the operator's memory.
//!
//! The index is a [`gkm_k8s_runtime::watched_index`]: a report is found under each
//! cache it mentions, with what it says about that cache, and a relist is
//! buffered there.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::runtime::watcher;
use kube::{Api, ResourceExt};

use gkm_k8s_api::NodeFit;
use gkm_k8s_api::cache_object::{CacheKey, NodeReport};
use gkm_k8s_api::crd::{CacheState, NodeCacheStatus, WorkloadUsage};
use gkm_k8s_runtime::watched_index::{self, Indexed};

/// What the operator reads of a node's entry for one digest: its state,
/// how many pods use it, of a multi-target image which variant the node
/// holds, whether the node serves or fits the digest ([`NodeFit`]), and
/// what the workloads on writable views of it compiled there. 40 bytes,
/// where the entry itself is hundreds, and the workloads' counts shared
/// only where a node has any: the operator keeps one per cache, node and
/// digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Where the digest stands on the node.
    pub state: Option<CacheState>,
    /// The pods using it there.
    pub pods: u32,
    /// The variant held ([`variant_key`] of its digest), of a multi-target
    /// image.
    pub variant: Option<u64>,
    /// Whether the node serves or fits the digest, as [`NodeFit::of`] reads
    /// the entry.
    pub fit: NodeFit,
    /// What the workloads on writable views of the digest compiled there.
    pub workloads: Option<Arc<[WorkloadUsage]>>,
}

/// An entry that says nothing: no state, no pods, no variant, fit unknown.
impl Default for Entry {
    fn default() -> Entry {
        Entry {
            state: None,
            pods: 0,
            variant: None,
            fit: NodeFit::Unknown,
            workloads: None,
        }
    }
}

impl From<&NodeCacheStatus> for Entry {
    fn from(entry: &NodeCacheStatus) -> Entry {
        Entry {
            fit: NodeFit::of(entry),
            state: entry.state,
            pods: entry
                .pods
                .as_ref()
                .map_or(0, |p| p.len().try_into().unwrap_or(u32::MAX)),
            variant: entry.variant.as_deref().and_then(variant_key),
            workloads: entry
                .workloads
                .as_deref()
                .filter(|w| !w.is_empty())
                .map(Arc::from),
        }
    }
}

/// A variant digest as the rollup keeps it: the first 64 bits of its hash,
/// enough to tell apart the variants of one index; `None` for what is not
/// a `sha256:` digest.
pub fn variant_key(digest: &str) -> Option<u64> {
    let hex = digest.strip_prefix("sha256:")?;
    u64::from_str_radix(hex.get(..16)?, 16).ok()
}

/// One node's entries for one cache, by image digest.
pub type NodeEntries = Vec<(String, Entry)>;

/// What the index keeps of one node's report on one cache.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeFacts {
    /// Its entries as the rollup reads them, by digest.
    pub entries: NodeEntries,
    /// The node's name, where the report names another than its own.
    node_name: Option<String>,
}

impl NodeFacts {
    /// What is kept of a report's `entries` (by digest) on one cache, from
    /// the report named `report` of node `node_name`.
    fn of<'a>(
        entries: impl IntoIterator<Item = (&'a String, &'a NodeCacheStatus)>,
        report: &str,
        node_name: &str,
    ) -> NodeFacts {
        let mut facts = NodeFacts {
            node_name: (!node_name.is_empty() && node_name != report)
                .then(|| node_name.to_string()),
            ..NodeFacts::default()
        };
        for (digest, entry) in entries {
            facts.entries.push((digest.clone(), Entry::from(entry)));
        }
        facts
    }

    /// Whether the node's GPUs fit `digest`, as its agent reports
    /// ([`NodeFit::fits`]): compatible GPUs listed, or the digest on the
    /// node; never when it says Incompatible.
    fn fits(&self, digest: &str) -> bool {
        self.entries
            .iter()
            .any(|(d, entry)| d == digest && entry.fit.fits())
    }
}

/// What the node reports of one kind say about each cache.
#[derive(Debug, Default)]
pub struct ReportIndex {
    reports: Arc<Indexed<CacheKey, NodeFacts>>,
    /// The watch that keeps it, when it has one of its own ([`Self::watched`]).
    watch: Option<tokio::task::AbortHandle>,
}

impl Drop for ReportIndex {
    fn drop(&mut self) {
        if let Some(watch) = &self.watch {
            watch.abort();
        }
    }
}

/// A report found under each cache it mentions, with what it says there.
fn view<R: NodeReport>(report: &R) -> Option<watched_index::Entry<CacheKey, NodeFacts>> {
    let status = report.report()?;
    let (namespace, name) = (report.namespace(), report.name_any());
    let under = status
        .caches
        .iter()
        .flatten()
        .map(|(cache, entries)| {
            let facts = NodeFacts::of(entries, &name, &status.node_name);
            (CacheKey::named(namespace.as_deref(), cache), facts)
        })
        .collect();
    Some(watched_index::Entry { under })
}

impl ReportIndex {
    /// Takes in one event of the node report watch; returns the caches
    /// whose entries it changed. The watch of [`Self::watched`] does this;
    /// tests feed it events.
    #[cfg(test)]
    pub fn observe<R: NodeReport>(&self, event: &watcher::Event<R>) -> Vec<CacheKey> {
        self.reports.observe(event, view).into_iter().collect()
    }

    /// Returns once a first list of the reports has been taken in.
    pub async fn wait_until_listed(&self) {
        self.reports.wait_until_listed().await
    }

    /// The entries (per digest) of each node that reports the cache `key`,
    /// with the node's name.
    pub fn for_cache(&self, key: &CacheKey) -> Vec<(String, NodeEntries)> {
        self.reports
            .under(key)
            .into_iter()
            .map(|((_, node), facts)| (node, facts.entries))
            .collect()
    }

    /// The nodes whose agents report `digest` of the cache `key` fitting
    /// their GPUs (see [`NodeFacts::fits`]).
    pub fn fitting_nodes(&self, key: &CacheKey, digest: &str) -> BTreeSet<String> {
        self.reports
            .under(key)
            .into_iter()
            .filter(|(_, facts)| facts.fits(digest))
            .map(|((_, report), facts)| facts.node_name.unwrap_or(report))
            .collect()
    }

    /// An index of the reports of `R`'s kind, kept by a watch of its own
    /// for as long as the index lives; `changed` is handed the caches whose
    /// entries each event changed.
    pub fn watched<R: NodeReport>(
        client: &kube::Client,
        changed: impl Fn(BTreeSet<CacheKey>) + Send + 'static,
    ) -> ReportIndex {
        let reports = Arc::new(Indexed::default());
        let api: Api<R> = Api::all(client.clone());
        let config = watcher::Config::default();
        let watch = watched_index::keep(api, config, reports.clone(), view, changed);
        ReportIndex {
            reports,
            watch: Some(watch),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::{
        CacheNodeStatus, CacheState, ClusterGKMCacheNode, GKMCacheNode, NodeCacheStatus,
    };
    use watcher::Event;

    fn entry(state: CacheState, message: &str) -> NodeCacheStatus {
        NodeCacheStatus {
            state: Some(state),
            message: Some(message.to_string()),
            ..NodeCacheStatus::default()
        }
    }

    fn report_of(namespace: &str, node: &str, caches: &[(&str, NodeCacheStatus)]) -> GKMCacheNode {
        let mut r = GKMCacheNode::new(node, Default::default());
        r.metadata.namespace = Some(namespace.into());
        r.status = Some(CacheNodeStatus {
            caches: Some(
                caches
                    .iter()
                    .map(|(c, e)| (c.to_string(), [("sha256:a".to_string(), e.clone())].into()))
                    .collect(),
            ),
            ..CacheNodeStatus::default()
        });
        r
    }

    fn report(namespace: &str, node: &str, caches: &[&str]) -> GKMCacheNode {
        let caches: Vec<_> = caches
            .iter()
            .map(|c| (*c, entry(CacheState::Extracted, "")))
            .collect();
        report_of(namespace, node, &caches)
    }

    fn nodes_of(index: &ReportIndex, namespace: Option<&str>, name: &str) -> Vec<String> {
        let entries = index.for_cache(&CacheKey::named(namespace, name));
        entries.into_iter().map(|(node, _)| node).collect()
    }

    fn cache(namespace: &str, name: &str) -> CacheKey {
        CacheKey::namespaced(namespace, name)
    }

    #[test]
    fn a_cache_sees_only_the_reports_that_mention_it_in_its_namespace() {
        let index = ReportIndex::default();
        index.observe(&Event::Apply(report("a", "n1", &["c1", "c2"])));
        index.observe(&Event::Apply(report("a", "n2", &["c1"])));
        index.observe(&Event::Apply(report("b", "n1", &["c1"])));
        assert_eq!(nodes_of(&index, Some("a"), "c1"), ["n1", "n2"]);
        assert_eq!(nodes_of(&index, Some("a"), "c2"), ["n1"]);
        assert_eq!(nodes_of(&index, Some("b"), "c1"), ["n1"]);
        assert!(nodes_of(&index, Some("b"), "c2").is_empty());
        assert!(nodes_of(&index, None, "c1").is_empty());
    }

    #[test]
    fn a_report_change_names_only_the_caches_whose_entries_it_changed() {
        let index = ReportIndex::default();
        let extracted = entry(CacheState::Extracted, "");
        let downloading = entry(CacheState::Downloading, "");
        let first = report_of("a", "n1", &[("c1", downloading), ("c2", extracted.clone())]);
        let mut changed = index.observe(&Event::Apply(first));
        changed.sort();
        assert_eq!(changed, [cache("a", "c1"), cache("a", "c2")]);
        let second = report_of(
            "a",
            "n1",
            &[("c1", extracted.clone()), ("c2", extracted.clone())],
        );
        assert_eq!(index.observe(&Event::Apply(second)), [cache("a", "c1")]);
        // A message the operator does not read changes nothing it reads.
        let reworded = entry(CacheState::Extracted, "extracted again");
        let third = report_of("a", "n1", &[("c1", extracted), ("c2", reworded)]);
        assert!(index.observe(&Event::Apply(third)).is_empty());
        // Dropping a cache changes that cache.
        let fourth = report_of("a", "n1", &[("c2", entry(CacheState::Extracted, ""))]);
        assert_eq!(index.observe(&Event::Apply(fourth)), [cache("a", "c1")]);
        assert!(nodes_of(&index, Some("a"), "c1").is_empty());
    }

    #[test]
    fn entries_keep_what_the_status_reads_and_nothing_else() {
        let index = ReportIndex::default();
        let mut full = entry(CacheState::Running, "in use");
        full.compatible_gpus = Some(vec![0, 1]);
        full.volume_size = Some(4096);
        full.pods = Some(vec![gkm_k8s_api::crd::PodData {
            pod_name: "p".into(),
            ..Default::default()
        }]);
        index.observe(&Event::Apply(report_of("a", "n1", &[("c1", full)])));
        let kept = index.for_cache(&CacheKey::named(Some("a"), "c1"));
        let expected = Entry {
            state: Some(CacheState::Running),
            pods: 1,
            variant: None,
            fit: NodeFit::Serves,
            workloads: None,
        };
        assert_eq!(
            kept,
            [("n1".to_string(), vec![("sha256:a".to_string(), expected)])]
        );
    }

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn a_nodes_workload_counts_are_kept_and_a_change_to_them_names_the_cache() {
        assert!(
            std::mem::size_of::<Entry>() <= 40,
            "{}",
            std::mem::size_of::<Entry>()
        );
        let index = ReportIndex::default();
        let plain = entry(CacheState::Extracted, "");
        index.observe(&Event::Apply(report_of(
            "a",
            "n1",
            &[("c1", plain.clone())],
        )));
        let counted = NodeCacheStatus {
            workloads: Some(vec![WorkloadUsage {
                new_entries: 2,
                ..WorkloadUsage::of(
                    "a",
                    "Job/warmup",
                    "triton",
                    Time(jiff::Timestamp::UNIX_EPOCH),
                )
            }]),
            ..plain
        };
        let changed = index.observe(&Event::Apply(report_of("a", "n1", &[("c1", counted)])));
        assert_eq!(changed, [cache("a", "c1")]);
        let kept = index.for_cache(&cache("a", "c1"));
        let workloads = kept[0].1[0].1.workloads.as_deref().unwrap_or_default();
        assert_eq!(workloads.len(), 1);
        assert_eq!(workloads[0].new_entries, 2);
    }

    #[test]
    fn a_report_that_drops_a_cache_or_goes_away_leaves_it() {
        let index = ReportIndex::default();
        index.observe(&Event::Apply(report("a", "n1", &["c1", "c2"])));
        index.observe(&Event::Apply(report("a", "n1", &["c2"])));
        assert!(nodes_of(&index, Some("a"), "c1").is_empty());
        assert_eq!(nodes_of(&index, Some("a"), "c2"), ["n1"]);
        let gone = index.observe(&Event::Delete(report("a", "n1", &["c2"])));
        assert_eq!(gone, [cache("a", "c2")]);
        assert!(nodes_of(&index, Some("a"), "c2").is_empty());
        let report = (Some("a".to_string()), "n1".to_string());
        assert_eq!(index.reports.get(&report), None, "nothing left behind");
    }

    #[test]
    fn a_relist_answers_from_the_old_index_until_done_then_names_what_changed() {
        let index = ReportIndex::default();
        index.observe(&Event::Apply(report("a", "gone", &["c1"])));
        index.observe(&Event::Apply(report("a", "kept", &["c1", "c2"])));
        index.observe(&Event::<GKMCacheNode>::Init);
        assert!(
            index
                .observe(&Event::InitApply(report("a", "kept", &["c1", "c2"])))
                .is_empty()
        );
        assert_eq!(nodes_of(&index, Some("a"), "c1"), ["gone", "kept"]);
        let changed = index.observe(&Event::<GKMCacheNode>::InitDone);
        assert_eq!(changed, [cache("a", "c1")], "c2 is as it was");
        assert_eq!(nodes_of(&index, Some("a"), "c1"), ["kept"]);
    }

    #[tokio::test]
    async fn it_is_listed_once_a_first_list_is_done() {
        let index = std::sync::Arc::new(ReportIndex::default());
        let waiting = tokio::spawn({
            let index = index.clone();
            async move { index.wait_until_listed().await }
        });
        index.observe(&Event::<GKMCacheNode>::Init);
        index.observe(&Event::InitApply(report("a", "n1", &["c1"])));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "listed before the list was done");
        let changed = index.observe(&Event::<GKMCacheNode>::InitDone);
        assert_eq!(changed, [cache("a", "c1")]);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("listed")
            .expect("the waiting task");
        assert_eq!(nodes_of(&index, Some("a"), "c1"), ["n1"]);
    }

    #[test]
    fn a_node_fits_a_digest_its_agent_extracted_or_lists_gpus_for() {
        let report = |node: &str, digest: &str, state: &str, gpus: serde_json::Value| {
            let report: GKMCacheNode = serde_json::from_value(serde_json::json!({
                "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
                "metadata": {"name": node, "namespace": "ns"},
                "status": {"nodeName": node, "caches": {"c": {digest: {
                    "state": state, "compatibleGPUs": gpus}}}},
            }))
            .expect("report");
            report
        };
        let index = ReportIndex::default();
        for r in [
            report(
                "extracted",
                "sha256:a",
                "Extracted",
                serde_json::json!(null),
            ),
            report(
                "downloading",
                "sha256:a",
                "Downloading",
                serde_json::json!([0]),
            ),
            report(
                "incompatible",
                "sha256:a",
                "Incompatible",
                serde_json::json!([0]),
            ),
            report(
                "old-digest",
                "sha256:b",
                "Extracted",
                serde_json::json!([0]),
            ),
            report("pending", "sha256:a", "Pending", serde_json::json!(null)),
        ] {
            index.observe(&Event::Apply(r));
        }
        let key = CacheKey::named(Some("ns"), "c");
        assert_eq!(
            index.fitting_nodes(&key, "sha256:a"),
            BTreeSet::from(["downloading".to_string(), "extracted".to_string()])
        );
        assert!(index.fitting_nodes(&key, "sha256:c").is_empty());
        let other = CacheKey::named(Some("ns"), "other");
        assert!(index.fitting_nodes(&other, "sha256:a").is_empty());
        // A report naming another node than its own is that node's.
        let mut renamed = report("report-1", "sha256:a", "Extracted", serde_json::json!(null));
        if let Some(status) = renamed.status.as_mut() {
            status.node_name = "node-1".into();
        }
        index.observe(&Event::Apply(renamed));
        assert!(index.fitting_nodes(&key, "sha256:a").contains("node-1"));
    }

    #[test]
    fn cluster_reports_are_indexed_without_a_namespace() {
        let index = ReportIndex::default();
        let mut r = ClusterGKMCacheNode::new("n1", Default::default());
        r.status = Some(CacheNodeStatus {
            caches: Some([("cc".to_string(), Default::default())].into()),
            ..CacheNodeStatus::default()
        });
        index.observe(&Event::Apply(r));
        assert_eq!(nodes_of(&index, None, "cc"), ["n1"]);
        // A report without status mentions nothing.
        index.observe(&Event::Apply(ClusterGKMCacheNode::new(
            "n1",
            Default::default(),
        )));
        assert!(nodes_of(&index, None, "cc").is_empty());
    }
}
