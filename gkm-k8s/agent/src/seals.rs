//! Store entries that may have been written since they were extracted: the
//! agent checks every entry's seal ([`gkm_oci::seal`]) when it starts, and
//! quarantines each one that is unsealed (stored by a version of gkm whose
//! deliveries could write into the store) or whose tree changed. A
//! quarantined digest is no longer stored, so the next pass extracts it
//! again from its verified image; pods that mounted the old tree keep it
//! until they end, and its directory goes once no mount record is older
//! than its quarantine ([`releasable`]). The entry's relocation layers,
//! made from the old tree, go into the quarantined entry with it
//! ([`relocation::quarantine_layers`]): the fresh extraction gets its own.

use std::time::SystemTime;

use gkm_k8s_node::relocation;
use gkm_oci::seal::SealCheck;
use gkm_oci::{Digest, Quarantined, Store};
use tracing::warn;

use crate::error::{Error, Result};

/// Checks the seal of every entry in `store` and quarantines each one that
/// is not intact, with its relocation layers; returns them with the
/// reason.
pub(super) fn quarantine_unsealed(store: &Store) -> Result<Vec<(Quarantined, String)>> {
    let mut taken = Vec::new();
    for digest in store.list()? {
        let reason = match store.check_seal(&digest) {
            None | Some(SealCheck::Intact) => continue,
            Some(SealCheck::Missing) => {
                "it has no seal (stored by an older gkm, whose deliveries could write into it)"
                    .to_string()
            }
            Some(SealCheck::Broken { reason }) => reason,
        };
        if let Some(quarantined) = store.quarantine(&digest)? {
            let root = store.root();
            relocation::quarantine_layers(root, &digest, &quarantined.path).map_err(|source| {
                Error::Io {
                    path: relocation::layers_of(root, &digest),
                    source,
                }
            })?;
            warn!(%digest, %reason, path = %quarantined.path.display(),
                "quarantined a store entry; it is extracted again from its verified image");
            taken.push((quarantined, reason));
        }
    }
    Ok(taken)
}

/// The quarantined entries no pod can see any more: those with no mount of
/// their digest published before they were taken out. `mounted` is each
/// mount record's digest and publish time.
pub(super) fn releasable<'a>(
    quarantined: &'a [Quarantined],
    mounted: &[(Digest, SystemTime)],
) -> Vec<&'a Quarantined> {
    quarantined
        .iter()
        .filter(|q| {
            !mounted
                .iter()
                .any(|(digest, published)| *digest == q.digest && *published <= q.since)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::time::Duration;

    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn quarantined(digest: &Digest, since: u64) -> Quarantined {
        Quarantined {
            digest: digest.clone(),
            since: at(since),
            path: format!("/store/quarantine/{}.{since}", digest.hex()).into(),
        }
    }

    #[test]
    fn a_quarantined_tree_stays_while_a_pod_that_mounted_it_before_does() {
        let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
        let taken = [quarantined(&a, 100), quarantined(&b, 100)];
        // A pod of `a` from before the quarantine; one of `b` from after it
        // mounts the fresh extraction, not the quarantined tree.
        let mounted = [(a.clone(), at(50)), (b.clone(), at(150))];
        let released = releasable(&taken, &mounted);
        assert_eq!(released, vec![&taken[1]]);
        assert_eq!(releasable(&taken, &[]).len(), 2);
    }

    #[test]
    fn unsealed_and_changed_entries_are_quarantined_and_intact_ones_kept() {
        let root = tempfile::tempdir().expect("tempdir");
        let store = Store::open(root.path()).expect("store");
        let entry = |name: &[u8]| {
            let digest = Digest::of(name);
            let path = store.path_of(&digest);
            fs::create_dir_all(path.join("io.triton.cache/KEY")).expect("tree");
            (digest, path)
        };
        let (intact, path) = entry(b"intact");
        gkm_oci::seal::seal(&path).expect("seal");
        let (changed, path) = entry(b"changed");
        gkm_oci::seal::seal(&path).expect("seal");
        std::thread::sleep(Duration::from_millis(20));
        fs::create_dir(path.join("io.triton.cache/NEWKEYAAAA")).expect("planted");
        let (unsealed, _) = entry(b"unsealed");
        // Layers made from each tree for a mount path of a pod.
        for digest in [&intact, &changed] {
            let layer = relocation::layers_of(store.root(), digest).join("0123456789abcdef");
            fs::create_dir_all(layer.join("KEY")).expect("layer");
            fs::write(layer.join("KEY/__grp__k.json"), "{}").expect("group");
        }

        let taken = quarantine_unsealed(&store).expect("audit");
        let mut digests: Vec<&Digest> = taken.iter().map(|(q, _)| &q.digest).collect();
        digests.sort();
        let mut want = vec![&changed, &unsealed];
        want.sort();
        assert_eq!(digests, want);
        for (q, reason) in &taken {
            let expected = if q.digest == changed {
                "changed since it was extracted"
            } else {
                "no seal"
            };
            assert!(reason.contains(expected), "{}: {reason}", q.digest);
        }
        assert_eq!(store.list().expect("list"), vec![intact.clone()]);
        // The changed tree's layers went with it, the intact one's stay.
        let root = store.root();
        assert!(!relocation::layers_of(root, &changed).exists());
        let (q, _) = taken
            .iter()
            .find(|(q, _)| q.digest == changed)
            .expect("changed");
        assert!(
            q.path
                .join(relocation::QUARANTINED_LAYERS)
                .join("0123456789abcdef/KEY/__grp__k.json")
                .is_file(),
            "kept in the quarantined entry while a pod may stack it"
        );
        assert!(relocation::layers_of(root, &intact).is_dir());
        // They go when the quarantined entry goes.
        store.remove_quarantined(q).expect("removed");
        assert!(!q.path.exists());
    }
}
