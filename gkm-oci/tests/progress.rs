//! What a progress receiver hears from build, push, pull and extract, on a
//! real registry: the steps in order, and byte counts that end at the total.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::FIXTURES;
use gkm_oci::{
    BuildOptions, ExtractPolicy, Image, ImageRef, Progress, RegistryOptions, Repo, Report, Store,
    UnpackOptions, build_with_progress, copy_image, extract_to_dir,
};
use gkm_testenv::fixture_cache;

/// Every step with its total and the last byte count it reported.
#[derive(Default)]
struct Heard(Mutex<Vec<(String, Option<u64>, u64)>>);

impl Report for Heard {
    fn step(&self, name: &str, total: Option<u64>) {
        self.0
            .lock()
            .expect("lock")
            .push((name.to_string(), total, 0));
    }

    fn bytes(&self, done: u64) {
        let mut steps = self.0.lock().expect("lock");
        let last = steps.last_mut().expect("bytes before any step");
        assert!(done >= last.2, "bytes went back from {} to {done}", last.2);
        last.2 = done;
    }
}

impl Heard {
    /// Takes what was heard so far.
    fn take(&self) -> Vec<(String, Option<u64>, u64)> {
        std::mem::take(&mut self.0.lock().expect("lock"))
    }
}

#[tokio::test]
async fn steps_and_bytes_of_build_push_pull_and_extract() {
    let registry = gkm_testenv::Registry::shared().expect("registry");
    let work = tempfile::tempdir().expect("tempdir");
    let opts = RegistryOptions {
        insecure: true,
        ..Default::default()
    };
    let heard = Arc::new(Heard::default());
    let progress: Progress = heard.clone();
    let remote: ImageRef = format!("{}/progress/cache:v1", registry.addr())
        .parse()
        .expect("ref");

    let built = build_with_progress(
        &fixture_cache(FIXTURES[0]),
        &remote,
        &BuildOptions::default(),
        &opts,
        Some(progress.clone()),
    )
    .await
    .expect("build");
    let steps = heard.take();
    assert!(
        steps[0].0.starts_with("scanning and compressing "),
        "{steps:?}"
    );
    let (name, total, done) = &steps[1];
    assert!(name.starts_with("copying 2 blob(s) to "), "{steps:?}");
    assert!(*total > Some(built.layer.size), "{steps:?}");
    assert_eq!(Some(*done), *total, "the push ends at its total");

    // Pulled to a layout: the same bytes again.
    let pulled: ImageRef = format!("oci:{}/pulled:v1", work.path().display())
        .parse()
        .expect("ref");
    let src = Repo::open(&remote, &opts).expect("open");
    copy_image(
        &src,
        &Repo::create(&pulled, &opts).expect("create"),
        Some(progress.clone()),
    )
    .await
    .expect("pull");
    let steps = heard.take();
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(Some(steps[0].2), steps[0].1, "{steps:?}");

    // Extracted from the registry: the layer's bytes, then the flush.
    let image = Image::fetch(&src).await.expect("fetch");
    let options = UnpackOptions {
        progress: Some(progress.clone()),
        ..UnpackOptions::default()
    };
    extract_to_dir(&src, &image, &work.path().join("out"), &options)
        .await
        .expect("extract");
    let steps = heard.take();
    let names: Vec<&str> = steps.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "fetching and extracting the layer",
            "flushing the tree to disk"
        ]
    );
    assert_eq!(steps[0].1, Some(built.layer.size));
    assert_eq!(steps[0].2, built.layer.size);

    // Into a node store from the layout.
    let store = Store::open(work.path().join("store")).expect("store");
    let layout = Repo::open(&pulled, &opts).expect("open");
    store
        .ensure(&layout, &ExtractPolicy::default(), Some(progress))
        .await
        .expect("store");
    let steps = heard.take();
    assert_eq!(steps[0].0, "extracting the layer", "{steps:?}");
    assert_eq!(steps[0].2, built.layer.size);
    assert_eq!(steps[1].0, "storing the tree", "{steps:?}");
}
