//! What the shipped caches dashboard (`deploy/dashboards/gkm-caches.json`)
//! promises: it asks only for metrics the operator and the CSI driver
//! serve, and draws each cache's nodes, pods and workloads' hits.

use std::collections::BTreeSet;
use std::sync::Arc;

use gkm_k8s::csi::{CsiCollector, CsiMetrics};
use gkm_k8s::operator::{Metrics, OperatorCollector};
use prometheus_client::collector::Collector;
use prometheus_client::registry::Registry;

/// Every series name `collector` serves (`gkm_` prefixed; a counter's with
/// `_total`), from its `# TYPE` lines.
fn served(collector: Box<dyn Collector>) -> anyhow::Result<BTreeSet<String>> {
    let mut registry = Registry::with_prefix("gkm");
    registry.register_collector(collector);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            if kind == "counter" {
                names.insert(format!("{name}_total"));
            }
            names.insert(name.to_string());
        }
    }
    Ok(names)
}

#[test]
fn the_caches_dashboard_asks_only_for_metrics_the_operator_and_csi_driver_serve()
-> anyhow::Result<()> {
    let path = gkm_testenv::repo_root().join("deploy/dashboards/gkm-caches.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let store = gkm_testenv::temp_dir()?;
    let mut serving = served(Box::new(OperatorCollector(Arc::new(Metrics::default()))))?;
    serving.extend(served(Box::new(CsiCollector::new(
        CsiMetrics::default(),
        store.path(),
    )))?);

    let asked = gkm_testenv::dashboard_metrics(&dashboard);
    for name in &asked {
        assert!(
            serving.contains(name),
            "the dashboard asks for {name}, which neither the operator nor the CSI driver serves"
        );
    }
    for drawn in [
        "gkm_operator_cache_nodes",
        "gkm_operator_cache_pods",
        "gkm_operator_cache_workload_pods_compiling",
        "gkm_operator_cache_workload_pods_ended",
        "gkm_operator_cache_workload_new_entries",
        "gkm_csi_view_new_entries_total",
    ] {
        assert!(
            asked.iter().any(|a| a == drawn),
            "the dashboard draws no {drawn}"
        );
    }
    Ok(())
}
