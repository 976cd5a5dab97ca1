//! What the agent's tests share: a Node with its agent, publishing what
//! the operator would, fixture images.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gkm_k8s_api::crd::{CacheRelease, GKMCache, GKMCacheNode, GKMCacheRelease, ImageVariant};
use gkm_oci::{BuildOptions, Compression, Digest, Image, ImageRef, RegistryOptions, Repo, build};
use gkm_testenv::{ControlPlane, Process};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// The label naming a test's Node, which its caches select.
const NODE_LABEL: &str = "gkm.test/node";

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    gkm_testenv::repo_root().join("deploy")
}

/// The namespace gkm's components run in, as `deploy/` installs them.
pub const SYSTEM: &str = "gkm-system";

/// The shared control plane with gkm's CRDs, its namespace and the agent's
/// RBAC as `deploy/` ships them, and a kubeconfig of the agent's
/// ServiceAccount.
pub async fn agent_plane() -> anyhow::Result<(&'static ControlPlane, PathBuf)> {
    let plane = ControlPlane::shared().await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    for file in ["namespace.yaml", "rbac/agent.yaml"] {
        plane.apply_file(&deploy_dir().join(file)).await?;
    }
    let kubeconfig = plane.kubeconfig_for_service_account(SYSTEM, "gkm-agent")?;
    Ok((plane, kubeconfig))
}

/// The variants of `digest` of `image` (a registry or an OCI layout), read
/// as the operator reads them (the manifest, the config only when the
/// manifest lacks the cache labels).
pub async fn variants_of(
    image: &ImageRef,
    digest: &Digest,
    registry: &RegistryOptions,
) -> anyhow::Result<Vec<ImageVariant>> {
    let repo = Repo::open(&image.with_digest(digest), registry)?;
    let read = Image::fetch_annotated(&repo).await?;
    let cache = read.cache()?;
    Ok(vec![
        ImageVariant::new(&read.digest, &cache.summary).with_cpu_isa(cache.declared_cpu_isa),
    ])
}

/// Publishes what the operator would for the GKMCache `name` in
/// `namespace` (no operator runs in these tests): its release, naming
/// `image` resolved to `digest`, deliverable with `variants`, or refused
/// for `refusal`.
pub async fn publish_release(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    image: &str,
    digest: &str,
    verdict: Result<Vec<ImageVariant>, &str>,
) -> anyhow::Result<()> {
    publish_release_for(client, namespace, name, image, digest, verdict, None).await
}

/// [`publish_release`] for the nodes `node_selector` selects only.
async fn publish_release_for(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    image: &str,
    digest: &str,
    verdict: Result<Vec<ImageVariant>, &str>,
    node_selector: Option<LabelSelector>,
) -> anyhow::Result<()> {
    let (deliverable, refusal, variants) = match verdict {
        Ok(variants) => (true, None, Some(variants)),
        Err(why) => (false, Some(why.to_string()), None),
    };
    let mut release = GKMCacheRelease::new(
        name,
        gkm_k8s_api::crd::GKMCacheReleaseSpec {
            release: CacheRelease {
                image: image.to_string(),
                digest: Some(digest.to_string()),
                deliverable,
                refusal,
                variants,
                node_selector,
                ..CacheRelease::default()
            },
        },
    );
    release.metadata.namespace = Some(namespace.to_string());
    Api::<GKMCacheRelease>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::apply("gkm-operator").force(),
            &Patch::Apply(&release),
        )
        .await?;
    Ok(())
}

/// A test's node, store and GPUs.
pub struct Node {
    /// The shared control plane.
    pub plane: &'static ControlPlane,
    /// An administrator's client.
    pub client: kube::Client,
    /// Its directory: store, GPUs file, logs.
    pub dir: tempfile::TempDir,
    /// The Node's name.
    pub name: String,
}

impl Node {
    /// A Node named `name` with one simulated T4.
    pub async fn new(name: &str) -> anyhow::Result<Node> {
        let plane = ControlPlane::shared().await?;
        plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
        plane.ensure_node(name).await?;
        // Labelled so that the caches of this node's test select it alone:
        // tests sharing the control plane do not fill each other's stores.
        let labelled: k8s_openapi::api::core::v1::Node = serde_json::from_value(
            json!({"metadata": {"name": name, "labels": {NODE_LABEL: name}}}),
        )?;
        Api::<k8s_openapi::api::core::v1::Node>::all(plane.client().await?)
            .patch(
                name,
                &PatchParams::apply("gkm-agent-test"),
                &Patch::Apply(&labelled),
            )
            .await?;
        let dir = gkm_testenv::temp_dir()?;
        std::fs::write(dir.path().join("gpus.yaml"), "gpus:\n  - profile: T4\n")?;
        Ok(Node {
            plane,
            client: plane.client().await?,
            dir,
            name: name.into(),
        })
    }

    /// Its store.
    pub fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// The agent for this node, serving `/metrics` on `port`, with `extra`
    /// flags.
    pub fn agent(&self, port: u16, extra: &[&str]) -> anyhow::Result<Process> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-agent"));
        cmd.arg(format!(
            "--kubeconfig={}",
            self.plane.kubeconfig().display()
        ))
        .arg(format!("--node-name={}", self.name))
        .arg(format!("--store={}", self.store().display()))
        .arg(gkm_testenv::AGENT_KEEP_FREE_ARG)
        .arg(format!(
            "--simulate={}",
            self.dir.path().join("gpus.yaml").display()
        ))
        .arg(format!("--metrics-addr=127.0.0.1:{port}"))
        .arg("--insecure-registry")
        .arg("--resync=1s")
        .arg("--start-jitter=0s")
        .args(extra)
        .env("GKM_LOG", "info");
        Process::spawn(
            &format!("agent-{}", self.name),
            cmd,
            &self.dir.path().join(format!("agent-{}.log", self.name)),
        )
    }

    /// A cache of `image` in `namespace` whose release says what the
    /// operator would: `digest`, verified (deliverable, with the image's
    /// variants read from its registry) or not.
    pub async fn cache(
        &self,
        namespace: &str,
        name: &str,
        image: &str,
        digest: &str,
        verified: bool,
    ) -> anyhow::Result<()> {
        let verdict = if verified {
            let reference: ImageRef = image.parse()?;
            Ok(variants_of(&reference, &digest.parse()?, &registry_options()).await?)
        } else {
            Err("no signature")
        };
        self.cache_with(namespace, name, image, digest, verdict)
            .await
    }

    /// A cache of `image` in `namespace` whose release names `digest` with
    /// `verdict`: deliverable with those variants, or refused for that
    /// reason.
    pub async fn cache_with(
        &self,
        namespace: &str,
        name: &str,
        image: &str,
        digest: &str,
        verdict: Result<Vec<ImageVariant>, &str>,
    ) -> anyhow::Result<()> {
        let api: Api<GKMCache> = Api::namespaced(self.client.clone(), namespace);
        let object: GKMCache = serde_json::from_value(json!({
            "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"image": image},
        }))?;
        let apply = PatchParams::apply("gkm-test").force();
        api.patch(name, &apply, &Patch::Apply(&object)).await?;
        let selector = LabelSelector {
            match_labels: Some([(NODE_LABEL.to_string(), self.name.clone())].into()),
            ..LabelSelector::default()
        };
        publish_release_for(
            &self.client,
            namespace,
            name,
            image,
            digest,
            verdict,
            Some(selector),
        )
        .await
    }

    /// Waits, while `agent` runs, at most `limit` for this node's report to
    /// say `cache` of `namespace` at `digest` is `Extracted`.
    pub async fn until_extracted(
        &self,
        agent: &mut Process,
        namespace: &str,
        cache: &str,
        digest: &str,
        limit: Duration,
    ) -> anyhow::Result<()> {
        until(
            agent,
            &format!("{namespace}/{cache} extracted"),
            limit,
            || async {
                Ok(self.state(namespace, cache, digest).await?.as_deref() == Some("Extracted"))
            },
        )
        .await
    }

    /// This node's report entry in `namespace` for `cache` at `digest`: its
    /// state.
    pub async fn state(
        &self,
        namespace: &str,
        cache: &str,
        digest: &str,
    ) -> anyhow::Result<Option<String>> {
        let api: Api<GKMCacheNode> = Api::namespaced(self.client.clone(), namespace);
        let Some(report) = api.get_opt(&self.name).await? else {
            return Ok(None);
        };
        Ok(report
            .status
            .and_then(|s| s.caches)
            .and_then(|c| c.get(cache).cloned())
            .and_then(|e| e.get(digest).cloned())
            .and_then(|e| e.state)
            .map(|s| format!("{s:?}")))
    }
}

/// Waits ([`gkm_testenv::eventually`]) until `probe` holds, failing after
/// `limit` or when `agent` exits, with the agent's log.
pub async fn until<F, Fut>(
    agent: &mut Process,
    what: &str,
    limit: Duration,
    mut probe: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    until_some(agent, what, limit, || {
        let holds = probe();
        async move { Ok(holds.await?.then_some(())) }
    })
    .await
}

/// Waits ([`gkm_testenv::eventually`]) until `probe` finds something, and
/// returns it; fails after `limit` or when `agent` exits, with the agent's
/// log.
pub async fn until_some<T, F, Fut>(
    agent: &mut Process,
    what: &str,
    limit: Duration,
    mut probe: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let waited = gkm_testenv::eventually(what, limit, || {
        let running = agent.check_running();
        let found = probe();
        async move {
            running?;
            found.await
        }
    })
    .await;
    waited.map_err(|e| e.context(format!("{what}; log:\n{}", agent.log_tail(40))))
}

/// The tests' registries serve plain HTTP.
pub fn registry_options() -> RegistryOptions {
    RegistryOptions {
        insecure: true,
        ..RegistryOptions::default()
    }
}

/// The fixture cache `name`, a directory of `shared/fixtures/caches`.
pub fn fixture(name: &str) -> PathBuf {
    gkm_testenv::fixture_cache(name)
}

/// Builds `tree` (uncompressed) into an OCI layout at `layout`; returns the
/// layout's reference and the image digest.
pub async fn build_layout(tree: &Path, layout: &Path) -> anyhow::Result<(ImageRef, Digest)> {
    let layout: ImageRef = format!("oci:{}:v1", layout.display()).parse()?;
    let options = BuildOptions {
        compression: Compression::None,
        ..BuildOptions::default()
    };
    let built = build(tree, &layout, &options, &registry_options()).await?;
    Ok((layout, built.digest))
}

/// Copies the image in `layout` to `remote`.
pub async fn push(layout: &ImageRef, remote: &str) -> anyhow::Result<()> {
    let remote: ImageRef = remote.parse()?;
    gkm_oci::copy_image(
        &Repo::open(layout, &registry_options())?,
        &Repo::create(&remote, &registry_options())?,
        None,
    )
    .await?;
    Ok(())
}

/// Builds the fixture cache `name` into an OCI layout at `layout` and
/// pushes it to `remote`; returns the layout's reference and the digest.
pub async fn push_fixture(
    name: &str,
    layout: &Path,
    remote: &str,
) -> anyhow::Result<(ImageRef, Digest)> {
    let (layout, digest) = build_layout(&fixture(name), layout).await?;
    push(&layout, remote).await?;
    Ok((layout, digest))
}
