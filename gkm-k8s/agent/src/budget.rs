//! Byte caps on the node store: how many bytes the store may hold in all,
//! and how many the caches of one namespace may (cluster-scoped caches
//! count as a scope of their own). Each extraction is granted, when it gets
//! its slot, the most bytes it may write without crossing either cap:
//!
//! ```text
//! min(namespace cap - the namespace's stored digests - its other grants,
//!     node cap      - every stored digest           - every other grant)
//! ```
//!
//! and gives the grant back when it ends, its tree then counting as stored.
//! A digest several namespaces use counts for each of them. Bytes are
//! counted as [`gkm_oci::tree_usage`] counts them, as the extraction counts
//! them against its budget. Pure bookkeeping: the caller measures the store
//! and runs the extractions.

use std::collections::{HashMap, HashSet};
use std::fmt;

use gkm_core::Digest;

use crate::slots::Scope;

/// The caps, in bytes; `None` for no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Caps {
    /// What the node store may hold in all.
    pub(crate) node: Option<u64>,
    /// What the caches of one namespace (or the cluster-scoped ones) may
    /// hold in the node store.
    pub(crate) namespace: Option<u64>,
}

/// Which cap limits an extraction, and how much of it is in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bound {
    /// Whose cap: a scope's, or `None` for the node store's.
    pub(crate) scope: Option<Scope>,
    /// Bytes stored, or granted to other extractions under way.
    pub(crate) used: u64,
    /// The cap.
    pub(crate) cap: u64,
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.scope {
            None => f.write_str("the node store's byte cap")?,
            Some(Some(namespace)) => write!(f, "namespace {namespace:?}'s byte cap on this node")?,
            Some(None) => f.write_str("the cluster-scoped caches' byte cap on this node")?,
        }
        write!(
            f,
            ": {} of {} bytes in use (stored, or granted to extractions under way)",
            self.used, self.cap
        )
    }
}

/// The bytes granted to one extraction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    /// Identifies the grant to [`Ledger::ended`].
    pub(crate) id: u64,
    /// The most bytes the extraction may write; `None` without caps.
    pub(crate) budget: Option<u64>,
    /// The cap that set the budget.
    pub(crate) bound: Option<Bound>,
}

/// What an extraction that got its slot may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Extract within this grant.
    Grant(Grant),
    /// Wait: what is left is granted to other extractions under way, and
    /// comes back when they end.
    Wait,
    /// Refuse: what is stored alone fills this cap.
    Refuse(Bound),
}

/// What the store holds, who uses it, and what is granted.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    caps: Caps,
    /// Bytes each stored digest takes.
    stored: HashMap<Digest, u64>,
    /// The stored digests each scope's caches (or their pods) use.
    uses: HashMap<Scope, HashSet<Digest>>,
    /// Extractions that ended since the store was listed: by when (the
    /// counter), scope, digest and bytes.
    recent: Vec<(u64, Scope, Digest, u64)>,
    /// Grants of extractions under way: by id, scope and bytes (`None`:
    /// uncapped).
    grants: HashMap<u64, (Scope, Option<u64>)>,
    /// Orders grants, ends and listings.
    counter: u64,
}

impl Ledger {
    /// A ledger under `caps`, with nothing stored yet.
    pub(crate) fn new(caps: Caps) -> Ledger {
        Ledger {
            caps,
            ..Ledger::default()
        }
    }

    /// To call just before listing the store: what [`Ledger::stored`] is
    /// then told includes the extractions that ended before.
    pub(crate) fn mark(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// What the store held when listed at `mark`: the bytes of each stored
    /// digest, and the digests each scope uses.
    pub(crate) fn stored(
        &mut self,
        mark: u64,
        stored: HashMap<Digest, u64>,
        uses: HashMap<Scope, HashSet<Digest>>,
    ) {
        self.stored = stored;
        self.uses = uses;
        self.recent.retain(|(when, ..)| *when > mark);
    }

    /// Bytes of the digests `scope` uses, and of every stored digest,
    /// counting the extractions ended since the last listing.
    fn stored_bytes(&self, scope: &Scope) -> (u64, u64) {
        let mut bytes = self.stored.clone();
        let mut own: HashSet<&Digest> = self.uses.get(scope).into_iter().flatten().collect();
        for (_, whose, digest, size) in &self.recent {
            bytes.insert(digest.clone(), *size);
            if whose == scope {
                own.insert(digest);
            }
        }
        let of = |d: &Digest| bytes.get(d).copied().unwrap_or(0);
        let scope_bytes = own.iter().map(|d| of(d)).fold(0, u64::saturating_add);
        let node_bytes = bytes.values().copied().fold(0, u64::saturating_add);
        (scope_bytes, node_bytes)
    }

    /// Decides, for an extraction of `scope` that got its slot, how many
    /// bytes it may write, and records the grant.
    pub(crate) fn grant(&mut self, scope: &Scope) -> Decision {
        let (scope_stored, node_stored) = self.stored_bytes(scope);
        let granted = |same: bool| {
            self.grants
                .values()
                .filter(|(s, _)| !same || s == scope)
                .filter_map(|(_, bytes)| *bytes)
                .fold(0, u64::saturating_add)
        };
        let limits = [
            self.caps.namespace.map(|cap| {
                (
                    Some(scope.clone()),
                    cap,
                    scope_stored,
                    scope_stored.saturating_add(granted(true)),
                )
            }),
            self.caps.node.map(|cap| {
                (
                    None,
                    cap,
                    node_stored,
                    node_stored.saturating_add(granted(false)),
                )
            }),
        ];
        let mut bound: Option<Bound> = None;
        for (whose, cap, stored, used) in limits.into_iter().flatten() {
            if stored >= cap {
                return Decision::Refuse(Bound {
                    scope: whose,
                    used: stored,
                    cap,
                });
            }
            if bound
                .as_ref()
                .is_none_or(|b| cap - used.min(cap) < b.cap - b.used)
            {
                bound = Some(Bound {
                    scope: whose,
                    used: used.min(cap),
                    cap,
                });
            }
        }
        let budget = bound.as_ref().map(|b| b.cap - b.used);
        if budget == Some(0) {
            return Decision::Wait;
        }
        self.counter += 1;
        let id = self.counter;
        self.grants.insert(id, (scope.clone(), budget));
        Decision::Grant(Grant { id, budget, bound })
    }

    /// Gives back grant `id`; `stored` is what the extraction left in the
    /// store (its digest and bytes), counted for its scope from now on.
    pub(crate) fn ended(&mut self, id: u64, stored: Option<(Digest, u64)>) {
        let Some((scope, _)) = self.grants.remove(&id) else {
            return;
        };
        if let Some((digest, bytes)) = stored {
            self.counter += 1;
            self.recent.push((self.counter, scope, digest, bytes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;

    fn digest(n: u8) -> Digest {
        format!("sha256:{}", format!("{n:02x}").repeat(32))
            .parse()
            .unwrap()
    }

    fn ns(name: &str) -> Scope {
        Some(name.to_string())
    }

    fn granted(decision: Decision) -> Grant {
        match decision {
            Decision::Grant(grant) => grant,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn without_caps_extractions_are_unbounded() {
        let mut ledger = Ledger::new(Caps::default());
        let grant = granted(ledger.grant(&ns("a")));
        assert_eq!((grant.budget, grant.bound), (None, None));
    }

    #[test]
    fn a_namespace_gets_what_its_stored_digests_leave_of_its_cap() {
        let mut ledger = Ledger::new(Caps {
            node: None,
            namespace: Some(100 * KIB),
        });
        let mark = ledger.mark();
        ledger.stored(
            mark,
            HashMap::from([(digest(1), 60 * KIB), (digest(2), 30 * KIB)]),
            HashMap::from([(ns("a"), HashSet::from([digest(1)]))]),
        );
        let grant = granted(ledger.grant(&ns("a")));
        assert_eq!(grant.budget, Some(40 * KIB));
        let bound = grant.bound.unwrap();
        assert_eq!(
            bound.to_string(),
            format!(
                "namespace \"a\"'s byte cap on this node: {} of {} bytes in use (stored, or granted to extractions under way)",
                60 * KIB,
                100 * KIB
            )
        );
        // Another namespace's digests are not this one's.
        assert_eq!(granted(ledger.grant(&ns("b"))).budget, Some(100 * KIB));
    }

    #[test]
    fn a_namespace_whose_stored_digests_fill_its_cap_is_refused() {
        let mut ledger = Ledger::new(Caps {
            node: None,
            namespace: Some(100 * KIB),
        });
        let mark = ledger.mark();
        // A digest two namespaces use counts for each.
        ledger.stored(
            mark,
            HashMap::from([(digest(1), 100 * KIB)]),
            HashMap::from([
                (ns("a"), HashSet::from([digest(1)])),
                (None, HashSet::from([digest(1)])),
            ]),
        );
        for scope in [ns("a"), None] {
            assert_eq!(
                ledger.grant(&scope),
                Decision::Refuse(Bound {
                    scope: Some(scope.clone()),
                    used: 100 * KIB,
                    cap: 100 * KIB
                })
            );
        }
        assert!(matches!(ledger.grant(&ns("b")), Decision::Grant(_)));
    }

    #[test]
    fn an_ended_extraction_counts_before_the_store_is_listed_again() {
        let mut ledger = Ledger::new(Caps {
            node: None,
            namespace: Some(100 * KIB),
        });
        let first = granted(ledger.grant(&ns("a")));
        assert_eq!(first.budget, Some(100 * KIB));
        ledger.ended(first.id, Some((digest(1), 70 * KIB)));
        // The next extraction of the namespace sees it at once...
        assert_eq!(granted(ledger.grant(&ns("a"))).budget, Some(30 * KIB));
        // ...and a listing taken before it ended does not forget it.
        let mut ledger = Ledger::new(ledger.caps);
        let mark = ledger.mark();
        let first = granted(ledger.grant(&ns("a")));
        ledger.ended(first.id, Some((digest(1), 70 * KIB)));
        ledger.stored(mark, HashMap::new(), HashMap::new());
        assert_eq!(granted(ledger.grant(&ns("a"))).budget, Some(30 * KIB));
        // A listing taken after it ended replaces it.
        let mark = ledger.mark();
        ledger.stored(mark, HashMap::new(), HashMap::new());
        let grants: Vec<u64> = ledger.grants.keys().copied().collect();
        for id in grants {
            ledger.ended(id, None);
        }
        assert_eq!(granted(ledger.grant(&ns("a"))).budget, Some(100 * KIB));
    }

    #[test]
    fn the_node_cap_counts_every_namespace_and_every_grant() {
        let mut ledger = Ledger::new(Caps {
            node: Some(300 * KIB),
            namespace: Some(200 * KIB),
        });
        let mark = ledger.mark();
        ledger.stored(
            mark,
            HashMap::from([(digest(1), 150 * KIB)]),
            HashMap::from([(ns("a"), HashSet::from([digest(1)]))]),
        );
        // The node's 150 KiB left is less than b's namespace cap.
        let b = granted(ledger.grant(&ns("b")));
        assert_eq!(b.budget, Some(150 * KIB));
        assert_eq!(b.bound.as_ref().unwrap().scope, None);
        assert!(
            b.bound
                .unwrap()
                .to_string()
                .starts_with("the node store's byte cap: 153600 of 307200")
        );
        // All of it is granted: c waits for b rather than being refused...
        assert_eq!(ledger.grant(&ns("c")), Decision::Wait);
        // ...and, once b stored 150 KiB, is refused: the store is full.
        ledger.ended(b.id, Some((digest(2), 150 * KIB)));
        assert_eq!(
            ledger.grant(&ns("c")),
            Decision::Refuse(Bound {
                scope: None,
                used: 300 * KIB,
                cap: 300 * KIB
            })
        );
    }

    #[test]
    fn a_failed_extraction_gives_its_grant_back() {
        let mut ledger = Ledger::new(Caps {
            node: Some(100 * KIB),
            namespace: None,
        });
        let a = granted(ledger.grant(&ns("a")));
        assert_eq!(ledger.grant(&ns("b")), Decision::Wait);
        ledger.ended(a.id, None);
        assert_eq!(granted(ledger.grant(&ns("b"))).budget, Some(100 * KIB));
    }
}
