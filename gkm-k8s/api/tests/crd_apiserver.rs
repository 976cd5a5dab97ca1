//! The CRDs on a real kube-apiserver: installed and Established, valid objects
//! of every kind accepted, invalid ones rejected by the apiserver with a
//! message naming the field, printer columns served in Table responses.

use gkm_k8s_api::crd::{self, ClusterGKMCache, GKMCache, GKMCacheNode};
use gkm_testenv::ControlPlane;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde::Deserialize;
use serde_json::{Value, json};

async fn setup(namespace: &str) -> anyhow::Result<kube::Client> {
    let plane = ControlPlane::shared().await?;
    plane.install_crds(&crd::crds()).await?;
    plane.ensure_namespace(namespace).await?;
    plane.client().await
}

/// Creates `obj` with strict field validation, as `kubectl create` does: unknown
/// fields are rejected rather than pruned.
async fn create(
    client: &kube::Client,
    resource: &ApiResource,
    namespace: Option<&str>,
    obj: &DynamicObject,
) -> anyhow::Result<kube::Result<DynamicObject>> {
    let path = match namespace {
        Some(ns) => format!(
            "/apis/{}/namespaces/{ns}/{}",
            resource.api_version, resource.plural
        ),
        None => format!("/apis/{}/{}", resource.api_version, resource.plural),
    };
    let mut request =
        kube::core::Request::new(path).create(&PostParams::default(), serde_json::to_vec(obj)?)?;
    let uri = request.uri().to_string();
    let separator = if uri.contains('?') { '&' } else { '?' };
    *request.uri_mut() = format!("{uri}{separator}fieldValidation=Strict").parse()?;
    Ok(client.request::<DynamicObject>(request).await)
}

fn resource<K: kube::Resource<DynamicType = ()>>() -> ApiResource {
    ApiResource::erase::<K>(&())
}

fn object(kind: &str, name: &str, spec: Value) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }))?)
}

#[tokio::test]
async fn crds_are_established_and_accept_valid_objects_of_every_kind() -> anyhow::Result<()> {
    let ns = "crd-valid";
    let client = setup(ns).await?;

    // GKM's own example, unchanged.
    let gkm_example = object(
        "GKMCache",
        "vector-add-cache-cuda",
        json!({
            "image": "quay.io/gkm/cache-examples:vector-add-cache-cuda",
            "storageClassName": "standard",
            "accessModes": ["ReadWriteOnce"],
            "podTemplate": {
                "metadata": {"labels": {"app": "vllm"}, "annotations": {"note": "x"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "gkm.io/gpu.backend", "operator": "In", "values": ["cuda"]}]}]}}},
                    "priorityClassName": "system-node-critical"
                }
            }
        }),
    )?;
    let created = create(&client, &resource::<GKMCache>(), Some(ns), &gkm_example).await??;
    assert_eq!(
        created.data["spec"]["image"],
        "quay.io/gkm/cache-examples:vector-add-cache-cuda"
    );

    // gkm's own fields, read back through the typed API.
    let with_policy = object(
        "GKMCache",
        "signed",
        json!({
            "image": "registry.example.com:5000/caches/triton@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "signature": {
                "mode": "Enforce",
                "signers": [
                    {"key": {"publicKey": "-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----\n"}},
                    {"key": {"secretRef": {"name": "cosign-pub", "key": "cosign.pub"}}},
                    {"keyless": {"issuer": "https://token.actions.githubusercontent.com",
                                 "subjectRegExp": "^https://github.com/acme/.*$"}}
                ],
                "trustedRoot": {"name": "sigstore-root", "key": "trusted_root.json"}
            },
            "nodeSelector": {"matchLabels": {"gkm.io/gpu.vendor": "nvidia"}},
            "resolveInterval": "5m"
        }),
    )?;
    create(&client, &resource::<GKMCache>(), Some(ns), &with_policy).await??;
    let typed: GKMCache = Api::namespaced(client.clone(), ns).get("signed").await?;
    let policy = typed
        .spec
        .cache
        .signature
        .as_ref()
        .expect("signature read back");
    assert_eq!(policy.signers.as_ref().map(Vec::len), Some(3));
    assert_eq!(typed.spec.cache.resolve_interval.as_deref(), Some("5m"));

    let cluster = object(
        "ClusterGKMCache",
        "crd-valid-cluster",
        json!({
            "image": "localhost:5000/gkm/vllm:latest",
            "storageClassName": "standard",
            "accessModes": ["ReadOnlyMany"],
            "workloadNamespaces": ["team-a", "team-b"]
        }),
    )?;
    create(&client, &resource::<ClusterGKMCache>(), None, &cluster).await??;

    let node = object("GKMCacheNode", "node-1", json!({}))?;
    create(&client, &resource::<GKMCacheNode>(), Some(ns), &node).await??;
    let cluster_node = object("ClusterGKMCacheNode", "crd-valid-node-1", json!({}))?;
    create(
        &client,
        &resource::<crd::ClusterGKMCacheNode>(),
        None,
        &cluster_node,
    )
    .await??;

    // The agent writes node reports through the status subresource.
    let nodes: Api<GKMCacheNode> = Api::namespaced(client.clone(), ns);
    let status = json!({"status": {
        "nodeName": "node-1",
        "counts": {"nodeCnt": 1, "nodeInUseCnt": 0, "nodeNotInUseCnt": 1, "nodeErrorCnt": 0,
                   "podRunningCnt": 0, "podDeletingCnt": 0, "podOutdatedCnt": 0},
        "gpus": [{"gpuType": "Tesla T4", "driverVersion": "550.54.15", "ids": [0, 1],
                  "backend": "cuda", "arch": "75", "warpSize": 32}],
        "caches": {"vector-add-cache-cuda": {"sha256:abc": {
            "state": "Extracted", "compatibleGPUs": [0, 1], "incompatibleGPUs": [], "volumeSize": 104857}}}
    }});
    nodes
        .patch_status("node-1", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    let read = nodes.get_status("node-1").await?;
    let report = read.status.expect("status written");
    assert_eq!(report.node_name, "node-1");
    let entry = &report.caches.expect("caches")["vector-add-cache-cuda"]["sha256:abc"];
    assert_eq!(entry.state, Some(crd::CacheState::Extracted));
    assert_eq!(entry.compatible_gpus.as_deref(), Some(&[0, 1][..]));
    Ok(())
}

/// One invalid object: what it is, the object, and the field its rejection must name.
struct Invalid {
    case: &'static str,
    kind: &'static str,
    spec: Value,
    field: &'static str,
}

fn invalid_objects() -> Vec<Invalid> {
    let image = "quay.io/gkm/cache-examples:vector-add-cache-cuda";
    let case = |case, kind, spec, field| Invalid {
        case,
        kind,
        spec,
        field,
    };
    vec![
        case(
            "missing image",
            "GKMCache",
            json!({"storageClassName": "standard"}),
            "spec.image",
        ),
        case(
            "empty image",
            "GKMCache",
            json!({"image": ""}),
            "spec.image",
        ),
        case(
            "upper-case repository",
            "GKMCache",
            json!({"image": "quay.io/GKM/Cache:v1"}),
            "spec.image",
        ),
        case(
            "double colon tag",
            "GKMCache",
            json!({"image": "quay.io/gkm/cache::v1"}),
            "spec.image",
        ),
        case(
            "space in reference",
            "GKMCache",
            json!({"image": "quay.io/gkm cache:v1"}),
            "spec.image",
        ),
        case(
            "malformed digest",
            "GKMCache",
            json!({"image": "quay.io/gkm/cache@sha256:xyz"}),
            "spec.image",
        ),
        case(
            "reference too long",
            "GKMCache",
            json!({"image": format!("quay.io/{}", "a".repeat(600))}),
            "spec.image",
        ),
        case(
            "image of the wrong type",
            "GKMCache",
            json!({"image": 42}),
            "spec.image",
        ),
        case(
            "unknown access mode",
            "GKMCache",
            json!({"image": image, "accessModes": ["ReadWriteSometimes"]}),
            "spec.accessModes[0]",
        ),
        case(
            "repeated access mode",
            "GKMCache",
            json!({"image": image, "accessModes": ["ReadOnlyMany", "ReadOnlyMany"]}),
            "spec.accessModes",
        ),
        case(
            "bad storage class name",
            "GKMCache",
            json!({"image": image, "storageClassName": "Not Valid"}),
            "spec.storageClassName",
        ),
        case(
            "workloadNamespaces on a namespaced cache",
            "GKMCache",
            json!({"image": image, "workloadNamespaces": ["team-a"]}),
            "spec.workloadNamespaces",
        ),
        case(
            "namespace name with upper case",
            "ClusterGKMCache",
            json!({"image": image, "workloadNamespaces": ["Team_A"]}),
            "spec.workloadNamespaces[0]",
        ),
        case(
            "namespace name too long",
            "ClusterGKMCache",
            json!({"image": image, "workloadNamespaces": ["n".repeat(64)]}),
            "spec.workloadNamespaces[0]",
        ),
        case(
            "PVC mode cluster cache without namespaces",
            "ClusterGKMCache",
            json!({"image": image, "storageClassName": "standard"}),
            "spec.workloadNamespaces",
        ),
        case(
            "unknown podTemplate spec field",
            "GKMCache",
            json!({"image": image, "podTemplate": {"spec": {"containers": []}}}),
            "spec.podTemplate.spec.containers",
        ),
        case(
            "unknown podTemplate metadata field",
            "GKMCache",
            json!({"image": image, "podTemplate": {"metadata": {"finalizers": ["x"]}}}),
            "spec.podTemplate.metadata.finalizers",
        ),
        case(
            "nodeSelector of the wrong type",
            "GKMCache",
            json!({"image": image, "podTemplate": {"spec": {"nodeSelector": ["a"]}}}),
            "spec.podTemplate.spec.nodeSelector",
        ),
        case(
            "unknown spec field",
            "GKMCache",
            json!({"image": image, "imagePullPolicy": "Always"}),
            "spec.imagePullPolicy",
        ),
        case(
            "unknown signature mode",
            "GKMCache",
            json!({"image": image, "signature": {"mode": "Sometimes", "signers": []}}),
            "spec.signature.mode",
        ),
        case(
            "enforced policy without signers",
            "GKMCache",
            json!({"image": image, "signature": {"mode": "Enforce"}}),
            "spec.signature.signers",
        ),
        case(
            "signer with key and keyless",
            "GKMCache",
            json!({"image": image, "signature": {"signers": [{
            "key": {"secretRef": {"name": "k", "key": "cosign.pub"}},
            "keyless": {"issuer": "https://accounts.google.com", "subject": "a@b.c"}}]}}),
            "spec.signature.signers[0]",
        ),
        case(
            "keyless signer without subject",
            "GKMCache",
            json!({"image": image, "signature": {"signers": [{
            "keyless": {"issuer": "https://accounts.google.com"}}]}}),
            "spec.signature.signers[0].keyless",
        ),
        case(
            "public key that is not PEM",
            "GKMCache",
            json!({"image": image, "signature": {"signers": [{
            "key": {"publicKey": "ssh-ed25519 AAAA"}}]}}),
            "spec.signature.signers[0].key.publicKey",
        ),
        case(
            "resolve interval in words",
            "GKMCache",
            json!({"image": image, "resolveInterval": "5 minutes"}),
            "spec.resolveInterval",
        ),
    ]
}

#[tokio::test]
async fn apiserver_rejects_invalid_objects_naming_the_field() -> anyhow::Result<()> {
    let ns = "crd-invalid";
    let client = setup(ns).await?;
    let cases = invalid_objects();
    assert!(cases.len() >= 15);
    let failures = unrefused(&client, ns, "crd-invalid", &cases).await?;
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    Ok(())
}

/// Creates each case and returns what went wrong: a case accepted, refused
/// with an unexpected status, or refused without naming its field.
async fn unrefused(
    client: &kube::Client,
    ns: &str,
    prefix: &str,
    cases: &[Invalid],
) -> anyhow::Result<Vec<String>> {
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let (resource, namespace) = match case.kind {
            "GKMCache" => (resource::<GKMCache>(), Some(ns)),
            _ => (resource::<ClusterGKMCache>(), None),
        };
        let obj = object(case.kind, &format!("{prefix}-{i}"), case.spec.clone())?;
        match create(client, &resource, namespace, &obj).await? {
            Ok(_) => failures.push(format!("{}: accepted", case.case)),
            Err(kube::Error::Api(status)) => {
                if status.code != 422 && status.code != 400 {
                    failures.push(format!(
                        "{}: HTTP {} {}",
                        case.case, status.code, status.message
                    ));
                } else if !status.message.contains(case.field) {
                    failures.push(format!(
                        "{}: message does not name {}: {}",
                        case.case,
                        case.field,
                        status.message.chars().take(400).collect::<String>()
                    ));
                }
            }
            Err(other) => failures.push(format!("{}: unexpected error {other}", case.case)),
        }
    }
    Ok(failures)
}

/// `n` distinct entries `k0: value … k{n-1}: value`.
fn many_entries(n: usize, value: &str) -> Value {
    Value::Object(
        (0..n)
            .map(|i| (format!("k{i}"), Value::from(value)))
            .collect(),
    )
}

/// Caches whose podTemplate, nodeSelector or other tenant-written fields are
/// far larger than any real use: each is something the operator and every
/// agent would otherwise hold in memory whole.
fn oversized_objects() -> Vec<Invalid> {
    let image = "quay.io/gkm/cache-examples:vector-add-cache-cuda";
    let long = "x".repeat(64 * 1024);
    let template = |spec: Value| json!({"image": image, "podTemplate": {"spec": spec}});
    let expression = |values: Value| json!({"key": "k", "operator": "In", "values": values});
    let many_values = Value::from((0..10_000).map(|i| format!("v{i}")).collect::<Vec<_>>());
    let case = |case, spec, field| Invalid {
        case,
        kind: "GKMCache",
        spec,
        field,
    };
    vec![
        case(
            "thousands of podTemplate labels",
            json!({"image": image, "podTemplate": {"metadata": {"labels": many_entries(5000, "v")}}}),
            "spec.podTemplate.metadata.labels",
        ),
        case(
            "thousands of podTemplate annotations",
            json!({"image": image, "podTemplate": {"metadata": {"annotations": many_entries(5000, "v")}}}),
            "spec.podTemplate.metadata.annotations",
        ),
        case(
            "a 1 KiB podTemplate label key",
            json!({"image": image, "podTemplate": {"metadata": {"labels": {"k".repeat(1024): "v"}}}}),
            "spec.podTemplate.metadata.labels",
        ),
        case(
            "a 64 KiB podTemplate annotation",
            json!({"image": image, "podTemplate": {"metadata": {"annotations": {"a": long}}}}),
            "spec.podTemplate.metadata.annotations",
        ),
        case(
            "thousands of podTemplate nodeSelector entries",
            template(json!({"nodeSelector": many_entries(5000, "v")})),
            "spec.podTemplate.spec.nodeSelector",
        ),
        case(
            "thousands of tolerations",
            template(json!({"tolerations": vec![json!({"operator": "Exists"}); 5000]})),
            "spec.podTemplate.spec.tolerations",
        ),
        case(
            "a 64 KiB toleration key",
            template(json!({"tolerations": [{"key": long, "operator": "Exists"}]})),
            "spec.podTemplate.spec.tolerations[0].key",
        ),
        case(
            "a 64 KiB priorityClassName",
            template(json!({"priorityClassName": long})),
            "spec.podTemplate.spec.priorityClassName",
        ),
        case(
            "thousands of node selector terms",
            template(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": vec![json!({"matchExpressions": [expression(json!(["a"]))]}); 5000]}}}}),
            ),
            "spec.podTemplate.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
        ),
        case(
            "ten thousand affinity values",
            template(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expression(many_values.clone())]}]}}}}),
            ),
            "spec.podTemplate.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values",
        ),
        case(
            "a 64 KiB pod affinity topology key",
            template(
                json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": long, "labelSelector": {"matchLabels": {"app": "x"}}}]}}}),
            ),
            "spec.podTemplate.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey",
        ),
        case(
            "thousands of cache nodeSelector labels",
            json!({"image": image, "nodeSelector": {"matchLabels": many_entries(5000, "v")}}),
            "spec.nodeSelector.matchLabels",
        ),
        case(
            "ten thousand cache nodeSelector values",
            json!({"image": image, "nodeSelector": {"matchExpressions": [expression(many_values)]}}),
            "spec.nodeSelector.matchExpressions[0].values",
        ),
    ]
}

/// A tenant cannot make the operator and every agent cache a huge object:
/// every list, map and string a cache's spec carries is bounded in the
/// schema, and the apiserver refuses an oversized one naming the field.
#[tokio::test]
async fn apiserver_refuses_oversized_caches_naming_the_field() -> anyhow::Result<()> {
    let ns = "crd-oversized";
    let client = setup(ns).await?;
    let cases = oversized_objects();
    let failures = unrefused(&client, ns, "crd-oversized", &cases).await?;
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    Ok(())
}

#[tokio::test]
async fn table_response_carries_the_printer_columns() -> anyhow::Result<()> {
    let ns = "crd-table";
    let client = setup(ns).await?;
    let obj = object(
        "GKMCache",
        "tabled",
        json!({"image": "quay.io/gkm/cache-examples:vector-add-cache-cuda"}),
    )?;
    create(&client, &resource::<GKMCache>(), Some(ns), &obj).await??;
    let status = json!({"status": {
        "state": "Running",
        "resolvedDigest": "sha256:0123",
        "counts": {"nodeCnt": 3, "nodeInUseCnt": 1, "nodeNotInUseCnt": 1, "nodeErrorCnt": 1,
                   "podRunningCnt": 2, "podDeletingCnt": 0, "podOutdatedCnt": 1},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Extracted", "message": "",
             "lastTransitionTime": "2026-12-01T10:00:00Z"},
            {"type": "Inert", "status": "True", "reason": "WorkloadsCompile", "message": "",
             "lastTransitionTime": "2026-12-01T10:00:00Z"}
        ]
    }});
    Api::<GKMCache>::namespaced(client.clone(), ns)
        .patch_status("tabled", &PatchParams::default(), &Patch::Merge(&status))
        .await?;

    let request = http::Request::get(format!("/apis/gkm.io/v1alpha1/namespaces/{ns}/gkmcaches"))
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())?;
    let table: Value = serde_json::from_str(&client.request_text(request).await?)?;
    assert_eq!(table["kind"], "Table");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .expect("columnDefinitions")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    for expected in [
        "Name",
        "Status",
        "Nodes",
        "Node-In-Use",
        "Node-Not-In-Use",
        "Node-Error",
        "Pod-Running",
        "Pod-Outdated",
        "Age",
    ] {
        assert!(
            columns.contains(&expected),
            "column {expected} missing from {columns:?}"
        );
    }
    let cells = table["rows"][0]["cells"].as_array().expect("one row");
    let cell = |name: &str| cells[columns.iter().position(|c| *c == name).expect("column")].clone();
    assert_eq!(cell("Name"), "tabled");
    assert_eq!(cell("Status"), "Running");
    assert_eq!(cell("Nodes"), 3);
    assert_eq!(cell("Node-Error"), 1);
    assert_eq!(cell("Pod-Running"), 2);
    assert_eq!(cell("Pod-Outdated"), 1);
    // `-o wide`: whether a workload compiles more than the cache holds.
    assert_eq!(cell("Inert"), "True");
    Ok(())
}

/// The documents of a fixture file under `tests/fixtures/`.
fn fixture_documents(name: &str) -> anyhow::Result<Vec<DynamicObject>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path)?;
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        out.push(DynamicObject::deserialize(doc)?);
    }
    Ok(out)
}

/// Where an object of `kind` is created: its resource and, for namespaced
/// kinds, `ns`.
fn placement<'a>(kind: &str, ns: &'a str) -> (ApiResource, Option<&'a str>) {
    match kind {
        "GKMCache" => (resource::<GKMCache>(), Some(ns)),
        "ClusterGKMCache" => (resource::<ClusterGKMCache>(), None),
        "GKMCacheNode" => (resource::<GKMCacheNode>(), Some(ns)),
        "ClusterGKMCacheNode" => (resource::<crd::ClusterGKMCacheNode>(), None),
        other => panic!("no such kind in the fixtures: {other}"),
    }
}

/// GKM's documented shapes (namespaced and cluster caches, ReadWriteOnce and
/// ReadOnlyMany, podTemplate, the `gkm.io/signature-format` label) and its
/// scaffold samples for node reports (`spec:` empty or left out) are
/// accepted with strict field validation, and read back through the typed
/// API; GKM's cache scaffolds, which have no image and which GKM's own
/// webhook refuses, are refused naming `spec`.
#[tokio::test]
async fn gkm_documented_shapes_and_node_scaffolds_are_accepted() -> anyhow::Result<()> {
    let ns = "crd-gkm-shapes";
    let client = setup(ns).await?;
    let docs = fixture_documents("gkm-shapes.yaml")?;
    assert_eq!(docs.len(), 9);
    let mut failures = Vec::new();
    for obj in &docs {
        let kind = obj
            .types
            .as_ref()
            .map(|t| t.kind.clone())
            .unwrap_or_default();
        let name = obj.metadata.name.clone().unwrap_or_default();
        let (resource, namespace) = placement(&kind, ns);
        if let Err(e) = create(&client, &resource, namespace, obj).await? {
            failures.push(format!("{kind} {name}: {e}"));
        }
    }
    assert!(failures.is_empty(), "refused:\n{}", failures.join("\n"));

    let signed: GKMCache = Api::namespaced(client.clone(), ns)
        .get("matmul-rocm-rwo-rox")
        .await?;
    assert_eq!(
        signed.metadata.labels.unwrap_or_default()["gkm.io/signature-format"],
        "cosign-v2"
    );
    assert_eq!(
        signed.spec.cache.access_modes.map(|m| m.len()),
        Some(2),
        "both access modes kept"
    );
    let nodes: Api<GKMCacheNode> = Api::namespaced(client.clone(), ns);
    for name in ["gkm-shapes-node-scaffold", "gkm-shapes-node-bare"] {
        let node = nodes.get(name).await?;
        assert_eq!(node.spec, crd::GKMCacheNodeSpec {});
    }
    let cluster_nodes: Api<crd::ClusterGKMCacheNode> = Api::all(client.clone());
    let listed = cluster_nodes.list(&Default::default()).await?;
    for name in [
        "gkm-shapes-cluster-node-scaffold",
        "gkm-shapes-cluster-node-bare",
    ] {
        assert!(
            listed
                .items
                .iter()
                .any(|n| n.metadata.name.as_deref() == Some(name)),
            "{name} not listed"
        );
    }

    for obj in fixture_documents("gkm-cache-scaffolds.yaml")? {
        let kind = obj
            .types
            .as_ref()
            .map(|t| t.kind.clone())
            .unwrap_or_default();
        let (resource, namespace) = placement(&kind, ns);
        match create(&client, &resource, namespace, &obj).await? {
            Ok(_) => panic!("{kind} without an image was accepted"),
            Err(kube::Error::Api(status)) => assert!(
                status.message.contains("spec"),
                "{kind}: the refusal does not name spec: {}",
                status.message
            ),
            Err(other) => panic!("{kind}: unexpected error {other}"),
        }
    }
    Ok(())
}
