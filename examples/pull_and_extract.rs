//! Pull a kernel cache image and extract it into a content-addressed store,
//! with gkm-core and gkm-oci only (no Kubernetes).
//!
//! ```text
//! cargo run -p gkm-examples --example pull_and_extract -- IMAGE STORE_DIR [--insecure]
//! ```
//!
//! IMAGE is `REGISTRY/REPO[:TAG|@DIGEST]` or `oci:PATH[:TAG]`. Prints the
//! image's targets and where its cache tree is. Running it twice does no
//! extraction the second time.

// An example may unwrap: a panic is how a short program reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gkm_oci::labels::KindLayout;
use gkm_oci::{ExtractPolicy, Image, ImageRef, RegistryOptions, Repo, Store};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(image), Some(store)) = (args.first(), args.get(1)) else {
        eprintln!("usage: pull_and_extract IMAGE STORE_DIR [--insecure]");
        std::process::exit(2);
    };
    let image: ImageRef = image.parse()?;
    let options = RegistryOptions {
        insecure: args.iter().any(|a| a == "--insecure"),
        ..Default::default()
    };
    let repo = Repo::open(&image, &options)?;

    // The summary is read first: a node checks it before pulling anything.
    let fetched = Image::fetch(&repo).await?;
    let cache = fetched.cache()?;
    println!("{} ({}): {}", image, fetched.digest, cache.summary);

    let store = Store::open(store)?;
    let stored = store
        .ensure_image(&repo, &fetched, &ExtractPolicy::default(), None)
        .await?;
    let tree = stored.path.join(KindLayout::of(cache.kind).cache_dir);
    match stored.extracted {
        Some(stats) => println!(
            "extracted {} files ({} bytes) to {}",
            stats.files,
            stats.bytes,
            tree.display()
        ),
        None => println!("already stored at {}", tree.display()),
    }
    Ok(())
}
