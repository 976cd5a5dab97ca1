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
//!   not their pods still run (`RESOURCE_EXHAUSTED`, naming the cap);
//! - while the trees already on the node, plus the new one, stay within
//!   the per-namespace and per-node counts of trees
//!   ([`CaptureConfig::namespace_max_trees`], [`CaptureConfig::node_max_trees`]):
//!   each tree is a mount in the host's mount namespace that every publish
//!   reads back, so small trees must not be made by the million within the
//!   byte caps (`RESOURCE_EXHAUSTED`, naming the cap). A tree is never
//!   smaller than [`CAPTURE_MIN_BYTES`](super::tree::CAPTURE_MIN_BYTES).
//!
//! Every refusal names the `gkm-csi` flag and the chart's value to raise.
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

/// The capture trees a namespace may hold on a node by default.
pub const DEFAULT_NAMESPACE_MAX_TREES: u64 = 32;
/// The capture trees a node may hold by default.
pub const DEFAULT_NODE_MAX_TREES: u64 = 128;

/// A cap on a node's capture trees: what it bounds, and how an
/// administrator sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// The bytes of one namespace's trees.
    NamespaceBytes,
    /// The bytes of all trees.
    NodeBytes,
    /// How many trees one namespace holds.
    NamespaceTrees,
    /// How many trees the node holds.
    NodeTrees,
}

impl Cap {
    /// The `gkm-csi` flag that sets it.
    pub fn flag(self) -> &'static str {
        match self {
            Cap::NamespaceBytes => "--capture-namespace-max-bytes",
            Cap::NodeBytes => "--capture-node-max-bytes",
            Cap::NamespaceTrees => "--capture-namespace-max-trees",
            Cap::NodeTrees => "--capture-node-max-trees",
        }
    }

    /// The chart's value that sets the flag.
    pub fn chart_value(self) -> &'static str {
        match self {
            Cap::NamespaceBytes => "capture.namespaceMaxBytes",
            Cap::NodeBytes => "capture.nodeMaxBytes",
            Cap::NamespaceTrees => "capture.namespaceMaxTrees",
            Cap::NodeTrees => "capture.nodeMaxTrees",
        }
    }
}

/// What the driver allows of capture volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureConfig {
    /// Whether capture volumes are published at all.
    pub enabled: bool,
    /// The most bytes a namespace's capture trees may be granted on the node.
    pub namespace_max_bytes: u64,
    /// The most bytes all capture trees may be granted on the node.
    pub node_max_bytes: u64,
    /// The most capture trees a namespace may hold on the node.
    pub namespace_max_trees: u64,
    /// The most capture trees the node may hold.
    pub node_max_trees: u64,
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
            namespace_max_trees: DEFAULT_NAMESPACE_MAX_TREES,
            node_max_trees: DEFAULT_NODE_MAX_TREES,
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
    let ours = |t: &&GrantedTree| t.capture.namespace == capture.namespace;
    let in_namespace = granted.iter().filter(ours);
    let whose_ns = format!("namespace {}'s", capture.namespace);
    let asked_for = format!("a capture tree of {bytes} bytes for GKMCacheCapture {capture}");
    let checks = [
        (
            Cap::NamespaceBytes,
            in_namespace.clone().map(|t| t.bytes).sum::<u64>(),
            bytes,
            config.namespace_max_bytes,
            whose_ns.as_str(),
        ),
        (
            Cap::NodeBytes,
            granted.iter().map(|t| t.bytes).sum(),
            bytes,
            config.node_max_bytes,
            "the node's",
        ),
        (
            Cap::NamespaceTrees,
            in_namespace.count() as u64,
            1,
            config.namespace_max_trees,
            whose_ns.as_str(),
        ),
        (
            Cap::NodeTrees,
            granted.len() as u64,
            1,
            config.node_max_trees,
            "the node's",
        ),
    ];
    for (cap, held, adds, max, whose) in checks {
        if held.saturating_add(adds) > max {
            let unit = match cap {
                Cap::NamespaceBytes | Cap::NodeBytes => "bytes",
                Cap::NamespaceTrees | Cap::NodeTrees => "trees",
            };
            return Err(Status::resource_exhausted(format!(
                "{asked_for} would take {whose} capture trees to {} {unit}, over the cap {}={max} \
                 ({held} {unit} granted already): end or release capture trees, or raise the \
                 chart's {} (gkm-csi {})",
                held.saturating_add(adds),
                cap.flag(),
                cap.chart_value(),
                cap.flag(),
            )));
        }
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
        assert!(ns.message().contains(Cap::NamespaceBytes.flag()), "{ns:?}");
        assert!(ns.message().contains("namespace team"), "{ns:?}");
        let granted = [tree("team", 6), tree("team", 4)];
        assert!(admit(&config, ask(&other, 5), Some(&open), &granted).is_ok());
        let node = admit(&config, ask(&other, 6), Some(&open), &granted).expect_err("node cap");
        assert_eq!(node.code(), Code::ResourceExhausted);
        assert!(node.message().contains(Cap::NodeBytes.flag()), "{node:?}");
    }

    #[test]
    fn the_count_caps_count_every_tree_and_name_the_chart_value() {
        let config = CaptureConfig {
            namespace_max_trees: 2,
            node_max_trees: 3,
            ..CaptureConfig::default()
        };
        let open = index(&[
            ("team", "c", CaptureState::Open),
            ("other", "c", CaptureState::Open),
        ]);
        let (team, other) = (name("team", "c"), name("other", "c"));
        let ask = |capture, bytes| Asked::NewTree { capture, bytes };
        let granted = [tree("team", 1)];
        assert!(admit(&config, ask(&team, 1), Some(&open), &granted).is_ok());
        let granted = [tree("team", 1), tree("team", 1)];
        let ns = admit(&config, ask(&team, 1), Some(&open), &granted).expect_err("ns count");
        assert_eq!(ns.code(), Code::ResourceExhausted);
        for named in [
            "--capture-namespace-max-trees=2",
            "capture.namespaceMaxTrees",
        ] {
            assert!(ns.message().contains(named), "{ns:?}");
        }
        assert!(admit(&config, ask(&other, 1), Some(&open), &granted).is_ok());
        let granted = [tree("team", 1), tree("team", 1), tree("other", 1)];
        let node = admit(&config, ask(&other, 1), Some(&open), &granted).expect_err("node count");
        for named in ["--capture-node-max-trees=3", "capture.nodeMaxTrees"] {
            assert!(node.message().contains(named), "{node:?}");
        }
    }
}
