//! Device metadata for workloads (the DRA device attributes downward API,
//! KEP-5304, as `k8s.io/dynamic-resource-allocation` 1.36 writes it): per
//! request of a prepared claim, a JSON file naming the devices allocated
//! to it with their attributes, bind-mounted read-only into the container
//! through CDI. KubeVirt's virt-launcher reads it to find a passthrough
//! GPU's `resource.kubernetes.io/pciBusID` or a vGPU's `mdevUUID`.
//!
//! - On the host: `<state dir>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json`.
//! - In the container: [`CONTAINER_DIR`]`/resourceclaims/<claim>/<request>/gpu.gkm.io-metadata.json`,
//!   or `…/resourceclaimtemplates/<pod claim name>/…` for a claim made from
//!   a template (the claim's [`POD_CLAIM_NAME_ANNOTATION`]), so a pod spec
//!   can name the file before the claim exists.
//! - The file is a JSON stream of the same object once per metadata API
//!   version, newest first; gkm writes [`API_VERSION`], the only one.
//!
//! No kubelet feature gate is involved: the kubelet only hands the CDI
//! device names the plugin returns to the runtime.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceClaim};
use serde::{Deserialize, Serialize};

use crate::devices::DraDevice;

/// The metadata object's `apiVersion`.
pub const API_VERSION: &str = "metadata.resource.k8s.io/v1alpha1";
/// The metadata object's `kind`.
pub const KIND: &str = "DeviceMetadata";
/// Where metadata files are in a container.
pub const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// The annotation a claim made from a template has: the pod's name for it.
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";
/// The directory under the state directory metadata files go in.
pub const HOST_SUBDIR: &str = "dra-device-metadata";

/// The metadata of one request of a claim (the file's object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceMetadata {
    /// [`API_VERSION`].
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    /// The claim: name, namespace, UID, generation (1).
    pub metadata: ClaimIdentity,
    /// The pod's name for the claim, for a claim made from a template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_name: Option<String>,
    /// The request (one per file) and its devices.
    pub requests: Vec<MetadataRequest>,
}

/// Which claim a metadata object is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimIdentity {
    /// The claim's name.
    pub name: String,
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's UID.
    pub uid: String,
    /// Incremented when a driver rewrites the file; gkm never does.
    pub generation: i64,
}

/// A request and the devices allocated for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetadataRequest {
    /// The request's name (`<request>/<subrequest>` for a subrequest).
    pub name: String,
    /// Its devices from this driver.
    pub devices: Vec<MetadataDevice>,
}

/// A device allocated for a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetadataDevice {
    /// The driver.
    pub driver: String,
    /// Its pool.
    pub pool: String,
    /// Its name in the pool.
    pub name: String,
    /// Its attributes, as the ResourceSlice has them.
    pub attributes: BTreeMap<String, DeviceAttribute>,
}

/// A metadata file of a prepared claim: where it is on the host and in the
/// container, and what it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetadataFile {
    /// The (base) request it is for.
    pub request: String,
    /// On the host.
    pub host_path: PathBuf,
    /// In the container.
    pub container_path: String,
    /// What it holds.
    pub document: DeviceMetadata,
}

impl MetadataFile {
    /// The file's bytes: the JSON stream (one object, one version).
    pub fn bytes(&self) -> serde_json::Result<Vec<u8>> {
        let mut bytes = serde_json::to_vec_pretty(&self.document)?;
        bytes.push(b'\n');
        Ok(bytes)
    }
}

/// The host directory of claim `namespace/name`'s metadata files under
/// `host_dir` (`<state dir>/dra-device-metadata`).
pub fn claim_dir(host_dir: &Path, namespace: &str, name: &str) -> PathBuf {
    host_dir.join(format!("{namespace}_{name}"))
}

/// The metadata files of claim `uid` (the apiserver's `claim`) holding
/// `devices` of `driver`'s pool `pool`, each with the requests it was
/// allocated for: one file per base request, listing its devices in order.
pub fn claim_metadata(
    uid: &str,
    claim: &ResourceClaim,
    driver: &str,
    pool: &str,
    devices: &[(&DraDevice, &[String])],
    host_dir: &Path,
) -> Vec<MetadataFile> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let pod_claim_name = pod_claim_name(claim).map(str::to_string);
    // Base request → (request as allocated, devices), in first-seen order.
    let mut requests: Vec<(String, String, Vec<MetadataDevice>)> = Vec::new();
    for (device, request_names) in devices {
        for request in *request_names {
            let base = base_request(request);
            let i = match requests.iter().position(|r| r.0 == base) {
                Some(i) => i,
                None => {
                    requests.push((base.to_string(), request.clone(), Vec::new()));
                    requests.len() - 1
                }
            };
            requests[i].2.push(MetadataDevice {
                driver: driver.to_string(),
                pool: pool.to_string(),
                name: device.name.clone(),
                attributes: device.attributes.clone(),
            });
        }
    }
    let dir = claim_dir(host_dir, &namespace, &name);
    requests
        .into_iter()
        .map(|(base, request, devices)| {
            let container_path = match &pod_claim_name {
                Some(pod_name) => format!(
                    "{CONTAINER_DIR}/resourceclaimtemplates/{pod_name}/{base}/{driver}-metadata.json"
                ),
                None => format!(
                    "{CONTAINER_DIR}/resourceclaims/{name}/{base}/{driver}-metadata.json"
                ),
            };
            MetadataFile {
                host_path: dir.join(&base).join("metadata.json"),
                container_path,
                request: base,
                document: DeviceMetadata {
                    api_version: API_VERSION.to_string(),
                    kind: KIND.to_string(),
                    metadata: ClaimIdentity {
                        name: name.clone(),
                        namespace: namespace.clone(),
                        uid: uid.to_string(),
                        generation: 1,
                    },
                    pod_claim_name: pod_claim_name.clone(),
                    requests: vec![MetadataRequest {
                        name: request,
                        devices,
                    }],
                },
            }
        })
        .collect()
}

/// The pod's name for `claim` (its [`POD_CLAIM_NAME_ANNOTATION`]), when it
/// is a DNS-1123 subdomain as the pod's claim names are. Anyone who may
/// write a claim may write the annotation, and it becomes a directory of a
/// path in the container: a value that is not a name (`../x`, `a/b`, empty)
/// is left out, and the file goes under the claim's own name instead.
pub fn pod_claim_name(claim: &ResourceClaim) -> Option<&str> {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
        .map(String::as_str)
        .filter(|n| gkm_k8s_node::names::is_dns1123_subdomain(n))
}

/// `gpu/h100` → `gpu`: a subrequest's request.
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_with_pod_claim_name(value: &str) -> ResourceClaim {
        let mut claim = ResourceClaim::default();
        claim.metadata.name = Some("pod-gpu-x7k2p".into());
        claim.metadata.namespace = Some("ml".into());
        claim.metadata.annotations = Some(BTreeMap::from([(
            POD_CLAIM_NAME_ANNOTATION.to_string(),
            value.to_string(),
        )]));
        claim
    }

    #[test]
    fn a_pod_claim_name_that_is_not_a_name_never_reaches_a_container_path() {
        let device = DraDevice {
            name: "gpu-0".into(),
            kind: crate::devices::DeviceType::Gpu,
            attributes: BTreeMap::new(),
            memory_bytes: None,
            access: gkm_k8s_devices::resources::Access::Amd { render_minor: None },
            id: "0000:6e:00.0".into(),
        };
        let requests = ["gpu".to_string()];
        for hostile in [
            "../../../etc",
            "..",
            "a/../../b",
            "a/b",
            "/abs",
            "",
            "UPPER",
            "a..b",
            "name\0",
        ] {
            let claim = claim_with_pod_claim_name(hostile);
            assert_eq!(pod_claim_name(&claim), None, "{hostile:?}");
            let files = claim_metadata(
                "uid-1",
                &claim,
                "gpu.gkm.io",
                "node-1",
                &[(&device, &requests[..])],
                Path::new("/state/meta"),
            );
            assert_eq!(files.len(), 1);
            assert_eq!(
                files[0].container_path,
                format!(
                    "{CONTAINER_DIR}/resourceclaims/pod-gpu-x7k2p/gpu/gpu.gkm.io-metadata.json"
                ),
                "{hostile:?}"
            );
            assert_eq!(files[0].document.pod_claim_name, None);
        }
        let claim = claim_with_pod_claim_name("gpu");
        let files = claim_metadata(
            "uid-1",
            &claim,
            "gpu.gkm.io",
            "node-1",
            &[(&device, &requests[..])],
            Path::new("/state/meta"),
        );
        assert_eq!(
            files[0].container_path,
            format!("{CONTAINER_DIR}/resourceclaimtemplates/gpu/gpu/gpu.gkm.io-metadata.json")
        );
    }

    #[test]
    fn subrequests_share_their_request_file() {
        assert_eq!(base_request("gpu/h100"), "gpu");
        assert_eq!(base_request("gpu"), "gpu");
    }
}
