//! The faults the soak injects, one at a time on a seeded schedule, and
//! how each is injected and ended.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use gkm_testenv::{ContainerdRestarts, ControlPlaneRestarts};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams};

use super::health::pod_ready;
use super::registry_proxy::{RegistryFault, RegistryProxy};
use super::rng::Rng;
use super::state::{Shared, Window};
use super::workload::REAL_NODE;
use crate::{SYSTEM_NAMESPACE, Stack};

/// How long a windowed fault (registry, full store) lasts.
const WINDOW: Duration = Duration::from_secs(15);
/// How long a deleted pod's replacement may take to be Ready.
const REPLACED_WITHIN: Duration = Duration::from_secs(120);
/// The simulated nodes whose processes and Node objects the soak breaks.
const SIMULATED: [&str; 2] = ["node-sm75", "node-gfx90a"];

/// A fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// One of the chart's pods on the real node deleted at once (grace 0:
    /// SIGKILL), by component.
    PodDeleted(String),
    /// A simulated node's agent process killed (SIGKILL) and restarted.
    AgentKilled(String),
    /// A simulated node's CSI driver process killed (SIGKILL) and restarted.
    CsiKilled(String),
    /// The real node's kubelet killed (SIGKILL) and restarted.
    KubeletKilled,
    /// The real node's containerd killed (SIGKILL) and restarted.
    ContainerdKilled,
    /// kube-apiserver killed (SIGKILL) and restarted.
    ApiserverKilled,
    /// etcd killed (SIGKILL) and restarted.
    EtcdKilled,
    /// The registry, as gkm reaches it, failing.
    Registry(RegistryFault),
    /// The real node's store filesystem filled past its reserve.
    StoreFull,
    /// A simulated Node deleted and created again.
    NodeRecreated(String),
}

impl Fault {
    /// The fault's kind, as reports group it.
    pub fn kind(&self) -> String {
        match self {
            Fault::PodDeleted(c) => format!("{}-pod-deleted", c.trim_start_matches("gkm-")),
            Fault::AgentKilled(_) => "sim-agent-killed".into(),
            Fault::CsiKilled(_) => "sim-csi-killed".into(),
            Fault::KubeletKilled => "kubelet-killed".into(),
            Fault::ContainerdKilled => "containerd-killed".into(),
            Fault::ApiserverKilled => "apiserver-killed".into(),
            Fault::EtcdKilled => "etcd-killed".into(),
            Fault::Registry(RegistryFault::Slow) => "registry-slow".into(),
            Fault::Registry(RegistryFault::Reset) => "registry-reset".into(),
            Fault::Registry(RegistryFault::BlackHole) => "registry-black-hole".into(),
            Fault::Registry(RegistryFault::ServerErrors) => "registry-5xx".into(),
            Fault::StoreFull => "store-full".into(),
            Fault::NodeRecreated(_) => "sim-node-recreated".into(),
        }
    }

    /// Whether it lasts a while and is then healed (its recovery counts
    /// from the healing), rather than a kill or a deletion (counted from
    /// the injection).
    pub fn is_windowed(&self) -> bool {
        matches!(self, Fault::Registry(_) | Fault::StoreFull)
    }

    /// Whether it touches the real node's serving path (so a new pod there
    /// may wait for it to end).
    pub fn touches_real_node(&self) -> bool {
        matches!(self, Fault::KubeletKilled | Fault::ContainerdKilled)
            || matches!(self, Fault::PodDeleted(c) if c != "gkm-operator")
    }

    /// The simulated node it touches.
    pub fn touches_node(&self) -> Option<String> {
        match self {
            Fault::AgentKilled(n) | Fault::CsiKilled(n) | Fault::NodeRecreated(n) => {
                Some(n.clone())
            }
            _ => None,
        }
    }

    /// The next fault: every kind equally likely (the chart's pods, one
    /// kind per component), the node it hits picked among the simulated
    /// ones; only kinds named in `only` when it names any.
    pub fn pick(rng: &mut Rng, components: &[&str], only: &[String]) -> Fault {
        let node = rng
            .pick(&SIMULATED)
            .copied()
            .unwrap_or("node-sm75")
            .to_string();
        let mut all = Fault::all(components, &node);
        if !only.is_empty() {
            all.retain(|f| only.contains(&f.kind()));
        }
        rng.pick(&all).cloned().unwrap_or(Fault::ApiserverKilled)
    }

    /// The kinds of fault the soak injects with `components`' pods.
    pub fn kinds(components: &[&str]) -> Vec<String> {
        Fault::all(components, SIMULATED[0])
            .iter()
            .map(Fault::kind)
            .collect()
    }

    /// One fault of each kind, those of a simulated node on `node`.
    fn all(components: &[&str], node: &str) -> Vec<Fault> {
        let mut all: Vec<Fault> = components
            .iter()
            .map(|c| Fault::PodDeleted(c.to_string()))
            .collect();
        all.extend([
            Fault::AgentKilled(node.to_string()),
            Fault::CsiKilled(node.to_string()),
            Fault::KubeletKilled,
            Fault::ContainerdKilled,
            Fault::ApiserverKilled,
            Fault::EtcdKilled,
            Fault::Registry(RegistryFault::Slow),
            Fault::Registry(RegistryFault::Reset),
            Fault::Registry(RegistryFault::BlackHole),
            Fault::Registry(RegistryFault::ServerErrors),
            Fault::StoreFull,
            Fault::NodeRecreated(node.to_string()),
        ]);
        all
    }
}

/// What injecting needs.
pub struct Injector<'a> {
    /// The stack.
    pub stack: &'a mut Stack,
    /// The control plane's crash and restart (the replacements live as
    /// long as this, so it outlives the injector).
    pub plane: &'a mut ControlPlaneRestarts,
    /// The real node's containerd crash and restart.
    pub containerd: &'a mut ContainerdRestarts,
    /// The fault proxy in front of the registry.
    pub proxy: &'a RegistryProxy,
    /// The filesystem the real node's store is on.
    pub store_fs: PathBuf,
    /// Shared state (fault windows).
    pub shared: &'a Shared,
}

impl Injector<'_> {
    /// Injects `fault` and returns once it has ended (the killed process
    /// or pod running again, the window healed).
    pub async fn inject(&mut self, fault: &Fault) -> anyhow::Result<()> {
        let index = self.shared.open_window(Window {
            kind: fault.kind(),
            touches_real_node: fault.touches_real_node(),
            touches_node: fault.touches_node(),
            blinds_apiserver: matches!(fault, Fault::ApiserverKilled | Fault::EtcdKilled),
            began: Instant::now(),
            ended: None,
        });
        let result = self.run(fault).await;
        self.shared.close_window(index);
        result.with_context(|| format!("injecting {}", fault.kind()))
    }

    async fn run(&mut self, fault: &Fault) -> anyhow::Result<()> {
        let client = self.stack.plane.client().await?;
        match fault {
            Fault::PodDeleted(component) => delete_and_wait(&client, component).await,
            Fault::AgentKilled(node) => {
                self.stack.kill_agent(node);
                self.stack.start_agent(node)
            }
            Fault::CsiKilled(node) => {
                self.stack.kill_csi(node);
                self.stack.start_csi(node)
            }
            Fault::KubeletKilled => {
                let node = self
                    .stack
                    .real_node_mut(REAL_NODE)
                    .context("no real node")?;
                gkm_testenv::crash_kubelet(node).await.map(|_| ())
            }
            Fault::ContainerdKilled => {
                let node = self.stack.real_node(REAL_NODE).context("no real node")?;
                self.containerd.restart(node).await.map(|_| ())
            }
            Fault::ApiserverKilled => self
                .plane
                .restart_apiserver(&self.stack.plane)
                .await
                .map(|_| ()),
            Fault::EtcdKilled => self.plane.restart_etcd(&self.stack.plane).await.map(|_| ()),
            Fault::Registry(kind) => {
                self.proxy.inject(*kind).await?;
                tokio::time::sleep(WINDOW).await;
                self.proxy.heal(*kind).await
            }
            Fault::StoreFull => {
                let filler = self.store_fs.join("soak-filler");
                fill(&self.store_fs, &filler)?;
                tokio::time::sleep(WINDOW).await;
                std::fs::remove_file(&filler)
                    .with_context(|| format!("removing {}", filler.display()))
            }
            Fault::NodeRecreated(node) => recreate_node(self.stack, &client, node).await,
        }
    }
}

/// Deletes the chart's pod of `component` (grace 0) and waits until its
/// replacement is Ready.
async fn delete_and_wait(client: &kube::Client, component: &str) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let selector = format!("app.kubernetes.io/name={component}");
    let old = pods.list(&ListParams::default().labels(&selector)).await?;
    let mut old_uids = Vec::new();
    for pod in old.items {
        old_uids.push(pod.metadata.uid.clone().unwrap_or_default());
        let name = pod.metadata.name.unwrap_or_default();
        pods.delete(&name, &DeleteParams::default().grace_period(0))
            .await?;
    }
    gkm_testenv::eventually(
        &format!("a new {component} pod Ready"),
        REPLACED_WITHIN,
        || {
            let (pods, selector, old_uids) = (pods.clone(), selector.clone(), &old_uids);
            async move {
                let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await else {
                    return Ok(None);
                };
                Ok(list
                    .items
                    .iter()
                    .any(|p| {
                        !old_uids.contains(p.metadata.uid.as_ref().unwrap_or(&String::new()))
                            && pod_ready(p)
                    })
                    .then_some(()))
            }
        },
    )
    .await
}

/// Fills the filesystem at `fs` with `filler` until 1 MiB is left free:
/// below any reserve the agent keeps.
fn fill(fs: &std::path::Path, filler: &std::path::Path) -> anyhow::Result<()> {
    let out = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(fs)
        .output()
        .context("running df")?;
    let avail: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .with_context(|| {
            format!(
                "df of {}: {}",
                fs.display(),
                String::from_utf8_lossy(&out.stdout)
            )
        })?;
    let size = avail.saturating_sub(1 << 20);
    let run = Command::new("fallocate")
        .args(["-l", &size.to_string()])
        .arg(filler)
        .output()
        .context("running fallocate")?;
    anyhow::ensure!(
        run.status.success(),
        "fallocate {}: {}",
        filler.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    Ok(())
}

/// Deletes simulated Node `node`, waits until it is gone and creates it
/// again as kwok's.
async fn recreate_node(stack: &mut Stack, client: &kube::Client, node: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let labels: BTreeMap<String, String> = nodes
        .get(node)
        .await?
        .metadata
        .labels
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with("gkm.io/"))
        .collect();
    nodes.delete(node, &DeleteParams::default()).await?;
    gkm_testenv::eventually(
        &format!("Node {node} gone"),
        Duration::from_secs(60),
        || {
            let nodes = nodes.clone();
            async move { Ok(nodes.get_opt(node).await?.is_none().then_some(())) }
        },
    )
    .await?;
    stack
        .kwok
        .create_node(client, node, &labels, &BTreeMap::new())
        .await?;
    // The agent's token was bound to the deleted Node, so the apiserver
    // refuses it now; on a cluster the Node's pods go with it and their
    // replacements get fresh tokens. The agent process gets the same.
    crate::node_token::node_bound_kubeconfig(
        &stack.plane,
        SYSTEM_NAMESPACE,
        "gkm-agent",
        node,
        &stack.node_dir(node).join("agent-kubeconfig.yaml"),
    )
    .await?;
    stack.kill_agent(node);
    stack.start_agent(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_named_once_and_only_named_kinds_are_picked() {
        let kinds = Fault::kinds(&crate::chart::COMPONENTS);
        assert_eq!(kinds.len(), 16, "{kinds:?}");
        assert!(kinds.contains(&"csi-pod-deleted".to_string()), "{kinds:?}");
        let only = vec!["store-full".to_string(), "csi-pod-deleted".to_string()];
        let mut rng = Rng::fork(1, 1);
        for _ in 0..50 {
            let kind = Fault::pick(&mut rng, &crate::chart::COMPONENTS, &only).kind();
            assert!(only.contains(&kind), "{kind}");
        }
    }
}
