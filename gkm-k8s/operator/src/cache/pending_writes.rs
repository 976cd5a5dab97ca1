//! The status writes the controllers' caches do not show yet.
//!
//! A reconcile reads a cache from the controller's watch cache, which lags
//! the operator's own writes. Without a memory of them, a reconcile that
//! runs before its write is seen (a node report changed meanwhile) compares
//! against the stale status and writes the same status again. The operator
//! remembers its last write per object. Only the operator sets
//! `lastUpdated`, so a status whose `lastUpdated` is not newer than that
//! write's is one the cache has not brought up to date yet; while the
//! operator wants what it wrote last, the write is already done. A status
//! the operator has written since wins, so does a newer one.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use gkm_k8s_api::crd::CacheStatus;

/// The last status written per object uid.
#[derive(Default)]
pub struct PendingWrites {
    by_uid: Mutex<HashMap<String, CacheStatus>>,
}

impl PendingWrites {
    /// Whether writing `wanted` over `shown` (what the watch cache shows for
    /// the object `uid`) would only repeat the operator's last write, which
    /// the cache does not show yet. `lastUpdated` of `wanted` is ignored.
    pub fn repeats(&self, uid: &str, shown: &CacheStatus, wanted: &CacheStatus) -> bool {
        let by_uid = self.by_uid.lock().unwrap_or_else(PoisonError::into_inner);
        by_uid.get(uid).is_some_and(|written| {
            same(written, wanted) && shown.last_updated <= written.last_updated
        })
    }

    /// Remembers that `status` was written for `uid`.
    pub fn record(&self, uid: &str, status: &CacheStatus) {
        let mut by_uid = self.by_uid.lock().unwrap_or_else(PoisonError::into_inner);
        by_uid.insert(uid.to_string(), status.clone());
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
    use gkm_k8s_api::crd::CacheState;
    use jiff::Timestamp;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn status(state: CacheState, nodes: i32) -> CacheStatus {
        let mut s = CacheStatus {
            state: Some(state),
            ..CacheStatus::default()
        };
        s.counts.node_cnt = nodes;
        s
    }

    fn stamped(mut s: CacheStatus, second: i64) -> CacheStatus {
        s.last_updated = Some(Time(Timestamp::from_second(second).unwrap()));
        s
    }

    #[test]
    fn writes_the_cache_does_not_show_yet_are_not_repeated() {
        let pending = PendingWrites::default();
        let s0 = stamped(status(CacheState::Pending, 1), 100);
        let s1 = stamped(status(CacheState::Pending, 2), 101);
        let s2 = stamped(status(CacheState::Extracted, 3), 101);
        pending.record("u", &s1);
        pending.record("u", &s2);
        // The cache shows the status before both writes, or the first one.
        assert!(pending.repeats("u", &s0, &status(CacheState::Extracted, 3)));
        assert!(pending.repeats("u", &s1, &status(CacheState::Extracted, 3)));
    }

    #[test]
    fn a_different_wish_or_a_newer_status_is_written() {
        let pending = PendingWrites::default();
        let s0 = stamped(status(CacheState::Pending, 1), 100);
        let s1 = stamped(status(CacheState::Extracted, 2), 101);
        pending.record("u", &s1);
        // Another node reported meanwhile: a new status is wanted.
        assert!(!pending.repeats("u", &s0, &status(CacheState::Extracted, 3)));
        // The cache shows a status newer than the last write (another
        // operator instance wrote since).
        let newer = stamped(status(CacheState::Error, 2), 102);
        assert!(!pending.repeats("u", &newer, &s1));
        // Another object, or a forgotten one, has no memory.
        assert!(!pending.repeats("v", &s0, &s1));
        pending.forget("u");
        assert!(!pending.repeats("u", &s0, &s1));
    }
}
