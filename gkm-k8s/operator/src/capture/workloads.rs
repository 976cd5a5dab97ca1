//! Thin glue: the ended workload pods the capture controller acts on,
//! watched only in the namespaces that hold a capture under way
//! ([`namespaces_under_way`](super::observe::namespaces_under_way)), and
//! kept only as the small [`EndedPod`] each one reads as.
//!
//! Why namespaces and not a label on workload pods: pods are the biggest
//! and most numerous objects of a cluster, and a cluster-wide watch of
//! ended pods would list and hold every finished pod (a thousand finished
//! pods with large annotations are gigabytes of JSON), while a label would
//! work only once every user knew to put it on every workload. Selecting
//! by namespace on the server costs users nothing: a namespace with no
//! capture under way is never listed. Within a watched namespace, the list
//! comes in pages of [`PAGE_SIZE`] pods and each pod is dropped once read,
//! so the operator's memory while it (re)lists is bounded by a page, not by
//! the namespace.
//!
//! A watch starts when a capture of its namespace is under way and stops,
//! forgetting its pods, when none is; each change to a pod naming a
//! capture wakes that capture's reconcile.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::decide::Workload;
use super::observe::{EndedPod, ended_pod};
use gkm_k8s_api::crd::GKMCacheCapture;

/// Pods that ended: the only workload pods a capture acts on (a field
/// selector, so running pods are never sent).
const ENDED_PODS: &str = "status.phase!=Pending,status.phase!=Running,status.phase!=Unknown";

/// Pods per page of a (re)list, here and of a capture Job's pods: what the
/// operator holds at most of whole pods at once (a pod is at most about
/// 1.5 MiB, the apiserver's request limit; 256 KiB of annotations at most).
pub const PAGE_SIZE: u32 = 20;

/// The ended pods naming a capture, by namespace then pod name.
type Pods = HashMap<String, HashMap<String, EndedPod>>;

/// The watched namespaces and what they hold.
pub struct Workloads {
    client: Client,
    pods: Arc<Mutex<Pods>>,
    watches: Mutex<HashMap<String, JoinHandle<()>>>,
    wake: UnboundedSender<ObjectRef<GKMCacheCapture>>,
}

impl Workloads {
    /// No namespace watched yet; the stream is the captures to reconcile
    /// because a pod naming them changed.
    pub fn new(client: Client) -> (Workloads, UnboundedReceiver<ObjectRef<GKMCacheCapture>>) {
        let (wake, woken) = unbounded();
        let workloads = Workloads {
            client,
            pods: Arc::default(),
            watches: Mutex::default(),
            wake,
        };
        (workloads, woken)
    }

    /// Watches exactly `namespaces`: starts the missing watches, stops the
    /// others and forgets their pods.
    pub fn watch_only(&self, namespaces: &BTreeSet<String>) {
        let mut watches = locked(&self.watches);
        watches.retain(|namespace, watch| {
            let keep = namespaces.contains(namespace);
            if !keep {
                watch.abort();
                locked(&self.pods).remove(namespace);
                debug!(%namespace, "stopped watching ended pods for captures");
            }
            keep
        });
        for namespace in namespaces {
            if watches.contains_key(namespace) {
                continue;
            }
            debug!(%namespace, "watching ended pods for captures");
            let task = tokio::spawn(watch_namespace(
                self.client.clone(),
                namespace.clone(),
                self.pods.clone(),
                self.wake.clone(),
            ));
            watches.insert(namespace.clone(), task);
        }
    }

    /// The ended pods of `namespace` naming the capture `capture`.
    pub fn named(&self, namespace: &str, capture: &str) -> Vec<Workload> {
        locked(&self.pods)
            .get(namespace)
            .into_iter()
            .flat_map(|pods| pods.values())
            .filter(|p| p.captures.iter().any(|c| c == capture))
            .map(|p| Workload {
                delta: p.delta_captures.iter().any(|c| c == capture),
                ..p.workload.clone()
            })
            .collect()
    }

    /// The ended pod `name` of `namespace`, when it names a capture.
    pub fn get(&self, namespace: &str, name: &str) -> Option<EndedPod> {
        locked(&self.pods).get(namespace)?.get(name).cloned()
    }
}

impl Drop for Workloads {
    fn drop(&mut self) {
        for watch in locked(&self.watches).values() {
            watch.abort();
        }
    }
}

/// `mutex`'s value; a panic elsewhere while it was held leaves nothing
/// half-written here (every change is one insert or remove).
fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Keeps `pods[namespace]` up to date with the namespace's ended pods
/// naming a capture, waking the captures they name, until aborted.
async fn watch_namespace(
    client: Client,
    namespace: String,
    pods: Arc<Mutex<Pods>>,
    wake: UnboundedSender<ObjectRef<GKMCacheCapture>>,
) {
    let config = watcher::Config::default()
        .fields(ENDED_PODS)
        .page_size(PAGE_SIZE);
    let mut events = watcher(Api::<Pod>::namespaced(client, &namespace), config)
        .default_backoff()
        .boxed();
    let wake_all = |named: &mut dyn Iterator<Item = &EndedPod>| {
        let captures: BTreeSet<&String> = named.flat_map(|p| p.captures.iter()).collect();
        for capture in captures {
            let _ = wake.unbounded_send(ObjectRef::new(capture).within(&namespace));
        }
    };
    // The pods of a (re)list under way, replacing the namespace's once done.
    let mut listing: Option<HashMap<String, EndedPod>> = None;
    while let Some(event) = events.next().await {
        match event {
            Err(e) => warn!(%namespace, error = %e, "watching ended pods for captures"),
            Ok(Event::Init) => listing = Some(HashMap::new()),
            Ok(Event::InitApply(pod)) => {
                if let (Some(listing), Some(ended)) = (listing.as_mut(), ended_pod(&pod)) {
                    listing.insert(pod.name_any(), ended);
                }
            }
            Ok(Event::InitDone) => {
                let listed = listing.take().unwrap_or_default();
                let old = locked(&pods).insert(namespace.clone(), listed.clone());
                wake_all(&mut listed.values().chain(old.iter().flat_map(|o| o.values())));
            }
            Ok(Event::Apply(pod)) => {
                let name = pod.name_any();
                let ended = ended_pod(&pod);
                drop(pod);
                let old = {
                    let mut pods = locked(&pods);
                    let here = pods.entry(namespace.clone()).or_default();
                    match &ended {
                        Some(ended) => here.insert(name, ended.clone()),
                        None => here.remove(&name),
                    }
                };
                wake_all(&mut ended.iter().chain(old.iter()));
            }
            Ok(Event::Delete(pod)) => {
                let old = locked(&pods)
                    .get_mut(&namespace)
                    .and_then(|here| here.remove(&pod.name_any()));
                wake_all(&mut old.iter());
            }
        }
    }
}
