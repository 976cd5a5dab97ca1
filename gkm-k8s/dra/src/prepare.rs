//! The prepare decision: a ResourceClaim's allocation → the node's devices
//! it names → what the kubelet is told ([`PreparedClaim`]) and what the
//! runtime is given ([`CdiSpec`]). Pure; the service reads the claim and
//! writes the results.

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};

use crate::cdi::{self, CdiSpec};
use crate::devices::{DeviceType, DraDevice, NodeDevices};
use crate::metadata::{self, MetadataFile};

/// One device of a prepared claim, as the kubelet is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    /// The claim's requests this device was allocated for.
    pub request_names: Vec<String>,
    /// Its pool (the node's).
    pub pool: String,
    /// Its name in the pool.
    pub device: String,
    /// The CDI devices the runtime injects for it.
    pub cdi_device_ids: Vec<String>,
}

/// A claim prepared on this node: what the kubelet was told, and the CDI
/// spec that backs it (kept, so a restarted plugin can rewrite it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// Its devices from this driver, in allocation order.
    pub devices: Vec<PreparedDevice>,
    /// The CDI spec written for it.
    pub spec: CdiSpec,
    /// Its device metadata files, one per request (none in checkpoints
    /// written before the plugin wrote them).
    #[serde(default)]
    pub metadata: Vec<MetadataFile>,
}

/// Why a claim cannot be prepared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// The claim the apiserver has is another one than the kubelet meant.
    #[error(
        "ResourceClaim {namespace}/{name} has UID {found}, not {wanted}: it was deleted and made again"
    )]
    OtherClaim {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The UID the kubelet asked for.
        wanted: String,
        /// The UID the apiserver has.
        found: String,
    },
    /// The claim is not allocated.
    #[error("ResourceClaim {namespace}/{name} is not allocated")]
    NotAllocated {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The allocation names a device this node does not publish (now).
    #[error(
        "ResourceClaim {namespace}/{name} was allocated {pool}/{device}, which this node does not have (or no longer has healthy)"
    )]
    UnknownDevice {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The pool named.
        pool: String,
        /// The device named.
        device: String,
    },
    /// The allocation takes part of an IOMMU group: a group goes to one
    /// virtual machine whole.
    #[error(
        "ResourceClaim {namespace}/{name} was allocated {device}, which shares IOMMU group {group} with {missing}; a group goes to one VM whole, so the claim must ask for all of them (for example with a matchAttribute constraint on gpu.gkm.io/iommuGroup)"
    )]
    PartOfGroup {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The device allocated.
        device: String,
        /// Its IOMMU group.
        group: u32,
        /// The PCI addresses of its group's GPUs the claim was not
        /// allocated, comma-separated.
        missing: String,
    },
}

/// What the plugin knows when it prepares a claim.
#[derive(Clone, Copy)]
pub struct PrepareContext<'a> {
    /// The driver's name.
    pub driver: &'a str,
    /// The node's pool.
    pub pool: &'a str,
    /// The node's devices now.
    pub devices: &'a NodeDevices,
    /// The `/dev` root device nodes are under.
    pub dev_root: &'a std::path::Path,
    /// Whether an optional device node exists under `dev_root`.
    pub present: &'a dyn Fn(&str) -> bool,
    /// Where device metadata files go on the host
    /// (`<state dir>/dra-device-metadata`).
    pub metadata_dir: &'a std::path::Path,
}

/// Prepares claim `uid` from the claim the apiserver has: its allocation's
/// results for this driver (other drivers' devices are theirs to prepare),
/// each a device of this node, with a CDI device per device.
pub fn prepare(
    uid: &str,
    claim: &ResourceClaim,
    ctx: &PrepareContext<'_>,
) -> Result<PreparedClaim, PrepareError> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let found = claim.metadata.uid.clone().unwrap_or_default();
    if found != uid {
        return Err(PrepareError::OtherClaim {
            namespace,
            name,
            wanted: uid.to_string(),
            found,
        });
    }
    let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(PrepareError::NotAllocated { namespace, name });
    };
    let results = allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut devices: Vec<&DraDevice> = Vec::new();
    let mut prepared: Vec<PreparedDevice> = Vec::new();
    for result in results.iter().filter(|r| r.driver == ctx.driver) {
        let device = (result.pool == ctx.pool)
            .then(|| ctx.devices.device(&result.device))
            .flatten()
            .ok_or_else(|| PrepareError::UnknownDevice {
                namespace: namespace.clone(),
                name: name.clone(),
                pool: result.pool.clone(),
                device: result.device.clone(),
            })?;
        // One device may serve several requests of the claim: one entry
        // listing them all.
        if let Some(entry) = prepared.iter_mut().find(|p| p.device == device.name) {
            entry.request_names.push(result.request.clone());
            continue;
        }
        devices.push(device);
        prepared.push(PreparedDevice {
            request_names: vec![result.request.clone()],
            pool: ctx.pool.to_string(),
            device: device.name.clone(),
            cdi_device_ids: vec![cdi::qualified_name(uid, &device.name)],
        });
    }
    check_whole_groups(&devices, &namespace, &name)?;
    let mut spec = cdi::claim_spec(uid, &devices, ctx.dev_root, ctx.present);
    let with_requests: Vec<(&DraDevice, &[String])> = devices
        .iter()
        .zip(&prepared)
        .map(|(device, p)| (*device, p.request_names.as_slice()))
        .collect();
    let metadata = metadata::claim_metadata(
        uid,
        claim,
        ctx.driver,
        ctx.pool,
        &with_requests,
        ctx.metadata_dir,
    );
    // Each request's metadata comes with its first device.
    for file in &metadata {
        let (device, qualified) =
            cdi::metadata_device(uid, &file.request, &file.host_path, &file.container_path);
        spec.devices.push(device);
        if let Some(first) = prepared.iter_mut().find(|p| {
            p.request_names
                .iter()
                .any(|r| metadata::base_request(r) == file.request)
        }) {
            first.cdi_device_ids.push(qualified);
        }
    }
    Ok(PreparedClaim {
        namespace,
        name,
        devices: prepared,
        spec,
        metadata,
    })
}

/// Refuses a claim holding a passthrough GPU without the other GPUs of its
/// IOMMU group (as the device plugin does): the group's devices cannot be
/// split between virtual machines.
fn check_whole_groups(
    devices: &[&DraDevice],
    namespace: &str,
    name: &str,
) -> Result<(), PrepareError> {
    let taken = |peer: &str| {
        devices
            .iter()
            .any(|d| d.kind == DeviceType::Vfio && d.id == peer)
    };
    for device in devices.iter().filter(|d| d.kind == DeviceType::Vfio) {
        if let Some(short) = device.access.missing_group_peers(taken) {
            return Err(PrepareError::PartOfGroup {
                namespace: namespace.to_string(),
                name: name.to_string(),
                device: device.id.clone(),
                group: short.group,
                missing: short.missing.join(", "),
            });
        }
    }
    Ok(())
}
