//! `gkm check`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use gkm_core::cache::Summary;
use gkm_core::compat::{CheckOptions, check_summary};
use gkm_gpu::DiscoveryOptions;
use gkm_oci::{Image, ImageRef, Repo};

use crate::image_args::{EXIT_INCOMPATIBLE, RegistryArgs, finish};

/// Arguments of `gkm check`.
#[derive(clap::Args)]
#[command(after_help = crate::image_args::EXIT_CODES_HELP)]
pub struct Args {
    /// An image (`REGISTRY/REPO[:TAG]`, `oci:PATH[:TAG]`) or a cache directory.
    target: String,
    /// Check against the GPUs of this simulated inventory file (YAML or
    /// JSON, as `gkm gpus --json` prints) instead of this node's.
    #[arg(long, value_name = "FILE")]
    gpus: Option<PathBuf>,
    /// The Triton version the workload runs.
    #[arg(long)]
    triton_version: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) registry: RegistryArgs,
}

/// Runs `gkm check`: exit 0 when at least one GPU fits, 3 when none does.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let summary = if !args.target.starts_with(gkm_oci::reference::LAYOUT_PREFIX)
        && std::path::Path::new(&args.target).is_dir()
    {
        let dir = PathBuf::from(&args.target);
        let manifest = tokio::task::spawn_blocking(move || gkm_core::cache::scan(&dir)).await??;
        manifest.summary()
    } else {
        let image: ImageRef = args.target.parse()?;
        let repo = Repo::open(&image, &args.registry.options()?)?;
        match Image::fetch(&repo).await {
            Ok(image) => image.cache()?.summary,
            Err(e) => return finish(e),
        }
    };
    let opts = DiscoveryOptions {
        simulate: args.gpus,
        ..Default::default()
    };
    let inventory = tokio::task::spawn_blocking(move || gkm_gpu::discover(&opts))
        .await
        .context("GPU discovery stopped")??;
    let report = check_summary(
        &Summary::new(summary.targets),
        &inventory.gpus,
        &CheckOptions {
            triton_version: args.triton_version,
            ..Default::default()
        },
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
        println!(
            "{}",
            if report.compatible {
                "compatible"
            } else {
                "incompatible"
            }
        );
    }
    Ok(if report.compatible {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INCOMPATIBLE)
    })
}
