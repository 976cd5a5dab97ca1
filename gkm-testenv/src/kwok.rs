//! kwok: simulated nodes and pod lifecycles against a real apiserver.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::binaries::{Component, find_binary};
use crate::control_plane::ControlPlane;
use crate::process::Process;

/// The annotation that hands a Node to kwok.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// A kwok process managing the Nodes annotated `kwok.x-k8s.io/node: fake`:
/// they become Ready and keep heartbeating, and pods bound to them run.
/// Stopped when dropped.
pub struct Kwok {
    process: Process,
}

impl Kwok {
    /// Starts kwok against `plane` (as its admin).
    pub fn start(plane: &ControlPlane) -> anyhow::Result<Kwok> {
        let mut cmd = Command::new(find_binary(Component::Kwok)?);
        cmd.arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
            .arg("--manage-all-nodes=false")
            .arg(format!(
                "--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake"
            ))
            .arg("--node-lease-duration-seconds=40")
            .arg("--cidr=10.244.0.1/16")
            .arg("--node-ip=127.0.0.1");
        let process = Process::spawn("kwok", cmd, &plane.dir().join("kwok.log"))?;
        Ok(Kwok { process })
    }

    /// Creates a simulated Node with `labels` and `capacity` (e.g.
    /// `nvidia.com/gpu: "1"`) and waits until kwok reports it Ready.
    pub async fn create_node(
        &mut self,
        client: &kube::Client,
        name: &str,
        labels: &BTreeMap<String, String>,
        capacity: &BTreeMap<String, String>,
    ) -> anyhow::Result<Node> {
        let mut resources: BTreeMap<String, String> =
            [("cpu", "16"), ("memory", "64Gi"), ("pods", "110")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        resources.extend(capacity.clone());
        let mut all_labels = labels.clone();
        all_labels.insert("kubernetes.io/hostname".into(), name.into());
        all_labels.insert("type".into(), "kwok".into());
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "labels": all_labels,
                "annotations": { KWOK_NODE_ANNOTATION: "fake" },
            },
            "spec": { "taints": [] },
            "status": { "capacity": resources, "allocatable": resources },
        }))?;
        let nodes: Api<Node> = Api::all(client.clone());
        nodes.create(&PostParams::default(), &node).await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.process.check_running()?;
            let current = nodes.get(name).await?;
            let ready = current
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                return Ok(current);
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "node {name} not Ready after 30s; kwok log:\n{}",
                    self.process.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
