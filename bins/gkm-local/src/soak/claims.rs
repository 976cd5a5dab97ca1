//! A claim in the workload: the cache [`CLAIMED`] is delivered through GKM's
//! PVC mode (`ReadOnlyMany`, a claim filled by a Job on the real node), on
//! volumes the operator makes under a directory of its own
//! (`pvc.volumeDir`), as on a cluster without a provisioner. Its tag moves
//! like the others, and each move is a refill under the faults.
//!
//! Checked: the claim is filled with the digest its tag points at within
//! the convergence bound ([`unfilled`], part of the health the soak waits
//! for), and once the cache is deleted its claim, volume, Jobs and volume
//! directory are gone ([`super::leaks`]).

use std::path::{Path, PathBuf};

use gkm_k8s_api::crd::GKMCache;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};

use super::workload::NAMESPACE;
use crate::{REAL_NODE_LABEL, Stack};

/// The cache delivered through a claim (and the claim's name).
pub const CLAIMED: &str = "claimed";
/// The StorageClass of the claim, with no provisioner.
const STORAGE_CLASS: &str = "soak-claims";
/// The annotation on a claim naming the digest it was filled with.
const FILLED: &str = gkm_k8s_operator::cache::pvc::FILLED_ANNOTATION;

/// Makes the directory the operator makes volumes in (owned by the fill
/// user, as an administrator makes it) under `dir`, and points the chart at
/// it; returns it. Call before [`Stack::install_chart`].
pub fn prepare(stack: &mut Stack, dir: &Path) -> anyhow::Result<PathBuf> {
    let volumes = dir.join("pvc-volumes");
    std::fs::create_dir_all(&volumes)?;
    let uid = gkm_k8s_operator::names::FILL_UID as u32;
    std::os::unix::fs::chown(&volumes, Some(uid), Some(uid))?;
    stack.set_chart_value("pvc.volumeDir", &json!(volumes));
    Ok(volumes)
}

/// Applies the claim's StorageClass: no provisioner, the operator makes
/// the volumes.
pub async fn apply_storage_class(stack: &Stack) -> anyhow::Result<()> {
    stack
        .plane
        .apply_object(
            &json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                    "metadata": {"name": STORAGE_CLASS},
                    "provisioner": "kubernetes.io/no-provisioner",
                    "volumeBindingMode": "Immediate"}),
            false,
        )
        .await
}

/// Makes the GKMCache `spec` one delivered through a `ReadOnlyMany` claim,
/// its fill Jobs on the real node (simulated nodes run no containers).
pub fn deliver_through_a_claim(spec: &mut Value) {
    spec["storageClassName"] = json!(STORAGE_CLASS);
    spec["accessModes"] = json!(["ReadOnlyMany"]);
    spec["podTemplate"] = json!({"spec": {"nodeSelector": {REAL_NODE_LABEL: "true"}}});
}

/// Why the claim of cache `name` is not filled with `latest` yet, or
/// `None` once it is.
pub async fn unfilled(
    client: &kube::Client,
    name: &str,
    latest: &str,
) -> anyhow::Result<Option<String>> {
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE)
        .get_opt(name)
        .await?;
    let filled = claim
        .as_ref()
        .and_then(|c| c.metadata.annotations.as_ref())
        .and_then(|a| a.get(FILLED));
    Ok((filled.map(String::as_str) != Some(latest)).then(|| {
        format!(
            "claim {name} filled with {filled:?}, its tag is at {latest}{}",
            if claim.is_none() { " (no claim)" } else { "" }
        )
    }))
}

/// Deletes the cache delivered through a claim (its claim, volume and
/// Jobs go with it).
pub async fn remove(client: &kube::Client) -> anyhow::Result<()> {
    match Api::<GKMCache>::namespaced(client.clone(), NAMESPACE)
        .delete(CLAIMED, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
