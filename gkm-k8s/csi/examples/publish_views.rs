//! How long a publish takes: the writable (copy-on-write) view against the
//! read-only view, on Triton-like trees of 1k and 20k files (kernel
//! directories of seven files each, as `hack/bench/synthetic_cache.py`
//! makes them). Calls the driver's publish in-process, without a kubelet,
//! so it runs as root (it mounts):
//!
//! ```text
//! cargo run --release -p gkm-k8s-csi --example publish_views
//! ```
//!
//! Prints, per tree, the median of 20 publishes of each view and its ratio
//! to the read-only view's. Each publish is undone before the next.

#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gkm_core::CacheKey;
use gkm_core::Digest;
use gkm_k8s_csi::{CacheVolume, Driver, DriverConfig, NodeService, View, Volume};
use gkm_k8s_node::delivery::{Delivery, DeliveryIndex};
use gkm_k8s_node::mount_records::PodRef;

const RUNS: usize = 20;
const FILES_PER_KERNEL: usize = 7;

/// A sealed store entry of `files` files, deliverable as `ml/bench`.
fn store_with_tree(root: &Path, files: usize) -> std::io::Result<Digest> {
    let digest = Digest::of(format!("bench-{files}").as_bytes());
    let entry = root.join("sha256").join(digest.hex());
    let tree = entry.join("io.triton.cache");
    for k in 0..files.div_ceil(FILES_PER_KERNEL) {
        let dir = tree.join(format!("KERNEL{k:048}"));
        std::fs::create_dir_all(&dir)?;
        for f in 0..FILES_PER_KERNEL {
            std::fs::write(dir.join(format!("kernel_{k}.{f}")), vec![b'k'; 4096])?;
        }
    }
    gkm_oci::seal::seal(&entry)?;
    DeliveryIndex::new(root)
        .publish(
            &CacheKey::namespaced("ml", "bench"),
            &Delivery::deliverable(digest.clone()),
        )
        .map_err(std::io::Error::other)?;
    Ok(digest)
}

fn request(target: &Path, n: usize, view: View) -> Volume {
    Volume::Cache(CacheVolume {
        volume_id: format!("csi-bench-{n}"),
        target_path: target.to_path_buf(),
        cache: CacheKey::namespaced("ml", "bench"),
        pod: PodRef {
            namespace: "ml".into(),
            name: "bench".into(),
            uid: None,
        },
        view,
        mount_path: None,
        capture: None,
    })
}

/// The median time of [`RUNS`] publishes of `view`.
fn median_publish(node: &NodeService, work: &Path, view: View) -> Result<Duration, String> {
    let mut times = Vec::with_capacity(RUNS);
    for n in 0..RUNS {
        let target: PathBuf = work.join(format!("pods/p{n}/mount"));
        let req = request(&target, n, view);
        let start = Instant::now();
        node.publish(&req).map_err(|s| s.message().to_string())?;
        times.push(start.elapsed());
        node.unpublish(req.volume_id(), &target)
            .map_err(|s| s.message().to_string())?;
    }
    times.sort();
    Ok(times[RUNS / 2])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let views = [
        ("read-only", View::ReadOnly),
        (
            "writable",
            View::Writable {
                group: None,
                max_bytes: 1 << 30,
            },
        ),
        (
            "writable, fsGroup",
            View::Writable {
                group: Some(1000),
                max_bytes: 1 << 30,
            },
        ),
    ];
    println!("median of {RUNS} publishes; ratio to the read-only view");
    for files in [1_000, 20_000] {
        let work = tempfile::tempdir()?;
        let store = work.path().join("store");
        store_with_tree(&store, files)?;
        let driver = Driver::new(&DriverConfig {
            node_name: "bench".into(),
            store_root: store.clone(),
            capture: Default::default(),
            views: Default::default(),
        })?;
        let mut baseline = None;
        for (name, view) in views {
            let median = median_publish(&driver.node, work.path(), view)?;
            let base = *baseline.get_or_insert(median);
            println!(
                "{files:>6} files  {name:<18} {:>9.2} ms  x{:.2}",
                median.as_secs_f64() * 1e3,
                median.as_secs_f64() / base.as_secs_f64()
            );
        }
    }
    Ok(())
}
