//! The usage records of one node store: when a pod's writable cache view
//! goes, the CSI driver writes what the pod compiled into it
//! ([`gkm_core::usage::ViewUsage`]: its new entries, which are the cache's
//! misses for that workload, and its scratch), with the view's mount record
//! (pod, cache, digest) and the cache's kind.
//!
//! ```text
//! <store>/usage/<volume id>.json    one per ended writable view
//! ```
//!
//! Bounded: at most [`MAX_USAGE_RECORDS`] are kept, the oldest removed
//! first, so a node running many short pods keeps a fixed number of small
//! files (each names at most
//! [`MAX_NAMED_ENTRIES`](gkm_core::usage::MAX_NAMED_ENTRIES) entries).

use std::path::{Path, PathBuf};

use gkm_core::usage::ViewUsage;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::json_file::{read_records, remove_file, write_json_atomically};
use crate::mount_records::{MountFile, MountRecord, volume_file_name};

/// The usage records' directory under the store root.
pub const USAGE_DIR: &str = "usage";
/// The most usage records a node keeps.
pub const MAX_USAGE_RECORDS: usize = 256;

/// What one pod compiled into its writable view of a cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRecord {
    /// The view's mount record: the pod, the cache, the digest.
    pub mount: MountRecord,
    /// The cache's kind (`triton`, `vllm`…).
    pub kind: String,
    /// When the view went.
    pub ended: Timestamp,
    /// The entries the delivered tree holds, by the same rules (absent
    /// when they could not be counted).
    pub delivered: Option<u64>,
    /// Why the new entries missed, the first few distinct sentences of
    /// [`gkm_core::explain`] (empty when the pod compiled nothing, or its
    /// entries are not a tree explain reads).
    pub reasons: Vec<String>,
    /// What the pod wrote, by the kind's rules.
    pub usage: ViewUsage,
}

/// The JSON form of a [`UsageRecord`].
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageFile {
    #[serde(flatten)]
    mount: MountFile,
    kind: String,
    ended: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivered: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    reasons: Vec<String>,
    usage: ViewUsage,
}

/// The usage records of one node store (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct UsageRecords {
    dir: PathBuf,
}

impl UsageRecords {
    /// The records of the store at `store_root`; touches nothing.
    pub fn new(store_root: &Path) -> UsageRecords {
        UsageRecords {
            dir: store_root.join(USAGE_DIR),
        }
    }

    /// Writes `record`, replacing any of the same volume, then removes the
    /// oldest records beyond [`MAX_USAGE_RECORDS`].
    pub fn record(&self, record: &UsageRecord) -> Result<()> {
        let file = UsageFile {
            mount: MountFile::from_record(&record.mount),
            kind: record.kind.clone(),
            ended: record.ended,
            delivered: record.delivered,
            reasons: record.reasons.clone(),
            usage: record.usage.clone(),
        };
        write_json_atomically(
            &self.dir.join(volume_file_name(&record.mount.volume_id)),
            &file,
        )?;
        let mut all = self.list()?;
        if all.len() > MAX_USAGE_RECORDS {
            all.sort_by_key(|r| r.ended);
            for old in &all[..all.len() - MAX_USAGE_RECORDS] {
                remove_file(&self.dir.join(volume_file_name(&old.mount.volume_id)))?;
            }
        }
        Ok(())
    }

    /// Every record, oldest first. Unreadable records are logged and left
    /// out.
    pub fn list(&self) -> Result<Vec<UsageRecord>> {
        let mut out = read_records(&self.dir, "usage record", |file: UsageFile| {
            Ok(UsageRecord {
                mount: file.mount.into_record()?,
                kind: file.kind,
                ended: file.ended,
                delivered: file.delivered,
                reasons: file.reasons,
                usage: file.usage,
            })
        })?;
        out.sort_by_key(|r| r.ended);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount_records::PodRef;
    use crate::test_keys::{digest, ns_key};
    use gkm_core::usage::NewEntry;

    fn record(volume: &str, second: i64, new: u64) -> UsageRecord {
        UsageRecord {
            mount: MountRecord {
                volume_id: volume.into(),
                pod: PodRef {
                    namespace: "ml".into(),
                    name: format!("pod-{volume}"),
                    uid: Some("uid".into()),
                },
                cache: ns_key("ml", "kernels"),
                digest: digest(1),
                target_path: "/var/lib/kubelet/x".into(),
                mount_path: None,
                published: Timestamp::from_second(0).unwrap(),
            },
            kind: "triton".into(),
            ended: Timestamp::from_second(second).unwrap(),
            delivered: Some(7),
            reasons: vec!["capture this workload".into()],
            usage: ViewUsage {
                new_entries: new,
                named: vec![NewEntry {
                    key: "KEY".into(),
                    name: Some("add_kernel".into()),
                    bytes: 3,
                }],
                new_bytes: 3,
                ..ViewUsage::default()
            },
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let records = UsageRecords::new(dir.path());
        let written = record("vol-1", 10, 2);
        records.record(&written).unwrap();
        assert_eq!(records.list().unwrap(), [written]);
    }

    #[test]
    fn the_oldest_records_go_beyond_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let records = UsageRecords::new(dir.path());
        for i in 0..MAX_USAGE_RECORDS + 3 {
            records
                .record(&record(&format!("vol-{i}"), i as i64, 1))
                .unwrap();
        }
        let kept = records.list().unwrap();
        assert_eq!(kept.len(), MAX_USAGE_RECORDS);
        assert_eq!(kept[0].mount.volume_id, "vol-3");
    }
}
