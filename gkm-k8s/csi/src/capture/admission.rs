//! Which capture volumes the driver publishes, so that a tenant who may only
//! create pods cannot pin a node's memory with capture trees.
//!
//! A capture volume is published only
//!
//! - when capture volumes are enabled ([`CaptureConfig::enabled`], the
//!   chart's `capture.enabled`; `FAILED_PRECONDITION` otherwise);
//! - for a workload's own tree, only for a `GKMCacheCapture` of the pod's
//!   namespace that the agent's [capture index](gkm_k8s_node::captures)
//!   says is pending (`open`: it exists and is not over). The index lists
//!   every pending capture of the cluster; one it does not name is
//!   `NOT_FOUND`, one that is over `FAILED_PRECONDITION`, and no index yet
//!   `UNAVAILABLE` (the kubelet retries, so a capture created with its
//!   workload is found once the agent has seen it);
//! - while the trees already granted on the node, plus the new one, stay
//!   within the per-namespace and per-node caps
//!   ([`CaptureConfig::namespace_max_bytes`], [`CaptureConfig::node_max_bytes`]):
//!   what is counted is the size of each tree's `tmpfs` (the most it can
//!   hold), as the kernel reports it for the trees mounted now, whether or
//!   not their pods still run (`RESOURCE_EXHAUSTED`, naming the cap).
//!
//! [`admit`] is the decision, pure; the driver gathers what it reads
//! ([`CaptureTrees::admit`](super::CaptureTrees::admit)).

use std::time::Duration;

use gkm_k8s_node::captures::{CaptureName, CaptureState, Captures};
use tonic::Status;

/// The bytes a namespace's capture trees may hold on a node by default.
pub const DEFAULT_NAMESPACE_MAX_BYTES: u64 = 20 << 30;
/// The bytes all capture trees may hold on a node by default.
pub const DEFAULT_NODE_MAX_BYTES: u64 = 40 << 30;
/// How long a tree of a pending capture stays, by default, once neither its
/// workload nor a capture Job has it mounted.
pub const DEFAULT_UNREAD_GRACE: Duration = Duration::from_secs(30 * 60);

/// The flag naming the per-namespace cap, as errors name it.
pub const NAMESPACE_CAP_FLAG: &str = "--capture-namespace-max-bytes";
/// The flag naming the per-node cap, as errors name it.
pub const NODE_CAP_FLAG: &str = "--capture-node-max-bytes";

/// What the driver allows of capture volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureConfig {
    /// Whether capture volumes are published at all.
    pub enabled: bool,
    /// The most bytes a namespace's capture trees may be granted on the node.
    pub namespace_max_bytes: u64,
    /// The most bytes all capture trees may be granted on the node.
    pub node_max_bytes: u64,
    /// How long a tree of a pending capture stays once nothing has it
    /// mounted (its workload ended and no capture Job reads it).
    pub unread_grace: Duration,
}

impl Default for CaptureConfig {
    /// Enabled, with the default caps and grace.
    fn default() -> CaptureConfig {
        CaptureConfig {
            enabled: true,
            namespace_max_bytes: DEFAULT_NAMESPACE_MAX_BYTES,
            node_max_bytes: DEFAULT_NODE_MAX_BYTES,
            unread_grace: DEFAULT_UNREAD_GRACE,
        }
    }
}

/// A tree granted on the node: its capture and the size of its `tmpfs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantedTree {
    /// The tree's capture.
    pub capture: CaptureName,
    /// The pod whose tree it is.
    pub uid: String,
    /// The most it can hold, in bytes.
    pub bytes: u64,
}

/// What a publish asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked<'a> {
    /// A workload's own new tree of `capture`, bounded to `bytes`.
    NewTree {
        /// The tree's capture, in the pod's namespace.
        capture: &'a CaptureName,
        /// Its bound.
        bytes: u64,
    },
    /// A tree granted already (a publish again), or a capture Job's
    /// read-only view of one.
    Existing,
}

/// Whether `asked` may be published, given `config`, the capture index
/// (`None` when the agent wrote none yet) and the trees granted now.
pub fn admit(
    config: &CaptureConfig,
    asked: Asked<'_>,
    index: Option<&Captures>,
    granted: &[GrantedTree],
) -> Result<(), Status> {
    if !config.enabled {
        return Err(Status::failed_precondition(
            "capture volumes are disabled on this node (the chart's capture.enabled is false: gkm-csi --capture-volumes=false)",
        ));
    }
    let Asked::NewTree { capture, bytes } = asked else {
        return Ok(());
    };
    let Some(index) = index else {
        return Err(Status::unavailable(format!(
            "no capture index yet: the gkm agent has not said whether GKMCacheCapture {capture} is pending"
        )));
    };
    match index.state(capture) {
        Some(CaptureState::Open) => {}
        Some(CaptureState::Over) => {
            return Err(Status::failed_precondition(format!(
                "GKMCacheCapture {capture} is over (Complete or Failed): nothing will capture a new tree"
            )));
        }
        Some(CaptureState::Gone) | None => {
            return Err(Status::not_found(format!(
                "no pending GKMCacheCapture {capture} (as the gkm agent saw the cluster at {}): create the capture before its workload",
                index.observed
            )));
        }
    }
    let in_namespace: u64 = granted
        .iter()
        .filter(|t| t.capture.namespace == capture.namespace)
        .map(|t| t.bytes)
        .sum();
    let on_node: u64 = granted.iter().map(|t| t.bytes).sum();
    let over = |held: u64, cap: u64, flag: &str, whose: &str| {
        Status::resource_exhausted(format!(
            "a capture tree of {bytes} bytes for GKMCacheCapture {capture} would take {whose} capture trees to {} bytes, over the cap {flag}={cap} ({held} bytes granted already)",
            held.saturating_add(bytes)
        ))
    };
    if in_namespace.saturating_add(bytes) > config.namespace_max_bytes {
        return Err(over(
            in_namespace,
            config.namespace_max_bytes,
            NAMESPACE_CAP_FLAG,
            &format!("namespace {}'s", capture.namespace),
        ));
    }
    if on_node.saturating_add(bytes) > config.node_max_bytes {
        return Err(over(
            on_node,
            config.node_max_bytes,
            NODE_CAP_FLAG,
            "the node's",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;
    use tonic::Code;

    fn name(ns: &str, capture: &str) -> CaptureName {
        CaptureName::new(ns, capture)
    }

    fn index(states: &[(&str, &str, CaptureState)]) -> Captures {
        let mut captures = Captures::new(Timestamp::UNIX_EPOCH);
        for (ns, n, state) in states {
            captures.states.insert(name(ns, n), *state);
        }
        captures
    }

    fn tree(ns: &str, bytes: u64) -> GrantedTree {
        GrantedTree {
            capture: name(ns, "c"),
            uid: "u".into(),
            bytes,
        }
    }

    #[test]
    fn only_a_pending_capture_of_the_pods_namespace_gets_a_new_tree() {
        let config = CaptureConfig::default();
        let warm = name("team", "warm");
        let ask = Asked::NewTree {
            capture: &warm,
            bytes: 1,
        };
        let open = index(&[("team", "warm", CaptureState::Open)]);
        assert!(admit(&config, ask, Some(&open), &[]).is_ok());
        let elsewhere = index(&[("other", "warm", CaptureState::Open)]);
        let cases = [
            (None, Code::Unavailable),
            (Some(&elsewhere), Code::NotFound),
            (Some(&index(&[])), Code::NotFound),
        ];
        for (idx, code) in cases {
            assert_eq!(
                admit(&config, ask, idx, &[]).expect_err("refused").code(),
                code
            );
        }
        let gone = index(&[("team", "warm", CaptureState::Gone)]);
        assert_eq!(
            admit(&config, ask, Some(&gone), &[])
                .expect_err("gone")
                .code(),
            Code::NotFound
        );
        let over = index(&[("team", "warm", CaptureState::Over)]);
        let refused = admit(&config, ask, Some(&over), &[]).expect_err("over");
        assert_eq!(refused.code(), Code::FailedPrecondition);
        assert!(refused.message().contains("team/warm"), "{refused:?}");
        // A tree granted already, or a Job's view, needs no pending capture.
        assert!(admit(&config, Asked::Existing, None, &[]).is_ok());
    }

    #[test]
    fn nothing_is_published_with_capture_volumes_disabled() {
        let config = CaptureConfig {
            enabled: false,
            ..CaptureConfig::default()
        };
        let open = index(&[("team", "warm", CaptureState::Open)]);
        let warm = name("team", "warm");
        for ask in [
            Asked::NewTree {
                capture: &warm,
                bytes: 1,
            },
            Asked::Existing,
        ] {
            let refused = admit(&config, ask, Some(&open), &[]).expect_err("disabled");
            assert_eq!(refused.code(), Code::FailedPrecondition);
            assert!(refused.message().contains("capture.enabled"), "{refused:?}");
        }
    }

    #[test]
    fn the_caps_count_every_granted_tree_and_are_named_when_hit() {
        let config = CaptureConfig {
            namespace_max_bytes: 10,
            node_max_bytes: 15,
            ..CaptureConfig::default()
        };
        let open = index(&[
            ("team", "c", CaptureState::Open),
            ("other", "c", CaptureState::Open),
        ]);
        let (team, other) = (name("team", "c"), name("other", "c"));
        let ask = |capture, bytes| Asked::NewTree { capture, bytes };
        let granted = [tree("team", 6)];
        assert!(admit(&config, ask(&team, 4), Some(&open), &granted).is_ok());
        let ns = admit(&config, ask(&team, 5), Some(&open), &granted).expect_err("ns cap");
        assert_eq!(ns.code(), Code::ResourceExhausted);
        assert!(ns.message().contains(NAMESPACE_CAP_FLAG), "{ns:?}");
        assert!(ns.message().contains("namespace team"), "{ns:?}");
        let granted = [tree("team", 6), tree("team", 4)];
        assert!(admit(&config, ask(&other, 5), Some(&open), &granted).is_ok());
        let node = admit(&config, ask(&other, 6), Some(&open), &granted).expect_err("node cap");
        assert_eq!(node.code(), Code::ResourceExhausted);
        assert!(node.message().contains(NODE_CAP_FLAG), "{node:?}");
    }
}
