//! Registry credentials: explicit ones, or Docker's `config.json`.

use std::collections::HashMap;
use std::path::PathBuf;

use base64::Engine as _;
use serde::Deserialize;

use crate::error::{Error, Result};

/// How to authenticate to a registry.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Credentials {
    /// Look the registry up in Docker's `config.json` (`$DOCKER_CONFIG`, else
    /// `~/.docker/config.json`); anonymous when it is not there.
    #[default]
    DockerConfig,
    /// No credentials.
    Anonymous,
    /// A user name and password (or token).
    Basic {
        /// User name.
        username: String,
        /// Password or token.
        password: String,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::DockerConfig => f.write_str("DockerConfig"),
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Basic { username, .. } => write!(f, "Basic({username}, ****)"),
        }
    }
}

#[derive(Deserialize, Default)]
struct DockerConfig {
    #[serde(default)]
    auths: HashMap<String, DockerAuth>,
}

#[derive(Deserialize, Default)]
struct DockerAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default, rename = "identitytoken")]
    identity_token: Option<String>,
}

/// The Docker config file gkm reads: `$DOCKER_CONFIG/config.json`, else
/// `$HOME/.docker/config.json`.
pub fn docker_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker").join("config.json"))
}

fn host_matches(key: &str, registry: &str) -> bool {
    let host = key
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default();
    let docker_hub =
        |h: &str| matches!(h, "docker.io" | "index.docker.io" | "registry-1.docker.io");
    host == registry || (docker_hub(host) && docker_hub(registry))
}

impl Credentials {
    /// The credentials to send to `registry` (a `host[:port]`).
    pub fn resolve(&self, registry: &str) -> Result<oci_client::secrets::RegistryAuth> {
        use oci_client::secrets::RegistryAuth;
        match self {
            Credentials::Anonymous => Ok(RegistryAuth::Anonymous),
            Credentials::Basic { username, password } => {
                Ok(RegistryAuth::Basic(username.clone(), password.clone()))
            }
            Credentials::DockerConfig => {
                let Some(path) = docker_config_path() else {
                    return Ok(RegistryAuth::Anonymous);
                };
                let bytes = match std::fs::read(&path) {
                    Ok(b) => b,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Ok(RegistryAuth::Anonymous);
                    }
                    Err(e) => return Err(Error::io(&path, e)),
                };
                let config: DockerConfig = serde_json::from_slice(&bytes)
                    .map_err(|e| Error::format(path.display().to_string(), e))?;
                let Some((key, entry)) =
                    config.auths.iter().find(|(k, _)| host_matches(k, registry))
                else {
                    return Ok(RegistryAuth::Anonymous);
                };
                if let Some(token) = &entry.identity_token {
                    return Ok(RegistryAuth::Bearer(token.clone()));
                }
                if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
                    return Ok(RegistryAuth::Basic(u.clone(), p.clone()));
                }
                let Some(encoded) = &entry.auth else {
                    return Ok(RegistryAuth::Anonymous);
                };
                let bad = |reason: &str| {
                    Error::format(format!("{}: auths.{key}.auth", path.display()), reason)
                };
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(encoded.trim())
                    .map_err(|_| bad("not base64"))?;
                let decoded = String::from_utf8(decoded).map_err(|_| bad("not UTF-8"))?;
                let (u, p) = decoded
                    .split_once(':')
                    .ok_or_else(|| bad("expected base64 of user:password"))?;
                Ok(RegistryAuth::Basic(u.to_string(), p.to_string()))
            }
        }
    }
}
