//! The agent's GPU metrics as a scrape sees them: parsed by Prometheus's own
//! parser and linted by promlint (HELP, TYPE, naming and units), with absent
//! readings absent, pod labels for allocated GPUs, and the output captured
//! from real NVML on an H100 (when the fixture is there). Also what the
//! shipped files promise about them: the admission policy allows exactly the
//! labels the agent writes, the Grafana dashboard asks only for metrics the
//! agent serves.

use std::path::PathBuf;

use gkm_gpu::telemetry::{Telemetry, TelemetryOptions};
use gkm_k8s_agent::allocations::Allocations;
use gkm_k8s_agent::telemetry::{GpuCollector, family_names, metrics_text};
use gkm_k8s_kubelet::proto::podresources as proto;
use gkm_testenv::{Sample, promlint, samples};

const MIXED: &str = "gpus:
  - profile: H100
    count: 2
  - profile: MI300X
    uuid: GPU-mi300x-0
    pciAddress: '0000:83:00.0'
  - profile: Gaudi2
";

fn collector(inventory: &str) -> anyhow::Result<GpuCollector> {
    let inventory = gkm_gpu::simulate::parse(inventory, "gpus.yaml".as_ref())?;
    Ok(GpuCollector::new(
        Telemetry::open(&inventory, &TelemetryOptions::default()),
        "node-1",
    ))
}

fn gpus_with(series: &[Sample], name: &str) -> Vec<String> {
    let mut gpus: Vec<String> = series
        .iter()
        .filter(|s| s.name == name)
        .filter_map(|s| s.label("gpu").map(str::to_string))
        .collect();
    gpus.dedup();
    gpus
}

#[test]
fn simulated_gpu_metrics_pass_the_prometheus_parser_and_promlint() -> anyhow::Result<()> {
    let text = metrics_text(collector(MIXED)?);
    promlint(&text)?;
    let series = samples(&text)?;

    // Every family exposed has HELP and TYPE, and is one gkm documents.
    let documented = family_names();
    for s in &series {
        let family = s.name.strip_suffix("_total").unwrap_or(&s.name);
        let family = family.strip_suffix("_info").unwrap_or(family);
        assert!(
            text.contains(&format!("# HELP {family} "))
                && text.contains(&format!("# TYPE {family} ")),
            "{} has no HELP or TYPE",
            s.name
        );
        assert!(
            documented.contains(&s.name),
            "{} is not in family_names()",
            s.name
        );
    }

    // Identity labels as dcgm-exporter's users select on them.
    let info: Vec<&Sample> = series.iter().filter(|s| s.name == "gkm_gpu_info").collect();
    assert_eq!(info.len(), 4);
    let mi300x = info[2];
    assert_eq!(mi300x.label("gpu"), Some("2"));
    assert_eq!(mi300x.label("UUID"), Some("GPU-mi300x-0"));
    assert_eq!(mi300x.label("pci_bus_id"), Some("0000:83:00.0"));
    assert_eq!(mi300x.label("model_name"), Some("AMD Instinct MI300X"));
    assert_eq!(mi300x.label("Hostname"), Some("node-1"));
    assert_eq!(mi300x.label("vendor"), Some("amd"));
    assert_eq!(mi300x.label("source"), Some("simulated"));

    // Absent readings are absent series, never zeros.
    assert_eq!(
        gpus_with(&series, "gkm_gpu_utilization_ratio"),
        ["0", "1", "2"]
    );
    assert_eq!(
        gpus_with(&series, "gkm_gpu_memory_total_bytes"),
        ["0", "1", "2", "3"]
    );
    assert_eq!(gpus_with(&series, "gkm_gpu_throttled"), ["0", "1"]);
    assert_eq!(
        gpus_with(&series, "gkm_gpu_energy_joules_total"),
        ["0", "1"]
    );
    assert!(gpus_with(&series, "gkm_gpu_xid_errors_total").is_empty());
    for s in series
        .iter()
        .filter(|s| s.name == "gkm_gpu_utilization_ratio")
    {
        assert!((0.0..=1.0).contains(&s.value), "{s:?}");
    }
    // The same inventory reads the same.
    assert_eq!(text, metrics_text(collector(MIXED)?));
    Ok(())
}

#[test]
fn gpus_held_by_a_container_carry_its_namespace_pod_and_container() -> anyhow::Result<()> {
    let allocations = Allocations::default();
    let collector = collector(MIXED)?.with_holders(allocations.clone());
    let text = || metrics_text(collector.clone());
    let held = |ids: &[&str]| proto::ListPodResourcesResponse {
        pod_resources: vec![proto::PodResources {
            name: "train-0".into(),
            namespace: "ml".into(),
            containers: vec![proto::ContainerResources {
                name: "main".into(),
                devices: vec![proto::ContainerDevices {
                    resource_name: "amd.com/gpu".into(),
                    device_ids: ids.iter().map(|s| s.to_string()).collect(),
                    topology: None,
                }],
                ..Default::default()
            }],
        }],
    };
    // Device plugins name GPUs by PCI address in any case.
    allocations.replace(&held(&["0000:83:00.0"]));
    let with_pod = text();
    promlint(&with_pod)?;
    let series = samples(&with_pod)?;
    let temperature: Vec<&Sample> = series
        .iter()
        .filter(|s| s.name == "gkm_gpu_temperature_celsius")
        .collect();
    for s in &temperature {
        let expected = (s.label("gpu") == Some("2")).then_some(("ml", "train-0", "main"));
        let got = s
            .label("namespace")
            .zip(s.label("pod"))
            .zip(s.label("container"))
            .map(|((n, p), c)| (n, p, c));
        assert_eq!(got, expected, "{s:?}");
    }
    allocations.replace(&held(&["GPU-mi300x-0"]));
    assert_eq!(text(), with_pod, "the UUID names the same GPU");

    allocations.replace(&proto::ListPodResourcesResponse::default());
    let gone = samples(&text())?;
    assert!(gone.iter().all(|s| s.label("pod").is_none()));
    Ok(())
}

fn fixture_dir() -> PathBuf {
    gkm_testenv::repo_root().join("gkm-gpu/tests/fixtures/nvml-h100")
}

/// What `gkm gpus --metrics` printed through real NVML on an NVIDIA H100
/// (`metrics.txt`, recorded by `hack/gpu/record.sh`): it passes Prometheus's
/// parser and promlint, every GPU has its readings under its UUID, and its
/// memory is what NVML reported for that product in the recorded inventory
/// (`gpus.json`). Both were recorded on H100s of one kind, not one card.
#[test]
fn real_nvml_metrics_from_an_h100_parse_and_carry_every_reading() -> anyhow::Result<()> {
    let dir = fixture_dir();
    // Recorded with a matrix-multiply load running, and again idle.
    let text = std::fs::read_to_string(dir.join("metrics.txt"))?;
    let idle = std::fs::read_to_string(dir.join("metrics-idle.txt"))?;
    promlint(&idle)?;
    let loaded = samples(&text)?;
    let busy = loaded
        .iter()
        .find(|s| s.name == "gkm_gpu_utilization_ratio")
        .map(|s| s.value);
    assert_eq!(busy, Some(1.0), "the GPU was busy during the recording");
    assert!(
        loaded
            .iter()
            .any(|s| s.name == "gkm_gpu_throttled" && s.label("reason") == Some("sw_power_cap")),
        "throttle reasons are reported"
    );
    promlint(&text)?;
    let series = samples(&text)?;
    let inventory: gkm_gpu::Inventory =
        serde_json::from_str(&std::fs::read_to_string(dir.join("gpus.json"))?)?;
    let gpus: Vec<&Sample> = series.iter().filter(|s| s.name == "gkm_gpu_info").collect();
    assert!(!gpus.is_empty(), "the recording has no GPU");
    for info in gpus {
        assert_eq!(info.label("source"), Some("nvml"), "{info:?}");
        assert_eq!(info.label("vendor"), Some("nvidia"), "{info:?}");
        let uuid = info.label("UUID").unwrap_or_default();
        assert!(uuid.starts_with("GPU-"), "{uuid}");
        let product = info.label("model_name").unwrap_or_default();
        assert!(product.contains("H100"), "{product}");
        assert!(info.label("pci_bus_id").is_some(), "{info:?}");
        let of_gpu = |name: &str| {
            series
                .iter()
                .find(|s| s.name == name && s.label("UUID") == Some(uuid))
                .map(|s| s.value)
        };
        for name in [
            "gkm_gpu_utilization_ratio",
            "gkm_gpu_memory_used_bytes",
            "gkm_gpu_memory_free_bytes",
            "gkm_gpu_temperature_celsius",
            "gkm_gpu_power_watts",
            "gkm_gpu_energy_joules_total",
            "gkm_gpu_sm_clock_hertz",
            "gkm_gpu_memory_clock_hertz",
        ] {
            assert!(of_gpu(name).is_some(), "no {name} for {uuid}");
        }
        let recorded = inventory
            .usable_gpus()
            .find(|g| g.product == product)
            .and_then(|g| g.memory_bytes);
        assert_eq!(
            of_gpu("gkm_gpu_memory_total_bytes"),
            recorded.map(|m| m as f64)
        );
        let temperature = of_gpu("gkm_gpu_temperature_celsius").unwrap_or_default();
        assert!((10.0..100.0).contains(&temperature), "{temperature}");
        let utilization = of_gpu("gkm_gpu_utilization_ratio").unwrap_or_default();
        assert!((0.0..=1.0).contains(&utilization), "{utilization}");
    }
    Ok(())
}

fn deploy_file(name: &str) -> anyhow::Result<String> {
    let path = gkm_testenv::repo_root().join("deploy").join(name);
    Ok(std::fs::read_to_string(path)?)
}

#[test]
fn the_admission_policy_allows_exactly_the_labels_the_agent_writes() -> anyhow::Result<()> {
    let policy: serde_yaml::Value = serde_yaml::from_str(
        deploy_file("policies/agent-own-node.yaml")?
            .split("\n---\n")
            .next()
            .unwrap_or_default(),
    )?;
    let variables = policy["spec"]["variables"]
        .as_sequence()
        .ok_or_else(|| anyhow::anyhow!("the policy has no variables"))?;
    let list = variables
        .iter()
        .find(|v| v["name"] == "gpuLabels")
        .and_then(|v| v["expression"].as_str())
        .ok_or_else(|| anyhow::anyhow!("the policy has no gpuLabels variable"))?;
    let allowed: Vec<&str> = list.split('\'').skip(1).step_by(2).collect();
    assert_eq!(allowed, gkm_gpu::labels::KEYS);
    Ok(())
}

#[test]
fn the_dashboard_asks_only_for_metrics_the_agent_serves() -> anyhow::Result<()> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&deploy_file("dashboards/gkm-gpus.json")?)?;
    let served = family_names();
    let asked = gkm_testenv::dashboard_metrics(&dashboard);
    assert!(asked.len() >= 10, "{asked:?}");
    for name in &asked {
        assert!(
            served.contains(name),
            "the dashboard asks for {name}, which the agent does not serve"
        );
    }
    Ok(())
}
