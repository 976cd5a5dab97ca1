//! Which node reports mention which cache, kept up to date as the node
//! report watch passes, so a reconcile reads only the reports about its own
//! cache instead of every report in the cluster.
//!
//! A relist (the watch restarted) is buffered like the reflector's store
//! does it: the index answers from what it had until the list is complete,
//! then swaps, so reports deleted while the watch was down drop out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use crate::cache_object::{CacheKey, NodeReport};
use crate::crd::NodeCacheStatus;

/// A cache as node reports name it: its namespace (`None` for a cluster
/// cache) and name.
type CacheRef = (Option<String>, String);
/// A node report: its namespace (`None` for a cluster report) and name
/// (the node's).
type ReportRef = (Option<String>, String);

/// Cache → the reports that mention it, and the reverse.
#[derive(Debug, Default, Clone, PartialEq)]
struct Index {
    by_cache: HashMap<CacheRef, BTreeSet<String>>,
    by_report: HashMap<ReportRef, Vec<String>>,
}

impl Index {
    fn apply(&mut self, report: ReportRef, caches: Vec<String>) {
        self.delete(&report);
        for cache in &caches {
            self.by_cache
                .entry((report.0.clone(), cache.clone()))
                .or_default()
                .insert(report.1.clone());
        }
        if !caches.is_empty() {
            self.by_report.insert(report, caches);
        }
    }

    fn delete(&mut self, report: &ReportRef) {
        for cache in self.by_report.remove(report).unwrap_or_default() {
            let key = (report.0.clone(), cache);
            if let Some(reports) = self.by_cache.get_mut(&key) {
                reports.remove(&report.1);
                if reports.is_empty() {
                    self.by_cache.remove(&key);
                }
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    current: Index,
    /// The relist in progress, if any.
    relisting: Option<Index>,
}

/// The node reports that mention each cache.
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
    /// Takes in one event of the node report watch.
    pub fn observe<R: NodeReport>(&self, event: &watcher::Event<R>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(report) => {
                state.current.apply(report_ref(report), caches(report))
            }
            watcher::Event::Delete(report) => state.current.delete(&report_ref(report)),
            watcher::Event::Init => state.relisting = Some(Index::default()),
            watcher::Event::InitApply(report) => state
                .relisting
                .get_or_insert_with(Index::default)
                .apply(report_ref(report), caches(report)),
            watcher::Event::InitDone => {
                if let Some(listed) = state.relisting.take() {
                    state.current = listed;
                }
                self.listed.send_replace(true);
            }
        }
    }

    /// Returns once a first list of the reports has been taken in (the
    /// reflector's store has it too by then).
    pub async fn wait_until_listed(&self) {
        let mut listed = self.listed.subscribe();
        // The sender lives in `self`: waiting cannot fail.
        let _ = listed.wait_for(|done| *done).await;
    }

    /// The names of the reports in `namespace` (`None`: cluster reports)
    /// that mention the cache `name`.
    pub fn reports_for(&self, namespace: Option<&str>, name: &str) -> Vec<String> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .current
            .by_cache
            .get(&(namespace.map(str::to_string), name.to_string()))
            .map(|reports| reports.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// The watched node reports of one kind, with the index of the caches
/// they mention.
pub struct Reports<R: NodeReport> {
    /// Every report, as the reflector keeps it.
    pub store: Store<R>,
    /// Which of them mention which cache.
    pub index: Arc<ReportIndex>,
}

impl<R: NodeReport> Reports<R> {
    /// The entries (per digest) of each node that reports the cache `key`,
    /// with the node's name.
    pub fn for_cache(&self, key: &CacheKey) -> Vec<(String, BTreeMap<String, NodeCacheStatus>)> {
        let namespace = key.namespace.as_deref();
        self.index
            .reports_for(namespace, &key.name)
            .into_iter()
            .filter_map(|node| {
                let at = match namespace {
                    Some(ns) => ObjectRef::<R>::new(&node).within(ns),
                    None => ObjectRef::<R>::new(&node),
                };
                let report = self.store.get(&at)?;
                let entries = report.report()?.caches.as_ref()?.get(&key.name)?.clone();
                Some((node, entries))
            })
            .collect()
    }
}

fn report_ref<R: NodeReport>(report: &R) -> ReportRef {
    (report.namespace(), report.name_any())
}

/// The caches a report mentions.
fn caches<R: NodeReport>(report: &R) -> Vec<String> {
    report
        .report()
        .and_then(|s| s.caches.as_ref())
        .map(|c| c.keys().cloned().collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{CacheNodeStatus, ClusterGKMCacheNode, GKMCacheNode};
    use watcher::Event;

    fn report(namespace: &str, node: &str, caches: &[&str]) -> GKMCacheNode {
        let mut r = GKMCacheNode::new(node, Default::default());
        r.metadata.namespace = Some(namespace.into());
        r.status = Some(CacheNodeStatus {
            caches: Some(
                caches
                    .iter()
                    .map(|c| (c.to_string(), Default::default()))
                    .collect(),
            ),
            ..CacheNodeStatus::default()
        });
        r
    }

    #[test]
    fn a_cache_sees_only_the_reports_that_mention_it_in_its_namespace() {
        let index = ReportIndex::default();
        index.observe(&Event::Apply(report("a", "n1", &["c1", "c2"])));
        index.observe(&Event::Apply(report("a", "n2", &["c1"])));
        index.observe(&Event::Apply(report("b", "n1", &["c1"])));
        assert_eq!(index.reports_for(Some("a"), "c1"), ["n1", "n2"]);
        assert_eq!(index.reports_for(Some("a"), "c2"), ["n1"]);
        assert_eq!(index.reports_for(Some("b"), "c1"), ["n1"]);
        assert!(index.reports_for(Some("b"), "c2").is_empty());
        assert!(index.reports_for(None, "c1").is_empty());
    }

    #[test]
    fn a_report_that_drops_a_cache_or_goes_away_leaves_it() {
        let index = ReportIndex::default();
        index.observe(&Event::Apply(report("a", "n1", &["c1", "c2"])));
        index.observe(&Event::Apply(report("a", "n1", &["c2"])));
        assert!(index.reports_for(Some("a"), "c1").is_empty());
        assert_eq!(index.reports_for(Some("a"), "c2"), ["n1"]);
        index.observe(&Event::Delete(report("a", "n1", &["c2"])));
        assert!(index.reports_for(Some("a"), "c2").is_empty());
        let state = index.state.lock().unwrap();
        assert_eq!(state.current, Index::default(), "nothing left behind");
    }

    #[test]
    fn a_relist_answers_from_the_old_index_until_done_then_forgets_vanished_reports() {
        let index = ReportIndex::default();
        index.observe(&Event::Apply(report("a", "gone", &["c1"])));
        index.observe(&Event::Apply(report("a", "kept", &["c1"])));
        index.observe(&Event::<GKMCacheNode>::Init);
        index.observe(&Event::InitApply(report("a", "kept", &["c1"])));
        assert_eq!(index.reports_for(Some("a"), "c1"), ["gone", "kept"]);
        index.observe(&Event::<GKMCacheNode>::InitDone);
        assert_eq!(index.reports_for(Some("a"), "c1"), ["kept"]);
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
        index.observe(&Event::<GKMCacheNode>::InitDone);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("listed")
            .expect("the waiting task");
        assert_eq!(index.reports_for(Some("a"), "c1"), ["n1"]);
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
        assert_eq!(index.reports_for(None, "cc"), ["n1"]);
        // A report without status mentions nothing.
        index.observe(&Event::Apply(ClusterGKMCacheNode::new(
            "n1",
            Default::default(),
        )));
        assert!(index.reports_for(None, "cc").is_empty());
    }
}
