//! What the CSI tests share: fixture caches extracted into a real node store,
//! the driver served on a unix socket in this process, gRPC clients over it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use gkm_core::CacheKey;
use gkm_k8s_csi::{Driver, DriverConfig, serve_csi};
use gkm_k8s_kubelet::proto::csi::identity_client::IdentityClient;
use gkm_k8s_kubelet::proto::csi::node_client::NodeClient;
use gkm_oci::{BuildOptions, Digest, ExtractPolicy, ImageRef, RegistryOptions, Repo, Store, build};
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// Build the fixture cache `name` into an OCI layout under `work` and
/// extract it into the store at `store_root`, as the agent does; its digest.
pub async fn extract_fixture(work: &Path, store_root: &Path, name: &str) -> Digest {
    let dest: ImageRef = format!("oci:{}/layout:{name}", work.display())
        .parse()
        .expect("image ref");
    let opts = RegistryOptions::default();
    let built = build(
        &gkm_testenv::fixture_cache(name),
        &dest,
        &BuildOptions::default(),
        &opts,
    )
    .await
    .expect("build image");
    let store = Store::open(store_root)
        .expect("open store")
        .with_durability(false);
    let repo = Repo::open(&dest, &opts).expect("open layout");
    let stored = store
        .ensure(&repo, &ExtractPolicy::default(), None)
        .await
        .expect("extract");
    assert_eq!(stored.digest, built.digest);
    stored.digest
}

/// A `GKMCache` key.
pub fn gkmcache(ns: &str, name: &str) -> CacheKey {
    CacheKey::namespaced(ns, name)
}

/// A `ClusterGKMCache` key.
pub fn cluster_cache(name: &str) -> CacheKey {
    CacheKey::cluster(name)
}

/// The driver, serving on a socket until dropped.
pub struct RunningDriver {
    pub socket: PathBuf,
    /// The counts the driver serves on `/metrics` ([`metrics_text`]).
    pub metrics: gkm_k8s_csi::CsiMetrics,
    stop: Option<oneshot::Sender<()>>,
}

/// What a driver with `metrics` over the store at `store_root` serves on
/// `/metrics` now, in Prometheus' text form.
// Not every test binary reads the metrics.
#[allow(dead_code)]
pub fn metrics_text(metrics: &gkm_k8s_csi::CsiMetrics, store_root: &Path) -> String {
    let mut registry = prometheus_client::registry::Registry::with_prefix("gkm");
    registry.register_collector(Box::new(gkm_k8s_csi::CsiCollector::new(
        metrics.clone(),
        store_root,
    )));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoding metrics");
    text
}

impl Drop for RunningDriver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The views the drivers of the tests allow: the defaults, but for the
/// free-space reserve of relocation layers (gkm_testenv::CSI_KEEP_FREE).
pub fn views_config() -> gkm_k8s_csi::ViewsConfig {
    let mut views = gkm_k8s_csi::ViewsConfig::default();
    views.relocation.keep_free = gkm_testenv::CSI_KEEP_FREE
        .parse()
        .expect("the tests' reserve");
    views
}

/// Serve the driver for node `node` and store `store_root` on `socket`.
pub async fn start_driver(socket: &Path, node: &str, store_root: &Path) -> RunningDriver {
    let config = DriverConfig {
        node_name: node.into(),
        store_root: store_root.to_path_buf(),
        capture: gkm_k8s_csi::CaptureConfig::default(),
        views: views_config(),
    };
    let driver = Driver::new(&config).expect("driver");
    let metrics = driver.node.metrics().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let path = socket.to_path_buf();
    tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        if let Err(e) = serve_csi(&path, driver, shutdown).await {
            eprintln!("serve_csi: {e}");
        }
    });
    RunningDriver {
        socket: socket.to_path_buf(),
        metrics,
        stop: Some(stop),
    }
}

/// A gRPC channel to the unix socket `socket`, retried until it answers.
pub async fn connect(socket: &Path) -> Channel {
    gkm_k8s_kubelet::socket::connect(socket, Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e:?}", socket.display()))
}

/// Node and Identity clients of the driver at `socket`.
pub async fn clients(socket: &Path) -> (NodeClient<Channel>, IdentityClient<Channel>) {
    let channel = connect(socket).await;
    (
        NodeClient::new(channel.clone()),
        IdentityClient::new(channel),
    )
}
