//! `gkm gpus`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use gkm_gpu::metrics::{GpuCollector, metrics_text};
use gkm_gpu::telemetry::{Telemetry, TelemetryOptions};
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
    /// Print the GPU metrics gkm-agent serves on /metrics for these GPUs
    /// instead (readings from NVML, amdgpu's sysfs files, or simulated).
    #[arg(long, conflicts_with_all = ["labels", "json"])]
    metrics: bool,
    /// With --metrics, the node name for the Hostname label (default: this
    /// machine's host name).
    #[arg(long, requires = "metrics")]
    node_name: Option<String>,
}

/// Runs `gkm gpus`.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = DiscoveryOptions {
        sysfs_root: args.sysfs.clone(),
        nvml: !args.no_nvml,
        simulate: args.simulate,
        pci_ids: args
            .pci_ids
            .map_or(PciIdsSource::System, PciIdsSource::File),
    };
    let inventory = tokio::task::spawn_blocking(move || gkm_gpu::discover(&opts))
        .await
        .context("GPU discovery stopped")??;
    if args.metrics {
        let telemetry_opts = TelemetryOptions {
            sysfs_root: args.sysfs,
            nvml: !args.no_nvml,
        };
        let telemetry =
            tokio::task::spawn_blocking(move || Telemetry::open(&inventory, &telemetry_opts))
                .await
                .context("opening GPU readings stopped")?;
        for note in telemetry.notes() {
            eprintln!("gkm: GPU readings missing: {note}");
        }
        let hostname = args.node_name.unwrap_or_else(host_name);
        print!("{}", metrics_text(GpuCollector::new(telemetry, hostname)));
    } else if args.labels {
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

/// This machine's host name, as the kernel has it.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
