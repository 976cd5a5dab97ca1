//! What one tenant, or one gkm component's identity, can do to the others,
//! against a real apiserver with the policies and RBAC `deploy/` ships:
//! each test is named after what it defends.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::time::Duration;

use gkm_testenv::{ControlPlane, eventually, service_account_groups, service_account_user};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const SYSTEM: &str = "gkm-system";
/// A tenant's namespace.
const TEAM: &str = "blast-team";
/// The tenant, a user who may create and edit pods in [`TEAM`].
const TENANT: &str = "tenant@example.com";
const ASSIGNMENT: &str = "gkm.io/gpu-assignment";

fn deploy_dir() -> PathBuf {
    gkm_testenv::repo_root().join("deploy")
}

/// Applies `files` (paths under `deploy/`) to the shared control plane,
/// with the tenant's namespace, its `default` ServiceAccount, and the
/// tenant's rights on pods there.
async fn install(files: &[&str]) -> anyhow::Result<(&'static ControlPlane, kube::Client)> {
    let plane = ControlPlane::shared().await?;
    plane
        .apply_file(&deploy_dir().join("namespace.yaml"))
        .await?;
    for file in files {
        plane.apply_file(&deploy_dir().join(file)).await?;
    }
    let admin = plane.client().await?;
    plane.ensure_namespace(TEAM).await?;
    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": "default", "namespace": TEAM}});
    plane.apply_object(&account, false).await?;
    // What a namespace's `edit` role grants on pods (no controller-manager
    // runs here to aggregate the built-in role).
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "tenant-pods", "namespace": TEAM},
        "rules": [{"apiGroups": [""], "resources": ["pods"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}],
    });
    plane.apply_object(&role, false).await?;
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "tenant-pods", "namespace": TEAM},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-pods"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT}],
    });
    plane.apply_object(&binding, false).await?;
    Ok((plane, admin))
}

/// Who a request is made as, through the admin's impersonation.
#[derive(Clone, Copy)]
enum Who<'a> {
    /// A user with no groups beyond `system:authenticated`.
    User(&'a str),
    /// A ServiceAccount of gkm's namespace.
    Account(&'a str),
    /// The admin itself.
    Admin,
}

/// `request` made as `who`: the answer, or the apiserver's refusal.
async fn as_who(
    admin: &kube::Client,
    who: Who<'_>,
    mut request: http::Request<Vec<u8>>,
) -> anyhow::Result<Result<Value, kube::core::Status>> {
    let headers = request.headers_mut();
    match who {
        Who::User(name) => {
            headers.insert("Impersonate-User", name.parse()?);
        }
        Who::Account(name) => {
            headers.insert(
                "Impersonate-User",
                service_account_user(SYSTEM, name).parse()?,
            );
            for group in service_account_groups(SYSTEM) {
                headers.append("Impersonate-Group", group.parse()?);
            }
        }
        Who::Admin => {}
    }
    match admin.request::<Value>(request).await {
        Ok(value) => Ok(Ok(value)),
        Err(kube::Error::Api(status)) => Ok(Err(*status)),
        Err(e) => Err(e.into()),
    }
}

fn pods_path(namespace: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/pods")
}

/// A pod bound to a node by `spec.nodeName` (so no scheduler sees it), with
/// `annotations`.
fn node_pod(name: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TEAM, "annotations": annotations},
        "spec": {
            "nodeName": "gpu-node-1",
            "automountServiceAccountToken": false,
            "containers": [{"name": "main", "image": "busybox",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    })
}

fn create(path: &str, body: &Value) -> anyhow::Result<http::Request<Vec<u8>>> {
    Ok(kube::core::Request::new(path).create(&PostParams::default(), serde_json::to_vec(body)?)?)
}

fn merge(path: &str, name: &str, patch: &Value) -> anyhow::Result<http::Request<Vec<u8>>> {
    Ok(
        kube::core::Request::new(path).patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(patch),
        )?,
    )
}

/// Asserts `result` is the policy's refusal naming who may write the
/// annotation.
fn refused_by_assignment_policy(what: &str, result: Result<Value, kube::core::Status>) {
    match result {
        Err(status)
            if status.code == 403
                && status
                    .message
                    .contains("only gkm-scheduler-extender may set")
                && status.message.contains(ASSIGNMENT) => {}
        other => panic!("{what}: expected the gpu-assignment policy's refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn only_the_scheduler_extender_may_set_a_pods_gpu_assignment() -> anyhow::Result<()> {
    let (_plane, admin) = install(&[
        "scheduler-extender/rbac.yaml",
        "policies/gpu-assignment.yaml",
    ])
    .await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), TEAM);
    let forged = json!({ASSIGNMENT: r#"{"nvidia.com/gpu":["GPU-held-by-another-pod"]}"#});

    // A tenant creates a pod on a node with the GPUs of its choosing. The
    // policy takes effect once the apiserver has loaded it: wait for the
    // refusal, removing any pod that got through before.
    let (tries, got_through) = (Cell::new(0), RefCell::new(String::new()));
    eventually(
        &format!("a tenant's pod with its own {ASSIGNMENT} refused"),
        Duration::from_secs(20),
        || async {
            let name = format!("forged-{}", tries.replace(tries.get() + 1));
            let attempt = as_who(
                &admin,
                Who::User(TENANT),
                create(&pods_path(TEAM), &node_pod(&name, forged.clone()))?,
            )
            .await?;
            match attempt {
                Err(status) if status.code == 403 && status.message.contains(ASSIGNMENT) => {
                    refused_by_assignment_policy("creating a pod with an assignment", Err(status));
                    Ok(Some(()))
                }
                other => {
                    if other.is_ok() {
                        pods.delete(&name, &Default::default()).await?;
                    }
                    *got_through.borrow_mut() = format!("{other:?}");
                    Ok(None)
                }
            }
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: the tenant created one: {}", got_through.borrow()))?;

    // The same pod without the annotation is the tenant's to make.
    as_who(
        &admin,
        Who::User(TENANT),
        create(&pods_path(TEAM), &node_pod("plain", json!({})))?,
    )
    .await?
    .map_err(|s| anyhow::anyhow!("creating a plain pod was refused: {}", s.message))?;

    // Adding one later, through the pod or its status, as the tenant or as
    // a cluster admin: refused.
    let add = json!({"metadata": {"annotations": forged.clone()}});
    refused_by_assignment_policy(
        "a tenant adding an assignment",
        as_who(
            &admin,
            Who::User(TENANT),
            merge(&pods_path(TEAM), "plain", &add)?,
        )
        .await?,
    );
    refused_by_assignment_policy(
        "an admin adding an assignment",
        as_who(&admin, Who::Admin, merge(&pods_path(TEAM), "plain", &add)?).await?,
    );
    let status_path = format!("{}/plain/status", pods_path(TEAM));
    let status_patch = http::Request::patch(format!("/api/v1/namespaces/{TEAM}/pods/plain/status"))
        .header("Content-Type", "application/merge-patch+json")
        .body(serde_json::to_vec(&add)?)?;
    refused_by_assignment_policy(
        &format!("an admin adding an assignment through {status_path}"),
        as_who(&admin, Who::Admin, status_patch).await?,
    );
    // A Binding's annotations are copied onto the pod.
    let unbound = node_pod("unbound", json!({}));
    let mut unbound = unbound;
    unbound["spec"]
        .as_object_mut()
        .map(|s| s.remove("nodeName"));
    as_who(&admin, Who::Admin, create(&pods_path(TEAM), &unbound)?)
        .await?
        .map_err(|s| anyhow::anyhow!("creating an unbound pod was refused: {}", s.message))?;
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "unbound", "annotations": forged.clone()},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1"},
    });
    refused_by_assignment_policy(
        "an admin binding with an assignment",
        as_who(
            &admin,
            Who::Admin,
            create(&format!("{}/unbound/binding", pods_path(TEAM)), &binding)?,
        )
        .await?,
    );

    // The extender writes it (a merge patch, as at bind) and changes it.
    let extender = Who::Account("gkm-scheduler-extender");
    let written = json!({ASSIGNMENT: r#"{"nvidia.com/gpu":["GPU-a"]}"#});
    as_who(
        &admin,
        extender,
        merge(
            &pods_path(TEAM),
            "plain",
            &json!({"metadata": {"annotations": written}}),
        )?,
    )
    .await?
    .map_err(|s| anyhow::anyhow!("the extender's assignment was refused: {}", s.message))?;
    let annotations = pods
        .get("plain")
        .await?
        .metadata
        .annotations
        .unwrap_or_default();
    assert_eq!(
        annotations.get(ASSIGNMENT).map(String::as_str),
        Some(r#"{"nvidia.com/gpu":["GPU-a"]}"#)
    );

    // The tenant keeps editing its pod otherwise, but may not change or
    // remove the assignment.
    as_who(
        &admin,
        Who::User(TENANT),
        merge(
            &pods_path(TEAM),
            "plain",
            &json!({"metadata": {"labels": {"team": "ml"}}}),
        )?,
    )
    .await?
    .map_err(|s| anyhow::anyhow!("labelling its own pod was refused: {}", s.message))?;
    for (what, value) in [
        ("changing", json!(r#"{"nvidia.com/gpu":["GPU-b"]}"#)),
        ("removing", Value::Null),
    ] {
        refused_by_assignment_policy(
            &format!("a tenant {what} the assignment"),
            as_who(
                &admin,
                Who::User(TENANT),
                merge(
                    &pods_path(TEAM),
                    "plain",
                    &json!({"metadata": {"annotations": {ASSIGNMENT: value}}}),
                )?,
            )
            .await?,
        );
    }
    Ok(())
}

#[tokio::test]
async fn the_scheduler_extenders_identity_may_change_only_a_pods_gpu_assignment()
-> anyhow::Result<()> {
    let (_plane, admin) = install(&[
        "scheduler-extender/rbac.yaml",
        "policies/gpu-assignment.yaml",
    ])
    .await?;
    let extender = Who::Account("gkm-scheduler-extender");
    let mut pod = node_pod("extender-scope", json!({"team.example/owner": "ml"}));
    pod["metadata"]["labels"] = json!({"app": "train"});
    as_who(&admin, Who::Admin, create(&pods_path(TEAM), &pod)?)
        .await?
        .map_err(|s| anyhow::anyhow!("creating the pod was refused: {}", s.message))?;
    let refused_naming_extender =
        |what: &str, result: Result<Value, kube::core::Status>| match result {
            Err(status)
                if status.code == 403
                    && status
                        .message
                        .contains("gkm-scheduler-extender may change only") => {}
            other => panic!("{what}: expected the extender-scope policy's refusal, got {other:?}"),
        };

    // Relabelling the pod (into another Service's selector, say) with the
    // extender's token: refused once the policy is loaded.
    let relabel = json!({"metadata": {"labels": {"app": "payments"}}});
    let got_through = RefCell::new(String::new());
    eventually(
        "the extender's identity refused relabelling a pod",
        Duration::from_secs(20),
        || async {
            match as_who(
                &admin,
                extender,
                merge(&pods_path(TEAM), "extender-scope", &relabel)?,
            )
            .await?
            {
                Err(status)
                    if status.code == 403
                        && status
                            .message
                            .contains("gkm-scheduler-extender may change only") =>
                {
                    Ok(Some(()))
                }
                other => {
                    if other.is_ok() {
                        let back = json!({"metadata": {"labels": {"app": "train"}}});
                        as_who(
                            &admin,
                            Who::Admin,
                            merge(&pods_path(TEAM), "extender-scope", &back)?,
                        )
                        .await?
                        .map_err(|s| anyhow::anyhow!("relabelling back: {}", s.message))?;
                    }
                    *got_through.borrow_mut() = format!("{other:?}");
                    Ok(None)
                }
            }
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: it was relabelled: {}", got_through.borrow()))?;

    // What the extender writes at bind: the assignment, by a merge patch.
    let written = json!({ASSIGNMENT: r#"{"gkm.io/gpu-shares":["GPU-a"]}"#});
    as_who(
        &admin,
        extender,
        merge(
            &pods_path(TEAM),
            "extender-scope",
            &json!({"metadata": {"annotations": written}}),
        )?,
    )
    .await?
    .map_err(|s| anyhow::anyhow!("the extender's assignment was refused: {}", s.message))?;

    // Anything else: refused.
    for (what, patch) in [
        (
            "another annotation changed",
            json!({"metadata": {"annotations": {"team.example/owner": "someone-else"}}}),
        ),
        (
            "an annotation added",
            json!({"metadata": {"annotations": {"prometheus.io/scrape": "true"}}}),
        ),
        (
            "an annotation removed",
            json!({"metadata": {"annotations": {"team.example/owner": null}}}),
        ),
        (
            "a label removed",
            json!({"metadata": {"labels": {"app": null}}}),
        ),
        (
            "a finalizer added",
            json!({"metadata": {"finalizers": ["example.com/hold"]}}),
        ),
        (
            "the spec changed",
            json!({"spec": {"activeDeadlineSeconds": 1}}),
        ),
        (
            "the assignment with another annotation",
            json!({"metadata": {"annotations": {
                ASSIGNMENT: r#"{"gkm.io/gpu-shares":["GPU-b"]}"#,
                "team.example/owner": "someone-else"}}}),
        ),
    ] {
        refused_naming_extender(
            what,
            as_who(
                &admin,
                extender,
                merge(&pods_path(TEAM), "extender-scope", &patch)?,
            )
            .await?,
        );
    }

    // A Binding carrying annotations (copied onto the pod): refused.
    let mut unbound = node_pod("extender-scope-unbound", json!({}));
    unbound["spec"]
        .as_object_mut()
        .map(|s| s.remove("nodeName"));
    as_who(&admin, Who::Admin, create(&pods_path(TEAM), &unbound)?)
        .await?
        .map_err(|s| anyhow::anyhow!("creating an unbound pod was refused: {}", s.message))?;
    let mut binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "extender-scope-unbound",
                     "annotations": {"team.example/owner": "someone-else"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1"},
    });
    let binding_path = format!("{}/extender-scope-unbound/binding", pods_path(TEAM));
    refused_naming_extender(
        "a Binding carrying another annotation",
        as_who(&admin, extender, create(&binding_path, &binding)?).await?,
    );
    // Its own Binding, as it makes them: bound.
    binding["metadata"]
        .as_object_mut()
        .map(|m| m.remove("annotations"));
    as_who(&admin, extender, create(&binding_path, &binding)?)
        .await?
        .map_err(|s| anyhow::anyhow!("the extender's Binding was refused: {}", s.message))?;

    let current = Api::<Pod>::namespaced(admin.clone(), TEAM)
        .get("extender-scope")
        .await?;
    let labels = current.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("app").map(String::as_str), Some("train"));
    let annotations = current.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("team.example/owner").map(String::as_str),
        Some("ml")
    );
    Ok(())
}

/// Creates (or replaces) Nodes `names`, each labelled `team: a`.
async fn nodes(admin: &kube::Client, names: &[&str]) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(admin.clone());
    for name in names {
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"team": "a"}}}))?;
        api.patch(
            name,
            &PatchParams::apply("gkm-blast-radius-test"),
            &Patch::Apply(&node),
        )
        .await?;
    }
    Ok(())
}

/// The device plugin's ServiceAccount on `node` (its token's node-name
/// claim), or with no claim.
async fn as_device_plugin(
    admin: &kube::Client,
    node: Option<&str>,
    mut request: http::Request<Vec<u8>>,
) -> anyhow::Result<Result<Value, kube::core::Status>> {
    if let Some(node) = node {
        request.headers_mut().insert(
            "Impersonate-Extra-authentication.kubernetes.io%2Fnode-name",
            node.parse()?,
        );
    }
    as_who(admin, Who::Account("gkm-device-plugin"), request).await
}

#[tokio::test]
async fn the_device_plugin_may_write_only_its_own_nodes_gpu_devices() -> anyhow::Result<()> {
    let (_plane, admin) = install(&[
        "rbac/device-plugin.yaml",
        "policies/device-plugin-own-node.yaml",
    ])
    .await?;
    let (own, other) = ("dp-own-node", "dp-other-node");
    nodes(&admin, &[own, other]).await?;
    let api: Api<Node> = Api::all(admin.clone());
    let devices = |value: &str| json!({"metadata": {"annotations": {"gkm.io/gpu-devices": value}}});

    // The policy takes effect once the apiserver has loaded it: wait until
    // the other node's annotation is refused, undoing writes that got
    // through before.
    let wrote = RefCell::new(String::new());
    eventually(
        &format!("the device plugin of {own} refused writing node {other}"),
        Duration::from_secs(20),
        || async {
            let attempt = as_device_plugin(
                &admin,
                Some(own),
                merge("/api/v1/nodes", other, &devices(r#"[{"id":"GPU-x"}]"#))?,
            )
            .await?;
            match attempt {
                Err(status) if status.code == 403 && status.message.contains("only its own") => {
                    Ok(Some(()))
                }
                other_result => {
                    let undo = json!({"metadata": {"annotations": {"gkm.io/gpu-devices": null}}});
                    api.patch(other, &PatchParams::default(), &Patch::Merge(&undo))
                        .await?;
                    *wrote.borrow_mut() = format!("{other_result:?}");
                    Ok(None)
                }
            }
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: it wrote it: {}", wrote.borrow()))?;

    // Its own node's gkm.io/gpu-devices, as it publishes it: allowed.
    let published = r#"[{"id":"0000:40:00.0","cores":100,"memory":1024}]"#;
    as_device_plugin(
        &admin,
        Some(own),
        merge("/api/v1/nodes", own, &devices(published))?,
    )
    .await?
    .map_err(|s| anyhow::anyhow!("publishing its node's GPUs was refused: {}", s.message))?;
    let annotations = api.get(own).await?.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("gkm.io/gpu-devices").map(String::as_str),
        Some(published)
    );

    // Anything else: refused, naming gkm-device-plugin.
    let refused: Vec<(&str, Option<&str>, &str, Value)> = vec![
        ("another node's GPUs", Some(own), other, devices("[]")),
        (
            "a taint on its own node",
            Some(own),
            own,
            json!({"spec": {"taints": [{"key": "evict", "effect": "NoExecute"}]}}),
        ),
        (
            "cordoning its own node",
            Some(own),
            own,
            json!({"spec": {"unschedulable": true}}),
        ),
        (
            "a label on its own node",
            Some(own),
            own,
            json!({"metadata": {"labels": {"team": "b"}}}),
        ),
        (
            "another annotation on its own node",
            Some(own),
            own,
            json!({"metadata": {"annotations": {"x": "y"}}}),
        ),
        (
            "its GPUs without a node-name claim",
            None,
            own,
            devices("[]"),
        ),
    ];
    for (what, claim, node, patch) in refused {
        match as_device_plugin(&admin, claim, merge("/api/v1/nodes", node, &patch)?).await? {
            Err(status) if status.code == 403 && status.message.contains("gkm-device-plugin") => {}
            other_result => {
                panic!("{what}: expected a refusal naming gkm-device-plugin, got {other_result:?}")
            }
        }
    }
    // (The apiserver itself taints a new Node not-ready.)
    let other_node = api.get(other).await?;
    let taints = other_node.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(!taints.iter().any(|t| t.key == "evict"), "{taints:?}");
    let own_node = api.get(own).await?;
    assert_eq!(own_node.spec.and_then(|s| s.unschedulable), None);
    assert_eq!(
        own_node
            .metadata
            .labels
            .unwrap_or_default()
            .get("team")
            .map(String::as_str),
        Some("a")
    );
    Ok(())
}

/// A request to create `body` under `path` as the operator's ServiceAccount.
async fn as_operator(
    admin: &kube::Client,
    path: &str,
    body: &Value,
) -> anyhow::Result<Result<Value, kube::core::Status>> {
    as_who(admin, Who::Account("gkm-operator"), create(path, body)?).await
}

fn refused_naming_operator(what: &str, result: Result<Value, kube::core::Status>) {
    match result {
        Err(status) if status.code == 403 && status.message.contains("gkm-operator may") => {}
        other => panic!("{what}: expected the operator-scope policy's refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn the_operator_may_create_only_fill_jobs_its_own_volumes_and_its_webhook()
-> anyhow::Result<()> {
    use gkm_k8s_api::cache_object::CacheKey;
    use gkm_k8s_api::crd::{AccessMode, CacheSpec};
    use gkm_k8s_operator::cache::pvc::objects::{PvcOptions, job, volume};
    use gkm_k8s_operator::cache::pvc::plan::ClaimPlan;

    let (_plane, admin) = install(&["rbac/operator.yaml", "policies/operator-scope.yaml"]).await?;
    let jobs_path = format!("/apis/batch/v1/namespaces/{TEAM}/jobs");
    let escape = |name: &str| {
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": TEAM},
            "spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "x", "image": "busybox", "command": ["chroot", "/host"],
                                "securityContext": {"privileged": true},
                                "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
                "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
            }}},
        })
    };

    // A privileged Job mounting the node's root, made with the operator's
    // token. The policy takes effect once the apiserver has loaded it.
    let (tries, created) = (Cell::new(0), RefCell::new(String::new()));
    eventually(
        "the operator's identity refused a privileged hostPath Job",
        Duration::from_secs(20),
        || async {
            let name = format!("escape-{}", tries.replace(tries.get() + 1));
            match as_operator(&admin, &jobs_path, &escape(&name)).await? {
                Err(status)
                    if status.code == 403 && status.message.contains("gkm-operator may") =>
                {
                    Ok(Some(()))
                }
                other => {
                    if other.is_ok() {
                        let background = kube::api::DeleteParams::background();
                        Api::<k8s_openapi::api::batch::v1::Job>::namespaced(admin.clone(), TEAM)
                            .delete(&name, &background)
                            .await?;
                    }
                    *created.borrow_mut() = format!("{other:?}");
                    Ok(None)
                }
            }
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: it created one: {}", created.borrow()))?;

    // What the operator itself makes for a ReadWriteOnce cache filled into
    // gkm-made volumes: allowed.
    let key = CacheKey::namespaced(TEAM, "vector-add");
    let spec = CacheSpec {
        image: "registry.example.com/caches/vector-add:v1".into(),
        storage_class_name: Some("gkm-local".into()),
        access_modes: Some(vec![AccessMode::ReadWriteOnce]),
        ..CacheSpec::default()
    };
    let plan = ClaimPlan {
        namespace: TEAM.into(),
        name: "vector-add-node-1".into(),
        node: Some("node-1".into()),
        volume: Some("gkm-0123456789".into()),
        job: Some("vector-add-fill-0123".into()),
        fill_digest: None,
    };
    // With registry mirrors: the fill Job carries its registry's host file.
    let options = PvcOptions {
        volume_dir: Some("/var/lib/gkm/volumes".into()),
        registry_hosts: gkm_oci::mirrors::HostsConfig::Text(
            "[host.\"http://127.0.0.1:30020\"]\n  capabilities = [\"pull\"]\n".into(),
        ),
        ..PvcOptions::default()
    };
    let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let image = format!("registry.example.com/caches/vector-add@{digest}");
    let fill = job(&key, &spec, &plan, digest, &image, &options)
        .ok_or_else(|| anyhow::anyhow!("no fill Job planned"))?;
    as_operator(&admin, &jobs_path, &fill)
        .await?
        .map_err(|s| anyhow::anyhow!("the operator's fill Job was refused: {}", s.message))?;
    let made =
        volume(&key, &spec, &plan, &options).ok_or_else(|| anyhow::anyhow!("no volume planned"))?;
    as_operator(&admin, "/api/v1/persistentvolumes", &made)
        .await?
        .map_err(|s| anyhow::anyhow!("the operator's volume was refused: {}", s.message))?;

    // Jobs that are not fill Jobs, and volumes that are not its own: refused.
    let mut shell = fill.clone();
    shell["metadata"]["name"] = json!("fill-with-a-shell");
    shell["spec"]["template"]["spec"]["containers"][0]["command"] = json!(["/bin/sh", "-c", "id"]);
    let mut other_image = fill.clone();
    other_image["metadata"]["name"] = json!("fill-other-image");
    other_image["spec"]["template"]["spec"]["containers"][0]["image"] = json!("busybox");
    let mut with_token = fill.clone();
    with_token["metadata"]["name"] = json!("fill-with-a-token");
    with_token["spec"]["template"]["spec"]["automountServiceAccountToken"] = json!(true);
    with_token["spec"]["template"]["spec"]["serviceAccountName"] = json!("admin");
    let mut host_pid = fill.clone();
    host_pid["metadata"]["name"] = json!("fill-host-pid");
    host_pid["spec"]["template"]["spec"]["hostPID"] = json!(true);
    let mut secret_env = fill.clone();
    secret_env["metadata"]["name"] = json!("fill-secret-env");
    secret_env["spec"]["template"]["spec"]["containers"][0]["env"] = json!([{
        "name": "GKM_REGISTRY_HOSTS",
        "valueFrom": {"secretKeyRef": {"name": "someone-elses", "key": "token"}},
    }]);
    let mut host_network = fill.clone();
    host_network["metadata"]["name"] = json!("fill-host-network");
    host_network["spec"]["template"]["spec"]["hostNetwork"] = json!(true);
    let mut extra_mount = fill.clone();
    extra_mount["metadata"]["name"] = json!("fill-extra-mount");
    extra_mount["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = json!([
        {"name": "cache", "mountPath": "/cache"},
        {"name": "cache", "mountPath": "/other", "subPath": "other-cache"},
    ]);
    let mut sub_path = fill.clone();
    sub_path["metadata"]["name"] = json!("fill-sub-path");
    sub_path["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "cache", "mountPath": "/cache", "subPath": "another-caches-tree"}]);
    let mut other_claim = fill.clone();
    other_claim["metadata"]["name"] = json!("fill-two-claims");
    other_claim["spec"]["template"]["spec"]["volumes"] = json!([
        {"name": "cache", "persistentVolumeClaim": {"claimName": "vector-add-node-1"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "someone-elses-data"}},
    ]);
    let mut extra_args = fill.clone();
    extra_args["metadata"]["name"] = json!("fill-extra-args");
    extra_args["spec"]["template"]["spec"]["containers"][0]["args"] = json!([
        "fill",
        "--image=registry.example.com/evil@sha256:00",
        "--into=/cache",
        "--into=/other"
    ]);
    let mut other_into = fill.clone();
    other_into["metadata"]["name"] = json!("fill-other-into");
    other_into["spec"]["template"]["spec"]["containers"][0]["args"][2] = json!("--into=/tmp");
    let mut host_port = fill.clone();
    host_port["metadata"]["name"] = json!("fill-host-port");
    host_port["spec"]["template"]["spec"]["containers"][0]["ports"] =
        json!([{"containerPort": 22, "hostPort": 22}]);
    for (what, body) in [
        ("a privileged hostPath Job", escape("escape")),
        ("a fill Job in the host's network", host_network),
        ("a fill Job mounting its claim twice", extra_mount),
        ("a fill Job mounting a subPath", sub_path),
        ("a fill Job mounting another claim", other_claim),
        ("a fill Job with extra arguments", extra_args),
        ("a fill Job filling elsewhere", other_into),
        ("a fill Job with a host port", host_port),
        ("a fill Job with a shell", shell),
        ("a Job of another image", other_image),
        ("a Job with a ServiceAccount token", with_token),
        ("a Job in the host's PID namespace", host_pid),
        (
            "a fill Job reading a Secret into its environment",
            secret_env,
        ),
    ] {
        refused_naming_operator(what, as_operator(&admin, &jobs_path, &body).await?);
    }
    let mut etc = made.clone();
    etc["metadata"]["name"] = json!("gkm-aaaaaaaaaa");
    etc["spec"]["hostPath"]["path"] = json!("/etc");
    let mut named = made.clone();
    named["metadata"]["name"] = json!("data");
    named["spec"]["hostPath"]["path"] = json!("/var/lib/gkm/volumes/data");
    for (what, body) in [
        ("a volume of /etc", etc),
        ("a volume not named gkm-<hash>", named),
    ] {
        refused_naming_operator(
            what,
            as_operator(&admin, "/api/v1/persistentvolumes", &body).await?,
        );
    }

    // A webhook configuration sending every pod elsewhere: refused (by RBAC
    // where the operator may not create webhook configurations at all).
    let hook = |name: &str| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "pods.evil.example", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "clientConfig": {"url": "https://evil.example/mutate"},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            }],
        })
    };
    for name in ["gkm-pvc-mutation", "gkm-image-volume", "evil"] {
        let path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";
        match as_operator(&admin, path, &hook(name)).await? {
            Err(status) if status.code == 403 => {}
            other => {
                panic!("webhook configuration {name} to a URL: expected a refusal, got {other:?}")
            }
        }
    }

    // The chart's GPU-quota webhook configuration: the operator may write
    // its caBundle, and nothing else of it. (Its namespaceSelector here
    // matches no namespace, so it judges nothing in these tests.)
    use gkm_k8s_operator::admission::Endpoint;
    use gkm_k8s_operator::admission::quota::{QUOTA_CONFIGURATION_NAME, quota_configuration};
    let service = Endpoint::Service {
        namespace: SYSTEM.into(),
        name: "gkm-operator-webhook".into(),
        port: 443,
    };
    let mut quota = quota_configuration(&service, SYSTEM, None);
    quota["webhooks"][0]["namespaceSelector"] =
        json!({"matchLabels": {"gkm.io/test": "no-namespace-has-this"}});
    _plane.apply_object(&quota, false).await?;
    let quota_path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
    let strategic = |patch: &Value| -> anyhow::Result<http::Request<Vec<u8>>> {
        Ok(kube::core::Request::new(quota_path).patch(
            QUOTA_CONFIGURATION_NAME,
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )?)
    };
    let webhook = quota["webhooks"][0]["name"].clone();
    let ca_bundle = json!({"webhooks": [{"name": webhook, "clientConfig": {"caBundle": "UEVN"}}]});
    as_who(&admin, Who::Account("gkm-operator"), strategic(&ca_bundle)?)
        .await?
        .map_err(|s| anyhow::anyhow!("the operator's caBundle patch was refused: {}", s.message))?;
    for (what, patch) in [
        (
            "the quota webhook sent to a URL",
            json!({"webhooks": [{"name": webhook, "clientConfig": {
                "service": null, "url": "https://evil.example/validate"}}]}),
        ),
        (
            "the quota webhook failing open",
            json!({"webhooks": [{"name": webhook, "failurePolicy": "Ignore"}]}),
        ),
        (
            "the quota webhook judging no pod",
            json!({"webhooks": [{"name": webhook, "rules": []}]}),
        ),
    ] {
        refused_naming_operator(
            what,
            as_who(&admin, Who::Account("gkm-operator"), strategic(&patch)?).await?,
        );
    }
    let mut evil = quota.clone();
    evil["metadata"]["name"] = json!("evil");
    match as_operator(&admin, quota_path, &evil).await? {
        Err(status) if status.code == 403 => {}
        other => panic!(
            "a validating webhook configuration of its own: expected a refusal, got {other:?}"
        ),
    }
    Ok(())
}

#[tokio::test]
async fn the_operator_may_create_capture_jobs_only_as_it_makes_them() -> anyhow::Result<()> {
    use gkm_k8s_api::crd::{CaptureSigning, GKMCacheCapture, GKMCacheCaptureSpec};
    use gkm_k8s_operator::capture::job::{CapturedPod, Harvest, JobOptions, job, job_harvesting};
    use kube::CustomResourceExt;

    let (plane, admin) = install(&["rbac/operator.yaml", "policies/operator-scope.yaml"]).await?;
    plane.install_crds(&[GKMCacheCapture::crd()]).await?;
    let jobs_path = format!("/apis/batch/v1/namespaces/{TEAM}/jobs");
    let mut capture = GKMCacheCapture::new(
        "warm",
        GKMCacheCaptureSpec {
            target_image: "registry.example.com/team/llama:h100".into(),
            signing: CaptureSigning {
                secret_name: "signing".into(),
                ..CaptureSigning::default()
            },
            registry_credentials_secret: Some("push".into()),
            ..GKMCacheCaptureSpec::default()
        },
    );
    capture.metadata.namespace = Some(TEAM.into());
    capture.metadata.uid = Some("0f8e2a2c-8d5b-4c1e-9d7e-3a1b2c3d4e5f".into());
    // The image the chart renders deploy/ with.
    let options = JobOptions {
        image: format!("ghcr.io/gkm-rs/gkm:v{}", env!("CARGO_PKG_VERSION")),
        image_pull_policy: gkm_k8s_operator::job_pod::ImagePullPolicy::IfNotPresent,
        host_network: false,
    };
    let pod = CapturedPod {
        uid: "6f1c2a7e-1111-2222-3333-444455556666",
        node: "node-1",
        tolerations: json!([]),
    };
    let made = |name: &str| {
        job(&capture, name, &pod, &options).ok_or_else(|| anyhow::anyhow!("no capture Job"))
    };

    // A capture Job with a hostPath volume: refused, once the policy is
    // loaded.
    let (tries, created) = (Cell::new(0), RefCell::new(String::new()));
    eventually(
        "the operator's identity refused a capture Job mounting the host",
        Duration::from_secs(20),
        || async {
            let name = format!("capture-host-{}", tries.replace(tries.get() + 1));
            let mut host = made(&name)?;
            host["spec"]["template"]["spec"]["volumes"][0] =
                json!({"name": "tree", "hostPath": {"path": "/"}});
            match as_operator(&admin, &jobs_path, &host).await? {
                Err(status)
                    if status.code == 403 && status.message.contains("gkm-operator may") =>
                {
                    assert!(
                        status.message.contains("capture Jobs"),
                        "{}",
                        status.message
                    );
                    Ok(Some(()))
                }
                other => {
                    if other.is_ok() {
                        let background = kube::api::DeleteParams::background();
                        Api::<k8s_openapi::api::batch::v1::Job>::namespaced(admin.clone(), TEAM)
                            .delete(&name, &background)
                            .await?;
                    }
                    *created.borrow_mut() = format!("{other:?}");
                    Ok(None)
                }
            }
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: it created one: {}", created.borrow()))?;

    // What the operator makes: allowed.
    as_operator(&admin, &jobs_path, &made("capture-warm-1")?)
        .await?
        .map_err(|s| anyhow::anyhow!("the operator's capture Job was refused: {}", s.message))?;
    let delta = |name: &str| {
        job_harvesting(&capture, name, &pod, Harvest::Delta, &options)
            .ok_or_else(|| anyhow::anyhow!("no delta capture Job"))
    };
    as_operator(&admin, &jobs_path, &delta("capture-delta-1")?)
        .await?
        .map_err(|s| {
            anyhow::anyhow!(
                "the operator's delta capture Job was refused: {}",
                s.message
            )
        })?;

    // Anything else of that shape: refused.
    let changed = |name: &str, change: &dyn Fn(&mut Value)| -> anyhow::Result<Value> {
        let mut job = made(name)?;
        change(&mut job["spec"]["template"]["spec"]);
        Ok(job)
    };
    let cases: Vec<(&str, Value)> = vec![
        (
            "a capture Job running a shell",
            changed("capture-shell", &|p| {
                p["containers"][0]["command"] = json!(["/bin/sh", "-c", "cat /signing/key"])
            })?,
        ),
        (
            "a capture Job of another image",
            changed("capture-image", &|p| {
                p["containers"][0]["image"] = json!("busybox")
            })?,
        ),
        (
            "a capture Job writing the captured tree",
            changed("capture-writable", &|p| {
                p["volumes"][0]["csi"]["readOnly"] = json!(false)
            })?,
        ),
        (
            "a capture Job mounting a claim",
            changed(
                "capture-claim",
                &|p| {
                    p["volumes"][2] =
                        json!({"name": "work", "persistentVolumeClaim": {"claimName": "data"}})
                },
            )?,
        ),
        (
            "a capture Job with a ServiceAccount token",
            changed("capture-token", &|p| {
                p["automountServiceAccountToken"] = json!(true)
            })?,
        ),
        (
            "a capture Job reading another Secret into its environment",
            changed("capture-env", &|p| {
                p["containers"][0]["env"] = json!([{"name": "TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": "signing", "key": "cosign.key"}}}])
            })?,
        ),
        (
            "a capture Job running as root",
            changed("capture-root", &|p| {
                p["securityContext"]["runAsNonRoot"] = json!(false)
            })?,
        ),
        (
            "a capture Job adding a capability",
            changed("capture-capability", &|p| {
                p["containers"][0]["securityContext"]["capabilities"] =
                    json!({"add": ["SYS_ADMIN"]})
            })?,
        ),
        (
            "a capture Job in the host's network",
            changed("capture-host-network", &|p| p["hostNetwork"] = json!(true))?,
        ),
        (
            "a capture Job mounting the signing key where it writes",
            changed("capture-extra-mount", &|p| {
                if let Some(m) = p["containers"][0]["volumeMounts"].as_array_mut() {
                    m.push(json!({"name": "signing", "mountPath": "/tmp/key"}));
                }
            })?,
        ),
        (
            "a capture Job mounting its tree writable",
            changed("capture-tree-writable", &|p| {
                p["containers"][0]["volumeMounts"][0]["readOnly"] = json!(false)
            })?,
        ),
        (
            "a capture Job with an extra argument",
            changed("capture-extra-args", &|p| {
                if let Some(a) = p["containers"][0]["args"].as_array_mut() {
                    a.push(json!("--key=/capture/stolen.key"));
                }
            })?,
        ),
        ("a delta capture Job reading its base from elsewhere", {
            let mut job = delta("capture-delta-record")?;
            job["spec"]["template"]["spec"]["containers"][0]["args"][8] =
                json!("--delta-base-record=/tmp/base.json");
            job
        }),
        (
            "a capture Job harvesting the upper without its base",
            changed("capture-upper-alone", &|p| {
                p["containers"][0]["args"][1] = json!("/capture/upper")
            })?,
        ),
        (
            "a capture Job reading its key from the captured tree",
            changed("capture-other-key", &|p| {
                p["containers"][0]["args"][3] = json!("--key=/capture/key")
            })?,
        ),
        (
            "a capture Job with a host port",
            changed("capture-host-port", &|p| {
                p["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 80}])
            })?,
        ),
        ("a capture Job owned by nothing", {
            let mut job = made("capture-unowned")?;
            job["metadata"]
                .as_object_mut()
                .map(|m| m.remove("ownerReferences"));
            job
        }),
    ];
    for (what, body) in cases {
        refused_naming_operator(what, as_operator(&admin, &jobs_path, &body).await?);
    }
    Ok(())
}

/// Whether `user` may `verb` `resource` (`resource[/subresource]` of
/// `gkm.io`) in the tenant's namespace, by a SubjectAccessReview.
async fn may(admin: &kube::Client, user: &str, verb: &str, resource: &str) -> anyhow::Result<bool> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_string())),
        None => (resource, None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            groups: Some(vec!["system:authenticated".into()]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some("gkm.io".into()),
                resource: Some(resource.into()),
                subresource,
                namespace: Some(TEAM.into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let reviewed = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(reviewed.status.is_some_and(|s| s.allowed))
}

#[tokio::test]
async fn tenants_edit_their_caches_but_not_quotas_reports_or_status() -> anyhow::Result<()> {
    // A control plane of its own, whose controller-manager aggregates the
    // built-in roles.
    let plane = ControlPlane::start_with(gkm_testenv::ControlPlaneOptions {
        controller_manager: true,
        extra_controllers: vec!["clusterrole-aggregation-controller".into()],
        ..Default::default()
    })
    .await?;
    plane
        .apply_file(&deploy_dir().join("rbac/tenant-roles.yaml"))
        .await?;
    plane.ensure_namespace(TEAM).await?;
    let admin = plane.client().await?;
    let (viewer, editor) = ("viewer@example.com", "editor@example.com");
    for (user, role) in [(viewer, "view"), (editor, "edit")] {
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": role, "namespace": TEAM},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        });
        plane.apply_object(&binding, false).await?;
    }

    // The built-in roles take gkm's rules in once the controller has
    // aggregated them.
    eventually(
        "a namespace's edit role creating GKMCaches and its view role listing GKMGPUQuotas",
        Duration::from_secs(30),
        || async {
            Ok((may(&admin, editor, "create", "gkmcaches").await?
                && may(&admin, viewer, "list", "gkmgpuquotas").await?)
                .then_some(()))
        },
    )
    .await?;

    let table: &[(&str, &str, &str, bool)] = &[
        (viewer, "get", "gkmcaches", true),
        (viewer, "watch", "gkmcachereleases", true),
        (viewer, "watch", "gkmcachenodes", true),
        (viewer, "get", "gkmgpuquotas/status", true),
        (viewer, "create", "gkmcaches", false),
        (viewer, "patch", "gkmcaches", false),
        (editor, "list", "gkmcaches", true),
        (editor, "create", "gkmcaches", true),
        (editor, "patch", "gkmcaches", true),
        (editor, "delete", "gkmcaches", true),
        (editor, "get", "gkmcachenodes", true),
        (editor, "patch", "gkmcaches/status", false),
        (editor, "update", "gkmcaches/status", false),
        (editor, "get", "gkmcachereleases", true),
        (editor, "create", "gkmcachereleases", false),
        (editor, "patch", "gkmcachereleases", false),
        (editor, "delete", "gkmcachereleases", false),
        (editor, "create", "gkmcachenodes", false),
        (editor, "patch", "gkmcachenodes", false),
        (editor, "patch", "gkmcachenodes/status", false),
        (editor, "delete", "gkmcachenodes", false),
        (editor, "create", "gkmgpuquotas", false),
        (editor, "patch", "gkmgpuquotas", false),
        (editor, "patch", "gkmgpuquotas/status", false),
        (editor, "delete", "gkmgpuquotas", false),
        (viewer, "watch", "gkmcachecaptures", true),
        (viewer, "create", "gkmcachecaptures", false),
        (editor, "create", "gkmcachecaptures", true),
        (editor, "delete", "gkmcachecaptures", true),
        (editor, "patch", "gkmcachecaptures/status", false),
    ];
    let mut wrong = Vec::new();
    for (user, verb, resource, expected) in table {
        let got = may(&admin, user, verb, resource).await?;
        if got != *expected {
            wrong.push(format!(
                "{user}: {verb} {resource}: {got}, must be {expected}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "tenant access differs:\n{}",
        wrong.join("\n")
    );
    Ok(())
}

/// Deleting the tenant's pod `name`.
fn delete_pod(name: &str) -> anyhow::Result<http::Request<Vec<u8>>> {
    Ok(kube::core::Request::new(pods_path(TEAM)).delete(name, &DeleteParams::default())?)
}

/// The tenant's first pod made by `pod` (named after `policy`) that `policy`
/// refuses: a policy takes effect once the apiserver has loaded it, so
/// pods that got through before are removed and another is tried. A
/// refusal by anything else fails.
async fn first_refusal_by(
    admin: &kube::Client,
    policy: &str,
    what: &str,
    pod: impl Fn(&str) -> Value,
) -> anyhow::Result<kube::core::Status> {
    let tries = Cell::new(0);
    eventually(
        &format!("{what} refused by {policy}"),
        Duration::from_secs(20),
        || async {
            let name = format!("{policy}-{}", tries.replace(tries.get() + 1));
            match as_who(
                admin,
                Who::User(TENANT),
                create(&pods_path(TEAM), &pod(&name))?,
            )
            .await?
            {
                Err(status) if status.message.contains(policy) => Ok(Some(status)),
                Err(status) => anyhow::bail!("refused for another reason: {}", status.message),
                Ok(_) => {
                    as_who(admin, Who::Admin, delete_pod(&name)?).await?.ok();
                    Ok(None)
                }
            }
        },
    )
    .await
}

/// A pod in the tenant's namespace mounting a `csi.gkm.io` cache volume
/// that names `mount_path` at `mounts` (container name, path, subPath).
fn cache_mount_pod(
    name: &str,
    mount_path: Option<&str>,
    mounts: &[(&str, &str, Option<&str>)],
) -> Value {
    let mut attributes = json!({"csi.gkm.io/GKMCache": "vector-add"});
    if let Some(path) = mount_path {
        attributes["csi.gkm.io/mountPath"] = json!(path);
    }
    let containers: Vec<Value> = mounts
        .iter()
        .map(|(container, path, sub_path)| {
            let mut mount = json!({"name": "kernels", "mountPath": path});
            if let Some(sub) = sub_path {
                mount["subPath"] = json!(sub);
            }
            json!({"name": container, "image": "busybox", "volumeMounts": [mount]})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {
            "nodeName": "gpu-node-1",
            "automountServiceAccountToken": false,
            "containers": containers,
            "volumes": [{"name": "kernels", "csi": {"driver": "csi.gkm.io",
                                                    "volumeAttributes": attributes}}],
        },
    })
}

#[tokio::test]
async fn a_pod_cannot_tell_the_csi_driver_a_mount_path_it_does_not_mount_its_cache_at()
-> anyhow::Result<()> {
    let (_plane, admin) = install(&["policies/cache-mount-path.yaml"]).await?;
    let tenant = Who::User(TENANT);
    let path = pods_path(TEAM);
    let at = "/root/.triton/cache";
    first_refusal_by(
        &admin,
        "gkm-cache-mount-path",
        "a pod mounting its cache away from its csi.gkm.io/mountPath",
        |name| cache_mount_pod(name, Some(at), &[("a", "/elsewhere", None)]),
    )
    .await?;
    let admitted = [
        (
            "mount-path-kept",
            cache_mount_pod(
                "mount-path-kept",
                Some(at),
                &[("a", at, None), ("b", at, None)],
            ),
        ),
        (
            "mount-path-none",
            cache_mount_pod("mount-path-none", None, &[("a", "/anywhere", None)]),
        ),
    ];
    for (name, pod) in admitted {
        let made = as_who(&admin, tenant, create(&path, &pod)?).await?;
        assert!(made.is_ok(), "{name} must be admitted: {made:?}");
        as_who(&admin, Who::Admin, delete_pod(name)?).await?.ok();
    }
    let refused = [
        (
            "a second container elsewhere",
            cache_mount_pod(
                "mount-path-second",
                Some(at),
                &[("a", at, None), ("b", "/tmp/c", None)],
            ),
        ),
        (
            "a subPath",
            cache_mount_pod("mount-path-sub", Some(at), &[("a", at, Some("KEY"))]),
        ),
    ];
    for (what, pod) in refused {
        let result = as_who(&admin, tenant, create(&path, &pod)?).await?;
        let status = result
            .err()
            .unwrap_or_else(|| panic!("{what} must be refused"));
        assert!(
            status.message.contains("csi.gkm.io/mountPath")
                && status.message.contains("gkm-cache-mount-path"),
            "{what}: {}",
            status.message
        );
    }
    Ok(())
}

/// A pod of the tenant's namespace that a Job named `job` (uid `uid`)
/// controls, as its owner reference says.
fn job_pod(name: &str, job: Option<(&str, &str)>) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {"nodeName": "gpu-node-1", "automountServiceAccountToken": false,
                 "containers": [{"name": "main", "image": "busybox"}]},
    });
    if let Some((job, uid)) = job {
        pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "Job",
            "name": job, "uid": uid, "controller": true}]);
    }
    pod
}

#[tokio::test]
async fn only_the_job_controller_may_make_a_pod_a_capture_job_controls() -> anyhow::Result<()> {
    let (_plane, admin) = install(&["policies/capture-job-pods.yaml"]).await?;
    let tenant = Who::User(TENANT);
    let path = pods_path(TEAM);
    let job = ("capture-warm-1", "5b2c3d4e-0000-4000-8000-000000000001");
    let status = first_refusal_by(
        &admin,
        "gkm-capture-job-pods",
        "a tenant's pod claiming a capture Job as its controller",
        |name| job_pod(name, Some(job)),
    )
    .await?;
    assert!(status.message.contains(TENANT), "{}", status.message);
    // Nor may it give one of its pods that owner afterwards.
    let plain = as_who(&admin, tenant, create(&path, &job_pod("plain-pod", None))?).await?;
    assert!(
        plain.is_ok(),
        "a pod without such an owner is the tenant's: {plain:?}"
    );
    let owners = job_pod("plain-pod", Some(job))["metadata"].clone();
    let given = as_who(
        &admin,
        tenant,
        merge(&path, "plain-pod", &json!({"metadata": owners}))?,
    )
    .await?;
    let status = given.expect_err("giving a pod a capture Job as controller is refused");
    assert!(
        status.message.contains("gkm-capture-job-pods"),
        "{}",
        status.message
    );
    // A Job of another name is not the policy's business.
    let other = as_who(
        &admin,
        tenant,
        create(&path, &job_pod("own-job-pod", Some(("nightly-1", job.1))))?,
    )
    .await?;
    assert!(other.is_ok(), "{other:?}");
    // The Job controller (kube-controller-manager's identity) may.
    let mut by_controller = create(&path, &job_pod("job-made-pod", Some(job)))?;
    let headers = by_controller.headers_mut();
    headers.insert(
        "Impersonate-User",
        "system:kube-controller-manager".parse()?,
    );
    headers.append("Impersonate-Group", "system:masters".parse()?);
    let made = admin.request::<Value>(by_controller).await;
    assert!(
        made.is_ok(),
        "the Job controller makes the pods of capture Jobs: {made:?}"
    );
    for name in ["plain-pod", "own-job-pod", "job-made-pod"] {
        as_who(&admin, Who::Admin, delete_pod(name)?).await?.ok();
    }
    Ok(())
}

/// A pod of the tenant's namespace mounting the claim `claim`, read-only
/// when `read_only`, labelled `labels`.
fn claim_pod(name: &str, claim: &str, read_only: bool, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TEAM, "labels": labels},
        "spec": {
            "nodeName": "gpu-node-1",
            "automountServiceAccountToken": false,
            "containers": [{"name": "main", "image": "busybox",
                            "volumeMounts": [{"name": "kernels", "mountPath": "/cache"}]}],
            "volumes": [{"name": "kernels", "persistentVolumeClaim":
                {"claimName": claim, "readOnly": read_only}}],
        },
    })
}

/// A claim in the tenant's namespace, labelled `labels`.
fn claim(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": TEAM, "labels": labels},
        "spec": {"accessModes": ["ReadOnlyMany"],
                 "resources": {"requests": {"storage": "1Gi"}}},
    })
}

#[tokio::test]
async fn no_pod_mounts_a_claim_gkm_filled_writable_even_while_gkm_is_away() -> anyhow::Result<()> {
    // Only the policy: no operator answers the claim-read-only webhook, as
    // when it is down or its port is held busy and the webhook is skipped.
    let (plane, admin) = install(&["policies/claim-read-only.yaml"]).await?;
    let gkm_labels = json!({"app.kubernetes.io/managed-by": "gkm-operator",
                            "gkm.io/cache": "vector-add", "gkm.io/cache-kind": "GKMCache"});
    plane
        .apply_object(&claim("vector-add", gkm_labels.clone()), false)
        .await?;
    plane
        .apply_object(&claim("scratch", json!({"app": "mine"})), false)
        .await?;
    let tenant = Who::User(TENANT);
    let path = pods_path(TEAM);
    let status = first_refusal_by(
        &admin,
        "gkm-claim-read-only",
        "a pod mounting a claim gkm filled writable",
        |name| claim_pod(name, "vector-add", false, json!({})),
    )
    .await?;
    assert!(
        status.message.contains("gkm claim vector-add writable")
            && status.message.contains("readOnly: true"),
        "the refusal names the claim and the fix: {}",
        status.message
    );
    // Labelling the pod as gkm's own does not make a tenant's pod a fill pod.
    let posing = as_who(
        &admin,
        tenant,
        create(
            &path,
            &claim_pod(
                "posing-as-fill",
                "vector-add",
                false,
                json!({"app.kubernetes.io/managed-by": "gkm-operator"}),
            ),
        )?,
    )
    .await?;
    let status = posing.expect_err("a tenant's pod labelled as gkm's is refused too");
    assert!(
        status.message.contains("gkm-claim-read-only"),
        "{}",
        status.message
    );
    let admitted = [
        (
            "reads-the-cache",
            claim_pod("reads-the-cache", "vector-add", true, json!({})),
        ),
        (
            "writes-its-own",
            claim_pod("writes-its-own", "scratch", false, json!({})),
        ),
    ];
    for (name, pod) in admitted {
        let made = as_who(&admin, tenant, create(&path, &pod)?).await?;
        assert!(made.is_ok(), "{name} must be admitted: {made:?}");
    }
    // gkm's fill pod, made by the Job controller, writes its claim.
    let mut by_controller = create(
        &path,
        &claim_pod("fill-pod", "vector-add", false, gkm_labels),
    )?;
    let headers = by_controller.headers_mut();
    headers.insert(
        "Impersonate-User",
        "system:kube-controller-manager".parse()?,
    );
    headers.append("Impersonate-Group", "system:masters".parse()?);
    let made = admin.request::<Value>(by_controller).await;
    assert!(made.is_ok(), "the Job controller makes fill pods: {made:?}");
    for name in ["reads-the-cache", "writes-its-own", "fill-pod"] {
        as_who(&admin, Who::Admin, delete_pod(name)?).await?.ok();
    }
    Ok(())
}
