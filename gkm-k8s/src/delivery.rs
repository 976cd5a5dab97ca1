//! The node-local files through which the node agent and the CSI driver
//! cooperate, readable without the Kubernetes API.
//!
//! Both live beside the content-addressed store ([`gkm_oci::Store`], whose
//! entries are `<store>/sha256/<hex>/`):
//!
//! - The **delivery index**, written by the agent, read by the CSI driver: per
//!   cache, the digest to deliver and whether it may be delivered on this node.
//!   - `<store>/delivery/gkmcache/<namespace>/<name>.json` for a `GKMCache`,
//!   - `<store>/delivery/clustergkmcache/<name>.json` for a `ClusterGKMCache`,
//!
//!   each `{"digest": "sha256:…", "deliverable": bool, "verdict": …,
//!   "reason": "…", "updated": "<RFC 3339>", "workloadNamespaces": […]}`
//!   (the last for a `ClusterGKMCache` that names them), where `verdict` is one of
//!   `deliverable`, `notVerified`, `incompatible`, `notExtracted` and `reason`
//!   (absent when deliverable) says why not, in words that end up in the pod's
//!   events.
//! - The **mount records**, written by the CSI driver, read by the agent: one
//!   `<store>/mounts/<volume-file>.json` per published volume (pod namespace,
//!   name and uid, the cache, the digest, the target path), written before the
//!   bind mount and removed after the unmount, so the records are always a
//!   superset of what is mounted. The agent counts pods per digest from them,
//!   and must not remove a store directory some record still names.
//!
//! Readers ignore fields they do not know, so an agent and a driver of
//! neighbouring versions (their DaemonSets roll separately) still agree.
//!
//! Every file is written atomically (a temporary file in the same directory,
//! synced, then renamed over the old one), so a reader sees the old or the new
//! content, never a torn one. Cache and namespace names are checked to be
//! Kubernetes object names before they become paths.
//!
//! ```
//! use gkm_k8s::cache_object::{CacheKey, Scope};
//! use gkm_k8s::delivery::{Delivery, DeliveryIndex, Verdict};
//!
//! let store = tempfile::tempdir()?;
//! let index = DeliveryIndex::new(store.path());
//! let key = CacheKey { scope: Scope::Namespaced, namespace: Some("ml".into()), name: "llama".into() };
//! let digest: gkm_oci::Digest =
//!     "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".parse()?;
//!
//! // The agent: this node's GPUs do not fit the cache.
//! index.publish(&key, &Delivery::refused(digest.clone(), Verdict::Incompatible, "GPU 0 Tesla T4: no target fits"))?;
//!
//! // The CSI driver: refuses the mount, saying why.
//! let delivery = index.get(&key)?.expect("recorded");
//! assert!(!delivery.is_deliverable());
//! assert_eq!(delivery.reason.as_deref(), Some("GPU 0 Tesla T4: no target fits"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use gkm_core::compat::Report;
use gkm_oci::Digest;
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::cache_object::{CacheKey, Scope};
use crate::error::{Error, Result};

/// The delivery index's directory under the store root.
pub const DELIVERY_DIR: &str = "delivery";
/// The mount records' directory under the store root.
pub const MOUNTS_DIR: &str = "mounts";

const NAMESPACED_DIR: &str = "gkmcache";
const CLUSTER_DIR: &str = "clustergkmcache";

/// Whether a cache's digest may be delivered on this node, and if not, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    /// Verified, compatible with a GPU of this node, and extracted.
    Deliverable,
    /// The signature is missing, wrong, or not checked yet.
    NotVerified,
    /// No GPU of this node fits the cache (or the node has no GPU).
    Incompatible,
    /// Verified and compatible, but not (yet) extracted into the store.
    NotExtracted,
}

/// The agent's decision for one cache on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The image digest the cache resolves to now.
    pub digest: Digest,
    /// Whether it may be delivered.
    pub verdict: Verdict,
    /// Why not (always set unless deliverable).
    pub reason: Option<String>,
    /// When the agent decided.
    pub updated: Timestamp,
    /// For a `ClusterGKMCache` with `workloadNamespaces`, the namespaces
    /// whose pods may mount it; `None`: pods of any namespace may.
    pub workload_namespaces: Option<Vec<String>>,
}

impl Delivery {
    /// `digest` may be mounted.
    pub fn deliverable(digest: Digest) -> Delivery {
        Delivery {
            digest,
            verdict: Verdict::Deliverable,
            reason: None,
            updated: Timestamp::now(),
            workload_namespaces: None,
        }
    }

    /// `digest` may not be mounted, because `reason`. A
    /// [`Verdict::Deliverable`] verdict is kept, and the reason dropped.
    pub fn refused(digest: Digest, verdict: Verdict, reason: impl Into<String>) -> Delivery {
        let reason = (verdict != Verdict::Deliverable).then(|| reason.into());
        Delivery {
            digest,
            verdict,
            reason,
            updated: Timestamp::now(),
            workload_namespaces: None,
        }
    }

    /// This decision, limited to pods of `namespaces` (`None`: any).
    pub fn for_namespaces(mut self, namespaces: Option<Vec<String>>) -> Delivery {
        self.workload_namespaces = namespaces;
        self
    }

    /// The decision that a compatibility check implies for an extracted
    /// digest: deliverable when some GPU fits, else incompatible with
    /// [`incompatibility_reason`].
    pub fn from_report(digest: Digest, report: &Report) -> Delivery {
        if report.compatible {
            Delivery::deliverable(digest)
        } else {
            Delivery::refused(
                digest,
                Verdict::Incompatible,
                incompatibility_reason(report),
            )
        }
    }

    /// Whether the CSI driver may mount it.
    pub fn is_deliverable(&self) -> bool {
        self.verdict == Verdict::Deliverable
    }
}

/// One line saying why no GPU of a node fits a cache, for pod events: per
/// GPU, per cache target, every reason, all separated by `; `:
/// `GPU 0 AMD Instinct MI210 (hip/gfx90a/64): cuda/75/32: backend mismatch:
/// the cache targets cuda, the GPU is hip; warp size mismatch: …`.
pub fn incompatibility_reason(report: &Report) -> String {
    let mut parts: Vec<String> = report.reasons.iter().map(ToString::to_string).collect();
    for gpu in report.incompatible_gpus() {
        let mut why: Vec<String> = gpu.reasons.iter().map(ToString::to_string).collect();
        for mismatch in &gpu.mismatches {
            let reasons: Vec<String> = mismatch.reasons.iter().map(ToString::to_string).collect();
            why.push(format!("{}: {}", mismatch.target, reasons.join("; ")));
        }
        parts.push(format!("GPU {}: {}", gpu.description, why.join("; ")));
    }
    if parts.is_empty() {
        "no GPU fits the cache".to_string()
    } else {
        parts.join("; ")
    }
}

/// The JSON form of a [`Delivery`].
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeliveryFile {
    digest: String,
    deliverable: bool,
    verdict: Verdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    updated: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workload_namespaces: Option<Vec<String>>,
}

impl DeliveryFile {
    fn from_delivery(d: &Delivery) -> DeliveryFile {
        DeliveryFile {
            digest: d.digest.to_string(),
            deliverable: d.is_deliverable(),
            verdict: d.verdict,
            reason: d.reason.clone(),
            updated: d.updated,
            workload_namespaces: d.workload_namespaces.clone(),
        }
    }

    fn into_delivery(self) -> std::result::Result<Delivery, String> {
        let digest: Digest = self
            .digest
            .parse()
            .map_err(|e| format!("field digest: {e}"))?;
        if self.deliverable != (self.verdict == Verdict::Deliverable) {
            return Err(format!(
                "deliverable is {} but the verdict is {:?}",
                self.deliverable, self.verdict
            ));
        }
        if !self.deliverable && self.reason.as_deref().is_none_or(str::is_empty) {
            return Err("an entry that is not deliverable needs a reason".to_string());
        }
        Ok(Delivery {
            digest,
            verdict: self.verdict,
            reason: self.reason,
            updated: self.updated,
            workload_namespaces: self.workload_namespaces,
        })
    }
}

/// The delivery index of one node store (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct DeliveryIndex {
    dir: PathBuf,
}

impl DeliveryIndex {
    /// The index of the store at `store_root`; touches nothing.
    pub fn new(store_root: &Path) -> DeliveryIndex {
        DeliveryIndex {
            dir: store_root.join(DELIVERY_DIR),
        }
    }

    /// The file holding `key`'s entry. Fails when a name is not a Kubernetes
    /// object name (so it cannot escape the index).
    pub fn path_of(&self, key: &CacheKey) -> Result<PathBuf> {
        check_key(key)?;
        let file = format!("{}.json", key.name);
        Ok(match (&key.scope, &key.namespace) {
            (Scope::Namespaced, Some(ns)) => self.dir.join(NAMESPACED_DIR).join(ns).join(file),
            _ => self.dir.join(CLUSTER_DIR).join(file),
        })
    }

    /// Record the decision for `key` (the agent), replacing any before.
    pub fn publish(&self, key: &CacheKey, delivery: &Delivery) -> Result<()> {
        let path = self.path_of(key)?;
        write_json_atomically(&path, &DeliveryFile::from_delivery(delivery))
    }

    /// The decision for `key`, `None` when the agent recorded none.
    pub fn get(&self, key: &CacheKey) -> Result<Option<Delivery>> {
        let path = self.path_of(key)?;
        let Some(file) = read_json::<DeliveryFile>(&path)? else {
            return Ok(None);
        };
        file.into_delivery()
            .map(Some)
            .map_err(|reason| invalid_data(&path, reason))
    }

    /// Forget `key` (the cache was deleted); whether there was an entry.
    pub fn remove(&self, key: &CacheKey) -> Result<bool> {
        remove_file(&self.path_of(key)?)
    }

    /// Every entry, sorted by cache. Unreadable entries are logged and left
    /// out.
    pub fn list(&self) -> Result<Vec<(CacheKey, Delivery)>> {
        let mut out = Vec::new();
        let namespaced = self.dir.join(NAMESPACED_DIR);
        for ns in list_dir(&namespaced)? {
            let Some(ns_name) = ns.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
                continue;
            };
            for file in list_dir(&ns)? {
                if let Some(name) = json_stem(&file) {
                    let key = CacheKey {
                        scope: Scope::Namespaced,
                        namespace: Some(ns_name.clone()),
                        name,
                    };
                    self.push_entry(&mut out, key);
                }
            }
        }
        for file in list_dir(&self.dir.join(CLUSTER_DIR))? {
            if let Some(name) = json_stem(&file) {
                self.push_entry(
                    &mut out,
                    CacheKey {
                        scope: Scope::Cluster,
                        namespace: None,
                        name,
                    },
                );
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn push_entry(&self, out: &mut Vec<(CacheKey, Delivery)>, key: CacheKey) {
        match self.get(&key) {
            Ok(Some(d)) => out.push((key, d)),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "skipping unreadable delivery entry"),
        }
    }
}

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
struct MountFile {
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
    published: Timestamp,
}

impl MountFile {
    fn from_record(r: &MountRecord) -> MountFile {
        MountFile {
            volume_id: r.volume_id.clone(),
            pod_namespace: r.pod.namespace.clone(),
            pod_name: r.pod.name.clone(),
            pod_uid: r.pod.uid.clone(),
            cache_scope: match r.cache.scope {
                Scope::Namespaced => ScopeFile::Namespaced,
                Scope::Cluster => ScopeFile::Cluster,
            },
            cache_namespace: r.cache.namespace.clone(),
            cache_name: r.cache.name.clone(),
            digest: r.digest.to_string(),
            target_path: r.target_path.clone(),
            published: r.published,
        }
    }

    fn into_record(self) -> std::result::Result<MountRecord, String> {
        let digest: Digest = self
            .digest
            .parse()
            .map_err(|e| format!("field digest: {e}"))?;
        let scope = match self.cache_scope {
            ScopeFile::Namespaced => Scope::Namespaced,
            ScopeFile::Cluster => Scope::Cluster,
        };
        let cache = CacheKey {
            scope,
            namespace: self.cache_namespace,
            name: self.cache_name,
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
            published: self.published,
        })
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
        let plain = !volume_id.is_empty()
            && volume_id.len() <= 200
            && !volume_id.starts_with(['.', '_'])
            && volume_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if plain {
            self.dir.join(format!("{volume_id}.json"))
        } else {
            self.dir
                .join(format!("_{}.json", Digest::of(volume_id.as_bytes()).hex()))
        }
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
        let mut out = Vec::new();
        for path in list_dir(&self.dir)? {
            if json_stem(&path).is_none() {
                continue;
            }
            let parsed = read_json::<MountFile>(&path).and_then(|file| match file {
                Some(file) => file
                    .into_record()
                    .map(Some)
                    .map_err(|reason| invalid_data(&path, reason)),
                None => Ok(None),
            });
            match parsed {
                Ok(Some(record)) => out.push(record),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "skipping unreadable mount record"),
            }
        }
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

/// Checks that a key's names are Kubernetes names and that its namespace
/// matches its scope.
pub fn check_key(key: &CacheKey) -> Result<()> {
    let bad = |what: String| Err(Error::InvalidSpec(what));
    match (&key.scope, &key.namespace) {
        (Scope::Namespaced, None) => {
            return bad(format!("GKMCache {:?} has no namespace", key.name));
        }
        (Scope::Cluster, Some(ns)) => {
            return bad(format!(
                "ClusterGKMCache {:?} cannot have a namespace (got {ns:?})",
                key.name
            ));
        }
        (Scope::Namespaced, Some(ns)) if !is_dns1123_label(ns) => {
            return bad(format!(
                "namespace {ns:?} is not a valid namespace name (a DNS-1123 label)"
            ));
        }
        _ => {}
    }
    if !is_dns1123_subdomain(&key.name) {
        return bad(format!(
            "cache name {:?} is not a valid object name (a DNS-1123 subdomain)",
            key.name
        ));
    }
    Ok(())
}

/// A DNS-1123 label: at most 63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: at most 253, dot-separated DNS-1123 labels.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

fn invalid_data(path: &Path, reason: impl Into<String>) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidData, reason.into()),
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Write `value` as JSON to `path` through a synced temporary file in the
/// same directory and a rename.
fn write_json_atomically<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| invalid_data(path, "no parent directory"))?;
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let mut bytes = serde_json::to_vec_pretty(value)?;
    bytes.push(b'\n');
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .suffix(".json")
        .tempfile_in(dir)
        .map_err(io_err(dir))?;
    tmp.write_all(&bytes).map_err(io_err(tmp.path()))?;
    tmp.as_file().sync_all().map_err(io_err(path))?;
    tmp.persist(path).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e.error,
    })?;
    Ok(())
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| invalid_data(path, e.to_string()))
}

fn remove_file(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(path)(e)),
    }
}

/// The entries of `dir`, sorted; none when it does not exist.
fn list_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    let mut out: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    out.sort();
    Ok(out)
}

/// `name` for `…/name.json`, skipping temporary files (`.tmp-…`).
fn json_stem(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    if file.starts_with('.') {
        return None;
    }
    file.strip_suffix(".json").map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(n: u8) -> Digest {
        Digest::of(&[n])
    }

    fn ns_key(ns: &str, name: &str) -> CacheKey {
        CacheKey {
            scope: Scope::Namespaced,
            namespace: Some(ns.into()),
            name: name.into(),
        }
    }

    fn cluster_key(name: &str) -> CacheKey {
        CacheKey {
            scope: Scope::Cluster,
            namespace: None,
            name: name.into(),
        }
    }

    #[test]
    fn index_round_trip_and_layout() {
        let store = tempfile::tempdir().expect("tempdir");
        let index = DeliveryIndex::new(store.path());
        let key = ns_key("ml", "llama");
        assert_eq!(index.get(&key).expect("get"), None);

        let d = Delivery::deliverable(digest(1));
        index.publish(&key, &d).expect("publish");
        assert_eq!(index.get(&key).expect("get"), Some(d.clone()));
        let file = store.path().join("delivery/gkmcache/ml/llama.json");
        let json: serde_json::Value =
            serde_json::from_slice(&fs::read(&file).expect("read")).expect("json");
        assert_eq!(json["digest"], digest(1).to_string());
        assert_eq!(json["deliverable"], true);
        assert_eq!(json["verdict"], "deliverable");
        assert!(json.get("reason").is_none());

        // Replaced, not appended; no temporary file left behind.
        let refused = Delivery::refused(digest(2), Verdict::NotVerified, "no signature");
        index.publish(&key, &refused).expect("publish");
        assert_eq!(index.get(&key).expect("get"), Some(refused));
        let names: Vec<_> = fs::read_dir(file.parent().expect("dir"))
            .expect("ls")
            .map(|e| e.expect("e").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("llama.json")]);

        let c = cluster_key("shared.cache");
        index
            .publish(&c, &Delivery::deliverable(digest(3)))
            .expect("publish");
        assert!(
            store
                .path()
                .join("delivery/clustergkmcache/shared.cache.json")
                .is_file()
        );

        let listed: Vec<CacheKey> = index
            .list()
            .expect("list")
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(listed, vec![key.clone(), c.clone()]);

        assert!(index.remove(&key).expect("remove"));
        assert!(!index.remove(&key).expect("remove again"));
        assert_eq!(index.get(&key).expect("get"), None);
    }

    #[test]
    fn names_that_could_escape_are_refused() {
        let store = tempfile::tempdir().expect("tempdir");
        let index = DeliveryIndex::new(store.path());
        for key in [
            ns_key("ml", "../../etc/passwd"),
            ns_key("..", "x"),
            ns_key("ml", ""),
            ns_key("ML", "x"),
            ns_key("ml", "a/b"),
            cluster_key(".."),
            CacheKey {
                scope: Scope::Namespaced,
                namespace: None,
                name: "x".into(),
            },
            CacheKey {
                scope: Scope::Cluster,
                namespace: Some("ml".into()),
                name: "x".into(),
            },
        ] {
            let err = index.path_of(&key).expect_err("refused");
            assert!(matches!(err, Error::InvalidSpec(_)), "{key:?}: {err}");
        }
    }

    proptest::proptest! {
        /// Whatever names a pod spec carries, an entry's path stays inside
        /// the index: refused, or a plain file two levels below it.
        #[test]
        fn paths_stay_inside_the_index(ns in "\\PC{0,12}|[a-z.-]{0,12}", name in "\\PC{0,20}|[a-z0-9./-]{0,20}") {
            let index = DeliveryIndex::new(Path::new("/store"));
            for key in [ns_key(&ns, &name), cluster_key(&name)] {
                if let Ok(path) = index.path_of(&key) {
                    let rel = path.strip_prefix("/store/delivery").expect("inside the index");
                    proptest::prop_assert!(rel.components().all(|c| matches!(c, std::path::Component::Normal(_))));
                    proptest::prop_assert!(rel.components().count() <= 3);
                    let expected = format!("{name}.json");
                    proptest::prop_assert_eq!(path.file_name().and_then(|f| f.to_str()), Some(expected.as_str()));
                }
            }
        }

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
    fn inconsistent_or_corrupt_entries_are_errors_naming_the_file() {
        let store = tempfile::tempdir().expect("tempdir");
        let index = DeliveryIndex::new(store.path());
        let key = ns_key("ml", "llama");
        let path = index.path_of(&key).expect("path");
        fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        let cases = [
            (
                r#"{"digest":"sha256:00","deliverable":true,"verdict":"deliverable","updated":"2026-01-01T00:00:00Z"}"#,
                "digest",
            ),
            (
                &format!(
                    r#"{{"digest":"{}","deliverable":true,"verdict":"incompatible","reason":"x","updated":"2026-01-01T00:00:00Z"}}"#,
                    digest(1)
                ),
                "verdict",
            ),
            (
                &format!(
                    r#"{{"digest":"{}","deliverable":false,"verdict":"incompatible","updated":"2026-01-01T00:00:00Z"}}"#,
                    digest(1)
                ),
                "reason",
            ),
            ("not json", "expected"),
        ];
        for (content, mentions) in cases {
            fs::write(&path, content).expect("write");
            let err = index.get(&key).expect_err("invalid").to_string();
            assert!(
                err.contains("llama.json") && err.contains(mentions),
                "{err}"
            );
        }
        // A field from a newer agent is ignored.
        let newer = format!(
            r#"{{"digest":"{}","deliverable":true,"verdict":"deliverable","updated":"2026-01-01T00:00:00Z","sizeBytes":42}}"#,
            digest(1)
        );
        fs::write(&path, newer).expect("write");
        assert!(
            index
                .get(&key)
                .expect("newer entry")
                .expect("present")
                .is_deliverable()
        );
        fs::write(&path, "not json").expect("write");

        // list() skips it rather than failing.
        assert!(index.list().expect("list").is_empty());
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

    #[test]
    fn from_report_words_the_refusal() {
        use gkm_core::cache::Summary;
        use gkm_core::compat::{CheckOptions, check_summary};
        use gkm_core::{Backend, Gpu, Vendor};

        let summary = Summary::from_label(
            r#"{"targets":[{"backend":"hip","arch":"gfx90a","warp_size":64}]}"#,
        )
        .expect("summary");
        let t4 = Gpu {
            vendor: Vendor::Nvidia,
            product: "Tesla T4".into(),
            backend: Some(Backend::Cuda),
            arch: Some("sm_75".parse().expect("arch")),
            warp_size: Some(32),
            ..Default::default()
        };
        let d = Delivery::from_report(
            digest(1),
            &check_summary(&summary, &[t4], &CheckOptions::default()),
        );
        assert_eq!(d.verdict, Verdict::Incompatible);
        let reason = d.reason.expect("reason");
        assert!(reason.starts_with("GPU 0 Tesla T4"), "{reason}");
        assert!(reason.contains("gfx90a"), "{reason}");

        let none = Delivery::from_report(
            digest(1),
            &check_summary(&summary, &[], &CheckOptions::default()),
        );
        assert_eq!(none.verdict, Verdict::Incompatible);
        assert!(!none.reason.expect("reason").is_empty());
    }
}
