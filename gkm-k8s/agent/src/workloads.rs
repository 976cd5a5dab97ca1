//! What the workloads on this node compiled into their writable views, for
//! the node's reports and an Event on each workload whose pod compiled.
//!
//! The CSI driver records, as each writable view goes, what its pod
//! compiled ([`gkm_k8s_node::usage`]). The agent counts those records under
//! the pod's workload ([`Workload`]: its controller, looked up while the pod
//! runs, when its mount record appears, since a pod whose view ended may
//! be gone by the next pass), adds them up per cache and digest
//! ([`add_usage`]), and publishes one Event per pod that compiled new
//! entries, on its workload, naming the cache and the count.
//!
//! Costs: one metadata read of each pod mounting a cache (two for a
//! Deployment's or a CronJob's pod), at most [`MAX_LOOKUPS_PER_PASS`] per
//! pass; the reports carry at most
//! [`MAX_WORKLOADS`](gkm_k8s_api::workloads::MAX_WORKLOADS) workloads per
//! digest, and the Event is the one write a pod's end adds.

use std::collections::{BTreeMap, HashMap, HashSet};

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use tracing::{debug, warn};

use gkm_core::usage::NewEntry;
use gkm_k8s_api::CacheKey;
use gkm_k8s_api::crd::WorkloadUsage;
use gkm_k8s_api::workloads::{Workload, add_usage, controller};
use gkm_k8s_node::mount_records::{MountRecord, PodRef};
use gkm_k8s_node::usage::UsageRecord;
use gkm_oci::Digest;

/// The most pods whose workload one pass looks up.
pub(crate) const MAX_LOOKUPS_PER_PASS: usize = 32;

/// The Event reason of a pod that compiled what its cache did not hold.
pub(crate) const COMPILED_REASON: &str = "CompiledNewEntries";

/// Per cache, per digest viewed: what each workload compiled.
pub(crate) type UsageByCache = HashMap<CacheKey, BTreeMap<Digest, Vec<WorkloadUsage>>>;

/// The workloads of the pods on this node, and the usage records already
/// announced.
pub(crate) struct Workloads {
    client: Client,
    recorder: Recorder,
    /// Each pod's workload, by [`pod_key`].
    owners: HashMap<String, Workload>,
    /// The records announced (volume id, end); `None` until the first pass,
    /// which announces nothing: what ended before this process started was
    /// announced by the one before (or, while none ran, is in the reports
    /// only).
    announced: Option<HashSet<(String, Timestamp)>>,
}

/// How a pod is known: its uid, or its namespace and name.
fn pod_key(pod: &PodRef) -> String {
    pod.uid
        .clone()
        .unwrap_or_else(|| format!("{}/{}", pod.namespace, pod.name))
}

impl Workloads {
    /// The workloads of node `node`'s pods, read and announced with `client`.
    pub(crate) fn new(client: Client, node: &str) -> Workloads {
        let reporter = Reporter {
            controller: "gkm-agent".into(),
            instance: Some(node.to_string()),
        };
        Workloads {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            owners: HashMap::new(),
            announced: None,
        }
    }

    /// Looks up the workloads of the pods of `mounts` and `records` not
    /// known yet (at most [`MAX_LOOKUPS_PER_PASS`]), and forgets the pods of
    /// neither.
    pub(crate) async fn follow(&mut self, mounts: &[MountRecord], records: &[UsageRecord]) {
        let pods: Vec<&PodRef> = mounts
            .iter()
            .map(|m| &m.pod)
            .chain(records.iter().map(|r| &r.mount.pod))
            .collect();
        let keep: HashSet<String> = pods.iter().map(|p| pod_key(p)).collect();
        self.owners.retain(|key, _| keep.contains(key));
        let mut looked_up = 0;
        for pod in pods {
            let key = pod_key(pod);
            if self.owners.contains_key(&key) || looked_up == MAX_LOOKUPS_PER_PASS {
                continue;
            }
            looked_up += 1;
            match workload_of(&self.client, pod).await {
                Ok(workload) => {
                    self.owners.insert(key, workload);
                }
                // Not allowed (an install without the chart's rules): the
                // pod stands for itself, and is not asked about again.
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    warn!(pod = %pod.name, namespace = %pod.namespace, "not allowed to read a pod's owner: its misses count under the pod itself");
                    self.owners
                        .insert(key, Workload::pod(&pod.name, pod.uid.clone()));
                }
                // Looked up again at the next pass.
                Err(e) => {
                    debug!(pod = %pod.name, namespace = %pod.namespace, error = %e, "looking up a pod's workload")
                }
            }
        }
    }

    /// The workload of `pod`: as looked up, or the pod itself.
    fn of(&self, pod: &PodRef) -> Workload {
        self.owners
            .get(&pod_key(pod))
            .cloned()
            .unwrap_or_else(|| Workload::pod(&pod.name, pod.uid.clone()))
    }

    /// What `records` say each workload compiled, per cache and digest.
    pub(crate) fn usage(&self, records: &[UsageRecord]) -> UsageByCache {
        let mut out = UsageByCache::new();
        for record in records {
            let workload = self.of(&record.mount.pod).label();
            let usage = pod_usage(record, workload);
            let per_digest = out.entry(record.mount.cache.clone()).or_default();
            add_usage(
                per_digest.entry(record.mount.digest.clone()).or_default(),
                usage,
            );
        }
        out
    }

    /// Publishes an Event on the workload of each pod of `records` that
    /// compiled new entries and was not announced yet.
    pub(crate) async fn announce(&mut self, records: &[UsageRecord]) {
        let ended: HashSet<(String, Timestamp)> = records
            .iter()
            .map(|r| (r.mount.volume_id.clone(), r.ended))
            .collect();
        let Some(announced) = self.announced.replace(ended.clone()) else {
            return;
        };
        for record in records {
            if announced.contains(&(record.mount.volume_id.clone(), record.ended))
                || record.usage.all_hits()
            {
                continue;
            }
            let workload = self.of(&record.mount.pod);
            let event = Event {
                type_: EventType::Warning,
                reason: COMPILED_REASON.into(),
                note: Some(event_note(record)),
                action: "Compile".into(),
                secondary: None,
            };
            let regarding = ObjectReference {
                api_version: Some(workload.api_version.clone()),
                kind: Some(workload.kind.clone()),
                name: Some(workload.name.clone()),
                namespace: Some(record.mount.pod.namespace.clone()),
                uid: workload.uid.clone(),
                ..ObjectReference::default()
            };
            if let Err(e) = self.recorder.publish(&event, &regarding).await {
                warn!(workload = %workload.label(), error = %e, "publishing a workload's new entries");
            }
        }
    }
}

/// One pod's record as its workload's usage.
fn pod_usage(record: &UsageRecord, workload: String) -> WorkloadUsage {
    let usage = &record.usage;
    WorkloadUsage {
        pods_ended: 1,
        pods_compiling: i32::from(!usage.all_hits()),
        entries_delivered: record.delivered.map(saturating_i64),
        new_entries: saturating_i64(usage.new_entries),
        // Bounded where usages are added up (`add_usage`).
        new_entry_names: usage.named.iter().map(|e| e.shown().to_string()).collect(),
        reasons: record.reasons.clone(),
        ..WorkloadUsage::of(
            &record.mount.pod.namespace,
            &workload,
            &record.kind,
            Time(record.ended),
        )
    }
}

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The Event's note: the pod, the cache and digest, how many new entries it
/// compiled of how many delivered, the first names, and where to look.
pub(crate) fn event_note(record: &UsageRecord) -> String {
    let usage = &record.usage;
    let mut names: Vec<&str> = usage.named.iter().take(4).map(NewEntry::shown).collect();
    names.dedup();
    let delivered = record
        .delivered
        .map(|d| format!(" (the cache holds {d})"))
        .unwrap_or_default();
    let more = if usage.new_entries > names.len() as u64 {
        ", …"
    } else {
        ""
    };
    let why = match record.reasons.first() {
        Some(reason) => format!("; {reason}"),
        None => "; `gkm explain` names what differs in their keys".to_string(),
    };
    format!(
        "pod {} compiled {} new {} entries that {} ({}) did not hold{delivered}: {}{more}{why}",
        record.mount.pod.name,
        usage.new_entries,
        record.kind,
        record.mount.cache,
        record.mount.digest,
        names.join(", "),
    )
}

/// The workload `pod` belongs to: its controller, or that controller's
/// own when it is a ReplicaSet or a Job ([`Workload::has_usual_controller`]);
/// the pod itself when it has none or is gone.
async fn workload_of(client: &Client, pod: &PodRef) -> Result<Workload, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let Some(meta) = pods.get_metadata_opt(&pod.name).await? else {
        return Ok(Workload::pod(&pod.name, pod.uid.clone()));
    };
    // Another pod of the same name is not this one.
    if pod.uid.is_some() && meta.metadata.uid != pod.uid {
        return Ok(Workload::pod(&pod.name, pod.uid.clone()));
    }
    let owners = meta.metadata.owner_references.unwrap_or_default();
    let Some(owner) = controller(&owners) else {
        return Ok(Workload::pod(&pod.name, pod.uid.clone()));
    };
    let workload = Workload::of_owner(owner);
    if !workload.has_usual_controller() {
        return Ok(workload);
    }
    let (namespace, name) = (pod.namespace.as_str(), workload.name.as_str());
    let parent = match workload.kind.as_str() {
        "ReplicaSet" => controller_of::<ReplicaSet>(client, namespace, name).await?,
        _ => controller_of::<Job>(client, namespace, name).await?,
    };
    Ok(parent.unwrap_or(workload))
}

/// The controller of the `K` named `name` in `namespace`, by its metadata;
/// `None` when it has none or is gone.
async fn controller_of<K>(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<Workload>, kube::Error>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let meta = Api::<K>::namespaced(client.clone(), namespace)
        .get_metadata_opt(name)
        .await?;
    Ok(meta.and_then(|m| {
        let owners = m.metadata.owner_references.unwrap_or_default();
        controller(&owners).map(Workload::of_owner)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_core::usage::ViewUsage;

    fn record(new: u64) -> UsageRecord {
        UsageRecord {
            mount: MountRecord {
                volume_id: "vol".into(),
                pod: PodRef {
                    namespace: "ml".into(),
                    name: "warmup-x7k2p".into(),
                    uid: Some("uid-1".into()),
                },
                cache: CacheKey::named(Some("ml"), "vector-add"),
                digest: format!("sha256:{}", "a".repeat(64)).parse().unwrap(),
                target_path: "/var/lib/kubelet/x".into(),
                mount_path: None,
                published: Timestamp::UNIX_EPOCH,
            },
            kind: "triton".into(),
            ended: Timestamp::from_second(60).unwrap(),
            delivered: Some(7),
            reasons: Vec::new(),
            usage: ViewUsage {
                new_entries: new,
                named: (0..new)
                    .map(|i| NewEntry {
                        key: format!("KEY{i}"),
                        name: Some(format!("kernel_{i}")),
                        bytes: 10,
                    })
                    .collect(),
                ..ViewUsage::default()
            },
        }
    }

    #[test]
    fn a_pods_record_counts_as_one_pod_of_its_workload_with_its_misses_named() {
        let usage = pod_usage(&record(2), "Job/warmup".into());
        assert_eq!((usage.pods_ended, usage.pods_compiling), (1, 1));
        assert_eq!(usage.new_entries, 2);
        assert_eq!(usage.entries_delivered, Some(7));
        assert_eq!(usage.new_entry_names, ["kernel_0", "kernel_1"]);
        let hits = pod_usage(&record(0), "Job/warmup".into());
        assert_eq!((hits.pods_compiling, hits.new_entries), (0, 0));
    }

    #[test]
    fn the_event_names_the_pod_the_cache_the_count_and_the_kernels() {
        let note = event_note(&record(6));
        assert!(note.starts_with("pod warmup-x7k2p compiled 6 new triton entries that GKMCache ml/vector-add (sha256:aaaa"), "{note}");
        assert!(
            note.contains("(the cache holds 7): kernel_0, kernel_1, kernel_2, kernel_3, …"),
            "{note}"
        );
        assert!(note.contains("gkm explain"), "{note}");
        let explained = UsageRecord {
            reasons: vec!["the workload runs Triton 3.6.0, the cache was built with Triton 3.5.0: rebuild the cache with Triton 3.6.0".into()],
            ..record(1)
        };
        let note = event_note(&explained);
        assert!(note.ends_with("kernel_0; the workload runs Triton 3.6.0, the cache was built with Triton 3.5.0: rebuild the cache with Triton 3.6.0"), "{note}");
    }
}
