//! The extender's benchmark (run by `hack/bench/extender.sh`): kube-scheduler
//! places the same GPU pods on the same kwok nodes without and then with
//! the extender; prints pods per second, the ratio, the extender's exact
//! filter, prioritize and bind answer times (p50, p99, max, read from its
//! `GET /scheduler/latency`) and its memory.
//!
//! ```sh
//! cargo run -p gkm-scheduler-extender --example bench -- EXTENDER_BINARY [NODES] [PODS]
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::path::PathBuf;
use std::time::Instant;

use common::Scheduled;
use serde_json::json;
use support::{Cluster, PLAIN_SCHEDULER, asking};

/// The extender's exact answer times per verb (`GET /scheduler/latency`):
/// verb → (calls, p50, p99, max), in seconds.
async fn latencies(addr: &str) -> anyhow::Result<serde_json::Value> {
    let reply = support::http_get(addr, gkm_k8s_extender::LATENCY_PATH).await?;
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, body)| body)
        .ok_or_else(|| anyhow::anyhow!("no body in the latency reply: {reply}"))?;
    Ok(serde_json::from_str(body)?)
}

fn ms(seconds: Option<f64>) -> String {
    seconds.map_or("n/a".into(), |s| format!("{:.3} ms", s * 1000.0))
}

fn rss(pid: u32) -> String {
    gkm_testenv::memory_mib(pid).map_or_else(
        |e| format!("? ({e:#})"),
        |(rss, peak)| format!("{rss:.1} MiB (peak {peak:.1} MiB)"),
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let extender = PathBuf::from(
        args.next()
            .ok_or_else(|| anyhow::anyhow!("usage: bench EXTENDER_BINARY [NODES] [PODS]"))?,
    );
    let nodes: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1000);
    let count: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2000);

    let began = Instant::now();
    let mut cluster = Cluster::start().await?;
    common::create_nodes(&cluster, nodes).await?;
    for ns in ["bench-plain", "bench-gkm"] {
        cluster.namespace(ns).await?;
    }
    common::allow_gpus(&cluster, "bench-gkm").await?;
    eprintln!("== {nodes} kwok nodes up in {:.0?}", began.elapsed());

    let spec = json!({"containers": asking(json!({"nvidia.com/gpu": "1"}))});
    common::create_pods(&cluster, "bench-plain", count, &spec).await?;
    let plain = common::schedule(&mut cluster, "bench-plain", count, PLAIN_SCHEDULER).await?;
    eprintln!(
        "== without the extender: {count} pods in {:.2?}",
        plain.elapsed
    );
    common::delete_pods(&cluster, "bench-plain").await?;

    cluster.start_extender_from(&extender).await?;
    common::create_pods(&cluster, "bench-gkm", count, &spec).await?;
    let config = support::scheduler_config(&cluster.extender_addr)?;
    let with = common::schedule(&mut cluster, "bench-gkm", count, &config).await?;
    eprintln!("== with the extender: {count} pods in {:.2?}", with.elapsed);

    let latency = latencies(&cluster.extender_addr).await?;
    let pid = cluster
        .extender
        .as_ref()
        .map(|p| p.pid())
        .unwrap_or_default();
    let line = |s: &Scheduled| {
        format!(
            "{:8.1} pods/s ({:.2?}; kube-scheduler CPU {:.2} s)",
            s.per_second(),
            s.elapsed,
            s.cpu_seconds
        )
    };
    println!("nodes {nodes}, GPU pods {count}");
    println!("without extender: {}", line(&plain));
    println!("with extender:    {}", line(&with));
    println!(
        "time ratio (with / without): {:.2}x (target <= 1.30x)",
        with.elapsed.as_secs_f64() / plain.elapsed.as_secs_f64().max(f64::EPSILON)
    );
    println!("extender answer times (exact, measured in the extender):");
    for verb in ["filter", "prioritize", "bind"] {
        let v = &latency[verb];
        println!(
            "{verb:<10} calls {:>6}  p50 {}  p99 {}  max {}",
            v["count"].as_u64().unwrap_or(0),
            ms(v["p50"].as_f64()),
            ms(v["p99"].as_f64()),
            ms(v["max"].as_f64())
        );
    }
    let filter_p99 = latency["filter"]["p99"].as_f64().unwrap_or(f64::INFINITY);
    println!(
        "filter p99 {} (target < 5 ms: {})",
        ms(Some(filter_p99)),
        if filter_p99 < 0.005 { "met" } else { "missed" }
    );
    println!("extender RSS: {}", rss(pid));
    Ok(())
}
