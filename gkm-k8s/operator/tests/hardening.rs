//! What a tenant or an unlucky operator can do to the operator, against a
//! real kube-apiserver and a real registry:
//!
//! - durations: the schema refuses out-of-range intervals; an object the
//!   schema once admitted (an older CRD) is reconciled with a bounded interval
//!   and never stops the others;
//! - the signature floor: a cache asking for `Off` is enforced, and the
//!   verdict the agents act on is in status;
//! - remembered verdicts follow the key in the Secret;
//! - Secret and ConfigMap references stay in the cache's namespace, with the
//!   same words whether the object is missing or unusable;
//! - deleting a cache ends although a node that no longer exists still
//!   reports it.

mod operator_support;

use std::time::Duration;

use gkm_k8s_api::cache_object::CacheKey;
use gkm_k8s_api::crd::{
    GKMCache, GKMCacheNode, KeySigner, SecretKeyRef, SignatureMode, SignaturePolicy, Signer,
};
use gkm_k8s_operator::{
    ImageVerifier, OperatorConfig, PolicyFloor, RegistryVerifier, TenantSigners,
};
use gkm_oci::sign::{SignFormat, SigningKey, sign};
use gkm_testenv::{ControlPlane, Registry, eventually};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use operator_support::{
    OPERATOR_NAMESPACE, WAIT, cache, pem, push, put_secret, registry_options, spawn_operator,
};
use serde_json::json;

/// The installed GKMCache CRD without any rule on `resolveInterval`, as an
/// older gkm installed it.
async fn relax_resolve_interval(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut crd = api.get("gkmcaches.gkm.io").await?;
    crd.metadata.managed_fields = None;
    let mut value = serde_json::to_value(&crd)?;
    for version in value["spec"]["versions"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["resolveInterval"] =
            json!({"type": "string"});
    }
    let relaxed: CustomResourceDefinition = serde_json::from_value(value)?;
    api.replace("gkmcaches.gkm.io", &PostParams::default(), &relaxed)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_holds_its_floor_and_outlives_hostile_caches() -> anyhow::Result<()> {
    let plane = ControlPlane::shared().await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    let client = plane.client().await?;
    let registry = Registry::shared()?;
    let ns = "hardening";
    plane.ensure_namespace(ns).await?;
    plane.ensure_namespace(OPERATOR_NAMESPACE).await?;
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), ns);
    let apply = PatchParams::apply("gkm-test").force();

    // Class 1, in the schema: out-of-range intervals never reach the operator.
    for bad in [
        "0s",
        "9s",
        "169h",
        "9999999999999999h",
        "1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h",
    ] {
        let err = caches
            .create(
                &PostParams::default(),
                &cache(
                    ns,
                    "bad-interval",
                    json!({"image": "r.local/c:v1", "resolveInterval": bad}),
                )?,
            )
            .await
            .expect_err("refused by the schema");
        assert!(err.to_string().contains("resolveInterval"), "{bad}: {err}");
    }

    // The image, signed by the key in a Secret of the cache's namespace.
    let (image, digest) = push(registry, "hardening/signed").await?;
    let (first, _) = SigningKey::generate_p256()?;
    let (second, _) = SigningKey::generate_p256()?;
    sign(
        &image.parse()?,
        &registry_options(),
        &digest.parse()?,
        &first,
        SignFormat::Bundle,
    )
    .await?;
    put_secret(&client, ns, "signer", &pem(first.public_key())).await?;

    let config = OperatorConfig {
        registry: registry_options(),
        resolve_interval: Duration::from_secs(1),
        floor: PolicyFloor::default(),
        // The caches name their own signers: counted in this namespace only.
        tenant_signers: TenantSigners::in_namespaces([ns]),
        ..OperatorConfig::default()
    };
    let operator = spawn_operator(&client, config);

    let by_secret =
        json!({"signers": [{"key": {"secretRef": {"name": "signer", "key": "cosign.pub"}}}]});
    caches
        .patch(
            "good",
            &apply,
            &Patch::Apply(&cache(
                ns,
                "good",
                json!({"image": image, "signature": by_secret}),
            )?),
        )
        .await?;
    // Class 2: a tenant asking for no verification gets the floor.
    caches
        .patch(
            "off",
            &apply,
            &Patch::Apply(&cache(
                ns,
                "off",
                json!({"image": image, "signature": {"mode": "Off"}}),
            )?),
        )
        .await?;

    let verification = |name: &'static str| {
        let caches = caches.clone();
        move || {
            let caches = caches.clone();
            async move { Ok(caches.get(name).await?.status.and_then(|s| s.verification)) }
        }
    };
    let good = eventually("the good cache verified", WAIT, || async {
        Ok(verification("good")().await?.filter(|v| v.verified))
    })
    .await?;
    assert_eq!(good.deliverable, Some(true));
    assert_eq!(good.mode, Some(SignatureMode::Enforce));
    assert_eq!(good.digest.as_deref(), Some(digest.as_str()));
    let fingerprint = good.policy.clone().expect("a policy fingerprint");

    let off = eventually("the Off cache judged", WAIT, verification("off")).await?;
    assert_eq!(off.mode, Some(SignatureMode::Enforce), "{off:?}");
    assert_eq!(off.deliverable, Some(false), "{off:?}");
    assert!(
        off.message
            .as_deref()
            .unwrap_or("")
            .contains("Off is not allowed"),
        "{off:?}"
    );

    // Class 5: the key in the Secret is rotated; the recorded verdict goes.
    put_secret(&client, ns, "signer", &pem(second.public_key())).await?;
    let rotated = eventually("the verdict after the key rotation", WAIT, || async {
        Ok(verification("good")().await?.filter(|v| !v.verified))
    })
    .await?;
    assert_eq!(rotated.deliverable, Some(false));
    assert_ne!(rotated.policy.as_deref(), Some(fingerprint.as_str()));
    put_secret(&client, ns, "signer", &pem(first.public_key())).await?;
    eventually("verified again with the first key", WAIT, || async {
        Ok(verification("good")().await?.filter(|v| v.verified))
    })
    .await?;

    // Class 1, in the operator: caches an older schema admitted (an
    // interval that overflows, one of zero) are reconciled with a bounded
    // interval, and the others go on.
    relax_resolve_interval(&client).await?;
    for (name, interval) in [("overflow", "9999999999999999h"), ("spin", "0s")] {
        let object = cache(
            ns,
            name,
            json!({"image": image, "resolveInterval": interval}),
        )?;
        // The apiserver takes the relaxed schema up a moment later.
        eventually("the relaxed schema in effect", WAIT, || async {
            match caches.patch(name, &apply, &Patch::Apply(&object)).await {
                Ok(_) => Ok(Some(())),
                Err(kube::Error::Api(s)) if s.code == 422 => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
        .await?;
    }
    for name in ["overflow", "spin"] {
        let reason = eventually("the hostile interval reported", WAIT, || async {
            let conditions = caches
                .get(name)
                .await?
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default();
            Ok(conditions
                .into_iter()
                .find(|c| c.type_ == "ResolveIntervalValid")
                .map(|c| c.message))
        })
        .await?;
        assert!(reason.contains("resolveInterval"), "{name}: {reason}");
    }
    put_secret(&client, ns, "signer", &pem(second.public_key())).await?;
    eventually("the good cache still reconciled", WAIT, || async {
        Ok(verification("good")().await?.filter(|v| !v.verified))
    })
    .await?;
    assert!(!operator.is_finished(), "the operator stopped");
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;

    // Class 7: a report of a node that no longer exists does not hold a
    // deletion forever.
    let reports: Api<GKMCacheNode> = Api::namespaced(client.clone(), ns);
    let report: GKMCacheNode = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
        "metadata": {"name": "scaled-down-node", "namespace": ns},
        "spec": {},
    }))?;
    reports
        .patch("scaled-down-node", &apply, &Patch::Apply(&report))
        .await?;
    let status = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
        "status": {"nodeName": "scaled-down-node", "caches": {"good": {(digest.as_str()): {"state": "Extracted"}}}},
    });
    reports
        .patch_status("scaled-down-node", &apply, &Patch::Apply(&status))
        .await?;
    caches.delete("good", &DeleteParams::default()).await?;
    eventually("the cache deleted", WAIT, || async {
        Ok(caches.get_opt("good").await?.is_none().then_some(()))
    })
    .await?;
    assert!(reports.get_opt("scaled-down-node").await?.is_none());
    assert!(!operator.is_finished(), "the operator stopped");
    operator.abort();
    Ok(())
}

/// Class 3: a namespaced cache reads key material only in its namespace, a
/// cluster cache only in the operator's, and the words never tell what
/// exists elsewhere.
#[tokio::test(flavor = "multi_thread")]
async fn key_references_stay_in_their_namespace() -> anyhow::Result<()> {
    let plane = ControlPlane::shared().await?;
    let client = plane.client().await?;
    for ns in ["tenant-a", "tenant-b", OPERATOR_NAMESPACE] {
        plane.ensure_namespace(ns).await?;
    }
    let (key, _) = SigningKey::generate_p256()?;
    let good = pem(key.public_key());
    put_secret(&client, "tenant-b", "their-key", &good).await?;
    put_secret(&client, "tenant-a", "garbage", "not a key").await?;
    put_secret(&client, "tenant-a", "mine", &good).await?;
    put_secret(&client, OPERATOR_NAMESPACE, "cluster-key", &good).await?;
    let verifier = RegistryVerifier::new(client.clone(), registry_options(), OPERATOR_NAMESPACE);
    let tenant_a = CacheKey::namespaced("tenant-a", "c");
    let cluster = CacheKey::cluster("c");
    let policy = |ns: Option<&str>, name: &str| SignaturePolicy {
        signers: Some(vec![Signer {
            key: Some(KeySigner {
                secret_ref: Some(SecretKeyRef {
                    name: name.into(),
                    namespace: ns.map(Into::into),
                    key: "cosign.pub".into(),
                }),
                ..KeySigner::default()
            }),
            ..Signer::default()
        }]),
        ..SignaturePolicy::default()
    };
    let refused = |r: Result<gkm_core::policy::Policy, String>| r.expect_err("refused");

    // Another namespace: refused before anything is read, the same words
    // for a Secret that exists there and one that does not.
    let present = refused(
        verifier
            .resolve(&tenant_a, &policy(Some("tenant-b"), "their-key"))
            .await,
    );
    let absent = refused(
        verifier
            .resolve(&tenant_a, &policy(Some("tenant-b"), "no-such"))
            .await,
    );
    assert!(
        present.contains("may only reference objects in \"tenant-a\""),
        "{present}"
    );
    assert_eq!(present, absent);

    // Its own namespace: missing and unusable read the same.
    let missing = refused(
        verifier
            .resolve(&tenant_a, &policy(None, "nothing-here"))
            .await,
    );
    let unusable = refused(verifier.resolve(&tenant_a, &policy(None, "garbage")).await);
    assert!(missing.contains("missing or not usable"), "{missing}");
    assert_eq!(
        missing.replace("nothing-here", "NAME"),
        unusable.replace("garbage", "NAME"),
        "{missing} / {unusable}"
    );
    assert!(
        verifier
            .resolve(&tenant_a, &policy(None, "mine"))
            .await
            .is_ok()
    );
    assert!(
        verifier
            .resolve(&tenant_a, &policy(Some("tenant-a"), "mine"))
            .await
            .is_ok()
    );

    // A cluster cache: the operator's namespace only.
    let elsewhere = refused(
        verifier
            .resolve(&cluster, &policy(Some("tenant-a"), "mine"))
            .await,
    );
    assert!(elsewhere.contains(OPERATOR_NAMESPACE), "{elsewhere}");
    assert!(
        verifier
            .resolve(&cluster, &policy(None, "cluster-key"))
            .await
            .is_ok()
    );
    Ok(())
}
