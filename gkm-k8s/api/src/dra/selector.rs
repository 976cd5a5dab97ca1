//! CEL that selects the `gpu.gkm.io` devices which meet what a
//! cache's targets require ([`gkm_core::compat::Requirement`]): the rule of
//! `gkm_core::compat` read back from the attributes the driver (`gkm-k8s-dra`)
//! writes, for a DeviceClass's selector.
//!
//! Each requirement becomes one conjunction over the device's `backend`,
//! `computeCapability` (or `architecture` for a gfx target), `warpSize`
//! and `toolkitVersion`; a device fits when any of them holds. Every
//! attribute is tested with `has()` before it is read: a missing one is a
//! CEL error, and an error aborts the allocation of the whole claim.

use std::collections::BTreeSet;

use gkm_core::compat::{ArchRequirement, Requirement, VersionRange};

use super::{ARCHITECTURE, BACKEND, COMPUTE_CAPABILITY, DRIVER, TOOLKIT_VERSION, WARP_SIZE};

/// The expression of a selector that no device meets.
pub const NOTHING: &str = "false";

/// The expression of a selector that this driver's devices meet, and no
/// other: a class that lists it first selects only this driver's devices
/// whatever its other selectors say (a class's selectors must all hold).
pub const THIS_DRIVER: &str = "device.driver == 'gpu.gkm.io'";

/// A CEL expression that is true for exactly the devices of this driver
/// that meet at least one of `requirements` ([`NOTHING`] when there are
/// none).
///
/// ```
/// use gkm_core::compat::{CheckOptions, requirement};
/// let target = gkm_core::cache::Summary::from_label(
///     r#"{"targets":[{"backend":"hip","arch":"gfx942","warp_size":64}]}"#,
/// ).unwrap().targets.remove(0);
/// let expression = gkm_k8s_api::dra::selector::fits(&[requirement(&target, &CheckOptions::default()).unwrap()]);
/// assert_eq!(
///     expression,
///     "device.driver == 'gpu.gkm.io' && (\
///      (has(device.attributes['gpu.gkm.io'].backend) && device.attributes['gpu.gkm.io'].backend == 'hip' \
///      && has(device.attributes['gpu.gkm.io'].architecture) && device.attributes['gpu.gkm.io'].architecture == 'gfx942' \
///      && has(device.attributes['gpu.gkm.io'].warpSize) && device.attributes['gpu.gkm.io'].warpSize == 64))"
/// );
/// ```
pub fn fits(requirements: &[Requirement]) -> String {
    // Variants often share targets: each conjunction once, in a stable order.
    let alternatives: BTreeSet<String> = requirements.iter().map(conjunction).collect();
    if alternatives.is_empty() {
        return NOTHING.to_string();
    }
    let alternatives: Vec<String> = alternatives.into_iter().map(|a| format!("({a})")).collect();
    format!("{THIS_DRIVER} && ({})", alternatives.join(" || "))
}

/// `device.attributes['gpu.gkm.io'].<key>`.
fn attribute(key: &str) -> String {
    format!("device.attributes[{}].{key}", quote(DRIVER))
}

/// `has(<attribute>)`.
fn has(key: &str) -> String {
    format!("has({})", attribute(key))
}

fn conjunction(r: &Requirement) -> String {
    let mut terms = vec![
        has(BACKEND),
        format!("{} == {}", attribute(BACKEND), quote(r.backend.as_str())),
    ];
    match &r.arch {
        ArchRequirement::ComputeCapability {
            major,
            minor,
            newer_minor,
        } => {
            terms.push(has(COMPUTE_CAPABILITY));
            if *newer_minor {
                terms.push(in_range(
                    COMPUTE_CAPABILITY,
                    &VersionRange {
                        from: (*major, *minor),
                        below: (major + 1, 0),
                    },
                ));
            } else {
                terms.push(format!(
                    "{}.compareTo(semver('{major}.{minor}.0')) == 0",
                    attribute(COMPUTE_CAPABILITY)
                ));
            }
        }
        ArchRequirement::Named(name) => {
            terms.push(has(ARCHITECTURE));
            terms.push(format!("{} == {}", attribute(ARCHITECTURE), quote(name)));
        }
    }
    let warp = format!("{} == {}", attribute(WARP_SIZE), r.warp_size);
    terms.push(if r.unreported_warp_size_fits {
        format!("(!{} || {warp})", has(WARP_SIZE))
    } else {
        format!("{} && {warp}", has(WARP_SIZE))
    });
    if !r.refused_drivers.is_empty() {
        let refused: Vec<String> = r
            .refused_drivers
            .iter()
            .map(|range| in_range(TOOLKIT_VERSION, range))
            .collect();
        terms.push(format!(
            "(!{} || !({}))",
            has(TOOLKIT_VERSION),
            refused.join(" || ")
        ));
    }
    terms.join(" && ")
}

/// Whether the version attribute `key` is in `range` (patch versions
/// ignored: the range's bounds are whole minor versions).
fn in_range(key: &str, range: &VersionRange) -> String {
    let (from, below) = (range.from, range.below);
    format!(
        "({a}.compareTo(semver('{}.{}.0')) >= 0 && {a}.compareTo(semver('{}.{}.0')) < 0)",
        from.0,
        from.1,
        below.0,
        below.1,
        a = attribute(key)
    )
}

/// `value` as a CEL string literal.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_core::compat::{CheckOptions, requirement};

    fn target(json: &str) -> gkm_core::cache::Target {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_triton_cuda_target_asks_for_its_compute_capability_and_a_driver_of_its_major() {
        let r = requirement(
            &target(r#"{"backend":"cuda","arch":"90","warp_size":32,"ptx_version":87}"#),
            &CheckOptions::default(),
        )
        .unwrap();
        let a = "device.attributes['gpu.gkm.io']";
        assert_eq!(
            fits(&[r.clone(), r]),
            format!(
                "device.driver == 'gpu.gkm.io' && (\
                 (has({a}.backend) && {a}.backend == 'cuda' \
                 && has({a}.computeCapability) && {a}.computeCapability.compareTo(semver('9.0.0')) == 0 \
                 && (!has({a}.warpSize) || {a}.warpSize == 32) \
                 && (!has({a}.toolkitVersion) || !(({a}.toolkitVersion.compareTo(semver('9.0.0')) >= 0 \
                 && {a}.toolkitVersion.compareTo(semver('12.0.0')) < 0)))))"
            )
        );
    }

    #[test]
    fn this_driver_is_the_driver() {
        assert_eq!(THIS_DRIVER, format!("device.driver == {}", quote(DRIVER)));
    }

    #[test]
    fn no_requirement_selects_nothing() {
        assert_eq!(fits(&[]), NOTHING);
    }

    #[test]
    fn literals_are_quoted() {
        assert_eq!(quote(r"it's \ here"), r"'it\'s \\ here'");
    }
}
