//! `gkm-soak`: the fault-injection soak (see `gkm_local::soak`); run by
//! `hack/soak.sh`. Exits non-zero when an invariant was violated.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use gkm_local::dra::GpuPath;
use gkm_local::soak::{self, Config};

/// Runs gkm on the local stack under a steady workload while faults are
/// injected on a seeded schedule, checking invariants throughout.
#[derive(Parser)]
#[command(name = "gkm-soak")]
struct Cli {
    /// Seconds of faults.
    #[arg(long, default_value_t = 120)]
    duration: u64,
    /// The schedule's seed (printed; the same seed replays the run).
    #[arg(long)]
    seed: Option<u64>,
    /// Where to keep logs and the summary (default: a fresh temporary
    /// directory, removed at the end unless --keep).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the directory.
    #[arg(long)]
    keep: bool,
    /// Also write the summary (JSON) here.
    #[arg(long)]
    summary: Option<PathBuf>,
    /// The real node's GPUs reach pods through DRA instead of the device plugin.
    #[arg(long)]
    dra: bool,
    /// The agents' `--gc-grace` (default: the agent's own, 10 minutes).
    /// With `0s` a node drops a cache's previous digest as soon as its tag
    /// moves, before the new one is extracted.
    #[arg(long)]
    gc_grace: Option<String>,
    /// Inject only these kinds of fault (comma-separated, as the summary
    /// names them: `store-full,csi-pod-deleted`); every kind by default.
    #[arg(long, value_delimiter = ',')]
    faults: Vec<String>,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let temp = gkm_testenv::temp_dir()?;
    let dir = match &cli.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => temp.path().to_path_buf(),
    };
    if cli.keep || cli.dir.is_some() {
        let _ = temp.keep();
    }
    let config = Config {
        duration: Duration::from_secs(cli.duration),
        seed: cli.seed.unwrap_or_else(soak::rng::fresh_seed),
        dir,
        gc_grace: cli.gc_grace.clone(),
        faults: cli.faults.clone(),
        gpu_path: if cli.dra {
            GpuPath::Dra
        } else {
            GpuPath::DevicePlugin
        },
    };
    // Interrupted (Ctrl-C, a CI timeout's SIGTERM), it still tears the
    // stack down: the real node's containers, mounts and bridge go with it.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let summary = tokio::select! {
        summary = soak::run(&config) => summary?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted (seed {})", config.seed),
        _ = terminate.recv() => anyhow::bail!("terminated (seed {})", config.seed),
    };
    let json = serde_json::to_string_pretty(&summary)?;
    if let Some(path) = &cli.summary {
        std::fs::write(path, &json)?;
    }
    println!("{json}\n\n{}", summary.markdown());
    if summary.violations > 0 {
        anyhow::bail!(
            "{} invariant violations (seed {}; SEED={} replays)",
            summary.violations,
            summary.seed,
            summary.seed
        );
    }
    Ok(())
}
