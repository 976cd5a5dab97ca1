//! Thin glue: the watches PVC delivery reads instead of listing on every
//! reconcile, and the reconciles their changes trigger.
//!
//! - gkm's Jobs, claims and volumes, only those it labelled
//!   ([`objects::managed_selector`]), indexed by the cache owning them;
//! - the namespaces, metadata only: which exist;
//! - the pods using claims, indexed by claim, watched only once a cache in
//!   PVC mode needs them (a cluster without one never watches its pods) and
//!   only while they run (a field selector on their phase).
//!
//! A change to one of gkm's objects triggers its cache; a pod's change the
//! cache owning a claim it uses; a namespace appearing or going, the PVC
//! caches serving it.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use futures::{Stream, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use tracing::warn;

use super::facts::{self, ClaimFacts, ClaimRef, ClaimUser};
use super::objects;
use super::plan::{PvcMode, served_namespaces};
use super::status::Fill;
use crate::error::{Error, Result};
use gkm_k8s_api::cache_object::{CacheKey, CacheObject, Scope};
use gkm_k8s_runtime::watched_index::{self, Entry, Indexed, ObjectId};

/// How long a reconcile waits for the pod watch's first list.
const FIRST_LIST: Duration = Duration::from_secs(60);

/// What changed, for the controllers to map onto their caches.
#[derive(Debug, Clone)]
enum Changed {
    /// Something a cache owns, or a pod using one of its claims.
    Cache(CacheKey),
    /// A namespace appeared, changed or went.
    Namespace(String),
}

/// Where changes go: one channel per cache kind.
#[derive(Clone)]
struct Senders {
    namespaced: UnboundedSender<Changed>,
    cluster: UnboundedSender<Changed>,
}

impl Senders {
    fn send(&self, changed: Changed) {
        // A receiver lives as long as its controller; after it, nothing
        // is left to trigger.
        match &changed {
            Changed::Cache(key) => match key.scope() {
                Scope::Namespaced => {
                    let _ = self.namespaced.unbounded_send(changed);
                }
                Scope::Cluster => {
                    let _ = self.cluster.unbounded_send(changed);
                }
            },
            Changed::Namespace(_) => {
                let _ = self.namespaced.unbounded_send(changed.clone());
                let _ = self.cluster.unbounded_send(changed);
            }
        }
    }
}

/// The watched objects of PVC delivery, shared by both controllers.
pub struct Watches {
    client: Client,
    jobs: Arc<Indexed<CacheKey, Fill>>,
    claims: Arc<Indexed<CacheKey, ClaimFacts>>,
    volumes: Arc<Indexed<CacheKey, ()>>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    /// Started by the first reconcile that needs them.
    pods: tokio::sync::OnceCell<Arc<Indexed<ClaimRef, ClaimUser>>>,
    senders: Senders,
    receivers: Mutex<Receivers>,
}

/// Each kind's end of its channel, until its controller takes it.
struct Receivers {
    namespaced: Option<UnboundedReceiver<Changed>>,
    cluster: Option<UnboundedReceiver<Changed>>,
}

/// The Jobs, claims and volumes a cache owns, as watched.
#[derive(Debug, Default)]
pub(super) struct Owned {
    /// Its fill Jobs.
    pub(super) jobs: Vec<ObjectId>,
    /// Its claims.
    pub(super) claims: Vec<ObjectId>,
    /// Its volumes.
    pub(super) volumes: Vec<ObjectId>,
}

impl Owned {
    /// Whether the cache owns nothing.
    pub(super) fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.claims.is_empty() && self.volumes.is_empty()
    }
}

impl Watches {
    /// Starts the watches of gkm's Jobs, claims and volumes and of the
    /// namespaces; returns once each has listed.
    pub async fn start(client: &Client) -> Arc<Watches> {
        let (namespaced, namespaced_rx) = unbounded();
        let (cluster, cluster_rx) = unbounded();
        let senders = Senders {
            namespaced,
            cluster,
        };
        let owned = watcher::Config::default().labels(&objects::managed_selector());
        let jobs = index(
            Api::<Job>::all(client.clone()),
            owned.clone(),
            facts::job,
            senders.clone(),
            |key| Some(key.clone()),
        );
        let claims = index(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            owned.clone(),
            facts::claim,
            senders.clone(),
            |key| Some(key.clone()),
        );
        let volumes = index(
            Api::<PersistentVolume>::all(client.clone()),
            owned,
            facts::volume,
            senders.clone(),
            |key| Some(key.clone()),
        );
        let namespaces = watch_namespaces(client, senders.clone());
        jobs.wait_until_listed().await;
        claims.wait_until_listed().await;
        volumes.wait_until_listed().await;
        // The stream retries for ever; its store only drops with the process.
        let _ = namespaces.wait_until_ready().await;
        Arc::new(Watches {
            client: client.clone(),
            jobs,
            claims,
            volumes,
            namespaces,
            pods: tokio::sync::OnceCell::new(),
            senders,
            receivers: Mutex::new(Receivers {
                namespaced: Some(namespaced_rx),
                cluster: Some(cluster_rx),
            }),
        })
    }

    /// The caches of kind `K` the watched changes concern, to trigger their
    /// reconciles; `caches` is the controller's store, which says which
    /// caches serve a namespace. Each kind's stream can be taken once.
    pub fn triggers<K: CacheObject>(
        &self,
        caches: Store<K>,
    ) -> impl Stream<Item = ObjectRef<K>> + Send + 'static {
        let mut receivers = self.receivers.lock().unwrap_or_else(|e| e.into_inner());
        let receiver = match K::SCOPE {
            Scope::Namespaced => receivers.namespaced.take(),
            Scope::Cluster => receivers.cluster.take(),
        };
        if receiver.is_none() {
            warn!("PVC delivery's triggers were taken before; this controller gets none");
        }
        futures::stream::iter(receiver)
            .flatten()
            .flat_map(move |changed| {
                let refs: Vec<ObjectRef<K>> = match changed {
                    Changed::Cache(key) => vec![object_ref(&key)],
                    Changed::Namespace(namespace) => caches
                        .state()
                        .iter()
                        .filter(|cache| {
                            let spec = cache.cache_spec();
                            PvcMode::of(spec).is_some()
                                && served_namespaces(&cache.key(), spec).contains(&namespace)
                        })
                        .map(|cache| ObjectRef::from_obj(cache.as_ref()))
                        .collect(),
                };
                futures::stream::iter(refs)
            })
    }

    /// The namespaces that exist and are not being deleted.
    pub(super) fn namespaces(&self) -> BTreeSet<String> {
        self.namespaces
            .state()
            .iter()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
            .filter_map(|n| n.metadata.name.clone())
            .collect()
    }

    /// What `key` owns, as watched.
    pub(super) fn owned(&self, key: &CacheKey) -> Owned {
        fn ids<T>(found: Vec<(ObjectId, T)>) -> Vec<ObjectId> {
            found.into_iter().map(|(id, _)| id).collect()
        }
        Owned {
            jobs: ids(self.jobs.under(key)),
            claims: ids(self.claims.under(key)),
            volumes: ids(self.volumes.under(key)),
        }
    }

    /// What the gkm-made claim `namespace/name` holds, if it is watched.
    pub(super) fn claim(&self, namespace: &str, name: &str) -> Option<ClaimFacts> {
        let id = (Some(namespace.to_string()), name.to_string());
        self.claims
            .get(&id)
            .and_then(|e| e.under.into_values().next())
    }

    /// The workload pods (not finished, not fill Jobs) using any of
    /// `claims` in `namespace`, each once, by name; the pod watch starts on
    /// the first call.
    pub(super) async fn pods_using(
        &self,
        namespace: &str,
        claims: &BTreeSet<String>,
    ) -> Result<Vec<(String, ClaimUser)>> {
        let pods = self.pods().await?;
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for claim in claims {
            for ((_, name), user) in pods.under(&(namespace.to_string(), claim.clone())) {
                if seen.insert(name.clone()) {
                    out.push((name, user));
                }
            }
        }
        Ok(out)
    }

    async fn pods(&self) -> Result<&Indexed<ClaimRef, ClaimUser>> {
        let pods = self.pods.get_or_init(|| async { self.watch_pods() }).await;
        tokio::time::timeout(FIRST_LIST, pods.wait_until_listed())
            .await
            .map_err(|_| Error::NotWatched(format!("pods: no first list in {FIRST_LIST:?}")))?;
        Ok(pods)
    }

    /// Watches the pods that run (or wait to), triggering the cache that
    /// owns each claim a changed pod uses.
    fn watch_pods(&self) -> Arc<Indexed<ClaimRef, ClaimUser>> {
        let claims = self.claims.clone();
        // Finished pods use no claim: the apiserver leaves them out (and
        // says a pod that finishes is gone).
        let running =
            watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        index(
            Api::<Pod>::all(self.client.clone()),
            running,
            facts::pod,
            self.senders.clone(),
            move |(namespace, claim)| {
                let id = (Some(namespace.clone()), claim.clone());
                claims.get(&id)?.first_key().cloned()
            },
        )
    }
}

/// The reference a controller of `K` triggers for `key`.
fn object_ref<K: CacheObject>(key: &CacheKey) -> ObjectRef<K> {
    let cache = ObjectRef::<K>::new(key.name());
    match key.namespace() {
        Some(namespace) => cache.within(namespace),
        None => cache,
    }
}

/// Watches `api` into an index of what `view` reads, sending each changed
/// key's cache (`cache_of`) to `senders`.
fn index<O, K, T>(
    api: Api<O>,
    config: watcher::Config,
    view: fn(&O) -> Option<Entry<K, T>>,
    senders: Senders,
    cache_of: impl Fn(&K) -> Option<CacheKey> + Send + 'static,
) -> Arc<Indexed<K, T>>
where
    O: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    O::DynamicType: Default,
    K: Clone + Eq + std::hash::Hash + Ord + Send + Sync + 'static,
    T: Clone + PartialEq + Send + Sync + 'static,
{
    let indexed = Arc::new(Indexed::default());
    // The watch lives as long as the process: PVC delivery reads it all along.
    watched_index::keep(api, config, indexed.clone(), view, move |keys| {
        for key in keys {
            if let Some(cache) = cache_of(&key) {
                senders.send(Changed::Cache(cache));
            }
        }
    });
    indexed
}

/// A store of the namespaces' names (metadata only, nothing else kept);
/// each namespace added, changed or deleted is sent on.
fn watch_namespaces(client: &Client, senders: Senders) -> Store<PartialObjectMeta<Namespace>> {
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
    let (reader, writer) = reflector::store();
    let reflect = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(|namespace| {
                let meta = &mut namespace.metadata;
                (meta.labels, meta.annotations, meta.managed_fields) = (None, None, None);
            }),
    )
    .for_each(move |event| {
        match event {
            Ok(watcher::Event::Apply(namespace) | watcher::Event::Delete(namespace)) => {
                if let Some(name) = namespace.metadata.name {
                    senders.send(Changed::Namespace(name));
                }
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "watching namespaces for PVC delivery"),
        }
        futures::future::ready(())
    });
    tokio::spawn(reflect);
    reader
}
