//! The trusted root (`trusted_root.json`): the certificate authorities and
//! transparency logs a keyless signature must chain to, and their validity.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::PolicyError;

/// A time window from a `trusted_root.json` `validFor`, in Unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Validity {
    /// Not before (none: always).
    pub start: Option<i64>,
    /// Not after (none: still valid).
    pub end: Option<i64>,
}

impl Validity {
    /// Whether `t` (Unix seconds) lies in the window.
    pub fn contains(&self, t: i64) -> bool {
        self.start.is_none_or(|s| t >= s) && self.end.is_none_or(|e| t <= e)
    }
}

/// A certificate authority (Fulcio) or timestamp authority: its chain,
/// leaf-most first, root last, as DER.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    /// Its URI, for messages.
    pub uri: String,
    /// The certificates, DER.
    pub chain: Vec<Vec<u8>>,
    /// When it may have issued certificates.
    pub valid_for: Validity,
}

/// A transparency or CT log key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogKey {
    /// Its base URL, for messages.
    pub base_url: String,
    /// The log ID (base64 as in the file).
    pub log_id: String,
    /// The public key, DER `SubjectPublicKeyInfo`.
    pub key: Vec<u8>,
    /// When the key was in use.
    pub valid_for: Validity,
}

/// The trust material of a sigstore `trusted_root.json`: Fulcio certificate
/// authorities, Rekor and CT log keys, timestamp authorities. Read from a
/// local file only; nothing is fetched.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TrustedRoot {
    /// Certificate authorities issuing signing certificates.
    pub certificate_authorities: Vec<Authority>,
    /// Transparency (Rekor) log keys.
    pub tlogs: Vec<LogKey>,
    /// Certificate transparency log keys.
    pub ctlogs: Vec<LogKey>,
    /// Timestamp authorities.
    pub timestamp_authorities: Vec<Authority>,
}

mod root_json {
    //! The JSON shape of `trusted_root.json` (sigstore protobuf-specs TrustedRoot).
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Root {
        pub media_type: Option<String>,
        #[serde(default)]
        pub tlogs: Vec<Log>,
        #[serde(default)]
        pub certificate_authorities: Vec<Ca>,
        #[serde(default)]
        pub ctlogs: Vec<Log>,
        #[serde(default)]
        pub timestamp_authorities: Vec<Ca>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Log {
        #[serde(default)]
        pub base_url: String,
        pub public_key: Key,
        #[serde(default)]
        pub log_id: Option<LogId>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct LogId {
        pub key_id: String,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Key {
        pub raw_bytes: String,
        #[serde(default)]
        pub valid_for: Option<Window>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Ca {
        #[serde(default)]
        pub uri: String,
        pub cert_chain: Chain,
        #[serde(default)]
        pub valid_for: Option<Window>,
    }

    #[derive(Deserialize)]
    pub struct Chain {
        pub certificates: Vec<Cert>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Cert {
        pub raw_bytes: String,
    }

    #[derive(Deserialize)]
    pub struct Window {
        pub start: Option<String>,
        pub end: Option<String>,
    }
}

impl TrustedRoot {
    /// Parse a `trusted_root.json` (media type
    /// `application/vnd.dev.sigstore.trustedroot+json;version=0.1`).
    pub fn from_json(bytes: &[u8]) -> Result<TrustedRoot, PolicyError> {
        let bad = |what: String| PolicyError::TrustedRoot(what);
        let root: root_json::Root = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("not a trusted_root.json: {e}")))?;
        if let Some(m) = &root.media_type
            && !m.starts_with("application/vnd.dev.sigstore.trustedroot")
        {
            return Err(bad(format!("unexpected mediaType {m:?}")));
        }
        let window = |w: &Option<root_json::Window>, what: &str| -> Result<Validity, PolicyError> {
            let Some(w) = w else {
                return Ok(Validity::default());
            };
            let parse = |s: &Option<String>| -> Result<Option<i64>, PolicyError> {
                s.as_deref()
                    .map(|s| {
                        parse_rfc3339(s).ok_or_else(|| bad(format!("{what}: invalid time {s:?}")))
                    })
                    .transpose()
            };
            Ok(Validity {
                start: parse(&w.start)?,
                end: parse(&w.end)?,
            })
        };
        let b64 = |s: &str, what: &str| {
            BASE64
                .decode(s)
                .map_err(|e| bad(format!("{what}: rawBytes is not base64: {e}")))
        };
        let cas = |list: &[root_json::Ca], kind: &str| -> Result<Vec<Authority>, PolicyError> {
            list.iter()
                .enumerate()
                .map(|(i, ca)| {
                    let what = format!("{kind}[{i}]");
                    if ca.cert_chain.certificates.is_empty() {
                        return Err(bad(format!("{what}: empty certChain")));
                    }
                    Ok(Authority {
                        uri: ca.uri.clone(),
                        chain: ca
                            .cert_chain
                            .certificates
                            .iter()
                            .map(|c| b64(&c.raw_bytes, &what))
                            .collect::<Result<_, _>>()?,
                        valid_for: window(&ca.valid_for, &what)?,
                    })
                })
                .collect()
        };
        let logs = |list: &[root_json::Log], kind: &str| -> Result<Vec<LogKey>, PolicyError> {
            list.iter()
                .enumerate()
                .map(|(i, l)| {
                    let what = format!("{kind}[{i}]");
                    Ok(LogKey {
                        base_url: l.base_url.clone(),
                        log_id: l
                            .log_id
                            .as_ref()
                            .map(|id| id.key_id.clone())
                            .unwrap_or_default(),
                        key: b64(&l.public_key.raw_bytes, &what)?,
                        valid_for: window(&l.public_key.valid_for, &what)?,
                    })
                })
                .collect()
        };
        Ok(TrustedRoot {
            certificate_authorities: cas(&root.certificate_authorities, "certificateAuthorities")?,
            tlogs: logs(&root.tlogs, "tlogs")?,
            ctlogs: logs(&root.ctlogs, "ctlogs")?,
            timestamp_authorities: cas(&root.timestamp_authorities, "timestampAuthorities")?,
        })
    }
}

/// Parse an RFC 3339 UTC-or-offset time (`2021-03-07T03:20:29.000Z`) into
/// Unix seconds.
///
/// ```
/// assert_eq!(gkm_core::policy::parse_rfc3339("1970-01-02T00:00:00Z"), Some(86400));
/// assert_eq!(gkm_core::policy::parse_rfc3339("2021-03-07T03:20:29.000Z"), Some(1615087229));
/// assert_eq!(gkm_core::policy::parse_rfc3339("yesterday"), None);
/// ```
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num =
        |r: std::ops::Range<usize>| -> Option<i64> { s.get(r)?.parse::<u32>().ok().map(i64::from) };
    let (y, mo, d, h, mi, sec) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        rest = &frac[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let rb = rest.as_bytes();
            if rb.len() != 6 || !matches!(rb[0], b'+' | b'-') || rb[3] != b':' {
                return None;
            }
            let oh: i64 = rest.get(1..3)?.parse().ok()?;
            let om: i64 = rest.get(4..6)?.parse().ok()?;
            let o = oh * 3600 + om * 60;
            if rb[0] == b'+' { o } else { -o }
        }
    };
    // Days from civil (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Some(days * 86400 + h * 3600 + mi * 60 + sec - offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_trusted_root() {
        let json = br#"{
          "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
          "certificateAuthorities": [{"uri": "https://ca.local",
            "certChain": {"certificates": [{"rawBytes": "AQID"}]},
            "validFor": {"start": "2024-01-01T00:00:00Z"}}],
          "tlogs": [{"baseUrl": "https://rekor.local", "hashAlgorithm": "SHA2_256",
            "publicKey": {"rawBytes": "BAUG", "keyDetails": "PKIX_ECDSA_P256_SHA_256"},
            "logId": {"keyId": "abc="}}]
        }"#;
        let root = TrustedRoot::from_json(json).expect("root");
        assert_eq!(root.certificate_authorities[0].chain, vec![vec![1, 2, 3]]);
        assert_eq!(
            root.certificate_authorities[0].valid_for.start,
            Some(1704067200)
        );
        assert_eq!(root.tlogs[0].key, vec![4, 5, 6]);
        let err = TrustedRoot::from_json(
            br#"{"certificateAuthorities":[{"certChain":{"certificates":[]}}]}"#,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("certificateAuthorities[0]: empty certChain"),
            "{err}"
        );
    }
}
