//! The chart's RBAC and `gkm-dra-plugin-own-node` policy on the real
//! apiserver: the plugin writes the gpu.gkm.io ResourceSlices of its own
//! node (named by its token's node-name claim) and reads ResourceClaims;
//! nothing else.

// The plugin itself is not started here.
#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use gkm_testenv::{ControlPlane, service_account_groups, service_account_user};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

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
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let attempt = as_plugin(
            &admin,
            Some(own),
            create(SLICES, &slice("dra-other-0", other, "gpu.gkm.io"))?,
        )
        .await?;
        match attempt {
            Err(status) if status.code == 403 && status.message.contains("its own node") => break,
            result => {
                let _ = slices.delete("dra-other-0", &DeleteParams::default()).await;
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "the plugin of {own} wrote a slice of {other}: {result:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

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
