//! Objects of one kind as a watch shows them, kept as the few facts a
//! reconcile reads and indexed by what it looks them up by (the cache that
//! owns them, the claim a pod uses), so a reconcile reads only what
//! concerns its cache and a change names only the keys it touched.
//!
//! Pure apart from its lock: tests feed it watch events. A relist (the
//! watch restarted) is buffered as a reflector's store does it: the index
//! answers from what it had until the list is complete, then swaps, and
//! the keys whose objects differ count as changed.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::Mutex;

use kube::Resource;
use kube::runtime::watcher;

/// Where an object is: its namespace (`None` when cluster-scoped) and name.
pub type ObjectId = (Option<String>, String);

/// What the index keeps of one object: the keys it is found under and the
/// facts read of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<K, T> {
    /// The keys it is found under.
    pub keys: Vec<K>,
    /// What a reconcile reads of it.
    pub facts: T,
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
    /// whose objects changed.
    fn put(&mut self, id: ObjectId, entry: Option<Entry<K, T>>) -> BTreeSet<K> {
        let mut changed = BTreeSet::new();
        if self.objects.get(&id) == entry.as_ref() {
            return changed;
        }
        if let Some(old) = self.objects.remove(&id) {
            for key in old.keys {
                if let Some(ids) = self.by_key.get_mut(&key) {
                    ids.remove(&id);
                    if ids.is_empty() {
                        self.by_key.remove(&key);
                    }
                }
                changed.insert(key);
            }
        }
        if let Some(new) = entry {
            for key in &new.keys {
                self.by_key
                    .entry(key.clone())
                    .or_default()
                    .insert(id.clone());
                changed.insert(key.clone());
            }
            self.objects.insert(id, new);
        }
        changed
    }

    fn under(&self, key: &K) -> Vec<(ObjectId, T)> {
        self.by_key
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|id| Some((id.clone(), self.objects.get(id)?.facts.clone())))
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
    /// The relist in progress, if any.
    relisting: Option<Index<K, T>>,
}

/// The objects of one watch, indexed by `K`, each kept as its facts `T`.
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
                relisting: None,
            }),
            listed: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl<K: Clone + Eq + Hash + Ord, T: Clone + PartialEq> Indexed<K, T> {
    /// Takes in one event of the watch, keeping what `view` reads of each
    /// object (`None`: the object is of no interest, and is forgotten);
    /// returns the keys whose objects it changed.
    pub fn observe<O: Resource>(
        &self,
        event: &watcher::Event<O>,
        view: impl Fn(&O) -> Option<Entry<K, T>>,
    ) -> BTreeSet<K> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(object) => state.current.put(id_of(object), view(object)),
            watcher::Event::Delete(object) => state.current.put(id_of(object), None),
            watcher::Event::Init => {
                state.relisting = Some(Index::default());
                BTreeSet::new()
            }
            watcher::Event::InitApply(object) => {
                state
                    .relisting
                    .get_or_insert_with(Index::default)
                    .put(id_of(object), view(object));
                BTreeSet::new()
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

    /// The objects found under `key`, with their facts.
    pub fn under(&self, key: &K) -> Vec<(ObjectId, T)> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.current.under(key)
    }
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
        Some(Entry {
            keys: vec![labels.get("key")?.clone()],
            facts: labels.get("value")?.clone(),
        })
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
