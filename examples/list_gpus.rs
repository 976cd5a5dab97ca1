//! Lists this node's GPUs with gkm-gpu alone (no OCI, no Kubernetes), and the
//! node labels they give.
//!
//! ```text
//! cargo run -p gkm-examples --example list_gpus              # this node
//! cargo run -p gkm-examples --example list_gpus -- /path/to/sysfs
//! cargo run -p gkm-examples --example list_gpus -- --simulate gpus.yaml
//! ```

// An example may unwrap: a panic is how a short program reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;

use gkm_gpu::labels::{LabelOptions, node_labels};
use gkm_gpu::{DiscoveryOptions, discover};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut opts = DiscoveryOptions::default();
    match args.as_slice() {
        [] => {}
        [flag, file] if flag == "--simulate" => opts.simulate = Some(file.into()),
        [root] => opts.sysfs_root = root.into(),
        _ => {
            eprintln!("usage: list_gpus [SYSFS_ROOT | --simulate FILE]");
            return ExitCode::from(2);
        }
    }
    let inventory = match discover(&opts) {
        Ok(inventory) => inventory,
        Err(e) => {
            eprintln!("list_gpus: {e}");
            return ExitCode::FAILURE;
        }
    };
    for gpu in &inventory.gpus {
        println!("{}", gpu.describe());
    }
    for v in &inventory.vfio {
        println!(
            "vfio {} {} (IOMMU group {:?})",
            v.pci_address, v.product, v.iommu_group
        );
    }
    for m in &inventory.mdevs {
        println!("vGPU {} {} on {}", m.uuid, m.type_id, m.parent_address);
    }
    for w in &inventory.warnings {
        eprintln!("warning: {w}");
    }
    let labels = node_labels(
        &inventory,
        &LabelOptions {
            vendor_labels: true,
        },
    );
    for (key, value) in labels {
        println!("{key}={value}");
    }
    ExitCode::SUCCESS
}
