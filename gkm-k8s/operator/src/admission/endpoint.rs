//! How the apiserver reaches the operator's webhooks ([`Endpoint`]), and
//! the `clientConfig` every webhook configuration carries. Pure.

use std::str::FromStr;

use base64::Engine as _;
use serde_json::{Value, json};

/// How the apiserver reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A URL (`https://host:port`; the path is added).
    Url(String),
    /// A Service in front of the operator.
    Service {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its port.
        port: u16,
    },
}

impl Endpoint {
    /// The URL endpoint `text`, `https://HOST[:PORT]`.
    pub fn parse_url(text: &str) -> Result<Endpoint, BadEndpoint> {
        let has_host = text
            .strip_prefix("https://")
            .and_then(|rest| rest.split(['/', ':']).next())
            .is_some_and(|host| !host.is_empty());
        if !has_host {
            return Err(BadEndpoint::Url(text.to_string()));
        }
        Ok(Endpoint::Url(text.to_string()))
    }

    /// The Service endpoint `text`, `NAMESPACE/NAME:PORT`.
    pub fn parse_service(text: &str) -> Result<Endpoint, BadEndpoint> {
        let parsed = text.split_once('/').and_then(|(namespace, rest)| {
            let (name, port) = rest.split_once(':')?;
            Some(Endpoint::Service {
                namespace: namespace.to_string(),
                name: name.to_string(),
                port: port.parse::<u16>().ok()?,
            })
        });
        parsed.ok_or_else(|| BadEndpoint::Service(text.to_string()))
    }

    /// The names the webhook's certificate is for: the URL's host, or the
    /// Service's two in-cluster names.
    pub fn hosts(&self) -> Vec<String> {
        match self {
            Endpoint::Url(url) => url
                .strip_prefix("https://")
                .and_then(|rest| rest.split(['/', ':']).next())
                .map(String::from)
                .into_iter()
                .collect(),
            Endpoint::Service {
                namespace, name, ..
            } => vec![
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
            ],
        }
    }
}

/// Text that names no [`Endpoint`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadEndpoint {
    /// Not `https://HOST[:PORT]`.
    #[error("{0:?}: not https://HOST[:PORT]")]
    Url(String),
    /// Not `NAMESPACE/NAME:PORT`.
    #[error("{0:?}: not NAMESPACE/NAME:PORT")]
    Service(String),
}

/// `https://HOST[:PORT]` is a URL endpoint, anything else must be a
/// Service's `NAMESPACE/NAME:PORT`.
impl FromStr for Endpoint {
    type Err = BadEndpoint;

    fn from_str(text: &str) -> Result<Endpoint, BadEndpoint> {
        if text.starts_with("https://") {
            Endpoint::parse_url(text)
        } else {
            Endpoint::parse_service(text)
        }
    }
}

/// A webhook's `clientConfig`: `endpoint` at `path`, trusting `ca_bundle`
/// (PEM; none when cert-manager injects it).
pub fn client_config(endpoint: &Endpoint, path: &str, ca_bundle: Option<&str>) -> Value {
    let mut client = match endpoint {
        Endpoint::Url(url) => json!({"url": format!("{}{path}", url.trim_end_matches('/'))}),
        Endpoint::Service {
            namespace,
            name,
            port,
        } => json!({"service": {"namespace": namespace, "name": name, "port": port,
                                "path": path}}),
    };
    if let Some(pem) = ca_bundle {
        client["caBundle"] = json!(base64::engine::general_purpose::STANDARD.encode(pem));
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_from_their_flags() {
        let service: Endpoint = "gkm-system/gkm-operator-webhook:443"
            .parse()
            .expect("a Service");
        assert_eq!(
            service,
            Endpoint::Service {
                namespace: "gkm-system".into(),
                name: "gkm-operator-webhook".into(),
                port: 443,
            }
        );
        assert_eq!(
            service.hosts(),
            [
                "gkm-operator-webhook.gkm-system.svc",
                "gkm-operator-webhook.gkm-system.svc.cluster.local"
            ]
        );
        let url: Endpoint = "https://10.0.0.1:9443/x".parse().expect("a URL");
        assert_eq!(url, Endpoint::Url("https://10.0.0.1:9443/x".into()));
        assert_eq!(url.hosts(), ["10.0.0.1"]);
        for bad in ["gkm-system/webhook", "webhook:443", "ns/name:http", ""] {
            assert_eq!(
                bad.parse::<Endpoint>(),
                Err(BadEndpoint::Service(bad.into())),
                "{bad}"
            );
        }
        for bad in ["https://", "https://:443", "http://host:443"] {
            assert!(Endpoint::parse_url(bad).is_err(), "{bad}");
        }
    }
}
