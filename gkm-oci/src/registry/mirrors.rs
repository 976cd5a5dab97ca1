//! Registry mirrors and pull-through caches (Spegel, Dragonfly, Harbor
//! proxy projects), configured as containerd configures them: one
//! directory per registry host under a configuration directory, holding a
//! `hosts.toml` file (`<dir>/<registry>/hosts.toml`, `<dir>/_default/`
//! for any registry without its own).
//!
//! ```toml
//! server = "https://registry.example"       # the origin (default: the registry itself)
//!
//! [host."http://127.0.0.1:30020"]           # tried first, in file order
//!   capabilities = ["pull", "resolve"]
//! [host."https://harbor.example/v2/proxy"]
//!   capabilities = ["pull"]
//!   override_path = true
//! ```
//!
//! What gkm reads: `server`; per `[host."URL"]` table (and at the top
//! level, for the server) `capabilities` (`pull`, `resolve`; `push` is
//! accepted and has no effect: gkm writes only to the registry an image
//! names), `skip_verify`, `override_path` and `dial_timeout`. Plain-HTTP
//! hosts are written as `http://` URLs. `ca`, `client`, `header` and
//! `proxy` are refused with an error naming the file and the key, as is
//! any key gkm does not know: ignoring them would make gkm connect
//! differently from what the file asks for (another trust root, no client
//! certificate, no proxy) while looking configured.
//!
//! The rule gkm keeps: **a mirror only ever serves content-addressed
//! bytes**. Every blob and every manifest fetched by digest is hashed and
//! compared with the digest that named it; a host serving other bytes is
//! refused (the error names the host and the digest) and the next host is
//! tried. Turning a tag into a digest is asked only of hosts with the
//! `resolve` capability; in a cluster it is the operator that resolves
//! tags, at the origin (it is given no mirrors), and it verifies the
//! signatures of that digest, so the digest every node and fill Job pulls
//! always comes from the origin's manifest.
//!
//! This module is the pure part: reading the files, and deciding which
//! hosts to ask, in which order, at which URLs.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};
use gkm_core::digest::Digest;

/// Where the agent and fill Jobs look for registry host files by default.
pub const DEFAULT_CONFIG_DIR: &str = "/etc/gkm/registry.d";

/// The file in each registry's directory.
pub const HOSTS_FILE: &str = "hosts.toml";

/// The directory that applies to registries without one of their own.
pub const DEFAULT_NAMESPACE: &str = "_default";

/// Where registry host files come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HostsConfig {
    /// No mirrors: every read goes to the registry an image names.
    #[default]
    None,
    /// A containerd-style configuration directory (a missing directory
    /// means no mirrors). Files are read when a repository is opened, so
    /// changes apply to the next pull, as in containerd.
    Dir(PathBuf),
    /// The text of one `hosts.toml`, applying to whatever registry is
    /// opened: what the operator hands a fill Job for its image's registry.
    Text(String),
}

impl HostsConfig {
    /// The host file that applies to `registry` (`host[:port]` as written
    /// in image references, `docker.io` for Docker Hub): where it is, for
    /// errors, and its text.
    pub fn file_for(&self, registry: &str) -> Result<Option<(String, String)>> {
        match self {
            HostsConfig::None => Ok(None),
            HostsConfig::Text(text) => Ok(Some(("the registry hosts text".into(), text.clone()))),
            HostsConfig::Dir(dir) => {
                for namespace in namespace_dirs(registry) {
                    let path = dir.join(namespace).join(HOSTS_FILE);
                    match std::fs::read_to_string(&path) {
                        Ok(text) => return Ok(Some((path.display().to_string(), text))),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(Error::io(&path, e)),
                    }
                }
                Ok(None)
            }
        }
    }

    /// The hosts to read `registry`'s images from, in the order to try
    /// them: its mirrors, then its server. `origin` is where the registry
    /// itself answers (Docker Hub's `index.docker.io` for `docker.io`),
    /// spoken to over plain HTTP when `insecure`, unless the file names a
    /// server.
    pub fn hosts_for(&self, registry: &str, origin: &str, insecure: bool) -> Result<Vec<Host>> {
        match self.file_for(registry)? {
            None => Ok(vec![Host::origin(origin, insecure)]),
            Some((path, text)) => {
                parse_hosts(&text, registry, origin, insecure).map_err(|reason| {
                    Error::HostsConfig {
                        path,
                        reason: reason.to_string(),
                    }
                })
            }
        }
    }

    /// What is wrong with the host files the configuration holds, each
    /// error naming its file and key: for a daemon to report when it
    /// starts. A directory shared with containerd (`/etc/containerd/certs.d`)
    /// may hold files for registries gkm never reads, so these are not
    /// fatal there; a pull from a registry whose file is unusable fails
    /// with the same error.
    pub fn problems(&self) -> Vec<Error> {
        let dir = match self {
            HostsConfig::None => return Vec::new(),
            HostsConfig::Text(text) => {
                let parsed = parse_hosts(text, "registry.invalid", "registry.invalid", false);
                return parsed
                    .err()
                    .map(|reason| Error::HostsConfig {
                        path: "the registry hosts text".into(),
                        reason: reason.to_string(),
                    })
                    .into_iter()
                    .collect();
            }
            HostsConfig::Dir(dir) => dir,
        };
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => return vec![Error::io(dir, e)],
        };
        let mut problems = Vec::new();
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    problems.push(Error::io(dir, e));
                    continue;
                }
            };
            let path = entry.path().join(HOSTS_FILE);
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                // A directory of certificates only, or a file that is not
                // a registry directory (a ConfigMap's `..data` link).
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                    ) =>
                {
                    continue;
                }
                Err(e) => {
                    problems.push(Error::io(&path, e));
                    continue;
                }
            };
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Err(reason) = parse_hosts(&text, &name, &name, false) {
                problems.push(Error::HostsConfig {
                    path: path.display().to_string(),
                    reason: reason.to_string(),
                });
            }
        }
        problems
    }
}

/// The directories searched for `registry`'s file, in containerd's order:
/// `host_port_` and `host:port` for a registry with a port, then
/// [`DEFAULT_NAMESPACE`].
pub fn namespace_dirs(registry: &str) -> Vec<String> {
    let mut dirs = Vec::new();
    if let Some((host, port)) = registry.rsplit_once(':')
        && !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
    {
        dirs.push(format!("{host}_{port}_"));
    }
    dirs.push(registry.to_string());
    dirs.push(DEFAULT_NAMESPACE.to_string());
    dirs
}

/// What a host may be asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Content by digest: blobs and manifests.
    pub pull: bool,
    /// Tags: which digest a tag names now.
    pub resolve: bool,
}

impl Capabilities {
    /// Everything, as containerd assumes when a host lists none.
    pub const ALL: Capabilities = Capabilities {
        pull: true,
        resolve: true,
    };

    /// Whether the host may be asked for `need`.
    pub fn allows(self, need: Need) -> bool {
        match need {
            Need::Pull => self.pull,
            Need::Resolve => self.resolve,
        }
    }
}

/// What a read asks a host for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Bytes named by a digest (blobs, manifests by digest): any host with
    /// `pull`, since the bytes are checked against the digest.
    Pull,
    /// A manifest by tag: only hosts trusted with `resolve`.
    Resolve,
}

/// Whether a host is a mirror or the registry's server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A `[host."…"]` entry.
    Mirror,
    /// The `server` (or the registry itself), tried after every mirror.
    Server,
}

/// One place to read a registry's images from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// A mirror or the server.
    pub role: Role,
    /// Plain HTTP instead of HTTPS.
    pub plain_http: bool,
    /// `host[:port]`.
    pub authority: String,
    /// The API root the repository path follows (`/v2`, `/prefix/v2`, or
    /// the path itself with `override_path`).
    pub api_root: String,
    /// What it may be asked for.
    pub capabilities: Capabilities,
    /// Accept any TLS certificate (`skip_verify`): content is still checked
    /// against its digest.
    pub skip_verify: bool,
    /// How long connecting may take (`dial_timeout`).
    pub dial_timeout: Option<Duration>,
    /// The registry the request is for, sent as the `ns` query parameter
    /// to a host that is not that registry (as containerd does; Spegel and
    /// Dragonfly use it to know which upstream a request is for).
    pub namespace: Option<String>,
}

impl Host {
    /// The registry itself, all capabilities, at `/v2`.
    pub fn origin(authority: &str, plain_http: bool) -> Host {
        Host {
            role: Role::Server,
            plain_http,
            authority: authority.to_string(),
            api_root: "/v2".into(),
            capabilities: Capabilities::ALL,
            skip_verify: false,
            dial_timeout: None,
            namespace: None,
        }
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> &'static str {
        if self.plain_http { "http" } else { "https" }
    }

    /// The URL of a manifest (`selector` a tag or a digest).
    pub fn manifest_url(&self, repository: &str, selector: &str) -> String {
        self.url(repository, "manifests", selector)
    }

    /// The URL of a blob.
    pub fn blob_url(&self, repository: &str, digest: &Digest) -> String {
        self.url(repository, "blobs", digest.as_str())
    }

    fn url(&self, repository: &str, kind: &str, what: &str) -> String {
        let mut url = format!(
            "{}://{}{}/{repository}/{kind}/{what}",
            self.scheme(),
            self.authority,
            self.api_root
        );
        if let Some(ns) = &self.namespace {
            url.push_str("?ns=");
            url.push_str(ns);
        }
        url
    }
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let role = match self.role {
            Role::Mirror => "mirror",
            Role::Server => "registry",
        };
        write!(
            f,
            "{role} {}://{}{}",
            self.scheme(),
            self.authority,
            self.api_root
        )
    }
}

/// The keys of a host entry (and of the file's top level, for the server).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct HostEntry {
    capabilities: Option<Vec<String>>,
    skip_verify: Option<bool>,
    override_path: Option<bool>,
    dial_timeout: Option<String>,
    ca: Option<toml::Value>,
    client: Option<toml::Value>,
    header: Option<toml::Value>,
    proxy: Option<toml::Value>,
}

/// Why a `hosts.toml` is unusable: which key is wrong and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidHosts(String);

/// The hosts a `hosts.toml` for `registry` lists: mirrors in file order,
/// then the server (`origin`, over plain HTTP when `insecure`, unless the
/// file names one). Errors say which key is wrong and why.
pub fn parse_hosts(
    text: &str,
    registry: &str,
    origin: &str,
    insecure: bool,
) -> std::result::Result<Vec<Host>, InvalidHosts> {
    hosts_in(text, registry, origin, insecure).map_err(InvalidHosts)
}

/// [`parse_hosts`], its error the bare reason.
fn hosts_in(
    text: &str,
    registry: &str,
    origin: &str,
    insecure: bool,
) -> std::result::Result<Vec<Host>, String> {
    let mut file: toml::Table = toml::from_str(text).map_err(|e| e.message().to_string())?;
    let server = match file.remove("server") {
        None => None,
        Some(toml::Value::String(url)) => Some(url),
        Some(_) => return Err("server: expected a URL string".into()),
    };
    let mirrors = match file.remove("host") {
        None => toml::Table::new(),
        Some(toml::Value::Table(mirrors)) => mirrors,
        Some(_) => return Err("host: expected [host.\"URL\"] tables".into()),
    };
    let top: HostEntry = toml::Value::Table(file)
        .try_into()
        .map_err(|e: toml::de::Error| e.message().to_string())?;
    let mut hosts = Vec::new();
    for (url, entry) in mirrors {
        let entry: HostEntry = entry
            .try_into()
            .map_err(|e: toml::de::Error| format!("[host.{url:?}]: {}", e.message()))?;
        hosts.push(
            host(&url, &entry, Role::Mirror, registry)
                .map_err(|reason| format!("[host.{url:?}]: {reason}"))?,
        );
    }
    let server = match &server {
        Some(url) => host(url, &top, Role::Server, registry)
            .map_err(|reason| format!("server {url:?}: {reason}"))?,
        None => {
            let mut origin = host(
                &format!("{}://{origin}", if insecure { "http" } else { "https" }),
                &top,
                Role::Server,
                registry,
            )?;
            origin.namespace = None;
            origin
        }
    };
    hosts.push(server);
    Ok(hosts)
}

/// One host from its URL and keys.
fn host(
    url: &str,
    entry: &HostEntry,
    role: Role,
    registry: &str,
) -> std::result::Result<Host, String> {
    for (key, set) in [
        ("ca", entry.ca.is_some()),
        ("client", entry.client.is_some()),
        ("header", entry.header.is_some()),
        ("proxy", entry.proxy.is_some()),
    ] {
        if set {
            return Err(format!(
                "`{key}` is not supported by gkm (supported: capabilities, skip_verify, \
                 override_path, dial_timeout); use a host gkm can reach without it"
            ));
        }
    }
    let with_scheme = if url.contains("://") {
        url.to_string()
    } else {
        format!("https://{url}")
    };
    let parsed = reqwest::Url::parse(&with_scheme).map_err(|e| format!("not a URL ({e})"))?;
    let plain_http = match parsed.scheme() {
        "http" => true,
        "https" => false,
        other => return Err(format!("scheme {other:?}: expected http or https")),
    };
    if parsed.query().is_some() || parsed.fragment().is_some() || !parsed.username().is_empty() {
        return Err("a host URL has no query, fragment or user".into());
    }
    let Some(name) = parsed.host_str() else {
        return Err("the URL names no host".into());
    };
    let authority = match parsed.port() {
        Some(port) => format!("{name}:{port}"),
        None => name.to_string(),
    };
    let path = parsed.path().trim_end_matches('/');
    let override_path = entry.override_path.unwrap_or(false);
    let api_root = if path.is_empty() && !override_path {
        "/v2".to_string()
    } else if override_path || path.ends_with("/v2") {
        path.to_string()
    } else {
        format!("{path}/v2")
    };
    let capabilities = match &entry.capabilities {
        None => Capabilities::ALL,
        Some(list) => {
            let mut caps = Capabilities {
                pull: false,
                resolve: false,
            };
            for c in list {
                match c.as_str() {
                    "pull" => caps.pull = true,
                    "resolve" => caps.resolve = true,
                    "push" => {}
                    other => {
                        return Err(format!(
                            "capability {other:?}: expected pull, resolve or push"
                        ));
                    }
                }
            }
            caps
        }
    };
    let dial_timeout = entry
        .dial_timeout
        .as_deref()
        .map(parse_duration)
        .transpose()?;
    Ok(Host {
        role,
        plain_http,
        namespace: (authority != registry).then(|| registry.to_string()),
        authority,
        api_root,
        capabilities,
        skip_verify: entry.skip_verify.unwrap_or(false),
        dial_timeout,
    })
}

/// A Go duration as containerd's `dial_timeout` takes it: a number and a
/// unit (`ms`, `s`, `m`), as in `500ms` or `1s`.
fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let bad = || format!("dial_timeout {text:?}: expected a duration such as 500ms, 1s or 1m");
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        _ => return Err(bad()),
    };
    if !(seconds > 0.0 && seconds <= 3600.0) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(text: &str) -> Vec<Host> {
        parse_hosts(
            text,
            "registry.example:5000",
            "registry.example:5000",
            false,
        )
        .expect("parses")
    }

    /// The hosts a read for `need` asks, in order.
    fn urls(hosts: &[Host], need: Need) -> Vec<String> {
        hosts
            .iter()
            .filter(|h| h.capabilities.allows(need))
            .map(Host::to_string)
            .collect()
    }

    #[test]
    fn no_file_means_the_registry_alone() {
        let none = HostsConfig::None
            .hosts_for("registry.example", "registry.example", true)
            .expect("hosts");
        assert_eq!(none, vec![Host::origin("registry.example", true)]);
        let missing = HostsConfig::Dir("/nonexistent/gkm".into())
            .hosts_for("registry.example", "registry.example", false)
            .expect("a missing directory is no mirrors");
        assert_eq!(missing, vec![Host::origin("registry.example", false)]);
    }

    #[test]
    fn mirrors_come_first_in_file_order_and_the_origin_last() {
        let hosts = hosts(
            r#"
            [host."http://zz-first.local:30020"]
              capabilities = ["pull", "resolve"]
            [host."https://aa-second.local"]
              capabilities = ["pull"]
            "#,
        );
        assert_eq!(
            urls(&hosts, Need::Pull),
            [
                "mirror http://zz-first.local:30020/v2",
                "mirror https://aa-second.local/v2",
                "registry https://registry.example:5000/v2",
            ]
        );
        // A pull-only mirror is never asked what a tag means.
        assert_eq!(
            urls(&hosts, Need::Resolve),
            [
                "mirror http://zz-first.local:30020/v2",
                "registry https://registry.example:5000/v2",
            ]
        );
    }

    #[test]
    fn a_server_replaces_the_origin_and_takes_the_top_level_keys() {
        let hosts = hosts(
            r#"
            server = "http://only-mirror.local:5001"
            capabilities = ["pull"]
            skip_verify = true
            "#,
        );
        assert_eq!(hosts.len(), 1);
        assert_eq!(hosts[0].role, Role::Server);
        assert!(hosts[0].plain_http && hosts[0].skip_verify);
        assert!(!hosts[0].capabilities.resolve);
        assert_eq!(urls(&hosts, Need::Resolve), Vec::<String>::new());
        assert_eq!(
            hosts[0].blob_url("team/cache", &Digest::of(b"x")),
            format!(
                "http://only-mirror.local:5001/v2/team/cache/blobs/{}?ns=registry.example:5000",
                Digest::of(b"x")
            )
        );
    }

    #[test]
    fn urls_follow_containerds_path_rules_and_name_the_registry() {
        let hosts = hosts(
            r#"
            [host."https://plain.local"]
            [host."https://prefixed.local/cache"]
            [host."https://harbor.local/v2/proxy-project"]
              override_path = true
            "#,
        );
        let at = |i: usize| hosts[i].manifest_url("team/cache", "v1");
        assert_eq!(
            at(0),
            "https://plain.local/v2/team/cache/manifests/v1?ns=registry.example:5000"
        );
        assert_eq!(
            at(1),
            "https://prefixed.local/cache/v2/team/cache/manifests/v1?ns=registry.example:5000"
        );
        assert_eq!(
            at(2),
            "https://harbor.local/v2/proxy-project/team/cache/manifests/v1?ns=registry.example:5000"
        );
        // The registry itself gets no `ns`.
        assert_eq!(
            at(3),
            "https://registry.example:5000/v2/team/cache/manifests/v1"
        );
    }

    #[test]
    fn insecure_applies_to_the_default_origin_only() {
        let hosts = parse_hosts(
            "[host.\"https://m.local\"]\n",
            "registry.example",
            "registry.example",
            true,
        )
        .expect("parses");
        assert!(!hosts[0].plain_http);
        assert!(hosts[1].plain_http);
        assert_eq!(hosts[1].namespace, None);
    }

    #[test]
    fn docker_hub_keeps_its_origin_and_is_named_docker_io() {
        let hosts = parse_hosts(
            "[host.\"http://127.0.0.1:30020\"]\n",
            "docker.io",
            "index.docker.io",
            false,
        )
        .expect("parses");
        assert_eq!(hosts[0].namespace.as_deref(), Some("docker.io"));
        assert_eq!(hosts[1].authority, "index.docker.io");
        assert_eq!(hosts[1].namespace, None);
    }

    #[test]
    fn unsupported_and_unknown_keys_are_refused_by_name() {
        for (text, needle) in [
            (
                "[host.\"https://m\"]\nca = \"m.crt\"\n",
                "`ca` is not supported",
            ),
            (
                "[host.\"https://m\"]\n[host.\"https://m\".header]\nx = \"y\"\n",
                "`header`",
            ),
            ("proxy = \"http://p:8080\"\n", "`proxy`"),
            (
                "[host.\"https://m\"]\ncapabilites = [\"pull\"]\n",
                "capabilites",
            ),
            (
                "[host.\"https://m\"]\ncapabilities = [\"fetch\"]\n",
                "\"fetch\"",
            ),
            ("[host.\"ftp://m\"]\n", "scheme \"ftp\""),
            (
                "[host.\"https://m\"]\ndial_timeout = \"soon\"\n",
                "dial_timeout",
            ),
            ("server = 1\n", "server"),
            ("not toml", ""),
        ] {
            let err = parse_hosts(text, "r", "r", false)
                .expect_err(text)
                .to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn dial_timeouts_and_push_are_read() {
        let hosts = hosts(
            "[host.\"https://m\"]\ncapabilities = [\"pull\", \"push\"]\ndial_timeout = \"500ms\"\n",
        );
        assert_eq!(hosts[0].dial_timeout, Some(Duration::from_millis(500)));
        assert_eq!(
            hosts[0].capabilities,
            Capabilities {
                pull: true,
                resolve: false
            }
        );
    }

    #[test]
    fn namespace_directories_are_searched_as_containerd_does() {
        assert_eq!(
            namespace_dirs("r.example:5000"),
            ["r.example_5000_", "r.example:5000", "_default"]
        );
        assert_eq!(namespace_dirs("docker.io"), ["docker.io", "_default"]);
    }

    #[test]
    fn a_directory_is_read_per_registry_with_a_default() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |ns: &str, text: &str| {
            std::fs::create_dir_all(dir.path().join(ns)).expect("mkdir");
            std::fs::write(dir.path().join(ns).join(HOSTS_FILE), text).expect("write");
        };
        write("r.example:5000", "[host.\"http://own.local\"]\n");
        write("_default", "[host.\"http://shared.local\"]\n");
        let config = HostsConfig::Dir(dir.path().to_path_buf());
        let own = config
            .hosts_for("r.example:5000", "r.example:5000", false)
            .expect("hosts");
        assert_eq!(own[0].authority, "own.local");
        let other = config
            .hosts_for("q.example", "q.example", false)
            .expect("hosts");
        assert_eq!(other[0].authority, "shared.local");
        assert!(config.problems().is_empty());
        write("broken.example", "[host.\"https://m\"]\nca = \"x\"\n");
        let problems: Vec<String> = config.problems().iter().map(|e| e.to_string()).collect();
        assert!(
            matches!(problems.as_slice(), [p] if p.contains("broken.example/hosts.toml") && p.contains("`ca`")),
            "{problems:?}"
        );
        // Only that registry's pulls fail, naming the file and the key.
        let err = config
            .hosts_for("broken.example", "broken.example", false)
            .expect_err("unusable");
        assert!(err.to_string().contains("`ca`"), "{err}");
        assert!(config.hosts_for("q.example", "q.example", false).is_ok());
    }
}
