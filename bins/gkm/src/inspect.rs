//! `gkm inspect`.

use std::process::ExitCode;

use gkm_oci::{Image, ImageRef, Repo};

use crate::image_args::{RegistryArgs, finish, parse_ref};

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
    let repo = Repo::open(&args.image, &args.registry.options()?)?;
    let image = match Image::fetch(&repo).await {
        Ok(i) => i,
        Err(e) => return finish(e),
    };
    let cache = image.cache()?;
    if args.json {
        let doc = serde_json::json!({
            "reference": args.image.to_string(),
            "digest": image.digest,
            "indexDigest": image.index_digest,
            "mediaType": image.raw.media_type,
            "kind": cache.kind,
            "title": cache.title,
            "entryCount": cache.entry_count,
            "cacheSizeBytes": cache.cache_size_bytes,
            "format": cache.format,
            "targets": cache.summary.targets.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "summary": cache.summary,
            "layers": image.manifest.layers,
            "labels": image.labels,
            "annotations": image.manifest.annotations,
        });
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
    println!("Entries:     {}", opt(cache.entry_count));
    println!("Cache size:  {} bytes", opt(cache.cache_size_bytes));
    println!("Targets:     {}", cache.summary);
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
