//! Writes each `GKMGPUQuota`'s use into its status, when it changes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::{debug, warn};

use super::server::Extender;
use gkm_k8s_api::crd::{GKMGPUQuota, GpuModelUse};

/// Every `period`, writes the use of each quota whose use changed since it
/// was last written. Runs until the process stops.
pub async fn run(client: Client, extender: Arc<Extender>, period: Duration) {
    let mut written: HashMap<(String, String), Vec<GpuModelUse>> = HashMap::new();
    loop {
        let current = extender.read().quota_statuses();
        written.retain(|key, _| current.iter().any(|(k, _)| k == key));
        for (key, used) in current {
            if written.get(&key) == Some(&used) {
                continue;
            }
            let api: Api<GKMGPUQuota> = Api::namespaced(client.clone(), &key.0);
            let patch = json!({"status": {"used": used}});
            match api
                .patch_status(&key.1, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    debug!(namespace = %key.0, quota = %key.1, "wrote quota use");
                    written.insert(key, used);
                }
                Err(e) => {
                    warn!(namespace = %key.0, quota = %key.1, error = %e, "writing quota use")
                }
            }
        }
        tokio::time::sleep(period).await;
    }
}
