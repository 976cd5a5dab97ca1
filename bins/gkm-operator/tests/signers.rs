//! Who decides which signatures deliver a cache image, against a real
//! kube-apiserver and a real registry, with `gkm-operator` run as its
//! ServiceAccount with the shipped RBAC:
//!
//! - only the signers the administrator named count: a tenant's own key in
//!   `spec.signature` makes nothing deliverable unless the operator's
//!   configuration opts the tenant's namespace in;
//! - a tag moved to an unsigned digest keeps the cache on the last verified
//!   digest, saying so, instead of failing new pods;
//! - a tag moved back to a digest the cache already moved away from (a
//!   rollback) is not followed, even though that digest is signed;
//! - a digest quarantined by hand (`spec.quarantine`) is served to no new
//!   pod: the cache falls back to the last good digest it served, or
//!   serves nothing, and follows the tag again once the quarantine is
//!   lifted; a malformed digest is refused by the apiserver.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gkm_k8s_api::crd::{CacheStatus, GKMCache};
use gkm_oci::sign::{SignFormat, SigningKey, sign};
use gkm_oci::{BuildOptions, Built, ImageRef, RegistryOptions, Repo, build};
use gkm_testenv::{ControlPlane, Process, Registry};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

const SYSTEM: &str = "gkm-system";

/// One operator at a time: each reconciles every cache in the cluster, each
/// with its own administrator's key.
static OPERATORS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long a cache's status may take.
const WAIT: Duration = Duration::from_secs(60);

fn deploy_dir() -> PathBuf {
    gkm_testenv::repo_root().join("deploy")
}

fn registry_options() -> RegistryOptions {
    RegistryOptions {
        insecure: true,
        ..RegistryOptions::default()
    }
}

/// Builds the fixture into `image` (a tag), titled `title` so that each
/// title is its own digest; the tag then points at it.
async fn push(image: &str, title: &str) -> anyhow::Result<Built> {
    let fixture = gkm_testenv::fixture_cache("triton-vector-add-cuda-sm75");
    let options = BuildOptions {
        title: Some(title.into()),
        ..BuildOptions::default()
    };
    Ok(build(&fixture, &image.parse()?, &options, &registry_options()).await?)
}

async fn sign_with(image: &str, built: &Built, key: &SigningKey) -> anyhow::Result<()> {
    sign(
        &image.parse()?,
        &registry_options(),
        &built.digest,
        key,
        SignFormat::Bundle,
    )
    .await?;
    Ok(())
}

/// Points the tag `image` at `built` again (it is in the repository already).
async fn retag(image: &str, built: &Built) -> anyhow::Result<()> {
    let reference: ImageRef = image.parse()?;
    Repo::create(&reference, &registry_options())?
        .put_manifest(&built.manifest)
        .await?;
    Ok(())
}

/// The operator, as its ServiceAccount, with the administrator's signers
/// (`admin_pem`) as its default policy and `extra` flags.
async fn operator(
    plane: &ControlPlane,
    dir: &Path,
    name: &str,
    admin_pem: &str,
    extra: &[String],
) -> anyhow::Result<Process> {
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    plane
        .apply_file(&deploy_dir().join("namespace.yaml"))
        .await?;
    plane
        .apply_file(&deploy_dir().join("rbac/operator.yaml"))
        .await?;
    let kubeconfig = plane.kubeconfig_for_service_account(SYSTEM, "gkm-operator")?;
    let policy = dir.join(format!("{name}-default-policy.yaml"));
    std::fs::write(
        &policy,
        serde_yaml::to_string(&json!({"signers": [{"key": {"publicKey": admin_pem}}]}))?,
    )?;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-operator"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--metrics-addr=127.0.0.1:0")
        .arg("--insecure-registry")
        .arg("--resolve-interval=1s")
        .arg(format!("--default-policy={}", policy.display()))
        .args(extra)
        .env("GKM_LOG", "info,kube=warn");
    Process::spawn(name, cmd, &dir.join(format!("{name}.log")))
}

async fn put_cache(
    client: &kube::Client,
    ns: &str,
    name: &str,
    spec: serde_json::Value,
) -> anyhow::Result<Api<GKMCache>> {
    let cache: GKMCache = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))?;
    let api = Api::<GKMCache>::namespaced(client.clone(), ns);
    api.patch(name, &PatchParams::apply("gkm-test"), &Patch::Apply(&cache))
        .await?;
    Ok(api)
}

/// Waits until the cache's status holds `done`, failing after [`WAIT`] (or
/// when the operator exits) with the last status seen.
async fn until_status(
    operator: &mut Process,
    caches: &Api<GKMCache>,
    name: &str,
    what: &str,
    done: impl Fn(&CacheStatus) -> bool,
) -> anyhow::Result<CacheStatus> {
    let last = std::cell::RefCell::new(CacheStatus::default());
    let waited = gkm_testenv::eventually(&format!("{name}: {what}"), WAIT, || {
        let running = operator.check_running();
        let (last, done) = (&last, &done);
        async move {
            running?;
            let status = caches.get(name).await?.status.unwrap_or_default();
            if done(&status) {
                return Ok(Some(status));
            }
            *last.borrow_mut() = status;
            Ok(None)
        }
    })
    .await;
    waited.map_err(|e| {
        anyhow::anyhow!(
            "{e}; status: {:#?}\noperator log:\n{}",
            last.borrow(),
            operator.log_tail(20)
        )
    })
}

/// Whether a node would deliver `digest` on this status: what the agents read.
fn delivers(status: &CacheStatus, digest: &str) -> bool {
    status.resolved_digest.as_deref() == Some(digest)
        && status
            .verification
            .as_ref()
            .is_some_and(|v| v.admits(digest))
}

fn condition<'a>(status: &'a CacheStatus, type_: &str) -> Option<(&'a str, &'a str, &'a str)> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenants_own_key_delivers_nothing_unless_the_administrator_opted_its_namespace_in()
-> anyhow::Result<()> {
    let _serial = OPERATORS.lock().await;
    let plane = ControlPlane::shared().await?;
    let registry = Registry::shared()?;
    let client = plane.client().await?;
    let dir = gkm_testenv::temp_dir()?;
    let (admin_key, _) = SigningKey::generate_p256()?;
    let (tenant_key, _) = SigningKey::generate_p256()?;
    let admin_pem = admin_key.public_key().to_pem();

    // An image only the tenant signed.
    let image = format!("{}/signers/tenant-signed:v1", registry.addr());
    let built = push(&image, "tenant-signed").await?;
    sign_with(&image, &built, &tenant_key).await?;
    let digest = built.digest.to_string();

    let (plain, opted) = ("signers-plain", "signers-opted");
    for ns in [plain, opted] {
        plane.ensure_namespace(ns).await?;
    }
    let mut operator = operator(
        plane,
        dir.path(),
        "tenant-signers",
        &admin_pem,
        &[format!("--tenant-signer-namespaces={opted}")],
    )
    .await?;
    let own_key = json!({"image": image,
        "signature": {"signers": [{"key": {"publicKey": tenant_key.public_key().to_pem()}}]}});

    // In a namespace the administrator did not opt in, the tenant's key is
    // not counted: only the administrator's signers are, and they did not
    // sign this image.
    let caches = put_cache(&client, plain, "own-key", own_key.clone()).await?;
    let status = until_status(&mut operator, &caches, "own-key", "a verdict", |s| {
        s.verification
            .as_ref()
            .is_some_and(|v| v.digest.as_deref() == Some(&digest))
    })
    .await?;
    assert!(
        !delivers(&status, &digest),
        "a tenant's own key made its image deliverable: {status:#?}"
    );
    let message = status
        .verification
        .as_ref()
        .and_then(|v| v.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("spec.signature.signers") && message.contains(plain),
        "the refusal does not say the tenant's signers were not counted: {message}"
    );

    // In a namespace the administrator opted in, the tenant's key counts.
    let caches = put_cache(&client, opted, "own-key", own_key).await?;
    until_status(&mut operator, &caches, "own-key", "delivered", |s| {
        delivers(s, &digest)
    })
    .await?;
    operator.check_running()?;
    Ok(())
}

/// A cache `name` in namespace `ns` following the tag `repo:v1` of the
/// shared registry, whose first digest (titled `title`) the administrator
/// signed, served by an operator (`operator_name`) with the
/// administrator's key as its default policy: once that digest is
/// delivered.
struct Following {
    operator: Process,
    caches: Api<GKMCache>,
    client: kube::Client,
    image: String,
    admin_key: SigningKey,
    first: Built,
    _dir: tempfile::TempDir,
}

async fn following(
    ns: &str,
    name: &str,
    repo: &str,
    title: &str,
    operator_name: &str,
) -> anyhow::Result<Following> {
    let plane = ControlPlane::shared().await?;
    let registry = Registry::shared()?;
    let client = plane.client().await?;
    let dir = gkm_testenv::temp_dir()?;
    let (admin_key, _) = SigningKey::generate_p256()?;
    let admin_pem = admin_key.public_key().to_pem();
    plane.ensure_namespace(ns).await?;
    let image = format!("{}/signers/{repo}:v1", registry.addr());
    let first = push(&image, title).await?;
    sign_with(&image, &first, &admin_key).await?;
    let first_digest = first.digest.to_string();
    let mut operator = operator(plane, dir.path(), operator_name, &admin_pem, &[]).await?;
    let caches = put_cache(&client, ns, name, json!({"image": image})).await?;
    until_status(
        &mut operator,
        &caches,
        name,
        "the first digest delivered",
        |s| delivers(s, &first_digest),
    )
    .await?;
    Ok(Following {
        operator,
        caches,
        client,
        image,
        admin_key,
        first,
        _dir: dir,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_moved_tag_serves_the_last_verified_digest_and_a_rollback_is_not_followed()
-> anyhow::Result<()> {
    let _serial = OPERATORS.lock().await;
    let ns = "signers-tags";
    let Following {
        mut operator,
        caches,
        client,
        image,
        admin_key,
        first,
        ..
    } = following(ns, "moving", "moving", "first", "tag-moves").await?;
    let first_digest = first.digest.to_string();

    // The tag moves to an unsigned digest: the cache stays on the last
    // verified one (pods keep getting it) and says why.
    let unsigned = push(&image, "unsigned").await?;
    let unsigned_digest = unsigned.digest.to_string();
    let status = until_status(
        &mut operator,
        &caches,
        "moving",
        "the tag move noticed",
        |s| condition(s, "TagFollowed").is_some(),
    )
    .await?;
    assert!(
        delivers(&status, &first_digest),
        "the last verified digest is no longer delivered: {status:#?}"
    );
    let (followed, reason, message) = condition(&status, "TagFollowed").unwrap_or_default();
    assert_eq!((followed, reason), ("False", "NotVerified"), "{message}");
    assert!(message.contains(&unsigned_digest), "{message}");

    // Signed, the next digest is followed.
    let second = push(&image, "second").await?;
    sign_with(&image, &second, &admin_key).await?;
    let second_digest = second.digest.to_string();
    let status = until_status(
        &mut operator,
        &caches,
        "moving",
        "the second digest delivered",
        |s| delivers(s, &second_digest),
    )
    .await?;
    assert_eq!(condition(&status, "TagFollowed"), None, "{status:#?}");

    // The tag moves back to the first digest, signed but replaced: a
    // rollback, not followed.
    retag(&image, &first).await?;
    let status = until_status(
        &mut operator,
        &caches,
        "moving",
        "the rollback noticed",
        |s| condition(s, "TagFollowed").is_some(),
    )
    .await?;
    assert!(
        delivers(&status, &second_digest),
        "the tag's rollback was followed: {status:#?}"
    );
    let (followed, reason, message) = condition(&status, "TagFollowed").unwrap_or_default();
    assert_eq!((followed, reason), ("False", "RolledBack"), "{message}");
    assert!(message.contains(&first_digest), "{message}");

    // Pinning the older digest is the tenant's deliberate choice: followed.
    let pinned = format!("{}@{first_digest}", image.trim_end_matches(":v1"));
    put_cache(&client, ns, "moving", json!({"image": pinned})).await?;
    until_status(
        &mut operator,
        &caches,
        "moving",
        "the pinned digest delivered",
        |s| delivers(s, &first_digest),
    )
    .await?;
    operator.check_running()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quarantined_digest_is_served_to_no_new_pod_and_the_cache_falls_back_to_the_last_good_one()
-> anyhow::Result<()> {
    let _serial = OPERATORS.lock().await;
    let ns = "signers-quarantine";
    let Following {
        mut operator,
        caches,
        client,
        image,
        admin_key,
        first: good,
        ..
    } = following(ns, "canary", "quarantined", "good", "quarantine").await?;
    let good_digest = good.digest.to_string();
    // The tag moves to a signed digest that turns out bad.
    let bad = push(&image, "bad").await?;
    sign_with(&image, &bad, &admin_key).await?;
    let bad_digest = bad.digest.to_string();
    until_status(
        &mut operator,
        &caches,
        "canary",
        "the bad digest followed",
        |s| delivers(s, &bad_digest),
    )
    .await?;

    // Quarantined by hand: no node serves it to new pods, the cache is back
    // on the good digest (which it had moved away from) and says why.
    put_cache(
        &client,
        ns,
        "canary",
        json!({"image": image, "quarantine": [bad_digest]}),
    )
    .await?;
    let status = until_status(&mut operator, &caches, "canary", "the fall-back", |s| {
        delivers(s, &good_digest)
    })
    .await?;
    assert!(!delivers(&status, &bad_digest), "{status:#?}");
    let (followed, reason, message) = condition(&status, "TagFollowed").unwrap_or_default();
    assert_eq!((followed, reason), ("False", "Quarantined"), "{message}");
    assert!(
        message.contains(&bad_digest) && message.contains(&format!("still serving {good_digest}")),
        "{message}"
    );

    // Both quarantined: nothing is delivered, and the verdict says why.
    put_cache(
        &client,
        ns,
        "canary",
        json!({"image": image, "quarantine": [bad_digest, good_digest]}),
    )
    .await?;
    let status = until_status(&mut operator, &caches, "canary", "nothing delivered", |s| {
        !delivers(s, &good_digest)
            && !delivers(s, &bad_digest)
            && condition(s, "TagFollowed").is_some_and(|(_, r, _)| r == "Quarantined")
    })
    .await?;
    let refusal = status
        .verification
        .as_ref()
        .and_then(|v| v.message.clone())
        .unwrap_or_default();
    assert!(refusal.contains("nothing is served"), "{status:#?}");

    // Lifted: the tag is followed again.
    put_cache(&client, ns, "canary", json!({"image": image})).await?;
    until_status(
        &mut operator,
        &caches,
        "canary",
        "the tag followed again",
        |s| delivers(s, &bad_digest),
    )
    .await?;

    // A digest that is not one is refused by the apiserver, naming the field.
    let refused = put_cache(
        &client,
        ns,
        "canary",
        json!({"image": image, "quarantine": ["sha256:beef"]}),
    )
    .await
    .expect_err("a malformed digest was accepted");
    assert!(
        refused.to_string().contains("spec.quarantine[0]"),
        "{refused:#}"
    );
    operator.check_running()?;
    Ok(())
}
