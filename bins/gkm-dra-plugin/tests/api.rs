//! `gkm-dra-plugin` against the real apiserver, without a kubelet (one
//! control plane for both tests):
//!
//! - over the kubelet's protocols, as the kubelet calls it (the claims it
//!   prepares are real ResourceClaims, allocated here by writing their
//!   status as the scheduler would): registration, `v1.DRAPlugin` and
//!   `v1beta1.DRAPlugin`, preparing and unpreparing twice;
//! - the chart's RBAC and `gkm-dra-plugin-own-node` policy: the plugin
//!   writes the gpu.gkm.io ResourceSlices of its own node (named by its
//!   token's node-name claim) and reads ResourceClaims; nothing else.

mod support;

use std::cell::RefCell;
use std::time::Duration;

use gkm_k8s_devices::node_tree::{NodeTree, Pci};
use gkm_k8s_dra::proto::{v1, v1beta1};
use gkm_k8s_kubelet::proto::registration::InfoRequest;
use gkm_k8s_kubelet::proto::registration::registration_client::RegistrationClient;
use gkm_testenv::{ControlPlane, eventually, service_account_groups, service_account_user};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

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
            // The device, and its request's device metadata file.
            cdi_device_ids: vec![
                format!("gkm.io/gpu={uid}-{DEVICE}"),
                format!("gkm.io/gpu={uid}-metadata-gpu"),
            ],
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

const SYSTEM: &str = "gkm-system";

/// `request` made as the plugin's ServiceAccount on `node` (its token's
/// node-name claim, or none), through the admin's impersonation.
async fn as_plugin(
    admin: &kube::Client,
    node: Option<&str>,
    mut request: http::Request<Vec<u8>>,
) -> anyhow::Result<Result<Value, kube::core::Status>> {
    let headers = request.headers_mut();
    headers.insert(
        "Impersonate-User",
        service_account_user(SYSTEM, "gkm-dra-plugin").parse()?,
    );
    for group in service_account_groups(SYSTEM) {
        headers.append("Impersonate-Group", group.parse()?);
    }
    if let Some(node) = node {
        headers.insert(
            "Impersonate-Extra-authentication.kubernetes.io%2Fnode-name",
            node.parse()?,
        );
    }
    match admin.request::<Value>(request).await {
        Ok(value) => Ok(Ok(value)),
        Err(kube::Error::Api(status)) => Ok(Err(*status)),
        Err(e) => Err(e.into()),
    }
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

fn slice(name: &str, node: &str, driver: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": []},
    })
}

fn create(path: &str, body: &Value) -> anyhow::Result<http::Request<Vec<u8>>> {
    Ok(kube::core::Request::new(path).create(&PostParams::default(), serde_json::to_vec(body)?)?)
}

fn delete(path: &str, name: &str) -> anyhow::Result<http::Request<Vec<u8>>> {
    Ok(kube::core::Request::new(path).delete(name, &DeleteParams::default())?)
}

#[tokio::test]
async fn the_dra_plugin_may_write_only_its_own_nodes_slices_and_read_claims() -> anyhow::Result<()>
{
    let plane = ControlPlane::shared().await?;
    let work = gkm_testenv::temp_dir()?;
    support::install(
        plane,
        work.path(),
        &["rbac/dra-plugin.yaml", "policies/dra-plugin-own-node.yaml"],
    )
    .await?;
    let admin = plane.client().await?;
    let (own, other) = ("dra-own-node", "dra-other-node");
    for name in [own, other] {
        plane.ensure_node(name).await?;
    }
    let slices: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(admin.clone());

    // The policy takes effect once the apiserver has loaded it: wait until
    // another node's slice is refused, removing ones that got through.
    let wrote = RefCell::new(String::new());
    eventually(
        &format!("the plugin of {own} refused a slice of {other}"),
        Duration::from_secs(20),
        || async {
            let attempt = as_plugin(
                &admin,
                Some(own),
                create(SLICES, &slice("dra-other-0", other, "gpu.gkm.io"))?,
            )
            .await?;
            match attempt {
                Err(status) if status.code == 403 && status.message.contains("its own node") => {
                    Ok(Some(()))
                }
                result => {
                    let _ = slices.delete("dra-other-0", &DeleteParams::default()).await;
                    *wrote.borrow_mut() = format!("{result:?}");
                    Ok(None)
                }
            }
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: it wrote one: {}", wrote.borrow()))?;

    // Its own node's slice of its own driver: written and deleted.
    as_plugin(
        &admin,
        Some(own),
        create(SLICES, &slice("dra-own-0", own, "gpu.gkm.io"))?,
    )
    .await?
    .map_err(|s| anyhow::anyhow!("writing its own node's slice was refused: {}", s.message))?;
    as_plugin(&admin, Some(own), delete(SLICES, "dra-own-0")?)
        .await?
        .map_err(|s| anyhow::anyhow!("deleting its own node's slice was refused: {}", s.message))?;

    // Anything else: refused.
    slices
        .create(
            &PostParams::default(),
            &serde_json::from_value(slice("dra-admin-other-0", other, "gpu.gkm.io"))?,
        )
        .await?;
    let refused = [
        (
            "another driver's slice on its node",
            Some(own),
            create(SLICES, &slice("dra-own-nic", own, "nic.example.com"))?,
        ),
        (
            "a slice with no node-name claim",
            None,
            create(SLICES, &slice("dra-own-1", own, "gpu.gkm.io"))?,
        ),
        (
            "deleting another node's slice",
            Some(own),
            delete(SLICES, "dra-admin-other-0")?,
        ),
        (
            "writing a ResourceClaim",
            Some(own),
            create(
                "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
                &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": "stolen"},
                        "spec": {"devices": {"requests": []}}}),
            )?,
        ),
    ];
    for (what, node, request) in refused {
        match as_plugin(&admin, node, request).await? {
            Err(status) if status.code == 403 => {}
            other => anyhow::bail!("{what}: not refused: {other:?}"),
        }
    }
    slices
        .delete("dra-admin-other-0", &DeleteParams::default())
        .await?;

    // Reading claims: allowed (a missing one is a 404, not a 403).
    let read = as_plugin(
        &admin,
        Some(own),
        kube::core::Request::new("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims")
            .get("absent", &Default::default())?,
    )
    .await?;
    match read {
        Err(status) if status.code == 404 => Ok(()),
        other => anyhow::bail!("reading a claim: {other:?}"),
    }
}
