//! A tag moved to a digest the node cannot pull yet: the node keeps serving
//! the verified tree it held, however short the garbage-collection grace,
//! until the new digest is whole in its store; then it serves the new one
//! and lets the old go.

use std::path::Path;
use std::time::Duration;

use gkm_core::store_layout::StoreLayout;
use gkm_k8s_api::cache_object::CacheKey;
use gkm_k8s_node::delivery::DeliveryIndex;
use gkm_oci::Digest;
use gkm_testenv::{Registry, copy_tree};

mod support;

use support::{Node, build_layout, push, push_fixture, registry_options, until, variants_of};

/// Whether the store holds a tree of `digest`.
fn stored(store: &Path, digest: &Digest) -> bool {
    StoreLayout::new(store).path_of(digest).is_dir()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_serves_its_verified_tree_until_the_moved_tags_digest_is_whole() -> anyhow::Result<()>
{
    let node = Node::new("tag-moves-node").await?;
    let ns = "tag-moves";
    node.plane.ensure_namespace(ns).await?;
    let registry = Registry::shared()?;
    let image = format!("{}/moves/vector-add:v1", registry.addr());
    let dir = node.dir.path();
    let (old_layout, old) =
        push_fixture("triton-vector-add-cuda-sm75", &dir.join("old"), &image).await?;
    node.cache_with(
        ns,
        "moving",
        &image,
        old.as_str(),
        Ok(variants_of(&old_layout, &old, &registry_options()).await?),
    )
    .await?;
    let port = gkm_testenv::free_port()?;
    // No grace at all: an unreferenced tree goes at the next pass.
    let mut agent = node.agent(port, &["--gc-grace=0s"])?;
    node.until_extracted(
        &mut agent,
        ns,
        "moving",
        old.as_str(),
        Duration::from_secs(60),
    )
    .await?;

    // The tag moves to a new build the registry does not have yet (the
    // operator read it, then the registry failed).
    let tree = dir.join("new-tree");
    copy_tree(&support::fixture("triton-vector-add-cuda-sm75"), &tree)?;
    // Rebuilt: one kernel's Triton IR differs by a comment.
    let ttir = tree.join("5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ/add_kernel.ttir");
    let mut text = std::fs::read_to_string(&ttir)?;
    text.push_str("// rebuilt\n");
    std::fs::write(&ttir, text)?;
    let (new_layout, new) = build_layout(&tree, &dir.join("new")).await?;
    node.cache_with(
        ns,
        "moving",
        &image,
        new.as_str(),
        Ok(variants_of(&new_layout, &new, &registry_options()).await?),
    )
    .await?;
    until(
        &mut agent,
        "the new digest's pull reported failing",
        Duration::from_secs(60),
        || async { Ok(node.state(ns, "moving", new.as_str()).await?.as_deref() == Some("Error")) },
    )
    .await?;
    let index = DeliveryIndex::new(&node.store());
    let key = CacheKey::namespaced(ns, "moving");
    // Several passes (resync 1s) later, the old tree is still stored and
    // still what a new pod gets.
    tokio::time::sleep(Duration::from_secs(4)).await;
    agent.check_running()?;
    let delivery = index.get(&key)?;
    assert!(
        delivery
            .as_ref()
            .is_some_and(|d| d.is_deliverable() && d.digest == old),
        "the old verified tree is served meanwhile: {delivery:?}"
    );
    assert!(stored(&node.store(), &old), "the old tree is kept");
    assert_eq!(
        node.state(ns, "moving", old.as_str()).await?.as_deref(),
        Some("Outdated"),
        "the node's report names the tree it serves meanwhile"
    );

    // The registry has it now: the new tree is served, the old one goes.
    push(&new_layout, &image).await?;
    node.until_extracted(
        &mut agent,
        ns,
        "moving",
        new.as_str(),
        Duration::from_secs(60),
    )
    .await?;
    until(
        &mut agent,
        "the old tree removed once the new one is served",
        Duration::from_secs(30),
        || async {
            let served = index.get(&key)?.is_some_and(|d| d.digest == new);
            Ok(served && !stored(&node.store(), &old))
        },
    )
    .await?;
    agent.terminate(Duration::from_secs(15))?;
    Ok(())
}
