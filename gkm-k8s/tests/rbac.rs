//! The shipped deployment: every YAML file under `deploy/` parses into known
//! kinds, `install.yaml` is exactly its parts, the apiserver accepts every
//! object (strict field validation, dry run), and the RBAC in `deploy/rbac/`
//! gives the operator, the agent and the CSI driver exactly what their code
//! needs: proven with the rules the apiserver reports for each
//! ServiceAccount, a table of SubjectAccessReviews of what each must and must
//! not do, and real requests made as each ServiceAccount.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gkm_k8s_api::crd::{self, GKMCache, GKMCacheNode};
use gkm_k8s_runtime::leader::{LeaderElector, LeaseConfig, Outcome};
use gkm_testenv::{
    ControlPlane, describe_object, eventually, service_account_groups, service_account_user,
    yaml_documents,
};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectRulesReview, SelfSubjectRulesReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::storage::v1::CSIDriver;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const SYSTEM: &str = "gkm-system";
/// A namespace holding a workload's caches.
const TEAM: &str = "rbac-team";

fn deploy_dir() -> anyhow::Result<PathBuf> {
    Ok(gkm_testenv::repo_root().join("deploy"))
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        // deploy/helm holds the chart these files are rendered from (its
        // templates are not YAML); bins/gkm-local/tests/chart.rs checks it.
        if path.is_dir() && path.file_name().is_some_and(|n| n == "helm") {
            continue;
        }
        if path.is_dir() {
            yaml_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    out.sort();
    Ok(())
}

/// The files `deploy/kustomization.yaml` lists, in order.
fn kustomization_resources() -> anyhow::Result<Vec<PathBuf>> {
    let dir = deploy_dir()?;
    let docs = yaml_documents(&dir.join("kustomization.yaml"))?;
    let resources = docs
        .first()
        .and_then(|d| d["resources"].as_array())
        .ok_or_else(|| anyhow::anyhow!("deploy/kustomization.yaml lists no resources"))?;
    resources
        .iter()
        .map(|r| {
            r.as_str()
                .map(|r| dir.join(r))
                .ok_or_else(|| anyhow::anyhow!("resource {r} is not a path"))
        })
        .collect()
}

fn kind_of<K: k8s_openapi::Resource>() -> (&'static str, &'static str) {
    (K::API_VERSION, K::KIND)
}

#[test]
fn deploy_yaml_parses_into_known_kinds_and_install_yaml_is_its_parts() -> anyhow::Result<()> {
    let known: BTreeSet<(&str, &str)> = [
        kind_of::<Namespace>(),
        kind_of::<ServiceAccount>(),
        kind_of::<ClusterRole>(),
        kind_of::<ClusterRoleBinding>(),
        kind_of::<Role>(),
        kind_of::<RoleBinding>(),
        kind_of::<Deployment>(),
        kind_of::<DaemonSet>(),
        kind_of::<Service>(),
        kind_of::<CSIDriver>(),
        kind_of::<CustomResourceDefinition>(),
        kind_of::<ValidatingAdmissionPolicy>(),
        kind_of::<ValidatingAdmissionPolicyBinding>(),
        kind_of::<MutatingWebhookConfiguration>(),
        kind_of::<ValidatingWebhookConfiguration>(),
        kind_of::<NetworkPolicy>(),
        kind_of::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(),
        ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
        (
            "kubescheduler.config.k8s.io/v1",
            "KubeSchedulerConfiguration",
        ),
    ]
    .into_iter()
    .collect();

    let mut files = Vec::new();
    yaml_files(&deploy_dir()?, &mut files)?;
    assert!(
        files.len() >= 10,
        "deploy/ holds {} YAML files",
        files.len()
    );
    let mut seen = BTreeSet::new();
    for file in &files {
        for doc in yaml_documents(file)? {
            let kind = (
                doc["apiVersion"].as_str().unwrap_or(""),
                doc["kind"].as_str().unwrap_or(""),
            );
            assert!(
                known.contains(&kind),
                "{}: unknown kind {kind:?}",
                file.display()
            );
            if kind.1 != "Kustomization" && kind.1 != "KubeSchedulerConfiguration" {
                assert!(
                    doc["metadata"]["name"].is_string(),
                    "{}: {} has no name",
                    file.display(),
                    describe_object(&doc)
                );
            }
            seen.insert(format!("{} {}", kind.0, kind.1));
        }
    }
    for kind in [
        "apps/v1 Deployment",
        "apps/v1 DaemonSet",
        "storage.k8s.io/v1 CSIDriver",
        "v1 ServiceAccount",
    ] {
        assert!(seen.contains(kind), "no {kind} under deploy/");
    }

    // install.yaml holds the kustomization's parts, in order, unchanged.
    let mut parts = Vec::new();
    for file in kustomization_resources()? {
        parts.extend(yaml_documents(&file)?);
    }
    let install = yaml_documents(&deploy_dir()?.join("install.yaml"))?;
    let names = |docs: &[Value]| docs.iter().map(describe_object).collect::<Vec<_>>();
    assert_eq!(
        names(&install),
        names(&parts),
        "deploy/install.yaml is stale: run deploy/render.sh"
    );
    assert!(
        install == parts,
        "deploy/install.yaml differs from its parts: run deploy/render.sh"
    );

    // The kustomization covers every file, so nothing shipped is left out.
    let listed: BTreeSet<PathBuf> = kustomization_resources()?.into_iter().collect();
    for file in &files {
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        // A KubeSchedulerConfiguration is kube-scheduler's file, not an API object.
        let component_config = yaml_documents(file)?
            .iter()
            .all(|d| d["kind"] == "KubeSchedulerConfiguration");
        if name != "install.yaml" && name != "kustomization.yaml" && !component_config {
            assert!(
                listed.contains(file),
                "{} is not in deploy/kustomization.yaml",
                file.display()
            );
        }
    }
    Ok(())
}

#[test]
fn the_workloads_run_as_their_own_service_accounts() -> anyhow::Result<()> {
    let dir = deploy_dir()?;
    let csi = yaml_documents(&dir.join("manifests/csi.yaml"))?;
    let driver = csi
        .iter()
        .find(|d| d["kind"] == "CSIDriver")
        .ok_or_else(|| anyhow::anyhow!("no CSIDriver"))?;
    assert_eq!(driver["metadata"]["name"], "csi.gkm.io");
    assert_eq!(driver["spec"]["attachRequired"], false);
    assert_eq!(driver["spec"]["podInfoOnMount"], true);
    assert_eq!(driver["spec"]["volumeLifecycleModes"], json!(["Ephemeral"]));

    let mut workloads = Vec::new();
    for file in [
        "manifests/operator.yaml",
        "manifests/agent.yaml",
        "manifests/csi.yaml",
    ] {
        workloads.extend(
            yaml_documents(&dir.join(file))?
                .into_iter()
                .filter(|d| d["kind"] == "Deployment" || d["kind"] == "DaemonSet"),
        );
    }
    let accounts: Vec<(&str, &str)> = workloads
        .iter()
        .map(|w| {
            (
                w["metadata"]["name"].as_str().unwrap_or(""),
                w["spec"]["template"]["spec"]["serviceAccountName"]
                    .as_str()
                    .unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        accounts,
        [
            ("gkm-operator", "gkm-operator"),
            ("gkm-agent", "gkm-agent"),
            ("gkm-csi", "gkm-csi")
        ]
    );
    let csi_pod = &workloads[2]["spec"]["template"]["spec"];
    assert_eq!(
        csi_pod["automountServiceAccountToken"], false,
        "the CSI driver never talks to the apiserver"
    );
    let containers: Vec<&str> = csi_pod["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        containers,
        ["gkm-csi"],
        "gkm-csi registers itself: no sidecar"
    );
    let csi_args = &csi_pod["containers"][0]["args"];
    assert!(
        csi_args.as_array().is_some_and(|a| a.iter().any(|arg| arg
            .as_str()
            .is_some_and(|s| s.starts_with("--kubelet-registration-path=")))),
        "{csi_args}"
    );
    let operator_args = &workloads[0]["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        operator_args
            .as_array()
            .is_some_and(|a| a.contains(&json!("--leader-elect"))),
        "{operator_args}"
    );
    Ok(())
}

/// Installs the CRDs, the namespace and `deploy/rbac/` on the shared control
/// plane, and a namespace for a workload's caches.
async fn install_rbac() -> anyhow::Result<(&'static ControlPlane, kube::Client)> {
    let plane = ControlPlane::shared().await?;
    plane.install_crds(&crd::crds()).await?;
    let admin = plane.client().await?;
    let dir = deploy_dir()?;
    let mut files = vec![dir.join("namespace.yaml")];
    let mut rbac = Vec::new();
    yaml_files(&dir.join("rbac"), &mut rbac)?;
    files.extend(rbac);
    for file in files {
        plane.apply_file(&file).await?;
    }
    let team = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEAM}});
    plane.apply_object(&team, false).await?;
    Ok((plane, admin))
}

#[tokio::test]
async fn the_apiserver_accepts_every_shipped_object() -> anyhow::Result<()> {
    let (plane, _admin) = install_rbac().await?;
    for doc in yaml_documents(&deploy_dir()?.join("install.yaml"))? {
        plane.apply_object(&doc, true).await?;
    }
    Ok(())
}

/// One row of the access table.
struct Access {
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    namespace: &'static str,
    name: &'static str,
}

/// `verb group/resource[/subresource]` in `namespace` (`-` for cluster-wide or
/// all namespaces), on the object `name` (`-` for any).
fn access(spec: &'static str) -> Access {
    let parts: Vec<&'static str> = spec.split_whitespace().collect();
    let field = |i: usize| parts.get(i).copied().filter(|p| *p != "-").unwrap_or("");
    let (group, resource) = field(1).split_once('/').unwrap_or(("", field(1)));
    Access {
        verb: field(0),
        group,
        resource,
        namespace: field(2),
        name: field(3),
    }
}

async fn allowed(admin: &kube::Client, account: &str, a: &Access) -> anyhow::Result<bool> {
    let (resource, subresource) = match a.resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_string())),
        None => (a.resource, None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(service_account_user(SYSTEM, account)),
            groups: Some(
                service_account_groups(SYSTEM)
                    .into_iter()
                    .chain(["system:authenticated".to_string()])
                    .collect(),
            ),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(a.verb.into()),
                group: Some(a.group.into()),
                resource: Some(resource.into()),
                subresource,
                namespace: (!a.namespace.is_empty()).then(|| a.namespace.into()),
                name: (!a.name.is_empty()).then(|| a.name.into()),
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

/// `group resource verb name` for every resource rule `account` has in
/// `namespace`, as the apiserver reports them to the account itself, less
/// the self-review rules every authenticated user has.
async fn rules(
    plane: &ControlPlane,
    account: &str,
    namespace: &str,
) -> anyhow::Result<BTreeSet<String>> {
    let client = plane.client_for_service_account(SYSTEM, account).await?;
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(namespace.into()),
        },
        ..SelfSubjectRulesReview::default()
    };
    let status = Api::<SelfSubjectRulesReview>::all(client)
        .create(&PostParams::default(), &review)
        .await?
        .status;
    let status = status.ok_or_else(|| anyhow::anyhow!("no rules review status"))?;
    assert!(
        !status.incomplete,
        "rules of {account}: {:?}",
        status.evaluation_error
    );
    let mut out = BTreeSet::new();
    for rule in status.resource_rules {
        let groups = rule.api_groups.unwrap_or_default();
        if groups
            .iter()
            .all(|g| g == "authorization.k8s.io" || g == "authentication.k8s.io")
        {
            continue;
        }
        let names = rule.resource_names.unwrap_or_else(|| vec!["*".into()]);
        for group in &groups {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    for name in &names {
                        let group = if group.is_empty() { "core" } else { group };
                        out.insert(format!("{group} {resource} {verb} {name}"));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Expands `group resources verbs [names]` lines (comma-separated lists).
fn expect(lines: &[&str]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in lines {
        let parts: Vec<&str> = line.split_whitespace().collect();
        for resource in parts[1].split(',') {
            for verb in parts[2].split(',') {
                for name in parts.get(3).unwrap_or(&"*").split(',') {
                    out.insert(format!("{} {resource} {verb} {name}", parts[0]));
                }
            }
        }
    }
    out
}

const OPERATOR_RULES: &[&str] = &[
    "gkm.io gkmcaches,clustergkmcaches get,list,watch,patch,update",
    "gkm.io gkmcaches/status,clustergkmcaches/status get,patch,update",
    "gkm.io gkmcaches/finalizers,clustergkmcaches/finalizers update",
    "gkm.io gkmcachereleases,clustergkmcachereleases get,list,watch,create,patch,delete",
    "gkm.io gkmcachenodes,clustergkmcachenodes get,list,watch,delete",
    "core nodes get,list,watch",
    "events.k8s.io events create,patch",
    "core events create,patch",
    "core secrets,configmaps get",
    "core persistentvolumeclaims,persistentvolumes get,list,watch,create,patch,delete",
    "batch jobs list,watch,create,patch,delete",
    "core namespaces,pods list,watch",
    "admissionregistration.k8s.io mutatingwebhookconfigurations create",
    "admissionregistration.k8s.io mutatingwebhookconfigurations get,patch gkm-pvc-mutation,gkm-image-volume",
    "admissionregistration.k8s.io validatingwebhookconfigurations patch gkm-gpu-quota",
    "gkm.io gkmgpuquotas list,watch",
    "gkm.io gkmgpuquotas/status patch",
    "resource.k8s.io resourceclaims list",
    "rbac.authorization.k8s.io clusterroles get gkm-operator",
    // On-cluster capture.
    "gkm.io gkmcachecaptures get,list,watch",
    "gkm.io gkmcachecaptures/status get,patch",
    "gkm.io gkmcachecaptures/finalizers update",
    "gkm.io gkmcaches create",
    "batch jobs get",
    "core events list",
];
/// The CSI driver's: none, it never talks to the apiserver.
const CSI_RULES: &[&str] = &[];
/// The operator's rules in the release namespace only: its Lease and the
/// webhook CA Secret its replicas share.
const OPERATOR_LEASE_RULES: &[&str] = &[
    "coordination.k8s.io leases create",
    "coordination.k8s.io leases get,update gkm-operator",
    "core secrets create",
    "core secrets get,update gkm-operator-webhook-ca",
];
const AGENT_RULES: &[&str] = &[
    "gkm.io gkmcachereleases,clustergkmcachereleases get,list,watch",
    "gkm.io gkmcachenodes,clustergkmcachenodes get,list,watch,create,patch,update,delete",
    "gkm.io gkmcachenodes/status,clustergkmcachenodes/status get,patch,update",
    "core nodes get,list,watch,patch",
    "events.k8s.io events create,patch",
    "core events create,patch",
    // The pods mounting a cache on its node and their owners, by name
    // only, for the workload a pod's misses count under.
    "core pods get",
    "apps replicasets get",
    "batch jobs get",
    // On-cluster capture: its node's captures, read-only, for the capture
    // index it writes for the CSI driver.
    "gkm.io gkmcachecaptures get,list,watch",
];

/// Waits until the RBAC authorizer's cache has the shipped bindings.
async fn until_bound(admin: &kube::Client) -> anyhow::Result<()> {
    let (operator, agent) = (
        access("list gkm.io/gkmcaches - -"),
        access("list gkm.io/gkmcachereleases - -"),
    );
    eventually(
        "the shipped bindings in effect",
        Duration::from_secs(15),
        || async {
            Ok((allowed(admin, "gkm-operator", &operator).await?
                && allowed(admin, "gkm-agent", &agent).await?)
                .then_some(()))
        },
    )
    .await
}

#[tokio::test]
async fn each_component_has_exactly_the_rules_it_needs() -> anyhow::Result<()> {
    let (plane, admin) = install_rbac().await?;
    until_bound(&admin).await?;

    assert_eq!(
        rules(plane, "gkm-operator", TEAM).await?,
        expect(OPERATOR_RULES)
    );
    let in_system: Vec<&str> = OPERATOR_RULES
        .iter()
        .chain(OPERATOR_LEASE_RULES)
        .copied()
        .collect();
    assert_eq!(
        rules(plane, "gkm-operator", SYSTEM).await?,
        expect(&in_system)
    );
    assert_eq!(rules(plane, "gkm-agent", TEAM).await?, expect(AGENT_RULES));
    assert_eq!(
        rules(plane, "gkm-agent", SYSTEM).await?,
        expect(AGENT_RULES)
    );
    assert_eq!(rules(plane, "gkm-csi", TEAM).await?, expect(CSI_RULES));
    assert_eq!(rules(plane, "gkm-csi", SYSTEM).await?, expect(CSI_RULES));
    Ok(())
}

#[tokio::test]
async fn access_reviews_allow_what_each_needs_and_deny_the_rest() -> anyhow::Result<()> {
    let (_plane, admin) = install_rbac().await?;
    until_bound(&admin).await?;

    let table: &[(&str, &str, bool)] = &[
        // The operator.
        ("gkm-operator", "watch gkm.io/gkmcaches - -", true),
        ("gkm-operator", "list gkm.io/clustergkmcaches - -", true),
        (
            "gkm-operator",
            "patch gkm.io/gkmcaches rbac-team cache",
            true,
        ),
        (
            "gkm-operator",
            "patch gkm.io/gkmcaches/status rbac-team cache",
            true,
        ),
        (
            "gkm-operator",
            "patch gkm.io/clustergkmcaches/status - cache",
            true,
        ),
        (
            "gkm-operator",
            "update gkm.io/gkmcaches/finalizers rbac-team cache",
            true,
        ),
        (
            "gkm-operator",
            "patch gkm.io/gkmcachereleases rbac-team cache",
            true,
        ),
        (
            "gkm-operator",
            "delete gkm.io/clustergkmcachereleases - cache",
            true,
        ),
        ("gkm-operator", "watch gkm.io/gkmcachereleases - -", true),
        ("gkm-operator", "watch gkm.io/gkmcachenodes - -", true),
        ("gkm-operator", "list gkm.io/clustergkmcachenodes - -", true),
        (
            "gkm-operator",
            "create events.k8s.io/events rbac-team -",
            true,
        ),
        (
            "gkm-operator",
            "create events.k8s.io/events default -",
            true,
        ),
        ("gkm-operator", "get secrets rbac-team cosign-pub", true),
        (
            "gkm-operator",
            "get configmaps rbac-team sigstore-root",
            true,
        ),
        (
            "gkm-operator",
            "create coordination.k8s.io/leases gkm-system -",
            true,
        ),
        (
            "gkm-operator",
            "update coordination.k8s.io/leases gkm-system gkm-operator",
            true,
        ),
        ("gkm-operator", "list secrets rbac-team -", false),
        ("gkm-operator", "watch secrets - -", false),
        ("gkm-operator", "update secrets rbac-team cosign-pub", false),
        // A complete capture creates the GKMCache it names.
        ("gkm-operator", "create gkm.io/gkmcaches rbac-team -", true),
        ("gkm-operator", "list secrets - -", false),
        ("gkm-operator", "create pods rbac-team -", false),
        (
            "gkm-operator",
            "update gkm.io/gkmcachecaptures rbac-team warm",
            false,
        ),
        (
            "gkm-operator",
            "delete gkm.io/gkmcaches rbac-team cache",
            false,
        ),
        (
            "gkm-operator",
            "create gkm.io/gkmcachenodes rbac-team -",
            false,
        ),
        (
            "gkm-operator",
            "patch gkm.io/gkmcachenodes/status rbac-team node-1",
            false,
        ),
        ("gkm-operator", "delete nodes - node-1", false),
        ("gkm-operator", "patch nodes - node-1", false),
        // PVC delivery: claims, volumes and fill Jobs; pods only listed
        // (the users of a deleted cache's claims are waited for).
        ("gkm-operator", "list pods - -", true),
        ("gkm-operator", "delete pods rbac-team reader", false),
        ("gkm-operator", "create pods rbac-team -", false),
        ("gkm-operator", "create batch/jobs rbac-team -", true),
        (
            "gkm-operator",
            "create persistentvolumeclaims rbac-team -",
            true,
        ),
        (
            "gkm-operator",
            "delete persistentvolumes - gkm-0123456789",
            true,
        ),
        (
            "gkm-operator",
            "update persistentvolumeclaims rbac-team cache",
            false,
        ),
        (
            "gkm-operator",
            "patch admissionregistration.k8s.io/mutatingwebhookconfigurations - gkm-pvc-mutation",
            true,
        ),
        (
            "gkm-operator",
            "patch admissionregistration.k8s.io/mutatingwebhookconfigurations - other",
            false,
        ),
        (
            "gkm-operator",
            "patch admissionregistration.k8s.io/validatingwebhookconfigurations - gkm-gpu-quota",
            true,
        ),
        (
            "gkm-operator",
            "create admissionregistration.k8s.io/validatingwebhookconfigurations - -",
            false,
        ),
        (
            "gkm-operator",
            "patch gkm.io/gkmgpuquotas rbac-team -",
            false,
        ),
        (
            "gkm-operator",
            "get coordination.k8s.io/leases gkm-system kube-controller-manager",
            false,
        ),
        (
            "gkm-operator",
            "create coordination.k8s.io/leases kube-system -",
            false,
        ),
        (
            "gkm-operator",
            "create rbac.authorization.k8s.io/clusterrolebindings - -",
            false,
        ),
        (
            "gkm-operator",
            "impersonate serviceaccounts gkm-system gkm-agent",
            false,
        ),
        // The agent: the releases, read only, and never the caches, whose
        // status changes with every node's report.
        ("gkm-agent", "watch gkm.io/gkmcachereleases - -", true),
        ("gkm-agent", "list gkm.io/clustergkmcachereleases - -", true),
        (
            "gkm-agent",
            "patch gkm.io/gkmcachereleases rbac-team cache",
            false,
        ),
        (
            "gkm-agent",
            "create gkm.io/clustergkmcachereleases - -",
            false,
        ),
        ("gkm-agent", "watch gkm.io/gkmcaches - -", false),
        ("gkm-agent", "list gkm.io/clustergkmcaches - -", false),
        ("gkm-agent", "create gkm.io/gkmcachenodes rbac-team -", true),
        (
            "gkm-agent",
            "patch gkm.io/gkmcachenodes/status rbac-team node-1",
            true,
        ),
        (
            "gkm-agent",
            "delete gkm.io/gkmcachenodes rbac-team node-1",
            true,
        ),
        (
            "gkm-agent",
            "patch gkm.io/clustergkmcachenodes/status - node-1",
            true,
        ),
        ("gkm-agent", "get nodes - node-1", true),
        ("gkm-agent", "patch nodes - node-1", true),
        ("gkm-agent", "create events.k8s.io/events rbac-team -", true),
        ("gkm-agent", "patch gkm.io/gkmcaches rbac-team cache", false),
        (
            "gkm-agent",
            "patch gkm.io/gkmcaches/status rbac-team cache",
            false,
        ),
        (
            "gkm-agent",
            "update gkm.io/clustergkmcaches/status - cache",
            false,
        ),
        (
            "gkm-agent",
            "update gkm.io/gkmcaches/finalizers rbac-team cache",
            false,
        ),
        (
            "gkm-agent",
            "delete gkm.io/gkmcaches rbac-team cache",
            false,
        ),
        ("gkm-agent", "get secrets rbac-team cosign-pub", false),
        ("gkm-agent", "list secrets - -", false),
        ("gkm-agent", "get configmaps rbac-team sigstore-root", false),
        // Its own Node, by a watch with a field selector, as the kubelet's.
        ("gkm-agent", "watch nodes - -", true),
        ("gkm-agent", "update nodes - node-1", false),
        ("gkm-agent", "delete nodes - node-1", false),
        ("gkm-agent", "patch nodes/status - node-1", false),
        ("gkm-agent", "list pods - -", false),
        ("gkm-agent", "watch pods - -", false),
        // A pod's workload, read by name.
        ("gkm-agent", "get pods rbac-team reader", true),
        (
            "gkm-agent",
            "get apps/replicasets rbac-team serve-7d4b9",
            true,
        ),
        ("gkm-agent", "list apps/replicasets - -", false),
        ("gkm-agent", "get batch/jobs rbac-team warmup", true),
        ("gkm-agent", "patch pods rbac-team reader", false),
        (
            "gkm-agent",
            "get coordination.k8s.io/leases gkm-system gkm-operator",
            false,
        ),
        // Its node's captures, read-only.
        ("gkm-agent", "watch gkm.io/gkmcachecaptures - -", true),
        (
            "gkm-agent",
            "get gkm.io/gkmcachecaptures rbac-team warm",
            true,
        ),
        (
            "gkm-agent",
            "patch gkm.io/gkmcachecaptures/status rbac-team warm",
            false,
        ),
        (
            "gkm-agent",
            "delete gkm.io/gkmcachecaptures rbac-team warm",
            false,
        ),
        // The CSI driver.
        ("gkm-csi", "list secrets - -", false),
        ("gkm-csi", "get secrets rbac-team cosign-pub", false),
        ("gkm-csi", "get gkm.io/gkmcaches rbac-team cache", false),
        ("gkm-csi", "list gkm.io/gkmcachenodes - -", false),
        ("gkm-csi", "get nodes - node-1", false),
        ("gkm-csi", "list pods - -", false),
        ("gkm-csi", "create events.k8s.io/events rbac-team -", false),
        ("gkm-csi", "create events rbac-team -", false),
        ("gkm-csi", "watch gkm.io/gkmcachecaptures - -", false),
        (
            "gkm-csi",
            "get gkm.io/gkmcachecaptures rbac-team warm",
            false,
        ),
        (
            "gkm-csi",
            "patch gkm.io/gkmcachecaptures/status rbac-team warm",
            false,
        ),
        (
            "gkm-csi",
            "delete gkm.io/gkmcachecaptures rbac-team warm",
            false,
        ),
    ];
    let mut wrong = Vec::new();
    for (account, spec, expected) in table {
        let got = allowed(&admin, account, &access(spec)).await?;
        if got != *expected {
            wrong.push(format!(
                "{account}: {spec}: {} but must be {}",
                verdict(got),
                verdict(*expected)
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "access differs from the table:\n{}",
        wrong.join("\n")
    );
    Ok(())
}

fn verdict(allowed: bool) -> &'static str {
    if allowed { "allowed" } else { "denied" }
}

fn forbidden<T: std::fmt::Debug>(result: kube::Result<T>) -> bool {
    matches!(result, Err(kube::Error::Api(ref s)) if s.code == 403)
}

#[tokio::test]
async fn requests_made_as_each_service_account() -> anyhow::Result<()> {
    let (plane, admin) = install_rbac().await?;
    until_bound(&admin).await?;
    let operator = plane
        .client_for_service_account(SYSTEM, "gkm-operator")
        .await?;
    let agent = plane
        .client_for_service_account(SYSTEM, "gkm-agent")
        .await?;
    let csi = plane.client_for_service_account(SYSTEM, "gkm-csi").await?;

    // Objects an administrator and a workload's owner made.
    let node_name = "rbac-node";
    let nodes: Api<Node> = Api::all(admin.clone());
    plane.ensure_node(node_name).await?;
    let cache: GKMCache = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "cache", "namespace": TEAM},
        "spec": {"image": "registry.example.com/caches/triton:v1"},
    }))?;
    Api::<GKMCache>::namespaced(admin.clone(), TEAM)
        .patch(
            "cache",
            &PatchParams::apply("gkm-rbac-test"),
            &Patch::Apply(&cache),
        )
        .await?;
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "cosign-pub", "namespace": TEAM}, "stringData": {"cosign.pub": "x"}}),
    )?;
    Api::<Secret>::namespaced(admin.clone(), TEAM)
        .patch(
            "cosign-pub",
            &PatchParams::apply("gkm-rbac-test"),
            &Patch::Apply(&secret),
        )
        .await?;

    // The operator: its Lease, a cache's finalizer and status, a secret by name.
    let elector = LeaderElector::new(
        operator.clone(),
        LeaseConfig::new(SYSTEM, "gkm-operator", "rbac-test"),
    );
    let outcome = tokio::time::timeout(
        Duration::from_secs(20),
        elector.run(std::future::pending(), async { "led" }),
    )
    .await?;
    assert_eq!(
        outcome,
        Outcome::Completed("led"),
        "the operator can take and release its Lease"
    );
    let other_lease = LeaderElector::new(
        operator.clone(),
        LeaseConfig::new(SYSTEM, "someone-else", "rbac-test"),
    );
    let blocked = tokio::time::timeout(
        Duration::from_secs(3),
        other_lease.run(std::future::pending(), async {}),
    )
    .await;
    assert!(blocked.is_err(), "the operator cannot hold another Lease");
    let lease = Api::<Lease>::namespaced(admin.clone(), SYSTEM)
        .get("gkm-operator")
        .await?;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        None,
        "released on completion"
    );

    let as_operator: Api<GKMCache> = Api::namespaced(operator.clone(), TEAM);
    let finalizer = json!({"metadata": {"finalizers": ["gkm.io/rbac-test"]}});
    as_operator
        .patch("cache", &PatchParams::default(), &Patch::Merge(&finalizer))
        .await?;
    let status = json!({"status": {"resolvedDigest": "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}});
    as_operator
        .patch_status("cache", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    as_operator
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    Api::<Secret>::namespaced(operator.clone(), TEAM)
        .get("cosign-pub")
        .await?;
    assert!(forbidden(
        Api::<Secret>::namespaced(operator.clone(), TEAM)
            .list(&ListParams::default())
            .await
    ));
    assert!(forbidden(
        Api::<GKMCache>::namespaced(operator.clone(), TEAM)
            .delete("cache", &DeleteParams::default())
            .await
    ));
    assert!(forbidden(
        Api::<Node>::all(operator.clone())
            .delete(node_name, &DeleteParams::default())
            .await
    ));
    let report: GKMCacheNode = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
        "metadata": {"name": node_name, "namespace": TEAM}, "spec": {},
    }))?;
    let apply = PatchParams::apply("gkm-agent").force();
    assert!(forbidden(
        Api::<GKMCacheNode>::namespaced(operator.clone(), TEAM)
            .patch(node_name, &apply, &Patch::Apply(&report))
            .await
    ));

    // The agent: its node report (server-side apply, as it writes them),
    // its Node's labels; not the cache, not secrets, not deleting nodes.
    let reports: Api<GKMCacheNode> = Api::namespaced(agent.clone(), TEAM);
    reports
        .patch(node_name, &apply, &Patch::Apply(&report))
        .await?;
    let report_status = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
        "status": {"nodeName": node_name},
    });
    reports
        .patch_status(node_name, &apply, &Patch::Apply(&report_status))
        .await?;
    let listed = Api::<GKMCacheNode>::all(agent.clone())
        .list(&ListParams::default().fields(&format!("metadata.name={node_name}")))
        .await?;
    assert_eq!(listed.items.len(), 1);
    reports.delete(node_name, &DeleteParams::default()).await?;
    let labels = json!({"metadata": {"labels": {"gkm.io/gpu.present": "false"}}});
    Api::<Node>::all(agent.clone())
        .patch(node_name, &PatchParams::default(), &Patch::Merge(&labels))
        .await?;
    assert_eq!(
        nodes
            .get(node_name)
            .await?
            .metadata
            .labels
            .unwrap_or_default()
            .get("gkm.io/gpu.present")
            .map(String::as_str),
        Some("false")
    );
    let as_agent: Api<GKMCache> = Api::namespaced(agent.clone(), TEAM);
    assert!(forbidden(as_agent.get("cache").await));
    assert!(forbidden(
        as_agent
            .patch_status("cache", &PatchParams::default(), &Patch::Merge(&status))
            .await
    ));
    assert!(forbidden(
        as_agent
            .patch("cache", &PatchParams::default(), &Patch::Merge(&finalizer))
            .await
    ));
    assert!(forbidden(
        Api::<Secret>::namespaced(agent.clone(), TEAM)
            .get("cosign-pub")
            .await
    ));
    assert!(forbidden(
        Api::<ConfigMap>::namespaced(agent.clone(), TEAM)
            .list(&ListParams::default())
            .await
    ));
    assert!(forbidden(
        Api::<Node>::all(agent.clone())
            .delete(node_name, &DeleteParams::default())
            .await
    ));

    // The CSI driver: nothing at all.
    assert!(forbidden(
        Api::<Secret>::all(csi.clone())
            .list(&ListParams::default())
            .await
    ));
    assert!(forbidden(
        Api::<GKMCache>::namespaced(csi.clone(), TEAM)
            .get("cache")
            .await
    ));
    assert!(forbidden(
        Api::<Node>::all(csi.clone()).get(node_name).await
    ));
    Ok(())
}

/// A request to the apiserver as the agent's ServiceAccount, made by the
/// admin with impersonation so that it can carry the node-name claim a pod's
/// bound token has.
async fn as_agent_on(
    admin: &kube::Client,
    node: Option<&str>,
    request: http::Request<Vec<u8>>,
) -> anyhow::Result<Result<Value, kube::core::Status>> {
    let mut request = request;
    let headers = request.headers_mut();
    headers.insert(
        "Impersonate-User",
        service_account_user(SYSTEM, "gkm-agent").parse()?,
    );
    for group in service_account_groups(SYSTEM) {
        headers.append("Impersonate-Group", group.parse()?);
    }
    if let Some(node) = node {
        headers.insert(
            "Impersonate-Extra-authentication.kubernetes.io%2Fnode-name",
            node.parse()?,
        );
    }
    match admin.request::<Value>(request).await {
        Ok(value) => Ok(Ok(value)),
        Err(kube::Error::Api(status)) => Ok(Err(*status)),
        Err(e) => Err(e.into()),
    }
}

fn merge_patch(path: &str, name: &str, patch: &Value) -> anyhow::Result<http::Request<Vec<u8>>> {
    Ok(
        kube::core::Request::new(path).patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(patch),
        )?,
    )
}

#[tokio::test]
async fn the_agent_policy_confines_each_agent_to_its_own_node() -> anyhow::Result<()> {
    // A control plane of its own: the policy would also confine the agent
    // identities the other tests use, which carry no node name.
    let plane = ControlPlane::start().await?;
    plane.install_crds(&crd::crds()).await?;
    let dir = deploy_dir()?;
    for file in [
        "namespace.yaml",
        "rbac/agent.yaml",
        "policies/agent-own-node.yaml",
    ] {
        plane.apply_file(&dir.join(file)).await?;
    }
    let admin = plane.client().await?;
    let team = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEAM}});
    plane.apply_object(&team, false).await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    for name in ["own-node", "other-node"] {
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"team": "a"}}}))?;
        nodes
            .patch(
                name,
                &PatchParams::apply("gkm-rbac-test"),
                &Patch::Apply(&node),
            )
            .await?;
    }

    let gpu_label = json!({"metadata": {"labels": {"gkm.io/gpu.count": "1"}}});
    // Policies take effect once the apiserver has loaded them: wait until the
    // other node's labels are refused.
    let last = RefCell::new(String::new());
    eventually("the policy in effect", Duration::from_secs(20), || async {
        let attempt = as_agent_on(
            &admin,
            Some("own-node"),
            merge_patch("/api/v1/nodes", "other-node", &gpu_label)?,
        )
        .await?;
        match attempt {
            Err(status) if status.code == 403 && status.message.contains("own node") => {
                Ok(Some(()))
            }
            other => {
                *last.borrow_mut() = format!("{other:?}");
                // Undo a write that got through before the policy was active.
                let undo = json!({"metadata": {"labels": {"gkm.io/gpu.count": null}}});
                nodes
                    .patch("other-node", &PatchParams::default(), &Patch::Merge(&undo))
                    .await?;
                Ok(None)
            }
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}: {}", last.borrow()))?;

    // Its own node's GPU labels, gkm's and (for --vendor-labels) GPU Feature
    // Discovery's and AMD's: allowed.
    let vendor_labels = json!({"metadata": {"labels": {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "amd.com/gpu.family": "AI",
    }}});
    for patch in [&gpu_label, &vendor_labels] {
        as_agent_on(
            &admin,
            Some("own-node"),
            merge_patch("/api/v1/nodes", "own-node", patch)?,
        )
        .await?
        .map_err(|s| anyhow::anyhow!("labelling its own node was refused: {}", s.message))?;
    }
    // As the agent writes them: server-side apply, which also drops the
    // labels its field manager applied before and no longer applies.
    for labels in [
        json!({"gkm.io/gpu.count": "1", "nvidia.com/gpu.family": "hopper"}),
        json!({"gkm.io/gpu.count": "1"}),
    ] {
        let applied = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "own-node", "labels": labels}});
        let request = kube::core::Request::new("/api/v1/nodes").patch(
            "own-node",
            &PatchParams::apply(gkm_k8s_agent::LABELS_FIELD_MANAGER).force(),
            &Patch::Apply(&applied),
        )?;
        as_agent_on(&admin, Some("own-node"), request)
            .await?
            .map_err(|s| {
                anyhow::anyhow!("applying its own node's labels was refused: {}", s.message)
            })?;
    }
    let own = nodes
        .get("own-node")
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(own.get("gkm.io/gpu.count").map(String::as_str), Some("1"));

    // Anything else on a Node: refused, with the reason.
    let refused: Vec<(&str, Option<&str>, &str, Value)> = vec![
        (
            "another node's labels",
            Some("own-node"),
            "other-node",
            gpu_label.clone(),
        ),
        (
            "a label outside gkm.io/",
            Some("own-node"),
            "own-node",
            json!({"metadata": {"labels": {"team": "b"}}}),
        ),
        (
            "an nvidia.com/ label gkm never writes",
            Some("own-node"),
            "own-node",
            json!({"metadata": {"labels": {"nvidia.com/gpu.deploy.driver": "false"}}}),
        ),
        (
            "a gkm.io/ label gkm never writes",
            Some("own-node"),
            "own-node",
            json!({"metadata": {"labels": {"gkm.io/anything": "x"}}}),
        ),
        (
            "removing a label outside gkm.io/",
            Some("own-node"),
            "own-node",
            json!({"metadata": {"labels": {"team": null}}}),
        ),
        (
            "cordoning",
            Some("own-node"),
            "own-node",
            json!({"spec": {"unschedulable": true}}),
        ),
        (
            "annotations",
            Some("own-node"),
            "own-node",
            json!({"metadata": {"annotations": {"x": "y"}}}),
        ),
        (
            "labels without a node-name claim",
            None,
            "own-node",
            gpu_label.clone(),
        ),
    ];
    for (what, claim, node, patch) in refused {
        let result =
            as_agent_on(&admin, claim, merge_patch("/api/v1/nodes", node, &patch)?).await?;
        match result {
            Err(status) if status.code == 403 && status.message.contains("gkm-agent") => {}
            other => panic!("{what}: expected a refusal naming gkm-agent, got {other:?}"),
        }
    }
    let other = nodes.get("other-node").await?;
    assert_eq!(
        other
            .metadata
            .labels
            .unwrap_or_default()
            .get("gkm.io/gpu.count"),
        None
    );
    assert_eq!(other.spec.and_then(|s| s.unschedulable), None);

    // Reports: only the one named after its node.
    let path = format!("/apis/gkm.io/v1alpha1/namespaces/{TEAM}/gkmcachenodes");
    let apply = PatchParams::apply("gkm-agent").force();
    let report = |name: &str| json!({"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode", "metadata": {"name": name}, "spec": {}});
    let own_report = kube::core::Request::new(&path).patch(
        "own-node",
        &apply,
        &Patch::Apply(report("own-node")),
    )?;
    as_agent_on(&admin, Some("own-node"), own_report)
        .await?
        .map_err(|s| anyhow::anyhow!("writing its own report was refused: {}", s.message))?;
    let other_report = kube::core::Request::new(&path).patch(
        "other-node",
        &apply,
        &Patch::Apply(report("other-node")),
    )?;
    match as_agent_on(&admin, Some("own-node"), other_report).await? {
        Err(status)
            if status.code == 403 && status.message.contains("gkmcachenodes \"other-node\"") => {}
        other => panic!("another node's report: expected a refusal, got {other:?}"),
    }
    let delete = kube::core::Request::new(&path).delete("own-node", &DeleteParams::default())?;
    as_agent_on(&admin, Some("own-node"), delete)
        .await?
        .map_err(|s| anyhow::anyhow!("deleting its own report was refused: {}", s.message))?;

    // Nobody else is confined.
    nodes
        .patch(
            "other-node",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"team": "c"}}})),
        )
        .await?;
    Ok(())
}
