//! The extender's HTTP verbs, served beside `/healthz`, `/readyz` and
//! `/metrics` by [`crate::runtime`]: `POST /scheduler/filter`,
//! `/scheduler/prioritize` and `/scheduler/bind` (`/scheduler/predicates`
//! is accepted for filter, gpu-admission's verb), and `GET
//! /scheduler/latency` (exact answer-time quantiles, [`super::latency`]).

use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Response, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::bind;
use super::index::{Index, IndexConfig};
use super::latency::{Quantiles, Samples};
use super::protocol::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult,
};
use super::verbs;
use gkm_k8s_runtime::endpoints::{ResponseFuture, Routes, text};
use gkm_k8s_runtime::readiness::Readiness;

/// The URL prefix of the verbs (the `urlPrefix` of the scheduler's
/// configuration ends with it).
pub const URL_PREFIX: &str = "/scheduler";

/// `GET` here answers with the exact p50, p99 and maximum answer time of
/// each verb over its most recent calls, as JSON
/// (`{"filter":{"count":…,"p50":…,"p99":…,"max":…},…}`, seconds).
pub const LATENCY_PATH: &str = "/scheduler/latency";

/// The largest request body a verb accepts: a scheduler call names nodes
/// (`nodeCacheCapable`) and carries one pod, far below this. A larger body
/// is refused with `413` before it is read whole.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// The calls answered at once; one more is refused with `503` (the
/// scheduler retries). kube-scheduler calls filter and prioritize for one
/// pod at a time and binds a few pods at once, far below this.
pub const MAX_IN_FLIGHT: usize = 64;

/// A verb's label in the metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabel {
    verb: String,
}

/// A bind outcome's label in the metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

/// Fine buckets below 5 ms, where the extender's answers should fall.
fn latency_histogram() -> Histogram {
    Histogram::new([
        0.000_025, 0.000_05, 0.000_1, 0.000_2, 0.000_3, 0.000_5, 0.000_75, 0.001, 0.001_5, 0.002,
        0.003, 0.004, 0.005, 0.007_5, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
    ])
}

/// The extender: the index behind a lock, the apiserver client bind uses,
/// and the pods the watch has seen.
pub struct Extender {
    index: RwLock<Index>,
    client: Option<kube::Client>,
    pods: Option<Store<Pod>>,
    synced: Readiness,
    latency: Family<VerbLabel, Histogram, fn() -> Histogram>,
    samples: Mutex<Samples>,
    binds: Family<ResultLabel, Counter>,
}

impl Extender {
    /// An extender over an empty index. Without a `client`, bind refuses;
    /// without `pods`, bind reads the pod from the apiserver. Filter and
    /// prioritize answer with an error until every check of `synced` is
    /// ready.
    pub fn new(
        config: IndexConfig,
        client: Option<kube::Client>,
        pods: Option<Store<Pod>>,
        synced: Readiness,
    ) -> Extender {
        Extender {
            index: RwLock::new(Index::new(config)),
            client,
            pods,
            synced,
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            samples: Mutex::new(Samples::default()),
            binds: Family::default(),
        }
    }

    /// Registers the extender's metrics: `extender_request_duration_seconds`
    /// per verb and `extender_binds_total` per result.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "extender_request_duration_seconds",
            "Time the extender took to answer, per verb",
            self.latency.clone(),
        );
        registry.register(
            "extender_binds",
            "Bind calls, per result",
            self.binds.clone(),
        );
    }

    /// The index, for reading. A panic elsewhere never leaves it half
    /// updated (updates do not panic), so a poisoned lock is still usable.
    pub fn read(&self) -> RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The index, for updating.
    pub fn write(&self) -> RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The filter verb.
    pub fn filter(&self, args: &ExtenderArgs) -> ExtenderFilterResult {
        if !self.synced.is_ready() {
            return ExtenderFilterResult {
                error: "gkm: the extender is still reading the cluster; retry".into(),
                ..ExtenderFilterResult::default()
            };
        }
        verbs::filter(&self.read(), args)
    }

    /// The prioritize verb.
    pub fn prioritize(&self, args: &ExtenderArgs) -> super::protocol::HostPriorityList {
        verbs::prioritize(&self.read(), args)
    }

    /// The bind verb: reserves room on the node, writes the device
    /// assignment to the pod, then binds it. Safe to retry.
    pub async fn bind(&self, args: &ExtenderBindingArgs) -> ExtenderBindingResult {
        let outcome = match &self.client {
            Some(client) => bind::bind(self, client, args).await,
            None => Err("gkm: the extender has no apiserver client".to_string()),
        };
        let result = if outcome.is_ok() { "bound" } else { "error" };
        self.binds
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
        ExtenderBindingResult {
            error: outcome.err().unwrap_or_default(),
        }
    }

    /// The pod `namespace/name` as the watch last saw it.
    pub(super) fn cached_pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        let pods = self.pods.as_ref()?;
        pods.get(&ObjectRef::new(name).within(namespace))
    }

    fn observe(&self, verb: &str, began: Instant) {
        let seconds = began.elapsed().as_secs_f64();
        self.latency
            .get_or_create(&VerbLabel { verb: verb.into() })
            .observe(seconds);
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(verb, seconds);
    }

    /// The exact p50, p99 and maximum answer time of each verb over its
    /// most recent calls (`GET /scheduler/latency`).
    pub fn latency(&self) -> std::collections::BTreeMap<String, Quantiles> {
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .quantiles()
    }
}

impl Routes for Extender {
    fn serves(&self, path: &str) -> bool {
        path.strip_prefix(URL_PREFIX)
            .is_some_and(|rest| rest.starts_with('/'))
    }

    fn max_body_bytes(&self) -> usize {
        MAX_BODY_BYTES
    }

    fn max_in_flight(&self) -> Option<usize> {
        Some(MAX_IN_FLIGHT)
    }

    fn respond<'a>(&'a self, method: &'a Method, path: &'a str, body: Bytes) -> ResponseFuture<'a> {
        Box::pin(async move {
            if method == Method::GET && path.trim_end_matches('/') == LATENCY_PATH {
                return json(&self.latency());
            }
            if method != Method::POST {
                return text(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "the extender's verbs take POST\n".into(),
                );
            }
            let began = Instant::now();
            let verb = path.trim_start_matches(URL_PREFIX).trim_matches('/');
            let response = match verb {
                "filter" | "predicates" => {
                    parse(&body).map(|args: ExtenderArgs| json(&self.filter(&args)))
                }
                "prioritize" => {
                    parse(&body).map(|args: ExtenderArgs| json(&self.prioritize(&args)))
                }
                "bind" => match parse::<ExtenderBindingArgs>(&body) {
                    Ok(args) => Ok(json(&self.bind(&args).await)),
                    Err(e) => Err(e),
                },
                other => {
                    return text(
                        StatusCode::NOT_FOUND,
                        format!("no verb {other:?}; the verbs are filter, prioritize and bind\n"),
                    );
                }
            };
            let response = response.unwrap_or_else(|e| text(StatusCode::BAD_REQUEST, e));
            let verb = if verb == "predicates" { "filter" } else { verb };
            self.observe(verb, began);
            response
        })
    }
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| format!("not an extender call: {e}\n"))
}

fn json(value: &impl Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_vec(value) {
        Ok(body) => {
            let mut response = Response::new(Full::new(Bytes::from(body)));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding: {e}\n"),
        ),
    }
}
