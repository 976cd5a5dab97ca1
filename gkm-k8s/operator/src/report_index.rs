//! What the node reports say about each cache, kept up to date as the
//! node report watch passes: a reconcile reads only its own cache's
//! entries, and a report's change triggers only the caches whose entries it
//! changed.
//!
//! Only what the operator reads of an entry (its state and pod count,
//! [`Entry`]) is kept, per cache and node; the reports themselves are not.
//! At a thousand nodes reporting fifty caches, the full reports (messages,
//! GPU reasons, managed fields, a map per cache) took most of the
//! operator's memory.
//!
//! A relist (the watch restarted) is buffered like a reflector's store does
//! it: the index answers from what it had until the list is complete, then
//! swaps, so reports deleted while the watch was down drop out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use kube::ResourceExt;
use kube::runtime::watcher;

use super::rollup::{Entry, NodeEntries};
use gkm_k8s_api::cache_object::{CacheKey, NodeReport};

/// A cache as node reports name it: its namespace (`None` for a cluster
/// cache) and name.
pub type CacheRef = (Option<String>, String);
/// A node report: its namespace (`None` for a cluster report) and name
/// (the node's).
type ReportRef = (Option<String>, String);

/// Cache → node → its entries, and report → the caches it mentions.
#[derive(Debug, Default, Clone, PartialEq)]
struct Index {
    by_cache: HashMap<CacheRef, BTreeMap<String, NodeEntries>>,
    by_report: HashMap<ReportRef, Vec<String>>,
}

impl Index {
    /// Takes in a report's entries per cache; returns the caches whose
    /// entries it changed (gained, lost or changed this node).
    fn apply(&mut self, report: ReportRef, caches: BTreeMap<String, NodeEntries>) -> Vec<CacheRef> {
        let (namespace, node) = &report;
        let mut changed = Vec::new();
        for cache in self.by_report.remove(&report).unwrap_or_default() {
            if !caches.contains_key(&cache) {
                let key = (namespace.clone(), cache);
                self.forget(&key, node);
                changed.push(key);
            }
        }
        let mentioned: Vec<String> = caches.keys().cloned().collect();
        for (cache, entries) in caches {
            let key = (namespace.clone(), cache);
            let nodes = self.by_cache.entry(key.clone()).or_default();
            if nodes.get(node) != Some(&entries) {
                nodes.insert(node.clone(), entries);
                changed.push(key);
            }
        }
        if !mentioned.is_empty() {
            self.by_report.insert(report, mentioned);
        }
        changed
    }

    /// Forgets a report; returns the caches it mentioned.
    fn delete(&mut self, report: &ReportRef) -> Vec<CacheRef> {
        let (namespace, node) = report;
        let caches = self.by_report.remove(report).unwrap_or_default();
        caches
            .into_iter()
            .map(|cache| {
                let key = (namespace.clone(), cache);
                self.forget(&key, node);
                key
            })
            .collect()
    }

    fn forget(&mut self, cache: &CacheRef, node: &str) {
        if let Some(nodes) = self.by_cache.get_mut(cache) {
            nodes.remove(node);
            if nodes.is_empty() {
                self.by_cache.remove(cache);
            }
        }
    }

    /// The caches whose entries differ between `self` and `other`.
    fn differences(&self, other: &Index) -> Vec<CacheRef> {
        let caches: BTreeSet<&CacheRef> =
            self.by_cache.keys().chain(other.by_cache.keys()).collect();
        caches
            .into_iter()
            .filter(|c| self.by_cache.get(*c) != other.by_cache.get(*c))
            .cloned()
            .collect()
    }
}

#[derive(Debug, Default)]
struct State {
    current: Index,
    /// The relist in progress, if any.
    relisting: Option<Index>,
}

/// What the node reports of one kind say about each cache.
#[derive(Debug)]
pub struct ReportIndex {
    state: Mutex<State>,
    /// Whether a first list has been taken in.
    listed: tokio::sync::watch::Sender<bool>,
}

impl Default for ReportIndex {
    fn default() -> Self {
        ReportIndex {
            state: Mutex::default(),
            listed: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl ReportIndex {
    /// Takes in one event of the node report watch; returns the caches
    /// whose entries it changed.
    pub fn observe<R: NodeReport>(&self, event: &watcher::Event<R>) -> Vec<CacheRef> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(report) => state
                .current
                .apply(report_ref(report), kept_entries(report)),
            watcher::Event::Delete(report) => state.current.delete(&report_ref(report)),
            watcher::Event::Init => {
                state.relisting = Some(Index::default());
                Vec::new()
            }
            watcher::Event::InitApply(report) => {
                state
                    .relisting
                    .get_or_insert_with(Index::default)
                    .apply(report_ref(report), kept_entries(report));
                Vec::new()
            }
            watcher::Event::InitDone => {
                let listed = state.relisting.take().unwrap_or_default();
                let changed = state.current.differences(&listed);
                state.current = listed;
                self.listed.send_replace(true);
                changed
            }
        }
    }

    /// Returns once a first list of the reports has been taken in.
    pub async fn wait_until_listed(&self) {
        let mut listed = self.listed.subscribe();
        // The sender lives in `self`: waiting cannot fail.
        let _ = listed.wait_for(|done| *done).await;
    }

    /// The entries (per digest) of each node that reports the cache `key`,
    /// with the node's name.
    pub fn for_cache(&self, key: &CacheKey) -> Vec<(String, NodeEntries)> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .current
            .by_cache
            .get(&(key.namespace().map(str::to_string), key.name().to_string()))
            .map(|nodes| nodes.iter().map(|(n, e)| (n.clone(), e.clone())).collect())
            .unwrap_or_default()
    }
}

fn report_ref<R: NodeReport>(report: &R) -> ReportRef {
    (report.namespace(), report.name_any())
}

/// A report's entries per cache, each as the operator reads it.
fn kept_entries<R: NodeReport>(report: &R) -> BTreeMap<String, NodeEntries> {
    let caches = report.report().and_then(|s| s.caches.as_ref());
    caches
        .into_iter()
        .flatten()
        .map(|(cache, entries)| {
            let kept = entries
                .iter()
                .map(|(digest, entry)| (digest.clone(), Entry::from(entry)))
                .collect();
            (cache.clone(), kept)
        })
        .collect()
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

    fn cache(namespace: &str, name: &str) -> CacheRef {
        (Some(namespace.to_string()), name.to_string())
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
        };
        assert_eq!(
            kept,
            [("n1".to_string(), vec![("sha256:a".to_string(), expected)])]
        );
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
        let state = index.state.lock().unwrap();
        assert_eq!(state.current, Index::default(), "nothing left behind");
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
