//! `gkm-csi`: the CSI node plugin that mounts extracted caches read-only into pods.

use clap::Parser;

/// gkm CSI driver (`csi.gkm.io`): bind-mounts a verified, compatible cache
/// from the node store read-only into pods.
#[derive(Parser)]
#[command(name = "gkm-csi", version, about)]
struct Cli {}

fn main() {
    Cli::parse();
    eprintln!("gkm-csi: the CSI driver is not built yet; see --help");
    std::process::exit(2);
}
