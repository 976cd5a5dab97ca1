//! Whether a cache follows its tag to a new digest. Pure: the reconcile
//! resolves and verifies, asks [`decide`], and writes what it says.
//!
//! The rules, for a cache whose spec is unchanged since it was last served:
//! - a tag moved to a digest that is not deliverable (not verified under
//!   Enforce) is not followed: the cache keeps serving the digest it served,
//!   re-verified as usual, and says why (condition `TagFollowed` false,
//!   reason `NotVerified`), so new pods keep getting a verified image;
//! - a tag moved back to a digest the cache served before and moved away
//!   from is a rollback, and is not followed even when that digest is
//!   signed (reason `RolledBack`): whoever can push the tag cannot bring a
//!   replaced (say, vulnerable) image back. Going back is a decision of whoever may
//!   edit the cache: naming the digest (`image@sha256:…`) or another tag
//!   changes `spec.image`, which starts a new history;
//! - a digest in `spec.quarantine` is never served (reason `Quarantined`),
//!   whether the tag moved to it or the cache was serving it: the cache
//!   serves the last digest it served that is not quarantined (the one it
//!   serves, or else the most recent one it moved away from), re-verified,
//!   or nothing. Quarantine is a decision of whoever may edit the cache, as
//!   naming a digest is, so it may bring a replaced digest back.
//!
//! The digests a cache moved away from are kept, per `spec.image`, in the
//! cache's annotation [`HISTORY_ANNOTATION`] (the most recent
//! [`HISTORY_LIMIT`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The annotation holding the digests a cache moved away from.
pub const HISTORY_ANNOTATION: &str = "gkm.io/replaced-digests";
/// How many replaced digests are remembered.
pub const HISTORY_LIMIT: usize = 32;

/// The digests a cache moved away from while its `spec.image` was `image`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// The `spec.image` they were served for.
    pub image: String,
    /// Oldest first.
    pub replaced: Vec<String>,
}

impl History {
    /// The history of `image` recorded in `annotations`; empty when there
    /// is none, it is for another image, or it cannot be read.
    pub fn of(annotations: &BTreeMap<String, String>, image: &str) -> History {
        annotations
            .get(HISTORY_ANNOTATION)
            .and_then(|text| serde_json::from_str::<History>(text).ok())
            .filter(|h| h.image == image)
            .unwrap_or_else(|| History {
                image: image.to_string(),
                replaced: Vec::new(),
            })
    }

    /// The history after moving from `from` to `to`.
    pub fn moved(&self, from: &str, to: &str) -> History {
        let mut replaced: Vec<String> = self
            .replaced
            .iter()
            .filter(|d| *d != from && *d != to)
            .cloned()
            .collect();
        replaced.push(from.to_string());
        let excess = replaced.len().saturating_sub(HISTORY_LIMIT);
        replaced.drain(..excess);
        History {
            image: self.image.clone(),
            replaced,
        }
    }

    /// The digests it moved away from, the most recent first: what a
    /// quarantine may fall back to.
    pub fn most_recent_first(&self) -> impl Iterator<Item = &str> {
        self.replaced.iter().rev().map(String::as_str)
    }

    /// The annotation's value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Why a tag's new digest is not followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// It is not deliverable; `why` is the verdict's message.
    NotVerified {
        /// The digest the tag points at.
        digest: String,
        /// Why it is not deliverable.
        why: String,
    },
    /// The cache served it before and moved away from it.
    RolledBack {
        /// The digest the tag points at.
        digest: String,
    },
    /// It is in `spec.quarantine`.
    Quarantined {
        /// The digest the tag points at.
        digest: String,
    },
}

impl Hold {
    /// The `TagFollowed` condition's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Hold::NotVerified { .. } => "NotVerified",
            Hold::RolledBack { .. } => "RolledBack",
            Hold::Quarantined { .. } => "Quarantined",
        }
    }

    /// What the `TagFollowed` condition says, `serving` being the digest
    /// the cache stays on (none when it has none to stay on).
    pub fn message(&self, serving: Option<&str>) -> String {
        let staying = match serving {
            Some(d) => format!("still serving {d}, the last verified digest"),
            None => "nothing is served".to_string(),
        };
        match self {
            Hold::NotVerified { digest, why } => {
                format!("the tag now points at {digest}, which is not verified ({why}); {staying}")
            }
            Hold::RolledBack { digest } => format!(
                "the tag moved back to {digest}, which this cache already replaced: a rollback is not followed (name the digest in spec.image to go back on purpose); {staying}"
            ),
            Hold::Quarantined { digest } => format!(
                "the tag points at {digest}, which spec.quarantine holds: no node serves it to new pods (pods already running keep their view); {staying}"
            ),
        }
    }
}

/// What to serve when the tag points at `new`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Serve `new`.
    Follow,
    /// Keep serving what the cache served (when there is something).
    Hold(Hold),
}

/// Whether to follow the tag to `new` (deliverable or not, with `why` when
/// not), given the digest the cache serves (`current`: deliverable, under
/// an unchanged spec), its history and whether a digest is quarantined.
pub fn decide(
    new: &str,
    deliverable: bool,
    why: &str,
    current: Option<&str>,
    history: &History,
    quarantined: impl Fn(&str) -> bool,
) -> Decision {
    if quarantined(new) {
        return Decision::Hold(Hold::Quarantined {
            digest: new.to_string(),
        });
    }
    if current == Some(new) {
        return Decision::Follow;
    }
    if history.replaced.iter().any(|d| d == new) {
        return Decision::Hold(Hold::RolledBack {
            digest: new.to_string(),
        });
    }
    if !deliverable && current.is_some() {
        return Decision::Hold(Hold::NotVerified {
            digest: new.to_string(),
            why: why.to_string(),
        });
    }
    Decision::Follow
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMAGE: &str = "r/c:v1";

    fn history(replaced: &[&str]) -> History {
        History {
            image: IMAGE.into(),
            replaced: replaced.iter().map(|d| d.to_string()).collect(),
        }
    }

    #[test]
    fn an_unverified_move_or_a_rollback_is_not_followed() {
        let none = history(&[]);
        assert_eq!(
            decide("a", true, "", None, &none, |_| false),
            Decision::Follow
        );
        assert_eq!(
            decide("a", true, "", Some("a"), &none, |_| false),
            Decision::Follow
        );
        assert_eq!(
            decide("b", true, "", Some("a"), &none, |_| false),
            Decision::Follow
        );
        assert_eq!(
            decide("b", false, "no signature", Some("a"), &none, |_| false),
            Decision::Hold(Hold::NotVerified {
                digest: "b".into(),
                why: "no signature".into()
            })
        );
        // Nothing served yet: an unverified digest is followed, and its
        // verdict refuses it.
        assert_eq!(
            decide("b", false, "x", None, &none, |_| false),
            Decision::Follow
        );
        let moved = none.moved("a", "b");
        assert_eq!(
            decide("a", true, "", Some("b"), &moved, |_| false),
            Decision::Hold(Hold::RolledBack { digest: "a".into() })
        );
        assert_eq!(
            decide("a", true, "", None, &moved, |_| false),
            Decision::Hold(Hold::RolledBack { digest: "a".into() })
        );
    }

    #[test]
    fn a_quarantined_digest_is_held_whether_new_served_or_signed() {
        let none = history(&[]);
        let bad = |d: &str| d == "b";
        let held = Decision::Hold(Hold::Quarantined { digest: "b".into() });
        assert_eq!(decide("b", true, "", Some("a"), &none, bad), held);
        assert_eq!(decide("b", true, "", Some("b"), &none, bad), held);
        assert_eq!(decide("b", true, "", None, &none, bad), held);
        assert_eq!(
            decide("a", true, "", Some("b"), &none, bad),
            Decision::Follow
        );
        let moved = none.moved("a", "b").moved("b", "c");
        assert_eq!(moved.most_recent_first().collect::<Vec<_>>(), ["b", "a"]);
        let message = Hold::Quarantined { digest: "b".into() }.message(Some("a"));
        assert!(
            message.contains("spec.quarantine holds")
                && message.contains("still serving a, the last verified digest"),
            "{message}"
        );
    }

    #[test]
    fn the_history_is_per_image_bounded_and_survives_the_annotation() {
        let mut h = history(&[]);
        for i in 0..HISTORY_LIMIT + 5 {
            h = h.moved(&format!("d{i}"), &format!("d{}", i + 1));
        }
        assert_eq!(h.replaced.len(), HISTORY_LIMIT);
        assert_eq!(
            h.replaced.last().map(String::as_str),
            Some(format!("d{}", HISTORY_LIMIT + 4).as_str())
        );
        let annotations = BTreeMap::from([(HISTORY_ANNOTATION.to_string(), h.to_annotation())]);
        assert_eq!(History::of(&annotations, IMAGE), h);
        assert!(History::of(&annotations, "r/c:v2").replaced.is_empty());
        let garbled = BTreeMap::from([(HISTORY_ANNOTATION.to_string(), "[".to_string())]);
        assert!(History::of(&garbled, IMAGE).replaced.is_empty());
        // Moving to a digest drops it from the history.
        assert_eq!(history(&["a", "b"]).moved("c", "a").replaced, ["b", "c"]);
    }
}
