//! Keeping the node's ResourceSlices what the plugin publishes: written
//! with server-side apply, extra slices deleted, the pool's generation
//! bumped on every change, and all of them deleted when the plugin stops.
//!
//! The kubelet deletes a node's slices when it starts and when a driver
//! stays unregistered; the plugin watches its slices and writes them again
//! ([`watch_slices`]).

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;

use crate::devices::DraDevice;
use crate::error::{Error, Result};
use crate::slices::{PoolOwner, pool_slices, still_published};

/// The field manager of the plugin's writes.
pub const FIELD_MANAGER: &str = "gkm-dra-plugin";

/// The node's pool, published through the apiserver.
pub struct Publisher {
    slices: Api<ResourceSlice>,
    driver: String,
    node: String,
    node_uid: String,
    /// What was published last, and as which generation.
    last: Option<(Vec<DraDevice>, i64)>,
}

impl Publisher {
    /// The publisher of `driver`'s pool on node `node` (reads the Node for
    /// its UID, the slices' owner).
    pub async fn new(client: kube::Client, driver: &str, node: &str) -> Result<Publisher> {
        let found = Api::<Node>::all(client.clone())
            .get(node)
            .await
            .map_err(Error::api(format!("reading Node {node}")))?;
        Ok(Publisher {
            slices: Api::all(client),
            driver: driver.to_string(),
            node: node.to_string(),
            node_uid: found.metadata.uid.unwrap_or_default(),
            last: None,
        })
    }

    fn selector(&self) -> String {
        own_slices(&self.node, &self.driver)
    }

    async fn existing(&self) -> Result<Vec<ResourceSlice>> {
        Ok(self
            .slices
            .list(&ListParams::default().fields(&self.selector()))
            .await
            .map_err(Error::api(format!(
                "listing the ResourceSlices of node {}",
                self.node
            )))?
            .items)
    }

    /// Makes the apiserver's slices publish `devices`: nothing is written
    /// when they already do.
    pub async fn publish(&mut self, devices: &[DraDevice]) -> Result<()> {
        let existing = self.existing().await?;
        let owner = PoolOwner {
            node: &self.node,
            node_uid: &self.node_uid,
        };
        if let Some((published, generation)) = &self.last
            && published.as_slice() == devices
            && still_published(
                &existing,
                &pool_slices(&self.driver, &owner, *generation, devices),
                *generation,
            )
        {
            return Ok(());
        }
        let newest = existing
            .iter()
            .map(|s| s.spec.pool.generation)
            .chain(self.last.as_ref().map(|(_, g)| *g))
            .max()
            .unwrap_or(0);
        let generation = newest + 1;
        let desired = pool_slices(&self.driver, &owner, generation, devices);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for slice in &desired {
            let name = slice.metadata.name.clone().unwrap_or_default();
            self.slices
                .patch(&name, &params, &Patch::Apply(slice))
                .await
                .map_err(Error::api(format!("writing ResourceSlice {name}")))?;
        }
        for stale in existing
            .iter()
            .filter(|s| !desired.iter().any(|d| d.metadata.name == s.metadata.name))
        {
            self.delete(stale).await?;
        }
        tracing::info!(
            node = %self.node,
            generation,
            devices = devices.len(),
            "published the node's ResourceSlices"
        );
        self.last = Some((devices.to_vec(), generation));
        Ok(())
    }

    /// Deletes every slice of the node's pool (the plugin is stopping).
    pub async fn withdraw(&mut self) -> Result<()> {
        for slice in self.existing().await? {
            self.delete(&slice).await?;
        }
        self.last = None;
        tracing::info!(node = %self.node, "deleted the node's ResourceSlices");
        Ok(())
    }

    async fn delete(&self, slice: &ResourceSlice) -> Result<()> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        match self.slices.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(Error::api(format!("deleting ResourceSlice {name}"))(e)),
        }
    }
}

/// The field selector of `driver`'s slices of node `node`.
pub fn own_slices(node: &str, driver: &str) -> String {
    format!("spec.nodeName={node},spec.driver={driver}")
}

/// Notifies `changed` whenever a slice of `driver` on `node` changes or
/// goes (the kubelet wiping them, an administrator deleting one), until the
/// stream ends.
pub async fn watch_slices(client: kube::Client, driver: &str, node: &str, changed: &Notify) {
    let api: Api<ResourceSlice> = Api::all(client);
    let config = watcher::Config::default().fields(&own_slices(node, driver));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                changed.notify_one()
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "watching the node's ResourceSlices"),
        }
    }
}
