//! A watch's relist, as its consumer sees it: after `Init` the watch
//! shows every object again (`InitApply`), and at `InitDone` whatever it
//! did not show is gone. [`Relist`] collects what the relist shows, so the
//! consumer drops the rest at `InitDone`; objects deleted while the watch
//! was down are never seen deleted otherwise.
//!
//! What is collected is the consumer's choice: the keys listed (a
//! [`HashSet`], with [`Relist::listed`]), or a whole index built aside and
//! swapped in at the end (answering from the old one meanwhile).
//!
//! ```
//! use std::collections::HashSet;
//! use gkm_k8s_runtime::relist::Relist;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::ResourceExt;
//! use kube::runtime::watcher::Event;
//!
//! let mut known: HashSet<String> = HashSet::from(["kept".into(), "gone".into()]);
//! let mut relist = Relist::<HashSet<String>>::default();
//! let mut kept = ConfigMap::default();
//! kept.metadata.name = Some("kept".into());
//! for event in [Event::Init, Event::InitApply(kept), Event::InitDone] {
//!     let shown = relist.observe(&event, |listed, object| {
//!         listed.insert(object.name_any());
//!     });
//!     if let Some(listed) = shown {
//!         known.retain(|name| listed.contains(name));
//!     }
//! }
//! assert_eq!(known, HashSet::from(["kept".to_string()]));
//! ```

use std::collections::HashSet;
use std::hash::Hash;

use kube::runtime::watcher;

/// What the relist under way has shown so far (`Listed`: a set of keys, an
/// index), or nothing between relists.
#[derive(Debug, Clone)]
pub struct Relist<Listed> {
    listing: Option<Listed>,
}

impl<Listed> Default for Relist<Listed> {
    fn default() -> Self {
        Relist { listing: None }
    }
}

impl<Listed: Default> Relist<Listed> {
    /// A relist starts (`Init`): nothing shown yet.
    pub fn start(&mut self) {
        self.listing = Some(Listed::default());
    }

    /// What the relist under way has shown, or `None` between relists.
    pub fn listing(&mut self) -> Option<&mut Listed> {
        self.listing.as_mut()
    }

    /// What the relist under way has shown, a relist starting when none
    /// is (an `InitApply` whose `Init` was not seen).
    pub fn listing_or_start(&mut self) -> &mut Listed {
        self.listing.get_or_insert_with(Listed::default)
    }

    /// The relist ends (`InitDone`): what it showed, or `None` when no
    /// relist was under way.
    pub fn finish(&mut self) -> Option<Listed> {
        self.listing.take()
    }

    /// Takes in one `event` of the watch: starts a relist at `Init`, hands
    /// each object an `InitApply` shows to `list` with what was shown so
    /// far, and returns what the relist showed at `InitDone`. `Apply` and
    /// `Delete` are the caller's alone.
    pub fn observe<O>(
        &mut self,
        event: &watcher::Event<O>,
        list: impl FnOnce(&mut Listed, &O),
    ) -> Option<Listed> {
        match event {
            watcher::Event::Init => {
                self.start();
                None
            }
            watcher::Event::InitApply(object) => {
                list(self.listing_or_start(), object);
                None
            }
            watcher::Event::InitDone => self.finish(),
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => None,
        }
    }
}

impl<Key: Eq + Hash> Relist<HashSet<Key>> {
    /// Remembers `key` as listed, when a relist is under way.
    pub fn listed(&mut self, key: Key) {
        if let Some(keys) = &mut self.listing {
            keys.insert(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use watcher::Event;

    #[test]
    fn a_relist_shows_what_it_listed_at_its_end_and_nothing_before() {
        let mut relist = Relist::<HashSet<&str>>::default();
        relist.listed("before");
        assert_eq!(relist.observe(&Event::<&str>::Init, |_, _| {}), None);
        fn list(keys: &mut HashSet<&'static str>, key: &&'static str) {
            keys.insert(*key);
        }
        assert_eq!(relist.observe(&Event::InitApply("a"), list), None);
        relist.listed("b");
        assert_eq!(relist.observe(&Event::Apply("c"), list), None);
        assert_eq!(
            relist.observe(&Event::<&str>::InitDone, |_, _| {}),
            Some(HashSet::from(["a", "b"]))
        );
        assert_eq!(relist.finish(), None, "between relists");
    }

    #[test]
    fn an_init_apply_without_init_starts_a_relist() {
        let mut relist = Relist::<Vec<u8>>::default();
        relist.observe(&Event::InitApply(1u8), |shown, n| shown.push(*n));
        relist.observe(&Event::InitApply(2u8), |shown, n| shown.push(*n));
        assert_eq!(relist.finish(), Some(vec![1, 2]));
    }
}
