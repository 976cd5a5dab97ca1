//! The checks run continuously while faults and the workload run: reader
//! logs (whole variants, writes, no gaps, served in time), simulated nodes
//! keeping their caches, each change converging in time, and the real
//! node's store writes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gkm_k8s_api::crd::{CacheState, GKMCacheNode};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::invariants::{CONVERGE_WITHIN, Check, READ_GAP, SERVE_AGAIN_WITHIN};
use super::state::Shared;
use super::trees::{ReadLine, parse_reads};
use super::workload::NAMESPACE;
use crate::SYSTEM_NAMESPACE;

/// The continuous checks' own memory between samples.
#[derive(Default)]
pub struct Sampler {
    /// (node, cache) pairs seen on their node.
    held: BTreeSet<(String, String)>,
    /// The agent pod and extraction count at the last scrape.
    last_scrape: Option<(String, f64, Instant)>,
    /// Store writes counted outside fault windows.
    pub quiet_writes: f64,
    /// Store writes counted in all.
    pub all_writes: f64,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Sampler {
    /// One pass of every continuous check.
    pub async fn sample(&mut self, client: &kube::Client, shared: &Shared) {
        check_readers(shared);
        self.check_simulated_nodes(client, shared).await;
        check_convergence(client, shared).await;
        self.scrape_writes(client, shared).await;
    }

    async fn check_simulated_nodes(&mut self, client: &kube::Client, shared: &Shared) {
        let reports: Api<GKMCacheNode> = Api::namespaced(client.clone(), NAMESPACE);
        let truths = shared.caches().clone();
        for node in ["node-sm75", "node-gfx90a"] {
            // A read the apiserver cannot answer says nothing of the node.
            let Ok(report) = reports.get_opt(node).await else {
                continue;
            };
            let caches = report
                .and_then(|r| r.status)
                .and_then(|s| s.caches)
                .unwrap_or_default();
            let touched = shared.fault_near(SERVE_AGAIN_WITHIN, |w| {
                w.touches_node.as_deref() == Some(node)
            });
            for (name, truth) in &truths {
                if !truth.nodes.iter().any(|n| n == node) {
                    continue;
                }
                let held = caches.get(name).is_some_and(|d| {
                    d.values()
                        .any(|e| e.state.is_some_and(CacheState::is_on_node))
                });
                let key = (node.to_string(), name.clone());
                if held {
                    self.held.insert(key);
                    shared.record(Check::NodesKeepTheirCaches, Ok(()));
                } else if self.held.contains(&key) {
                    if touched {
                        continue;
                    }
                    shared.record(
                        Check::NodesKeepTheirCaches,
                        Err(format!(
                            "{node} no longer reports {name} on the node: {:?}",
                            caches.get(name)
                        )),
                    );
                    // Reported once until it holds it again.
                    self.held.remove(&key);
                }
            }
        }
    }

    /// Scrapes the real node's agent for its store writes
    /// (`gkm_agent_extractions_total{outcome="succeeded"}`).
    async fn scrape_writes(&mut self, client: &kube::Client, shared: &Shared) {
        let Some((uid, value)) = agent_extractions(client).await else {
            return;
        };
        let now = Instant::now();
        let delta = match &self.last_scrape {
            Some((last_uid, last, _)) if *last_uid == uid && value >= *last => value - last,
            // A new agent counts from zero.
            _ => value,
        };
        let quiet = match &self.last_scrape {
            Some((_, _, at)) => !shared.any_fault_between(*at - Duration::from_secs(5), now),
            None => !shared.any_fault_between(shared.began, now),
        };
        self.all_writes += delta;
        if quiet {
            self.quiet_writes += delta;
        }
        self.last_scrape = Some((uid, value, now));
    }
}

/// The real node's agent pod and its count of successful extractions.
async fn agent_extractions(client: &kube::Client) -> Option<(String, f64)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=gkm-agent"))
        .await
        .ok()?;
    let pod = list.items.into_iter().find(super::health::pod_ready)?;
    let port = pod
        .spec
        .as_ref()?
        .containers
        .first()?
        .ports
        .as_ref()?
        .first()?
        .container_port;
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let samples = gkm_testenv::samples(&text).ok()?;
    let value = samples
        .iter()
        .filter(|s| {
            s.name == "gkm_agent_extractions_total" && s.label("outcome") == Some("succeeded")
        })
        .map(|s| s.value)
        .sum();
    Some((pod.metadata.uid.unwrap_or_default(), value))
}

/// Reads every reader's new log lines.
pub fn check_readers(shared: &Shared) {
    let truths = shared.caches().clone();
    let node_fault_end = shared.last_fault_end(|w| w.touches_real_node);
    let now = unix_now();
    let mut outcomes = Vec::new();
    for reader in shared.readers().iter_mut() {
        let log = std::fs::read_to_string(&reader.log).unwrap_or_default();
        let lines = parse_reads(&log);
        let allowed = truths.get(&reader.cache).map(|t| &t.fingerprints);
        for line in lines.iter().skip(reader.checked) {
            match line {
                ReadLine::Read { at, fingerprint } => {
                    let whole = allowed.is_some_and(|a| a.contains(fingerprint));
                    outcomes.push((
                        Check::ReadsAreWholeVariants,
                        if whole {
                            Ok(())
                        } else {
                            Err(format!(
                                "{} read {fingerprint} of {}, no verified variant",
                                reader.name, reader.cache
                            ))
                        },
                    ));
                    if reader.writable {
                        outcomes.push((Check::WritableViewsTakeWrites, Ok(())));
                    }
                    reader.last_read = Some(*at);
                }
                ReadLine::WriteFailed { .. } => outcomes.push((
                    Check::WritableViewsTakeWrites,
                    Err(format!(
                        "{} could not write its view of {}",
                        reader.name, reader.cache
                    )),
                )),
            }
        }
        reader.checked = lines.len();
        if reader.retired {
            continue;
        }
        // Served within the bound of its creation or of the last fault
        // that touched the real node, whichever is later.
        if !reader.served {
            let since = node_fault_end.map_or(reader.created, |e| e.max(reader.created));
            if reader.last_read.is_some() {
                reader.served = true;
                outcomes.push((Check::NodeServesAgain, Ok(())));
            } else if since.elapsed() > SERVE_AGAIN_WITHIN {
                reader.served = true;
                outcomes.push((
                    Check::NodeServesAgain,
                    Err(format!(
                        "{} read nothing {}s after it was created or the node's last fault",
                        reader.name,
                        SERVE_AGAIN_WITHIN.as_secs()
                    )),
                ));
            }
        } else if let Some(last) = reader.last_read {
            let gap = now.saturating_sub(last);
            if gap > READ_GAP.as_secs() {
                if !reader.gap_reported {
                    reader.gap_reported = true;
                    outcomes.push((
                        Check::RunningPodsKeepReading,
                        Err(format!("{} has not read for {gap}s", reader.name)),
                    ));
                }
            } else {
                outcomes.push((Check::RunningPodsKeepReading, Ok(())));
            }
        }
    }
    for (check, outcome) in outcomes {
        shared.record(check, outcome);
    }
}

/// Marks each change converged once it is, and reports one that is not
/// [`CONVERGE_WITHIN`] after it was made or after the last fault.
async fn check_convergence(client: &kube::Client, shared: &Shared) {
    let pending: Vec<(String, super::state::CacheTruth)> = shared
        .caches()
        .iter()
        .filter(|(_, t)| !t.converged)
        .map(|(n, t)| (n.clone(), t.clone()))
        .collect();
    let last_fault = shared.last_fault_end(|_| true);
    for (name, truth) in pending {
        let converged = match super::health::cache_unconverged(client, &name, &truth).await {
            Ok(None) => true,
            Ok(Some(_)) => false,
            // The apiserver is away: nothing to conclude.
            Err(_) => continue,
        };
        let Some(changed) = truth.changed_at else {
            continue;
        };
        let since = last_fault.map_or(changed, |f| f.max(changed));
        let mut caches = shared.caches();
        let Some(current) = caches.get_mut(&name) else {
            continue;
        };
        // A newer change replaced the one checked.
        if current.latest != truth.latest {
            continue;
        }
        if converged {
            current.converged = true;
            drop(caches);
            shared.record(Check::ChangesConverge, Ok(()));
        } else if since.elapsed() > CONVERGE_WITHIN && !current.reported {
            current.reported = true;
            drop(caches);
            shared.record(
                Check::ChangesConverge,
                Err(format!(
                    "cache {name} at {} not converged {}s after its change or the last fault",
                    truth.latest,
                    CONVERGE_WITHIN.as_secs()
                )),
            );
        }
    }
}
