//! Which stored digests the agent removes: those nothing has referenced for
//! the grace period. Only digests seen in a listing of the store are ever
//! candidates, so an extraction that ends while a pass runs is never removed
//! by that pass.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use gkm_oci::Digest;

/// Since when each stored digest has been unreferenced.
#[derive(Debug, Default)]
pub(super) struct Unreferenced {
    since: HashMap<Digest, Instant>,
}

impl Unreferenced {
    /// The digests of `stored` (a listing of the store) to remove at `now`:
    /// those not in `keep` (referenced, or being extracted) and unreferenced
    /// for at least `grace`. A digest in `keep` starts over; one no longer
    /// stored is forgotten.
    pub(super) fn expired(
        &mut self,
        stored: &HashSet<Digest>,
        keep: &HashSet<Digest>,
        now: Instant,
        grace: Duration,
    ) -> Vec<Digest> {
        self.since
            .retain(|digest, _| stored.contains(digest) && !keep.contains(digest));
        let mut expired: Vec<Digest> = stored
            .iter()
            .filter(|digest| !keep.contains(*digest))
            .filter(|digest| {
                let since = *self.since.entry((*digest).clone()).or_insert(now);
                now.duration_since(since) >= grace
            })
            .cloned()
            .collect();
        expired.sort();
        expired
    }

    /// Forgets `digest`, removed from the store.
    pub(super) fn removed(&mut self, digest: &Digest) {
        self.since.remove(digest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(600);

    fn digest(n: u8) -> Digest {
        Digest::from_hex(&format!("{n:02x}").repeat(32)).expect("digest")
    }

    fn set(digests: &[&Digest]) -> HashSet<Digest> {
        digests.iter().map(|d| (*d).clone()).collect()
    }

    #[test]
    fn an_unreferenced_digest_goes_once_the_grace_is_over() {
        let (a, b) = (digest(1), digest(2));
        let mut gc = Unreferenced::default();
        let start = Instant::now();
        let stored = set(&[&a, &b]);
        let keep = set(&[&b]);
        assert!(gc.expired(&stored, &keep, start, GRACE).is_empty());
        let nearly = start + GRACE - Duration::from_secs(1);
        assert!(gc.expired(&stored, &keep, nearly, GRACE).is_empty());
        assert_eq!(gc.expired(&stored, &keep, start + GRACE, GRACE), [a]);
    }

    #[test]
    fn a_digest_referenced_again_starts_over() {
        let a = digest(1);
        let mut gc = Unreferenced::default();
        let start = Instant::now();
        let stored = set(&[&a]);
        assert!(gc.expired(&stored, &set(&[]), start, GRACE).is_empty());
        let referenced = start + GRACE / 2;
        assert!(
            gc.expired(&stored, &set(&[&a]), referenced, GRACE)
                .is_empty()
        );
        // Unreferenced again only from this pass on.
        let again = start + GRACE;
        assert!(gc.expired(&stored, &set(&[]), again, GRACE).is_empty());
        let nearly = again + GRACE - Duration::from_secs(1);
        assert!(gc.expired(&stored, &set(&[]), nearly, GRACE).is_empty());
        assert_eq!(gc.expired(&stored, &set(&[]), again + GRACE, GRACE), [a]);
    }

    #[test]
    fn only_a_listed_digest_is_ever_removed() {
        // An extraction that ends after the listing is not in it: whatever
        // else the pass decides, it is not a candidate.
        let (listed, extracted) = (digest(1), digest(2));
        let mut gc = Unreferenced::default();
        let start = Instant::now();
        let stored = set(&[&listed]);
        gc.expired(&stored, &set(&[]), start, GRACE);
        let removed = gc.expired(&stored, &set(&[]), start + GRACE, GRACE);
        assert_eq!(removed, [listed]);
        assert!(!removed.contains(&extracted));
        // Listed from the next pass on, it gets the full grace.
        let next = start + GRACE * 2;
        let stored = set(&[&extracted]);
        assert!(gc.expired(&stored, &set(&[]), next, GRACE).is_empty());
        assert_eq!(
            gc.expired(&stored, &set(&[]), next + GRACE, GRACE),
            [extracted]
        );
    }

    #[test]
    fn a_removed_or_vanished_digest_is_forgotten() {
        let a = digest(1);
        let mut gc = Unreferenced::default();
        let start = Instant::now();
        gc.expired(&set(&[&a]), &set(&[]), start, GRACE);
        gc.expired(&set(&[]), &set(&[]), start + GRACE / 2, GRACE);
        // Stored again: unreferenced only from now.
        let back = start + GRACE;
        assert!(gc.expired(&set(&[&a]), &set(&[]), back, GRACE).is_empty());
        gc.removed(&a);
        assert!(gc.since.is_empty());
    }
}
