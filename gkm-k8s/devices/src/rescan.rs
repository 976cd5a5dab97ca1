//! When a plugin's poll reads the node's devices again (the DRA plugin's
//! and the device plugin's, the same way): reading them is a full
//! discovery (the PCI ID database, every GPU's files, NVML), so a poll
//! first takes the node's [`Fingerprint`] and reads the devices only when
//!
//! - the fingerprint moved (a device, driver binding, device node, vGPU…
//!   came or went),
//! - the scan inputs changed (a critical XID made a GPU unhealthy), or
//! - the last read is [`FULL_LOOK_EVERY`] old: what the fingerprint cannot
//!   see (NVML's answers) is read now and then anyway,
//!
//! or when the last read failed (nothing is remembered then).

use std::time::{Duration, Instant};

use crate::fingerprint::Fingerprint;
use crate::resources::ScanInputs;

/// The longest a poll goes without reading the node's devices.
pub const FULL_LOOK_EVERY: Duration = Duration::from_secs(60);

/// What the last successful read of the node's devices saw.
#[derive(Debug, Clone)]
pub struct LastLook {
    fingerprint: Fingerprint,
    inputs: ScanInputs,
    at: Instant,
}

impl LastLook {
    /// A read at `at`, begun when the node's fingerprint was `fingerprint`
    /// (taken before reading, so a change while reading moves the next one)
    /// with `inputs`.
    pub fn new(fingerprint: Fingerprint, inputs: ScanInputs, at: Instant) -> LastLook {
        LastLook {
            fingerprint,
            inputs,
            at,
        }
    }

    /// Whether a poll at `now`, finding `fingerprint` and `inputs`, must
    /// read the node's devices again.
    pub fn stale(&self, fingerprint: Fingerprint, inputs: &ScanInputs, now: Instant) -> bool {
        fingerprint != self.fingerprint
            || *inputs != self.inputs
            || now.saturating_duration_since(self.at) >= FULL_LOOK_EVERY
    }
}

/// Whether a poll at `now`, finding `fingerprint` and `inputs`, must read
/// the node's devices: always when nothing is remembered (no read yet, or
/// the last one failed), else when [`LastLook::stale`].
pub fn due(
    last: Option<&LastLook>,
    fingerprint: Fingerprint,
    inputs: &ScanInputs,
    now: Instant,
) -> bool {
    last.is_none_or(|last| last.stale(fingerprint, inputs, now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::fingerprint;
    use crate::node_tree::{NodeTree, Pci};

    /// Two fingerprints of a node: with an H100's device node, and without.
    fn fingerprints() -> (Fingerprint, Fingerprint) {
        let dir = tempfile::tempdir().unwrap();
        let tree = NodeTree::new(dir.path()).unwrap();
        tree.pci(&Pci::gpu("0000:6e:00.0", 0x10de, 0x2330).driver("nvidia"))
            .unwrap();
        tree.nvidia_gpu("0000:6e:00.0", "GPU-6e", 0).unwrap();
        let with = fingerprint(tree.paths());
        std::fs::remove_file(tree.paths().dev_root.join("nvidia0")).unwrap();
        (with, fingerprint(tree.paths()))
    }

    #[test]
    fn an_unchanged_node_is_not_read_again_until_the_full_look_is_due() {
        let (node, _) = fingerprints();
        let at = Instant::now();
        let last = LastLook::new(node, ScanInputs::default(), at);
        let inputs = ScanInputs::default();
        assert!(!last.stale(node, &inputs, at + Duration::from_secs(5)));
        assert!(!last.stale(
            node,
            &inputs,
            at + FULL_LOOK_EVERY - Duration::from_millis(1)
        ));
        assert!(last.stale(node, &inputs, at + FULL_LOOK_EVERY));
    }

    #[test]
    fn a_changed_node_is_read_at_the_next_poll() {
        let (before, after) = fingerprints();
        let at = Instant::now();
        let last = LastLook::new(before, ScanInputs::default(), at);
        assert!(last.stale(after, &ScanInputs::default(), at + Duration::from_secs(5)));
    }

    #[test]
    fn a_critical_xid_has_the_node_read_at_the_next_poll() {
        let (node, _) = fingerprints();
        let at = Instant::now();
        let last = LastLook::new(node, ScanInputs::default(), at);
        let mut inputs = ScanInputs::default();
        inputs
            .xids
            .insert("0000:6e:00.0".to_string(), "79".to_string());
        assert!(last.stale(node, &inputs, at + Duration::from_secs(5)));
    }

    #[test]
    fn a_node_never_read_or_whose_last_read_failed_is_read() {
        let (node, _) = fingerprints();
        let at = Instant::now();
        let inputs = ScanInputs::default();
        assert!(due(None, node, &inputs, at));
        let last = LastLook::new(node, inputs.clone(), at);
        assert!(!due(
            Some(&last),
            node,
            &inputs,
            at + Duration::from_secs(2)
        ));
        assert!(due(Some(&last), node, &inputs, at + FULL_LOOK_EVERY));
    }
}
