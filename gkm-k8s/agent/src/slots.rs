//! Registry work shared fairly between namespaces: at most `total` reads
//! (or extractions) at once, and at most one per namespace, so that one
//! tenant's slow registry holds one slot, never all of them. Waiters are
//! served first come, first served, so a namespace with many caches queues
//! behind the others' instead of before them; how many namespaces wait for
//! a shared slot is known, so that slow work can give its slot up to them
//! ([`crate::slot_yield`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Whose work it is: a namespace, or `None` for cluster-scoped caches.
pub(crate) type Scope = Option<String>;

/// Slots for work, shared between namespaces.
pub(crate) struct FairSlots {
    total: Arc<Semaphore>,
    per_scope: Mutex<HashMap<Scope, Arc<Semaphore>>>,
    /// Callers of [`FairSlots::acquire`] that hold their scope's slot and
    /// wait for a shared one.
    waiting: AtomicUsize,
}

/// Counts a caller of [`FairSlots::acquire`] as waiting for a shared slot
/// while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Waiting<'a> {
        count.fetch_add(1, Ordering::SeqCst);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A held slot: released when dropped.
pub(crate) struct Slot {
    _scope: OwnedSemaphorePermit,
    _total: OwnedSemaphorePermit,
}

impl FairSlots {
    /// `total` slots (at least one), one per scope at most.
    pub(crate) fn new(total: usize) -> FairSlots {
        FairSlots {
            total: Arc::new(Semaphore::new(total.max(1))),
            per_scope: Mutex::new(HashMap::new()),
            waiting: AtomicUsize::new(0),
        }
    }

    /// How many scopes wait for a shared slot, holding none: those a slot
    /// given up would go to (a scope's further callers wait behind its
    /// first, and are not counted).
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Waits for `scope`'s slot, then for one of the shared ones.
    #[allow(
        clippy::expect_used,
        reason = "the semaphores are never closed, so acquiring cannot fail"
    )]
    pub(crate) async fn acquire(&self, scope: &Scope) -> Slot {
        let own = self
            .per_scope
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(scope.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(1)))
            .clone();
        // Neither semaphore is ever closed.
        let scope = own.acquire_owned().await.expect("never closed");
        let _waiting = Waiting::new(&self.waiting);
        let total = self
            .total
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        Slot {
            _scope: scope,
            _total: total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_namespace_holds_one_slot_and_others_get_the_rest() {
        let slots = Arc::new(FairSlots::new(2));
        let hostile: Scope = Some("hostile".into());
        let _held = slots.acquire(&hostile).await;
        // The hostile namespace's second read waits...
        let again = {
            let slots = slots.clone();
            let hostile = hostile.clone();
            tokio::spawn(async move { slots.acquire(&hostile).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!again.is_finished());
        // (behind its own first, not waiting for a shared slot)
        assert_eq!(slots.waiting(), 0);
        // ...while another namespace gets the other slot at once.
        let other =
            tokio::time::timeout(Duration::from_secs(1), slots.acquire(&Some("other".into())))
                .await;
        assert!(
            other.is_ok(),
            "another namespace waited for the hostile one"
        );
        // A third namespace waits for a shared slot, and is counted.
        let third = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire(&Some("third".into())).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(slots.waiting(), 1);
        third.abort();
        let _ = third.await;
        assert_eq!(slots.waiting(), 0);
        again.abort();
    }
}
