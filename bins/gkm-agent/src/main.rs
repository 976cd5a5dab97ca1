//! `gkm-agent`: one per node; checks caches against the node's GPUs and extracts them.

use clap::Parser;

/// gkm node agent: discovers the node's GPUs, pulls and extracts compatible
/// caches into the node store and reports in the node's GKMCacheNode.
#[derive(Parser)]
#[command(name = "gkm-agent", version, about)]
struct Cli {}

fn main() {
    Cli::parse();
    eprintln!("gkm-agent: the node agent is not built yet; see --help");
    std::process::exit(2);
}
