//! `gkm-operator fill`, the command of a PVC fill Job, reading through the
//! registry host file the operator hands it (GKM_REGISTRY_HOSTS), against
//! two real registries: the origin an image names and a mirror holding a
//! copy whose layer bytes were tampered with. The fill takes the config
//! from the mirror, refuses its layer by digest, takes the layer from the
//! origin, and serves the fixture's tree.

use std::process::Command;

use gkm_oci::{BuildOptions, Image, ImageRef, RegistryOptions, Repo, build, copy_image};
use gkm_testenv::{Registry, fixture_cache, tree_files};

const FIXTURE: &str = "triton-vector-add-cuda-sm75";

/// How many GETs of a path holding `needle` `registry` answered after its
/// first `since` requests.
#[allow(
    clippy::expect_used,
    reason = "a test's helper: a missing access log fails the test"
)]
fn gets(registry: &Registry, since: usize, needle: &str) -> usize {
    registry
        .gets_since(since, needle)
        .expect("access log")
        .len()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fill_reads_through_the_mirror_and_refuses_its_wrong_bytes() {
    let start = || {
        Registry::start_logging_requests()
            .expect("start docker-registry (apt-get install -y docker-registry)")
    };
    let (origin, mirror) = (start(), start());
    let plain = RegistryOptions {
        insecure: true,
        ..RegistryOptions::default()
    };
    let tagged: ImageRef = format!("{}/caches/fill:v1", origin.addr())
        .parse()
        .expect("ref");
    let built = build(
        &fixture_cache(FIXTURE),
        &tagged,
        &BuildOptions::default(),
        &plain,
    )
    .await
    .expect("build and push");
    let copy: ImageRef = format!("{}/caches/fill:v1", mirror.addr())
        .parse()
        .expect("ref");
    copy_image(
        &Repo::open(&tagged, &plain).expect("open"),
        &Repo::create(&copy, &plain).expect("create"),
        None,
    )
    .await
    .expect("copy to the mirror");
    let pinned = tagged.with_digest(&built.digest);
    let image = Image::fetch(&Repo::open(&pinned, &plain).expect("open"))
        .await
        .expect("fetch");
    let layer = image.cache_layer().expect("layer").digest.clone();
    let config = image.manifest.config.digest.clone();
    let data = mirror.blob_data_path(layer.as_str());
    let mut bytes = std::fs::read(&data).expect("stored layer");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&data, bytes).expect("tamper");
    let setup = (
        origin.answered().expect("log"),
        mirror.answered().expect("log"),
    );

    let work = tempfile::tempdir().expect("tempdir");
    let into = work.path().join("claim");
    let hosts = format!(
        "[host.\"http://{}\"]\n  capabilities = [\"pull\"]\n",
        mirror.addr()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_gkm-operator"))
        .args(["fill", "--insecure-registry", "--image"])
        .arg(pinned.to_string())
        .arg("--into")
        .arg(&into)
        .env("GKM_REGISTRY_HOSTS", &hosts)
        .output()
        .expect("run gkm-operator fill");
    assert!(
        out.status.success(),
        "fill failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        tree_files(&into.join(".gkm/current")).expect("the filled tree"),
        tree_files(&fixture_cache(FIXTURE)).expect("the fixture")
    );

    let blob = |d: &gkm_oci::Digest| format!("/blobs/{d}");
    assert_eq!(gets(&mirror, setup.1, &blob(&config)), 1);
    assert_eq!(
        gets(&origin, setup.0, &blob(&config)),
        0,
        "the mirror served the config"
    );
    assert_eq!(
        gets(&mirror, setup.1, &blob(&layer)),
        1,
        "the mirror was asked first"
    );
    assert_eq!(
        gets(&origin, setup.0, &blob(&layer)),
        1,
        "its layer was refused"
    );
}
