//! Which devices to prefer when the kubelet asks: the scheduler's assignment
//! when the pod has one, else whole IOMMU groups on one NUMA node.

use std::collections::BTreeMap;

use super::resources::{Access, Resource};

/// A preference request for one container, as the kubelet sends it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Devices the kubelet may choose from.
    pub available: &'a [String],
    /// Devices that must be in the answer.
    pub must_include: &'a [String],
    /// How many devices to choose.
    pub size: usize,
}

/// The devices to prefer for `request` from `resource`.
///
/// `assigned` lists device sets a scheduler assigned to pods waiting on this
/// node (oldest first, see [`gkm_core::assignment`]): the first set that the
/// request can be served from (it holds the must-include devices, and enough
/// of it is available) is the answer. Otherwise the choice keeps the
/// must-include devices, completes IOMMU groups, and takes the rest from
/// one NUMA node where one can hold them all (the fullest such node first,
/// leaving emptier nodes whole), whole groups before split ones.
pub fn preferred(
    resource: &Resource,
    request: Request<'_>,
    assigned: &[Vec<String>],
) -> Vec<String> {
    let usable = |id: &String| request.available.contains(id) || request.must_include.contains(id);
    for set in assigned {
        let fits = request.must_include.iter().all(|m| set.contains(m))
            && set.iter().filter(|id| usable(id)).count() >= request.size;
        if fits {
            let mut chosen: Vec<String> = request.must_include.to_vec();
            for id in set.iter().filter(|id| usable(id)) {
                if chosen.len() >= request.size {
                    break;
                }
                if !chosen.contains(id) {
                    chosen.push(id.clone());
                }
            }
            return chosen;
        }
    }

    let mut chosen: Vec<String> = Vec::new();
    let take = |chosen: &mut Vec<String>, unit: &[String]| {
        for id in unit {
            if !chosen.contains(id) {
                chosen.push(id.clone());
            }
        }
    };
    for id in request.must_include {
        take(&mut chosen, &unit_of(resource, id, request.available));
    }
    // Units (a device with its available group peers) not yet chosen.
    let mut units: Vec<Vec<String>> = Vec::new();
    for id in request.available {
        if chosen.contains(id) || units.iter().any(|u| u.contains(id)) {
            continue;
        }
        units.push(unit_of(resource, id, request.available));
    }
    let numa = |id: &String| resource.device(id).and_then(|d| d.numa_node);
    let mut per_node: BTreeMap<Option<u32>, usize> = BTreeMap::new();
    for unit in &units {
        *per_node.entry(unit.first().and_then(numa)).or_default() += unit.len();
    }
    let needed = request.size.saturating_sub(chosen.len());
    // Nodes of the must-include devices first, then those that can hold the
    // rest alone, fullest first.
    let chosen_nodes: Vec<Option<u32>> = chosen.iter().map(numa).collect();
    let mut nodes: Vec<(Option<u32>, usize)> = per_node.into_iter().collect();
    nodes.sort_by_key(|(node, count)| {
        (!chosen_nodes.contains(node), *count < needed, *count, *node)
    });
    for (node, _) in nodes {
        let mut on_node: Vec<&Vec<String>> = units
            .iter()
            .filter(|u| u.first().and_then(numa) == node)
            .collect();
        // Largest units that still fit first, so groups stay whole.
        on_node.sort_by_key(|u| std::cmp::Reverse(u.len()));
        for unit in on_node.iter().copied() {
            let room = request.size.saturating_sub(chosen.len());
            if room == 0 {
                break;
            }
            if unit.len() <= room && !unit.iter().any(|id| chosen.contains(id)) {
                take(&mut chosen, unit);
            }
        }
    }
    // Still short (only units larger than the room are left): split one.
    for unit in &units {
        for id in unit {
            if chosen.len() >= request.size {
                break;
            }
            if !chosen.contains(id) {
                chosen.push(id.clone());
            }
        }
    }
    chosen.truncate(request.size.max(request.must_include.len()));
    chosen
}

/// `id` with its group peers that are available, in ID order.
fn unit_of(resource: &Resource, id: &str, available: &[String]) -> Vec<String> {
    let mut unit = vec![id.to_string()];
    if let Some(Access::Vfio { group_peers, .. }) = resource.device(id).map(|d| &d.access) {
        unit.extend(
            group_peers
                .iter()
                .filter(|p| available.contains(p))
                .cloned(),
        );
    }
    unit.sort();
    unit
}
