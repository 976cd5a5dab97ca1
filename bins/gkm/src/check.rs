//! `gkm check`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use gkm_core::cache::{CpuFit, Fit, Summary};
use gkm_core::compat::{CheckOptions, check_summary, cpu_fit_mismatch, host_cpu_isa};
use gkm_core::variant::VariantChoice;
use gkm_gpu::DiscoveryOptions;
use gkm_oci::{Image, ImageRef, Repo};

use crate::image_args::{EXIT_INCOMPATIBLE, RegistryArgs, finish, multi_target};

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
    /// The node's CPU ISA as Inductor picks it (`avx2`, `avx512`…), for
    /// caches of C++ kernels only (default: read from /proc/cpuinfo).
    #[arg(long, value_name = "ISA")]
    cpu_isa: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) registry: RegistryArgs,
}

/// What `gkm check` checks: the fit facts of a cache, or the variants of
/// a multi-target image.
enum Checked {
    Fit(Fit),
    Variants(gkm_oci::MultiTarget),
}

/// Runs `gkm check`: exit 0 when at least one GPU fits (a multi-target
/// image: when the node gets a variant), 3 when none does.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let checked = if !args.target.starts_with(gkm_oci::reference::LAYOUT_PREFIX)
        && std::path::Path::new(&args.target).is_dir()
    {
        let dir = PathBuf::from(&args.target);
        let manifest = tokio::task::spawn_blocking(move || gkm_core::cache::scan(&dir)).await??;
        Checked::Fit(manifest.fit())
    } else {
        let image: ImageRef = args.target.parse()?;
        let registry = args.registry.options()?;
        let repo = Repo::open(&image, &registry)?;
        match Image::fetch(&repo).await {
            Ok(image) => {
                let cache = image.cache()?;
                let labels = if image.labels.is_empty() {
                    &image.manifest.annotations
                } else {
                    &image.labels
                };
                Checked::Fit(cache.kind.fit_of_labels(cache.summary, labels))
            }
            Err(gkm_oci::Error::MultiTarget { .. }) => match multi_target(&repo, &registry).await {
                Ok(multi) => Checked::Variants(multi),
                Err(e) => return finish(e),
            },
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
    let options = CheckOptions {
        triton_version: args.triton_version,
        ..Default::default()
    };
    let compatible = match checked {
        Checked::Fit(fit) if fit.judged_by_cpu().is_some() => {
            let cpu = fit.judged_by_cpu().cloned().unwrap_or_default();
            check_cpu(&cpu, args.cpu_isa.as_deref(), args.json)?
        }
        Checked::Fit(fit) => {
            let report = check_summary(
                &Summary::new(fit.targets.targets),
                &inventory.gpus,
                &options,
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
            report.compatible
        }
        Checked::Variants(multi) => {
            let choice = multi.choose(&inventory.gpus, &options);
            print_choice(&multi, &inventory.gpus, &choice, args.json)?;
            choice.chosen.is_some()
        }
    };
    Ok(if compatible {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INCOMPATIBLE)
    })
}

/// Checks a cache of C++ kernels only against this node's CPU (or the ISA
/// given): prints the verdict, returns whether it fits.
fn check_cpu(cpu: &CpuFit, node: Option<&str>, json: bool) -> anyhow::Result<bool> {
    let node = match node {
        Some(isa) => Some(isa.to_string()),
        None => host_cpu_isa(),
    };
    let reason = cpu_fit_mismatch(cpu, node.as_deref());
    let built = if cpu.declared {
        "declared built for"
    } else {
        "built for"
    };
    if json {
        let mut doc = serde_json::json!({
            "compatible": reason.is_none(),
            "cpuIsa": node,
            "cppKernels": cpu.kernels,
            "reason": reason,
        });
        let key = if cpu.declared {
            "declaredCpuIsa"
        } else {
            "kernelCpuIsa"
        };
        doc[key] = serde_json::json!(cpu.isa);
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        let node = node.as_deref().unwrap_or("unknown");
        let kernels = cpu
            .kernels
            .map_or_else(|| "C++ kernels".to_string(), |n| format!("{n} C++ kernels"));
        match &reason {
            None => println!("CPU {node}: compatible ({kernels} {built} {node})"),
            Some(reason) => println!("CPU {node}: incompatible\n  {reason}"),
        }
        println!(
            "{}",
            if reason.is_none() {
                "compatible"
            } else {
                "incompatible"
            }
        );
    }
    Ok(reason.is_none())
}

/// Prints which variant each GPU gets and why, then the node's choice.
fn print_choice(
    multi: &gkm_oci::MultiTarget,
    gpus: &[gkm_core::Gpu],
    choice: &VariantChoice,
    json: bool,
) -> anyhow::Result<()> {
    let digest = |v: Option<usize>| v.map(|v| multi.variants[v].digest.to_string());
    if json {
        let doc = serde_json::json!({
            "index": multi.digest(),
            "chosen": choice.chosen,
            "chosenDigest": digest(choice.chosen),
            "reason": choice.to_string(),
            "gpus": (0..gpus.len()).map(|g| serde_json::json!({
                "index": gpus[g].index,
                "variant": choice.gpu_variant(g),
                "variantDigest": digest(choice.gpu_variant(g)),
            })).collect::<Vec<_>>(),
            "variants": multi.variants.iter().zip(&choice.reports).map(|(v, report)| serde_json::json!({
                "digest": v.digest,
                "targets": v.summary().targets.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "report": report,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let Some(first) = choice.reports.first() else {
        println!("incompatible: {choice}");
        return Ok(());
    };
    for (g, gpu) in first.gpus.iter().enumerate() {
        match choice.gpu_variant(g) {
            Some(v) => {
                let matching = &choice.reports[v].gpus[g].matching_targets;
                let targets: Vec<String> = matching.iter().map(ToString::to_string).collect();
                println!(
                    "GPU {}: variant {v} {} (matches {})",
                    gpu.description,
                    multi.variants[v].digest,
                    targets.join(", ")
                );
            }
            None => {
                println!("GPU {}: no variant", gpu.description);
                for (v, report) in choice.reports.iter().enumerate() {
                    for reason in report.gpus[g].all_reasons() {
                        println!("  variant {v} ({}): {reason}", multi.variants[v].summary());
                    }
                }
            }
        }
    }
    match choice.chosen {
        Some(v) => println!(
            "node gets variant {v} {}: {choice}",
            multi.variants[v].digest
        ),
        None => println!("incompatible: {choice}"),
    }
    Ok(())
}
