//! Who may reach the extender's verbs, as the chart installs it: a
//! NetworkPolicy admits only kube-scheduler to the verbs' port, and the
//! probes and scrapers are served on a port of their own, by the real
//! binary. The policy is accepted by a real apiserver; enforcing it is the
//! network plugin's part.

mod support;

use std::time::Duration;

use gkm_testenv::{eventually, free_port};
use serde_json::{Value, json};
use support::{Cluster, http_get};

/// The chart's documents with the extender enabled and its defaults.
fn rendered() -> anyhow::Result<Vec<Value>> {
    support::chart_documents(&[])
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    support::find_document(docs, kind, name)
}

/// Whether an ingress `rule` admits traffic to the container port `name`
/// (numbered `number`): a rule without ports admits every port.
fn admits_port(rule: &Value, name: &str, number: u64) -> bool {
    match rule["ports"].as_array() {
        None => true,
        Some(ports) if ports.is_empty() => true,
        Some(ports) => ports
            .iter()
            .any(|p| p["port"] == name || p["port"].as_u64() == Some(number)),
    }
}

/// Only the scheduler may call the verbs: every ingress rule that admits the
/// verbs' port names its peers, and each peer is kube-scheduler's pods in
/// kube-system; the metrics port is open, and the probes use it.
#[tokio::test]
async fn only_the_scheduler_may_reach_the_extender_verbs() -> anyhow::Result<()> {
    let docs = rendered()?;
    let deployment = find(&docs, "Deployment", "gkm-scheduler-extender")
        .ok_or_else(|| anyhow::anyhow!("no extender Deployment"))?;
    let policy = find(&docs, "NetworkPolicy", "gkm-scheduler-extender")
        .ok_or_else(|| anyhow::anyhow!("the chart ships no NetworkPolicy for the extender"))?;

    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selector = policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .ok_or_else(|| anyhow::anyhow!("the policy selects no pods by label"))?;
    assert!(!selector.is_empty(), "the policy selects every pod");
    for (key, value) in selector {
        assert_eq!(
            &pod_labels[key], value,
            "the policy does not select the extender's pods"
        );
    }
    assert!(
        policy["spec"]["policyTypes"]
            .as_array()
            .is_some_and(|t| t.contains(&json!("Ingress"))),
        "the policy does not restrict ingress"
    );

    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let port = |name: &str| {
        container["ports"]
            .as_array()
            .and_then(|ports| ports.iter().find(|p| p["name"] == name))
            .and_then(|p| p["containerPort"].as_u64())
    };
    let verbs = port("extender").ok_or_else(|| anyhow::anyhow!("no extender port"))?;
    let metrics = port("metrics").ok_or_else(|| anyhow::anyhow!("no metrics port"))?;
    assert_ne!(verbs, metrics);

    let rules = policy["spec"]["ingress"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let to_verbs: Vec<&Value> = rules
        .iter()
        .filter(|r| admits_port(r, "extender", verbs))
        .collect();
    assert!(
        !to_verbs.is_empty(),
        "nothing may call the verbs, the scheduler included"
    );
    let scheduler = json!({
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"component": "kube-scheduler"}},
    });
    for rule in &to_verbs {
        let from = rule["from"].as_array().cloned().unwrap_or_default();
        assert!(
            !from.is_empty(),
            "a rule admits anyone to the verbs: {rule}"
        );
        for peer in &from {
            assert_eq!(
                peer, &scheduler,
                "a peer other than kube-scheduler may call the verbs"
            );
        }
    }
    assert!(
        rules
            .iter()
            .any(|r| admits_port(r, "metrics", metrics) && r["from"].is_null()),
        "the metrics port is closed to scrapers"
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(
            container[probe]["httpGet"]["port"], "metrics",
            "{probe} uses the verbs' port, which the policy closes"
        );
    }

    // A real apiserver accepts the policy, and the binary serves what the
    // chart's arguments say: health and metrics on the metrics port, the
    // verbs not at all there.
    let mut cluster = Cluster::start().await?;
    cluster.namespace("gkm-system").await?;
    cluster.plane.apply_object(policy, false).await?;

    let metrics_addr = format!("127.0.0.1:{}", free_port()?);
    let args = container["args"].as_array().cloned().unwrap_or_default();
    let flag = format!("--metrics-address=0.0.0.0:{metrics}");
    assert!(
        args.contains(&json!(flag)),
        "the chart does not pass {flag}: {args:?}"
    );
    cluster
        .start_extender_with(&[format!("--metrics-address={metrics_addr}")])
        .await?;
    eventually(
        "/readyz on the metrics port",
        Duration::from_secs(60),
        || async {
            Ok(http_get(&metrics_addr, "/readyz")
                .await
                .is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
                .then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", cluster.logs()))?;
    let verb = http_get(&metrics_addr, "/scheduler/latency").await?;
    assert!(
        verb.starts_with("HTTP/1.1 404"),
        "the metrics port serves the verbs: {verb}"
    );
    let latency = http_get(&cluster.extender_addr, "/scheduler/latency").await?;
    assert!(latency.starts_with("HTTP/1.1 200"), "{latency}");
    Ok(())
}
