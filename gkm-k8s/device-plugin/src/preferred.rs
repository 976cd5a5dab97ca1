//! Which devices to prefer when the kubelet asks: the scheduler's assignment
//! when the pod has one, else whole IOMMU groups close together.

use std::collections::{BTreeMap, HashSet};

use gkm_core::assignment::unit_gpu;

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
/// `assigned` is the device set a scheduler assigned to the pod the kubelet
/// allocates for (see [`crate::assignments`]); when the request can be
/// served from it (it holds the must-include devices, and enough of it is
/// available) it is the answer. Only available devices are ever preferred:
/// an assignment naming devices another pod holds is passed over. Otherwise
/// the choice keeps the must-include devices, completes IOMMU groups, and
/// takes the rest from one place where one can hold them all: one GPU for
/// GPU shares, else one NUMA node; the fullest such place first, leaving
/// emptier ones whole; whole groups before split ones.
pub fn preferred(
    resource: &Resource,
    request: Request<'_>,
    assigned: Option<&[String]>,
) -> Vec<String> {
    let available: HashSet<&str> = request.available.iter().map(String::as_str).collect();
    let usable = |id: &str| available.contains(id) || request.must_include.iter().any(|m| m == id);
    let mut chosen = Chosen::default();
    if let Some(set) = assigned {
        if let Some(ids) = assigned_shares(resource, request, set) {
            return ids;
        }
        let fits = request.must_include.iter().all(|m| set.contains(m))
            && set.iter().filter(|id| usable(id)).count() >= request.size;
        if fits {
            chosen.take(request.must_include.iter());
            for id in set.iter().filter(|id| usable(id)) {
                if chosen.len() >= request.size {
                    break;
                }
                chosen.take(std::iter::once(id));
            }
            return chosen.ids;
        }
    }

    for id in request.must_include {
        chosen.take(unit_of(resource, id, &available).iter());
    }
    // Units (a device with its available group peers) not yet chosen.
    let mut in_unit: HashSet<&str> = HashSet::new();
    let mut units: Vec<Vec<String>> = Vec::new();
    for id in request.available {
        if chosen.has(id) || in_unit.contains(id.as_str()) {
            continue;
        }
        let unit = unit_of(resource, id, &available);
        in_unit.extend(
            request
                .available
                .iter()
                .filter(|a| unit.contains(a))
                .map(String::as_str),
        );
        units.push(unit);
    }
    let place = |id: &String| place_of(resource, id);
    let mut free: BTreeMap<Place, usize> = BTreeMap::new();
    for unit in &units {
        if let Some(first) = unit.first() {
            *free.entry(place(first)).or_default() += unit.len();
        }
    }
    let needed = request.size.saturating_sub(chosen.len());
    // Places of the must-include devices first, then those that can hold
    // the rest alone, fullest first.
    let chosen_places: Vec<Place> = chosen.ids.iter().map(place).collect();
    let mut places: Vec<(Place, usize)> = free.into_iter().collect();
    places.sort_by(|(a, a_free), (b, b_free)| {
        let key = |p: &Place, n: usize| (!chosen_places.contains(p), n < needed, n);
        key(a, *a_free).cmp(&key(b, *b_free)).then_with(|| a.cmp(b))
    });
    for (where_, _) in places {
        let mut here: Vec<&Vec<String>> = units
            .iter()
            .filter(|u| u.first().map(place) == Some(where_.clone()))
            .collect();
        // Largest units that still fit first, so groups stay whole.
        here.sort_by_key(|u| std::cmp::Reverse(u.len()));
        for unit in here {
            let room = request.size.saturating_sub(chosen.len());
            if room == 0 {
                break;
            }
            if unit.len() <= room && !unit.iter().any(|id| chosen.has(id)) {
                chosen.take(unit.iter());
            }
        }
    }
    // Still short (only units larger than the room are left): split one.
    for id in units.iter().flatten() {
        if chosen.len() >= request.size {
            break;
        }
        chosen.take(std::iter::once(id));
    }
    let mut ids = chosen.ids;
    ids.truncate(request.size.max(request.must_include.len()));
    ids
}

/// For a unit resource (GPU shares), an assignment names how many units of
/// which GPUs: `<gpu>-<n>` is one unit of `<gpu>`, whichever `n`. The answer
/// is that many available units of each named GPU, when they are there.
/// `None` when the resource is not made of units or the units are not free.
fn assigned_shares(
    resource: &Resource,
    request: Request<'_>,
    set: &[String],
) -> Option<Vec<String>> {
    if !resource.is_units() {
        return None;
    }
    let gpu_of = |id: &str| unit_gpu(id).map(str::to_string);
    let mut wanted: BTreeMap<String, usize> = BTreeMap::new();
    for id in set {
        *wanted.entry(gpu_of(id)?).or_default() += 1;
    }
    if wanted.values().sum::<usize>() != request.size {
        return None;
    }
    let mut chosen = Chosen::default();
    for id in request.must_include.iter().chain(request.available) {
        let gpu = gpu_of(id)?;
        if let Some(left) = wanted.get_mut(&gpu).filter(|n| **n > 0)
            && !chosen.has(id)
        {
            *left -= 1;
            chosen.take(std::iter::once(id));
        }
    }
    (chosen.len() == request.size).then_some(chosen.ids)
}

/// Devices chosen so far, in order, each once.
#[derive(Default)]
struct Chosen {
    ids: Vec<String>,
    set: HashSet<String>,
}

impl Chosen {
    fn take<'a>(&mut self, ids: impl Iterator<Item = &'a String>) {
        for id in ids {
            if self.set.insert(id.clone()) {
                self.ids.push(id.clone());
            }
        }
    }

    fn has(&self, id: &str) -> bool {
        self.set.contains(id)
    }

    fn len(&self) -> usize {
        self.ids.len()
    }
}

/// Where a device is, for keeping a choice together: its GPU for a share,
/// else its NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Place {
    Numa(Option<u32>),
    Gpu(String),
}

fn place_of(resource: &Resource, id: &str) -> Place {
    match resource.device(id) {
        Some(d) => match &d.access {
            Access::Share { gpu, .. } => Place::Gpu(gpu.clone()),
            _ => Place::Numa(d.numa_node),
        },
        None => Place::Numa(None),
    }
}

/// `id` with its group peers that are available, in ID order.
fn unit_of(resource: &Resource, id: &str, available: &HashSet<&str>) -> Vec<String> {
    let mut unit = vec![id.to_string()];
    if let Some(Access::Vfio { group_peers, .. }) = resource.device(id).map(|d| &d.access) {
        unit.extend(
            group_peers
                .iter()
                .filter(|p| available.contains(p.as_str()))
                .cloned(),
        );
    }
    unit.sort();
    unit
}
