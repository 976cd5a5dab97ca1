//! Deciding a `NodePublishVolume` from what the node holds: pure, so every
//! refusal and its gRPC code is tested without root, a store or a mount.
//! [`Views::publish`](super::Views::publish) reads the [`Observed`] facts, asks
//! [`decide`], and carries the [`Decision`] out.

use std::path::PathBuf;

use gkm_k8s_node::delivery::{Delivery, Verdict};
use gkm_k8s_node::mount_records::MountRecord;
use jiff::Timestamp;
use tonic::Status;

use super::access::{check_pod, check_workload_namespace};
use crate::volume::{CacheVolume, View};

/// The store entry of the digest the agent decided on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// No store directory at `path`.
    Missing {
        /// Where it should be.
        path: PathBuf,
    },
    /// The directory is there without its seal: stored by a version of gkm
    /// whose deliveries could write into it, so the agent checks it and
    /// extracts it again before it is delivered.
    Unsealed {
        /// The entry.
        path: PathBuf,
    },
    /// The directory is there, but holds no cache tree that may be mounted.
    Unmountable {
        /// Why not.
        reason: String,
    },
    /// A cache tree, ready to bind-mount.
    Ready,
}

/// What is mounted at the target path already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetMount {
    /// The mount's filesystem type.
    pub fs_type: String,
    /// The mount's root within its filesystem.
    pub root: PathBuf,
    /// Whether it is read-only.
    pub read_only: bool,
    /// Whether it is the view this publish would mount: the read-only view
    /// of the digest, or the writable view of the digest for this volume.
    pub ours: bool,
}

/// What the agent recorded for the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// No delivery decision, in the delivery index file read.
    Nothing {
        /// The file, named in the refusal.
        index_file: String,
    },
    /// Its decision, and the store entry of the digest it decided on.
    Decision {
        /// The decision.
        delivery: Delivery,
        /// The digest's store entry.
        entry: Entry,
    },
}

/// What the node holds that a publish decides on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// What the agent recorded for the cache.
    pub recorded: Recorded,
    /// Where the volume is still mounted under another target path, if its
    /// mount record names one that is still a mount point.
    pub published_elsewhere: Option<PathBuf>,
    /// What is mounted at the target path, if anything.
    pub at_target: Option<TargetMount>,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Published already: only make sure the record is there.
    AlreadyPublished(MountRecord),
    /// Record, then mount the view the request asks for at the target.
    Mount(MountRecord),
}

/// Decides `req` on `node` from `observed`, at `now`: a [`Decision`] or the
/// refusal, whose gRPC code tells the kubelet whether retrying can help
/// (`UNAVAILABLE`: not yet) or not (`FAILED_PRECONDITION`, `NOT_FOUND`,
/// `PERMISSION_DENIED`).
pub fn decide(
    req: &CacheVolume,
    node: &str,
    observed: &Observed,
    now: Timestamp,
) -> Result<Decision, Status> {
    check_pod(req)?;
    let (delivery, entry) = match &observed.recorded {
        Recorded::Nothing { index_file } => {
            return Err(Status::not_found(format!(
                "{} is not known on node {node}: the gkm agent has recorded no delivery decision for it ({index_file}); \
                 check that the cache exists and that gkm-agent runs on this node",
                req.cache
            )));
        }
        Recorded::Decision { delivery, entry } => (delivery, entry),
    };
    check_workload_namespace(req, delivery)?;
    let what = format!("{} digest {}", req.cache, delivery.digest);
    let reason = delivery.reason.as_deref().unwrap_or("no reason recorded");
    match delivery.verdict {
        Verdict::Deliverable => {}
        Verdict::NotVerified => {
            return Err(Status::failed_precondition(format!(
                "{what} is not verified: {reason}"
            )));
        }
        Verdict::Incompatible => {
            return Err(Status::failed_precondition(format!(
                "{what} is not compatible with any GPU on node {node}: {reason}"
            )));
        }
        Verdict::NotExtracted => {
            return Err(Status::unavailable(format!(
                "{what} is not extracted on node {node} yet: {reason}"
            )));
        }
    }
    match entry {
        Entry::Missing { path } => {
            return Err(Status::unavailable(format!(
                "{what} is deliverable but its store directory {} is missing on node {node}",
                path.display()
            )));
        }
        Entry::Unsealed { path } => {
            return Err(Status::unavailable(format!(
                "{what} is stored at {} on node {node} without a seal (stored by an older gkm, whose \
                 deliveries could write into it): the gkm agent checks it and extracts it again",
                path.display()
            )));
        }
        Entry::Unmountable { reason } => {
            return Err(Status::failed_precondition(format!(
                "{what} cannot be mounted on node {node}: {reason}"
            )));
        }
        Entry::Ready => {}
    }
    if let Some(elsewhere) = &observed.published_elsewhere {
        return Err(Status::failed_precondition(format!(
            "volume {} is already published at {}; unpublish it there first",
            req.volume_id,
            elsewhere.display()
        )));
    }
    let record = MountRecord {
        volume_id: req.volume_id.clone(),
        pod: req.pod.clone(),
        cache: req.cache.clone(),
        digest: delivery.digest.clone(),
        target_path: req.target_path.clone(),
        mount_path: req.mount_path.clone(),
        published: now,
    };
    match &observed.at_target {
        None => Ok(Decision::Mount(record)),
        Some(existing) if existing.ours => Ok(Decision::AlreadyPublished(record)),
        Some(existing) => Err(Status::failed_precondition(format!(
            "target path {} is already a mount point ({} {}{}), not the {} view of {what}",
            req.target_path.display(),
            existing.fs_type,
            existing.root.display(),
            if existing.read_only {
                ", read-only"
            } else {
                ""
            },
            match req.view {
                View::ReadOnly => "read-only",
                View::Writable { .. } => "writable",
            },
        ))),
    }
}

#[cfg(test)]
mod tests {
    use gkm_core::{CacheKey, Digest};
    use gkm_k8s_node::mount_records::PodRef;
    use tonic::Code;

    use super::*;

    const TARGET: &str = "/var/lib/kubelet/pods/0c1d/volumes/kubernetes.io~csi/kernels/mount";

    fn request(cache: CacheKey) -> CacheVolume {
        CacheVolume {
            volume_id: "csi-1".into(),
            target_path: TARGET.into(),
            cache,
            pod: PodRef {
                namespace: "ml".into(),
                name: "infer-0".into(),
                uid: Some("0c1d".into()),
            },
            view: View::ReadOnly,
            mount_path: None,
            capture: None,
        }
    }

    fn observed(delivery: Option<Delivery>) -> Observed {
        with_entry(delivery, Entry::Ready)
    }

    fn with_entry(delivery: Option<Delivery>, entry: Entry) -> Observed {
        let recorded = match delivery {
            Some(delivery) => Recorded::Decision { delivery, entry },
            None => Recorded::Nothing {
                index_file: "/store/delivery/gkmcache/ml/vector-add.json".into(),
            },
        };
        Observed {
            recorded,
            published_elsewhere: None,
            at_target: None,
        }
    }

    fn digest() -> Digest {
        Digest::of(b"cache")
    }

    fn refused(result: Result<Decision, Status>) -> (Code, String) {
        let status = result.expect_err("refused");
        (status.code(), status.message().to_string())
    }

    fn decided(observed: &Observed) -> Result<Decision, Status> {
        let req = request(CacheKey::namespaced("ml", "vector-add"));
        decide(&req, "node-a", observed, Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn a_deliverable_cache_is_recorded_then_mounted() {
        let decision = decided(&observed(Some(Delivery::deliverable(digest())))).expect("mount");
        let Decision::Mount(record) = decision else {
            panic!("expected a mount, got {decision:?}");
        };
        assert_eq!(record.digest, digest());
        assert_eq!(record.target_path, std::path::Path::new(TARGET));
        assert_eq!(record.pod.uid.as_deref(), Some("0c1d"));
    }

    #[test]
    fn every_refusal_names_its_cause_with_the_code_the_kubelet_acts_on() {
        let refusals = [
            (
                observed(None),
                Code::NotFound,
                "has recorded no delivery decision",
            ),
            (
                observed(Some(Delivery::refused(
                    digest(),
                    Verdict::NotVerified,
                    "no signature",
                ))),
                Code::FailedPrecondition,
                "is not verified: no signature",
            ),
            (
                observed(Some(Delivery::refused(
                    digest(),
                    Verdict::Incompatible,
                    "GPU 0: sm75",
                ))),
                Code::FailedPrecondition,
                "is not compatible with any GPU on node node-a: GPU 0: sm75",
            ),
            (
                observed(Some(Delivery::refused(
                    digest(),
                    Verdict::NotExtracted,
                    "pulling",
                ))),
                Code::Unavailable,
                "is not extracted on node node-a yet: pulling",
            ),
            (
                with_entry(
                    Some(Delivery::deliverable(digest())),
                    Entry::Missing {
                        path: "/store/sha256/ab".into(),
                    },
                ),
                Code::Unavailable,
                "its store directory /store/sha256/ab is missing",
            ),
            (
                with_entry(
                    Some(Delivery::deliverable(digest())),
                    Entry::Unsealed {
                        path: "/store/sha256/ab".into(),
                    },
                ),
                Code::Unavailable,
                "is stored at /store/sha256/ab on node node-a without a seal",
            ),
            (
                with_entry(
                    Some(Delivery::deliverable(digest())),
                    Entry::Unmountable {
                        reason: "a symbolic link".into(),
                    },
                ),
                Code::FailedPrecondition,
                "cannot be mounted on node node-a: a symbolic link",
            ),
            (
                Observed {
                    published_elsewhere: Some("/elsewhere".into()),
                    ..observed(Some(Delivery::deliverable(digest())))
                },
                Code::FailedPrecondition,
                "already published at /elsewhere",
            ),
            (
                Observed {
                    at_target: Some(TargetMount {
                        fs_type: "tmpfs".into(),
                        root: "/".into(),
                        read_only: false,
                        ours: false,
                    }),
                    ..observed(Some(Delivery::deliverable(digest())))
                },
                Code::FailedPrecondition,
                "is already a mount point (tmpfs /), not the read-only view of",
            ),
            (
                Observed {
                    at_target: Some(TargetMount {
                        fs_type: "ext4".into(),
                        root: "/store".into(),
                        read_only: false,
                        // A writable mount is never the read-only view.
                        ours: false,
                    }),
                    ..observed(Some(Delivery::deliverable(digest())))
                },
                Code::FailedPrecondition,
                "is already a mount point (ext4 /store), not the read-only view of",
            ),
        ];
        for (observed, code, says) in refusals {
            let (got, message) = refused(decided(&observed));
            assert_eq!(got, code, "{message}");
            assert!(message.contains(says), "{message:?} lacks {says:?}");
        }
    }

    #[test]
    fn publishing_again_keeps_the_mount_and_only_records_it() {
        let observed = Observed {
            at_target: Some(TargetMount {
                fs_type: "ext4".into(),
                root: "/store/sha256/ab/io.triton.cache".into(),
                read_only: true,
                ours: true,
            }),
            ..observed(Some(Delivery::deliverable(digest())))
        };
        assert!(matches!(
            decided(&observed),
            Ok(Decision::AlreadyPublished(_))
        ));
    }

    #[test]
    fn access_is_checked_before_anything_is_read() {
        let other_namespace = request(CacheKey::namespaced("team-b", "vector-add"));
        let (code, message) = refused(decide(
            &other_namespace,
            "node-a",
            &observed(Some(Delivery::deliverable(digest()))),
            Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(code, Code::PermissionDenied, "{message}");
        let mut shared = Delivery::deliverable(digest());
        shared.workload_namespaces = Some(vec!["team-b".into()]);
        let (code, message) = refused(decide(
            &request(CacheKey::cluster("shared")),
            "node-a",
            &observed(Some(shared)),
            Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(code, Code::PermissionDenied, "{message}");
        assert!(message.contains("workloadNamespaces (team-b)"), "{message}");
    }
}
