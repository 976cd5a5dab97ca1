//! Readiness: the named conditions `/readyz` waits for
//! ([`gkm_k8s_daemon::readiness`]), and the checks that wait for the
//! apiserver to serve a resource.

use std::fmt;
use std::time::Duration;

use tracing::{debug, warn};

pub use gkm_k8s_daemon::readiness::*;

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
