//! Device health for the kubelet (`v1alpha1.DRAResourceHealth`, the
//! `ResourceHealthStatus` feature, beta and on by default in kubelet
//! 1.36): the kubelet opens `NodeWatchResources` on the DRA socket and
//! shows what the plugin reports in the status of pods using the devices
//! (`status.containerStatuses[].allocatedResourcesStatus`).
//!
//! A device the plugin has published and that is no longer healthy on the
//! node (its `/dev/vfio/<group>` or `/dev/nvidia<N>` went, its group lost
//! viability, it left the node) is reported `UNHEALTHY` with the reason,
//! while it also leaves the ResourceSlice so nothing new is allocated on
//! it. Reports are sent when the devices change and at least every
//! [`REPORT_EVERY`], well within the kubelet's health timeout.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::devices::NodeDevices;
use crate::proto::health::dra_resource_health_server::DraResourceHealth;
use crate::proto::health::{
    DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesRequest,
    NodeWatchResourcesResponse,
};

/// How often the health of every device is reported again when nothing
/// changes (the kubelet marks a device `Unknown` after
/// [`HEALTH_TIMEOUT`] without a report).
pub const REPORT_EVERY: Duration = Duration::from_secs(10);
/// The timeout the plugin asks the kubelet to apply to its reports.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(60);

/// One device's health, as reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// Its name in the pool.
    pub device: String,
    /// Whether it can be used.
    pub healthy: bool,
    /// Why not, when it cannot.
    pub message: String,
}

/// The devices this plugin has published and their IDs on the node: what
/// it reports on, even once they are gone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known(BTreeMap<String, String>);

impl Known {
    /// Remembers the devices of `now`.
    pub fn learn(&mut self, now: &NodeDevices) {
        for device in &now.devices {
            self.0.insert(device.name.clone(), device.id.clone());
        }
    }

    /// Every known device's health in `now`: healthy when published, else
    /// unhealthy with the reason it was left out (or that it is gone).
    pub fn health(&self, now: &NodeDevices) -> Vec<Health> {
        self.0
            .iter()
            .map(|(name, id)| {
                if now.device(name).is_some() {
                    return Health {
                        device: name.clone(),
                        healthy: true,
                        message: String::new(),
                    };
                }
                let message = now
                    .excluded
                    .iter()
                    .find(|e| &e.device == id)
                    .map(|e| e.reason.clone())
                    .unwrap_or_else(|| format!("{id} is no longer on the node"));
                Health {
                    device: name.clone(),
                    healthy: false,
                    message,
                }
            })
            .collect()
    }
}

/// The health service for pool `pool`, following the node's devices. The
/// devices it knows are shared by every stream, so a kubelet that
/// reconnects still hears about a device that went before.
#[derive(Clone)]
pub struct HealthService {
    pool: String,
    devices: watch::Receiver<NodeDevices>,
    known: Arc<Mutex<Known>>,
}

impl HealthService {
    /// The service reporting on `devices` (the node's devices now) in pool
    /// `pool`.
    pub fn new(pool: &str, devices: watch::Receiver<NodeDevices>) -> HealthService {
        let mut known = Known::default();
        known.learn(&devices.borrow());
        HealthService {
            pool: pool.to_string(),
            devices,
            known: Arc::new(Mutex::new(known)),
        }
    }
}

fn response(pool: &str, health: Vec<Health>) -> NodeWatchResourcesResponse {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    NodeWatchResourcesResponse {
        devices: health
            .into_iter()
            .map(|h| DeviceHealth {
                device: Some(DeviceIdentifier {
                    pool_name: pool.to_string(),
                    device_name: h.device,
                }),
                health: if h.healthy {
                    HealthStatus::Healthy
                } else {
                    HealthStatus::Unhealthy
                } as i32,
                last_updated_time: now,
                health_check_timeout_seconds: HEALTH_TIMEOUT.as_secs() as i64,
                message: h.message,
            })
            .collect(),
    }
}

type HealthStream = Pin<Box<dyn Stream<Item = Result<NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _request: Request<NodeWatchResourcesRequest>,
    ) -> Result<Response<HealthStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut devices = self.devices.clone();
        let (pool, known) = (self.pool.clone(), self.known.clone());
        tokio::spawn(async move {
            loop {
                let now = devices.borrow_and_update().clone();
                let health = {
                    let mut known = known.lock().unwrap_or_else(|e| e.into_inner());
                    known.learn(&now);
                    known.health(&now)
                };
                for h in health.iter().filter(|h| !h.healthy) {
                    tracing::debug!(device = %h.device, reason = %h.message, "reporting unhealthy");
                }
                if tx.send(Ok(response(&pool, health))).await.is_err() {
                    return; // The kubelet closed the stream.
                }
                tokio::select! {
                    changed = devices.changed() => if changed.is_err() { return },
                    () = tokio::time::sleep(REPORT_EVERY) => {}
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
