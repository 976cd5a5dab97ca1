//! The operator's metrics as a Prometheus scrape of the operator's
//! endpoints sees them: every series from the start, then the values the
//! reconciles record.

use std::sync::Arc;
use std::time::Duration;

use gkm_k8s_api::cache_object::Scope;
use gkm_k8s_operator::{Error, Metrics, OperatorCollector};
use gkm_k8s_runtime::endpoints::Endpoints;
use gkm_k8s_runtime::readiness::Readiness;
use gkm_k8s_runtime::server::serve;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A scrape of `/metrics` on `port`, as its lines.
async fn scrape(port: u16) -> anyhow::Result<Vec<String>> {
    let (status, body) = gkm_testenv::http_get(port, "/metrics")
        .await
        .ok_or_else(|| anyhow::anyhow!("no answer on port {port}"))?;
    anyhow::ensure!(status == 200, "/metrics answered {status}: {body}");
    Ok(body.lines().map(String::from).collect())
}

fn assert_has(lines: &[String], expected: &[&str]) {
    for expected in expected {
        assert!(
            lines.iter().any(|l| l == expected),
            "missing {expected:?} in\n{}",
            lines.join("\n")
        );
    }
}

#[tokio::test]
async fn the_operators_series_are_served_from_the_start_with_current_values() -> anyhow::Result<()>
{
    let metrics = Arc::new(Metrics::default());
    let mut registry = Registry::with_prefix("gkm");
    registry.register_collector(Box::new(OperatorCollector(metrics.clone())));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let (stop, stopped) = oneshot::channel::<()>();
    let endpoints = Arc::new(Endpoints::new(registry, Readiness::default()));
    let server = tokio::spawn(serve(listener, endpoints, async {
        let _ = stopped.await;
    }));

    let before = scrape(port).await?;
    assert_has(
        &before,
        &[
            "# TYPE gkm_operator_reconciles counter",
            "gkm_operator_reconciles_total{controller=\"gkmcache\"} 0",
            "gkm_operator_reconciles_total{controller=\"clustergkmcache\"} 0",
            "gkm_operator_status_writes_total 0",
            "gkm_operator_caches{state=\"Running\"} 0",
        ],
    );
    assert_eq!(before.last().map(String::as_str), Some("# EOF"));

    for error in [None, None, Some(Error::InvalidSpec("no image".into()))] {
        metrics.reconciled(Scope::Namespaced, Duration::from_millis(30), error.as_ref());
    }
    metrics.status_written();
    metrics.status_written();
    let after = scrape(port).await?;
    assert_has(
        &after,
        &[
            "gkm_operator_reconciles_total{controller=\"gkmcache\"} 3",
            "gkm_operator_reconcile_errors_total{controller=\"gkmcache\",error=\"invalid_spec\"} 1",
            "gkm_operator_reconcile_duration_seconds_count{controller=\"gkmcache\"} 3",
            "gkm_operator_status_writes_total 2",
        ],
    );
    stop.send(()).ok();
    server.await?;
    Ok(())
}
