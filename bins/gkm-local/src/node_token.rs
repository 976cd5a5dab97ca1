//! Kubeconfigs for a gkm process that acts for one node, authenticating
//! with a ServiceAccount token bound to that Node.
//!
//! The chart's `gkm-agent-own-node` admission policy lets an agent write
//! only its own node's objects, and reads "its own node" from the token's
//! node-name claim, which every token of a pod carries. A simulated (kwok)
//! node runs no pods, so its agent, a process, gets the same claim from a
//! token bound to the Node itself.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use gkm_testenv::ControlPlane;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, PostParams};

/// How long a token lasts: longer than anyone runs `gkm-local`.
const TOKEN_SECONDS: i64 = 7 * 24 * 3600;

/// Writes `dest`, a kubeconfig for `plane` authenticating as the
/// ServiceAccount `namespace/name` with a token bound to the Node `node`.
pub async fn node_bound_kubeconfig(
    plane: &ControlPlane,
    namespace: &str,
    name: &str,
    node: &str,
    dest: &Path,
) -> anyhow::Result<PathBuf> {
    let client = plane.client().await?;
    let uid = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .with_context(|| format!("reading Node {node}"))?
        .metadata
        .uid;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.into()),
                uid,
            }),
            expiration_seconds: Some(TOKEN_SECONDS),
        }),
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client, namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token of {namespace}/{name} bound to {node}"))?
        .status
        .map(|s| s.token)
        .ok_or_else(|| anyhow::anyhow!("the token request for {namespace}/{name} got no token"))?;
    let admin = std::fs::read_to_string(plane.kubeconfig())?;
    let mut config: serde_yaml::Value = serde_yaml::from_str(&admin)?;
    let user = format!("system:serviceaccount:{namespace}:{name}");
    config["users"] = serde_yaml::to_value([serde_json::json!({
        "name": user, "user": {"token": token}
    })])?;
    config["contexts"][0]["context"]["user"] = user.into();
    std::fs::write(dest, serde_yaml::to_string(&config)?)
        .with_context(|| format!("writing {}", dest.display()))?;
    Ok(dest.to_path_buf())
}
