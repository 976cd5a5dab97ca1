//! The ResourceSlices of a node's pool: a pure function of its devices.
//!
//! One pool per node, named after the node; its devices go into slices of
//! at most [`MAX_DEVICES_PER_SLICE`], named `<node>-<driver>-<n>`, each
//! owned by the Node so they go with it. The pool's generation is bumped
//! whenever what is published changes, so the scheduler never mixes slices
//! of two generations.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Device, DeviceCapacity, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::devices::DraDevice;

/// The most devices the apiserver takes in one ResourceSlice.
pub const MAX_DEVICES_PER_SLICE: usize = 128;

/// The label naming the driver that wrote a slice.
pub const DRIVER_LABEL: &str = "gkm.io/dra-driver";

/// The node a pool belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOwner<'a> {
    /// The Node's name (and the pool's).
    pub node: &'a str,
    /// The Node's UID, for the owner reference.
    pub node_uid: &'a str,
}

/// The slices publishing `devices` as generation `generation` of the
/// node's pool for `driver`. A node without devices gets one empty slice,
/// so the scheduler knows the pool is empty rather than unknown.
pub fn pool_slices(
    driver: &str,
    owner: &PoolOwner<'_>,
    generation: i64,
    devices: &[DraDevice],
) -> Vec<ResourceSlice> {
    let chunks: Vec<&[DraDevice]> = if devices.is_empty() {
        vec![&[]]
    } else {
        devices.chunks(MAX_DEVICES_PER_SLICE).collect()
    };
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(owner.node, driver, i)),
                labels: Some(BTreeMap::from([(
                    DRIVER_LABEL.to_string(),
                    driver.to_string(),
                )])),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".to_string(),
                    kind: "Node".to_string(),
                    name: owner.node.to_string(),
                    uid: owner.node_uid.to_string(),
                    controller: Some(true),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: driver.to_string(),
                node_name: Some(owner.node.to_string()),
                pool: ResourcePool {
                    name: owner.node.to_string(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(chunk.iter().map(device).collect()),
                ..ResourceSliceSpec::default()
            },
        })
        .collect()
}

/// The longest object name (a DNS subdomain).
const MAX_NAME: usize = 253;

/// The name of slice `index` of the node's pool: `<node>-<driver>-<index>`;
/// for a node name so long that this would not be a valid object name, the
/// node part is cut and followed by a hash of the whole node name, so two
/// such nodes still get names of their own.
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    let name = format!("{node}-{driver}-{index}");
    if name.len() <= MAX_NAME {
        return name;
    }
    // FNV-1a: stable across builds, so a restarted plugin names its slices
    // as before.
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let tail = format!("-{hash:016x}-{driver}-{index}");
    let keep = MAX_NAME.saturating_sub(tail.len());
    // Node names are ASCII (DNS subdomains); cut on a character boundary anyway.
    let cut = (0..=keep.min(node.len()))
        .rev()
        .find(|&i| node.is_char_boundary(i))
        .unwrap_or(0);
    format!("{}{tail}", node[..cut].trim_end_matches(['-', '.']))
}

fn device(d: &DraDevice) -> Device {
    Device {
        name: d.name.clone(),
        attributes: Some(d.attributes.clone()),
        capacity: d.memory_bytes.map(|bytes| {
            BTreeMap::from([(
                "memory".to_string(),
                DeviceCapacity {
                    value: Quantity(bytes.to_string()),
                    ..DeviceCapacity::default()
                },
            )])
        }),
        ..Device::default()
    }
}

/// Whether the slices the apiserver has, `existing`, are still the ones
/// published as `generation` with the names of `desired`. (Their devices are
/// not compared: the apiserver rewrites quantities in its canonical form;
/// what was published is compared with `desired` before it is written.)
pub fn still_published(
    existing: &[ResourceSlice],
    desired: &[ResourceSlice],
    generation: i64,
) -> bool {
    let mut have: Vec<Option<&str>> = existing
        .iter()
        .map(|s| s.metadata.name.as_deref())
        .collect();
    let mut want: Vec<Option<&str>> = desired.iter().map(|s| s.metadata.name.as_deref()).collect();
    have.sort();
    want.sort();
    have == want
        && existing
            .iter()
            .all(|s| s.spec.pool.generation == generation)
}
