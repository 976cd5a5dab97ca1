//! The UUID and PCI address of a simulated GPU that its entry does not give.
//!
//! Real GPUs always have both (NVML's `GPU-…` UUID, which dcgm-exporter puts
//! in every metric's `UUID` label, and a PCI address), so simulated ones do
//! too. They are derived from the inventory file's name, its directory's
//! name, its text and the GPU's index: the same file reads the same every
//! time and wherever the tree lies, and two nodes simulated from different
//! files (or the same text in directories named after each node) get
//! different UUIDs.

use std::path::Path;

use gkm_core::{Gpu, Vendor};

/// The first PCI bus simulated GPUs sit on; buses below are left to the
/// host bridge and on-board devices, as on real servers.
const FIRST_BUS: u32 = 0x18;
/// Buses per PCI domain that GPUs are placed on (`0x18..=0xff`).
const BUSES_PER_DOMAIN: u32 = 0x100 - FIRST_BUS;

/// What a file's simulated identities derive from: its directory's name,
/// its own name and its text.
pub(super) fn seed(path: &Path, text: &str) -> Vec<u8> {
    let name = |p: Option<&Path>| {
        p.and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let tail = format!("{}/{}", name(path.parent()), name(Some(path)));
    [tail.as_bytes(), b"\0", text.as_bytes()].concat()
}

/// Gives every GPU without a UUID or PCI address one, derived from `seed`
/// (the file's path and text) and its index. Addresses an entry gave are
/// kept and never handed out again.
pub(super) fn assign(gpus: &mut [Gpu], seed: &[u8]) {
    let taken: Vec<String> = gpus.iter().filter_map(|g| g.pci_address.clone()).collect();
    let mut next_slot = 0u32;
    for gpu in gpus.iter_mut() {
        if gpu.uuid.is_none() {
            gpu.uuid = Some(uuid(gpu.vendor, seed, gpu.index));
        }
        if gpu.pci_address.is_none() {
            let address = loop {
                let candidate = pci_address(next_slot);
                next_slot += 1;
                if !taken.contains(&candidate) {
                    break candidate;
                }
            };
            gpu.pci_address = Some(address);
        }
    }
}

/// An RFC 9562 version 8 (vendor-specific) UUID from `seed` and `index`,
/// written as the vendor's tools write UUIDs: `GPU-…` for NVIDIA (NVML),
/// bare otherwise.
fn uuid(vendor: Vendor, seed: &[u8], index: u32) -> String {
    let hi = fnv1a(0xcbf2_9ce4_8422_2325, seed, index);
    let lo = fnv1a(0x8422_2325_cbf2_9ce4, seed, index);
    let hi = (hi & !0xf000) | 0x8000; // version 8
    let lo = (lo & !(0b11 << 62)) | (0b10 << 62); // RFC 9562 variant
    let text = format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    );
    match vendor {
        Vendor::Nvidia => format!("GPU-{text}"),
        _ => text,
    }
}

/// 64-bit FNV-1a of `seed` then `index`, from `basis`: stable across
/// builds and platforms, unlike the standard library's hasher.
fn fnv1a(basis: u64, seed: &[u8], index: u32) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    seed.iter()
        .chain(index.to_le_bytes().iter())
        .fold(basis, |hash, byte| {
            (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
        })
}

/// The `slot`-th GPU address: device 0, function 0 of one bus each, as GPUs
/// sit on real servers (`0000:18:00.0`, `0000:19:00.0`…), moving to the
/// next PCI domain when the buses run out.
fn pci_address(slot: u32) -> String {
    let domain = slot / BUSES_PER_DOMAIN;
    let bus = FIRST_BUS + slot % BUSES_PER_DOMAIN;
    format!("{domain:04x}:{bus:02x}:00.0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_stable_distinct_and_well_formed() {
        let a = uuid(Vendor::Nvidia, b"node-a", 0);
        assert_eq!(a, uuid(Vendor::Nvidia, b"node-a", 0));
        assert_ne!(a, uuid(Vendor::Nvidia, b"node-a", 1));
        assert_ne!(a, uuid(Vendor::Nvidia, b"node-b", 0));
        let bare = a.strip_prefix("GPU-").unwrap();
        let groups: Vec<usize> = bare.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12]);
        assert_eq!(&bare[14..15], "8", "version 8: {a}");
        assert!("89ab".contains(&bare[19..20]), "RFC 9562 variant: {a}");
        assert!(!uuid(Vendor::Amd, b"node-a", 0).starts_with("GPU-"));
    }

    #[test]
    fn seeds_name_the_file_and_its_directory_only() {
        let text = "gpus: [{profile: T4}]";
        assert_eq!(
            seed(Path::new("/a/node-1/gpus.yaml"), text),
            seed(Path::new("/b/c/node-1/gpus.yaml"), text)
        );
        assert_ne!(
            seed(Path::new("/a/node-1/gpus.yaml"), text),
            seed(Path::new("/a/node-2/gpus.yaml"), text)
        );
    }

    #[test]
    fn addresses_fill_buses_then_domains() {
        assert_eq!(pci_address(0), "0000:18:00.0");
        assert_eq!(pci_address(1), "0000:19:00.0");
        assert_eq!(pci_address(BUSES_PER_DOMAIN - 1), "0000:ff:00.0");
        assert_eq!(pci_address(BUSES_PER_DOMAIN), "0001:18:00.0");
    }

    #[test]
    fn given_identities_are_kept_and_never_reused() {
        let mut gpus: Vec<Gpu> = (0..3)
            .map(|index| Gpu {
                index,
                ..Gpu::default()
            })
            .collect();
        gpus[1].pci_address = Some("0000:18:00.0".into());
        gpus[2].uuid = Some("GPU-given".into());
        assign(&mut gpus, b"seed");
        let addresses: Vec<&str> = gpus
            .iter()
            .map(|g| g.pci_address.as_deref().unwrap())
            .collect();
        assert_eq!(addresses, ["0000:19:00.0", "0000:18:00.0", "0000:1a:00.0"]);
        assert_eq!(gpus[2].uuid.as_deref(), Some("GPU-given"));
        assert!(gpus[0].uuid.is_some() && gpus[1].uuid.is_some());
    }
}
