//! What the benchmark reads from the logs: the apiserver's audit log
//! (API requests by writer, kind and verb) and the registry's access log
//! (requests by what they fetch).

use super::*;
/// The caches the harness creates and the operator writes the status of,
/// as (kind, plural).
pub(crate) const CACHE_KINDS: &[(&str, &str)] = &[
    ("GKMCache", "gkmcaches"),
    ("ClusterGKMCache", "clustergkmcaches"),
];
/// The node reports the agents write, as (kind, plural): their writes are
/// the agents' report writes and their stored changes are counted.
pub(crate) const AGENT_REPORTS: &[(&str, &str)] = &[
    ("GKMCacheNode", "gkmcachenodes"),
    ("ClusterGKMCacheNode", "clustergkmcachenodes"),
];

/// The gkm.io resources a revision's agents watch: those its agent
/// ClusterRole (`deploy/rbac/agent.yaml`) may `watch`, but the reports they
/// write. Read from each revision's own RBAC, so that the figure counts the
/// caches for a revision whose agents watch the caches, and the releases for
/// one whose agents watch those.
pub(crate) fn agent_watched(tree: &Path) -> anyhow::Result<BTreeSet<String>> {
    let path = tree.join("deploy/rbac/agent.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut watched = BTreeSet::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let object = serde_yaml::Value::deserialize(document)
            .with_context(|| format!("{}: not YAML", path.display()))?;
        if object["kind"].as_str() != Some("ClusterRole") {
            continue;
        }
        let strings = |value: &serde_yaml::Value| -> Vec<String> {
            value
                .as_sequence()
                .map(|items| {
                    items
                        .iter()
                        .filter_map(|i| i.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        for rule in object["rules"].as_sequence().into_iter().flatten() {
            if strings(&rule["apiGroups"]).iter().any(|g| g == "gkm.io")
                && strings(&rule["verbs"]).iter().any(|v| v == "watch")
            {
                watched.extend(strings(&rule["resources"]).into_iter().filter(|r| {
                    !r.contains('/') && !AGENT_REPORTS.iter().any(|(_, plural)| plural == r)
                }));
            }
        }
    }
    anyhow::ensure!(
        !watched.is_empty(),
        "{}: the agents' ClusterRole watches no gkm.io resource but their reports",
        path.display()
    );
    Ok(watched)
}

/// Audit only the operator's and agents' requests, one event per request.
pub(crate) const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  users: [\"system:serviceaccount:gkm-system:gkm-operator\", \"system:serviceaccount:gkm-system:gkm-agent\"]
- level: None
";

/// Requests counted in one phase.
#[derive(Default)]
pub(crate) struct Counts {
    /// (writer, verb, resource[/subresource]) → requests, less the
    /// refused writes.
    pub(crate) api: BTreeMap<(String, String, String), u64>,
    /// (writer, resource[/subresource], response code) → writes the
    /// apiserver refused.
    pub(crate) refused: BTreeMap<(String, String, u64), u64>,
    /// Registry requests: tag resolutions (manifests by tag) and the rest.
    pub(crate) registry_tags: u64,
    pub(crate) registry_other: u64,
    /// Registry GETs of a cache image's layer: one per extraction.
    pub(crate) layer_gets: u64,
    /// Registry requests by kind ([`registry_kind`]: method, what was
    /// asked for, response code).
    pub(crate) registry_kinds: BTreeMap<String, u64>,
    /// Changes the apiserver stored (new resourceVersions, as watched):
    /// of the caches and of the agents' reports.
    pub(crate) cache_changes: u64,
    pub(crate) report_changes: u64,
}

impl Counts {
    /// Registry requests of extractions: a cache image's manifest by digest
    /// and its layer.
    pub(crate) fn extraction_requests(&self) -> u64 {
        self.registry_kinds
            .iter()
            .filter(|(kind, _)| kind.contains(IMAGE_MANIFEST) || kind.as_str() == LAYER_GET)
            .map(|(_, n)| n)
            .sum()
    }

    pub(crate) fn writes(&self, writer: &str, resource: Option<&str>) -> u64 {
        self.api
            .iter()
            .filter(|((w, verb, res), _)| {
                w == writer && is_write(verb) && resource.is_none_or(|r| res == r)
            })
            .map(|(_, n)| n)
            .sum()
    }

    pub(crate) fn refused(&self, writer: &str) -> u64 {
        self.refused
            .iter()
            .filter(|((w, _, _), _)| w == writer)
            .map(|(_, n)| n)
            .sum()
    }

    /// The writes of `writer` to any of `resources` and their status.
    pub(crate) fn writes_to(&self, writer: &str, resources: &[(&str, &str)]) -> u64 {
        resources
            .iter()
            .flat_map(|(_, plural)| [plural.to_string(), format!("{plural}/status")])
            .map(|r| self.writes(writer, Some(&r)))
            .sum()
    }

    pub(crate) fn reads(&self, writer: &str) -> u64 {
        self.api
            .iter()
            .filter(|((w, verb, _), _)| w == writer && !is_write(verb))
            .map(|(_, n)| n)
            .sum()
    }

    pub(crate) fn print(&self, phase: &str) {
        eprintln!(
            "   {phase}: registry {} tag resolutions, {} other requests ({} layer GETs); \
             stored changes: {} of caches, {} of node reports",
            self.registry_tags,
            self.registry_other,
            self.layer_gets,
            self.cache_changes,
            self.report_changes
        );
        for (kind, n) in &self.registry_kinds {
            eprintln!("   {phase}: registry {kind:<40} {n}");
        }
        for ((writer, verb, resource), n) in &self.api {
            eprintln!("   {phase}: {writer:<8} {verb:<8} {resource:<28} {n}");
        }
        for ((writer, resource, code), n) in &self.refused {
            eprintln!("   {phase}: {writer:<8} refused  {resource:<28} {n} ({code})");
        }
    }
}

pub(crate) fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

/// Where a log file was read up to.
pub(crate) struct LogMark {
    pub(crate) path: PathBuf,
    pub(crate) offset: u64,
}

impl LogMark {
    pub(crate) fn at_end(path: &Path) -> anyhow::Result<LogMark> {
        let offset = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        Ok(LogMark {
            path: path.to_path_buf(),
            offset,
        })
    }

    /// The whole lines written since the mark; moves the mark past them.
    pub(crate) fn new_lines(&mut self) -> anyhow::Result<Vec<String>> {
        let mut file = std::fs::File::open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        file.seek(std::io::SeekFrom::Start(self.offset))?;
        let mut reader = std::io::BufReader::new(file);
        let mut lines = Vec::new();
        let mut line = String::new();
        while reader.read_line(&mut line)? > 0 {
            if !line.ends_with('\n') {
                break;
            }
            self.offset += line.len() as u64;
            lines.push(std::mem::take(&mut line));
        }
        Ok(lines)
    }
}

/// One request of the registry's access log.
pub(crate) struct RegistryRequest<'a> {
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    /// The response code (0 where the line has none).
    pub(crate) code: u16,
}

/// The request of an access log line (`… "GET /v2/... HTTP/1.1" 200 …`).
pub(crate) fn registry_request(line: &str) -> Option<RegistryRequest<'_>> {
    let mut quoted = line.split('"');
    let request = quoted.nth(1)?;
    let code = quoted
        .next()
        .and_then(|after| after.split_whitespace().next())
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let mut parts = request.split(' ');
    let method = parts.next()?;
    let path = parts.next()?;
    (matches!(method, "GET" | "HEAD" | "PUT" | "POST" | "PATCH" | "DELETE")
        && path.starts_with("/v2/"))
    .then_some(RegistryRequest { method, path, code })
}

/// The kind of a cache image's layer GET (one per extraction).
pub(crate) const LAYER_GET: &str = "GET layer blob 200";
/// What a request for a cache image's manifest by digest is.
pub(crate) const IMAGE_MANIFEST: &str = "image manifest by digest";

/// The digests of the cache images the benchmark pushed.
#[derive(Default)]
pub(crate) struct CacheImages {
    /// Their manifests.
    pub(crate) manifests: BTreeSet<String>,
    /// Their layers.
    pub(crate) layers: BTreeSet<String>,
}

/// What a registry request asked for, without the repository or digest
/// (`GET manifest by tag 200`, `HEAD cosign v2 .sig tag 404`, …): the
/// figure that says which requests each cache and each extraction cost.
/// A cache image's manifest and layer are told apart from the signatures'
/// and other blobs.
pub(crate) fn registry_kind(request: &RegistryRequest, images: &CacheImages) -> String {
    let path = request.path;
    let what = if path == "/v2/" {
        "API version check"
    } else if let Some((_, reference)) = path.rsplit_once("/manifests/") {
        match reference.strip_prefix("sha256-") {
            Some(rest) if rest.ends_with(".sig") => "cosign v2 .sig tag",
            Some(_) => "referrers tag-schema index",
            None if images.manifests.contains(reference) => IMAGE_MANIFEST,
            None if reference.starts_with("sha256:") => "other manifest by digest",
            None => "manifest by tag",
        }
    } else if let Some((_, digest)) = path.rsplit_once("/blobs/") {
        if images.layers.contains(digest) {
            "layer blob"
        } else {
            "other blob"
        }
    } else if path.contains("/referrers/") {
        "referrers API"
    } else {
        "other"
    };
    format!("{} {what} {}", request.method, request.code)
}

/// A manifest request by tag (not by digest, not a `sha256-…` signature tag).
pub(crate) fn is_tag_resolution(path: &str) -> bool {
    path.rsplit_once("/manifests/")
        .is_some_and(|(_, reference)| !reference.starts_with("sha256"))
}
