//! The scenario: the control plane, registry and nodes, gkm's processes,
//! the signed cache images, and the phases measured one after another.

use super::*;

/// No gkm write for this long after convergence ends a phase.
pub(crate) const QUIET: Duration = Duration::from_secs(15);
/// The longest a phase waits for that quiet after converging.
pub(crate) const SETTLE_MAX: Duration = Duration::from_secs(120);

/// The benchmark's size, from the environment.
pub(crate) struct Scale {
    pub(crate) nodes: usize,
    pub(crate) caches: usize,
    pub(crate) changed: usize,
    /// Of every ten nodes, how many have a GPU the caches fit (0: none,
    /// so nothing is extracted and every node finds every cache
    /// incompatible).
    pub(crate) t4_per_ten: usize,
    /// How the images are signed.
    pub(crate) signatures: Signatures,
    pub(crate) idle: Duration,
    pub(crate) converge_timeout: Duration,
}

impl Scale {
    pub(crate) fn from_env() -> anyhow::Result<Scale> {
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
pub(crate) enum Signatures {
    /// cosign v3: a sigstore bundle attached as an OCI referrer.
    V3,
    /// cosign v2: a simple-signing payload at the `sha256-<hex>.sig` tag.
    V2,
}

/// A node's simulated GPUs: `t4_per_ten` in ten an NVIDIA T4 (sm75), which
/// the CUDA fixture fits; of the others, alternately an AMD MI210 (gfx90a)
/// and no GPU. The default, 8, gives 8 T4, 1 MI210 and 1 without GPUs.
pub(crate) fn inventory(index: usize, t4_per_ten: usize) -> (&'static str, bool) {
    let place = index % 10;
    if place < t4_per_ten {
        ("gpus:\n- profile: T4\n", true)
    } else if (place - t4_per_ten).is_multiple_of(2) {
        ("gpus:\n- profile: MI210\n", false)
    } else {
        ("gpus: []\n", false)
    }
}

pub(crate) fn node_name(index: usize) -> String {
    format!("gpu-{index:04}")
}

/// Counts the changes the apiserver stores to objects of `resource`
/// (every add, modification or deletion a watch sees, not the initial
/// listing) into `changes`; returns once the watch has listed, with the
/// task that watches.
pub(crate) async fn count_changes(
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

pub(crate) fn gkm_resource(kind: &str, plural: &str) -> ApiResource {
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
pub(crate) struct Meter {
    pub(crate) audit: LogMark,
    pub(crate) registry: LogMark,
    /// The cache images, to tell their requests apart.
    pub(crate) images: CacheImages,
    pub(crate) cache_changes: Arc<AtomicU64>,
    pub(crate) report_changes: Arc<AtomicU64>,
    pub(crate) watches: Vec<tokio::task::AbortHandle>,
}

impl Drop for Meter {
    fn drop(&mut self) {
        for watch in &self.watches {
            watch.abort();
        }
    }
}

impl Meter {
    pub(crate) async fn start(
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
    pub(crate) fn take(&mut self, counts: &mut Counts) -> anyhow::Result<u64> {
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

/// The watch events the apiserver has sent so far for the `watched`
/// gkm.io resources ([`agent_watched`]; `apiserver_watch_events_total`).
/// The apiserver counts the events of every watcher, so the operator's
/// watch of those resources and this harness's (one each at most) count too.
pub(crate) async fn agent_watch_events(
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

/// One revision's stack.
pub(crate) struct Bench {
    pub(crate) _registry: Registry,
    pub(crate) plane: ControlPlane,
    pub(crate) _kwok: Kwok,
    pub(crate) client: kube::Client,
    pub(crate) registry_addr: String,
    pub(crate) audit_log: PathBuf,
    pub(crate) registry_log: PathBuf,
}

impl Bench {
    pub(crate) async fn start(dir: &Path, tree: &Path) -> anyhow::Result<Bench> {
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
    pub(crate) async fn create_nodes(&self, scale: &Scale, nodes_dir: &Path) -> anyhow::Result<()> {
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
    pub(crate) async fn push(
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

    /// Every cache. The apiserver is loaded to its limits while the caches
    /// converge: a failed list is tried again each second until `deadline`.
    pub(crate) async fn list_caches(
        &self,
        deadline: Instant,
    ) -> anyhow::Result<kube::api::ObjectList<DynamicObject>> {
        loop {
            match self.caches().list(&ListParams::default()).await {
                Ok(list) => return Ok(list),
                Err(e) => {
                    eprintln!("   listing the caches: {e}; trying again");
                    anyhow::ensure!(Instant::now() < deadline, "listing the caches: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    pub(crate) fn caches(&self) -> Api<DynamicObject> {
        let resource = gkm_resource("GKMCache", "gkmcaches");
        Api::namespaced_with(self.client.clone(), NAMESPACE, &resource)
    }

    /// Creates a GKMCache per `images` entry (`bench/NAME:v1`); they are
    /// verified under the operator's default policy ([`Gkm::start`]).
    pub(crate) async fn create_caches(
        &self,
        images: &BTreeMap<String, String>,
    ) -> anyhow::Result<()> {
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
    pub(crate) async fn move_caches(
        &self,
        images: &BTreeMap<String, String>,
    ) -> anyhow::Result<()> {
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
    pub(crate) async fn converge(
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
            let list = self.list_caches(deadline).await?;
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
pub(crate) async fn settle(meter: &mut Meter, counts: &mut Counts) -> anyhow::Result<bool> {
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
pub(crate) fn stores_root() -> PathBuf {
    match std::env::var_os("STORES_DIR") {
        Some(dir) => PathBuf::from(dir),
        None if Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
        None => std::env::temp_dir(),
    }
}

/// The images the benchmark pushed: name → digest of the first set and of
/// the changed ones, and the digests of all.
pub(crate) struct Pushed {
    pub(crate) first: BTreeMap<String, String>,
    pub(crate) second: BTreeMap<String, String>,
    pub(crate) images: CacheImages,
}

/// Builds CACHES images (`bench/cache-NN:v1`) and, for the first CHANGED,
/// another (`:v2`), all signed with `key`.
pub(crate) async fn push_images(
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
pub(crate) struct Gkm {
    pub(crate) agents: Process,
    pub(crate) operator: Process,
}

impl Gkm {
    /// Starts the agents of the nodes under `nodes_dir` and the operator, as
    /// their ServiceAccounts, logging into `dir`. The operator's default
    /// signature policy (the administrator's, which every tree understands)
    /// names `key`.
    pub(crate) fn start(
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

    pub(crate) fn check_running(&mut self) -> anyhow::Result<()> {
        self.agents.check_running()?;
        self.operator.check_running()
    }

    /// Counts into `counts` until every node's agent labelled its Node.
    pub(crate) async fn wait_for_labels(
        &mut self,
        meter: &mut Meter,
        counts: &mut Counts,
        scale: &Scale,
    ) -> anyhow::Result<()> {
        let waited = gkm_testenv::eventually(
            "every node's agent labelling its Node",
            scale.converge_timeout,
            || {
                let step = (|| -> anyhow::Result<Option<()>> {
                    self.check_running()?;
                    meter.take(counts)?;
                    let labelled = counts.writes("agents", Some("nodes"));
                    Ok((labelled >= scale.nodes as u64).then_some(()))
                })();
                async move { step }
            },
        )
        .await;
        waited.map_err(|e| {
            e.context(format!(
                "only {} Node label writes by the agents:\n{}",
                counts.writes("agents", Some("nodes")),
                self.agents.log_tail(20)
            ))
        })
    }

    /// Counts into `counts` for `how_long`, nothing changing.
    pub(crate) async fn idle(
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

/// The pod-end phase: on every node the caches fit, one pod's writable view
/// of each cache ends, having compiled two entries the cache lacks, as the
/// CSI driver records it (a usage record in the node's store, which the
/// node's agent reads at its next pass). The pods have no object (kwok
/// nodes run none): each is its own workload, one name per cache on every
/// node, so each cache's status adds one workload up across the nodes.
/// Returns the records written.
pub(crate) fn end_pods(
    nodes_dir: &Path,
    scale: &Scale,
    current: &BTreeMap<String, String>,
) -> anyhow::Result<usize> {
    use gkm_core::usage::{NewEntry, ViewUsage};
    use gkm_k8s_node::mount_records::{MountRecord, PodRef};
    use gkm_k8s_node::usage::{UsageRecord, UsageRecords};
    let now = jiff::Timestamp::now();
    let mut written = 0;
    for index in (0..scale.nodes).filter(|&i| inventory(i, scale.t4_per_ten).1) {
        let node = node_name(index);
        let records = UsageRecords::new(&nodes_dir.join(&node).join("store"));
        for (cache, digest) in current {
            let record = UsageRecord {
                mount: MountRecord {
                    volume_id: format!("csi-{cache}-{node}"),
                    pod: PodRef {
                        namespace: NAMESPACE.into(),
                        name: format!("{cache}-worker"),
                        uid: None,
                    },
                    cache: gkm_core::CacheKey::named(Some(NAMESPACE), cache),
                    digest: digest.parse()?,
                    target_path: nodes_dir.join(&node).join("volume"),
                    mount_path: None,
                    published: now,
                },
                kind: "triton".into(),
                ended: now,
                delivered: Some(4),
                reasons: vec!["no cached entry of kernel mul_kernel: capture this workload".into()],
                usage: ViewUsage {
                    new_entries: 2,
                    named: ["mul_kernel", "sub_kernel"]
                        .map(|name| NewEntry {
                            key: format!("{name}-KEY"),
                            name: Some(name.into()),
                            bytes: 4096,
                        })
                        .into(),
                    new_bytes: 8192,
                    ..ViewUsage::default()
                },
            };
            records.record(&record)?;
            written += 1;
        }
    }
    Ok(written)
}

impl Bench {
    /// Waits until the status of every cache of `current` counts the pods
    /// of [`end_pods`] on `compatible` nodes; returns whether they all did
    /// within CONVERGE_TIMEOUT_SECS.
    pub(crate) async fn counted(
        &self,
        current: &BTreeMap<String, String>,
        scale: &Scale,
        compatible: usize,
        gkm: &mut Gkm,
    ) -> anyhow::Result<bool> {
        let deadline = Instant::now() + scale.converge_timeout;
        loop {
            gkm.check_running()?;
            let list = self.list_caches(deadline).await?;
            let nodes_counted = |cache: &DynamicObject| -> u64 {
                cache.data["status"]["workloads"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|w| w["nodes"].as_u64())
                    .sum()
            };
            let done = list
                .items
                .iter()
                .filter(|c| current.contains_key(&c.metadata.name.clone().unwrap_or_default()))
                .filter(|c| nodes_counted(c) as usize == compatible)
                .count();
            if done == current.len() {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                eprintln!(
                    "   only {done} of {} caches counted the pods",
                    current.len()
                );
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The bytes of the status of node `index`'s report.
    pub(crate) async fn report_bytes(&self, index: usize) -> anyhow::Result<usize> {
        let reports: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            NAMESPACE,
            &gkm_resource("GKMCacheNode", "gkmcachenodes"),
        );
        let report = reports.get(&node_name(index)).await?;
        Ok(serde_json::to_vec(&report.data["status"])?.len())
    }
}
