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
//! converge; CHANGED of them get a new image and converge again; on every
//! node the caches fit, a pod's writable view of each cache ends having
//! compiled two entries (its usage record, as the CSI driver writes it,
//! [`end_pods`]) until every cache's status counts it; then nothing changes
//! for IDLE_SECS. A revision whose caches do not all
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

mod logs;
mod report;
mod scenario;

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
use logs::*;
use report::*;
use scenario::*;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The fixture cache every image is built from (sm75 kernels).
pub(crate) const FIXTURE: &str = "triton-vector-add-cuda-sm75";
/// The namespace of the benchmark's caches.
pub(crate) const NAMESPACE: &str = "bench";
/// The operator's and agents' users, as their ServiceAccounts.
pub(crate) const OPERATOR_USER: &str = "system:serviceaccount:gkm-system:gkm-operator";
pub(crate) const AGENT_USER: &str = "system:serviceaccount:gkm-system:gkm-agent";

/// Runs the benchmark on one revision and writes its figures to `out`.
pub(crate) async fn run(
    tree: &Path,
    operator: &Path,
    agents: &Path,
    out: &Path,
) -> anyhow::Result<()> {
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

    // Phase 4: on every fitting node, a pod's writable view of each cache
    // ends having compiled two entries the cache lacks.
    let fitting = (0..scale.nodes).find(|&i| inventory(i, scale.t4_per_ten).1);
    let before = match fitting {
        Some(index) => Some(bench.report_bytes(index).await?),
        None => None,
    };
    let ended = Instant::now();
    m.pods_ended = end_pods(stores.path(), &scale, &expected)?;
    let counted = bench
        .counted(&expected, &scale, compatible, &mut gkm)
        .await?;
    m.pod_end_secs = ended.elapsed().as_secs_f64();
    settle(&mut meter, &mut m.pod_end).await?;
    if let (Some(index), Some(before)) = (fitting, before) {
        m.report_bytes = Some((before, bench.report_bytes(index).await?));
    }
    eprintln!(
        "== {} pod ends counted in every cache's status in {:.1}s (all: {counted})",
        m.pods_ended, m.pod_end_secs
    );

    // Phase 5: nothing changes.
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

/// Fails, naming the command that installs it, when a component or the
/// fixture cache is missing.
pub(crate) fn check() -> anyhow::Result<()> {
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
