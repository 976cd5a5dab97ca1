//! Metrics every gkm daemon exposes the same way: values sampled at each
//! scrape ([`Sampled`]) and the build information.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Whether a sampled value is a counter or a gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleKind {
    /// Only ever grows; exposed as `NAME_total`.
    Counter,
    /// Goes up and down.
    Gauge,
}

type Read = Box<dyn Fn() -> u64 + Send + Sync>;

/// A metric whose value is read from elsewhere (an atomic, a channel) at
/// each scrape; register it with [`Registry::register_collector`].
pub struct Sampled {
    name: String,
    help: String,
    kind: SampleKind,
    read: Read,
}

impl Sampled {
    /// A metric `name` of `kind` described by `help`, whose value is `read()`.
    pub fn new(
        name: impl Into<String>,
        help: impl Into<String>,
        kind: SampleKind,
        read: impl Fn() -> u64 + Send + Sync + 'static,
    ) -> Self {
        Sampled {
            name: name.into(),
            help: help.into(),
            kind,
            read: Box::new(read),
        }
    }

    /// A gauge that is 1 while `flag` is set and 0 otherwise.
    pub fn flag(name: impl Into<String>, help: impl Into<String>, flag: Arc<AtomicBool>) -> Self {
        Self::new(name, help, SampleKind::Gauge, move || {
            u64::from(flag.load(Ordering::Relaxed))
        })
    }
}

impl fmt::Debug for Sampled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sampled")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .finish()
    }
}

impl Collector for Sampled {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let value = (self.read)();
        match self.kind {
            SampleKind::Counter => self.encode_one(encoder, ConstCounter::new(value)),
            SampleKind::Gauge => self.encode_one(
                encoder,
                ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)),
            ),
        }
    }
}

impl Sampled {
    /// Writes `metric` under this sample's name and help.
    fn encode_one(&self, mut encoder: DescriptorEncoder, metric: impl EncodeMetric) -> fmt::Result {
        let out = encoder.encode_descriptor(&self.name, &self.help, None, metric.metric_type())?;
        metric.encode(out)
    }
}

/// Registers `gkm_build_info{version="…"} 1` in `registry` (under its prefix).
pub fn register_build_info(registry: &mut Registry, component: &str, version: &str) {
    let labels = [
        ("component".to_string(), component.to_string()),
        ("version".to_string(), version.to_string()),
    ];
    registry.register(
        "build",
        "The component and its version",
        prometheus_client::metrics::info::Info::new(labels.to_vec()),
    );
}
