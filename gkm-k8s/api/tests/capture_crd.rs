//! `GKMCacheCapture` on a real kube-apiserver: a capture is accepted as a
//! tenant writes one; one aimed at a digest, at another namespace's Secret,
//! or with a size the capture cannot read is refused naming the field; and
//! a capture's target cannot be moved once it exists.

use gkm_k8s_api::crd::GKMCacheCapture;
use gkm_testenv::ControlPlane;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{CustomResourceExt, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "capture-crd";

async fn client() -> anyhow::Result<kube::Client> {
    let plane = ControlPlane::shared().await?;
    plane.install_crds(&[GKMCacheCapture::crd()]).await?;
    plane.ensure_namespace(NS).await?;
    plane.client().await
}

fn capture(name: &str, spec: Value) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1",
        "kind": "GKMCacheCapture",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }))?)
}

fn valid_spec() -> Value {
    json!({
        "targetImage": "registry.example/team/llama:h100",
        "framework": "Triton",
        "signing": {"secretName": "signing"},
        "registryCredentialsSecret": "push",
        "maxBytes": "2GiB",
        "cacheName": "llama",
    })
}

/// Creates `obj` with strict field validation (unknown fields refused, not
/// pruned), as `kubectl create` does.
async fn create(client: &kube::Client, obj: &DynamicObject) -> anyhow::Result<kube::Result<Value>> {
    let path = format!("/apis/gkm.io/v1alpha1/namespaces/{NS}/gkmcachecaptures");
    let mut request =
        kube::core::Request::new(path).create(&PostParams::default(), serde_json::to_vec(obj)?)?;
    let uri = request.uri().to_string();
    let separator = if uri.contains('?') { '&' } else { '?' };
    let uri = format!("{uri}{separator}fieldValidation=Strict");
    *request.uri_mut() = uri.parse()?;
    Ok(client.request::<Value>(request).await)
}

#[tokio::test]
async fn a_capture_is_accepted_and_invalid_ones_are_refused_naming_the_field() -> anyhow::Result<()>
{
    let client = client().await?;
    let created = create(&client, &capture("valid", valid_spec())?).await??;
    assert_eq!(
        created["spec"]["targetImage"],
        "registry.example/team/llama:h100"
    );

    let cases = [
        (
            "a digest target",
            "targetImage",
            json!(
                "registry.example/team/llama@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
            ),
        ),
        (
            "not an image reference",
            "targetImage",
            json!("Not An Image"),
        ),
        ("a size that does not parse", "maxBytes", json!("10GB")),
        (
            "a Secret named badly",
            "registryCredentialsSecret",
            json!("Push_Creds"),
        ),
    ];
    let mut failures = Vec::new();
    for (i, (case, field, value)) in cases.iter().enumerate() {
        let mut spec = valid_spec();
        spec[*field] = value.clone();
        failures.extend(refusal(&client, &format!("bad-{i}"), spec, field, case).await?);
    }
    // Another namespace's Secret cannot even be written down.
    let mut spec = valid_spec();
    spec["signing"]["namespace"] = json!("other");
    failures.extend(refusal(&client, "other-ns", spec, "namespace", "another namespace").await?);
    assert!(failures.is_empty(), "{failures:#?}");
    Ok(())
}

/// Why `spec` was not refused as it should be, naming `field`.
async fn refusal(
    client: &kube::Client,
    name: &str,
    spec: Value,
    field: &str,
    case: &str,
) -> anyhow::Result<Option<String>> {
    Ok(match create(client, &capture(name, spec)?).await? {
        Ok(_) => Some(format!("{case}: accepted")),
        Err(kube::Error::Api(status)) if status.code == 422 || status.code == 400 => {
            (!status.message.contains(field))
                .then(|| format!("{case}: does not name {field}: {}", status.message))
        }
        Err(other) => Some(format!("{case}: {other}")),
    })
}

#[tokio::test]
async fn a_captures_target_cannot_be_moved() -> anyhow::Result<()> {
    let client = client().await?;
    create(&client, &capture("fixed", valid_spec())?).await??;
    let api: Api<GKMCacheCapture> = Api::namespaced(client, NS);
    let moved = api
        .patch(
            "fixed",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"targetImage": "registry.example/elsewhere/x:v1"}})),
        )
        .await;
    match moved {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains("targetImage cannot change"),
                "{}",
                status.message
            );
        }
        other => panic!("the target moved: {other:?}"),
    }
    // Other fields may change.
    let changed = api
        .patch(
            "fixed",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxBytes": "1GiB"}})),
        )
        .await?;
    assert_eq!(changed.spec.max_bytes.as_deref(), Some("1GiB"));
    assert_eq!(changed.name_any(), "fixed");
    Ok(())
}
