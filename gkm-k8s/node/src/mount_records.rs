//! The mount records: one file per published volume, written by the CSI
//! driver before the bind mount and removed after the unmount, from which the
//! agent counts the pods using each digest (see the [module docs](super)).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gkm_core::Digest;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::MOUNTS_DIR;
use super::json_file::{invalid_data, read_json, read_records, remove_file, write_json_atomically};
use super::names::check_key;
use crate::error::Result;
use gkm_core::{CacheKey, Scope};

/// The pod a volume is published for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid, when the kubelet passed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// One published volume (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountRecord {
    /// The CSI volume id the kubelet chose.
    pub volume_id: String,
    /// The pod using it.
    pub pod: PodRef,
    /// The cache it delivers.
    pub cache: CacheKey,
    /// The digest mounted.
    pub digest: Digest,
    /// Where it is mounted.
    pub target_path: PathBuf,
    /// The path the pod mounts it at, when the volume names one
    /// (`csi.gkm.io/mountPath`): the view then stacks the digest's
    /// relocation layer for that path ([`crate::relocation`]).
    pub mount_path: Option<String>,
    /// When it was published.
    pub published: Timestamp,
}

/// The JSON form of a [`Scope`] in a mount record.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ScopeFile {
    Namespaced,
    Cluster,
}

/// The JSON form of a [`MountRecord`].
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MountFile {
    volume_id: String,
    pod_namespace: String,
    pod_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod_uid: Option<String>,
    cache_scope: ScopeFile,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cache_namespace: Option<String>,
    cache_name: String,
    digest: String,
    target_path: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mount_path: Option<String>,
    published: Timestamp,
}

impl MountFile {
    pub(crate) fn from_record(r: &MountRecord) -> MountFile {
        MountFile {
            volume_id: r.volume_id.clone(),
            pod_namespace: r.pod.namespace.clone(),
            pod_name: r.pod.name.clone(),
            pod_uid: r.pod.uid.clone(),
            cache_scope: match r.cache.scope() {
                Scope::Namespaced => ScopeFile::Namespaced,
                Scope::Cluster => ScopeFile::Cluster,
            },
            cache_namespace: r.cache.namespace().map(str::to_string),
            cache_name: r.cache.name().to_string(),
            digest: r.digest.to_string(),
            target_path: r.target_path.clone(),
            mount_path: r.mount_path.clone(),
            published: r.published,
        }
    }

    pub(crate) fn into_record(self) -> std::result::Result<MountRecord, String> {
        let digest: Digest = self
            .digest
            .parse()
            .map_err(|e| format!("field digest: {e}"))?;
        let cache = match (self.cache_scope, self.cache_namespace) {
            (ScopeFile::Namespaced, Some(namespace)) => {
                CacheKey::namespaced(namespace, self.cache_name)
            }
            (ScopeFile::Cluster, None) => CacheKey::cluster(self.cache_name),
            (ScopeFile::Namespaced, None) => {
                return Err(format!("GKMCache {:?} has no namespace", self.cache_name));
            }
            (ScopeFile::Cluster, Some(ns)) => {
                return Err(format!(
                    "ClusterGKMCache {:?} cannot have a namespace (got {ns:?})",
                    self.cache_name
                ));
            }
        };
        check_key(&cache).map_err(|e| e.to_string())?;
        Ok(MountRecord {
            volume_id: self.volume_id,
            pod: PodRef {
                namespace: self.pod_namespace,
                name: self.pod_name,
                uid: self.pod_uid,
            },
            cache,
            digest,
            target_path: self.target_path,
            mount_path: self.mount_path,
            published: self.published,
        })
    }
}

/// The file a record of `volume_id` is kept in: `<id>.json` when the id is
/// a plain file name (letters, digits, `.`, `_`, `-`; at most 200; not
/// starting with `.` or `_`), else `_<sha256 of the id>.json`.
pub(crate) fn volume_file_name(volume_id: &str) -> String {
    let plain = !volume_id.is_empty()
        && volume_id.len() <= 200
        && !volume_id.starts_with(['.', '_'])
        && volume_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if plain {
        format!("{volume_id}.json")
    } else {
        format!("_{}.json", Digest::of(volume_id.as_bytes()).hex())
    }
}

/// The mount records of one node store (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct MountRecords {
    dir: PathBuf,
}

impl MountRecords {
    /// The records of the store at `store_root`; touches nothing.
    pub fn new(store_root: &Path) -> MountRecords {
        MountRecords {
            dir: store_root.join(MOUNTS_DIR),
        }
    }

    /// The file of `volume_id`'s record: `<id>.json` when the id is a plain
    /// file name (letters, digits, `.`, `_`, `-`; at most 200; not starting
    /// with `.`), else `_<sha256 of the id>.json`.
    pub fn path_of(&self, volume_id: &str) -> PathBuf {
        self.dir.join(volume_file_name(volume_id))
    }

    /// Write `record`, replacing any for the same volume.
    pub fn record(&self, record: &MountRecord) -> Result<()> {
        write_json_atomically(
            &self.path_of(&record.volume_id),
            &MountFile::from_record(record),
        )
    }

    /// The record of `volume_id`, if any.
    pub fn get(&self, volume_id: &str) -> Result<Option<MountRecord>> {
        let path = self.path_of(volume_id);
        let Some(file) = read_json::<MountFile>(&path)? else {
            return Ok(None);
        };
        file.into_record()
            .map(Some)
            .map_err(|reason| invalid_data(&path, reason))
    }

    /// Remove the record of `volume_id`; whether there was one.
    pub fn remove(&self, volume_id: &str) -> Result<bool> {
        remove_file(&self.path_of(volume_id))
    }

    /// Every record, sorted by volume id. Unreadable records are logged and
    /// left out.
    pub fn list(&self) -> Result<Vec<MountRecord>> {
        let mut out = read_records(&self.dir, "mount record", MountFile::into_record)?;
        out.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
        Ok(out)
    }

    /// The pods using each digest, from every record.
    pub fn pods_by_digest(&self) -> Result<BTreeMap<Digest, Vec<PodRef>>> {
        let mut out: BTreeMap<Digest, Vec<PodRef>> = BTreeMap::new();
        for record in self.list()? {
            out.entry(record.digest).or_default().push(record.pod);
        }
        for pods in out.values_mut() {
            pods.sort();
            pods.dedup();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_keys::{digest, ns_key};

    proptest::proptest! {
        /// Any volume id maps to one file directly in the mounts directory.
        #[test]
        fn mount_record_files_stay_inside(id in "\\PC{0,40}|[a-z0-9./_-]{0,40}") {
            let records = MountRecords::new(Path::new("/store"));
            let path = records.path_of(&id);
            proptest::prop_assert_eq!(path.parent(), Some(Path::new("/store/mounts")));
            let file = path.file_name().and_then(|f| f.to_str()).unwrap_or_default().to_string();
            proptest::prop_assert!(file.ends_with(".json") && !file.starts_with('.'));
        }
    }

    #[test]
    fn mount_records_round_trip_and_count_pods() {
        let store = tempfile::tempdir().expect("tempdir");
        let mounts = MountRecords::new(store.path());
        let record = |vol: &str, pod: &str, d: u8| MountRecord {
            volume_id: vol.into(),
            pod: PodRef {
                namespace: "ml".into(),
                name: pod.into(),
                uid: Some(format!("uid-{pod}")),
            },
            cache: ns_key("ml", "llama"),
            digest: digest(d),
            target_path: PathBuf::from(format!("/var/lib/kubelet/pods/{pod}/volumes/x/mount")),
            mount_path: Some("/root/.triton/cache".into()),
            published: Timestamp::now(),
        };
        let a = record("csi-aaaa", "a", 1);
        let b = record("weird/id with spaces", "b", 1);
        let c = record("csi-cccc", "c", 2);
        for r in [&a, &b, &c] {
            mounts.record(r).expect("record");
        }
        assert!(store.path().join("mounts/csi-aaaa.json").is_file());
        let weird = mounts.path_of(&b.volume_id);
        assert_eq!(weird.parent(), Some(store.path().join("mounts").as_path()));
        assert!(
            weird
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('_'))
        );

        assert_eq!(
            mounts.get("weird/id with spaces").expect("get"),
            Some(b.clone())
        );
        assert_eq!(mounts.list().expect("list").len(), 3);
        let by_digest = mounts.pods_by_digest().expect("count");
        assert_eq!(by_digest[&digest(1)].len(), 2);
        assert_eq!(by_digest[&digest(2)], vec![c.pod.clone()]);

        assert!(mounts.remove("csi-aaaa").expect("remove"));
        assert!(!mounts.remove("csi-aaaa").expect("remove again"));
        assert_eq!(
            mounts.pods_by_digest().expect("count")[&digest(1)],
            vec![b.pod.clone()]
        );
    }
}
