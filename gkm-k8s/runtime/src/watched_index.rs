//! Objects of one kind as a watch shows them, kept as the few facts their
//! readers need and indexed by what they look them up by (the cache a node
//! report speaks of, the cache that owns a Job or claim, the claim a pod
//! uses), so a reader reads only what concerns its key and a change names
//! only the keys whose facts it changed.
//!
//! The operator serves its node reports, PVC delivery's objects and its
//! admission webhooks from it. Pure
//! apart from its lock: tests feed it watch events. A relist (the watch
//! restarted) is buffered as a reflector's store does it: the index answers
//! from what it had until the list is complete, then swaps, and the keys
//! whose facts differ count as changed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::Mutex;

use kube::Resource;
use kube::runtime::watcher;

use crate::relist::Relist;

/// Where an object is: its namespace (`None` when cluster-scoped) and name.
pub type ObjectId = (Option<String>, String);

/// What the index keeps of one object: the keys it is found under, each
/// with what the object says about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<K, T> {
    /// The keys it is found under, with its facts under each.
    pub under: BTreeMap<K, T>,
}

impl<K: Ord, T> Entry<K, T> {
    /// An object found under `key` alone.
    pub fn one(key: K, facts: T) -> Entry<K, T> {
        Entry {
            under: BTreeMap::from([(key, facts)]),
        }
    }

    /// An object found under each of `keys`, with the same `facts`.
    pub fn each(keys: impl IntoIterator<Item = K>, facts: T) -> Entry<K, T>
    where
        T: Clone,
    {
        Entry {
            under: keys.into_iter().map(|k| (k, facts.clone())).collect(),
        }
    }

    /// The first key it is found under.
    pub fn first_key(&self) -> Option<&K> {
        self.under.keys().next()
    }
}

#[derive(Debug, Clone)]
struct Index<K, T> {
    objects: HashMap<ObjectId, Entry<K, T>>,
    by_key: HashMap<K, BTreeSet<ObjectId>>,
}

impl<K, T> Default for Index<K, T> {
    fn default() -> Self {
        Index {
            objects: HashMap::new(),
            by_key: HashMap::new(),
        }
    }
}

impl<K: Clone + Eq + Hash + Ord, T: Clone + PartialEq> Index<K, T> {
    /// Puts `entry` (`None`: nothing) in `id`'s place; returns the keys
    /// whose facts changed (the object gained, lost or changed them).
    fn put(&mut self, id: ObjectId, entry: Option<Entry<K, T>>) -> BTreeSet<K> {
        let empty = BTreeMap::new();
        let old = self.objects.get(&id).map_or(&empty, |e| &e.under);
        let new = entry.as_ref().map_or(&empty, |e| &e.under);
        let changed: BTreeSet<K> = old
            .keys()
            .chain(new.keys())
            .filter(|key| old.get(*key) != new.get(*key))
            .cloned()
            .collect();
        if changed.is_empty() {
            return changed;
        }
        let gone: Vec<K> = old
            .keys()
            .filter(|key| !new.contains_key(*key))
            .cloned()
            .collect();
        for key in gone {
            if let Some(ids) = self.by_key.get_mut(&key) {
                ids.remove(&id);
                if ids.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
        match entry {
            Some(new) if !new.under.is_empty() => {
                for key in new.under.keys() {
                    self.by_key
                        .entry(key.clone())
                        .or_default()
                        .insert(id.clone());
                }
                self.objects.insert(id, new);
            }
            _ => {
                self.objects.remove(&id);
            }
        }
        changed
    }

    fn under(&self, key: &K) -> Vec<(ObjectId, T)> {
        self.by_key
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|id| Some((id.clone(), self.objects.get(id)?.under.get(key)?.clone())))
            .collect()
    }

    /// The keys whose objects differ between `self` and `other`.
    fn differences(&self, other: &Index<K, T>) -> BTreeSet<K> {
        self.by_key
            .keys()
            .chain(other.by_key.keys())
            .filter(|key| self.under(key) != other.under(key))
            .cloned()
            .collect()
    }
}

#[derive(Debug)]
struct State<K, T> {
    current: Index<K, T>,
    /// The index the relist in progress builds, swapped in when it ends.
    relist: Relist<Index<K, T>>,
}

/// The objects of one watch, indexed by `K`, each kept as its facts `T`
/// under each key.
#[derive(Debug)]
pub struct Indexed<K, T> {
    state: Mutex<State<K, T>>,
    /// Whether a first list has been taken in.
    listed: tokio::sync::watch::Sender<bool>,
}

impl<K, T> Default for Indexed<K, T> {
    fn default() -> Self {
        Indexed {
            state: Mutex::new(State {
                current: Index::default(),
                relist: Relist::default(),
            }),
            listed: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl<K: Clone + Eq + Hash + Ord, T: Clone + PartialEq> Indexed<K, T> {
    /// Takes in one event of the watch, keeping what `view` reads of each
    /// object (`None`, or no key: the object is of no interest, and is
    /// forgotten); returns the keys whose facts it changed.
    pub fn observe<O: Resource>(
        &self,
        event: &watcher::Event<O>,
        view: impl Fn(&O) -> Option<Entry<K, T>>,
    ) -> BTreeSet<K> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(object) => state.current.put(id_of(object), view(object)),
            watcher::Event::Delete(object) => state.current.put(id_of(object), None),
            watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => {
                let shown = state.relist.observe(event, |listed, object| {
                    listed.put(id_of(object), view(object));
                });
                if !matches!(event, watcher::Event::InitDone) {
                    return BTreeSet::new();
                }
                let listed = shown.unwrap_or_default();
                let changed = state.current.differences(&listed);
                state.current = listed;
                self.listed.send_replace(true);
                changed
            }
        }
    }

    /// Returns once a first list has been taken in.
    pub async fn wait_until_listed(&self) {
        let mut listed = self.listed.subscribe();
        // The sender lives in `self`: waiting cannot fail.
        let _ = listed.wait_for(|done| *done).await;
    }

    /// The object at `id`, if kept.
    pub fn get(&self, id: &ObjectId) -> Option<Entry<K, T>> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.current.objects.get(id).cloned()
    }

    /// The objects found under `key`, in the order of their ids, with their
    /// facts under it.
    pub fn under(&self, key: &K) -> Vec<(ObjectId, T)> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.current.under(key)
    }
}

/// Watches `api` (the objects `config` selects) into `index`, keeping what
/// `view` reads of each and handing the keys each event changed to
/// `changed`; returns the task that watches, which retries for ever.
pub fn keep<O, K, T>(
    api: kube::Api<O>,
    config: watcher::Config,
    index: std::sync::Arc<Indexed<K, T>>,
    view: fn(&O) -> Option<Entry<K, T>>,
    changed: impl Fn(BTreeSet<K>) + Send + 'static,
) -> tokio::task::AbortHandle
where
    O: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    O::DynamicType: Default,
    K: Clone + Eq + Hash + Ord + Send + Sync + 'static,
    T: Clone + PartialEq + Send + Sync + 'static,
{
    use futures::StreamExt as _;
    use kube::runtime::WatchStreamExt as _;
    let kind = O::kind(&O::DynamicType::default()).to_string();
    let watching = watcher(api, config)
        .default_backoff()
        .for_each(move |event| {
            match event {
                Ok(event) => changed(index.observe(&event, view)),
                Err(e) => tracing::warn!(error = %e, "watching {kind}s"),
            }
            futures::future::ready(())
        });
    tokio::spawn(watching).abort_handle()
}

/// Where `object` is.
pub fn id_of<O: Resource>(object: &O) -> ObjectId {
    let meta = object.meta();
    (
        meta.namespace.clone(),
        meta.name.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use watcher::Event;

    /// A ConfigMap whose label `key` names its key and `value` its facts.
    fn object(name: &str, key: &str, value: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns",
                         "labels": {"key": key, "value": value}},
        }))
        .expect("a ConfigMap")
    }

    fn view(object: &ConfigMap) -> Option<Entry<String, String>> {
        let labels = object.metadata.labels.as_ref()?;
        Some(Entry::one(
            labels.get("key")?.clone(),
            labels.get("value")?.clone(),
        ))
    }

    fn set(keys: &[&str]) -> BTreeSet<String> {
        keys.iter().map(|k| k.to_string()).collect()
    }

    fn names(index: &Indexed<String, String>, key: &str) -> Vec<(String, String)> {
        index
            .under(&key.to_string())
            .into_iter()
            .map(|((_, name), facts)| (name, facts))
            .collect()
    }

    #[test]
    fn a_change_names_the_keys_it_touched_and_only_when_facts_change() {
        let index = Indexed::default();
        let a = object("a", "cache-1", "pending");
        assert_eq!(
            index.observe(&Event::Apply(a.clone()), view),
            set(&["cache-1"])
        );
        assert_eq!(
            index.observe(&Event::Apply(a), view),
            set(&[]),
            "same facts"
        );
        let done = object("a", "cache-1", "done");
        assert_eq!(index.observe(&Event::Apply(done), view), set(&["cache-1"]));
        assert_eq!(names(&index, "cache-1"), [("a".into(), "done".into())]);
        // Moved to another key: both change.
        let moved = object("a", "cache-2", "done");
        assert_eq!(
            index.observe(&Event::Apply(moved.clone()), view),
            set(&["cache-1", "cache-2"])
        );
        assert!(names(&index, "cache-1").is_empty());
        // Of no interest any more (the view reads nothing): forgotten.
        let mut bare = moved.clone();
        bare.metadata.labels = None;
        assert_eq!(index.observe(&Event::Apply(bare), view), set(&["cache-2"]));
        assert_eq!(index.get(&(Some("ns".into()), "a".into())), None);
        index.observe(&Event::Apply(moved.clone()), view);
        assert_eq!(
            index.observe(&Event::Delete(moved), view),
            set(&["cache-2"])
        );
        assert!(names(&index, "cache-2").is_empty());
    }

    /// A ConfigMap found under each key of its data, with the value there.
    fn spread(name: &str, under: &[(&str, &str)]) -> ConfigMap {
        let data: BTreeMap<String, String> = under
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns"}, "data": data,
        }))
        .expect("a ConfigMap")
    }

    fn spread_view(object: &ConfigMap) -> Option<Entry<String, String>> {
        Some(Entry {
            under: object.data.clone()?,
        })
    }

    #[test]
    fn an_object_under_several_keys_names_only_those_whose_facts_changed() {
        let index = Indexed::default();
        let first = spread("n1", &[("c1", "downloading"), ("c2", "extracted")]);
        assert_eq!(
            index.observe(&Event::Apply(first), spread_view),
            set(&["c1", "c2"])
        );
        let second = spread("n1", &[("c1", "extracted"), ("c2", "extracted")]);
        assert_eq!(
            index.observe(&Event::Apply(second), spread_view),
            set(&["c1"])
        );
        // Dropping a key names it alone; the object stays under the other.
        let third = spread("n1", &[("c2", "extracted")]);
        assert_eq!(
            index.observe(&Event::Apply(third.clone()), spread_view),
            set(&["c1"])
        );
        assert!(names(&index, "c1").is_empty());
        assert_eq!(names(&index, "c2"), [("n1".into(), "extracted".into())]);
        assert_eq!(
            index.observe(&Event::Delete(third), spread_view),
            set(&["c2"])
        );
        assert_eq!(index.get(&(Some("ns".into()), "n1".into())), None);
    }

    #[tokio::test]
    async fn a_relist_answers_from_the_old_objects_until_done_then_names_the_differences() {
        let index = Indexed::default();
        index.observe(&Event::Init, view);
        index.observe(&Event::InitApply(object("a", "k1", "x")), view);
        index.observe(&Event::InitApply(object("b", "k2", "x")), view);
        assert_eq!(index.observe(&Event::InitDone, view), set(&["k1", "k2"]));
        index.wait_until_listed().await;
        // The watch restarts: b went while it was down, a changed, c is new.
        index.observe(&Event::Init, view);
        index.observe(&Event::InitApply(object("a", "k1", "y")), view);
        index.observe(&Event::InitApply(object("c", "k3", "x")), view);
        assert_eq!(
            names(&index, "k2"),
            [("b".into(), "x".into())],
            "until done"
        );
        assert_eq!(
            index.observe(&Event::InitDone, view),
            set(&["k1", "k2", "k3"])
        );
        assert!(names(&index, "k2").is_empty());
        assert_eq!(names(&index, "k1"), [("a".into(), "y".into())]);
    }
}
