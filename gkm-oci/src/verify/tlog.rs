//! Transparency log (Rekor) entries: the signed entry timestamp (SET) a log
//! returns, checked offline against the log keys of the trusted root.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use gkm_core::policy::{PublicKey, TrustedRoot};

use super::crypto::verify_with_key;

/// A log entry with its signed entry timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The canonicalized entry body, base64 as the log returns it.
    pub body: String,
    /// When the log integrated the entry (Unix seconds).
    pub integrated_time: i64,
    /// The entry's index in the log.
    pub log_index: i64,
    /// The log ID: hex SHA-256 of the log's public key.
    pub log_id: String,
    /// The log's signature over the entry (the SET).
    pub set: Vec<u8>,
}

/// The JSON the log signs: the canonical (sorted, compact) form of
/// `{body, integratedTime, logID, logIndex}`.
pub(crate) fn signed_payload(e: &Entry) -> Vec<u8> {
    // serde_json's map is sorted, and these values need no escaping beyond
    // what serde_json writes.
    serde_json::to_vec(&serde_json::json!({
        "body": e.body,
        "integratedTime": e.integrated_time,
        "logID": e.log_id,
        "logIndex": e.log_index,
    }))
    .unwrap_or_default()
}

/// The time an entry proves, when it verifies: a log key of `root` (by log
/// ID, in its validity window) signed it, and its body names `signature`.
pub(crate) fn verified_time(e: &Entry, root: &TrustedRoot, signature: &[u8]) -> Option<i64> {
    let body = BASE64.decode(&e.body).ok()?;
    let body: serde_json::Value = serde_json::from_slice(&body).ok()?;
    let sig_b64 = BASE64.encode(signature);
    if !names_signature(&body, &sig_b64) {
        return None;
    }
    let payload = signed_payload(e);
    root.tlogs.iter().find_map(|log| {
        let key = PublicKey::from_der(log.key.clone()).ok()?;
        let id = hex::encode(sha2::Digest::finalize(
            <sha2::Sha256 as sha2::Digest>::new_with_prefix(&log.key),
        ));
        let id_matches = id.eq_ignore_ascii_case(&e.log_id);
        (id_matches
            && log.valid_for.contains(e.integrated_time)
            && verify_with_key(&key, &payload, &e.set))
        .then_some(e.integrated_time)
    })
}

/// Whether a log entry body records this signature (hashedrekord's
/// `spec.signature.content`, or dsse/intoto's `spec.signatures[].signature`).
fn names_signature(body: &serde_json::Value, sig_b64: &str) -> bool {
    if body
        .pointer("/spec/signature/content")
        .and_then(|v| v.as_str())
        == Some(sig_b64)
    {
        return true;
    }
    body.pointer("/spec/signatures")
        .and_then(|v| v.as_array())
        .is_some_and(|list| {
            list.iter()
                .any(|s| s.get("signature").and_then(|v| v.as_str()) == Some(sig_b64))
        })
}

/// Why a transparency log entry could not be read: what it lacks or what
/// is malformed in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct MalformedEntry(String);

impl From<String> for MalformedEntry {
    fn from(reason: String) -> Self {
        MalformedEntry(reason)
    }
}

impl From<&str> for MalformedEntry {
    fn from(reason: &str) -> Self {
        MalformedEntry(reason.to_string())
    }
}

/// The entry of cosign v2's `dev.sigstore.cosign/bundle` annotation.
pub(crate) fn from_cosign_annotation(text: &str) -> Result<Entry, MalformedEntry> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("the Rekor bundle is not JSON: {e}"))?;
    let set = v
        .get("SignedEntryTimestamp")
        .and_then(|s| s.as_str())
        .ok_or("the Rekor bundle has no SignedEntryTimestamp")?;
    let p = v.get("Payload").ok_or("the Rekor bundle has no Payload")?;
    Ok(Entry {
        body: p
            .get("body")
            .and_then(|b| b.as_str())
            .ok_or("the Rekor bundle has no body")?
            .to_string(),
        integrated_time: p
            .get("integratedTime")
            .and_then(|t| t.as_i64())
            .ok_or("the Rekor bundle has no integratedTime")?,
        log_index: p
            .get("logIndex")
            .and_then(|t| t.as_i64())
            .ok_or("the Rekor bundle has no logIndex")?,
        log_id: p
            .get("logID")
            .and_then(|b| b.as_str())
            .ok_or("the Rekor bundle has no logID")?
            .to_string(),
        set: BASE64
            .decode(set)
            .map_err(|e| format!("the SignedEntryTimestamp is not base64: {e}"))?,
    })
}

/// The entry of a sigstore bundle's `verificationMaterial.tlogEntries[]`.
pub(crate) fn from_bundle_entry(v: &serde_json::Value) -> Result<Entry, MalformedEntry> {
    let int = |name: &str| -> Result<i64, String> {
        match v.get(name) {
            Some(serde_json::Value::String(s)) => s
                .parse()
                .map_err(|_| format!("tlog entry {name} is not a number")),
            Some(serde_json::Value::Number(n)) => n
                .as_i64()
                .ok_or_else(|| format!("tlog entry {name} is not an integer")),
            _ => Err(format!("tlog entry has no {name}")),
        }
    };
    let key_id = v
        .pointer("/logId/keyId")
        .and_then(|k| k.as_str())
        .ok_or("tlog entry has no logId")?;
    let set = v
        .pointer("/inclusionPromise/signedEntryTimestamp")
        .and_then(|s| s.as_str())
        .ok_or("tlog entry has no inclusion promise")?;
    Ok(Entry {
        body: v
            .get("canonicalizedBody")
            .and_then(|b| b.as_str())
            .ok_or("tlog entry has no body")?
            .to_string(),
        integrated_time: int("integratedTime")?,
        log_index: int("logIndex")?,
        log_id: hex::encode(
            BASE64
                .decode(key_id)
                .map_err(|e| format!("tlog logId is not base64: {e}"))?,
        ),
        set: BASE64
            .decode(set)
            .map_err(|e| format!("the signedEntryTimestamp is not base64: {e}"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_core::policy::{LogKey, Validity, pem_block};

    /// The public Rekor instance's key, and an entry it signed in 2021 (from
    /// sigstore-rs's test data).
    const REKOR_PUB_KEY: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE2G2Y+2tabdTV5BcGiBIx0a9fAFwr
kBbmLSGtks4L3qX6yYY0zufBnhC8Ur/iy55GhWP/9A/bY2LhC30M9+RYtw==
-----END PUBLIC KEY-----";
    const ANNOTATION: &str = r#"{"SignedEntryTimestamp":"MEUCIDx9M+yRpD0O47/Mzm8NAPCbtqy4uiTkLWWexW0bo4jZAiEA1wwueIW8XzJWNkut5y9snYj7UOfbMmUXp7fH3CzJmWg=","Payload":{"body":"eyJhcGlWZXJzaW9uIjoiMC4wLjEiLCJraW5kIjoicmVrb3JkIiwic3BlYyI6eyJkYXRhIjp7Imhhc2giOnsiYWxnb3JpdGhtIjoic2hhMjU2IiwidmFsdWUiOiIzYWY0NDE0ZDIwYzllMWNiNzZjY2M3MmFhZThiMjQyMTY2ZGFiZTZhZjUzMWE0YTc5MGRiOGUyZjBlNWVlN2M5In19LCJzaWduYXR1cmUiOnsiY29udGVudCI6Ik1FWUNJUURXV3hQUWEzWEZVc1BieVRZK24rYlp1LzZQd2hnNVd3eVlEUXRFZlFobzl3SWhBUGtLVzdldWI4YjdCWCtZYmJSYWM4VHd3SXJLNUt4dmR0UTZOdW9EK2l2VyIsImZvcm1hdCI6Ing1MDkiLCJwdWJsaWNLZXkiOnsiY29udGVudCI6IkxTMHRMUzFDUlVkSlRpQlFWVUpNU1VNZ1MwVlpMUzB0TFMwS1RVWnJkMFYzV1VoTGIxcEplbW93UTBGUldVbExiMXBKZW1vd1JFRlJZMFJSWjBGRlRFdG9SRGRHTlU5TGVUYzNXalU0TWxrMmFEQjFNVW96UjA1Qkt3cHJkbFZ6YURSbFMzQmtNV3gzYTBSQmVtWkdSSE0zZVZoRlJYaHpSV3RRVUhWcFVVcENaV3hFVkRZNGJqZFFSRWxYUWk5UlJWazNiWEpCUFQwS0xTMHRMUzFGVGtRZ1VGVkNURWxESUV0RldTMHRMUzB0Q2c9PSJ9fX19","integratedTime":1634714179,"logIndex":783606,"logID":"c0d23d6ad406973f9559f3ba2d1ca01f84147d8ffc5b8445c224f98b9591801d"}}"#;
    const SIGNATURE: &str = "MEYCIQDWWxPQa3XFUsPbyTY+n+bZu/6Pwhg5WwyYDQtEfQho9wIhAPkKW7eub8b7BX+YbbRac8TwwIrK5KxvdtQ6NuoD+ivW";

    fn root() -> TrustedRoot {
        let key = pem_block(REKOR_PUB_KEY, "PUBLIC KEY").expect("pem");
        TrustedRoot {
            tlogs: vec![LogKey {
                base_url: "https://rekor.sigstore.dev".into(),
                log_id: String::new(),
                key,
                valid_for: Validity::default(),
            }],
            ..TrustedRoot::default()
        }
    }

    #[test]
    fn a_real_rekor_signed_entry_timestamp_verifies() {
        let entry = from_cosign_annotation(ANNOTATION).expect("entry");
        let signature = BASE64.decode(SIGNATURE).expect("base64");
        assert_eq!(verified_time(&entry, &root(), &signature), Some(1634714179));
    }

    #[test]
    fn an_altered_entry_or_another_signature_does_not() {
        let entry = from_cosign_annotation(ANNOTATION).expect("entry");
        let signature = BASE64.decode(SIGNATURE).expect("base64");
        let moved = Entry {
            integrated_time: entry.integrated_time + 1,
            ..entry.clone()
        };
        assert_eq!(verified_time(&moved, &root(), &signature), None);
        assert_eq!(verified_time(&entry, &root(), b"another signature"), None);
        let mut other_root = root();
        other_root.tlogs[0].valid_for = Validity {
            start: Some(1_700_000_000),
            end: None,
        };
        assert_eq!(verified_time(&entry, &other_root, &signature), None);
    }
}
