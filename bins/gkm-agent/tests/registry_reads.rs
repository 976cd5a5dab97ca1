//! What `gkm-agent` asks of a registry, counted in a real registry's access
//! log: deciding whether a cache fits the node's GPUs takes no request (the
//! operator publishes the image's targets in the cache's release), and
//! extracting a cache that fits reads its manifest and its layer, nothing
//! else: not its config, no `/v2/` ping (an anonymous registry), not again
//! at the next passes.

use std::time::Duration;

use gkm_oci::Manifest;
use gkm_testenv::Registry;

mod support;

use support::{Node, push_fixture, registry_options, until, variants_of};

#[tokio::test(flavor = "multi_thread")]
async fn fit_is_decided_without_the_registry_and_extraction_reads_manifest_and_layer()
-> anyhow::Result<()> {
    let node = Node::new("registry-reads-node").await?;
    let ns = "registry-reads";
    node.plane.ensure_namespace(ns).await?;
    let registry = Registry::start_logging_requests()?;
    let fits = format!("{}/reads/fits:v1", registry.addr());
    let misfit = format!("{}/reads/misfit:v1", registry.addr());
    let dir = node.dir.path();
    let (fits_layout, fits_digest) =
        push_fixture("triton-vector-add-cuda-sm75", &dir.join("fits"), &fits).await?;
    let (misfit_layout, misfit_digest) = push_fixture(
        "triton-vector-add-rocm-gfx90a",
        &dir.join("misfit"),
        &misfit,
    )
    .await?;
    // The operator's part, from the layouts: no request to the registry.
    let options = registry_options();
    let fits_variants = variants_of(&fits_layout, &fits_digest, &options).await?;
    let misfit_variants = variants_of(&misfit_layout, &misfit_digest, &options).await?;
    let layer = Manifest::parse(&std::fs::read(
        dir.join("fits/blobs/sha256").join(fits_digest.hex()),
    )?)?
    .layers[0]
        .digest
        .clone();

    let before = registry.requests()?.len();
    node.cache_with(ns, "fits", &fits, fits_digest.as_str(), Ok(fits_variants))
        .await?;
    node.cache_with(
        ns,
        "misfit",
        &misfit,
        misfit_digest.as_str(),
        Ok(misfit_variants),
    )
    .await?;
    let port = gkm_testenv::free_port()?;
    let mut agent = node.agent(port, &[])?;
    let state = |cache: &'static str, digest: String| {
        let node = &node;
        move || {
            let digest = digest.clone();
            async move { node.state(ns, cache, &digest).await }
        }
    };
    until(
        &mut agent,
        "the sm75 cache extracted on the T4 node",
        Duration::from_secs(60),
        || async {
            Ok(state("fits", fits_digest.to_string())().await?.as_deref() == Some("Extracted"))
        },
    )
    .await?;
    until(
        &mut agent,
        "the gfx90a cache found incompatible",
        Duration::from_secs(60),
        || async {
            Ok(state("misfit", misfit_digest.to_string())()
                .await?
                .as_deref()
                == Some("Incompatible"))
        },
    )
    .await?;
    // A few more passes (resync 1s): nothing is read again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    agent.check_running()?;

    let requests: Vec<String> = registry.requests()?.split_off(before);
    let misfit_requests: Vec<&String> = requests
        .iter()
        .filter(|r| r.contains("/reads/misfit/"))
        .collect();
    assert!(
        misfit_requests.is_empty(),
        "deciding the gfx90a cache does not fit read the registry: {misfit_requests:?}"
    );
    assert_eq!(
        requests,
        [
            format!("GET /v2/reads/fits/manifests/{fits_digest}"),
            format!("GET /v2/reads/fits/blobs/{layer}"),
        ],
        "the agent's requests"
    );
    agent.terminate(Duration::from_secs(15))?;
    Ok(())
}
