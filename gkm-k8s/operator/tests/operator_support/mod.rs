//! What the operator's tests share: a signed fixture image in the test
//! registry, key Secrets, caches, and waiting for the operator.

#![allow(dead_code)]

use std::time::Duration;

use gkm_core::policy::PublicKey;
use gkm_k8s_api::crd::GKMCache;
use gkm_oci::{BuildOptions, ImageRef, RegistryOptions, build};
use gkm_testenv::Registry;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// The namespace the operator runs in (where cluster caches' references are read).
pub const OPERATOR_NAMESPACE: &str = "gkm-system";

pub fn registry_options() -> RegistryOptions {
    RegistryOptions {
        insecure: true,
        ..RegistryOptions::default()
    }
}

/// Builds a fixture into the registry as `repo:v1`; its reference and digest.
pub async fn push(registry: &Registry, repo: &str) -> anyhow::Result<(String, String)> {
    let image = format!("{}/{repo}:v1", registry.addr());
    let reference: ImageRef = image.parse()?;
    let built = build(
        &gkm_testenv::fixture_cache("triton-vector-add-cuda-sm75"),
        &reference,
        &BuildOptions::default(),
        &registry_options(),
    )
    .await?;
    Ok((image, built.digest.to_string()))
}

pub fn pem(key: &PublicKey) -> String {
    key.to_pem()
}

pub async fn put_secret(
    client: &kube::Client,
    ns: &str,
    name: &str,
    pem: &str,
) -> anyhow::Result<()> {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "stringData": {"cosign.pub": pem},
    }))?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("gkm-test").force(),
            &Patch::Apply(&secret),
        )
        .await?;
    Ok(())
}

/// How long the operator's tests wait for the operator to act.
pub const WAIT: Duration = Duration::from_secs(60);

pub fn cache(ns: &str, name: &str, spec: serde_json::Value) -> anyhow::Result<GKMCache> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))?)
}

/// Runs the operator in-process with `config`, verifying through the
/// registry as `client`; abort the handle to stop it.
pub fn spawn_operator(
    client: &kube::Client,
    config: gkm_k8s_operator::OperatorConfig,
) -> tokio::task::JoinHandle<Result<(), gkm_k8s_operator::InvalidConfig>> {
    let verifier: std::sync::Arc<dyn gkm_k8s_operator::ImageVerifier> =
        std::sync::Arc::new(gkm_k8s_operator::RegistryVerifier::new(
            client.clone(),
            registry_options(),
            OPERATOR_NAMESPACE,
        ));
    tokio::spawn(gkm_k8s_operator::run(
        client.clone(),
        config,
        verifier,
        std::sync::Arc::new(gkm_k8s_operator::Metrics::default()),
    ))
}
