//! `gkm capture`: a warmed cache directory becomes a signed, verified image
//! (the flow is `gkm_oci::capture`); with `--delta-of`, the upper of a
//! writable view becomes a delta image of its base (`gkm_oci::delta`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use gkm_core::delta::DeltaBase;
use gkm_oci::capture::{CaptureError, CaptureOptions, Captured, FailureReason, capture};
use gkm_oci::delta::{BaseCheck, capture_delta};
use gkm_oci::sign::SigningKey;
use gkm_oci::{ExtractPolicy, ImageRef, Progress, Report};
use serde::Serialize;

use crate::build::CompressionArg;
use crate::image_args::{DeclaredArgs, EXIT_REJECTED, RegistryArgs, parse_ref};
use crate::output;
use crate::progress::{Bar, hook};
use crate::sign::{FormatArg, KeyArgs};

/// Arguments of `gkm capture`.
#[derive(clap::Args)]
#[command(after_help = crate::image_args::EXIT_CODES_HELP)]
pub struct Args {
    /// The directory the workload compiled into (a Triton cache or a vLLM
    /// cache); with --delta-of or --delta-base-record, the upper directory
    /// of the writable view the workload compiled into.
    dir: PathBuf,
    /// Capture a delta image of this base (`REGISTRY/REPO@sha256:…`, the
    /// image the view was made of): the base's layers plus one layer of
    /// the files DIR adds. The base must verify with the signing key (or a
    /// --base-key).
    #[arg(long, value_name = "REF", value_parser = parse_ref, conflicts_with = "delta_base_record")]
    delta_of: Option<ImageRef>,
    /// Like --delta-of, the base (and its build path) read from this JSON
    /// record (`{"image": "REPO@sha256:…", "buildPath": "…"}`), as the CSI
    /// driver writes it beside a kept upper. The base is checked by its
    /// digest only: the node delivered it, so the cache's signature policy
    /// allowed it already.
    #[arg(long, value_name = "FILE")]
    delta_base_record: Option<PathBuf>,
    /// With --delta-of: a PEM public key whose signature on the base is
    /// accepted too (repeatable; the signing key's always is).
    #[arg(long, value_name = "FILE", conflicts_with = "delta_base_record")]
    base_key: Vec<PathBuf>,
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
    #[arg(long, conflicts_with_all = ["discover_gpu", "gpus"])]
    gpu: Option<String>,
    #[command(flatten)]
    declared: DeclaredArgs,
    /// Record the GPUs of this machine that fit the cache's targets as the
    /// GPU it was compiled on (run where the workload ran).
    #[arg(long)]
    discover_gpu: bool,
    /// Like --discover-gpu, from a simulated inventory file (YAML or JSON,
    /// as `gkm gpus --json` prints) instead of this machine's GPUs.
    #[arg(long, value_name = "FILE", conflicts_with = "discover_gpu")]
    gpus: Option<PathBuf>,
    /// The most the cache's files may add up to (a number of bytes, with an
    /// optional KiB, MiB, GiB or TiB suffix); a larger tree is refused
    /// before anything is packed. The default is the agents' default cap of
    /// one namespace's caches on a node.
    #[arg(long, default_value = "64GiB", value_parser = gkm_oci::disk::parse_bytes)]
    max_bytes: u64,
    /// The most files and directories the cache may hold.
    #[arg(long, default_value_t = ExtractPolicy::default().max_entries)]
    max_files: u64,
    /// Also write the outcome, as compact JSON of at most 4 KiB
    /// (`{captured, image, digest}` or `{captured, reason, message}`), to
    /// this file: a Job's `terminationMessagePath`, where the on-cluster
    /// capture reads it.
    #[arg(long, value_name = "PATH")]
    termination_log: Option<PathBuf>,
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
    /// A delta's base, pinned.
    #[serde(skip_serializing_if = "Option::is_none")]
    base: Option<String>,
    /// A delta's own layer.
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<DeltaDoc>,
}

/// The delta layer of `gkm capture --delta-of --json`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeltaDoc {
    /// The delta layer's digest.
    digest: String,
    /// Its files, relative to the cache root.
    files: Vec<String>,
    /// The sum of their sizes.
    bytes: u64,
    /// How many of the image's layers are the base's.
    base_layers: usize,
    /// The upper's scratch left out.
    dropped: Vec<String>,
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

/// The outcome written to `--termination-log`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Outcome {
    captured: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<FailureReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// A delta's base, pinned.
    #[serde(skip_serializing_if = "Option::is_none")]
    base: Option<String>,
}

/// The most a container's termination message may hold.
const TERMINATION_MESSAGE_MAX: usize = 4096;

impl Outcome {
    /// Compact JSON within [`TERMINATION_MESSAGE_MAX`] bytes: a long
    /// message is cut (at a character boundary) until it fits.
    fn to_bounded_json(&self) -> String {
        let mut outcome = Outcome {
            image: self.image.clone(),
            digest: self.digest.clone(),
            message: self.message.clone(),
            base: self.base.clone(),
            ..*self
        };
        loop {
            let json = serde_json::to_string(&outcome).unwrap_or_default();
            let excess = json.len().saturating_sub(TERMINATION_MESSAGE_MAX);
            let Some(message) = outcome.message.as_mut().filter(|_| excess > 0) else {
                return json;
            };
            if message.len() <= excess + 3 {
                outcome.message = None;
                continue;
            }
            let mut cut = message.len() - excess - 3;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push('…');
        }
    }
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
    let gpus = if args.discover_gpu || args.gpus.is_some() {
        let opts = gkm_gpu::DiscoveryOptions {
            simulate: args.gpus.clone(),
            ..Default::default()
        };
        tokio::task::spawn_blocking(move || gkm_gpu::discover(&opts))
            .await
            .context("GPU discovery stopped")??
            .gpus
    } else {
        Vec::new()
    };
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
        gpus,
        work_dir: None,
        declared: args.declared.declared(),
    };
    let registry = args.registry.options()?;
    let bar = Bar::start("capture", args.json);
    let progress: Progress = match hook(&bar) {
        Some(bar) => bar,
        None => Arc::new(StepLines),
    };
    let delta = delta_base(&args)?;
    let base_name = delta.as_ref().map(|(base, _)| base.to_string());
    let result = match delta {
        Some((base, build_path)) => {
            let mut keys = vec![key.public_key().clone()];
            for path in &args.base_key {
                let pem = std::fs::read_to_string(path)
                    .with_context(|| format!("reading the base key {}", path.display()))?;
                keys.push(
                    gkm_core::policy::PublicKey::from_pem(&pem)
                        .with_context(|| format!("the base key {}", path.display()))?,
                );
            }
            let policy = gkm_core::policy::Policy::keys(keys)?;
            let check = if args.delta_base_record.is_some() {
                BaseCheck::Delivered
            } else {
                BaseCheck::Signed(&policy)
            };
            capture_delta(
                &args.dir,
                &base,
                build_path.as_deref(),
                check,
                &args.target,
                &key,
                &options,
                &registry,
                Some(progress),
            )
            .await
        }
        None => {
            capture(
                &args.dir,
                &args.target,
                &key,
                &options,
                &registry,
                Some(progress),
            )
            .await
        }
    };
    drop(bar);
    if let Some(path) = &args.termination_log {
        let outcome = match &result {
            Ok(c) => Outcome {
                captured: true,
                image: Some(c.pinned.to_string()),
                digest: Some(c.digest.to_string()),
                reason: None,
                message: None,
                base: base_name,
            },
            Err(e) => Outcome {
                captured: false,
                image: None,
                digest: None,
                reason: Some(e.reason()),
                message: Some(e.to_string()),
                base: base_name,
            },
        };
        std::fs::write(path, outcome.to_bounded_json())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    match result {
        Ok(captured) => {
            report(&args, &key, &captured)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => failed(&args, err),
    }
}

/// The base of a delta capture, from --delta-of or --delta-base-record,
/// with the record's build path.
fn delta_base(args: &Args) -> anyhow::Result<Option<(ImageRef, Option<PathBuf>)>> {
    if let Some(base) = &args.delta_of {
        return Ok(Some((base.clone(), None)));
    }
    let Some(path) = &args.delta_base_record else {
        return Ok(None);
    };
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let record: DeltaBase = serde_json::from_slice(&bytes)
        .with_context(|| format!("{}: not a delta base record", path.display()))?;
    let base = parse_ref(&record.image)
        .map_err(|e| anyhow::anyhow!("{}: image {:?}: {e}", path.display(), record.image))?;
    Ok(Some((base, record.build_path)))
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
            base: c.delta.as_ref().map(|d| d.base.clone()),
            delta: c.delta.as_ref().map(|d| DeltaDoc {
                digest: c.layer.digest.to_string(),
                files: d.files.clone(),
                bytes: c.tree.bytes,
                base_layers: d.base_layers,
                dropped: d.dropped.clone(),
            }),
        });
    }
    eprintln!(
        "captured {} into {}: {} kernels, {} files, {} bytes, targets: {}{}",
        args.dir.display(),
        c.target,
        c.cache.entries().len(),
        c.tree.files,
        c.tree.bytes,
        crate::build::targets_and_cpu(&c.cache),
        c.gpu
            .as_deref()
            .map(|g| format!(", compiled on {g}"))
            .unwrap_or_default(),
    );
    if let Some(delta) = &c.delta {
        eprintln!(
            "a delta of {}: its {} layer(s), then one layer of {} new files ({} bytes)",
            delta.base,
            delta.base_layers,
            delta.files.len(),
            c.tree.bytes
        );
    }
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
        FailureReason::UnsafeTree
        | FailureReason::NotVerified
        | FailureReason::DeltaChangesBase => {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_to_fit_a_termination_message() {
        let outcome = Outcome {
            captured: false,
            image: None,
            digest: None,
            reason: Some(FailureReason::UnsafeTree),
            message: Some("é".repeat(5000)),
            base: Some("r/base@sha256:01".into()),
        };
        let json = outcome.to_bounded_json();
        assert!(json.len() <= TERMINATION_MESSAGE_MAX, "{}", json.len());
        let doc: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(doc["reason"], "UnsafeTree");
        assert_eq!(doc["base"], "r/base@sha256:01", "a delta names its base");
        assert!(doc["message"].as_str().is_some_and(|m| m.ends_with('…')));
        let short = Outcome {
            message: Some("short".into()),
            ..outcome
        };
        assert!(short.to_bounded_json().contains("\"message\":\"short\""));
    }
}
