//! The health and metrics endpoints over real HTTP/1.1 on loopback, as a
//! kubelet probe or a Prometheus scrape sees them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use gkm_k8s_runtime::endpoints::Endpoints;
use gkm_k8s_runtime::metrics::{SampleKind, Sampled, register_build_info};
use gkm_k8s_runtime::readiness::Readiness;
use gkm_k8s_runtime::server::serve;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

struct Reply {
    status: u16,
    headers: String,
    body: String,
}

/// Sends one request the way curl would and reads the whole reply.
async fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> anyhow::Result<Reply> {
    let mut stream = TcpStream::connect(addr).await?;
    let head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await?;
    let (headers, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no header end in {raw:?}"))?;
    let status = headers
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status in {headers:?}"))?;
    Ok(Reply {
        status,
        headers: headers.to_ascii_lowercase(),
        body: body.to_string(),
    })
}

struct Server {
    addr: std::net::SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(endpoints: Endpoints) -> anyhow::Result<Server> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, Arc::new(endpoints), async {
        let _ = stopped.await;
    }));
    Ok(Server { addr, stop, task })
}

#[tokio::test]
async fn health_and_readiness_follow_the_checks() -> anyhow::Result<()> {
    let readiness = Readiness::default();
    let synced = readiness.check("caches-synced");
    let apiserver = readiness.check("apiserver");
    let server = start(Endpoints::new(Registry::default(), readiness.clone())).await?;

    let health = request(server.addr, "GET", "/healthz").await?;
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));

    let not_ready = request(server.addr, "GET", "/readyz").await?;
    assert_eq!(not_ready.status, 503);
    assert!(
        not_ready.body.contains("[-]caches-synced not ready"),
        "{}",
        not_ready.body
    );
    assert!(
        not_ready.body.contains("[-]apiserver not ready"),
        "{}",
        not_ready.body
    );

    apiserver.set(true);
    let half = request(server.addr, "GET", "/readyz").await?;
    assert_eq!(half.status, 503);
    assert!(
        half.body.contains("[-]caches-synced not ready"),
        "{}",
        half.body
    );
    assert!(
        !half.body.contains("apiserver"),
        "only failing checks are listed: {}",
        half.body
    );

    synced.set(true);
    let ready = request(server.addr, "GET", "/readyz").await?;
    assert_eq!((ready.status, ready.body.as_str()), (200, "ok\n"));
    let verbose = request(server.addr, "GET", "/readyz?verbose").await?;
    assert_eq!(verbose.body, "[+]caches-synced ok\n[+]apiserver ok\nok\n");

    synced.set(false);
    assert_eq!(
        request(server.addr, "GET", "/readyz").await?.status,
        503,
        "readiness can be withdrawn"
    );

    let missing = request(server.addr, "GET", "/nope").await?;
    assert_eq!(missing.status, 404);
    assert!(missing.body.contains("/nope"), "{}", missing.body);
    let post = request(server.addr, "POST", "/healthz").await?;
    assert_eq!(post.status, 405);
    assert!(
        post.headers.contains("allow: get, head"),
        "{}",
        post.headers
    );
    let head = request(server.addr, "HEAD", "/healthz").await?;
    assert_eq!((head.status, head.body.as_str()), (200, ""));

    server.stop.send(()).ok();
    server.task.await?;
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "the port is closed after shutdown"
    );
    Ok(())
}

#[tokio::test]
async fn metrics_are_openmetrics_text_with_current_values() -> anyhow::Result<()> {
    let leading = Arc::new(AtomicBool::new(false));
    let mut registry = Registry::with_prefix("gkm");
    registry.register_collector(Box::new(Sampled::flag(
        "leader",
        "1 while this replica leads",
        leading.clone(),
    )));
    registry.register_collector(Box::new(Sampled::new(
        "store_bytes",
        "Bytes in the store",
        SampleKind::Gauge,
        || 4096,
    )));
    register_build_info(&mut registry, "gkm-operator", "1.2.3");
    let server = start(Endpoints::new(registry, Readiness::default())).await?;

    let before = request(server.addr, "GET", "/metrics").await?;
    assert_eq!(before.status, 200);
    assert!(
        before
            .headers
            .contains("content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "{}",
        before.headers
    );
    let lines: Vec<&str> = before.body.lines().collect();
    for expected in [
        "# TYPE gkm_leader gauge",
        "gkm_leader 0",
        "gkm_store_bytes 4096",
        "gkm_build_info{component=\"gkm-operator\",version=\"1.2.3\"} 1",
    ] {
        assert!(
            lines.contains(&expected),
            "missing {expected:?} in\n{}",
            before.body
        );
    }
    assert_eq!(lines.last(), Some(&"# EOF"));

    leading.store(true, Ordering::Relaxed);
    let after = request(server.addr, "GET", "/metrics").await?;
    let lines: Vec<&str> = after.body.lines().collect();
    assert!(
        lines.contains(&"gkm_leader 1"),
        "missing \"gkm_leader 1\" in\n{}",
        after.body
    );
    server.stop.send(()).ok();
    server.task.await?;
    Ok(())
}
