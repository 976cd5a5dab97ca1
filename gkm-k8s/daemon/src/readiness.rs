//! Readiness: the named conditions `/readyz` waits for (the checks that
//! wait for the apiserver to serve a resource are `gkm_k8s_runtime`'s).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The named conditions `/readyz` waits for. Clones share the same checks.
#[derive(Clone, Default)]
pub struct Readiness {
    checks: Arc<Mutex<Vec<(String, ReadyCheck)>>>,
}

/// One readiness condition, not ready until [`ReadyCheck::set`] says so.
#[derive(Clone, Default)]
pub struct ReadyCheck {
    ready: Arc<AtomicBool>,
}

impl ReadyCheck {
    /// Marks the condition ready or not ready.
    pub fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Whether the condition is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

impl Readiness {
    /// Registers a condition named `name`, initially not ready, and returns
    /// the handle that sets it.
    pub fn check(&self, name: impl Into<String>) -> ReadyCheck {
        let check = ReadyCheck::default();
        self.lock().push((name.into(), check.clone()));
        check
    }

    /// Whether every registered condition is ready.
    pub fn is_ready(&self) -> bool {
        self.lock().iter().all(|(_, check)| check.is_ready())
    }

    /// The `/readyz` body: one `[+]name ok` or `[-]name not ready` line per
    /// check (only the failing ones unless `verbose`), then the verdict.
    pub(super) fn report(&self, verbose: bool) -> (bool, String) {
        let checks = self.lock();
        let ready = checks.iter().all(|(_, check)| check.is_ready());
        let mut body = String::new();
        for (name, check) in checks.iter() {
            match check.is_ready() {
                true if verbose => body.push_str(&format!("[+]{name} ok\n")),
                true => {}
                false => body.push_str(&format!("[-]{name} not ready\n")),
            }
        }
        body.push_str(if ready {
            "ok\n"
        } else {
            "readyz check failed\n"
        });
        (ready, body)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, ReadyCheck)>> {
        // The list is only ever pushed to, so a poisoned lock still holds a
        // consistent list.
        self.checks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
