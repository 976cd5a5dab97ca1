//! The figures a run writes, the summary of what scales, and the table
//! comparing two revisions.

use super::*;

/// What one run measured.
#[derive(Default)]
pub(crate) struct Measured {
    pub(crate) start: Counts,
    pub(crate) converge: Counts,
    pub(crate) change: Counts,
    pub(crate) idle: Counts,
    /// The pod-end phase ([`end_pods`]).
    pub(crate) pod_end: Counts,
    /// Its pods' ends (usage records written), and the time until every
    /// cache's status counted them.
    pub(crate) pods_ended: usize,
    pub(crate) pod_end_secs: f64,
    /// The status bytes of a fitting node's report before and after.
    pub(crate) report_bytes: Option<(usize, usize)>,
    pub(crate) converge_secs: f64,
    pub(crate) change_secs: f64,
    pub(crate) settled_quiet: bool,
    pub(crate) operator_rss_mib: f64,
    pub(crate) operator_peak_rss_mib: f64,
    pub(crate) operator_cpu_secs: f64,
    pub(crate) agents_rss_mib: f64,
    pub(crate) agents_cpu_secs: f64,
    /// Watch events of the resources agents watch, while converging.
    pub(crate) agent_watch_events_converge: f64,
    /// Likewise while idle, when nothing changes: the watches' keep-alive
    /// (bookmarks, sent to every watch about once a minute), the rate
    /// that is not changes.
    pub(crate) agent_watch_events_idle: Option<f64>,
    /// How many caches converged when CONVERGE_TIMEOUT_SECS ran out, when
    /// not all did; the change and idle phases did not run then.
    pub(crate) timed_out_with: Option<usize>,
}

impl Measured {
    /// The figures `compare` reads, by name.
    pub(crate) fn figures(&self, scale: &Scale) -> serde_json::Value {
        let per = |n: u64, objects: usize| n as f64 / objects.max(1) as f64;
        let cache_writes = |c: &Counts| c.writes_to("operator", CACHE_KINDS);
        let report_writes = |c: &Counts| c.writes_to("agents", AGENT_REPORTS);
        // The cache changes the operator made: those stored, less the
        // harness's own (one create per cache, one spec change per changed
        // cache).
        let operator_changes = |c: &Counts, own: usize| c.cache_changes.saturating_sub(own as u64);
        let ratio = |writes: u64, changes: u64| writes as f64 / changes.max(1) as f64;
        let (start, converge, change, idle, pod_end) = (
            &self.start,
            &self.converge,
            &self.change,
            &self.idle,
            &self.pod_end,
        );
        let per_pod_end = |n: u64| per(n, self.pods_ended);
        let mut figures = json!({
            "nodes": scale.nodes,
            "caches": scale.caches,
            "t4_per_ten": scale.t4_per_ten,
            "changed": scale.changed,
            "idle_secs": scale.idle.as_secs(),
            "converge_secs": self.converge_secs,
            "change_secs": self.change_secs,
            "agent_label_writes_per_node": per(start.writes("agents", Some("nodes")), scale.nodes),
            "converge_operator_writes": converge.writes("operator", None),
            "converge_operator_cache_writes_per_cache": per(cache_writes(converge), scale.caches),
            "converge_operator_cache_writes_per_stored_change": ratio(
                cache_writes(converge),
                operator_changes(converge, scale.caches),
            ),
            "converge_operator_events": converge.writes("operator", Some("events")),
            "converge_agent_writes": converge.writes("agents", None),
            "converge_agent_report_writes_per_node": per(report_writes(converge), scale.nodes),
            "converge_agent_report_writes_per_stored_change": ratio(
                report_writes(converge),
                converge.report_changes,
            ),
            "converge_agent_events": converge.writes("agents", Some("events")),
            "converge_operator_writes_refused": converge.refused("operator"),
            "converge_agent_writes_refused": converge.refused("agents"),
            "converge_registry_requests": converge.registry_tags + converge.registry_other,
            "change_operator_writes": change.writes("operator", None),
            "change_operator_cache_writes_per_changed_cache": per(cache_writes(change), scale.changed),
            "change_operator_cache_writes_per_stored_change": ratio(
                cache_writes(change),
                operator_changes(change, scale.changed),
            ),
            "change_agent_writes": change.writes("agents", None),
            "change_agent_report_writes_per_node": per(report_writes(change), scale.nodes),
            "change_agent_report_writes_per_stored_change": ratio(
                report_writes(change),
                change.report_changes,
            ),
            "change_registry_requests": change.registry_tags + change.registry_other,
            "change_operator_writes_refused": change.refused("operator"),
            "change_agent_writes_refused": change.refused("agents"),
            "idle_operator_writes": idle.writes("operator", None),
            "idle_agent_writes": idle.writes("agents", None),
            "idle_operator_reads": idle.reads("operator"),
            "idle_agent_reads": idle.reads("agents"),
            "idle_registry_tag_resolutions": idle.registry_tags,
            "idle_registry_other_requests": idle.registry_other,
            "operator_rss_mib": self.operator_rss_mib,
            "operator_peak_rss_mib": self.operator_peak_rss_mib,
            "agents_process_rss_mib": self.agents_rss_mib,
            "operator_cpu_secs": self.operator_cpu_secs,
            "agents_process_cpu_secs": self.agents_cpu_secs,
            "settled_quiet": self.settled_quiet,
        });
        // Apart: one macro holding every figure passes serde_json's
        // recursion limit.
        let pod_end_figures = json!({
            "pod_end_secs": self.pod_end_secs,
            "pod_end_agent_writes_per_pod_end": per_pod_end(pod_end.writes("agents", None)),
            "pod_end_agent_report_writes_per_pod_end": per_pod_end(report_writes(pod_end)),
            "pod_end_agent_report_writes_per_stored_change": ratio(
                report_writes(pod_end),
                pod_end.report_changes,
            ),
            "pod_end_agent_events_per_pod_end": per_pod_end(pod_end.writes("agents", Some("events"))),
            "pod_end_operator_cache_writes_per_cache": per(cache_writes(pod_end), scale.caches),
            "pod_end_operator_cache_writes_per_stored_change": ratio(
                cache_writes(pod_end),
                pod_end.cache_changes,
            ),
            "pod_end_report_bytes_before": self.report_bytes.map(|(before, _)| before),
            "pod_end_report_bytes_after": self.report_bytes.map(|(_, after)| after),
        });
        if let (Some(figures), Some(pod_end)) =
            (figures.as_object_mut(), pod_end_figures.as_object())
        {
            figures.extend(pod_end.clone());
        }
        figures["agent_watch_events_converge"] = json!(self.agent_watch_events_converge);
        let summary = self.summary(scale);
        figures["agent_watch_events_idle_per_sec"] =
            json!(summary.agent_watch_events_idle_per_second);
        figures["agent_watch_events_converge_beyond_idle_rate"] =
            json!(summary.agent_watch_events_converge_beyond_idle_rate);
        figures["extractions"] = json!(self.extractions());
        figures["converged_caches"] = json!(self.timed_out_with.unwrap_or(scale.caches));
        if self.timed_out_with.is_some() {
            // Those phases did not run.
            let skipped = |key: &String| {
                (key.starts_with("change_")
                    || key.starts_with("idle_")
                    || key.starts_with("pod_end_"))
                    && key != "idle_secs"
            };
            if let Some(object) = figures.as_object_mut() {
                object
                    .iter_mut()
                    .filter(|(key, _)| skipped(key))
                    .for_each(|(_, value)| *value = serde_json::Value::Null);
                object.insert("settled_quiet".into(), serde_json::Value::Null);
            }
        }
        figures["summary"] = json!(summary);
        figures
    }

    /// Extractions (GETs of a cache image's layer) after the start.
    pub(crate) fn extractions(&self) -> u64 {
        [&self.converge, &self.change, &self.pod_end, &self.idle]
            .iter()
            .map(|c| c.layer_gets)
            .sum()
    }

    /// What scales, over the converge and change phases.
    pub(crate) fn summary(&self, scale: &Scale) -> Summary {
        let moving = [&self.converge, &self.change];
        let sum = |f: &dyn Fn(&Counts) -> u64| moving.iter().map(|c| f(c)).sum::<u64>();
        let ratio = |writes: u64, changes: u64| writes as f64 / changes.max(1) as f64;
        // The harness's own cache changes (creations, spec changes) are not
        // the operator's.
        let harness_changes = (scale.caches + scale.changed) as u64;
        let converge = &self.converge;
        let extraction_requests = converge.extraction_requests();
        let converge_requests = converge.registry_tags + converge.registry_other;
        let idle_rate = self
            .agent_watch_events_idle
            .map(|events| events / scale.idle.as_secs_f64().max(1.0));
        Summary {
            scale: ScaleSummary {
                nodes: scale.nodes,
                caches: scale.caches,
                changed: scale.changed,
                t4_per_ten: scale.t4_per_ten,
                signatures: scale.signatures,
                idle_secs: scale.idle.as_secs(),
            },
            converged_caches: self.timed_out_with.unwrap_or(scale.caches),
            converge_seconds: self.converge_secs,
            change_seconds: self.timed_out_with.is_none().then_some(self.change_secs),
            operator_writes_per_stored_change: ratio(
                sum(&|c| c.writes_to("operator", CACHE_KINDS)),
                sum(&|c| c.cache_changes).saturating_sub(harness_changes),
            ),
            agent_writes_per_stored_change: ratio(
                sum(&|c| c.writes_to("agents", AGENT_REPORTS)),
                sum(&|c| c.report_changes),
            ),
            agent_watch_events_converge: self.agent_watch_events_converge,
            agent_watch_events_idle_per_second: idle_rate,
            agent_watch_events_converge_beyond_idle_rate: idle_rate
                .map(|rate| self.agent_watch_events_converge - rate * self.converge_secs),
            registry_requests_converge: converge_requests,
            registry_requests_per_cache_converge: (converge_requests - extraction_requests) as f64
                / scale.caches.max(1) as f64,
            registry_requests_per_extraction_converge: (converge.layer_gets > 0)
                .then(|| extraction_requests as f64 / converge.layer_gets as f64),
            registry_requests_converge_by_kind: converge.registry_kinds.clone(),
            registry_requests_idle: self
                .timed_out_with
                .is_none()
                .then_some(self.idle.registry_tags + self.idle.registry_other),
            registry_requests_idle_by_kind: self.idle.registry_kinds.clone(),
            extractions: self.extractions(),
            writes_per_pod_end: (self.pods_ended > 0).then(|| {
                let writes =
                    self.pod_end.writes("agents", None) + self.pod_end.writes("operator", None);
                writes as f64 / self.pods_ended as f64
            }),
            report_bytes_per_counted_cache: self.report_bytes.map(|(before, after)| {
                after.saturating_sub(before) as f64 / scale.caches.max(1) as f64
            }),
            operator_rss_mib: self.operator_rss_mib,
            agents_cpu_seconds: self.agents_cpu_secs,
        }
    }
}

/// The size of a run, as its summary states it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ScaleSummary {
    pub(crate) nodes: usize,
    pub(crate) caches: usize,
    pub(crate) changed: usize,
    /// Of every ten nodes, how many have the GPU the caches fit (0: no
    /// node does, nothing is extracted).
    pub(crate) t4_per_ten: usize,
    /// How the images were signed (`v3`: sigstore bundles as referrers;
    /// `v2`: cosign's `.sig` tag).
    pub(crate) signatures: Signatures,
    pub(crate) idle_secs: u64,
}

/// What scales, per revision: the figures `summary.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Summary {
    /// What ran.
    pub(crate) scale: ScaleSummary,
    /// How many caches converged on every node: all of them, or as many as
    /// had when CONVERGE_TIMEOUT_SECS ran out.
    pub(crate) converged_caches: usize,
    /// Time for the caches to converge on every node (when not all did:
    /// CONVERGE_TIMEOUT_SECS, the time given).
    pub(crate) converge_seconds: f64,
    /// Time for the changed caches to converge again; `null` when the
    /// first convergence timed out and this phase did not run.
    pub(crate) change_seconds: Option<f64>,
    /// The operator's writes to caches (and their status) per change the
    /// apiserver stored, converging and changing (1: every write changed
    /// something).
    pub(crate) operator_writes_per_stored_change: f64,
    /// The agents' writes to their reports per stored change, likewise.
    pub(crate) agent_writes_per_stored_change: f64,
    /// Watch events sent for the resources agents watch ([`agent_watched`])
    /// while converging.
    pub(crate) agent_watch_events_converge: f64,
    /// Those events per second while idle, when nothing changed: what the
    /// watches send without changes (bookmarks); `null` when the idle phase
    /// did not run.
    pub(crate) agent_watch_events_idle_per_second: Option<f64>,
    /// `agent_watch_events_converge` less that idle rate over the time
    /// converging took: the events that carried changes.
    pub(crate) agent_watch_events_converge_beyond_idle_rate: Option<f64>,
    /// Registry requests while converging, and while idle.
    pub(crate) registry_requests_converge: u64,
    /// Of those, the ones that are not an extraction's (an image's manifest
    /// by digest and its layer), per cache: resolving the tag and finding
    /// and reading its signatures.
    pub(crate) registry_requests_per_cache_converge: f64,
    /// An extraction's requests (image manifest by digest, layer) per
    /// extraction while converging; `null` when nothing was extracted.
    pub(crate) registry_requests_per_extraction_converge: Option<f64>,
    /// The requests while converging by kind: method, what was asked for
    /// (tag, signature tag, referrers, manifest, blob…), response code.
    pub(crate) registry_requests_converge_by_kind: BTreeMap<String, u64>,
    /// `null` when the idle phase did not run (see `change_seconds`).
    pub(crate) registry_requests_idle: Option<u64>,
    /// The requests while idle by kind, likewise.
    pub(crate) registry_requests_idle_by_kind: BTreeMap<String, u64>,
    /// GETs of a cache image's layer after the start: one per extraction.
    pub(crate) extractions: u64,
    /// API writes (agents and operator: reports, Events, cache statuses)
    /// per pod end counted ([`end_pods`]); `null` when that phase did not
    /// run.
    #[serde(default)]
    pub(crate) writes_per_pod_end: Option<f64>,
    /// What a node report's status grew by per cache whose digest counts a
    /// workload, in bytes.
    #[serde(default)]
    pub(crate) report_bytes_per_counted_cache: Option<f64>,
    /// The operator's RSS at the end.
    pub(crate) operator_rss_mib: f64,
    /// CPU time of the agents' process.
    pub(crate) agents_cpu_seconds: f64,
}

/// The summaries of the revisions that ran, and after / baseline of each
/// figure when both did (`null` where the baseline's is 0).
#[derive(Debug, Serialize)]
pub(crate) struct Summaries {
    pub(crate) baseline: Option<Summary>,
    pub(crate) after: Summary,
    pub(crate) ratios: Option<BTreeMap<String, Option<f64>>>,
}

impl Summaries {
    pub(crate) fn new(baseline: Option<Summary>, after: Summary) -> anyhow::Result<Summaries> {
        let ratios = match &baseline {
            None => None,
            Some(base) => {
                let (base, new) = (serde_json::to_value(base)?, serde_json::to_value(&after)?);
                let mut ratios = BTreeMap::new();
                // Numbers only: the scale and the requests by kind are not.
                let numbers = base
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(_, b)| b.is_number());
                for (key, b) in numbers {
                    let ratio = match (b.as_f64(), new[key].as_f64()) {
                        (Some(b), Some(a)) if b != 0.0 => Some(a / b),
                        _ => None,
                    };
                    ratios.insert(key.clone(), ratio);
                }
                Some(ratios)
            }
        };
        Ok(Summaries {
            baseline,
            after,
            ratios,
        })
    }
}

impl Measured {
    /// Reads the processes' memory and CPU time, prints the counts, writes
    /// the figures to `out` and stops the operator and the agents.
    pub(crate) fn finish(mut self, scale: &Scale, mut gkm: Gkm, out: &Path) -> anyhow::Result<()> {
        (self.operator_rss_mib, self.operator_peak_rss_mib) =
            gkm_testenv::memory_mib(gkm.operator.pid())?;
        (self.agents_rss_mib, _) = gkm_testenv::memory_mib(gkm.agents.pid())?;
        self.operator_cpu_secs = gkm_testenv::cpu_seconds(gkm.operator.pid())?;
        self.agents_cpu_secs = gkm_testenv::cpu_seconds(gkm.agents.pid())?;
        for (phase, counts) in [
            ("start", &self.start),
            ("converge", &self.converge),
            ("change", &self.change),
            ("pod end", &self.pod_end),
            ("idle", &self.idle),
        ] {
            counts.print(phase);
        }
        std::fs::write(out, serde_json::to_string_pretty(&self.figures(scale))?)?;
        gkm.agents.stop(Duration::from_secs(5));
        gkm.operator.stop(Duration::from_secs(5));
        Ok(())
    }
}

/// The rows of the table: figure, what "after" should meet.
pub(crate) const ROWS: &[(&str, &str)] = &[
    ("converged_caches", ""),
    ("converge_secs", ""),
    ("change_secs", ""),
    ("agent_label_writes_per_node", "<= 1"),
    ("converge_operator_writes", ""),
    ("converge_operator_cache_writes_per_cache", ""),
    ("converge_operator_cache_writes_per_stored_change", "<= 1"),
    ("converge_operator_events", ""),
    ("converge_agent_writes", ""),
    ("converge_agent_report_writes_per_node", ""),
    ("converge_agent_report_writes_per_stored_change", "<= 1"),
    ("converge_agent_events", ""),
    ("converge_operator_writes_refused", ""),
    ("converge_agent_writes_refused", ""),
    ("converge_registry_requests", ""),
    ("change_operator_writes", ""),
    ("change_operator_cache_writes_per_changed_cache", ""),
    ("change_operator_cache_writes_per_stored_change", "<= 1"),
    ("change_agent_writes", ""),
    ("change_agent_report_writes_per_node", ""),
    ("change_agent_report_writes_per_stored_change", "<= 1"),
    ("change_registry_requests", ""),
    ("change_operator_writes_refused", ""),
    ("change_agent_writes_refused", ""),
    ("pod_end_secs", ""),
    ("pod_end_agent_writes_per_pod_end", ""),
    ("pod_end_agent_report_writes_per_pod_end", ""),
    ("pod_end_agent_report_writes_per_stored_change", "<= 1"),
    ("pod_end_agent_events_per_pod_end", "<= 1"),
    ("pod_end_operator_cache_writes_per_cache", ""),
    ("pod_end_operator_cache_writes_per_stored_change", "<= 1"),
    ("pod_end_report_bytes_before", ""),
    ("pod_end_report_bytes_after", ""),
    ("idle_operator_writes", "0"),
    ("idle_agent_writes", "0"),
    ("idle_operator_reads", ""),
    ("idle_agent_reads", ""),
    (
        "idle_registry_tag_resolutions",
        "periodic re-resolution only",
    ),
    ("idle_registry_other_requests", "0"),
    ("operator_rss_mib", "< 100"),
    ("operator_peak_rss_mib", "< 100"),
    ("agents_process_rss_mib", ""),
    ("operator_cpu_secs", ""),
    ("agents_process_cpu_secs", ""),
    ("agent_watch_events_converge", ""),
    ("agent_watch_events_idle_per_sec", ""),
    (
        "agent_watch_events_converge_beyond_idle_rate",
        "<= nodes x changes x 1.1",
    ),
    ("extractions", ""),
];

/// Prints the table of `baseline` (`-`: none) and `after`; with `summary`,
/// writes their [`Summaries`] there and prints its path.
pub(crate) fn compare(baseline: &Path, after: &Path, summary: Option<&Path>) -> anyhow::Result<()> {
    let read = |path: &Path| -> anyhow::Result<serde_json::Value> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Ok(serde_json::from_str(&text)?)
    };
    // `-`: the after run alone, its baseline column empty.
    let base = match baseline.to_str() {
        Some("-") => serde_json::Value::Null,
        _ => read(baseline)?,
    };
    let new = read(after)?;
    for key in ["nodes", "caches", "t4_per_ten", "changed", "idle_secs"] {
        anyhow::ensure!(
            base.is_null() || base[key] == new[key],
            "the runs differ in {key}: {} and {}",
            base[key],
            new[key]
        );
    }
    println!(
        "nodes {} ({} in 10 with a T4), caches {}, changed {}, idle {} s; settled quietly: baseline {}, after {}",
        new["nodes"],
        new["t4_per_ten"],
        new["caches"],
        new["changed"],
        new["idle_secs"],
        base["settled_quiet"],
        new["settled_quiet"]
    );
    println!(
        "{:<48} {:>12} {:>12} {:>8}  target (after)",
        "figure", "baseline", "after", "ratio"
    );
    for (key, target) in ROWS {
        let (b, a) = (base[key].as_f64(), new[key].as_f64());
        let show = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.2}"));
        let ratio = match (b, a) {
            (Some(b), Some(a)) if b > 0.0 => format!("{:.2}", a / b),
            (Some(_), Some(0.0)) => "=".into(),
            _ => "-".into(),
        };
        println!(
            "{key:<48} {:>12} {:>12} {ratio:>8}  {target}",
            show(b),
            show(a)
        );
    }
    if let Some(path) = summary {
        let of = |figures: &serde_json::Value, which: &str| -> anyhow::Result<Summary> {
            serde_json::from_value(figures["summary"].clone())
                .with_context(|| format!("the {which} figures have no summary"))
        };
        let baseline = if base.is_null() {
            None
        } else {
            Some(of(&base, "baseline")?)
        };
        let summaries = Summaries::new(baseline, of(&new, "after")?)?;
        std::fs::write(path, serde_json::to_string_pretty(&summaries)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("summary: {}", path.display());
    }
    Ok(())
}
