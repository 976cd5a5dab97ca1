//! `gkm`: the command line for GPU kernel cache images, GPUs and CRDs.
//!
//! Flag parsing and wiring only; the work is in the library crates.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod build;
mod check;
mod crds;
mod extract;
mod gpus;
mod image_args;
mod inspect;
mod pull;
mod push;
mod sign;
mod verify;

/// GPU kernel cache manager.
#[derive(Parser)]
#[command(name = "gkm", version, about, propagate_version = true)]
struct Cli {
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Scan a cache directory and build an OCI image of it.
    Build(build::Args),
    /// Push an image from an OCI layout to a registry.
    Push(push::Args),
    /// Pull an image into an OCI layout.
    Pull(pull::Args),
    /// Show an image's targets, entries, size, layers, digest and labels.
    Inspect(inspect::Args),
    /// Check an image or cache directory against GPUs.
    Check(check::Args),
    /// Extract an image's cache into a directory.
    Extract(extract::Args),
    /// Sign an image (a sigstore bundle by default, or the cosign v2 format).
    Sign(sign::Args),
    /// Verify an image's signature against keys or a keyless identity.
    Verify(verify::Args),
    /// List this node's GPUs.
    Gpus(gpus::Args),
    /// Print gkm's CustomResourceDefinitions as YAML.
    Crds(crds::Args),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    gkm_bin_support::init_logging(cli.log_json, "warn");
    let result = match cli.command {
        Command::Build(args) => build::run(args).await,
        Command::Push(args) => push::run(args).await,
        Command::Pull(args) => pull::run(args).await,
        Command::Inspect(args) => inspect::run(args).await,
        Command::Check(args) => check::run(args).await,
        Command::Extract(args) => extract::run(args).await,
        Command::Sign(args) => sign::run(args).await,
        Command::Verify(args) => verify::run(args).await,
        Command::Gpus(args) => gpus::run(args).await,
        Command::Crds(args) => crds::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("gkm: error: {err:#}");
            ExitCode::from(1)
        }
    }
}
