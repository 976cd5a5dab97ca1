//! Readiness: the named conditions `/readyz` waits for, and the checks that
//! wait for the apiserver to serve a resource.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tracing::{debug, warn};

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

/// Sets `check` once `api` answers a list: the apiserver is reachable, the
/// resource is served and this process may list it. Tries every 2 s, logging
/// what went wrong, until it succeeds.
pub async fn ready_when_listable<K>(api: kube::Api<K>, check: ReadyCheck)
where
    K: kube::Resource + Clone + fmt::Debug + serde::de::DeserializeOwned,
{
    let params = kube::api::ListParams::default().limit(1);
    let mut logged = false;
    loop {
        match api.list_metadata(&params).await {
            Ok(_) => {
                check.set(true);
                return;
            }
            Err(e) if !logged => {
                warn!(resource = %api.resource_url(), error = %e, "not ready: cannot list; retrying");
                logged = true;
            }
            Err(e) => debug!(resource = %api.resource_url(), error = %e, "not ready: cannot list"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
