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
//!
//! [`Rescan`] is that rule with its memory, which both plugins poll through.

use std::time::{Duration, Instant};

use crate::fingerprint::{Fingerprint, fingerprint};
use crate::resources::{NodePaths, ScanInputs};

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

/// A polling plugin's last successful read of the node's devices: what it
/// found, and the [`LastLook`] that says when to read again ([`due`]).
#[derive(Debug)]
pub struct Rescan<T> {
    last: Option<(LastLook, T)>,
}

impl<T> Default for Rescan<T> {
    fn default() -> Self {
        Rescan { last: None }
    }
}

impl<T: Clone> Rescan<T> {
    /// The node's devices at a poll: what the last read found when no read
    /// is [`due`] for the node under `paths` with `inputs`, else what
    /// `read` finds now. A successful read is remembered; a failed one
    /// forgets the last, so that the next poll reads again.
    pub fn poll<E>(
        &mut self,
        paths: &NodePaths,
        inputs: &ScanInputs,
        read: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        // Taken before the read, so a change while reading moves the next one.
        let node = fingerprint(paths);
        let now = Instant::now();
        let last = self.last.as_ref();
        if !due(last.map(|(look, _)| look), node, inputs, now)
            && let Some((_, found)) = last
        {
            return Ok(found.clone());
        }
        let read = read();
        self.last = read
            .as_ref()
            .ok()
            .map(|found| (LastLook::new(node, inputs.clone(), now), found.clone()));
        read
    }
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

    #[test]
    fn a_poll_reads_again_only_when_due_or_after_a_failed_read() {
        let dir = tempfile::tempdir().unwrap();
        let tree = NodeTree::new(dir.path()).unwrap();
        tree.pci(&Pci::gpu("0000:6e:00.0", 0x10de, 0x2330).driver("nvidia"))
            .unwrap();
        let inputs = ScanInputs::default();
        let mut rescan = Rescan::default();
        let mut reads = 0;
        let mut read = |found: Result<u32, &'static str>| {
            reads += 1;
            found
        };
        assert_eq!(rescan.poll(tree.paths(), &inputs, || read(Ok(1))), Ok(1));
        // Unchanged: the first read stands.
        assert_eq!(rescan.poll(tree.paths(), &inputs, || read(Ok(2))), Ok(1));
        // A new device node moves the fingerprint; that read fails, and
        // the next poll reads again though nothing else changed.
        tree.nvidia_gpu("0000:6e:00.0", "GPU-6e", 0).unwrap();
        assert_eq!(
            rescan.poll(tree.paths(), &inputs, || read(Err("busy"))),
            Err("busy")
        );
        assert_eq!(rescan.poll(tree.paths(), &inputs, || read(Ok(3))), Ok(3));
        assert_eq!(rescan.poll(tree.paths(), &inputs, || read(Ok(4))), Ok(3));
        assert_eq!(reads, 3);
    }
}
