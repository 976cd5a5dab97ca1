//! Signed certificate timestamps embedded in keyless signing certificates
//! (RFC 6962 §3.3): when the trusted root names certificate-transparency
//! logs, a signing certificate must carry an SCT that one of them signed over
//! its precertificate, so a certificate the CA issued off the record is
//! refused.

use gkm_core::policy::{PublicKey, Rejection, TrustedRoot};
use sha2::Digest as _;

use super::crypto::verify_with_key;

/// The X.509 extension holding the SCT list.
pub const OID_SCT_LIST: &str = "1.3.6.1.4.1.11129.2.4.2";
/// The same OID, DER-encoded (tag, length, value).
const OID_SCT_LIST_DER: &[u8] = &[
    0x06, 0x0a, 0x2b, 0x06, 0x01, 0x04, 0x01, 0xd6, 0x79, 0x02, 0x04, 0x02,
];

fn untrusted(reason: impl Into<String>) -> Rejection {
    Rejection::UntrustedChain(reason.into())
}

/// One SCT, as RFC 6962 encodes it.
struct Sct<'a> {
    log_id: &'a [u8],
    timestamp: u64,
    extensions: &'a [u8],
    signature: &'a [u8],
}

/// Checks the SCT list `extension` (the value of the leaf's SCT extension,
/// if it has one) of the leaf whose `TBSCertificate` is `tbs`, issued by the
/// CA whose `SubjectPublicKeyInfo` is `issuer_spki`, against the CT logs of
/// `root`. Nothing to check when the root names no CT log.
pub(crate) fn check(
    extension: Option<&[u8]>,
    tbs: &[u8],
    issuer_spki: &[u8],
    root: &TrustedRoot,
) -> Result<(), Rejection> {
    if root.ctlogs.is_empty() {
        return Ok(());
    }
    let Some(value) = extension else {
        return Err(untrusted(
            "the certificate carries no signed certificate timestamp, and the trusted root names CT logs",
        ));
    };
    // The extension's value is an OCTET STRING holding the TLS-encoded list.
    let (tag, list, _) = der_tlv(value).map_err(untrusted)?;
    if tag != 0x04 {
        return Err(untrusted("the SCT extension is not an OCTET STRING"));
    }
    let scts = parse_list(list).map_err(untrusted)?;
    let precert = precertificate_tbs(tbs).map_err(untrusted)?;
    let issuer_key_hash = sha2::Sha256::digest(issuer_spki);
    let mut tried = Vec::new();
    for sct in &scts {
        let Some(log) = root
            .ctlogs
            .iter()
            .find(|l| sha2::Sha256::digest(&l.key).as_slice() == sct.log_id)
        else {
            tried.push(format!("an SCT of unknown log {}", hex::encode(sct.log_id)));
            continue;
        };
        let seconds = (sct.timestamp / 1000) as i64;
        if !log.valid_for.contains(seconds) {
            tried.push(format!(
                "an SCT of {} outside its key's validity",
                log.base_url
            ));
            continue;
        }
        let Ok(key) = PublicKey::from_der(log.key.clone()) else {
            tried.push(format!("{}: unreadable log key", log.base_url));
            continue;
        };
        let mut signed = vec![0u8, 0u8];
        signed.extend_from_slice(&sct.timestamp.to_be_bytes());
        signed.extend_from_slice(&[0, 1]);
        signed.extend_from_slice(&issuer_key_hash);
        let len = precert.len();
        if len >= 1 << 24 {
            return Err(untrusted("the precertificate is too large"));
        }
        signed.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
        signed.extend_from_slice(&precert);
        signed.extend_from_slice(&(sct.extensions.len() as u16).to_be_bytes());
        signed.extend_from_slice(sct.extensions);
        if verify_with_key(&key, &signed, sct.signature) {
            return Ok(());
        }
        tried.push(format!(
            "an SCT of {} whose signature does not verify",
            log.base_url
        ));
    }
    Err(untrusted(format!(
        "no signed certificate timestamp of a trusted CT log verifies ({})",
        tried.join("; ")
    )))
}

/// The SCTs of a TLS-encoded `SignedCertificateTimestampList`.
fn parse_list(bytes: &[u8]) -> Result<Vec<Sct<'_>>, String> {
    let mut r = Reader(bytes);
    let mut list = Reader(r.vec16()?);
    let mut out = Vec::new();
    while !list.0.is_empty() {
        let mut s = Reader(list.vec16()?);
        if s.take(1)? != [0] {
            continue; // Only v1 SCTs are defined.
        }
        let log_id = s.take(32)?;
        let timestamp = u64::from_be_bytes(
            s.take(8)?
                .try_into()
                .map_err(|_| "truncated SCT timestamp".to_string())?,
        );
        let extensions = s.vec16()?;
        let _algorithms = s.take(2)?;
        let signature = s.vec16()?;
        out.push(Sct {
            log_id,
            timestamp,
            extensions,
            signature,
        });
    }
    Ok(out)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("truncated SCT list".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn vec16(&mut self) -> Result<&'a [u8], String> {
        let len = self.take(2)?;
        let n = usize::from(u16::from_be_bytes([len[0], len[1]]));
        self.take(n)
    }
}

/// One DER tag-length-value: (tag, content, the rest).
fn der_tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), String> {
    let bad = || "malformed DER in the certificate".to_string();
    let (&tag, rest) = input.split_first().ok_or_else(bad)?;
    let (&first, rest) = rest.split_first().ok_or_else(bad)?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(bad());
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err(bad());
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

/// `tag` and `content` as DER.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend_from_slice(&bytes);
    }
    out.extend_from_slice(content);
    out
}

/// The leaf's `TBSCertificate` without its SCT extension: what the log
/// signed (the precertificate).
fn precertificate_tbs(tbs: &[u8]) -> Result<Vec<u8>, String> {
    let (tag, mut fields, _) = der_tlv(tbs)?;
    if tag != 0x30 {
        return Err("the TBS certificate is not a SEQUENCE".into());
    }
    let mut out = Vec::with_capacity(tbs.len());
    while !fields.is_empty() {
        let (tag, content, rest) = der_tlv(fields)?;
        let whole = &fields[..fields.len() - rest.len()];
        fields = rest;
        if tag != 0xa3 {
            out.extend_from_slice(whole);
            continue;
        }
        let (seq_tag, mut extensions, _) = der_tlv(content)?;
        if seq_tag != 0x30 {
            return Err("the extensions are not a SEQUENCE".into());
        }
        let mut kept = Vec::new();
        while !extensions.is_empty() {
            let (_, extension, rest) = der_tlv(extensions)?;
            let one = &extensions[..extensions.len() - rest.len()];
            extensions = rest;
            if !extension.starts_with(OID_SCT_LIST_DER) {
                kept.extend_from_slice(one);
            }
        }
        out.extend(der(0xa3, &der(0x30, &kept)));
    }
    Ok(der(0x30, &out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_round_trips_lengths() {
        for len in [0usize, 1, 127, 128, 255, 256, 70_000] {
            let content = vec![7u8; len];
            let encoded = der(0x30, &content);
            let (tag, back, rest) = der_tlv(&encoded).expect("parse");
            assert_eq!((tag, back.len(), rest.len()), (0x30, len, 0));
        }
    }

    #[test]
    fn the_sct_extension_is_dropped_and_nothing_else() {
        let ext = |oid: &[u8], value: &[u8]| der(0x30, &[oid, &der(0x04, value)].concat());
        let other = ext(&[0x06, 0x03, 0x55, 0x1d, 0x0f], b"usage");
        let sct = ext(OID_SCT_LIST_DER, b"scts");
        let version = der(0xa0, &der(0x02, &[2]));
        let tbs = der(
            0x30,
            &[
                version.clone(),
                der(0xa3, &der(0x30, &[other.clone(), sct].concat())),
            ]
            .concat(),
        );
        let want = der(0x30, &[version, der(0xa3, &der(0x30, &other))].concat());
        assert_eq!(precertificate_tbs(&tbs).expect("precert"), want);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bytes in [
            &[][..],
            &[0x30],
            &[0x30, 0x85, 1, 1, 1, 1, 1],
            &[0x30, 0x05, 1],
        ] {
            assert!(precertificate_tbs(bytes).is_err());
        }
        assert!(parse_list(&[0, 5, 0, 3]).is_err());
    }
}
