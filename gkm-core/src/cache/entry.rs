//! What every kind's entries and facts have in common: an entry is a key
//! (where its kind files it in the tree), the GPU target it was compiled
//! for and the versions its key records, with the kind's own facts behind
//! it ([`EntryFacts`]); a manifest's [`Facts`] are what a kind records beside
//! its entries. Generic code reads the common part and never a kind's
//! type; a kind reads its own facts back with [`CacheEntry::facts`] and
//! [`Facts::get`].

use std::any::Any;
use std::cmp::Ordering;
use std::fmt::Debug;
use std::sync::Arc;

use super::{Target, TritonKernel};

/// What any kind's facts (of an entry or of a whole manifest) can do
/// without knowing its type: compare, clone and be read back as their own
/// type. Implemented for every `Clone + PartialEq + Debug` type.
pub trait AnyFacts: Any + Debug + Send + Sync {
    /// These facts, to read back as their type.
    fn as_any(&self) -> &dyn Any;
    /// These facts, to change as their type.
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// Whether `other` is the same type with equal facts.
    fn eq_any(&self, other: &dyn Any) -> bool;
    /// A copy.
    fn clone_box(&self) -> Box<dyn AnyFacts>;
    /// The name of their type: what orders entries of two types.
    fn type_name(&self) -> &'static str;
}

impl<T: Any + Debug + Clone + PartialEq + Send + Sync> AnyFacts for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn eq_any(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<T>().is_some_and(|other| other == self)
    }

    fn clone_box(&self) -> Box<dyn AnyFacts> {
        Box::new(self.clone())
    }

    fn type_name(&self) -> &'static str {
        std::any::type_name::<T>()
    }
}

/// How an entry's facts order against another's without knowing its type:
/// implemented for every `Ord` type.
pub trait OrdFacts {
    /// Their order against `other`, when it is the same type.
    fn cmp_any(&self, other: &dyn Any) -> Option<Ordering>;
}

impl<T: Any + Ord> OrdFacts for T {
    fn cmp_any(&self, other: &dyn Any) -> Option<Ordering> {
        other.downcast_ref::<T>().map(|other| self.cmp(other))
    }
}

/// One entry's facts, as its kind records them: the common part every kind
/// answers, and the kind's own fields (read back with
/// [`CacheEntry::facts`]).
pub trait EntryFacts: AnyFacts + OrdFacts {
    /// Where its kind files it in the tree: a directory or file below the
    /// tree's root, `/`-separated (a Triton cache key directory, a vLLM
    /// artefact's path).
    fn key(&self) -> &str;

    /// The GPU target it was compiled for; `None` for an entry that holds
    /// no GPU code (a C++ kernel for the CPU).
    fn target(&self) -> Option<Target>;

    /// The compiler and framework versions its key records, by name
    /// (`triton`).
    fn versions(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// The Triton kernel it is, when it is one (every kind gkm knows today
    /// files Triton kernels).
    fn kernel(&self) -> Option<&TritonKernel> {
        None
    }
}

/// One entry of a cache, as `manifest.json` lists it: its common part
/// ([`key`](Self::key), [`target`](Self::target),
/// [`versions`](Self::versions)) and its kind's own facts.
#[derive(Clone)]
pub struct CacheEntry(Arc<dyn EntryFacts>);

impl CacheEntry {
    /// An entry of these facts.
    pub fn new(facts: impl EntryFacts) -> CacheEntry {
        CacheEntry(Arc::new(facts))
    }

    /// Where its kind files it in the tree ([`EntryFacts::key`]).
    pub fn key(&self) -> &str {
        self.0.key()
    }

    /// The GPU target it was compiled for ([`EntryFacts::target`]).
    pub fn target(&self) -> Option<Target> {
        self.0.target()
    }

    /// The versions its key records ([`EntryFacts::versions`]).
    pub fn versions(&self) -> Vec<(&'static str, String)> {
        self.0.versions()
    }

    /// The Triton kernel it is, when it is one ([`EntryFacts::kernel`]).
    pub fn kernel(&self) -> Option<&TritonKernel> {
        self.0.kernel()
    }

    /// Its facts as their kind's type `F`, when they are.
    pub fn facts<F: EntryFacts>(&self) -> Option<&F> {
        self.0.as_any().downcast_ref()
    }
}

impl<F: EntryFacts> From<F> for CacheEntry {
    fn from(facts: F) -> CacheEntry {
        CacheEntry::new(facts)
    }
}

impl Debug for CacheEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for CacheEntry {
    fn eq(&self, other: &CacheEntry) -> bool {
        self.0.eq_any(other.0.as_any())
    }
}

impl Eq for CacheEntry {}

impl PartialOrd for CacheEntry {
    fn partial_cmp(&self, other: &CacheEntry) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Entries of one type sort as their kind orders them; entries of two
/// types (a vLLM cache's Triton and C++ kernels) by their type's name, then
/// key: a total order, so sorting a manifest's entries is well defined.
impl Ord for CacheEntry {
    fn cmp(&self, other: &CacheEntry) -> Ordering {
        self.0.cmp_any(other.0.as_any()).unwrap_or_else(|| {
            (self.0.type_name(), self.key()).cmp(&(other.0.type_name(), other.key()))
        })
    }
}

/// What a kind records about a whole cache beside its entries (vLLM's
/// layout and artefact records, PyTorch's entry counts and declared facts):
/// empty for a kind that records nothing (Triton). Read back with
/// [`get`](Self::get) as the kind's type.
#[derive(Default)]
pub struct Facts(Option<Box<dyn AnyFacts>>);

impl Facts {
    /// No facts.
    pub fn none() -> Facts {
        Facts(None)
    }

    /// These facts.
    pub fn of(facts: impl AnyFacts) -> Facts {
        Facts(Some(Box::new(facts)))
    }

    /// The facts as their kind's type `F`, when they are.
    pub fn get<F: AnyFacts>(&self) -> Option<&F> {
        self.0.as_deref()?.as_any().downcast_ref()
    }

    /// The facts as their kind's type `F`, to change, when they are.
    pub fn get_mut<F: AnyFacts>(&mut self) -> Option<&mut F> {
        self.0.as_deref_mut()?.as_any_mut().downcast_mut()
    }

    /// Whether there are none.
    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }
}

impl Clone for Facts {
    fn clone(&self) -> Facts {
        Facts(self.0.as_ref().map(|f| f.clone_box()))
    }
}

impl Debug for Facts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(facts) => facts.fmt(f),
            None => f.write_str("None"),
        }
    }
}

impl PartialEq for Facts {
    fn eq(&self, other: &Facts) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => a.eq_any(b.as_any()),
            (None, None) => true,
            _ => false,
        }
    }
}

impl Eq for Facts {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
    struct Module(String);

    impl EntryFacts for Module {
        fn key(&self) -> &str {
            &self.0
        }
        fn target(&self) -> Option<Target> {
            None
        }
    }

    #[test]
    fn an_entry_reads_back_as_its_kinds_facts_and_compares_by_them() {
        let a = CacheEntry::new(Module("a".into()));
        let b = CacheEntry::new(Module("b".into()));
        assert_eq!(a.facts::<Module>(), Some(&Module("a".into())));
        assert_eq!(a.kernel(), None);
        assert!(a < b && a == a.clone() && a != b);
        assert_eq!(format!("{a:?}"), "Module(\"a\")");

        let mut facts = Facts::of(Module("m".into()));
        facts.get_mut::<Module>().unwrap().0.push('!');
        assert_eq!(facts.get::<Module>(), Some(&Module("m!".into())));
        assert_eq!(facts.get::<String>(), None);
        assert_ne!(facts, Facts::none());
        assert_eq!(facts.clone(), facts);
    }
}
