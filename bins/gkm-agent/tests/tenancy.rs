//! What one namespace can do to the others through `gkm-agent`, against a
//! real kube-apiserver and a real registry: a tenant whose namespace is
//! stuck terminating (a finalizer of its own on a cache) does not stop the
//! agent from reporting other namespaces or collecting garbage, and a
//! tenant's registry that trickles its layer does not hold the other
//! namespaces' extractions (a small TCP server in this file plays that
//! hostile registry; the healthy caches come from a real `docker-registry`),
//! nor, from two namespaces holding both extraction slots, a third
//! namespace's cache (the trickling extractions give their slots up), and a
//! tenant whose caches exceed its namespace's byte cap does not take the
//! node's store from the others, whose caches stop at the store's cap.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gkm_k8s_api::crd::{GKMCache, GKMCacheNode, GKMCacheRelease};
use gkm_oci::Digest;
use gkm_testenv::{Registry, samples};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

mod support;

use support::{Node, build_layout, fixture, push, push_fixture, until};

/// A digest no cache or pod references.
const UNREFERENCED: &str = "5555555555555555555555555555555555555555555555555555555555555555";

/// The agent's passes that succeeded so far, from its metrics.
async fn passes_succeeded(port: u16) -> f64 {
    let (_, metrics) = gkm_testenv::http_get(port, "/metrics")
        .await
        .unwrap_or_default();
    samples(&metrics)
        .unwrap_or_default()
        .iter()
        .filter(|s| s.name == "gkm_agent_sync_passes_total")
        .filter(|s| s.label("outcome") == Some("succeeded"))
        .map(|s| s.value)
        .sum()
}

fn digest_dir(store: &Path, hex: &str) -> PathBuf {
    store.join("sha256").join(hex)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_namespace_stuck_terminating_does_not_stop_other_namespaces_or_garbage_collection()
-> anyhow::Result<()> {
    let node = Node::new("tenancy-terminating-node").await?;
    let (stuck, healthy) = ("tenant-stuck-terminating", "tenant-beside-stuck");
    node.plane.ensure_namespace(stuck).await?;
    node.plane.ensure_namespace(healthy).await?;
    let digest = format!("sha256:{}", "6".repeat(64));

    // The tenant keeps a finalizer of its own on a cache, then deletes its
    // namespace: the cache stays, deleting, and the namespace stays
    // terminating, where nothing new may be created (this node's report).
    node.cache(stuck, "held", "registry.invalid/held:v1", &digest, false)
        .await?;
    let caches: Api<GKMCache> = Api::namespaced(node.client.clone(), stuck);
    caches
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/keep"]}})),
        )
        .await?;
    caches.delete("held", &DeleteParams::default()).await?;
    let namespaces: Api<Namespace> = Api::all(node.client.clone());
    namespaces.delete(stuck, &DeleteParams::default()).await?;

    // Another tenant's cache, refused here (not verified): no registry
    // needed to report it.
    node.cache(
        healthy,
        "beside",
        "registry.invalid/beside:v1",
        &digest,
        false,
    )
    .await?;
    // A digest nothing references, left in the store.
    let stale = digest_dir(&node.store(), UNREFERENCED);
    std::fs::create_dir_all(&stale)?;
    std::fs::write(stale.join("kernel.bin"), b"old")?;

    let port = gkm_testenv::free_port()?;
    let mut agent = node.agent(port, &["--gc-grace=1s"])?;
    until(
        &mut agent,
        "the other namespace's cache reported",
        Duration::from_secs(60),
        || async { Ok(node.state(healthy, "beside", &digest).await?.as_deref() == Some("Error")) },
    )
    .await?;
    until(
        &mut agent,
        "the unreferenced digest collected",
        Duration::from_secs(60),
        || async { Ok(!stale.exists()) },
    )
    .await?;
    until(
        &mut agent,
        "passes succeeding",
        Duration::from_secs(30),
        || async { Ok(passes_succeeded(port).await >= 2.0) },
    )
    .await?;
    // The terminating namespace got no report, and is still terminating.
    let reports: Api<GKMCacheNode> = Api::namespaced(node.client.clone(), stuck);
    assert!(reports.get_opt(&node.name).await?.is_none());
    let phase = namespaces
        .get(stuck)
        .await?
        .status
        .and_then(|s| s.phase)
        .unwrap_or_default();
    assert_eq!(phase, "Terminating");
    agent.terminate(Duration::from_secs(15))?;
    Ok(())
}

/// A hostile registry: it answers the registry API at once for its
/// manifest and the blobs it holds whole, and sends any other blob one byte
/// every 200 ms, each byte well within any per-read timeout. Not a
/// registry: a deliberately slow TCP server.
struct TricklingRegistry {
    addr: String,
    /// The digest of the manifest it serves.
    digest: Digest,
    /// Requests for blobs it trickles.
    trickled: Arc<AtomicUsize>,
    /// Of those, the ones whose client hung up.
    hung_up: Arc<AtomicUsize>,
}

impl TricklingRegistry {
    /// Serves `manifest` and `whole` at once, trickles other blobs.
    async fn start(
        manifest: Vec<u8>,
        whole: HashMap<String, Vec<u8>>,
    ) -> anyhow::Result<TricklingRegistry> {
        let digest = Digest::of(&manifest);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let trickled = Arc::new(AtomicUsize::new(0));
        let hung_up = Arc::new(AtomicUsize::new(0));
        let served = Arc::new(Served {
            manifest,
            whole,
            trickled: trickled.clone(),
            hung_up: hung_up.clone(),
        });
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve_trickling(socket, served.clone()));
            }
        });
        Ok(TricklingRegistry {
            addr,
            digest,
            trickled,
            hung_up,
        })
    }

    /// Serves the image of `layout` (its manifest and config, so the same
    /// digest), trickling its layer.
    async fn serving(layout: &Path, digest: &Digest) -> anyhow::Result<TricklingRegistry> {
        let blobs = layout.join("blobs/sha256");
        let manifest = std::fs::read(blobs.join(digest.hex()))?;
        let parsed: serde_json::Value = serde_json::from_slice(&manifest)?;
        let config_digest = parsed["config"]["digest"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let config_hex = config_digest.trim_start_matches("sha256:");
        let config = std::fs::read(blobs.join(config_hex))?;
        TricklingRegistry::start(manifest, HashMap::from([(config_digest, config)])).await
    }

    /// Requests for blobs it trickled so far.
    fn trickled(&self) -> usize {
        self.trickled.load(Ordering::SeqCst)
    }

    /// Trickled requests whose client hung up.
    fn hung_up(&self) -> usize {
        self.hung_up.load(Ordering::SeqCst)
    }
}

/// What a [`TricklingRegistry`] serves.
struct Served {
    manifest: Vec<u8>,
    /// Blobs served whole, by digest.
    whole: HashMap<String, Vec<u8>>,
    trickled: Arc<AtomicUsize>,
    hung_up: Arc<AtomicUsize>,
}

/// Answers requests on one connection: the manifest and whole blobs at
/// once, other blobs a byte at a time, anything else (`/v2/`) with `{}`.
async fn serve_trickling(
    mut socket: tokio::net::TcpStream,
    served: Arc<Served>,
) -> std::io::Result<()> {
    let mut buffer = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buffer.extend_from_slice(&chunk[..n]);
        let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
        buffer.drain(..end + 4);
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
        let head_only = head.starts_with("HEAD ");
        let blob = path.split("/blobs/").nth(1);
        let (content_type, body): (&str, &[u8]) = match blob {
            Some(digest) => match served.whole.get(digest) {
                Some(bytes) => ("application/octet-stream", bytes),
                None => {
                    served.trickled.fetch_add(1, Ordering::SeqCst);
                    let sent = trickle(&mut socket).await;
                    if sent.is_err() {
                        served.hung_up.fetch_add(1, Ordering::SeqCst);
                    }
                    sent?;
                    continue;
                }
            },
            None if path.contains("/manifests/") => (
                "application/vnd.oci.image.manifest.v1+json",
                &served.manifest,
            ),
            None => ("application/json", b"{}"),
        };
        let reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nDocker-Content-Digest: {}\r\n\r\n",
            body.len(),
            Digest::of(body)
        );
        socket.write_all(reply.as_bytes()).await?;
        if !head_only {
            socket.write_all(body).await?;
        }
    }
}

/// Sends a 1 MiB blob a byte every 200 ms.
async fn trickle(socket: &mut tokio::net::TcpStream) -> std::io::Result<()> {
    socket
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 1048576\r\n\r\n",
        )
        .await?;
    for _ in 0..1_048_576 {
        socket.write_all(b"{").await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trickling_layer_does_not_hold_other_namespaces_extractions() -> anyhow::Result<()> {
    let node = Node::new("tenancy-trickle-layer-node").await?;
    let (hostile, healthy) = ("tenant-trickling-layer", "tenant-beside-trickling-layer");
    node.plane.ensure_namespace(hostile).await?;
    node.plane.ensure_namespace(healthy).await?;
    let registry = Registry::shared()?;
    let remote = format!("{}/tenancy/layer:v1", registry.addr());
    let layout = node.dir.path().join("layout");
    let (_, good) = push_fixture("triton-vector-add-cuda-sm75", &layout, &remote).await?;
    // The hostile registry serves the very same image (its manifest and
    // config, so the same digest) but trickles its layer.
    let trickling = TricklingRegistry::serving(&layout, &good).await?;
    assert_eq!(trickling.digest, good);

    // The hostile tenant's cache first: the agent starts pulling its layer.
    let slow_image = format!("{}/hostile/layer:v1", trickling.addr);
    node.cache(hostile, "slow", &slow_image, good.as_str(), true)
        .await?;
    let port = gkm_testenv::free_port()?;
    let mut agent = node.agent(port, &[])?;
    until(
        &mut agent,
        "the hostile registry's layer requested",
        Duration::from_secs(60),
        || async { Ok(trickling.trickled() >= 1) },
    )
    .await?;

    // Another tenant's cache of the same digest, from a real registry: its
    // extraction neither waits for the hostile one nor is taken for it.
    node.cache(healthy, "beside", &remote, good.as_str(), true)
        .await?;
    node.until_extracted(
        &mut agent,
        healthy,
        "beside",
        good.as_str(),
        Duration::from_secs(90),
    )
    .await?;
    assert!(digest_dir(&node.store(), good.hex()).is_dir());
    agent.terminate(Duration::from_secs(15))?;
    Ok(())
}

/// The agent's extractions that gave their slot up so far, from its
/// metrics.
async fn slot_yields(port: u16) -> f64 {
    let (_, metrics) = gkm_testenv::http_get(port, "/metrics")
        .await
        .unwrap_or_default();
    samples(&metrics)
        .unwrap_or_default()
        .iter()
        .filter(|s| s.name == "gkm_agent_extraction_slot_yields_total")
        .map(|s| s.value)
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_trickling_namespaces_do_not_delay_a_third_namespaces_cache() -> anyhow::Result<()> {
    let node = Node::new("tenancy-two-trickling-node").await?;
    let hostile = ["tenant-trickling-first", "tenant-trickling-second"];
    let waiting = "tenant-after-two-trickling";
    for namespace in hostile.iter().chain([&waiting]) {
        node.plane.ensure_namespace(namespace).await?;
        // Nothing left from an earlier run on the shared control plane.
        let params = (DeleteParams::default(), ListParams::default());
        Api::<GKMCacheRelease>::namespaced(node.client.clone(), namespace)
            .delete_collection(&params.0, &params.1)
            .await?;
        Api::<GKMCache>::namespaced(node.client.clone(), namespace)
            .delete_collection(&params.0, &params.1)
            .await?;
    }
    // Images of their own (no other test's cache names their digests): one
    // served trickling, the waiting namespace's on a real registry.
    let registry = Registry::shared()?;
    let slow = push_padded(
        node.dir.path(),
        &format!("{}/tenancy/two-trickling:v1", registry.addr()),
        4096,
        8,
    )
    .await?;
    let trickling = TricklingRegistry::serving(&node.dir.path().join("layout-8"), &slow).await?;
    let remote = format!("{}/tenancy/after-two-trickling:v1", registry.addr());
    let good = push_padded(node.dir.path(), &remote, 4096, 7).await?;

    // Two namespaces' caches behind trickling layers take both extraction
    // slots (the agent runs with its defaults).
    for namespace in hostile {
        let image = format!("{}/{namespace}/layer:v1", trickling.addr);
        node.cache(namespace, "slow", &image, slow.as_str(), true)
            .await?;
    }
    let port = gkm_testenv::free_port()?;
    let mut agent = node.agent(port, &[])?;
    until(
        &mut agent,
        "both trickling layers requested",
        Duration::from_secs(60),
        || async { Ok(trickling.trickled() >= 2) },
    )
    .await?;

    // A third namespace's cache is extracted and reported within two
    // minutes, not after the extraction deadline (30 minutes).
    let asked = std::time::Instant::now();
    node.cache(waiting, "waiting", &remote, good.as_str(), true)
        .await?;
    node.until_extracted(
        &mut agent,
        waiting,
        "waiting",
        good.as_str(),
        Duration::from_secs(120),
    )
    .await?;
    println!(
        "the third namespace's cache was extracted {:?} after it was created",
        asked.elapsed()
    );
    // The agent says why: a slot given up, counted...
    let yields = slot_yields(port).await;
    assert!(yields >= 1.0, "{yields} slot yields counted");
    // ...and the yielded extractions cancelled: their connections closed,
    // nothing of them kept.
    until(
        &mut agent,
        "the yielded extractions' connections closed",
        Duration::from_secs(30),
        || async { Ok(trickling.hung_up() as f64 >= yields) },
    )
    .await?;
    assert!(!digest_dir(&node.store(), slow.hex()).exists());
    let staging = std::fs::read_dir(node.store().join("staging"))?
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .count();
    assert!(staging <= 2, "{staging} staging trees for two slots");
    agent.terminate(Duration::from_secs(15))?;
    Ok(())
}

/// Builds the sm75 fixture cache with `padding` more bytes in a file of its
/// own (filled with `fill`, so each image is a digest of its own) and
/// pushes it to `remote`; returns its digest.
async fn push_padded(dir: &Path, remote: &str, padding: usize, fill: u8) -> anyhow::Result<Digest> {
    let tree = dir.join(format!("tree-{fill}"));
    gkm_testenv::copy_tree(&fixture("triton-vector-add-cuda-sm75"), &tree)?;
    std::fs::write(tree.join("padding.bin"), vec![fill; padding])?;
    let (layout, digest) = build_layout(&tree, &dir.join(format!("layout-{fill}"))).await?;
    push(&layout, remote).await?;
    Ok(digest)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_namespace_over_its_byte_cap_does_not_take_the_node_from_others() -> anyhow::Result<()> {
    let node = Node::new("tenancy-byte-caps-node").await?;
    let (greedy, other, late) = (
        "tenant-over-byte-cap",
        "tenant-beside-byte-cap",
        "tenant-after-store-full",
    );
    for namespace in [greedy, other, late] {
        node.plane.ensure_namespace(namespace).await?;
    }
    // Each image takes a little under 500 KiB in the store: one fits a
    // namespace's 768 KiB, two do not; two fit the node's 1280 KiB, three
    // do not.
    let registry = Registry::shared()?;
    let mut images = Vec::new();
    for (fill, name) in [(1u8, "first"), (2, "second"), (3, "beside"), (4, "late")] {
        let remote = format!("{}/tenancy/bytes-{name}:v1", registry.addr());
        let digest = push_padded(node.dir.path(), &remote, 384 << 10, fill).await?;
        images.push((remote, digest));
    }
    let port = gkm_testenv::free_port()?;
    let mut agent = node.agent(
        port,
        &["--namespace-max-bytes=768KiB", "--store-max-bytes=1280KiB"],
    )?;
    let message = |namespace: &'static str, cache: &'static str, digest: Digest| {
        let api: Api<GKMCacheNode> = Api::namespaced(node.client.clone(), namespace);
        let name = node.name.clone();
        async move {
            anyhow::Ok(
                api.get_opt(&name)
                    .await?
                    .and_then(|r| {
                        r.status?
                            .caches?
                            .get(cache)?
                            .get(digest.as_str())?
                            .message
                            .clone()
                    })
                    .unwrap_or_default(),
            )
        }
    };
    let extracted = |namespace: &'static str, cache: &'static str, digest: Digest| {
        let node = &node;
        async move {
            anyhow::Ok(
                node.state(namespace, cache, digest.as_str())
                    .await?
                    .as_deref()
                    == Some("Extracted"),
            )
        }
    };

    // The tenant's first cache fits its cap and is extracted...
    let (first, second, beside, last) = (&images[0], &images[1], &images[2], &images[3]);
    node.cache(greedy, "first", &first.0, first.1.as_str(), true)
        .await?;
    until(
        &mut agent,
        "the tenant's first cache extracted",
        Duration::from_secs(30),
        || extracted(greedy, "first", first.1.clone()),
    )
    .await?;
    // ...its second would take it past the cap: refused, saying so, and
    // nothing of it kept.
    node.cache(greedy, "second", &second.0, second.1.as_str(), true)
        .await?;
    until(
        &mut agent,
        "the tenant's second cache refused for its namespace's cap",
        Duration::from_secs(30),
        || async {
            let m = message(greedy, "second", second.1.clone()).await?;
            Ok(m.contains("namespace") && m.contains(&(768u64 << 10).to_string()))
        },
    )
    .await?;
    assert!(!digest_dir(&node.store(), second.1.hex()).exists());
    // Another namespace's cache is still extracted.
    node.cache(other, "beside", &beside.0, beside.1.as_str(), true)
        .await?;
    until(
        &mut agent,
        "the other namespace's cache extracted",
        Duration::from_secs(30),
        || extracted(other, "beside", beside.1.clone()),
    )
    .await?;
    // The node's store is now too full for a third namespace's cache.
    node.cache(late, "late", &last.0, last.1.as_str(), true)
        .await?;
    until(
        &mut agent,
        "the third namespace's cache refused for the store's cap",
        Duration::from_secs(30),
        || async {
            let m = message(late, "late", last.1.clone()).await?;
            Ok(m.contains("store") && m.contains(&(1280u64 << 10).to_string()))
        },
    )
    .await?;
    assert!(!digest_dir(&node.store(), last.1.hex()).exists());
    assert!(!extracted(greedy, "second", second.1.clone()).await?);
    agent.terminate(Duration::from_secs(15))?;
    Ok(())
}
