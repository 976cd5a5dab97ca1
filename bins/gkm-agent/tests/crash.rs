//! `gkm-agent` against a real kube-apiserver and a real registry when things
//! go wrong: a registry that fails once is tried again (the node report says
//! when), and an agent killed in the middle of an extraction (SIGKILL, 20
//! times in a row, then by the kernel for exceeding a memory cgroup's limit)
//! never leaves a partial tree where the CSI driver looks, and converges once
//! it runs undisturbed; a tree written since its extraction is quarantined
//! at the agent's next start and extracted again.
//!
//! The memory limit is a cgroup (v1 `memory` controller), as Kubernetes
//! applies to the agent's pod: the kernel kills the process when its charged
//! memory passes the limit, exactly what a pod limit does. An address-space
//! rlimit would instead fail allocations (reserved thread stacks and malloc
//! arenas count), which is not what happens to an agent on a node.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gkm_k8s_api::cache_object::CacheKey;
use gkm_k8s_api::crd::{GKMCache, GKMCacheNode};
use gkm_k8s_node::delivery::DeliveryIndex;
use gkm_oci::{Digest, ImageRef};
use gkm_testenv::{ControlPlane, Process, Registry};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

mod support;

use support::{build_layout, fixture, push, registry_options, until, until_some};

/// A copy of the sm75 fixture with `extra` more 1 KiB files, so extracting
/// it takes a while.
fn cache_tree(dir: &Path, extra: usize) -> anyhow::Result<PathBuf> {
    let root = dir.join("cache");
    gkm_testenv::copy_tree(&fixture("triton-vector-add-cuda-sm75"), &root)?;
    let launcher = root.join("Q4KTBUSJ2LEGOHKSPJA2BG4BDURWUGYX7YU6TXZ7DZBKCDBQVGZQ");
    for i in 0..extra {
        let body: Vec<u8> = (0..1024u32).map(|b| (b as usize * 31 + i) as u8).collect();
        std::fs::write(launcher.join(format!("extra-{i:05}.so")), body)?;
    }
    Ok(root)
}

struct Setup {
    plane: &'static ControlPlane,
    client: kube::Client,
    dir: tempfile::TempDir,
    node: String,
    namespace: String,
}

impl Setup {
    async fn new(node: &str, namespace: &str) -> anyhow::Result<Setup> {
        let plane = ControlPlane::shared().await?;
        plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
        plane.ensure_namespace(namespace).await?;
        let client = plane.client().await?;
        plane.ensure_node(node).await?;
        let dir = gkm_testenv::temp_dir()?;
        std::fs::write(dir.path().join("gpus.yaml"), "gpus:\n  - profile: T4\n")?;
        Ok(Setup {
            plane,
            client,
            dir,
            node: node.into(),
            namespace: namespace.into(),
        })
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// The agent's command line, serving `/metrics` on `metrics_port` (0:
    /// any free port).
    fn agent_command_on(&self, metrics_port: u16) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-agent"));
        cmd.arg(format!(
            "--kubeconfig={}",
            self.plane.kubeconfig().display()
        ))
        .arg(format!("--node-name={}", self.node))
        .arg(format!("--store={}", self.store().display()))
        .arg(gkm_testenv::AGENT_KEEP_FREE_ARG)
        .arg(format!(
            "--simulate={}",
            self.dir.path().join("gpus.yaml").display()
        ))
        .arg(format!("--metrics-addr=127.0.0.1:{metrics_port}"))
        .arg("--insecure-registry")
        .arg("--resync=1s")
        .arg("--start-jitter=0s")
        .env("GKM_LOG", "info");
        cmd
    }

    fn agent_command(&self) -> Command {
        self.agent_command_on(0)
    }

    fn agent(&self, name: &str) -> anyhow::Result<Process> {
        Process::spawn(
            name,
            self.agent_command(),
            &self.dir.path().join(format!("{name}.log")),
        )
    }

    /// A cache of `image` whose release says what the operator would: the
    /// digest, deliverable, with the variants of the image in `layout` (the
    /// same image, wherever it is pushed).
    async fn cache(
        &self,
        name: &str,
        image: &str,
        layout: &ImageRef,
        digest: &Digest,
    ) -> anyhow::Result<()> {
        let api: Api<GKMCache> = Api::namespaced(self.client.clone(), &self.namespace);
        let object: GKMCache = serde_json::from_value(json!({
            "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"image": image},
        }))?;
        let apply = PatchParams::apply("gkm-test").force();
        api.patch(name, &apply, &Patch::Apply(&object)).await?;
        let variants = support::variants_of(layout, digest, &registry_options()).await?;
        support::publish_release(
            &self.client,
            &self.namespace,
            name,
            image,
            digest.as_str(),
            Ok(variants),
        )
        .await
    }

    /// This node's report entry for `cache` and `digest`: state and message.
    async fn entry(
        &self,
        cache: &str,
        digest: &Digest,
    ) -> anyhow::Result<Option<(String, String)>> {
        let api: Api<GKMCacheNode> = Api::namespaced(self.client.clone(), &self.namespace);
        let Some(report) = api.get_opt(&self.node).await? else {
            return Ok(None);
        };
        let entry = report
            .status
            .and_then(|s| s.caches)
            .and_then(|c| c.get(cache).cloned())
            .and_then(|e| e.get(digest.as_str()).cloned());
        Ok(entry.map(|e| {
            (
                e.state.map(|s| format!("{s:?}")).unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        }))
    }

    fn key(&self, cache: &str) -> CacheKey {
        CacheKey::namespaced(self.namespace.clone(), cache)
    }
}

/// Waits until this node reports `cache` extracted at `digest`.
async fn until_extracted(
    setup: &Setup,
    agent: &mut Process,
    cache: &str,
    digest: &Digest,
) -> anyhow::Result<()> {
    until(
        agent,
        "the cache extracted",
        Duration::from_secs(300),
        || async {
            Ok(setup
                .entry(cache, digest)
                .await?
                .is_some_and(|(state, _)| state == "Extracted"))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registry_blip_is_tried_again_and_the_report_says_when() -> anyhow::Result<()> {
    let setup = Setup::new("blip-node", "agent-blip").await?;
    let registry = Registry::shared()?;
    let tree = cache_tree(setup.dir.path(), 0)?;
    let (layout, digest) = build_layout(&tree, &setup.dir.path().join("layout")).await?;
    // The image is not in the registry yet: pulling it fails.
    let remote = format!("{}/agent/blip:v1", registry.addr());
    setup.cache("blip", &remote, &layout, &digest).await?;
    let port = gkm_testenv::free_port()?;
    let mut agent = Process::spawn(
        "agent-blip",
        setup.agent_command_on(port),
        &setup.dir.path().join("agent-blip.log"),
    )?;
    until(
        &mut agent,
        "the failure reported",
        Duration::from_secs(60),
        || async {
            Ok(setup
                .entry("blip", &digest)
                .await?
                .is_some_and(|(state, m)| state == "Error" && m.contains("next try at")))
        },
    )
    .await?;
    let (_, message) = setup.entry("blip", &digest).await?.unwrap_or_default();
    assert!(message.contains("(attempt "), "{message}");
    // The registry answers now: the same agent delivers, no restart.
    push(&layout, &remote).await?;
    until_extracted(&setup, &mut agent, "blip", &digest).await?;
    let delivery = DeliveryIndex::new(&setup.store()).get(&setup.key("blip"))?;
    assert!(delivery.is_some_and(|d| d.is_deliverable()));
    // What an operator sees on /metrics: the failed pull, the extractions,
    // what the store holds (other tests' caches too: the cluster is shared,
    // so the figures are compared with the store directory itself); in a
    // shape Prometheus's own linter accepts.
    let value = |metrics: &str, name: &str| -> Option<f64> {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
    };
    let stored = || -> (f64, f64) {
        let digests: Vec<PathBuf> = std::fs::read_dir(setup.store().join("sha256"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        let bytes: u64 = digests
            .iter()
            .flat_map(|d| files(d).into_iter().map(move |f| d.join(f)))
            .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
            .sum();
        (digests.len() as f64, bytes as f64)
    };
    let stored = &stored;
    // The last figures seen, for the failure message.
    let seen = std::sync::Mutex::new(String::new());
    let seen = &seen;
    // The other tests' caches (one of 20 MB) land in this store too, each
    // counted once its pass ends: a loaded machine needs more than a minute.
    let metrics = until_some(
        &mut agent,
        "/metrics matching the store's images and bytes",
        Duration::from_secs(180),
        || async move {
            let last = gkm_testenv::http_get(port, "/metrics").await;
            let (images, bytes) = stored();
            *seen.lock().unwrap_or_else(|e| e.into_inner()) = match &last {
                Some((status, text)) => format!(
                    "store: {images} images, {bytes} bytes; /metrics ({status}): {:?} images, {:?} bytes",
                    value(text, "gkm_agent_store_images"),
                    value(text, "gkm_agent_store_bytes"),
                ),
                None => format!("store: {images} images, {bytes} bytes; /metrics: no answer"),
            };
            Ok(match last {
                Some((200, text))
                    if value(&text, "gkm_agent_store_images") == Some(images)
                        && value(&text, "gkm_agent_store_bytes") == Some(bytes) =>
                {
                    Some(text)
                }
                _ => None,
            })
        },
    )
    .await
    .map_err(|e| {
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        e.context(format!("last seen: {seen}"))
    })?;
    gkm_testenv::promlint(&metrics)?;
    let value = |name: &str| -> f64 {
        value(&metrics, name).unwrap_or_else(|| panic!("{name} missing in:\n{metrics}"))
    };
    assert!(value("gkm_agent_extractions_total{outcome=\"failed\"}") >= 1.0);
    let images = value("gkm_agent_store_images");
    assert!(images >= 1.0, "the blip cache is in the store");
    assert_eq!(
        value("gkm_agent_extractions_total{outcome=\"succeeded\"}"),
        images
    );
    // Failed extractions are timed too.
    assert!(
        value("gkm_agent_extraction_duration_seconds_count")
            >= images + value("gkm_agent_extractions_total{outcome=\"failed\"}")
    );
    assert!(value("gkm_agent_sync_passes_total{outcome=\"succeeded\"}") >= 1.0);
    agent.terminate(Duration::from_secs(15))?;
    Ok(())
}

/// Every regular file below `dir`, relative, sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir) {
                out.push(rel.to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// What the CSI driver could see now: nothing, or the whole tree; and a
/// deliverable entry only with the whole tree in place.
fn assert_no_partial_tree(store: &Path, key: &CacheKey, digest: &Digest, want: &[PathBuf]) {
    let entry = store.join("sha256").join(digest.hex());
    let present = entry.exists();
    if present {
        assert_eq!(files(&entry), want, "a partial tree at {}", entry.display());
    }
    let deliverable = DeliveryIndex::new(store)
        .get(key)
        .ok()
        .flatten()
        .is_some_and(|d| d.is_deliverable());
    assert!(
        !deliverable || present,
        "deliverable without its tree in the store"
    );
}

/// Whether an extraction is under way: a staging directory is filling.
fn extracting(store: &Path) -> bool {
    std::fs::read_dir(store.join("staging"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .any(|e| std::fs::read_dir(e.path()).is_ok_and(|mut d| d.next().is_some()))
}

/// Waits until the agent is extracting.
async fn until_extracting(agent: &mut Process, store: &Path) -> anyhow::Result<()> {
    until(
        agent,
        "extraction under way",
        Duration::from_secs(60),
        || async { Ok(extracting(store)) },
    )
    .await
}

/// A memory cgroup of its own, removed when dropped.
struct MemoryCgroup(PathBuf);

impl MemoryCgroup {
    fn new(name: &str, limit: u64) -> Option<MemoryCgroup> {
        let dir = Path::new("/sys/fs/cgroup/memory").join(name);
        std::fs::create_dir(&dir).ok()?;
        let group = MemoryCgroup(dir);
        std::fs::write(group.0.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
        Some(group)
    }

    fn add(&self, pid: u32) -> std::io::Result<()> {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string())
    }

    fn failures(&self) -> u64 {
        std::fs::read_to_string(self.0.join("memory.failcnt"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_killed_while_extracting_never_shows_a_partial_tree() -> anyhow::Result<()> {
    let setup = Setup::new("crash-node", "agent-crash").await?;
    let registry = Registry::shared()?;
    let tree = cache_tree(setup.dir.path(), 20_000)?;
    let (layout, digest) = build_layout(&tree, &setup.dir.path().join("layout")).await?;
    let remote = format!("{}/agent/crash:v1", registry.addr());
    push(&layout, &remote).await?;
    let mut want: Vec<PathBuf> = files(&tree)
        .into_iter()
        .map(|p| Path::new("io.triton.cache").join(p))
        .collect();
    want.push(PathBuf::from("io.triton.manifest/manifest.json"));
    want.push(PathBuf::from(gkm_oci::seal::SEAL_FILE));
    want.sort();
    setup.cache("crash", &remote, &layout, &digest).await?;
    let key = setup.key("crash");
    let store = setup.store();

    // SIGKILL in the middle of extracting, 20 times in a row, at a different
    // point each time.
    for round in 0..20u64 {
        let mut agent = setup.agent(&format!("agent-kill-{round}"))?;
        until_extracting(&mut agent, &store).await?;
        tokio::time::sleep(Duration::from_millis(round * 97 % 1500)).await;
        agent.kill();
        let entry = store.join("sha256").join(digest.hex());
        assert!(
            !entry.exists(),
            "round {round}: the extraction finished before the kill; make the image larger"
        );
        assert_no_partial_tree(&store, &key, &digest, &want);
    }

    // Killed by the kernel: the agent joins a memory cgroup once it
    // extracts, whose limit its extraction's memory exceeds.
    let name = format!("gkm-agent-test-{}", std::process::id());
    match MemoryCgroup::new(&name, 4 << 20) {
        None => eprintln!(
            "skipping the memory-limit part: cannot create a memory cgroup under /sys/fs/cgroup/memory (needs root and cgroup v1)"
        ),
        Some(group) => {
            let mut child = setup
                .agent_command()
                .stdout(std::fs::File::create(
                    setup.dir.path().join("agent-oom.log"),
                )?)
                .stderr(std::fs::File::create(
                    setup.dir.path().join("agent-oom.err"),
                )?)
                .spawn()?;
            let began = Instant::now();
            while !extracting(&store) {
                anyhow::ensure!(began.elapsed() < Duration::from_secs(60), "no extraction");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            group.add(child.id())?;
            let exited = gkm_testenv::eventually(
                "the agent killed at its memory limit",
                Duration::from_secs(120),
                || {
                    let status = child.try_wait();
                    async move { Ok(status?) }
                },
            )
            .await;
            if exited.is_err() {
                let _ = child.kill();
            }
            let status = exited?;
            use std::os::unix::process::ExitStatusExt as _;
            assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
            assert!(group.failures() > 0, "the limit was never hit");
            assert!(!store.join("sha256").join(digest.hex()).exists());
            assert_no_partial_tree(&store, &key, &digest, &want);
        }
    }

    // Undisturbed, it converges: the whole tree, deliverable, no leftovers.
    let mut agent = setup.agent("agent-final")?;
    until_extracted(&setup, &mut agent, "crash", &digest).await?;
    assert_no_partial_tree(&store, &key, &digest, &want);
    assert_eq!(files(&store.join("sha256").join(digest.hex())), want);
    let delivery = DeliveryIndex::new(&store).get(&key)?;
    assert!(delivery.is_some_and(|d| d.is_deliverable()));
    let leftovers: Vec<_> = std::fs::read_dir(store.join("staging"))?
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(leftovers.is_empty(), "staging holds {leftovers:?}");
    // Its peak memory, the whole extraction included.
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid()))?;
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(u64::MAX);
    assert!(peak_kib < 128 << 10, "the agent peaked at {peak_kib} KiB");
    agent.terminate(Duration::from_secs(15))?;
    Ok(())
}

/// A tree written since it was extracted (by a pod of a release whose
/// deliveries could write into the store, say): the agent's next start
/// finds its seal broken, quarantines it, extracts the verified image
/// again, and removes the quarantined tree once no pod mounts it.
#[tokio::test(flavor = "multi_thread")]
async fn a_tree_written_since_extraction_is_quarantined_and_extracted_again() -> anyhow::Result<()>
{
    let setup = Setup::new("seal-node", "agent-seal").await?;
    let registry = Registry::shared()?;
    // One file more than the other tests' trees: a digest of its own, as
    // every agent on the shared control plane serves every cache.
    let tree = cache_tree(setup.dir.path(), 1)?;
    let (layout, digest) = build_layout(&tree, &setup.dir.path().join("layout")).await?;
    let remote = format!("{}/agent/seal:v1", registry.addr());
    push(&layout, &remote).await?;
    setup.cache("seal", &remote, &layout, &digest).await?;
    let store = setup.store();
    let entry = store.join("sha256").join(digest.hex());

    let mut agent = setup.agent("agent-seal-first")?;
    until_extracted(&setup, &mut agent, "seal", &digest).await?;
    let extracted = files(&entry);
    assert!(
        extracted.contains(&PathBuf::from(gkm_oci::seal::SEAL_FILE)),
        "sealed at extraction: {extracted:?}"
    );
    agent.kill();

    // A kernel planted in the tree.
    let planted = entry.join("io.triton.cache/NEWKEYAAAA");
    std::fs::create_dir(&planted)?;
    std::fs::write(planted.join("add_kernel.cubin"), b"planted")?;

    let mut agent = setup.agent("agent-seal-second")?;
    until(
        &mut agent,
        "the written tree replaced by a fresh extraction",
        Duration::from_secs(120),
        || async {
            let quarantine = store.join("quarantine");
            let released = std::fs::read_dir(&quarantine)
                .map(|mut d| d.next().is_none())
                .unwrap_or(false);
            Ok(released
                && entry.is_dir()
                && gkm_oci::seal::check(&entry) == gkm_oci::seal::SealCheck::Intact)
        },
    )
    .await?;
    assert_eq!(
        files(&entry),
        extracted,
        "the verified tree, nothing planted"
    );
    until_extracted(&setup, &mut agent, "seal", &digest).await?;
    let log = agent.log_tail(200);
    assert!(
        log.contains("quarantined a store entry") && log.contains("changed since it was extracted"),
        "{log}"
    );
    Ok(())
}
