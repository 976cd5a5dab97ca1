//! `gkm`: the command line for GPU kernel cache images, GPUs and CRDs.
//!
//! Flag parsing and wiring only; the work is in the library crates.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod build;
mod caches;
mod capture;
mod check;
mod crds;
mod explain;
mod extract;
mod gpus;
mod hints;
mod image_args;
mod index;
mod inspect;
mod output;
mod progress;
mod pull;
mod push;
mod sign;
mod variant;
mod verify;
mod view;

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
    /// Scan a cache directory and build an OCI image of it (several
    /// directories: a multi-target image).
    Build(build::Args),
    /// Assemble single-target cache images into one multi-target image (an
    /// OCI index annotated with each variant's targets).
    Index(index::Args),
    /// Push an image from an OCI layout to a registry.
    Push(push::Args),
    /// Turn a warmed cache directory into a signed, verified image: check,
    /// build, push by digest, sign, verify, then tag.
    Capture(Box<capture::Args>),
    /// Pull an image into an OCI layout.
    Pull(pull::Args),
    /// Show an image's targets, entries, size, layers, digest and labels.
    Inspect(inspect::Args),
    /// Check an image or cache directory against GPUs.
    Check(check::Args),
    /// Extract an image's cache into a directory.
    Extract(extract::Args),
    /// Explain why a workload's new cache entries missed a cache: for each,
    /// the nearest cached entry of the same kernel and what differs in its
    /// key.
    Explain(explain::Args),
    /// Sign an image (a sigstore bundle by default, or the cosign v2 format).
    Sign(sign::Args),
    /// Verify an image's signature against keys or a keyless identity.
    Verify(verify::Args),
    /// Lay a writable view of a read-only cache tree into a directory:
    /// directories made, files linked, Triton group files relocated.
    View(view::Args),
    /// List this node's GPUs.
    Gpus(gpus::Args),
    /// Print gkm's CustomResourceDefinitions (YAML, or JSON with --json).
    Crds(crds::Args),
    /// List a cluster's caches and whether they are used: per cache its
    /// state, digest, nodes serving it and pods on it, and per workload
    /// its hit ratio and the entries it compiled.
    Caches(caches::Args),
    /// Print a shell completion script.
    ///
    /// For example `gkm completions bash > /etc/bash_completion.d/gkm`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

impl Command {
    /// The registry flags, for the commands that talk to registries.
    fn registry(&self) -> Option<&image_args::RegistryArgs> {
        match self {
            Command::Build(a) => Some(&a.registry),
            Command::Index(a) => Some(&a.registry),
            Command::Push(a) => Some(&a.registry),
            Command::Capture(a) => Some(&a.registry),
            Command::Pull(a) => Some(&a.registry),
            Command::Inspect(a) => Some(&a.registry),
            Command::Check(a) => Some(&a.registry),
            Command::Extract(a) => Some(&a.registry),
            Command::Explain(a) => Some(&a.registry),
            Command::Sign(a) => Some(&a.registry),
            Command::Verify(a) => Some(&a.registry),
            Command::Gpus(_)
            | Command::View(_)
            | Command::Crds(_)
            | Command::Caches(_)
            | Command::Completions { .. } => None,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    gkm_bin_support::init_logging_to(cli.log_json, "warn", progress::LogWriter);
    let with_username = cli.command.registry().is_some_and(|r| r.username.is_some());
    let result = match cli.command {
        Command::Build(args) => build::run(args).await,
        Command::Index(args) => index::run(args).await,
        Command::Push(args) => push::run(args).await,
        Command::Capture(args) => capture::run(*args).await,
        Command::Pull(args) => pull::run(args).await,
        Command::Inspect(args) => inspect::run(args).await,
        Command::Check(args) => check::run(args).await,
        Command::Extract(args) => extract::run(args).await,
        Command::Explain(args) => explain::run(args).await,
        Command::Sign(args) => sign::run(args).await,
        Command::Verify(args) => verify::run(args).await,
        Command::View(args) => view::run(args),
        Command::Gpus(args) => gpus::run(args).await,
        Command::Crds(args) => crds::run(args),
        Command::Caches(args) => caches::run(args).await,
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "gkm", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("gkm: error: {err:#}");
            if let Some(hint) = hints::hint(&err, with_username) {
                eprintln!("gkm: hint: {hint}");
            }
            ExitCode::from(1)
        }
    }
}
