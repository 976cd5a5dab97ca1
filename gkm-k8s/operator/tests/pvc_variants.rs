//! PVC delivery of a multi-target image, against a real kube-apiserver and
//! a real registry: with ReadWriteOnce claims, each node's fill Job is
//! pinned to the variant its agent reports (`REPO@sha256:variant`); a
//! ReadOnlyMany claim, one tree for nodes needing different variants, is
//! not filled, and its status says why. A fill pinned to the index itself
//! is refused, naming the variants; one pinned to a variant fills.

mod operator_support;

use std::time::Duration;

use gkm_k8s_api::crd::{GKMCache, GKMCacheNode};
use gkm_k8s_operator::names;
use gkm_k8s_operator::{OperatorConfig, TenantSigners};
use gkm_oci::BuildOptions;
use gkm_oci::sign::{SignFormat, SigningKey, sign};
use gkm_testenv::{ControlPlane, Registry, eventually, fixture_cache};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams};
use operator_support::{
    OPERATOR_NAMESPACE, WAIT, cache, pem, put_secret, registry_options, spawn_operator,
};
use serde_json::json;

const NS: &str = "pvc-variants";

#[tokio::test(flavor = "multi_thread")]
async fn each_rwo_fill_is_pinned_to_its_nodes_variant_and_a_mixed_rox_claim_is_withheld()
-> anyhow::Result<()> {
    let plane = ControlPlane::shared().await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    let client = plane.client().await?;
    plane.ensure_namespace(NS).await?;
    plane.ensure_namespace(OPERATOR_NAMESPACE).await?;

    // One signed index of two variants (CUDA sm75, ROCm gfx90a).
    let repository = format!("{}/{NS}/fleet", Registry::shared()?.addr());
    let image = format!("{repository}:v1");
    let multi = gkm_oci::build::build_multi(
        &[
            fixture_cache("triton-vector-add-cuda-sm75"),
            fixture_cache("triton-vector-add-rocm-gfx90a"),
        ],
        &image.parse()?,
        &BuildOptions::default(),
        &registry_options(),
        None,
    )
    .await?;
    let index = multi.digest().to_string();
    let variants: Vec<String> = multi
        .variants
        .iter()
        .map(|v| v.digest.to_string())
        .collect();
    let (key, _) = SigningKey::generate_p256()?;
    sign(
        &image.parse()?,
        &registry_options(),
        multi.digest(),
        &key,
        SignFormat::Bundle,
    )
    .await?;
    put_secret(&client, NS, "signer", &pem(key.public_key())).await?;

    let config = OperatorConfig {
        registry: registry_options(),
        resolve_interval: Duration::from_secs(300),
        tenant_signers: TenantSigners::in_namespaces([NS]),
        ..OperatorConfig::default()
    };
    let operator = spawn_operator(&client, config);

    let apply = PatchParams::apply("gkm-test").force();
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), NS);
    let signature =
        json!({"signers": [{"key": {"secretRef": {"name": "signer", "key": "cosign.pub"}}}]});
    for (name, modes) in [
        ("per-node", json!(["ReadWriteOnce"])),
        ("shared", json!(["ReadOnlyMany"])),
    ] {
        let spec = json!({"image": image, "signature": signature,
                          "storageClassName": "standard", "accessModes": modes});
        let object = cache(NS, name, spec)?;
        caches.patch(name, &apply, &Patch::Apply(&object)).await?;
    }

    // Two nodes, each holding its own variant, as their agents report.
    let reports: Api<GKMCacheNode> = Api::namespaced(client.clone(), NS);
    let agent = PatchParams::apply("gkm-test-agent").force();
    let nodes = ["pvc-variants-cuda", "pvc-variants-rocm"];
    for (node, variant) in nodes.iter().zip(&variants) {
        plane.ensure_node(node).await?;
        let report = json!({"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
                            "metadata": {"name": node, "namespace": NS}});
        reports.patch(node, &agent, &Patch::Apply(&report)).await?;
        let entry = json!({index.as_str(): {"state": "Extracted", "variant": variant}});
        let status = json!({"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
                            "status": {"nodeName": node,
                                       "caches": {"per-node": entry, "shared": entry}}});
        reports
            .patch_status(node, &agent, &Patch::Apply(&status))
            .await?;
    }

    // ReadWriteOnce: each node's Job extracts that node's variant.
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    for (node, variant) in nodes.iter().zip(&variants) {
        let claim = names::node_claim("per-node", node);
        let name = names::job(&claim, variant, None);
        let job = eventually(&format!("{node}'s fill Job"), WAIT, || async {
            Ok(jobs.get_opt(&name).await?)
        })
        .await?;
        let pod = job.spec.and_then(|s| s.template.spec).expect("a pod spec");
        let args = pod.containers[0].args.clone().unwrap_or_default();
        assert!(
            args.contains(&format!("--image={repository}@{variant}")),
            "{node}: {args:?}"
        );
        let claims: Vec<_> = pod
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
            .collect();
        assert_eq!(claims, [claim], "{node}");
    }

    // ReadOnlyMany: no Job, and the claim's status names the variants.
    let message = eventually("the shared claim withheld", WAIT, || async {
        let status = caches.get("shared").await?.status.unwrap_or_default();
        let message = status
            .pvc_status
            .and_then(|p| p.get(NS).cloned())
            .and_then(|p| p.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.message);
        Ok(message.filter(|m| m.contains("different variants")))
    })
    .await?;
    for variant in &variants {
        assert!(message.contains(variant.as_str()), "{message}");
    }
    let shared_jobs: Vec<String> = jobs
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|j| j.metadata.name)
        .filter(|n| n.starts_with("shared"))
        .collect();
    assert!(shared_jobs.is_empty(), "{shared_jobs:?}");

    operator.abort();

    // The fill itself: the index is refused, naming its variants, with
    // nothing served; a variant is extracted and served.
    let dir = gkm_testenv::temp_dir()?;
    let claim = dir.path().join("claim");
    let pinned = |digest: &str| format!("{repository}@{digest}").parse::<gkm_oci::ImageRef>();
    let refused = gkm_k8s_operator::cache::pvc::fill(&pinned(&index)?, &claim, &registry_options())
        .await
        .expect_err("an index is no tree");
    let said = refused.to_string();
    assert!(said.contains("multi-target"), "{said}");
    for variant in &variants {
        assert!(said.contains(variant.as_str()), "{said}");
    }
    assert!(!claim.join(".gkm/current").exists(), "nothing served");
    let stats =
        gkm_k8s_operator::cache::pvc::fill(&pinned(&variants[0])?, &claim, &registry_options())
            .await?;
    assert!(stats.files > 0, "{stats:?}");
    Ok(())
}
