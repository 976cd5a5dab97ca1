//! A real fault proxy between gkm and the registry: Toxiproxy (built by
//! `hack/ci/components.sh toxiproxy`), whose toxics slow, reset and
//! black-hole the connections. Toxiproxy works on TCP and has no toxic that
//! answers HTTP, so registry 5xx come from a small HTTP front of the soak's
//! own ([`FiveHundreds`]) that the proxy's upstream is switched to.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Context as _;
use gkm_testenv::{Process, free_port, tools_bin_dir};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const PROXY: &str = "registry";

/// A registry fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryFault {
    /// Every answer 3 s late.
    Slow,
    /// Every connection reset.
    Reset,
    /// Nothing answers; connections hang.
    BlackHole,
    /// Every request answered `503 Service Unavailable`.
    ServerErrors,
}

/// Toxiproxy in front of the registry; stopped when dropped.
pub struct RegistryProxy {
    _server: Process,
    api: String,
    listen: String,
    upstream: String,
    five_hundreds: FiveHundreds,
    http: reqwest::Client,
}

impl RegistryProxy {
    /// Starts Toxiproxy (logging into `dir`) with a proxy on a free
    /// loopback port to `upstream` (`host:port`).
    pub async fn start(dir: &Path, upstream: &str) -> anyhow::Result<RegistryProxy> {
        let binary = tools_bin_dir().join("toxiproxy-server");
        anyhow::ensure!(
            binary.is_file(),
            "{} is missing; install it with `hack/ci/components.sh toxiproxy`",
            binary.display()
        );
        let api_port = free_port()?;
        let mut cmd = Command::new(binary);
        cmd.args(["-host", "127.0.0.1", "-port", &api_port.to_string()]);
        let server = Process::spawn("toxiproxy", cmd, &dir.join("toxiproxy.log"))?;
        let api = format!("http://127.0.0.1:{api_port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?;
        gkm_testenv::eventually("toxiproxy answers", Duration::from_secs(20), || {
            let http = http.clone();
            let url = format!("{api}/version");
            async move { Ok(http.get(url).send().await.ok().map(|_| ())) }
        })
        .await?;
        let listen = format!("127.0.0.1:{}", free_port()?);
        let proxy = RegistryProxy {
            _server: server,
            api,
            listen,
            upstream: upstream.to_string(),
            five_hundreds: FiveHundreds::start().await?,
            http,
        };
        proxy
            .call(
                reqwest::Method::POST,
                "/proxies",
                Some(serde_json::json!({
                    "name": PROXY, "listen": proxy.listen, "upstream": proxy.upstream,
                    "enabled": true,
                })),
            )
            .await?;
        Ok(proxy)
    }

    /// Where gkm reaches the registry (`127.0.0.1:PORT`).
    pub fn addr(&self) -> &str {
        &self.listen
    }

    /// Starts `fault`.
    pub async fn inject(&self, fault: RegistryFault) -> anyhow::Result<()> {
        let toxic = |kind: &str, attributes: serde_json::Value| {
            serde_json::json!({"name": "soak", "type": kind, "stream": "downstream",
                               "toxicity": 1.0, "attributes": attributes})
        };
        let path = format!("/proxies/{PROXY}/toxics");
        match fault {
            RegistryFault::Slow => {
                let body = toxic(
                    "latency",
                    serde_json::json!({"latency": 3000, "jitter": 500}),
                );
                self.call(reqwest::Method::POST, &path, Some(body)).await
            }
            RegistryFault::Reset => {
                let body = toxic("reset_peer", serde_json::json!({"timeout": 0}));
                self.call(reqwest::Method::POST, &path, Some(body)).await
            }
            RegistryFault::BlackHole => {
                let body = toxic("timeout", serde_json::json!({"timeout": 0}));
                self.call(reqwest::Method::POST, &path, Some(body)).await
            }
            RegistryFault::ServerErrors => {
                self.set_upstream(&self.five_hundreds.addr.clone()).await
            }
        }
    }

    /// Ends `fault`.
    pub async fn heal(&self, fault: RegistryFault) -> anyhow::Result<()> {
        match fault {
            RegistryFault::ServerErrors => self.set_upstream(&self.upstream.clone()).await,
            _ => {
                let path = format!("/proxies/{PROXY}/toxics/soak");
                self.call(reqwest::Method::DELETE, &path, None).await
            }
        }
    }

    async fn set_upstream(&self, upstream: &str) -> anyhow::Result<()> {
        // Re-enabling the proxy drops the connections open to the old
        // upstream, so every request after this reaches the new one.
        let path = format!("/proxies/{PROXY}");
        for body in [
            serde_json::json!({"enabled": false}),
            serde_json::json!({"upstream": upstream, "enabled": true}),
        ] {
            self.call(reqwest::Method::POST, &path, Some(body)).await?;
        }
        Ok(())
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<()> {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.api));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("toxiproxy {method} {path}"))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        anyhow::ensure!(
            status.is_success(),
            "toxiproxy {method} {path}: {status} {text}"
        );
        Ok(())
    }
}

/// An HTTP server answering every request `503 Service Unavailable`, the
/// registry's answer when it is overloaded or its storage fails.
struct FiveHundreds {
    addr: String,
    task: tokio::task::JoinHandle<()>,
}

impl FiveHundreds {
    async fn start() -> anyhow::Result<FiveHundreds> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    // One answer per request head; the connection closes after.
                    let _ = stream.read(&mut buf).await;
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
                              content-length: 67\r\nconnection: close\r\n\r\n\
                              {\"errors\":[{\"code\":\"UNAVAILABLE\",\"message\":\"service unavailable\"}]}",
                        )
                        .await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Ok(FiveHundreds { addr, task })
    }
}

impl Drop for FiveHundreds {
    fn drop(&mut self) {
        self.task.abort();
    }
}
