//! What a ResourceClaim was allocated, as its status says.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;

/// A device a claim was allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedDevice {
    /// The DRA driver.
    pub driver: String,
    /// The pool (a node's pool is named after the node).
    pub pool: String,
    /// The device, in its pool.
    pub device: String,
}

impl std::fmt::Display for AllocatedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// The ResourceClaim made for `pod`'s claim `pod_claim` from its template,
/// once the resource claim controller has named it.
pub async fn pod_claim_name(
    pods: &Api<Pod>,
    pod: &str,
    pod_claim: &str,
) -> anyhow::Result<Option<String>> {
    let pod = pods.get(pod).await?;
    Ok(pod
        .status
        .and_then(|s| s.resource_claim_statuses)
        .unwrap_or_default()
        .into_iter()
        .find(|s| s.name == pod_claim)
        .and_then(|s| s.resource_claim_name))
}

/// The devices the claim `claim` was allocated (its
/// `status.allocation.devices.results`); empty while it is not allocated.
pub async fn allocated_devices(
    claims: &Api<ResourceClaim>,
    claim: &str,
) -> anyhow::Result<Vec<AllocatedDevice>> {
    let claim = claims.get(claim).await?;
    Ok(claim
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .unwrap_or_default()
        .into_iter()
        .map(|r| AllocatedDevice {
            driver: r.driver,
            pool: r.pool,
            device: r.device,
        })
        .collect())
}
