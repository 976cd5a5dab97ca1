//! The webhook's own certificates: a self-issued CA (shared by every
//! replica, [`super::shared_ca`]) and the serving certificate each replica
//! has it sign, swapped in place when the CA changes.

use std::net::IpAddr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use gkm_k8s_runtime::server::TlsError;
use jiff::{SignedDuration, Timestamp, tz::TimeZone};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

/// A CA: its certificate and key in PEM, and when it expires.
#[derive(Clone, PartialEq, Eq)]
pub struct Ca {
    /// The CA certificate (what the webhook configuration's `caBundle` holds).
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
    /// When it stops being valid.
    pub not_after: Timestamp,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// A serving certificate and its key, in PEM.
#[derive(Clone)]
pub struct Leaf {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

impl std::fmt::Debug for Leaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leaf").finish_non_exhaustive()
    }
}

/// Sets `params`' validity to the calendar days of `from` and `to` (UTC).
fn set_validity(params: &mut CertificateParams, from: Timestamp, to: Timestamp) {
    let day = |at: Timestamp| {
        let date = at.to_zoned(TimeZone::UTC).date();
        rcgen::date_time_ymd(
            i32::from(date.year()),
            date.month().unsigned_abs(),
            date.day().unsigned_abs(),
        )
    };
    params.not_before = day(from);
    params.not_after = day(to);
}

fn rcgen_err(e: rcgen::Error) -> TlsError {
    TlsError::new(format!("issuing the webhook certificate: {e}"))
}

/// The CA's parameters: the same for every CA gkm issues, so a leaf can be
/// signed with nothing but the CA's key.
fn ca_params() -> CertificateParams {
    let mut ca = CertificateParams::default();
    ca.distinguished_name = name("gkm webhook CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca
}

/// Issues a new CA valid for `validity` (whole days, at least one).
pub fn issue_ca(validity: Duration) -> Result<Ca, TlsError> {
    let now = Timestamp::now();
    let days = (validity.as_secs() / 86_400).max(1) as i64;
    let not_after = now
        .checked_add(SignedDuration::from_hours(24 * days))
        .map_err(|e| TlsError::new(format!("certificate validity {validity:?}: {e}")))?;
    let not_before = now
        .checked_sub(SignedDuration::from_hours(24))
        .map_err(|e| TlsError::new(format!("certificate start: {e}")))?;
    let key = KeyPair::generate().map_err(rcgen_err)?;
    let mut ca = ca_params();
    set_validity(&mut ca, not_before, not_after);
    let cert_pem = ca.self_signed(&key).map_err(rcgen_err)?.pem();
    Ok(Ca {
        cert_pem,
        key_pem: key.serialize_pem(),
        not_after,
    })
}

/// Issues a serving certificate for `hosts` (IP addresses or DNS names),
/// signed by `ca` and valid as long as it.
pub fn issue_leaf(ca: &Ca, hosts: &[String]) -> Result<Leaf, TlsError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem)
        .map_err(|e| TlsError::new(format!("the webhook CA's key is not a PEM key: {e}")))?;
    let not_before = Timestamp::now()
        .checked_sub(SignedDuration::from_hours(24))
        .map_err(|e| TlsError::new(format!("certificate start: {e}")))?;
    let mut leaf = CertificateParams::default();
    leaf.distinguished_name = name("gkm-operator webhook");
    leaf.subject_alt_names = hosts
        .iter()
        .map(|h| match h.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => h
                .clone()
                .try_into()
                .map(SanType::DnsName)
                .map_err(|e| TlsError::new(format!("webhook host {h:?}: {e}"))),
        })
        .collect::<Result<_, _>>()?;
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    set_validity(&mut leaf, not_before, ca.not_after);
    let key = KeyPair::generate().map_err(rcgen_err)?;
    let params = ca_params();
    let issuer = Issuer::from_params(&params, &ca_key);
    let cert_pem = leaf.signed_by(&key, &issuer).map_err(rcgen_err)?.pem();
    Ok(Leaf {
        cert_pem,
        key_pem: key.serialize_pem(),
    })
}

fn name(common: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common);
    dn
}

/// Whether a certificate valid until `not_after`, issued for `validity`,
/// is due for rotation at `now`: in the last third of its life.
pub fn due(not_after: Timestamp, now: Timestamp, validity: Duration) -> bool {
    let margin = SignedDuration::from_secs((validity.as_secs() / 3) as i64);
    now.checked_add(margin).is_ok_and(|t| t >= not_after)
}

/// The serving certificate the TLS server presents, replaceable while it runs.
#[derive(Debug)]
pub struct RotatingCert(RwLock<Arc<CertifiedKey>>);

impl RotatingCert {
    /// Serves `cert_pem` with `key_pem`.
    pub fn new(cert_pem: &str, key_pem: &str) -> Result<Arc<RotatingCert>, TlsError> {
        Ok(Arc::new(RotatingCert(RwLock::new(certified(
            cert_pem, key_pem,
        )?))))
    }

    /// Serves `cert_pem` with `key_pem` from the next handshake on.
    pub fn replace(&self, cert_pem: &str, key_pem: &str) -> Result<(), TlsError> {
        let new = certified(cert_pem, key_pem)?;
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = new;
        Ok(())
    }

    /// A TLS acceptor presenting the current certificate; with
    /// `client_ca` (PEM), only to clients presenting a certificate it
    /// signed (the others fail the handshake and send no request).
    pub fn acceptor(
        self: &Arc<Self>,
        client_ca: Option<&[u8]>,
    ) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::new(format!("TLS configuration: {e}")))?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                builder.with_client_cert_verifier(gkm_k8s_runtime::server::client_verifier(ca)?)
            }
        };
        let config = builder.with_cert_resolver(self.clone());
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

impl ResolvesServerCert for RotatingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

fn certified(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new(format!("the certificate is not PEM: {e}")))?;
    if chain.is_empty() {
        return Err(TlsError::new("no certificate in the PEM"));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| TlsError::new(format!("the key is not a PEM private key: {e}")))?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::new(format!("the key cannot sign: {e}")))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_is_due_in_the_last_third() {
        let validity = Duration::from_secs(30 * 86_400);
        let issued = Timestamp::now();
        let not_after = issued
            .checked_add(SignedDuration::from_hours(30 * 24))
            .expect("date");
        let at = |days: i64| {
            issued
                .checked_add(SignedDuration::from_hours(24 * days))
                .expect("date")
        };
        assert!(!due(not_after, at(0), validity));
        assert!(!due(not_after, at(19), validity));
        assert!(due(not_after, at(21), validity));
        assert!(due(not_after, at(31), validity));
    }

    #[test]
    fn leaves_signed_by_a_ca_serve_and_name_their_hosts() {
        let ca = issue_ca(Duration::from_secs(7 * 86_400)).expect("a CA");
        assert!(ca.cert_pem.contains("BEGIN CERTIFICATE"));
        let hosts = [
            "127.0.0.1".to_string(),
            "gkm-operator-webhook.gkm-system.svc".to_string(),
        ];
        let leaf = issue_leaf(&ca, &hosts).expect("a leaf");
        let cert = RotatingCert::new(&leaf.cert_pem, &leaf.key_pem).expect("usable");
        cert.acceptor(None).expect("an acceptor");
        cert.acceptor(Some(ca.cert_pem.as_bytes()))
            .expect("an acceptor of clients the CA signed");
        assert!(cert.acceptor(Some(b"not PEM")).is_err());
        let again = issue_ca(Duration::from_secs(86_400)).expect("a CA");
        let next = issue_leaf(&again, &hosts).expect("a leaf");
        cert.replace(&next.cert_pem, &next.key_pem)
            .expect("replaced");
        assert_ne!(again.cert_pem, ca.cert_pem, "each CA is new");
        let bad = Ca {
            key_pem: "not a key".into(),
            ..ca
        };
        let err = issue_leaf(&bad, &hosts).expect_err("no key, no leaf");
        assert!(err.to_string().contains("CA's key"), "{err}");
    }
}
