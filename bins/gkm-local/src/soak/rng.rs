//! The soak's only source of chance: SplitMix64, seeded, so a seed replays
//! the same schedule of faults and workload steps.

/// A seeded pseudo-random stream (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A stream starting at `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// A second stream derived from this seed and `salt`, independent of
    /// how much of this one was used (the workload's and the faults').
    pub fn fork(seed: u64, salt: u64) -> Rng {
        let mut mixer = Rng::new(seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Rng::new(mixer.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `low..=high` (`low` when the range is empty).
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        if high <= low {
            return low;
        }
        low + self.next_u64() % (high - low + 1)
    }

    /// One of `items`, or `None` when there are none.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            return None;
        }
        let index = self.next_u64() % items.len() as u64;
        items.get(index as usize)
    }
}

/// A seed from the clock, for runs that were not given one.
pub fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    Rng::new(nanos ^ u64::from(std::process::id())).next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_replays_the_same_stream() {
        let a: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(42);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(42);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(Rng::new(43).next_u64(), a[0]);
    }

    #[test]
    fn forked_streams_differ_and_stay_in_range() {
        let mut faults = Rng::fork(7, 1);
        let mut work = Rng::fork(7, 2);
        assert_ne!(faults.next_u64(), work.next_u64());
        for _ in 0..1000 {
            let n = faults.between(5, 9);
            assert!((5..=9).contains(&n), "{n}");
        }
        assert_eq!(faults.between(3, 3), 3);
        assert_eq!(faults.pick::<u8>(&[]), None);
    }
}
