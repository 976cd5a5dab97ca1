//! The Helm chart `deploy/helm/gkm`, as `helm` (the pinned build from
//! `hack/ci/components.sh helm`) sees it: lint-clean, its rendering pinned by
//! snapshots for the default values and two variants, wrong values refused
//! by `values.schema.json`, and every flat file under `deploy/` (the
//! kustomize parts, `install.yaml`, the chart's CRDs) exactly what
//! `deploy/render.sh` makes from it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gkm_local::repo_root;
use gkm_testenv::{Component, find_binary};

/// The chart's values for one rendering: a name and `helm` arguments.
struct Variant {
    name: &'static str,
    args: &'static [&'static str],
}

const VARIANTS: &[Variant] = &[
    Variant {
        name: "default",
        args: &[],
    },
    // A Prometheus-operator cluster that runs the scheduler extender with
    // GPU shares, with a default signature policy and logs for people.
    Variant {
        name: "extender_monitoring_policy",
        args: &[
            "--set",
            "schedulerExtender.enabled=true",
            "--set",
            "devicePlugin.gpuShares=true",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.serviceMonitor.labels.release=prometheus",
            "--set",
            "logFormat=text",
            "--set",
            "signature.allowedModes={Enforce,Audit}",
            "--set-json",
            r#"signature.defaultPolicy={"signers":[{"key":{"secretRef":{"name":"cosign-pub","key":"cosign.pub"}}}]}"#,
        ],
    },
    // Images pinned by digest from a private registry, a distribution with
    // its kubelet elsewhere, GPU nodes only, no device plugin, a node-local
    // mirror for the cache registry, no on-cluster capture.
    Variant {
        name: "private_registry_custom_paths",
        args: &[
            "--set",
            "image.registry=registry.example.com/gkm",
            "--set",
            "image.tag=v0.1.0-rc1",
            "--set",
            "image.pullSecrets={regcred}",
            "--set",
            "operator.image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "--set",
            "kubeletDir=/var/lib/k0s/kubelet",
            "--set",
            "storeDir=/data/gkm",
            "--set",
            "devicePlugin.enabled=false",
            // No on-cluster capture: the CSI driver has no token.
            "--set",
            "capture.enabled=false",
            // GPUs through DRA instead of the device plugin.
            "--set",
            "dra.enabled=true",
            "--set-json",
            r#"dra.deviceClasses.models=[{"name":"h100","productName":"NVIDIA H100 SXM5 80GB"},{"name":"h100-vm","productName":"NVIDIA H100 SXM5 80GB","type":"vfio"}]"#,
            "--set",
            "namespace.create=true",
            // Label values are strings: with --set, `true` would be refused.
            "--set-string",
            "agent.nodeSelector.gkm\\.io/gpu\\.present=true",
            "--set-json",
            r#"agent.tolerations=[{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"}]"#,
            "--set-json",
            r#"registry.mirrors={"registry.example.com:5000":"[host.\"http://127.0.0.1:30020\"]\n  capabilities = [\"pull\"]\n"}"#,
        ],
    },
];

fn chart() -> PathBuf {
    repo_root().join("deploy/helm/gkm")
}

fn helm(args: &[&str]) -> anyhow::Result<Output> {
    let helm = find_binary(Component::Helm)?;
    Ok(Command::new(&helm).args(args).output()?)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn template(extra: &[&str]) -> anyhow::Result<Output> {
    let chart = chart();
    let chart = chart.to_str().unwrap_or_default();
    let mut args = vec!["template", "gkm", chart, "--namespace", "gkm-system"];
    args.extend_from_slice(extra);
    helm(&args)
}

#[test]
fn helm_lint_is_clean_for_every_variant() -> anyhow::Result<()> {
    let chart = chart();
    for variant in VARIANTS {
        let mut args = vec!["lint", "--strict", chart.to_str().unwrap_or_default()];
        args.extend_from_slice(variant.args);
        let out = helm(&args)?;
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "helm lint ({}): {stdout}{}",
            variant.name,
            text(&out.stderr)
        );
        assert!(
            stdout.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{stdout}"
        );
        assert!(
            !stdout.contains("[WARNING]") && !stdout.contains("[ERROR]"),
            "helm lint ({}): {stdout}",
            variant.name
        );
    }
    Ok(())
}

#[test]
fn helm_template_output_is_pinned_by_snapshots() -> anyhow::Result<()> {
    for variant in VARIANTS {
        let out = template(variant.args)?;
        assert!(
            out.status.success(),
            "helm template ({}): {}",
            variant.name,
            text(&out.stderr)
        );
        insta::assert_snapshot!(format!("chart_{}", variant.name), text(&out.stdout));
    }
    Ok(())
}

#[test]
fn wrong_values_fail_before_anything_is_installed() -> anyhow::Result<()> {
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "logFormat=xml"], "logFormat"),
        // A misspelt key is an error, not silently ignored.
        (&["--set", "operator.replica=2"], "replica"),
        (
            &["--set", "signature.allowedModes={Sometimes}"],
            "allowedModes",
        ),
        (&["--set", "kubeletDir=var/lib/kubelet"], "kubeletDir"),
        (&["--set", "operator.image.digest=latest"], "digest"),
        (&["--set", "webhook.port=0"], "webhook"),
        (
            &["--set", "registry.configPath=etc/containerd"],
            "configPath",
        ),
        (&["--set", "pvc.volumeDir=srv/gkm-volumes"], "volumeDir"),
    ];
    for (args, key) in cases {
        let out = template(args)?;
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(
            stderr.contains("values don't meet the specifications of the schema")
                && stderr.contains(key),
            "{args:?}: {stderr}"
        );
    }
    Ok(())
}

#[test]
fn a_pvc_volume_dir_is_the_operators_flag_its_mount_and_the_only_place_for_its_volumes()
-> anyhow::Result<()> {
    let out = template(&["--set", "pvc.volumeDir=/srv/gkm-volumes/"])?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rendered = text(&out.stdout);
    for expected in [
        "- --pvc-volume-dir=/srv/gkm-volumes/",
        "mountPath: /srv/gkm-volumes/",
        "path: /srv/gkm-volumes/\n            type: Directory",
        // The admission policy pins the operator's volumes under it, a
        // trailing slash or not.
        "object.spec.hostPath.path == \"/srv/gkm-volumes/\" + object.metadata.name",
    ] {
        assert!(rendered.contains(expected), "no {expected:?} in the render");
    }
    // Without it: no flag, no mount, no pinned path.
    let default = text(&template(&[])?.stdout);
    assert!(!default.contains("- --pvc-volume-dir="));
    assert!(!default.contains("pvc-volumes"));
    Ok(())
}

/// Every file under `dir`, relative to it.
fn files(dir: &Path, base: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files(&path, base, out)?;
        } else {
            out.push(path.strip_prefix(base)?.to_path_buf());
        }
    }
    out.sort();
    Ok(())
}

#[test]
fn deploy_files_are_rendered_from_the_chart() -> anyhow::Result<()> {
    let deploy = repo_root().join("deploy");
    let copy = tempfile::tempdir()?;
    let mut shipped = Vec::new();
    files(&deploy, &deploy, &mut shipped)?;
    for file in &shipped {
        let to = copy.path().join(file);
        std::fs::create_dir_all(to.parent().unwrap_or(copy.path()))?;
        std::fs::copy(deploy.join(file), &to)?;
    }
    let out = Command::new("sh")
        .arg(copy.path().join("render.sh"))
        .env("HELM", find_binary(Component::Helm)?)
        .output()?;
    assert!(
        out.status.success(),
        "deploy/render.sh: {}",
        text(&out.stderr)
    );
    let mut rendered = Vec::new();
    files(copy.path(), copy.path(), &mut rendered)?;
    assert_eq!(
        rendered, shipped,
        "deploy/render.sh makes other files than deploy/ holds"
    );
    for file in &shipped {
        let want = std::fs::read(copy.path().join(file))?;
        let have = std::fs::read(deploy.join(file))?;
        assert!(
            want == have,
            "deploy/{} is stale: run deploy/render.sh",
            file.display()
        );
    }
    Ok(())
}
