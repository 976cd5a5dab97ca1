//! The status writes the controllers' caches do not show yet.
//!
//! A reconcile reads a cache from the controller's watch cache, which lags
//! the operator's own writes. Without a memory of them, a reconcile that
//! runs before its write is seen (a node report changed meanwhile) compares
//! against the stale status and writes the same status again. Each write is
//! remembered with the status it replaced; while the cache still shows
//! exactly that status and the operator wants what it wrote, the write is
//! already done. Any other change to the status (by anyone) ends the memory
//! for that object.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::crd::CacheStatus;

/// Status writes per object uid, until the watch cache shows them.
#[derive(Default)]
pub struct PendingWrites {
    by_uid: Mutex<HashMap<String, Written>>,
}

struct Written {
    /// The status the object showed when it was written.
    replaced: CacheStatus,
    /// The status written.
    status: CacheStatus,
}

impl PendingWrites {
    /// Whether writing `wanted` over `shown` (what the watch cache shows for
    /// the object `uid`) would only repeat a write the cache does not show
    /// yet. `lastUpdated` is ignored on both sides.
    pub fn repeats(&self, uid: &str, shown: &CacheStatus, wanted: &CacheStatus) -> bool {
        let by_uid = self.by_uid.lock().unwrap_or_else(PoisonError::into_inner);
        by_uid
            .get(uid)
            .is_some_and(|w| same(&w.replaced, shown) && same(&w.status, wanted))
    }

    /// Remembers that `status` was written over `replaced` for `uid`.
    pub fn record(&self, uid: &str, replaced: &CacheStatus, status: &CacheStatus) {
        let mut by_uid = self.by_uid.lock().unwrap_or_else(PoisonError::into_inner);
        by_uid.insert(
            uid.to_string(),
            Written {
                replaced: replaced.clone(),
                status: status.clone(),
            },
        );
    }

    /// Forgets `uid` (its object is gone).
    pub fn forget(&self, uid: &str) {
        let mut by_uid = self.by_uid.lock().unwrap_or_else(PoisonError::into_inner);
        by_uid.remove(uid);
    }
}

/// Equal but for `lastUpdated`.
fn same(a: &CacheStatus, b: &CacheStatus) -> bool {
    let unstamped = |s: &CacheStatus| CacheStatus {
        last_updated: None,
        ..s.clone()
    };
    unstamped(a) == unstamped(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::CacheState;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn status(state: CacheState, nodes: i32) -> CacheStatus {
        let mut s = CacheStatus {
            state: Some(state),
            ..CacheStatus::default()
        };
        s.counts.node_cnt = nodes;
        s
    }

    fn stamped(mut s: CacheStatus) -> CacheStatus {
        s.last_updated = Some(Time(Timestamp::now()));
        s
    }

    #[test]
    fn a_write_the_cache_does_not_show_yet_is_not_repeated() {
        let pending = PendingWrites::default();
        let before = status(CacheState::Pending, 1);
        let written = stamped(status(CacheState::Extracted, 2));
        pending.record("u", &before, &written);
        // The watch cache still shows `before`; the same status is wanted.
        assert!(pending.repeats("u", &before, &status(CacheState::Extracted, 2)));
    }

    #[test]
    fn a_different_wish_or_a_changed_object_is_written() {
        let pending = PendingWrites::default();
        let before = status(CacheState::Pending, 1);
        let written = status(CacheState::Extracted, 2);
        pending.record("u", &before, &written);
        // Another node reported meanwhile: a new status is wanted.
        assert!(!pending.repeats("u", &before, &status(CacheState::Extracted, 3)));
        // Someone else changed the status: write again.
        assert!(!pending.repeats("u", &status(CacheState::Error, 1), &written));
        // Another object, or a forgotten one, has no memory.
        assert!(!pending.repeats("v", &before, &written));
        pending.forget("u");
        assert!(!pending.repeats("u", &before, &written));
    }
}
