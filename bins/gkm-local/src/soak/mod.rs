//! A fault-injection soak of the whole system: the local stack (a real
//! node with gkm installed by its chart, simulated nodes with gkm as
//! processes) under a steady workload ([`workload`]), faults injected one
//! at a time on a seeded schedule ([`faults`]), invariants checked all the
//! while ([`checks`], [`invariants`]), and a summary ([`summary`]).
//!
//! `hack/soak.sh` runs it (`DURATION`, `SEED`); the binary is `gkm-soak`.

pub mod captures;
pub mod checks;
pub mod claims;
pub mod faults;
pub mod health;
pub mod invariants;
pub mod leaks;
pub mod registry_proxy;
pub mod rng;
pub mod rss;
pub mod state;
pub mod summary;
pub mod trees;
pub mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use gkm_testenv::{ContainerdRestarts, ControlPlaneRestarts};

use crate::{SimulatedNode, Stack, cosign, default_nodes};
use faults::{Fault, Injector};
use invariants::{CONVERGE_WITHIN, Check, RSS_GROWTH, SERVE_AGAIN_WITHIN, WRITES_PER_CHANGE};
use registry_proxy::RegistryProxy;
use rng::Rng;
use state::Shared;
use summary::{Recovery, Summary};
use workload::{REAL_NODE, Workload};

/// Size of the real node's store filesystem (a tmpfs of its own).
const STORE_FS_SIZE: &str = "1280m";
/// How long the caches may take to converge before any fault.
const FIRST_CONVERGENCE: Duration = Duration::from_secs(240);
/// How often the continuous checks run.
const SAMPLE_EVERY: Duration = Duration::from_secs(3);

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long to inject faults.
    pub duration: Duration,
    /// The schedule's seed.
    pub seed: u64,
    /// Where everything lives (logs, trees, the summary).
    pub dir: PathBuf,
    /// The GPU path of the real node (device plugin or DRA).
    pub gpu_path: crate::dra::GpuPath,
    /// The agents' `--gc-grace`; `None` keeps their default.
    pub gc_grace: Option<String>,
    /// Only these kinds of fault (see [`Fault::kinds`]); every kind when empty.
    pub faults: Vec<String>,
}

/// Runs the soak and returns its summary (also written to
/// `<dir>/summary.json`).
pub async fn run(config: &Config) -> anyhow::Result<Summary> {
    let began = Instant::now();
    let kinds = Fault::kinds(&crate::chart::components(config.gpu_path));
    if let Some(unknown) = config.faults.iter().find(|f| !kinds.contains(f)) {
        anyhow::bail!("no fault kind {unknown} (the kinds: {})", kinds.join(", "));
    }
    eprintln!(
        "soak: seed {} (SEED={} replays), {} s of faults, in {}",
        config.seed,
        config.seed,
        config.duration.as_secs(),
        config.dir.display()
    );
    let mut stack =
        Stack::start_for_chart_with(&config.dir, default_nodes(), config.gpu_path).await?;
    stack
        .add_real_node(SimulatedNode::new(REAL_NODE, "gpus:\n- profile: T4\n"))
        .await?;
    let real = stack.real_node(REAL_NODE).context("no real node")?;
    let kubelet_dir = real.kubelet_dir();
    // The store on a bounded filesystem of its own, so filling it touches
    // nothing else.
    let store_fs = kubelet_dir.join("gkm");
    mount_tmpfs(&store_fs)?;
    stack.set_args(
        vec![
            "--resolve-interval=2s".into(),
            format!("--tenant-signer-namespaces={}", workload::NAMESPACE),
            // Capture and fill Jobs: the registry listens on the host's
            // loopback, and their images are imported, not pulled.
            "--job-host-network".into(),
            "--job-image-pull-policy=Never".into(),
        ],
        std::iter::once("--resync=2s".to_string())
            .chain(config.gc_grace.iter().map(|g| format!("--gc-grace={g}")))
            .collect(),
    );
    eprintln!(
        "soak: stack up in {:.0?}; building images, installing the chart",
        began.elapsed()
    );
    let volume_dir = claims::prepare(&mut stack, &config.dir)?;
    stack.import_images()?;
    stack.install_chart().await?;
    claims::apply_storage_class(&stack).await?;
    stack.start_gkm()?;
    let store = stack.store_dir(REAL_NODE);
    let components = crate::chart::components(config.gpu_path);
    let client = stack.plane.client().await?;
    stack
        .plane
        .ensure_pod_namespace(workload::NAMESPACE)
        .await?;
    let proxy = RegistryProxy::start(&config.dir, stack.registry.addr()).await?;
    let key = cosign::generate_key_pair(&config.dir.join("keys"))?;
    let shared = Shared::new();
    let registry_addr = stack.registry.addr().to_string();
    let work = Workload::new(
        client.clone(),
        &registry_addr,
        proxy.addr(),
        &key,
        &config.dir,
        &shared,
    );
    work.apply_caches().await?;
    work.create_signing_secret().await?;
    healthy_within(
        "the caches converge before any fault",
        FIRST_CONVERGENCE,
        &client,
        &components,
        &shared,
    )
    .await
    .map_err(anyhow::Error::msg)?;
    eprintln!(
        "soak: caches converged at {:.0?}; warming up",
        began.elapsed()
    );

    // Warm-up: readers running, a few workload steps, then the RSS baseline.
    let mut work_rng = Rng::fork(config.seed, 2);
    work.start_reader("reader", "sm75", false).await?;
    work.start_reader("reader", "fleet", true).await?;
    let mut sampler = checks::Sampler::default();
    let warm_until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < warm_until {
        sampler.sample(&client, &shared).await;
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    let warm_rss = rss::daemons();

    // Faults, workload and checks together until the duration is spent.
    // The replacements of crashed processes live until the end.
    let mut plane_restarts = ControlPlaneRestarts::new(&stack.plane)?;
    let mut containerd =
        ContainerdRestarts::new(stack.real_node(REAL_NODE).context("no real node")?)?;
    let mut recoveries: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let faults_end = Instant::now() + config.duration;
    let done = std::cell::Cell::new(false);
    {
        let mut injector = Injector {
            stack: &mut stack,
            plane: &mut plane_restarts,
            containerd: &mut containerd,
            proxy: &proxy,
            store_fs: store_fs.clone(),
            shared: &shared,
        };
        let faulting = async {
            let mut rng = Rng::fork(config.seed, 1);
            while Instant::now() < faults_end {
                let fault = Fault::pick(&mut rng, &components, &config.faults);
                let kind = fault.kind();
                eprintln!("soak: {:>6.1}s fault {kind}", shared.elapsed_s());
                let mut injected = Instant::now();
                if let Err(e) = injector.inject(&fault).await {
                    shared.record(Check::ChangesConverge, Err(format!("{kind}: {e:#}")));
                }
                if fault.is_windowed() {
                    injected = Instant::now();
                }
                let recovered =
                    recover(&client, &components, &shared, &work, &fault, injected).await;
                if let Some(seconds) = recovered {
                    eprintln!(
                        "soak: {:>6.1}s recovered from {kind} in {seconds:.1}s",
                        shared.elapsed_s()
                    );
                    recoveries.entry(kind).or_default().push(seconds);
                } else {
                    recoveries.entry(kind).or_default();
                }
                tokio::time::sleep(Duration::from_secs(rng.between(3, 10))).await;
            }
            done.set(true);
        };
        let working = async {
            while !done.get() {
                if let Err(e) = work.step(&mut work_rng).await {
                    shared.count("step-refused");
                    eprintln!("soak: workload step refused: {e:#}");
                }
                tokio::time::sleep(Duration::from_secs(work_rng.between(3, 8))).await;
            }
        };
        let checking = async {
            while !done.get() {
                sampler.sample(&client, &shared).await;
                work.check_captures().await;
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        };
        tokio::join!(faulting, working, checking);
    }

    // Everything converges after the last fault.
    let last = Instant::now();
    let converged = healthy_within(
        "every change converged after the last fault",
        CONVERGE_WITHIN,
        &client,
        &components,
        &shared,
    )
    .await;
    shared.record(Check::ChangesConverge, converged);
    eprintln!(
        "soak: final convergence in {:.1}s",
        last.elapsed().as_secs_f64()
    );
    sampler.sample(&client, &shared).await;

    // Writes per stored change on the real node, outside fault windows.
    let changes = shared
        .counts()
        .get("real-node-changes")
        .copied()
        .unwrap_or(0) as f64;
    let per_change = if changes > 0.0 {
        sampler.quiet_writes / changes
    } else {
        0.0
    };
    shared.record(
        Check::OneWritePerChange,
        if per_change <= WRITES_PER_CHANGE {
            Ok(())
        } else {
            Err(format!(
                "{} store writes outside fault windows for {changes} changes ({per_change:.2} per change; {} in all)",
                sampler.quiet_writes, sampler.all_writes
            ))
        },
    );
    eprintln!(
        "soak: {} store writes outside fault windows, {} in all, for {changes} changes",
        sampler.quiet_writes, sampler.all_writes
    );

    // Memory after the run against after warm-up.
    let end_rss = rss::daemons();
    let grown = rss::grown(&warm_rss, &end_rss, RSS_GROWTH);
    for daemon in warm_rss.keys() {
        let failure = grown.iter().find(|g| g.starts_with(&format!("{daemon}:")));
        shared.record(
            Check::RssStaysFlat,
            failure.map_or(Ok(()), |g| Err(g.clone())),
        );
    }

    // Every capture ends; nothing left once every capture, reader and the
    // claimed cache are gone.
    work.end_captures().await?;
    claims::remove(&client).await?;
    work.delete_all_readers(Duration::from_secs(120)).await?;
    let left = gkm_testenv::eventually("nothing left behind", Duration::from_secs(60), || async {
        let left = leaks::leftovers(&client, &kubelet_dir, &store, &volume_dir).await?;
        Ok(left.is_empty().then_some(()))
    })
    .await;
    let leftovers = leaks::leftovers(&client, &kubelet_dir, &store, &volume_dir).await?;
    shared.record(Check::NothingLeaks, left.map_err(|_| leftovers.join("; ")));

    // The real node's directory goes with the stack: keep its logs (the
    // kubelet's, every pod's) beside the summary.
    if let Some(real) = stack.real_node(REAL_NODE) {
        keep_logs(&real.paths().dir, &config.dir.join("real-node"));
    }
    let ledger = shared.ledger();
    let summary = Summary {
        seed: config.seed,
        duration_s: config.duration.as_secs(),
        wall_s: began.elapsed().as_secs_f64(),
        faults_injected: shared.windows().len(),
        recovery: recoveries
            .iter()
            .map(|(kind, samples)| {
                let injected = shared.windows().iter().filter(|w| &w.kind == kind).count();
                (kind.clone(), Recovery::of(injected, samples))
            })
            .collect(),
        checks_run: ledger.runs(),
        violations: ledger.violations(),
        checks: ledger,
        workload: shared.counts(),
    };
    let json = serde_json::to_string_pretty(&summary)?;
    std::fs::write(config.dir.join("summary.json"), &json)?;
    drop(proxy);
    drop(stack);
    drop(containerd);
    drop(plane_restarts);
    Ok(summary)
}

/// Waits up to `within` for the system to be healthy (`what` names the
/// wait); when it is not, what the wait said and what is still unhealthy.
async fn healthy_within(
    what: &str,
    within: Duration,
    client: &kube::Client,
    components: &[&str],
    shared: &Shared,
) -> Result<(), String> {
    let healthy = gkm_testenv::eventually(what, within, || async {
        Ok(health::unhealthy(client, components, shared)
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(()))
    })
    .await;
    if let Err(e) = healthy {
        let why = health::unhealthy(client, components, shared)
            .await
            .ok()
            .flatten();
        return Err(format!("{e}: {}", why.unwrap_or_default()));
    }
    Ok(())
}

/// Waits until the system is healthy after `fault` (and, after one that
/// touched the real node, until a new pod there reads a verified tree);
/// records the outcome and returns the recovery time in seconds, from
/// `injected` (the injection, or the healing of a windowed fault).
async fn recover(
    client: &kube::Client,
    components: &[&str],
    shared: &Shared,
    work: &Workload<'_>,
    fault: &Fault,
    injected: Instant,
) -> Option<f64> {
    let healthy = healthy_within(
        &format!("healthy after {}", fault.kind()),
        CONVERGE_WITHIN,
        client,
        components,
        shared,
    )
    .await;
    if let Err(e) = healthy {
        shared.record(
            Check::ChangesConverge,
            Err(format!("{}: {e}", fault.kind())),
        );
        return None;
    }
    shared.record(Check::ChangesConverge, Ok(()));
    if fault.touches_real_node() {
        // A new pod on the node reads a verified tree within the bound.
        let probe = match work.start_reader("probe", "sm75", false).await {
            Ok(probe) => probe,
            Err(e) => {
                shared.record(
                    Check::NodeServesAgain,
                    Err(format!("probe after {}: {e:#}", fault.kind())),
                );
                return None;
            }
        };
        let served =
            gkm_testenv::eventually(&format!("{probe} reads"), SERVE_AGAIN_WITHIN, || async {
                checks::check_readers(shared);
                let read = shared
                    .readers()
                    .iter()
                    .any(|r| r.name == probe && r.last_read.is_some());
                Ok(read.then_some(()))
            })
            .await;
        checks::check_readers(shared);
        let _ = work.delete_reader(&probe).await;
        served.ok()?;
    }
    Some(injected.elapsed().as_secs_f64())
}

/// Copies the kubelet's logs and the pod logs of the real node at `node_dir`
/// into `dest` (best effort: a missing log is skipped).
fn keep_logs(node_dir: &Path, dest: &Path) {
    let _ = std::fs::create_dir_all(dest);
    for log in ["kubelet.log", "kubelet.previous.log", "containerd.log"] {
        let _ = std::fs::copy(node_dir.join(log), dest.join(log));
    }
    let _ = gkm_testenv::copy_tree(&node_dir.join("pod-logs"), &dest.join("pod-logs"));
}

/// Mounts a tmpfs of [`STORE_FS_SIZE`] at `dir`.
fn mount_tmpfs(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let out = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={STORE_FS_SIZE}"),
            "soak-store",
        ])
        .arg(dir)
        .output()
        .context("running mount")?;
    anyhow::ensure!(
        out.status.success(),
        "mount tmpfs at {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
