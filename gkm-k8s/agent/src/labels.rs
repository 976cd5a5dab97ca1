//! The Node's GPU labels, written by server-side apply.
//!
//! The agent applies the labels it wants as field manager
//! [`FIELD_MANAGER`]; the apiserver then removes the labels that manager
//! applied before and no longer applies, and never touches labels other
//! managers own (a hand-set label, the kubelet's). `gkm.io/` labels an older
//! agent wrote with a merge patch are owned by no applier, so those that no
//! longer apply are removed explicitly.

use std::collections::BTreeMap;

use gkm_gpu::labels::KEYS;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::info;

use crate::error::Result;

/// The field manager of the agent's Node labels.
pub const FIELD_MANAGER: &str = "gkm-agent-labels";

/// Makes `wanted` the GPU labels of Node `node` and returns all the Node's
/// labels afterwards. A Node that does not exist yet is left alone (and an
/// empty map returned).
pub async fn apply_node_labels(
    client: &Client,
    node: &str,
    wanted: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    if nodes.get_metadata_opt(node).await?.is_none() {
        return Ok(BTreeMap::new());
    }
    let patch = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": node, "labels": wanted },
    });
    let applied = nodes
        .patch(
            node,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    let stale: Vec<&String> = applied
        .labels()
        .keys()
        .filter(|k| k.starts_with("gkm.io/") && KEYS.contains(&k.as_str()))
        .filter(|k| !wanted.contains_key(*k))
        .collect();
    if stale.is_empty() {
        return Ok(applied.labels().clone());
    }
    info!(node, labels = ?stale, "removing GPU labels that no longer apply");
    let removal: serde_json::Map<String, serde_json::Value> = stale
        .into_iter()
        .map(|k| (k.clone(), serde_json::Value::Null))
        .collect();
    let patched = nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": removal } })),
        )
        .await?;
    Ok(patched.labels().clone())
}
