//! The kube-scheduler extender protocol's messages
//! (`k8s.io/kube-scheduler/extender/v1`). Their Go types carry no JSON tags,
//! so the field names on the wire are the Go field names.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::{Deserialize, Serialize};

/// The highest score prioritize may give a node.
pub const MAX_PRIORITY: i64 = 10;

/// A filter or prioritize call: the pod and the candidate nodes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    #[serde(rename = "Pod", default)]
    pub pod: Option<Pod>,
    /// Candidate nodes, when the extender is not `nodeCacheCapable`.
    #[serde(rename = "Nodes", default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    /// Candidate node names, when the extender is `nodeCacheCapable`.
    #[serde(rename = "NodeNames", default, skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
}

/// A list of nodes (only the items matter here).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NodeList {
    /// The nodes.
    #[serde(default)]
    pub items: Vec<Node>,
}

impl ExtenderArgs {
    /// The candidate node names, from whichever form the call carries.
    pub fn candidates(&self) -> Vec<String> {
        match (&self.node_names, &self.nodes) {
            (Some(names), _) => names.clone(),
            (None, Some(list)) => list
                .items
                .iter()
                .filter_map(|n| n.metadata.name.clone())
                .collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// The answer to filter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    /// The nodes that fit (`nodeCacheCapable` form).
    #[serde(rename = "NodeNames", default, skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
    /// Nodes that do not fit, with why; preemption might help.
    #[serde(rename = "FailedNodes", default)]
    pub failed_nodes: BTreeMap<String, String>,
    /// Nodes that do not fit, with why; preemption would not help.
    #[serde(rename = "FailedAndUnresolvableNodes", default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// Set when the call failed as a whole.
    #[serde(rename = "Error", default)]
    pub error: String,
}

/// One node's score.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    /// The node.
    #[serde(rename = "Host")]
    pub host: String,
    /// Its score, 0 to [`MAX_PRIORITY`].
    #[serde(rename = "Score")]
    pub score: i64,
}

/// The answer to prioritize.
pub type HostPriorityList = Vec<HostPriority>;

/// A bind call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingArgs {
    /// The pod's name.
    #[serde(rename = "PodName", default)]
    pub pod_name: String,
    /// The pod's namespace.
    #[serde(rename = "PodNamespace", default)]
    pub pod_namespace: String,
    /// The pod's UID.
    #[serde(rename = "PodUID", default)]
    pub pod_uid: String,
    /// The node chosen.
    #[serde(rename = "Node", default)]
    pub node: String,
}

/// The answer to bind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    /// Empty on success.
    #[serde(rename = "Error", default)]
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_go_field_names() {
        let args: ExtenderArgs = serde_json::from_str(
            r#"{"Pod":{"metadata":{"name":"p","namespace":"ml","uid":"u1"}},"Nodes":null,"NodeNames":["a","b"]}"#,
        )
        .unwrap_or_default();
        assert_eq!(args.candidates(), ["a", "b"]);
        let bind: ExtenderBindingArgs =
            serde_json::from_str(r#"{"PodName":"p","PodNamespace":"ml","PodUID":"u1","Node":"a"}"#)
                .unwrap_or_default();
        assert_eq!(bind.node, "a");
        let result = ExtenderFilterResult {
            node_names: Some(vec!["a".into()]),
            failed_nodes: BTreeMap::from([("b".into(), "full".into())]),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&result).unwrap_or_default(),
            r#"{"NodeNames":["a"],"FailedNodes":{"b":"full"},"FailedAndUnresolvableNodes":{},"Error":""}"#
        );
        let scores = vec![HostPriority {
            host: "a".into(),
            score: 3,
        }];
        assert_eq!(
            serde_json::to_string(&scores).unwrap_or_default(),
            r#"[{"Host":"a","Score":3}]"#
        );
    }
}
