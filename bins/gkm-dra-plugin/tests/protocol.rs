//! `gkm-dra-plugin` over the kubelet's protocols, as the kubelet calls it,
//! against the real apiserver (the claims it prepares are real
//! ResourceClaims, allocated here by writing their status as the scheduler
//! would): registration, `v1.DRAPlugin` and `v1beta1.DRAPlugin`, preparing
//! and unpreparing twice.

mod support;

use std::time::Duration;

use gkm_k8s_devices::node_tree::{NodeTree, Pci};
use gkm_k8s_dra::proto::{v1, v1beta1};
use gkm_k8s_kubelet::proto::registration::InfoRequest;
use gkm_k8s_kubelet::proto::registration::registration_client::RegistrationClient;
use gkm_testenv::ControlPlane;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const NODE: &str = "dra-protocol-node";
const NS: &str = "dra-protocol";
const DRIVER: &str = "gpu.gkm.io";
const DEVICE: &str = "gpu-0000-6e-00-0";

/// A claim in `NS`, allocated `DEVICE` of this node's pool as the scheduler
/// would allocate it; its UID.
async fn allocated_claim(client: &kube::Client, name: &str) -> anyhow::Result<String> {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gkm-gpu"}},
        ]}},
    }))?;
    let created = claims.create(&PostParams::default(), &claim).await?;
    let status = json!({"status": {"allocation": {
        "devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": DEVICE},
        ]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE]},
        ]}]},
    }}});
    claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(created.metadata.uid.unwrap_or_default())
}

/// The same claim, as v1beta1 names it.
fn beta_claim(claim: &v1::Claim) -> v1beta1::Claim {
    v1beta1::Claim {
        namespace: claim.namespace.clone(),
        uid: claim.uid.clone(),
        name: claim.name.clone(),
    }
}

#[tokio::test]
async fn the_plugin_registers_and_prepares_idempotently_over_v1_and_v1beta1() -> anyhow::Result<()>
{
    let plane = ControlPlane::shared().await?;
    let client = plane.client().await?;
    plane.ensure_namespace(NS).await?;
    let work = gkm_testenv::temp_dir()?;
    let kubeconfig = support::install(plane, work.path(), &["rbac/dra-plugin.yaml"]).await?;
    plane.ensure_node(NODE).await?;

    let tree = NodeTree::new(&work.path().join("node"))?;
    tree.pci(&Pci::gpu("0000:6e:00.0", 0x10de, 0x2330).driver("nvidia"))?;
    tree.nvidia_gpu(
        "0000:6e:00.0",
        "GPU-6e000000-1111-2222-3333-444444444444",
        0,
    )?;
    let kubelet = work.path().join("kubelet");
    let site = support::Site {
        node: NODE,
        kubelet_dir: kubelet.clone(),
        cdi_dir: work.path().join("cdi"),
        state_dir: work.path().join("state"),
    };
    let cdi = site.cdi_dir.clone();
    let mut plugin = support::start_plugin(
        &site,
        &tree,
        &kubeconfig,
        &[],
        &work.path().join("plugin.log"),
    )?;

    // Registration, as the kubelet's plugin watcher asks.
    let registration = gkm_k8s_kubelet::socket::connect(
        &kubelet.join("plugins_registry/gpu.gkm.io-reg.sock"),
        Duration::from_secs(30),
    )
    .await?;
    let info = RegistrationClient::new(registration)
        .get_info(InfoRequest {})
        .await?
        .into_inner();
    let dra_socket = kubelet.join("plugins/gpu.gkm.io/dra.sock");
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, dra_socket.display().to_string());
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );

    let channel = gkm_k8s_kubelet::socket::connect(&dra_socket, Duration::from_secs(10)).await?;
    let mut v1 = v1::dra_plugin_client::DraPluginClient::new(channel.clone());
    let mut v1beta1 = v1beta1::dra_plugin_client::DraPluginClient::new(channel);

    let uid = allocated_claim(&client, "gpu").await?;
    let claim = v1::Claim {
        namespace: NS.to_string(),
        uid: uid.clone(),
        name: "gpu".to_string(),
    };
    let prepare = v1::NodePrepareResourcesRequest {
        claims: vec![claim.clone()],
    };
    let first = v1
        .node_prepare_resources(prepare.clone())
        .await?
        .into_inner();
    let answer = &first.claims[&uid];
    assert_eq!(answer.error, "", "{answer:?}");
    assert_eq!(
        answer.devices,
        [v1::Device {
            request_names: vec!["gpu".to_string()],
            pool_name: NODE.to_string(),
            device_name: DEVICE.to_string(),
            cdi_device_ids: vec![format!("gkm.io/gpu={uid}-{DEVICE}")],
            share_id: None,
        }]
    );
    let spec = cdi.join(format!("gkm.io-gpu_{uid}.json"));
    assert!(spec.exists(), "{}", spec.display());

    // Asked again, over either version: the same devices.
    let again = v1.node_prepare_resources(prepare).await?.into_inner();
    assert_eq!(again.claims[&uid], *answer);
    let beta = v1beta1
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![beta_claim(&claim)],
        })
        .await?
        .into_inner();
    let beta = &beta.claims[&uid];
    assert_eq!(beta.error, "");
    assert_eq!(beta.devices.len(), 1);
    assert_eq!(beta.devices[0].device_name, DEVICE);
    assert_eq!(
        beta.devices[0].cdi_device_ids,
        answer.devices[0].cdi_device_ids
    );

    // A claim the apiserver has under another UID (deleted and made
    // again): refused for that claim only, naming why.
    let stale = v1
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![v1::Claim {
                uid: "00000000-0000-4000-8000-000000000000".to_string(),
                ..claim.clone()
            }],
        })
        .await?
        .into_inner();
    let error = &stale.claims["00000000-0000-4000-8000-000000000000"].error;
    assert!(error.contains(&format!("has UID {uid}")), "{error}");

    // Unprepared over v1beta1, twice: the spec goes, the second is fine.
    for _ in 0..2 {
        let done = v1beta1
            .node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest {
                claims: vec![beta_claim(&claim)],
            })
            .await?
            .into_inner();
        assert_eq!(done.claims[&uid].error, "");
        assert!(!spec.exists());
    }
    plugin.check_running()?;
    Ok(())
}
