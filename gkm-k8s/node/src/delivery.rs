//! The delivery index: per cache, the digest the agent decided to deliver on
//! this node and whether it may be mounted, which the CSI driver reads before
//! each mount (see the [module docs](super)).

use std::path::{Path, PathBuf};

use gkm_core::Digest;
use gkm_core::compat::Report;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::DELIVERY_DIR;
use super::json_file::{
    invalid_data, json_stem, list_dir, read_json, remove_file, write_json_atomically,
};
use super::names::check_key;
use crate::error::Result;
use gkm_core::CacheKey;

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
    /// The cache's `spec.image` (the repository the node pulls from), which
    /// names the base of a delta capture; `None` when not recorded.
    pub image: Option<String>,
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
            image: None,
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
            image: None,
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

    /// Whether the CSI driver may mount it: the node's verdict, which the
    /// agent reached from the operator's (`VerificationStatus::admits` in
    /// `gkm-k8s-api`), the GPU fit and the store. The driver decides nothing else.
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image: Option<String>,
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
            image: d.image.clone(),
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
            image: self.image,
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
        let file = format!("{}.json", key.name());
        Ok(match key {
            CacheKey::Namespaced { namespace, .. } => {
                self.dir.join(NAMESPACED_DIR).join(namespace).join(file)
            }
            CacheKey::Cluster { .. } => self.dir.join(CLUSTER_DIR).join(file),
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
                    let key = CacheKey::namespaced(ns_name.clone(), name);
                    self.push_entry(&mut out, key);
                }
            }
        }
        for file in list_dir(&self.dir.join(CLUSTER_DIR))? {
            if let Some(name) = json_stem(&file) {
                self.push_entry(&mut out, CacheKey::cluster(name));
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

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::error::Error;
    use crate::test_keys::{cluster_key, digest, ns_key};

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
        ] {
            let err = index.path_of(&key).expect_err("refused");
            assert!(matches!(err, Error::InvalidName(_)), "{key:?}: {err}");
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
