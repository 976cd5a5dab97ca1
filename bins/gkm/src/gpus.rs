//! `gkm gpus`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use gkm_gpu::{DiscoveryOptions, LabelOptions, PciIdsSource};

/// Arguments of `gkm gpus`.
#[derive(clap::Args)]
pub struct Args {
    /// Print the inventory as JSON (readable back with --simulate).
    #[arg(long)]
    json: bool,
    /// The sysfs root to scan.
    #[arg(long, value_name = "ROOT", default_value = "/sys")]
    sysfs: PathBuf,
    /// Read a simulated inventory (YAML or JSON) instead of this node.
    #[arg(long, value_name = "FILE")]
    simulate: Option<PathBuf>,
    /// Do not ask NVML about NVIDIA GPUs.
    #[arg(long)]
    no_nvml: bool,
    /// Name PCI devices from this pci.ids file instead of the system's.
    #[arg(long, value_name = "FILE")]
    pci_ids: Option<PathBuf>,
    /// Print the node labels the inventory gives instead.
    #[arg(long)]
    labels: bool,
    /// With --labels, add NVIDIA GPU Feature Discovery's and AMD's label names.
    #[arg(long, requires = "labels")]
    vendor_labels: bool,
}

/// Runs `gkm gpus`.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = DiscoveryOptions {
        sysfs_root: args.sysfs,
        nvml: !args.no_nvml,
        simulate: args.simulate,
        pci_ids: args
            .pci_ids
            .map_or(PciIdsSource::System, PciIdsSource::File),
    };
    let inventory = tokio::task::spawn_blocking(move || gkm_gpu::discover(&opts))
        .await
        .context("GPU discovery stopped")??;
    if args.labels {
        let labels = gkm_gpu::node_labels(
            &inventory,
            &LabelOptions {
                vendor_labels: args.vendor_labels,
            },
        );
        if args.json {
            println!("{}", serde_json::to_string_pretty(&labels)?);
        } else {
            for (key, value) in labels {
                println!("{key}={value}");
            }
        }
    } else if args.json {
        println!("{}", serde_json::to_string_pretty(&inventory)?);
    } else {
        print!("{}", gkm_gpu::report::render(&inventory));
    }
    Ok(ExitCode::SUCCESS)
}
