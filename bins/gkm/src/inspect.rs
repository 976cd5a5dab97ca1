//! `gkm inspect`.

use std::process::ExitCode;

use gkm_oci::{Image, ImageRef, Repo};

use crate::image_args::{RegistryArgs, finish, multi_target, parse_ref};

/// Arguments of `gkm inspect`.
#[derive(clap::Args)]
#[command(after_help = crate::image_args::EXIT_CODES_HELP)]
pub struct Args {
    /// The image: `REGISTRY/REPO[:TAG|@DIGEST]` or `oci:PATH[:TAG]`.
    #[arg(value_parser = parse_ref)]
    image: ImageRef,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) registry: RegistryArgs,
}

/// Runs `gkm inspect`.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let options = args.registry.options()?;
    let repo = Repo::open(&args.image, &options)?;
    let image = match Image::fetch(&repo).await {
        Ok(i) => i,
        Err(gkm_oci::Error::MultiTarget { .. }) => {
            return match multi_target(&repo, &options).await {
                Ok(multi) => print_variants(&args, &multi),
                Err(e) => finish(e),
            };
        }
        Err(e) => return finish(e),
    };
    let cache = image.cache()?;
    let labels = if image.labels.is_empty() {
        &image.manifest.annotations
    } else {
        &image.labels
    };
    let fit = cache.kind.fit_of_labels(cache.summary.clone(), labels);
    if args.json {
        let mut doc = serde_json::json!({
            "reference": args.image.to_string(),
            "digest": image.digest,
            "indexDigest": image.index_digest,
            "mediaType": image.raw.media_type,
            "kind": cache.kind,
            "title": cache.title,
            "entryCount": cache.entry_count,
            "cacheSizeBytes": cache.cache_size_bytes,
            "format": cache.format,
            "buildPath": cache.build_path,
            "targets": cache.summary.targets.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "summary": cache.summary,
            "layers": image.manifest.layers,
            "labels": image.labels,
            "annotations": image.manifest.annotations,
        });
        if cache.kind.is_torch()
            && let Some(fields) = doc.as_object_mut()
        {
            fields.insert(
                "tritonVersion".into(),
                serde_json::json!(cache.triton_version),
            );
            fields.insert(
                "declaredTorchVersion".into(),
                serde_json::json!(cache.declared_torch_version),
            );
            fields.insert(
                "declaredCpuIsa".into(),
                serde_json::json!(cache.declared_cpu_isa),
            );
            fields.insert("entryCounts".into(), serde_json::json!(cache.entry_counts));
        }
        if let Some(cpu) = &fit.cpu
            && let Some(fields) = doc.as_object_mut()
        {
            fields.insert(
                "cpu".into(),
                serde_json::json!({
                    "cppKernels": cpu.kernels,
                    "isa": cpu.isa,
                    "isaDeclared": cpu.declared,
                }),
            );
        }
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |n| n.to_string());
    println!("Reference:   {}", args.image);
    println!("Digest:      {}", image.digest);
    if let Some(index) = &image.index_digest {
        println!("Index:       {index}");
    }
    println!("Media type:  {}", image.raw.media_type);
    println!(
        "Kind:        {}",
        serde_json::to_value(cache.kind)?.as_str().unwrap_or("-")
    );
    println!("Title:       {}", cache.title.as_deref().unwrap_or("-"));
    if let Some(format) = &cache.format {
        println!("Format:      {format}");
    }
    if let Some(path) = &cache.build_path {
        println!("Built at:    {path}");
    }
    if let Some(version) = &cache.declared_torch_version {
        println!("Torch:       {version} (declared)");
    }
    if let Some(version) = &cache.triton_version {
        println!("Triton:      {version}");
    }
    println!("Entries:     {}", opt(cache.entry_count));
    if let Some(cpu) = &fit.cpu {
        if let Some(n) = cpu.kernels {
            println!("C++ kernels: {n}");
        }
        if let Some(isa) = &cpu.isa {
            println!("CPU ISA:     {isa} ({})", cpu.provenance());
        }
    }
    if let Some(counts) = &cache.entry_counts {
        let parts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("Parts:       {}", parts.join(", "));
    }
    println!("Cache size:  {} bytes", opt(cache.cache_size_bytes));
    if cache.summary.targets.is_empty() {
        println!("Targets:     none (no GPU kernel)");
    } else {
        println!("Targets:     {}", cache.summary);
    }
    let mut text = String::from("\n");
    gkm_gpu::report::table(
        &mut text,
        &["LAYER", "MEDIA TYPE", "SIZE"],
        &image
            .manifest
            .layers
            .iter()
            .map(|l| {
                vec![
                    l.digest.to_string(),
                    l.media_type.clone(),
                    l.size.to_string(),
                ]
            })
            .collect::<Vec<_>>(),
    );
    let twins: Vec<Vec<String>> = image
        .manifest
        .layers
        .iter()
        .enumerate()
        .filter_map(|(n, l)| l.erofs.as_ref().map(|t| (n, t)))
        .map(|(n, t)| {
            vec![
                t.digest.to_string(),
                // The layer's row in the table above, counted from 1.
                (n + 1).to_string(),
                t.compression.to_string(),
                t.size.to_string(),
            ]
        })
        .collect();
    if !twins.is_empty() {
        text.push('\n');
        gkm_gpu::report::table(
            &mut text,
            &["EROFS LAYER", "OF LAYER", "COMPRESSION", "SIZE"],
            &twins,
        );
    }
    text.push('\n');
    gkm_gpu::report::table(
        &mut text,
        &["LABEL", "VALUE"],
        &image
            .labels
            .iter()
            .map(|(k, v)| vec![k.clone(), v.clone()])
            .collect::<Vec<_>>(),
    );
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// Prints a multi-target image: its index and one row per variant.
fn print_variants(args: &Args, multi: &gkm_oci::MultiTarget) -> anyhow::Result<ExitCode> {
    if args.json {
        let doc = serde_json::json!({
            "reference": args.image.to_string(),
            "digest": multi.digest(),
            "mediaType": multi.raw.media_type,
            "variants": multi.variants.iter().map(|v| serde_json::json!({
                "digest": v.digest,
                "mediaType": v.media_type,
                "kind": v.cache.as_ref().map(|c| c.kind),
                "entryCount": v.cache.as_ref().and_then(|c| c.entry_count),
                "cacheSizeBytes": v.cache.as_ref().and_then(|c| c.cache_size_bytes),
                "targets": v.summary().targets.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "summary": v.summary(),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |n| n.to_string());
    println!("Reference:   {}", args.image);
    println!("Index:       {}", multi.digest());
    println!("Media type:  {}", multi.raw.media_type);
    println!("Variants:    {}", multi.variants.len());
    let mut text = String::from("\n");
    gkm_gpu::report::table(
        &mut text,
        &["#", "VARIANT", "TARGETS", "ENTRIES", "CACHE SIZE"],
        &multi
            .variants
            .iter()
            .enumerate()
            .map(|(n, v)| {
                let cache = v.cache.as_ref();
                vec![
                    n.to_string(),
                    v.digest.to_string(),
                    v.summary().to_string(),
                    opt(cache.and_then(|c| c.entry_count)),
                    opt(cache.and_then(|c| c.cache_size_bytes)),
                ]
            })
            .collect::<Vec<_>>(),
    );
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}
