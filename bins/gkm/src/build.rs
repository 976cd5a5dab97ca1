//! `gkm build`.

use std::path::PathBuf;
use std::process::ExitCode;

use gkm_oci::build::build_multi;
use gkm_oci::erofs::write::ErofsWriter;
use gkm_oci::{BuildOptions, Compression, ImageRef, build_with_progress};

use crate::image_args::{DeclaredArgs, RegistryArgs, finish, parse_ref};
use crate::output;
use crate::progress::{Bar, hook};

/// Layer compression: gzip (read by MCV and GKM's extractor) or zstd
/// (smaller; read by gkm). The variants carry no doc comments, which would
/// turn `--help` into its long form.
#[derive(Clone, Copy, clap::ValueEnum)]
#[allow(missing_docs)]
pub enum CompressionArg {
    Zstd,
    Gzip,
}

impl From<CompressionArg> for Compression {
    fn from(arg: CompressionArg) -> Compression {
        match arg {
            CompressionArg::Zstd => Compression::Zstd,
            CompressionArg::Gzip => Compression::Gzip,
        }
    }
}

/// Arguments of `gkm build`.
#[derive(clap::Args)]
#[command(after_help = crate::image_args::EXIT_CODES_HELP)]
pub struct Args {
    /// The cache directory (a Triton cache, a vLLM torch_compile_cache, an
    /// Inductor cache) or Mega-Cache blob; several make a multi-target
    /// image, one variant each, in this order.
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// Where to write the image: `REGISTRY/REPO[:TAG]` or `oci:PATH[:TAG]`.
    #[arg(short = 't', long = "tag", value_name = "REF", value_parser = parse_ref)]
    tag: ImageRef,
    /// Layer compression: gzip (read by MCV and GKM's extractor) or zstd
    /// (smaller; read by gkm).
    #[arg(long, value_enum, default_value = "gzip")]
    compression: CompressionArg,
    /// Also write each layer as an EROFS image (lz4hc) that a node can mount
    /// instead of extracting: named in the layer's annotations, the tar
    /// layer staying the image's (needs erofs-utils' mkfs.erofs).
    #[arg(long)]
    erofs: bool,
    /// The `org.opencontainers.image.title` label (default: the
    /// repository's or layout directory's last path component).
    #[arg(long)]
    title: Option<String>,
    #[command(flatten)]
    declared: DeclaredArgs,
    /// Print the result as JSON (no progress display).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) registry: RegistryArgs,
}

/// Runs `gkm build`; prints the image digest.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let options = BuildOptions {
        compression: args.compression.into(),
        title: args.title,
        declared: args.declared.declared(),
        erofs: args.erofs.then(ErofsWriter::default),
    };
    let registry = args.registry.options()?;
    let bar = Bar::start("build", args.json);
    if let [_, _, ..] = args.dirs.as_slice() {
        let result = build_multi(&args.dirs, &args.tag, &options, &registry, hook(&bar)).await;
        drop(bar);
        return crate::index::report(result, &args.tag, args.json);
    }
    let result =
        build_with_progress(&args.dirs[0], &args.tag, &options, &registry, hook(&bar)).await;
    drop(bar);
    match result {
        Ok(built) if args.json => {
            output::print(&output::Built {
                reference: args.tag.to_string(),
                digest: built.digest.to_string(),
                entry_count: built.cache.entries().len(),
                cache_size_bytes: built.layer.cache_size_bytes,
                layer: output::Blob {
                    digest: built.layer.digest.to_string(),
                    size: built.layer.size,
                    media_type: built.layer.compression.media_type().to_string(),
                },
                erofs: built.erofs.as_ref().map(|t| output::ErofsBlob {
                    blob: output::Blob {
                        digest: t.digest.to_string(),
                        size: t.size,
                        media_type: gkm_oci::erofs::MEDIA_TYPE.to_string(),
                    },
                    compression: t.compression.to_string(),
                }),
                targets: built
                    .cache
                    .summary()
                    .targets
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Ok(built) => {
            eprintln!(
                "built {} ({} cache): {} kernels, {} bytes, targets: {}",
                args.tag,
                built.cache.kind().as_str(),
                built.cache.entries().len(),
                built.layer.cache_size_bytes,
                targets_and_cpu(&built.cache),
            );
            println!("{}", built.digest);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => finish(e),
    }
}

/// What a cache fits by, as `gkm build` and `gkm capture` print it: its GPU
/// targets (`none (no GPU kernel)`), then the C++ kernels it holds and their
/// CPU ISA, when it has any.
pub fn targets_and_cpu(cache: &gkm_core::cache::CacheManifest) -> String {
    let summary = cache.summary();
    let targets = if summary.targets.is_empty() {
        "none (no GPU kernel)".to_string()
    } else {
        summary.to_string()
    };
    let cpu = match cache.fit().cpu {
        Some(cpu) if cpu.kernels.is_some() || cpu.isa.is_some() => {
            let kernels = cpu
                .kernels
                .map_or_else(String::new, |n| format!("{n} C++ kernels, "));
            let isa = cpu.isa.as_deref().map_or_else(
                || "CPU ISA unknown".to_string(),
                |isa| format!("CPU ISA {isa} ({})", cpu.provenance()),
            );
            format!("; {kernels}{isa}")
        }
        _ => String::new(),
    };
    format!("{targets}{cpu}")
}
