//! What the driver serves on `/metrics` (with the prefix `gkm`, as every
//! gkm daemon): the bytes pods wrote into their writable cache views, and
//! how many writable views were published and how many uppers were swept.
//!
//! - `gkm_csi_upper_bytes{namespace,pod}` (gauge): the bytes of each
//!   running pod's upper layers, from the used blocks of each upper's
//!   `tmpfs` (a delta capture's: its capture tree's), labelled from the
//!   driver's mount records;
//! - `gkm_csi_namespace_upper_bytes{namespace}` (gauge): their sum per
//!   namespace;
//! - `gkm_csi_writable_publishes_total{namespace}` (counter): writable views
//!   published since the driver started;
//! - `gkm_csi_uppers_swept_total` (counter): uppers (and their overlays'
//!   leftovers) no mounted view named, removed when the driver started;
//! - `gkm_csi_writable_views_ended_total{namespace,cache,kind}` and
//!   `gkm_csi_view_new_entries_total{namespace,cache,kind}` (counters): the
//!   writable views that ended and the new entries (misses) their pods
//!   compiled into them, counted from each upper as its view goes
//!   ([`crate::views::usage`]).
//!
//! The counts are kept by [`CsiMetrics`] (clones share them); the bytes are
//! read at each scrape ([`CsiCollector`]), so nothing about a pod outlives
//! its mount record.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use gkm_k8s_node::mount_records::{MountRecord, MountRecords};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use crate::capture::tree::{MountedTree, is_delta_tree, mounted_trees};
use crate::views::upper::{Upper, is_upper_mount, tmpfs_used_bytes};

/// The counts the driver keeps; clones share them.
#[derive(Debug, Clone, Default)]
pub struct CsiMetrics {
    counts: Arc<Mutex<Counts>>,
}

#[derive(Debug, Default)]
struct Counts {
    writable_publishes: BTreeMap<String, u64>,
    swept: u64,
    /// Per (pod namespace, cache, kind): writable views ended, and the new
    /// entries their pods compiled.
    views_ended: BTreeMap<(String, String, String), (u64, u64)>,
}

impl CsiMetrics {
    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A writable view was published for a pod of `namespace`.
    pub fn writable_published(&self, namespace: &str) {
        *self
            .counts()
            .writable_publishes
            .entry(namespace.to_string())
            .or_default() += 1;
    }

    /// A writable view of `record`'s cache, of `kind`, ended with its pod
    /// having compiled `new_entries` new entries into it.
    pub fn view_ended(&self, record: &MountRecord, kind: &str, new_entries: u64) {
        let key = (
            record.pod.namespace.clone(),
            record.cache.name().to_string(),
            kind.to_string(),
        );
        let counts = &mut *self.counts();
        let (views, entries) = counts.views_ended.entry(key).or_default();
        *views += 1;
        *entries += new_entries;
    }

    /// `uppers` uppers were swept.
    pub fn swept(&self, uppers: usize) {
        self.counts().swept += uppers as u64;
    }
}

/// One pod's upper bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUpper {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The bytes its uppers hold.
    pub bytes: u64,
}

/// The upper bytes of each pod of `records`, by namespace then pod, from
/// `bytes_of` (the bytes of a record's upper; `None` for a read-only view,
/// which has none). Pure.
pub fn pod_uppers(
    records: &[MountRecord],
    bytes_of: impl Fn(&MountRecord) -> Option<u64>,
) -> Vec<PodUpper> {
    let mut by_pod: BTreeMap<(String, String), u64> = BTreeMap::new();
    for record in records {
        if let Some(bytes) = bytes_of(record) {
            *by_pod
                .entry((record.pod.namespace.clone(), record.pod.name.clone()))
                .or_default() += bytes;
        }
    }
    by_pod
        .into_iter()
        .map(|((namespace, pod), bytes)| PodUpper {
            namespace,
            pod,
            bytes,
        })
        .collect()
}

/// The bytes of `record`'s upper below the store root `root`: its own
/// upper's, or the delta capture tree of its pod's (found in `trees`);
/// `None` when it has none mounted (a read-only view).
fn upper_bytes(root: &Path, record: &MountRecord, trees: &[MountedTree]) -> Option<u64> {
    if let Some(dir) = Upper::path(root, &record.volume_id)
        && is_upper_mount(&dir)
    {
        return Some(tmpfs_used_bytes(&dir));
    }
    let uid = record.pod.uid.as_deref()?;
    let tree = trees
        .iter()
        .find(|t| t.granted.uid == uid && is_delta_tree(&t.path))?;
    Some(tmpfs_used_bytes(&tree.path))
}

/// Reads the driver's metrics at each scrape; register it with
/// `Registry::register_collector`.
#[derive(Debug)]
pub struct CsiCollector {
    metrics: CsiMetrics,
    root: PathBuf,
}

impl CsiCollector {
    /// The collector of `metrics` and of the uppers below the store root
    /// `root`.
    pub fn new(metrics: CsiMetrics, root: impl Into<PathBuf>) -> CsiCollector {
        CsiCollector {
            metrics,
            root: root.into(),
        }
    }

    /// Every pod's upper bytes now (nothing when the records or the mount
    /// table cannot be read: a scrape never fails for them).
    fn uppers(&self) -> Vec<PodUpper> {
        let records = MountRecords::new(&self.root).list().unwrap_or_default();
        let trees = mounted_trees(&self.root).unwrap_or_default();
        pod_uppers(&records, |r| upper_bytes(&self.root, r, &trees))
    }
}

fn gauge(v: u64) -> ConstGauge {
    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
}

impl Collector for CsiCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let bytes = Unit::Bytes;
        let uppers = self.uppers();
        let mut out = encoder.encode_descriptor(
            "csi_upper",
            "Bytes a running pod wrote into its writable cache views (its upper layers)",
            Some(&bytes),
            MetricType::Gauge,
        )?;
        let mut by_namespace: BTreeMap<&str, u64> = BTreeMap::new();
        for upper in &uppers {
            let labels = [("namespace", upper.namespace.as_str()), ("pod", &upper.pod)];
            gauge(upper.bytes).encode(out.encode_family(&labels)?)?;
            *by_namespace.entry(&upper.namespace).or_default() += upper.bytes;
        }
        let mut out = encoder.encode_descriptor(
            "csi_namespace_upper",
            "Bytes a namespace's running pods wrote into their writable cache views",
            Some(&bytes),
            MetricType::Gauge,
        )?;
        for (namespace, total) in by_namespace {
            gauge(total).encode(out.encode_family(&[("namespace", namespace)])?)?;
        }
        let (publishes, swept, ended) = {
            let counts = self.metrics.counts();
            (
                counts.writable_publishes.clone(),
                counts.swept,
                counts.views_ended.clone(),
            )
        };
        for (name, help, pick) in [
            (
                "csi_writable_views_ended",
                "Writable cache views whose pods ended, by the pod's namespace, the cache and its kind",
                0,
            ),
            (
                "csi_view_new_entries",
                "New cache entries (misses) pods compiled into their writable views, counted as each view ended",
                1,
            ),
        ] {
            let mut out = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for ((namespace, cache, kind), (views, entries)) in &ended {
                let n = if pick == 0 { *views } else { *entries };
                let labels = [
                    ("namespace", namespace.as_str()),
                    ("cache", cache.as_str()),
                    ("kind", kind.as_str()),
                ];
                ConstCounter::new(n).encode(out.encode_family(&labels)?)?;
            }
        }
        let mut out = encoder.encode_descriptor(
            "csi_writable_publishes",
            "Writable cache views published since the driver started, by the pod's namespace",
            None,
            MetricType::Counter,
        )?;
        for (namespace, n) in &publishes {
            ConstCounter::new(*n)
                .encode(out.encode_family(&[("namespace", namespace.as_str())])?)?;
        }
        let out = encoder.encode_descriptor(
            "csi_uppers_swept",
            "Uppers no mounted view named, removed when the driver started",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(swept).encode(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_core::{CacheKey, Digest};
    use gkm_k8s_node::mount_records::PodRef;

    fn record(volume: &str, namespace: &str, pod: &str) -> MountRecord {
        MountRecord {
            volume_id: volume.into(),
            pod: PodRef {
                namespace: namespace.into(),
                name: pod.into(),
                uid: None,
            },
            cache: CacheKey::namespaced(namespace, "c"),
            digest: Digest::of(b"c"),
            target_path: "/t".into(),
            mount_path: None,
            published: jiff::Timestamp::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_pods_uppers_add_up_and_read_only_views_count_nothing() {
        let records = [
            record("v1", "ml", "a"),
            record("v2", "ml", "a"),
            record("v3", "ml", "b"),
            record("ro", "team", "c"),
        ];
        let uppers = pod_uppers(&records, |r| (r.volume_id != "ro").then_some(4096));
        assert_eq!(
            uppers,
            [
                PodUpper {
                    namespace: "ml".into(),
                    pod: "a".into(),
                    bytes: 8192
                },
                PodUpper {
                    namespace: "ml".into(),
                    pod: "b".into(),
                    bytes: 4096
                },
            ]
        );
    }
}
