//! GPU metrics: [`crate::telemetry`] readings as Prometheus families, read
//! at each scrape, with the labels dcgm-exporter's users select on (`gpu`,
//! `UUID`, `pci_bus_id`, `Hostname`; the model as `model_name`, in the snake
//! case Prometheus's naming rules ask for) and, for a GPU a container holds
//! ([`Holders`]), its `namespace`, `pod` and `container`. gkm-agent serves
//! them on `/metrics`; `gkm gpus --metrics` prints them.
//!
//! A reading a GPU or its driver does not give has no series; a family no GPU
//! has a reading for is left out whole.
//!
//! ```
//! use gkm_gpu::metrics::GpuCollector;
//! use gkm_gpu::telemetry::{Telemetry, TelemetryOptions};
//! use prometheus_client::registry::Registry;
//!
//! let inventory = gkm_gpu::simulate::parse("gpus: [{profile: T4}]", "t4.yaml".as_ref())?;
//! let telemetry = Telemetry::open(&inventory, &TelemetryOptions::default());
//! let mut registry = Registry::with_prefix("gkm");
//! registry.register_collector(Box::new(GpuCollector::new(telemetry, "node-1")));
//! let mut text = String::new();
//! prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
//! assert!(text.contains("# TYPE gkm_gpu_temperature_celsius gauge"));
//! assert!(text.contains(r#"model_name="Tesla T4",Hostname="node-1""#));
//! # Ok::<(), gkm_gpu::Error>(())
//! ```

use std::fmt;
use std::sync::Arc;

use crate::telemetry::{GpuReadings, Telemetry};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// A container, named as metrics label it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ContainerRef {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod.
    pub pod: String,
    /// The container.
    pub container: String,
}

/// Which containers hold a GPU (gkm-agent's answer comes from the kubelet's
/// pod-resources API).
pub trait Holders: Send + Sync {
    /// The containers holding any of the devices named `ids` (a GPU's UUID,
    /// its PCI address), sorted, each once.
    fn holders(&self, ids: &[&str]) -> Vec<ContainerRef>;
}

/// Label pairs of one series.
type Labels = Vec<(String, String)>;

/// A reading: counts and bytes stay integers in the exposition.
#[derive(Clone, Copy)]
enum Num {
    Int(u64),
    Float(f64),
}

/// One sample of a family for one GPU: an extra label, if the family has
/// one, and the value.
type Sample = (Option<(&'static str, String)>, Num);

/// A metric family read from [`GpuReadings`].
struct Family {
    /// The name after `gkm_`, without the unit.
    name: &'static str,
    help: &'static str,
    unit: Option<&'static str>,
    counter: bool,
    samples: fn(&GpuReadings) -> Vec<Sample>,
}

fn one(value: Option<f64>) -> Vec<Sample> {
    value.map(|v| (None, Num::Float(v))).into_iter().collect()
}

fn bytes(value: Option<u64>) -> Vec<Sample> {
    value.map(|v| (None, Num::Int(v))).into_iter().collect()
}

/// Every GPU family but `gkm_gpu_info`, in the order they are exposed.
const FAMILIES: &[Family] = &[
    Family {
        name: "gpu_utilization",
        help: "Fraction of the last sample period during which a kernel ran on the GPU",
        unit: Some("ratio"),
        counter: false,
        samples: |r| one(r.utilization_ratio),
    },
    Family {
        name: "gpu_memory_used",
        help: "Device memory in use",
        unit: Some("bytes"),
        counter: false,
        samples: |r| bytes(r.memory_used_bytes),
    },
    Family {
        name: "gpu_memory_free",
        help: "Device memory free",
        unit: Some("bytes"),
        counter: false,
        samples: |r| bytes(r.memory_free_bytes),
    },
    Family {
        name: "gpu_memory_total",
        help: "Device memory in all",
        unit: Some("bytes"),
        counter: false,
        samples: |r| bytes(r.memory_total_bytes),
    },
    Family {
        name: "gpu_temperature",
        help: "GPU core temperature",
        unit: Some("celsius"),
        counter: false,
        samples: |r| one(r.temperature_celsius),
    },
    Family {
        name: "gpu_power",
        help: "GPU power draw",
        unit: Some("watts"),
        counter: false,
        samples: |r| one(r.power_watts),
    },
    Family {
        name: "gpu_energy",
        help: "Energy the GPU used since its driver loaded",
        unit: Some("joules"),
        counter: true,
        samples: |r| one(r.energy_joules),
    },
    Family {
        name: "gpu_sm_clock",
        help: "SM (NVIDIA) or shader (AMD) clock frequency",
        unit: Some("hertz"),
        counter: false,
        samples: |r| one(r.sm_clock_hertz),
    },
    Family {
        name: "gpu_memory_clock",
        help: "Memory clock frequency",
        unit: Some("hertz"),
        counter: false,
        samples: |r| one(r.memory_clock_hertz),
    },
    Family {
        name: "gpu_ecc_errors",
        help: "ECC errors in device memory since the driver loaded, by type (corrected, uncorrected)",
        unit: None,
        counter: true,
        samples: |r| {
            [
                ("corrected", r.ecc_corrected_errors),
                ("uncorrected", r.ecc_uncorrected_errors),
            ]
            .into_iter()
            .filter_map(|(kind, v)| v.map(|v| (Some(("type", kind.to_string())), Num::Int(v))))
            .collect()
        },
    },
    Family {
        name: "gpu_xid_errors",
        help: "XID errors the driver reported since the agent started, by XID number",
        unit: None,
        counter: true,
        samples: |r| {
            r.xid_errors
                .iter()
                .flatten()
                .map(|(xid, n)| (Some(("xid", xid.to_string())), Num::Int(*n)))
                .collect()
        },
    },
    Family {
        name: "gpu_throttled",
        help: "Whether a reason holds the GPU's clocks down now (1) or not (0), by reason",
        unit: None,
        counter: false,
        samples: |r| {
            r.throttle_reasons
                .iter()
                .flatten()
                .map(|(reason, on)| {
                    (
                        Some(("reason", reason.to_string())),
                        Num::Int(u64::from(*on)),
                    )
                })
                .collect()
        },
    },
];

/// The names of the families [`GpuCollector`] may expose, as scraped
/// (with the `gkm_` prefix, units and `_total`/`_info` suffixes).
pub fn family_names() -> Vec<String> {
    let mut names = vec!["gkm_gpu_info".to_string()];
    for f in FAMILIES {
        let mut name = format!("gkm_{}", f.name);
        if let Some(unit) = f.unit {
            name = format!("{name}_{unit}");
        }
        if f.counter {
            name.push_str("_total");
        }
        names.push(name);
    }
    names
}

/// Reads the node's GPUs at each scrape and encodes them; register it with
/// [`prometheus_client::registry::Registry::register_collector`] in a
/// registry prefixed `gkm`. Clones read the same GPUs.
#[derive(Clone)]
pub struct GpuCollector {
    telemetry: Arc<Telemetry>,
    hostname: String,
    holders: Option<Arc<dyn Holders>>,
}

impl fmt::Debug for GpuCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuCollector")
            .field("hostname", &self.hostname)
            .finish()
    }
}

impl GpuCollector {
    /// A collector for `telemetry` on node `hostname`.
    pub fn new(telemetry: Telemetry, hostname: impl Into<String>) -> GpuCollector {
        GpuCollector {
            telemetry: Arc::new(telemetry),
            hostname: hostname.into(),
            holders: None,
        }
    }

    /// Labels each GPU's series with the containers `holders` says hold it.
    pub fn with_holders(mut self, holders: impl Holders + 'static) -> GpuCollector {
        self.holders = Some(Arc::new(holders));
        self
    }

    /// One label set per holder of the GPU (one without pod labels when no
    /// container holds it).
    fn label_sets(&self, r: &GpuReadings) -> Vec<Labels> {
        let mut base: Labels = vec![("gpu".into(), r.gpu.to_string())];
        if let Some(uuid) = &r.uuid {
            base.push(("UUID".into(), uuid.clone()));
        }
        if let Some(pci) = &r.pci_bus_id {
            base.push(("pci_bus_id".into(), pci.clone()));
        }
        base.push(("model_name".into(), r.model_name.clone()));
        base.push(("Hostname".into(), self.hostname.clone()));
        let ids: Vec<&str> = [r.uuid.as_deref(), r.pci_bus_id.as_deref()]
            .into_iter()
            .flatten()
            .collect();
        let holders: Vec<ContainerRef> = self
            .holders
            .as_ref()
            .map(|h| h.holders(&ids))
            .unwrap_or_default();
        if holders.is_empty() {
            return vec![base];
        }
        holders
            .into_iter()
            .map(|h| {
                let mut labels = base.clone();
                labels.push(("namespace".into(), h.namespace));
                labels.push(("pod".into(), h.pod));
                labels.push(("container".into(), h.container));
                labels
            })
            .collect()
    }
}

impl Collector for GpuCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let gpus: Vec<(GpuReadings, Vec<Labels>)> = self
            .telemetry
            .read()
            .into_iter()
            .map(|r| {
                let sets = self.label_sets(&r);
                (r, sets)
            })
            .collect();
        if gpus.is_empty() {
            return Ok(());
        }
        let mut info = encoder.encode_descriptor(
            "gpu",
            "A GPU of this node: its vendor and where its readings come from",
            None,
            MetricType::Info,
        )?;
        for (r, sets) in &gpus {
            for labels in sets {
                let mut labels = labels.clone();
                labels.push(("vendor".into(), r.vendor.as_str().into()));
                labels.push(("source".into(), r.source.as_str().into()));
                info.encode_info(&labels)?;
            }
        }
        for family in FAMILIES {
            let samples: Vec<(&Vec<Labels>, Vec<Sample>)> = gpus
                .iter()
                .map(|(r, sets)| (sets, (family.samples)(r)))
                .filter(|(_, s)| !s.is_empty())
                .collect();
            if samples.is_empty() {
                continue;
            }
            let unit = family.unit.map(|u| Unit::Other(u.into()));
            let kind = if family.counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            let mut out =
                encoder.encode_descriptor(family.name, family.help, unit.as_ref(), kind)?;
            for (sets, values) in samples {
                for labels in sets {
                    for (extra, value) in &values {
                        let mut labels = labels.clone();
                        labels.extend(extra.iter().map(|(k, v)| ((*k).to_string(), v.clone())));
                        let series = out.encode_family(&labels)?;
                        match (family.counter, *value) {
                            (true, Num::Int(v)) => ConstCounter::new(v).encode(series)?,
                            (true, Num::Float(v)) => ConstCounter::new(v).encode(series)?,
                            (false, Num::Int(v)) => {
                                ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
                                    .encode(series)?
                            }
                            (false, Num::Float(v)) => ConstGauge::new(v).encode(series)?,
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// What a registry prefixed `gkm` holding only `collector` serves: the GPU
/// metrics as gkm-agent's `/metrics` shows them.
pub fn metrics_text(collector: GpuCollector) -> String {
    let mut registry = prometheus_client::registry::Registry::with_prefix("gkm");
    registry.register_collector(Box::new(collector));
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}
