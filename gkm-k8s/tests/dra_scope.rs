//! How far one namespace, or one node's DRA plugin, reaches through DRA,
//! against a real apiserver with the chart's DRA policies (dra.enabled)
//! applied as rendered: each test is named after what it defends.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gkm_testenv::{ControlPlane, eventually, service_account_groups, service_account_user};
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

const SYSTEM: &str = "gkm-system";

/// The chart's `templates` rendered with dra.enabled into `dir`.
fn render_chart(dir: &Path, templates: &[&str]) -> anyhow::Result<PathBuf> {
    let chart = gkm_testenv::repo_root().join("deploy/helm/gkm");
    let mut helm = Command::new(gkm_testenv::find_binary(gkm_testenv::Component::Helm)?);
    helm.args(["template", "gkm"]).arg(&chart).args([
        "--namespace",
        SYSTEM,
        "--set",
        "dra.enabled=true",
    ]);
    for template in templates {
        helm.args(["--show-only", &format!("templates/{template}")]);
    }
    let out = helm.output()?;
    anyhow::ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("dra.yaml");
    std::fs::write(&path, out.stdout)?;
    Ok(path)
}

/// The shared control plane with `templates` of the chart applied.
async fn install(templates: &[&str]) -> anyhow::Result<(&'static ControlPlane, kube::Client)> {
    let plane = ControlPlane::shared().await?;
    plane
        .apply_file(&gkm_testenv::repo_root().join("deploy/namespace.yaml"))
        .await?;
    let work = gkm_testenv::temp_dir()?;
    plane
        .apply_file(&render_chart(work.path(), templates)?)
        .await?;
    let admin = plane.client().await?;
    Ok((plane, admin))
}

/// `request` made as `user` in `groups` with `extra` (header suffix,
/// value), through the admin's impersonation; the answer or the refusal.
async fn as_user(
    admin: &kube::Client,
    user: &str,
    groups: &[String],
    extra: Option<(&str, &str)>,
    mut request: http::Request<Vec<u8>>,
) -> anyhow::Result<Result<Value, kube::core::Status>> {
    let headers = request.headers_mut();
    headers.insert("Impersonate-User", user.parse()?);
    for group in groups {
        headers.append("Impersonate-Group", group.parse()?);
    }
    if let Some((key, value)) = extra {
        headers.insert(
            http::HeaderName::from_bytes(format!("Impersonate-Extra-{key}").as_bytes())?,
            value.parse()?,
        );
    }
    match admin.request::<Value>(request).await {
        Ok(value) => Ok(Ok(value)),
        Err(kube::Error::Api(status)) => Ok(Err(*status)),
        Err(e) => Err(e.into()),
    }
}

fn create(path: &str, body: &Value) -> anyhow::Result<http::Request<Vec<u8>>> {
    Ok(kube::core::Request::new(path).create(&PostParams::default(), serde_json::to_vec(body)?)?)
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// A slice of `node` whose pool is named `pool`.
fn slice(name: &str, node: &str, pool: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": "gpu.gkm.io", "nodeName": node,
                 "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0000-6e-00-0"}]},
    })
}

#[tokio::test]
async fn the_dra_plugins_identity_cannot_publish_a_pool_named_after_another_node()
-> anyhow::Result<()> {
    let (plane, admin) =
        install(&["rbac/dra-plugin.yaml", "policies/dra-plugin-own-node.yaml"]).await?;
    let (own, other) = ("scope-own-node", "scope-other-node");
    for name in [own, other] {
        plane.ensure_node(name).await?;
    }
    let plugin = service_account_user(SYSTEM, "gkm-dra-plugin");
    let groups = service_account_groups(SYSTEM);
    let node_claim = Some(("authentication.kubernetes.io%2Fnode-name", own));
    let slices: kube::Api<k8s_openapi::api::resource::v1::ResourceSlice> =
        kube::Api::all(admin.clone());

    // A slice on its own node naming the other node's pool (so devices of
    // that pool, as claims' allocations name them, would be its). The
    // policy takes effect once the apiserver has loaded it.
    let wrote = RefCell::new(String::new());
    eventually(
        &format!("the plugin of {own} refused a slice of {other}'s pool"),
        Duration::from_secs(20),
        || async {
            let attempt = as_user(
                &admin,
                &plugin,
                &groups,
                node_claim,
                create(SLICES, &slice("scope-own-as-other", own, other))?,
            )
            .await?;
            match attempt {
                Err(status)
                    if status.code == 403 && status.message.contains("pool named after it") =>
                {
                    Ok(Some(()))
                }
                result => {
                    let _ = slices
                        .delete("scope-own-as-other", &DeleteParams::default())
                        .await;
                    *wrote.borrow_mut() = format!("{result:?}");
                    Ok(None)
                }
            }
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: it wrote one: {}", wrote.borrow()))?;

    // Its own node's pool, as the plugin writes it: written.
    as_user(
        &admin,
        &plugin,
        &groups,
        node_claim,
        create(SLICES, &slice("scope-own", own, own))?,
    )
    .await?
    .map_err(|s| anyhow::anyhow!("its own pool's slice was refused: {}", s.message))?;
    slices.delete("scope-own", &DeleteParams::default()).await?;
    Ok(())
}

const TEAM: &str = "dra-scope-team";

/// A claim of [`TEAM`] asking one device of `class`, or, with
/// `first_available`, one of `class` or else of gkm-gpu.
fn claim(name: &str, class: &str, first_available: bool) -> Value {
    let request = if first_available {
        json!({"name": "gpu", "firstAvailable": [
            {"name": "cached", "deviceClassName": class},
            {"name": "any", "deviceClassName": "gkm-gpu"},
        ]})
    } else {
        json!({"name": "gpu", "exactly": {"deviceClassName": class}})
    };
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {"devices": {"requests": [request]}},
    })
}

/// A claim template of [`TEAM`] asking one device of `class`.
fn template(name: &str, class: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": class}}]}}},
    })
}

fn claims_path() -> String {
    format!("/apis/resource.k8s.io/v1/namespaces/{TEAM}/resourceclaims")
}

fn templates_path() -> String {
    format!("/apis/resource.k8s.io/v1/namespaces/{TEAM}/resourceclaimtemplates")
}

fn refused_naming_another_namespace(what: &str, result: Result<Value, kube::core::Status>) {
    match result {
        Err(status)
            if status.code == 403
                && status
                    .message
                    .contains("names a DeviceClass of another namespace's cache") => {}
        other => panic!("{what}: expected the claim-classes policy's refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_namespace_cannot_name_another_namespaces_cache_device_class() -> anyhow::Result<()> {
    let (plane, admin) = install(&["policies/dra-claim-classes.yaml"]).await?;
    plane.ensure_namespace(TEAM).await?;
    let claims: kube::Api<k8s_openapi::api::resource::v1::ResourceClaim> =
        kube::Api::namespaced(admin.clone(), TEAM);

    // Another namespace's cache class: refused once the policy is loaded
    // (whoever asks: the policy judges the claim, not its author).
    let wrote = RefCell::new(String::new());
    eventually(
        "a claim naming another namespace's cache class refused",
        Duration::from_secs(20),
        || async {
            let attempt = admin
                .request::<Value>(create(
                    &claims_path(),
                    &claim("theirs", "gkm-cache.other-team.llama", false),
                )?)
                .await;
            match attempt {
                Err(kube::Error::Api(status))
                    if status.code == 403
                        && status.message.contains("another namespace's cache") =>
                {
                    Ok(Some(()))
                }
                result => {
                    let _ = claims.delete("theirs", &DeleteParams::default()).await;
                    *wrote.borrow_mut() = format!("{result:?}");
                    Ok(None)
                }
            }
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: it was written: {}", wrote.borrow()))?;

    let request = |r: anyhow::Result<http::Request<Vec<u8>>>| async {
        match admin.request::<Value>(r?).await {
            Ok(v) => Ok::<_, anyhow::Error>(Ok(v)),
            Err(kube::Error::Api(status)) => Ok(Err(*status)),
            Err(e) => Err(e.into()),
        }
    };
    // Refused: another namespace's class through firstAvailable, through a
    // template, and a class of a namespace whose name this one's begins.
    for (what, result) in [
        (
            "a firstAvailable subrequest naming another namespace's cache class",
            request(create(
                &claims_path(),
                &claim("theirs-first", "gkm-cache.other-team.llama", true),
            ))
            .await?,
        ),
        (
            "a claim template naming another namespace's cache class",
            request(create(
                &templates_path(),
                &template("theirs", "gkm-cache.other-team.llama"),
            ))
            .await?,
        ),
        (
            "the class of a namespace whose name begins with this one's",
            request(create(
                &claims_path(),
                &claim("prefix", &format!("gkm-cache.{TEAM}-x.llama"), false),
            ))
            .await?,
        ),
    ] {
        refused_naming_another_namespace(what, result);
    }

    // Allowed: its own caches' classes, the cluster caches', gkm-gpu and
    // the model classes, in claims and templates.
    let own = format!("gkm-cache.{TEAM}.llama");
    for (name, body, path) in [
        ("own", claim("own", &own, false), claims_path()),
        ("own-first", claim("own-first", &own, true), claims_path()),
        (
            "cluster",
            claim("cluster", "gkm-clustercache.llama", false),
            claims_path(),
        ),
        ("gpu", claim("gpu", "gkm-gpu", false), claims_path()),
        (
            "model",
            claim("model", "gkm-model-h100", false),
            claims_path(),
        ),
        ("own", template("own", &own), templates_path()),
    ] {
        request(create(&path, &body))
            .await?
            .map_err(|s| anyhow::anyhow!("{name} ({path}) was refused: {}", s.message))?;
    }
    Ok(())
}
