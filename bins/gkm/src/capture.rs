//! `gkm capture`: a warmed cache directory becomes a signed, verified image
//! (the flow is `gkm_oci::capture`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use gkm_oci::capture::{CaptureError, CaptureOptions, Captured, FailureReason, capture};
use gkm_oci::sign::SigningKey;
use gkm_oci::{ExtractPolicy, ImageRef, Progress, Report};
use serde::Serialize;

use crate::build::CompressionArg;
use crate::image_args::{EXIT_REJECTED, RegistryArgs, parse_ref};
use crate::output;
use crate::progress::{Bar, hook};
use crate::sign::{FormatArg, KeyArgs};

/// Arguments of `gkm capture`.
#[derive(clap::Args)]
#[command(after_help = crate::image_args::EXIT_CODES_HELP)]
pub struct Args {
    /// The directory the workload compiled into (a Triton cache or a vLLM
    /// cache).
    dir: PathBuf,
    /// The registry repository and tag to push to (`REGISTRY/REPO[:TAG]`).
    #[arg(short = 't', long = "target", value_name = "REF", value_parser = parse_ref)]
    target: ImageRef,
    #[command(flatten)]
    key: KeyArgs,
    /// The signature format.
    #[arg(long, value_enum, default_value_t)]
    format: FormatArg,
    /// Layer compression: gzip (read by MCV and GKM's extractor) or zstd
    /// (smaller; read by gkm).
    #[arg(long, value_enum, default_value = "gzip")]
    compression: CompressionArg,
    /// The `org.opencontainers.image.title` label (default: the
    /// repository's last path component).
    #[arg(long)]
    title: Option<String>,
    /// The GPU the cache was compiled on (for example "NVIDIA T4"),
    /// recorded in the image's `io.gkm.compiled-on-gpu` label.
    #[arg(long)]
    gpu: Option<String>,
    /// The most the cache's files may add up to (a number of bytes, with an
    /// optional KiB, MiB, GiB or TiB suffix); a larger tree is refused
    /// before anything is packed. The default is the agents' default cap of
    /// one namespace's caches on a node.
    #[arg(long, default_value = "64GiB", value_parser = gkm_oci::disk::parse_bytes)]
    max_bytes: u64,
    /// The most files and directories the cache may hold.
    #[arg(long, default_value_t = ExtractPolicy::default().max_entries)]
    max_files: u64,
    /// Print the result as JSON (no progress display); a failure prints
    /// `{captured: false, reason, message}` too.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) registry: RegistryArgs,
}

/// `gkm capture --json`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CapturedDoc {
    captured: bool,
    target: String,
    /// The target pinned to the digest.
    image: String,
    digest: String,
    files: u64,
    bytes: u64,
    entry_count: usize,
    targets: Vec<String>,
    /// The GPU the cache was compiled on, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu: Option<String>,
    layer: output::Blob,
    signature: String,
    verified: gkm_core::policy::Verified,
}

/// `gkm capture --json` when it failed.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FailedDoc {
    captured: bool,
    target: String,
    reason: FailureReason,
    message: String,
}

/// Without a progress bar (standard error is not a terminal, or `--json`),
/// each step as a line on standard error, so a Job's log shows how far a
/// capture got.
struct StepLines;

impl Report for StepLines {
    fn step(&self, name: &str, _total: Option<u64>) {
        eprintln!("gkm capture: {name}");
    }
}

/// Runs `gkm capture`.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let key = args.key.load()?;
    let options = CaptureOptions {
        limits: ExtractPolicy {
            max_total_size: args.max_bytes,
            max_entries: args.max_files,
            ..ExtractPolicy::default()
        },
        compression: args.compression.into(),
        title: args.title.clone(),
        format: args.format.format(),
        gpu: args.gpu.clone(),
        work_dir: None,
    };
    let registry = args.registry.options()?;
    let bar = Bar::start("capture", args.json);
    let progress: Progress = match hook(&bar) {
        Some(bar) => bar,
        None => Arc::new(StepLines),
    };
    let result = capture(
        &args.dir,
        &args.target,
        &key,
        &options,
        &registry,
        Some(progress),
    )
    .await;
    drop(bar);
    match result {
        Ok(captured) => {
            report(&args, &key, &captured)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => failed(&args, err),
    }
}

/// Prints a capture that succeeded.
fn report(args: &Args, key: &SigningKey, c: &Captured) -> anyhow::Result<()> {
    let targets: Vec<String> = c
        .cache
        .summary()
        .targets
        .iter()
        .map(ToString::to_string)
        .collect();
    if args.json {
        return output::print(&CapturedDoc {
            captured: true,
            target: c.target.to_string(),
            image: c.pinned.to_string(),
            digest: c.digest.to_string(),
            files: c.tree.files,
            bytes: c.tree.bytes,
            entry_count: c.cache.entries().len(),
            targets,
            gpu: c.gpu.clone(),
            layer: output::Blob {
                digest: c.layer.digest.to_string(),
                size: c.layer.size,
                media_type: c.layer.compression.media_type().to_string(),
            },
            signature: c.signature.clone(),
            verified: c.verified.clone(),
        });
    }
    eprintln!(
        "captured {} into {}: {} kernels, {} files, {} bytes, targets: {}{}",
        args.dir.display(),
        c.target,
        c.cache.entries().len(),
        c.tree.files,
        c.tree.bytes,
        targets.join(", "),
        c.gpu
            .as_deref()
            .map(|g| format!(", compiled on {g}"))
            .unwrap_or_default(),
    );
    let public = key.public_key();
    eprintln!(
        "signed with {} key {}; verified: {}",
        public.algorithm(),
        public.fingerprint(),
        c.verified
    );
    println!("{}", c.pinned);
    Ok(())
}

/// Prints a capture that failed: refusals (an unsafe tree, an image that
/// did not verify) exit 4, other errors go to `main` (exit 1, with a hint).
fn failed(args: &Args, err: CaptureError) -> anyhow::Result<ExitCode> {
    let reason = err.reason();
    if args.json {
        output::print(&FailedDoc {
            captured: false,
            target: args.target.to_string(),
            reason,
            message: err.to_string(),
        })?;
    }
    match reason {
        FailureReason::UnsafeTree | FailureReason::NotVerified => {
            eprintln!("gkm: rejected: {reason}: {err}");
            Ok(ExitCode::from(EXIT_REJECTED))
        }
        _ => Err(match err {
            // The image error itself, so main's hints see the registry error.
            CaptureError::Image(e) => anyhow::Error::from(e),
            other => anyhow::Error::from(other),
        }),
    }
}
