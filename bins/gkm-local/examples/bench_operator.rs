//! The operator and agents at scale (run by `hack/bench/operator.sh`): a
//! real control plane (etcd, kube-apiserver with an audit log), kwok nodes
//! with simulated GPUs, a real Distribution registry with its access log on,
//! signed cache images, one gkm operator process and one process running
//! the real agent library once per node (`gkm-agent`'s `agents` example).
//!
//! ```sh
//! # one revision: its deploy/ tree, operator and agents binaries
//! bench_operator run TREE OPERATOR AGENTS OUT.json
//! # the table: figures of both and the ratio after / baseline
//! bench_operator compare BASELINE.json AFTER.json
//! # the after run's figures alone
//! bench_operator compare - AFTER.json
//! # either, also writing both runs' summaries (and ratios) to SUMMARY.json
//! bench_operator compare BASELINE.json AFTER.json SUMMARY.json
//! # fail, naming the install command, when a component is missing
//! bench_operator check
//! ```
//!
//! `run` reads NODES (1000), CACHES (50), CHANGED (5, at most CACHES), T4_PER_TEN (8: of
//! every ten nodes, how many have the GPU the caches fit; 0: none, so
//! nothing is extracted), SIGNATURES (v3: cosign v3's sigstore bundles; v2:
//! cosign v2's `.sig` tags), IDLE_SECS (600) and CONVERGE_TIMEOUT_SECS
//! (1800) from the environment. Phases, each counted
//! apart: the agents start (Node labels); CACHES GKMCaches are created and
//! converge; CHANGED of them get a new image and converge again; then
//! nothing changes for IDLE_SECS. A revision whose caches do not all
//! converge within CONVERGE_TIMEOUT_SECS is measured up to there (how many
//! did is `converged_caches`), and its change and idle phases are skipped
//! (their figures `null`). API requests are read from the
//! apiserver's audit log (user, verb, resource, subresource of each
//! request by the operator's and the agents' ServiceAccounts), registry
//! requests from the registry's access log. Writes the apiserver refused
//! (429 when it sheds load, 409, 5xx) are counted apart from the writes it
//! took: a refused write changed nothing and is not the writer's choice to
//! repeat one, since kube's client retries 429, 503 and 504 itself.
//!
//! Besides the table's figures, each run's OUT.json holds a `summary` of
//! what scales ([`Summary`]); `compare … SUMMARY.json` writes the summaries
//! of both revisions (and the ratios after / baseline when both ran) there.
//! The watch events agents receive are read from the apiserver's
//! `apiserver_watch_events_total` for the resources the revision's agents
//! watch ([`agent_watched`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead as _, Seek as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use gkm_local::cosign;
use gkm_oci::{BuildOptions, ImageRef, RegistryOptions};
use gkm_testenv::{ControlPlane, ControlPlaneOptions, Kwok, Process, Registry};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The fixture cache every image is built from (sm75 kernels).
const FIXTURE: &str = "triton-vector-add-cuda-sm75";
/// The namespace of the benchmark's caches.
const NAMESPACE: &str = "bench";
/// The operator's and agents' users, as their ServiceAccounts.
const OPERATOR_USER: &str = "system:serviceaccount:gkm-system:gkm-operator";
const AGENT_USER: &str = "system:serviceaccount:gkm-system:gkm-agent";
/// The caches the harness creates and the operator writes the status of,
/// as (kind, plural).
const CACHE_KINDS: &[(&str, &str)] = &[
    ("GKMCache", "gkmcaches"),
    ("ClusterGKMCache", "clustergkmcaches"),
];
/// The node reports the agents write, as (kind, plural): their writes are
/// the agents' report writes and their stored changes are counted.
const AGENT_REPORTS: &[(&str, &str)] = &[
    ("GKMCacheNode", "gkmcachenodes"),
    ("ClusterGKMCacheNode", "clustergkmcachenodes"),
];

/// The gkm.io resources a revision's agents watch: those its agent
/// ClusterRole (`deploy/rbac/agent.yaml`) may `watch`, but the reports they
/// write. Read from each revision's own RBAC, so that the figure counts the
/// caches for a revision whose agents watch the caches, and the releases for
/// one whose agents watch those.
fn agent_watched(tree: &Path) -> anyhow::Result<BTreeSet<String>> {
    let path = tree.join("deploy/rbac/agent.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut watched = BTreeSet::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let object = serde_yaml::Value::deserialize(document)
            .with_context(|| format!("{}: not YAML", path.display()))?;
        if object["kind"].as_str() != Some("ClusterRole") {
            continue;
        }
        let strings = |value: &serde_yaml::Value| -> Vec<String> {
            value
                .as_sequence()
                .map(|items| {
                    items
                        .iter()
                        .filter_map(|i| i.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        for rule in object["rules"].as_sequence().into_iter().flatten() {
            if strings(&rule["apiGroups"]).iter().any(|g| g == "gkm.io")
                && strings(&rule["verbs"]).iter().any(|v| v == "watch")
            {
                watched.extend(strings(&rule["resources"]).into_iter().filter(|r| {
                    !r.contains('/') && !AGENT_REPORTS.iter().any(|(_, plural)| plural == r)
                }));
            }
        }
    }
    anyhow::ensure!(
        !watched.is_empty(),
        "{}: the agents' ClusterRole watches no gkm.io resource but their reports",
        path.display()
    );
    Ok(watched)
}

/// No gkm write for this long after convergence ends a phase.
const QUIET: Duration = Duration::from_secs(15);
/// The longest a phase waits for that quiet after converging.
const SETTLE_MAX: Duration = Duration::from_secs(120);

/// Audit only the operator's and agents' requests, one event per request.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  users: [\"system:serviceaccount:gkm-system:gkm-operator\", \"system:serviceaccount:gkm-system:gkm-agent\"]
- level: None
";

/// The benchmark's size, from the environment.
struct Scale {
    nodes: usize,
    caches: usize,
    changed: usize,
    /// Of every ten nodes, how many have a GPU the caches fit (0: none,
    /// so nothing is extracted and every node finds every cache
    /// incompatible).
    t4_per_ten: usize,
    /// How the images are signed.
    signatures: Signatures,
    idle: Duration,
    converge_timeout: Duration,
}

impl Scale {
    fn from_env() -> anyhow::Result<Scale> {
        let var = |name: &str, default: u64| -> anyhow::Result<u64> {
            match std::env::var(name) {
                Ok(v) => v
                    .parse()
                    .with_context(|| format!("{name}={v:?}: not a whole number")),
                Err(_) => Ok(default),
            }
        };
        let caches = var("CACHES", 50)? as usize;
        let scale = Scale {
            nodes: var("NODES", 1000)? as usize,
            caches,
            // 5 of the caches, or all of them when there are fewer.
            changed: var("CHANGED", caches.min(5) as u64)? as usize,
            t4_per_ten: var("T4_PER_TEN", 8)? as usize,
            signatures: match std::env::var("SIGNATURES").as_deref() {
                Err(_) | Ok("v3") => Signatures::V3,
                Ok("v2") => Signatures::V2,
                Ok(other) => anyhow::bail!("SIGNATURES must be v3 or v2, not {other:?}"),
            },
            idle: Duration::from_secs(var("IDLE_SECS", 600)?),
            converge_timeout: Duration::from_secs(var("CONVERGE_TIMEOUT_SECS", 1800)?),
        };
        anyhow::ensure!(scale.nodes >= 10, "NODES must be at least 10");
        anyhow::ensure!(scale.caches >= 1, "CACHES must be at least 1");
        anyhow::ensure!(scale.t4_per_ten <= 10, "T4_PER_TEN must be from 0 to 10");
        anyhow::ensure!(
            scale.changed <= scale.caches,
            "CHANGED must be at most CACHES"
        );
        Ok(scale)
    }
}

/// How the benchmark's images are signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Signatures {
    /// cosign v3: a sigstore bundle attached as an OCI referrer.
    V3,
    /// cosign v2: a simple-signing payload at the `sha256-<hex>.sig` tag.
    V2,
}

/// A node's simulated GPUs: `t4_per_ten` in ten an NVIDIA T4 (sm75), which
/// the CUDA fixture fits; of the others, alternately an AMD MI210 (gfx90a)
/// and no GPU. The default, 8, gives 8 T4, 1 MI210 and 1 without GPUs.
fn inventory(index: usize, t4_per_ten: usize) -> (&'static str, bool) {
    let place = index % 10;
    if place < t4_per_ten {
        ("gpus:\n- profile: T4\n", true)
    } else if (place - t4_per_ten).is_multiple_of(2) {
        ("gpus:\n- profile: MI210\n", false)
    } else {
        ("gpus: []\n", false)
    }
}

fn node_name(index: usize) -> String {
    format!("gpu-{index:04}")
}

/// Requests counted in one phase.
#[derive(Default)]
struct Counts {
    /// (writer, verb, resource[/subresource]) → requests, less the
    /// refused writes.
    api: BTreeMap<(String, String, String), u64>,
    /// (writer, resource[/subresource], response code) → writes the
    /// apiserver refused.
    refused: BTreeMap<(String, String, u64), u64>,
    /// Registry requests: tag resolutions (manifests by tag) and the rest.
    registry_tags: u64,
    registry_other: u64,
    /// Registry GETs of a cache image's layer: one per extraction.
    layer_gets: u64,
    /// Registry requests by kind ([`registry_kind`]: method, what was
    /// asked for, response code).
    registry_kinds: BTreeMap<String, u64>,
    /// Changes the apiserver stored (new resourceVersions, as watched):
    /// of the caches and of the agents' reports.
    cache_changes: u64,
    report_changes: u64,
}

impl Counts {
    /// Registry requests of extractions: a cache image's manifest by digest
    /// and its layer.
    fn extraction_requests(&self) -> u64 {
        self.registry_kinds
            .iter()
            .filter(|(kind, _)| kind.contains(IMAGE_MANIFEST) || kind.as_str() == LAYER_GET)
            .map(|(_, n)| n)
            .sum()
    }

    fn writes(&self, writer: &str, resource: Option<&str>) -> u64 {
        self.api
            .iter()
            .filter(|((w, verb, res), _)| {
                w == writer && is_write(verb) && resource.is_none_or(|r| res == r)
            })
            .map(|(_, n)| n)
            .sum()
    }

    fn refused(&self, writer: &str) -> u64 {
        self.refused
            .iter()
            .filter(|((w, _, _), _)| w == writer)
            .map(|(_, n)| n)
            .sum()
    }

    /// The writes of `writer` to any of `resources` and their status.
    fn writes_to(&self, writer: &str, resources: &[(&str, &str)]) -> u64 {
        resources
            .iter()
            .flat_map(|(_, plural)| [plural.to_string(), format!("{plural}/status")])
            .map(|r| self.writes(writer, Some(&r)))
            .sum()
    }

    fn reads(&self, writer: &str) -> u64 {
        self.api
            .iter()
            .filter(|((w, verb, _), _)| w == writer && !is_write(verb))
            .map(|(_, n)| n)
            .sum()
    }

    fn print(&self, phase: &str) {
        eprintln!(
            "   {phase}: registry {} tag resolutions, {} other requests ({} layer GETs); \
             stored changes: {} of caches, {} of node reports",
            self.registry_tags,
            self.registry_other,
            self.layer_gets,
            self.cache_changes,
            self.report_changes
        );
        for (kind, n) in &self.registry_kinds {
            eprintln!("   {phase}: registry {kind:<40} {n}");
        }
        for ((writer, verb, resource), n) in &self.api {
            eprintln!("   {phase}: {writer:<8} {verb:<8} {resource:<28} {n}");
        }
        for ((writer, resource, code), n) in &self.refused {
            eprintln!("   {phase}: {writer:<8} refused  {resource:<28} {n} ({code})");
        }
    }
}

fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

/// Where a log file was read up to.
struct LogMark {
    path: PathBuf,
    offset: u64,
}

impl LogMark {
    fn at_end(path: &Path) -> anyhow::Result<LogMark> {
        let offset = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        Ok(LogMark {
            path: path.to_path_buf(),
            offset,
        })
    }

    /// The whole lines written since the mark; moves the mark past them.
    fn new_lines(&mut self) -> anyhow::Result<Vec<String>> {
        let mut file = std::fs::File::open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        file.seek(std::io::SeekFrom::Start(self.offset))?;
        let mut reader = std::io::BufReader::new(file);
        let mut lines = Vec::new();
        let mut line = String::new();
        while reader.read_line(&mut line)? > 0 {
            if !line.ends_with('\n') {
                break;
            }
            self.offset += line.len() as u64;
            lines.push(std::mem::take(&mut line));
        }
        Ok(lines)
    }
}

/// Counts the changes the apiserver stores to objects of `resource`
/// (every add, modification or deletion a watch sees, not the initial
/// listing) into `changes`; returns once the watch has listed, with the
/// task that watches.
async fn count_changes(
    client: &kube::Client,
    resource: ApiResource,
    changes: Arc<AtomicU64>,
) -> anyhow::Result<tokio::task::AbortHandle> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let (listed, ready) = tokio::sync::oneshot::channel();
    let mut listed = Some(listed);
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let task = tokio::spawn(stream.for_each(move |event| {
        match event {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                changes.fetch_add(1, Ordering::Relaxed);
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(listed) = listed.take() {
                    let _ = listed.send(());
                }
            }
            Ok(_) => {}
            Err(e) => eprintln!("watching {}: {e}", resource.plural),
        }
        std::future::ready(())
    }));
    tokio::time::timeout(Duration::from_secs(30), ready)
        .await
        .context("the watch did not list in 30s")??;
    Ok(task.abort_handle())
}

fn gkm_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "gkm.io".into(),
        version: "v1alpha1".into(),
        api_version: "gkm.io/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Counts the audit log's and the registry access log's new lines, and
/// the changes stored to caches and node reports.
struct Meter {
    audit: LogMark,
    registry: LogMark,
    /// The cache images, to tell their requests apart.
    images: CacheImages,
    cache_changes: Arc<AtomicU64>,
    report_changes: Arc<AtomicU64>,
    watches: Vec<tokio::task::AbortHandle>,
}

impl Drop for Meter {
    fn drop(&mut self) {
        for watch in &self.watches {
            watch.abort();
        }
    }
}

impl Meter {
    async fn start(
        client: &kube::Client,
        audit: &Path,
        registry: &Path,
        images: CacheImages,
    ) -> anyhow::Result<Meter> {
        let cache_changes = Arc::new(AtomicU64::new(0));
        let report_changes = Arc::new(AtomicU64::new(0));
        let mut watches = Vec::new();
        let counted = CACHE_KINDS
            .iter()
            .map(|kind| (kind, &cache_changes))
            .chain(AGENT_REPORTS.iter().map(|kind| (kind, &report_changes)));
        for ((kind, plural), counter) in counted {
            watches.push(count_changes(client, gkm_resource(kind, plural), counter.clone()).await?);
        }
        Ok(Meter {
            audit: LogMark::at_end(audit)?,
            registry: LogMark::at_end(registry)?,
            images,
            cache_changes,
            report_changes,
            watches,
        })
    }

    /// Adds what was logged since the last call to `counts`; returns how
    /// many gkm writes that was.
    fn take(&mut self, counts: &mut Counts) -> anyhow::Result<u64> {
        let mut writes = 0;
        for line in self.audit.new_lines()? {
            let event: serde_json::Value =
                serde_json::from_str(&line).with_context(|| format!("audit log line {line:?}"))?;
            let writer = match event["user"]["username"].as_str() {
                Some(OPERATOR_USER) => "operator",
                Some(AGENT_USER) => "agents",
                _ => continue,
            };
            let verb = event["verb"].as_str().unwrap_or("?").to_string();
            let object = &event["objectRef"];
            let mut resource = object["resource"].as_str().unwrap_or("-").to_string();
            if let Some(sub) = object["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            if is_write(&verb) {
                // Refused writes count towards the phase's activity too.
                writes += 1;
                let code = event["responseStatus"]["code"].as_u64().unwrap_or(0);
                if code >= 400 {
                    *counts
                        .refused
                        .entry((writer.to_string(), resource, code))
                        .or_default() += 1;
                    continue;
                }
            }
            *counts
                .api
                .entry((writer.to_string(), verb, resource))
                .or_default() += 1;
        }
        for line in self.registry.new_lines()? {
            let Some(request) = registry_request(&line) else {
                continue;
            };
            if is_tag_resolution(request.path) {
                counts.registry_tags += 1;
            } else {
                counts.registry_other += 1;
            }
            let kind = registry_kind(&request, &self.images);
            if kind == LAYER_GET {
                counts.layer_gets += 1;
            }
            *counts.registry_kinds.entry(kind).or_default() += 1;
        }
        counts.cache_changes += self.cache_changes.swap(0, Ordering::Relaxed);
        counts.report_changes += self.report_changes.swap(0, Ordering::Relaxed);
        Ok(writes)
    }
}

/// One request of the registry's access log.
struct RegistryRequest<'a> {
    method: &'a str,
    path: &'a str,
    /// The response code (0 where the line has none).
    code: u16,
}

/// The request of an access log line (`… "GET /v2/... HTTP/1.1" 200 …`).
fn registry_request(line: &str) -> Option<RegistryRequest<'_>> {
    let mut quoted = line.split('"');
    let request = quoted.nth(1)?;
    let code = quoted
        .next()
        .and_then(|after| after.split_whitespace().next())
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let mut parts = request.split(' ');
    let method = parts.next()?;
    let path = parts.next()?;
    (matches!(method, "GET" | "HEAD" | "PUT" | "POST" | "PATCH" | "DELETE")
        && path.starts_with("/v2/"))
    .then_some(RegistryRequest { method, path, code })
}

/// The kind of a cache image's layer GET (one per extraction).
const LAYER_GET: &str = "GET layer blob 200";
/// What a request for a cache image's manifest by digest is.
const IMAGE_MANIFEST: &str = "image manifest by digest";

/// The digests of the cache images the benchmark pushed.
#[derive(Default)]
struct CacheImages {
    /// Their manifests.
    manifests: BTreeSet<String>,
    /// Their layers.
    layers: BTreeSet<String>,
}

/// What a registry request asked for, without the repository or digest
/// (`GET manifest by tag 200`, `HEAD cosign v2 .sig tag 404`, …): the
/// figure that says which requests each cache and each extraction cost.
/// A cache image's manifest and layer are told apart from the signatures'
/// and other blobs.
fn registry_kind(request: &RegistryRequest, images: &CacheImages) -> String {
    let path = request.path;
    let what = if path == "/v2/" {
        "API version check"
    } else if let Some((_, reference)) = path.rsplit_once("/manifests/") {
        match reference.strip_prefix("sha256-") {
            Some(rest) if rest.ends_with(".sig") => "cosign v2 .sig tag",
            Some(_) => "referrers tag-schema index",
            None if images.manifests.contains(reference) => IMAGE_MANIFEST,
            None if reference.starts_with("sha256:") => "other manifest by digest",
            None => "manifest by tag",
        }
    } else if let Some((_, digest)) = path.rsplit_once("/blobs/") {
        if images.layers.contains(digest) {
            "layer blob"
        } else {
            "other blob"
        }
    } else if path.contains("/referrers/") {
        "referrers API"
    } else {
        "other"
    };
    format!("{} {what} {}", request.method, request.code)
}

/// The watch events the apiserver has sent so far for the `watched`
/// gkm.io resources ([`agent_watched`]; `apiserver_watch_events_total`).
/// The apiserver counts the events of every watcher, so the operator's
/// watch of those resources and this harness's (one each at most) count too.
async fn agent_watch_events(
    client: &kube::Client,
    watched: &BTreeSet<String>,
) -> anyhow::Result<f64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(request)
        .await
        .context("reading the apiserver's metrics")?;
    Ok(gkm_testenv::samples(&text)?
        .iter()
        .filter(|s| s.name == "apiserver_watch_events_total")
        .filter(|s| {
            s.label("group") == Some("gkm.io")
                && watched.contains(s.label("resource").unwrap_or_default())
        })
        .map(|s| s.value)
        .sum())
}

/// A manifest request by tag (not by digest, not a `sha256-…` signature tag).
fn is_tag_resolution(path: &str) -> bool {
    path.rsplit_once("/manifests/")
        .is_some_and(|(_, reference)| !reference.starts_with("sha256"))
}

/// One revision's stack.
struct Bench {
    _registry: Registry,
    plane: ControlPlane,
    _kwok: Kwok,
    client: kube::Client,
    registry_addr: String,
    audit_log: PathBuf,
    registry_log: PathBuf,
}

impl Bench {
    async fn start(dir: &Path, tree: &Path) -> anyhow::Result<Bench> {
        let policy = dir.join("audit-policy.yaml");
        std::fs::write(&policy, AUDIT_POLICY)?;
        let audit_log = dir.join("audit.log");
        let options = ControlPlaneOptions {
            apiserver_args: vec![
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", audit_log.display()),
                "--audit-log-format=json".into(),
                "--audit-log-mode=blocking".into(),
                "--audit-log-maxsize=0".into(),
            ],
            controller_manager: true,
            ..ControlPlaneOptions::default()
        };
        let plane = ControlPlane::start_in_dir(dir, options).await?;
        let deploy = tree.join("deploy");
        let mut crds = Vec::new();
        for entry in std::fs::read_dir(deploy.join("crds"))? {
            let path = entry?.path();
            let text = std::fs::read_to_string(&path)?;
            let crd: CustomResourceDefinition = serde_yaml::from_str(&text)
                .with_context(|| format!("{}: not a CRD", path.display()))?;
            crds.push(crd);
        }
        plane.install_crds(&crds).await?;
        plane.apply_file(&deploy.join("namespace.yaml")).await?;
        for file in ["operator.yaml", "agent.yaml"] {
            plane.apply_file(&deploy.join("rbac").join(file)).await?;
        }
        plane.ensure_namespace(NAMESPACE).await?;
        let kwok = Kwok::start(&plane)?;
        let registry_dir = dir.join("registry");
        std::fs::create_dir_all(&registry_dir)?;
        let registry = Registry::start_in_dir(&registry_dir)?;
        Ok(Bench {
            client: plane.client().await?,
            registry_addr: registry.addr().to_string(),
            registry_log: registry.root().join("registry.log"),
            _registry: registry,
            plane,
            _kwok: kwok,
            audit_log,
        })
    }

    /// Creates the kwok Nodes and their agents' directories under `nodes_dir`.
    async fn create_nodes(&self, scale: &Scale, nodes_dir: &Path) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut pending = tokio::task::JoinSet::new();
        for index in 0..scale.nodes {
            let name = node_name(index);
            let node_dir = nodes_dir.join(&name);
            std::fs::create_dir_all(node_dir.join("store"))?;
            std::fs::write(
                node_dir.join("gpus.yaml"),
                inventory(index, scale.t4_per_ten).0,
            )?;
            let resources = json!({"cpu": "64", "memory": "512Gi", "pods": "110"});
            let node: Node = serde_json::from_value(json!({
                "metadata": {
                    "name": name,
                    "labels": {"type": "kwok", "kubernetes.io/hostname": name},
                    "annotations": {gkm_testenv::KWOK_NODE_ANNOTATION: "fake"},
                },
                "status": {"capacity": resources, "allocatable": resources},
            }))?;
            let nodes = nodes.clone();
            pending.spawn(async move { nodes.create(&PostParams::default(), &node).await });
            if pending.len() >= 16 {
                pending.join_next().await.transpose()?.transpose()?;
            }
        }
        while let Some(done) = pending.join_next().await {
            done??;
        }
        Ok(())
    }

    /// Builds the CUDA fixture into `repository:tag` with its own title (so
    /// its own digest), signs it with `key` as `signatures` says and
    /// returns the digest and its layer's digest.
    async fn push(
        &self,
        repository: &str,
        tag: &str,
        title: &str,
        key: &cosign::CosignKey,
        signatures: Signatures,
    ) -> anyhow::Result<(String, String)> {
        let reference = format!("{}/{repository}:{tag}", self.registry_addr);
        let dest: ImageRef = reference.parse()?;
        let build = BuildOptions {
            title: Some(title.into()),
            ..BuildOptions::default()
        };
        let registry = RegistryOptions {
            insecure: true,
            ..RegistryOptions::default()
        };
        let fixture = gkm_local::fixture(FIXTURE);
        let built = gkm_oci::build(&fixture, &dest, &build, &registry)
            .await
            .with_context(|| format!("building {} into {reference}", fixture.display()))?;
        let digest = built.digest.to_string();
        let key = key.clone();
        let signed = format!("{}/{repository}@{digest}", self.registry_addr);
        tokio::task::spawn_blocking(move || match signatures {
            Signatures::V3 => cosign::sign(&key, &signed),
            Signatures::V2 => cosign::sign_v2(&key, &signed),
        })
        .await??;
        Ok((digest, built.layer.digest.to_string()))
    }

    fn caches(&self) -> Api<DynamicObject> {
        let resource = gkm_resource("GKMCache", "gkmcaches");
        Api::namespaced_with(self.client.clone(), NAMESPACE, &resource)
    }

    /// Creates a GKMCache per `images` entry (`bench/NAME:v1`); they are
    /// verified under the operator's default policy ([`Gkm::start`]).
    async fn create_caches(&self, images: &BTreeMap<String, String>) -> anyhow::Result<()> {
        for name in images.keys() {
            let cache: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "gkm.io/v1alpha1",
                "kind": "GKMCache",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {
                    "image": format!("{}/bench/{name}:v1", self.registry_addr),
                },
            }))?;
            self.caches().create(&PostParams::default(), &cache).await?;
        }
        Ok(())
    }

    /// Points the caches of `images` at their `:v2` tag.
    async fn move_caches(&self, images: &BTreeMap<String, String>) -> anyhow::Result<()> {
        for name in images.keys() {
            let image = format!("{}/bench/{name}:v2", self.registry_addr);
            let patch = json!({"spec": {"image": image}});
            self.caches()
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Ok(())
    }

    /// Waits until every cache of `expected` (name → digest) reports its
    /// digest resolved, every node counted, every compatible node holding
    /// it extracted and every other node finding it incompatible: each node
    /// has decided on that digest, not only reported the cache. Returns how
    /// many of them converged: all, or those that had when
    /// CONVERGE_TIMEOUT_SECS ran out.
    async fn converge(
        &self,
        expected: &BTreeMap<String, String>,
        scale: &Scale,
        compatible: usize,
        gkm: &mut Gkm,
    ) -> anyhow::Result<usize> {
        let (nodes, timeout) = (scale.nodes, scale.converge_timeout);
        let deadline = Instant::now() + timeout;
        let mut last_report = Instant::now();
        loop {
            gkm.check_running()?;
            // The apiserver is loaded to its limits here: a failed poll is
            // tried again, within the deadline.
            let list = match self.caches().list(&ListParams::default()).await {
                Ok(list) => list,
                Err(e) => {
                    eprintln!("   listing the caches: {e}; trying again");
                    anyhow::ensure!(Instant::now() < deadline, "listing the caches: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let mut done = 0;
            let mut behind = String::new();
            for cache in &list.items {
                let name = cache.metadata.name.clone().unwrap_or_default();
                let Some(digest) = expected.get(&name) else {
                    continue;
                };
                let status = &cache.data["status"];
                let counts = &status["counts"];
                let count = |field: &str| counts[field].as_u64().unwrap_or(0) as usize;
                let extracted = count("nodeNotInUseCnt") + count("nodeInUseCnt");
                if status["resolvedDigest"].as_str() == Some(digest.as_str())
                    && count("nodeCnt") == nodes
                    && extracted == compatible
                    && count("nodeIncompatibleCnt") == nodes - compatible
                {
                    done += 1;
                } else if behind.is_empty() {
                    behind = format!("{name}: {counts}");
                }
            }
            if done == expected.len() {
                return Ok(done);
            }
            if last_report.elapsed() > Duration::from_secs(30) {
                eprintln!("   {done}/{} converged; {behind}", expected.len());
                last_report = Instant::now();
            }
            if Instant::now() >= deadline {
                eprintln!(
                    "   only {done} of {} caches converged in {timeout:?}; {behind}",
                    expected.len()
                );
                return Ok(done);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Counts until no gkm write came for [`QUIET`] (at most [`SETTLE_MAX`]);
/// returns whether it got quiet.
async fn settle(meter: &mut Meter, counts: &mut Counts) -> anyhow::Result<bool> {
    let began = Instant::now();
    let mut last_write = Instant::now();
    loop {
        if meter.take(counts)? > 0 {
            last_write = Instant::now();
        }
        if last_write.elapsed() >= QUIET {
            return Ok(true);
        }
        if began.elapsed() >= SETTLE_MAX {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Where the nodes' stores go: `STORES_DIR`, else `/dev/shm` where there is
/// one. A thousand agents sharing one disk would wait on each other's
/// fsyncs, which no real node does.
fn stores_root() -> PathBuf {
    match std::env::var_os("STORES_DIR") {
        Some(dir) => PathBuf::from(dir),
        None if Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
        None => std::env::temp_dir(),
    }
}

/// The images the benchmark pushed: name → digest of the first set and of
/// the changed ones, and the digests of all.
struct Pushed {
    first: BTreeMap<String, String>,
    second: BTreeMap<String, String>,
    images: CacheImages,
}

/// Builds CACHES images (`bench/cache-NN:v1`) and, for the first CHANGED,
/// another (`:v2`), all signed with `key`.
async fn push_images(
    bench: &Bench,
    scale: &Scale,
    key: &cosign::CosignKey,
) -> anyhow::Result<Pushed> {
    let mut pushed = Pushed {
        first: BTreeMap::new(),
        second: BTreeMap::new(),
        images: CacheImages::default(),
    };
    for i in 0..scale.caches {
        let name = format!("cache-{i:02}");
        let repository = format!("bench/{name}");
        let (digest, layer) = bench
            .push(&repository, "v1", &name, key, scale.signatures)
            .await?;
        pushed.images.manifests.insert(digest.clone());
        pushed.images.layers.insert(layer);
        pushed.first.insert(name.clone(), digest);
        if i < scale.changed {
            let (digest, layer) = bench
                .push(
                    &repository,
                    "v2",
                    &format!("{name}-v2"),
                    key,
                    scale.signatures,
                )
                .await?;
            pushed.images.manifests.insert(digest.clone());
            pushed.images.layers.insert(layer);
            pushed.second.insert(name, digest);
        }
    }
    Ok(pushed)
}

/// gkm's processes: the agents (one process) and the operator.
struct Gkm {
    agents: Process,
    operator: Process,
}

impl Gkm {
    /// Starts the agents of the nodes under `nodes_dir` and the operator, as
    /// their ServiceAccounts, logging into `dir`. The operator's default
    /// signature policy (the administrator's, which every tree understands)
    /// names `key`.
    fn start(
        bench: &Bench,
        dir: &Path,
        nodes_dir: &Path,
        operator: &Path,
        agents: &Path,
        key: &cosign::CosignKey,
    ) -> anyhow::Result<Gkm> {
        let plane = &bench.plane;
        let mut cmd = Command::new(agents);
        cmd.arg(plane.kubeconfig_for_service_account("gkm-system", "gkm-agent")?)
            .arg(nodes_dir)
            .env("GKM_LOG", "warn");
        let agents = Process::spawn("agents", cmd, &dir.join("agents.log"))?;
        let kubeconfig = plane.kubeconfig_for_service_account("gkm-system", "gkm-operator")?;
        let policy = dir.join("default-policy.json");
        let signers = json!({"signers": [{"key": {"publicKey": key.public_pem}}]});
        std::fs::write(&policy, signers.to_string())
            .with_context(|| format!("writing {}", policy.display()))?;
        let mut cmd = Command::new(operator);
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--default-policy={}", policy.display()))
            .arg("--metrics-addr=127.0.0.1:0")
            .arg("--insecure-registry")
            .env("GKM_LOG", "info,kube=warn");
        let operator = Process::spawn("gkm-operator", cmd, &dir.join("operator.log"))?;
        Ok(Gkm { agents, operator })
    }

    fn check_running(&mut self) -> anyhow::Result<()> {
        self.agents.check_running()?;
        self.operator.check_running()
    }

    /// Counts into `counts` until every node's agent labelled its Node.
    async fn wait_for_labels(
        &mut self,
        meter: &mut Meter,
        counts: &mut Counts,
        scale: &Scale,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + scale.converge_timeout;
        loop {
            self.check_running()?;
            meter.take(counts)?;
            let labelled = counts.writes("agents", Some("nodes"));
            if labelled >= scale.nodes as u64 {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "only {labelled} Node label writes by the agents in {:?}:\n{}",
                scale.converge_timeout,
                self.agents.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Counts into `counts` for `how_long`, nothing changing.
    async fn idle(
        &mut self,
        meter: &mut Meter,
        counts: &mut Counts,
        how_long: Duration,
    ) -> anyhow::Result<()> {
        let until = Instant::now() + how_long;
        while Instant::now() < until {
            self.check_running()?;
            meter.take(counts)?;
            tokio::time::sleep(Duration::from_secs(1).min(until - Instant::now())).await;
        }
        meter.take(counts)?;
        Ok(())
    }
}

/// What one run measured.
#[derive(Default)]
struct Measured {
    start: Counts,
    converge: Counts,
    change: Counts,
    idle: Counts,
    converge_secs: f64,
    change_secs: f64,
    settled_quiet: bool,
    operator_rss_mib: f64,
    operator_peak_rss_mib: f64,
    operator_cpu_secs: f64,
    agents_rss_mib: f64,
    agents_cpu_secs: f64,
    /// Watch events of the resources agents watch, while converging.
    agent_watch_events_converge: f64,
    /// Likewise while idle, when nothing changes: the watches' keep-alive
    /// (bookmarks, sent to every watch about once a minute), the rate
    /// that is not changes.
    agent_watch_events_idle: Option<f64>,
    /// How many caches converged when CONVERGE_TIMEOUT_SECS ran out, when
    /// not all did; the change and idle phases did not run then.
    timed_out_with: Option<usize>,
}

impl Measured {
    /// The figures `compare` reads, by name.
    fn figures(&self, scale: &Scale) -> serde_json::Value {
        let per = |n: u64, objects: usize| n as f64 / objects.max(1) as f64;
        let cache_writes = |c: &Counts| c.writes_to("operator", CACHE_KINDS);
        let report_writes = |c: &Counts| c.writes_to("agents", AGENT_REPORTS);
        // The cache changes the operator made: those stored, less the
        // harness's own (one create per cache, one spec change per changed
        // cache).
        let operator_changes = |c: &Counts, own: usize| c.cache_changes.saturating_sub(own as u64);
        let ratio = |writes: u64, changes: u64| writes as f64 / changes.max(1) as f64;
        let (start, converge, change, idle) =
            (&self.start, &self.converge, &self.change, &self.idle);
        let mut figures = json!({
            "nodes": scale.nodes,
            "caches": scale.caches,
            "t4_per_ten": scale.t4_per_ten,
            "changed": scale.changed,
            "idle_secs": scale.idle.as_secs(),
            "converge_secs": self.converge_secs,
            "change_secs": self.change_secs,
            "agent_label_writes_per_node": per(start.writes("agents", Some("nodes")), scale.nodes),
            "converge_operator_writes": converge.writes("operator", None),
            "converge_operator_cache_writes_per_cache": per(cache_writes(converge), scale.caches),
            "converge_operator_cache_writes_per_stored_change": ratio(
                cache_writes(converge),
                operator_changes(converge, scale.caches),
            ),
            "converge_operator_events": converge.writes("operator", Some("events")),
            "converge_agent_writes": converge.writes("agents", None),
            "converge_agent_report_writes_per_node": per(report_writes(converge), scale.nodes),
            "converge_agent_report_writes_per_stored_change": ratio(
                report_writes(converge),
                converge.report_changes,
            ),
            "converge_agent_events": converge.writes("agents", Some("events")),
            "converge_operator_writes_refused": converge.refused("operator"),
            "converge_agent_writes_refused": converge.refused("agents"),
            "converge_registry_requests": converge.registry_tags + converge.registry_other,
            "change_operator_writes": change.writes("operator", None),
            "change_operator_cache_writes_per_changed_cache": per(cache_writes(change), scale.changed),
            "change_operator_cache_writes_per_stored_change": ratio(
                cache_writes(change),
                operator_changes(change, scale.changed),
            ),
            "change_agent_writes": change.writes("agents", None),
            "change_agent_report_writes_per_node": per(report_writes(change), scale.nodes),
            "change_agent_report_writes_per_stored_change": ratio(
                report_writes(change),
                change.report_changes,
            ),
            "change_registry_requests": change.registry_tags + change.registry_other,
            "change_operator_writes_refused": change.refused("operator"),
            "change_agent_writes_refused": change.refused("agents"),
            "idle_operator_writes": idle.writes("operator", None),
            "idle_agent_writes": idle.writes("agents", None),
            "idle_operator_reads": idle.reads("operator"),
            "idle_agent_reads": idle.reads("agents"),
            "idle_registry_tag_resolutions": idle.registry_tags,
            "idle_registry_other_requests": idle.registry_other,
            "operator_rss_mib": self.operator_rss_mib,
            "operator_peak_rss_mib": self.operator_peak_rss_mib,
            "agents_process_rss_mib": self.agents_rss_mib,
            "operator_cpu_secs": self.operator_cpu_secs,
            "agents_process_cpu_secs": self.agents_cpu_secs,
            "settled_quiet": self.settled_quiet,
        });
        figures["agent_watch_events_converge"] = json!(self.agent_watch_events_converge);
        let summary = self.summary(scale);
        figures["agent_watch_events_idle_per_sec"] =
            json!(summary.agent_watch_events_idle_per_second);
        figures["agent_watch_events_converge_beyond_idle_rate"] =
            json!(summary.agent_watch_events_converge_beyond_idle_rate);
        figures["extractions"] = json!(self.extractions());
        figures["converged_caches"] = json!(self.timed_out_with.unwrap_or(scale.caches));
        if self.timed_out_with.is_some() {
            // Those phases did not run.
            let skipped = |key: &String| {
                (key.starts_with("change_") || key.starts_with("idle_")) && key != "idle_secs"
            };
            if let Some(object) = figures.as_object_mut() {
                object
                    .iter_mut()
                    .filter(|(key, _)| skipped(key))
                    .for_each(|(_, value)| *value = serde_json::Value::Null);
                object.insert("settled_quiet".into(), serde_json::Value::Null);
            }
        }
        figures["summary"] = json!(summary);
        figures
    }

    /// Extractions (GETs of a cache image's layer) after the start.
    fn extractions(&self) -> u64 {
        [&self.converge, &self.change, &self.idle]
            .iter()
            .map(|c| c.layer_gets)
            .sum()
    }

    /// What scales, over the converge and change phases.
    fn summary(&self, scale: &Scale) -> Summary {
        let moving = [&self.converge, &self.change];
        let sum = |f: &dyn Fn(&Counts) -> u64| moving.iter().map(|c| f(c)).sum::<u64>();
        let ratio = |writes: u64, changes: u64| writes as f64 / changes.max(1) as f64;
        // The harness's own cache changes (creations, spec changes) are not
        // the operator's.
        let harness_changes = (scale.caches + scale.changed) as u64;
        let converge = &self.converge;
        let extraction_requests = converge.extraction_requests();
        let converge_requests = converge.registry_tags + converge.registry_other;
        let idle_rate = self
            .agent_watch_events_idle
            .map(|events| events / scale.idle.as_secs_f64().max(1.0));
        Summary {
            scale: ScaleSummary {
                nodes: scale.nodes,
                caches: scale.caches,
                changed: scale.changed,
                t4_per_ten: scale.t4_per_ten,
                signatures: scale.signatures,
                idle_secs: scale.idle.as_secs(),
            },
            converged_caches: self.timed_out_with.unwrap_or(scale.caches),
            converge_seconds: self.converge_secs,
            change_seconds: self.timed_out_with.is_none().then_some(self.change_secs),
            operator_writes_per_stored_change: ratio(
                sum(&|c| c.writes_to("operator", CACHE_KINDS)),
                sum(&|c| c.cache_changes).saturating_sub(harness_changes),
            ),
            agent_writes_per_stored_change: ratio(
                sum(&|c| c.writes_to("agents", AGENT_REPORTS)),
                sum(&|c| c.report_changes),
            ),
            agent_watch_events_converge: self.agent_watch_events_converge,
            agent_watch_events_idle_per_second: idle_rate,
            agent_watch_events_converge_beyond_idle_rate: idle_rate
                .map(|rate| self.agent_watch_events_converge - rate * self.converge_secs),
            registry_requests_converge: converge_requests,
            registry_requests_per_cache_converge: (converge_requests - extraction_requests) as f64
                / scale.caches.max(1) as f64,
            registry_requests_per_extraction_converge: (converge.layer_gets > 0)
                .then(|| extraction_requests as f64 / converge.layer_gets as f64),
            registry_requests_converge_by_kind: converge.registry_kinds.clone(),
            registry_requests_idle: self
                .timed_out_with
                .is_none()
                .then_some(self.idle.registry_tags + self.idle.registry_other),
            registry_requests_idle_by_kind: self.idle.registry_kinds.clone(),
            extractions: self.extractions(),
            operator_rss_mib: self.operator_rss_mib,
            agents_cpu_seconds: self.agents_cpu_secs,
        }
    }
}

/// The size of a run, as its summary states it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ScaleSummary {
    nodes: usize,
    caches: usize,
    changed: usize,
    /// Of every ten nodes, how many have the GPU the caches fit (0: no
    /// node does, nothing is extracted).
    t4_per_ten: usize,
    /// How the images were signed (`v3`: sigstore bundles as referrers;
    /// `v2`: cosign's `.sig` tag).
    signatures: Signatures,
    idle_secs: u64,
}

/// What scales, per revision: the figures `summary.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Summary {
    /// What ran.
    scale: ScaleSummary,
    /// How many caches converged on every node: all of them, or as many as
    /// had when CONVERGE_TIMEOUT_SECS ran out.
    converged_caches: usize,
    /// Time for the caches to converge on every node (when not all did:
    /// CONVERGE_TIMEOUT_SECS, the time given).
    converge_seconds: f64,
    /// Time for the changed caches to converge again; `null` when the
    /// first convergence timed out and this phase did not run.
    change_seconds: Option<f64>,
    /// The operator's writes to caches (and their status) per change the
    /// apiserver stored, converging and changing (1: every write changed
    /// something).
    operator_writes_per_stored_change: f64,
    /// The agents' writes to their reports per stored change, likewise.
    agent_writes_per_stored_change: f64,
    /// Watch events sent for the resources agents watch ([`agent_watched`])
    /// while converging.
    agent_watch_events_converge: f64,
    /// Those events per second while idle, when nothing changed: what the
    /// watches send without changes (bookmarks); `null` when the idle phase
    /// did not run.
    agent_watch_events_idle_per_second: Option<f64>,
    /// `agent_watch_events_converge` less that idle rate over the time
    /// converging took: the events that carried changes.
    agent_watch_events_converge_beyond_idle_rate: Option<f64>,
    /// Registry requests while converging, and while idle.
    registry_requests_converge: u64,
    /// Of those, the ones that are not an extraction's (an image's manifest
    /// by digest and its layer), per cache: resolving the tag and finding
    /// and reading its signatures.
    registry_requests_per_cache_converge: f64,
    /// An extraction's requests (image manifest by digest, layer) per
    /// extraction while converging; `null` when nothing was extracted.
    registry_requests_per_extraction_converge: Option<f64>,
    /// The requests while converging by kind: method, what was asked for
    /// (tag, signature tag, referrers, manifest, blob…), response code.
    registry_requests_converge_by_kind: BTreeMap<String, u64>,
    /// `null` when the idle phase did not run (see `change_seconds`).
    registry_requests_idle: Option<u64>,
    /// The requests while idle by kind, likewise.
    registry_requests_idle_by_kind: BTreeMap<String, u64>,
    /// GETs of a cache image's layer after the start: one per extraction.
    extractions: u64,
    /// The operator's RSS at the end.
    operator_rss_mib: f64,
    /// CPU time of the agents' process.
    agents_cpu_seconds: f64,
}

/// The summaries of the revisions that ran, and after / baseline of each
/// figure when both did (`null` where the baseline's is 0).
#[derive(Debug, Serialize)]
struct Summaries {
    baseline: Option<Summary>,
    after: Summary,
    ratios: Option<BTreeMap<String, Option<f64>>>,
}

impl Summaries {
    fn new(baseline: Option<Summary>, after: Summary) -> anyhow::Result<Summaries> {
        let ratios = match &baseline {
            None => None,
            Some(base) => {
                let (base, new) = (serde_json::to_value(base)?, serde_json::to_value(&after)?);
                let mut ratios = BTreeMap::new();
                // Numbers only: the scale and the requests by kind are not.
                let numbers = base
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(_, b)| b.is_number());
                for (key, b) in numbers {
                    let ratio = match (b.as_f64(), new[key].as_f64()) {
                        (Some(b), Some(a)) if b != 0.0 => Some(a / b),
                        _ => None,
                    };
                    ratios.insert(key.clone(), ratio);
                }
                Some(ratios)
            }
        };
        Ok(Summaries {
            baseline,
            after,
            ratios,
        })
    }
}

/// Runs the benchmark on one revision and writes its figures to `out`.
async fn run(tree: &Path, operator: &Path, agents: &Path, out: &Path) -> anyhow::Result<()> {
    let scale = Scale::from_env()?;
    let began = Instant::now();
    let tempdir = tempfile::Builder::new()
        .prefix("gkm-bench-operator-")
        .tempdir()?;
    let dir = tempdir.path();
    let bench = Bench::start(dir, tree).await?;
    let stores = tempfile::Builder::new()
        .prefix("gkm-bench-operator-nodes-")
        .tempdir_in(stores_root())?;
    bench.create_nodes(&scale, stores.path()).await?;
    let compatible = (0..scale.nodes)
        .filter(|&i| inventory(i, scale.t4_per_ten).1)
        .count();
    eprintln!(
        "== {} kwok nodes ({compatible} with an sm75 GPU) in {:.0?}",
        scale.nodes,
        began.elapsed()
    );
    let key = cosign::generate_key_pair(&dir.join("cosign"))?;
    let Pushed {
        first,
        second,
        images,
    } = push_images(&bench, &scale, &key).await?;
    eprintln!(
        "== {} signed images pushed in {:.0?}",
        scale.caches + scale.changed,
        began.elapsed()
    );

    let mut meter =
        Meter::start(&bench.client, &bench.audit_log, &bench.registry_log, images).await?;
    let mut m = Measured::default();
    // Phase 1: the agents and the operator start; no cache yet.
    let mut gkm = Gkm::start(&bench, dir, stores.path(), operator, agents, &key)?;
    gkm.wait_for_labels(&mut meter, &mut m.start, &scale)
        .await?;
    settle(&mut meter, &mut m.start).await?;
    eprintln!("== agents and operator up in {:.0?}", began.elapsed());

    // Phase 2: the caches are created and converge.
    let watched = agent_watched(tree)?;
    eprintln!("   the agents watch {watched:?}");
    let watch_events = agent_watch_events(&bench.client, &watched).await?;
    let created = Instant::now();
    bench.create_caches(&first).await?;
    let converged = bench.converge(&first, &scale, compatible, &mut gkm).await?;
    m.converge_secs = created.elapsed().as_secs_f64();
    if converged < first.len() {
        // A revision that does not converge in time is measured up to
        // there; the phases after it would start from an unconverged state.
        meter.take(&mut m.converge)?;
        m.agent_watch_events_converge =
            agent_watch_events(&bench.client, &watched).await? - watch_events;
        m.timed_out_with = Some(converged);
        eprintln!(
            "== {converged} of {} caches converged in {:.0}s, CONVERGE_TIMEOUT_SECS: measured up to there, the change and idle phases skipped",
            scale.caches, m.converge_secs
        );
        return m.finish(&scale, gkm, out);
    }
    let converge_quiet = settle(&mut meter, &mut m.converge).await?;
    m.agent_watch_events_converge =
        agent_watch_events(&bench.client, &watched).await? - watch_events;
    eprintln!(
        "== {} caches converged in {:.1}s (quiet after: {converge_quiet})",
        scale.caches, m.converge_secs
    );

    // Phase 3: CHANGED caches move to a new image.
    let changed = Instant::now();
    bench.move_caches(&second).await?;
    let mut expected = first.clone();
    expected.extend(second.clone());
    let converged = bench
        .converge(&expected, &scale, compatible, &mut gkm)
        .await?;
    anyhow::ensure!(
        converged == expected.len(),
        "the changed caches did not converge in CONVERGE_TIMEOUT_SECS"
    );
    m.change_secs = changed.elapsed().as_secs_f64();
    let change_quiet = settle(&mut meter, &mut m.change).await?;
    m.settled_quiet = converge_quiet && change_quiet;
    eprintln!(
        "== {} changed caches converged in {:.1}s (quiet after: {change_quiet})",
        scale.changed, m.change_secs
    );

    // Phase 4: nothing changes.
    let watch_events = agent_watch_events(&bench.client, &watched).await?;
    gkm.idle(&mut meter, &mut m.idle, scale.idle).await?;
    m.agent_watch_events_idle =
        Some(agent_watch_events(&bench.client, &watched).await? - watch_events);
    eprintln!(
        "== idle {:?} done; whole run {:.0?}",
        scale.idle,
        began.elapsed()
    );
    m.finish(&scale, gkm, out)
}

impl Measured {
    /// Reads the processes' memory and CPU time, prints the counts, writes
    /// the figures to `out` and stops the operator and the agents.
    fn finish(mut self, scale: &Scale, mut gkm: Gkm, out: &Path) -> anyhow::Result<()> {
        (self.operator_rss_mib, self.operator_peak_rss_mib) =
            gkm_testenv::memory_mib(gkm.operator.pid())?;
        (self.agents_rss_mib, _) = gkm_testenv::memory_mib(gkm.agents.pid())?;
        self.operator_cpu_secs = gkm_testenv::cpu_seconds(gkm.operator.pid())?;
        self.agents_cpu_secs = gkm_testenv::cpu_seconds(gkm.agents.pid())?;
        for (phase, counts) in [
            ("start", &self.start),
            ("converge", &self.converge),
            ("change", &self.change),
            ("idle", &self.idle),
        ] {
            counts.print(phase);
        }
        std::fs::write(out, serde_json::to_string_pretty(&self.figures(scale))?)?;
        gkm.agents.stop(Duration::from_secs(5));
        gkm.operator.stop(Duration::from_secs(5));
        Ok(())
    }
}

/// The rows of the table: figure, what "after" should meet.
const ROWS: &[(&str, &str)] = &[
    ("converged_caches", ""),
    ("converge_secs", ""),
    ("change_secs", ""),
    ("agent_label_writes_per_node", "<= 1"),
    ("converge_operator_writes", ""),
    ("converge_operator_cache_writes_per_cache", ""),
    ("converge_operator_cache_writes_per_stored_change", "<= 1"),
    ("converge_operator_events", ""),
    ("converge_agent_writes", ""),
    ("converge_agent_report_writes_per_node", ""),
    ("converge_agent_report_writes_per_stored_change", "<= 1"),
    ("converge_agent_events", ""),
    ("converge_operator_writes_refused", ""),
    ("converge_agent_writes_refused", ""),
    ("converge_registry_requests", ""),
    ("change_operator_writes", ""),
    ("change_operator_cache_writes_per_changed_cache", ""),
    ("change_operator_cache_writes_per_stored_change", "<= 1"),
    ("change_agent_writes", ""),
    ("change_agent_report_writes_per_node", ""),
    ("change_agent_report_writes_per_stored_change", "<= 1"),
    ("change_registry_requests", ""),
    ("change_operator_writes_refused", ""),
    ("change_agent_writes_refused", ""),
    ("idle_operator_writes", "0"),
    ("idle_agent_writes", "0"),
    ("idle_operator_reads", ""),
    ("idle_agent_reads", ""),
    (
        "idle_registry_tag_resolutions",
        "periodic re-resolution only",
    ),
    ("idle_registry_other_requests", "0"),
    ("operator_rss_mib", "< 100"),
    ("operator_peak_rss_mib", "< 100"),
    ("agents_process_rss_mib", ""),
    ("operator_cpu_secs", ""),
    ("agents_process_cpu_secs", ""),
    ("agent_watch_events_converge", ""),
    ("agent_watch_events_idle_per_sec", ""),
    (
        "agent_watch_events_converge_beyond_idle_rate",
        "<= nodes x changes x 1.1",
    ),
    ("extractions", ""),
];

/// Prints the table of `baseline` (`-`: none) and `after`; with `summary`,
/// writes their [`Summaries`] there and prints its path.
fn compare(baseline: &Path, after: &Path, summary: Option<&Path>) -> anyhow::Result<()> {
    let read = |path: &Path| -> anyhow::Result<serde_json::Value> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Ok(serde_json::from_str(&text)?)
    };
    // `-`: the after run alone, its baseline column empty.
    let base = match baseline.to_str() {
        Some("-") => serde_json::Value::Null,
        _ => read(baseline)?,
    };
    let new = read(after)?;
    for key in ["nodes", "caches", "t4_per_ten", "changed", "idle_secs"] {
        anyhow::ensure!(
            base.is_null() || base[key] == new[key],
            "the runs differ in {key}: {} and {}",
            base[key],
            new[key]
        );
    }
    println!(
        "nodes {} ({} in 10 with a T4), caches {}, changed {}, idle {} s; settled quietly: baseline {}, after {}",
        new["nodes"],
        new["t4_per_ten"],
        new["caches"],
        new["changed"],
        new["idle_secs"],
        base["settled_quiet"],
        new["settled_quiet"]
    );
    println!(
        "{:<48} {:>12} {:>12} {:>8}  target (after)",
        "figure", "baseline", "after", "ratio"
    );
    for (key, target) in ROWS {
        let (b, a) = (base[key].as_f64(), new[key].as_f64());
        let show = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.2}"));
        let ratio = match (b, a) {
            (Some(b), Some(a)) if b > 0.0 => format!("{:.2}", a / b),
            (Some(_), Some(0.0)) => "=".into(),
            _ => "-".into(),
        };
        println!(
            "{key:<48} {:>12} {:>12} {ratio:>8}  {target}",
            show(b),
            show(a)
        );
    }
    if let Some(path) = summary {
        let of = |figures: &serde_json::Value, which: &str| -> anyhow::Result<Summary> {
            serde_json::from_value(figures["summary"].clone())
                .with_context(|| format!("the {which} figures have no summary"))
        };
        let baseline = if base.is_null() {
            None
        } else {
            Some(of(&base, "baseline")?)
        };
        let summaries = Summaries::new(baseline, of(&new, "after")?)?;
        std::fs::write(path, serde_json::to_string_pretty(&summaries)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("summary: {}", path.display());
    }
    Ok(())
}

/// Fails, naming the command that installs it, when a component or the
/// fixture cache is missing.
fn check() -> anyhow::Result<()> {
    use gkm_testenv::Component;
    for component in [
        Component::Etcd,
        Component::KubeApiserver,
        Component::KubeControllerManager,
        Component::Kwok,
        Component::Registry,
        Component::CosignV2,
        Component::CosignV3,
    ] {
        gkm_testenv::find_binary(component)?;
    }
    let fixture = gkm_local::fixture(FIXTURE);
    anyhow::ensure!(
        fixture.is_dir(),
        "the fixture cache {} is missing",
        fixture.display()
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let usage = "usage: bench_operator check | run TREE OPERATOR AGENTS OUT.json | compare BASELINE.json|- AFTER.json [SUMMARY.json]";
    match args.first().and_then(|a| a.to_str()) {
        Some("check") if args.len() == 1 => check(),
        Some("run") if args.len() == 5 => {
            check()?;
            // The registry logs every request (Distribution reads its
            // configuration's overrides from the environment).
            // SAFETY: set before any thread is started.
            unsafe { std::env::set_var("REGISTRY_LOG_ACCESSLOG_DISABLED", "false") };
            tokio::runtime::Runtime::new()?.block_on(run(&args[1], &args[2], &args[3], &args[4]))
        }
        Some("compare") if (3..=4).contains(&args.len()) => {
            compare(&args[1], &args[2], args.get(3).map(PathBuf::as_path))
        }
        _ => anyhow::bail!("{usage}"),
    }
}
