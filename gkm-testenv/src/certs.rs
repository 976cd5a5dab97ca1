//! Certificates for a local control plane: a CA, the apiserver's serving
//! certificate, client certificates, and the service-account signing key.

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// A PEM certificate and its PEM private key.
pub struct Pem {
    /// The certificate.
    pub cert: String,
    /// Its private key (PKCS#8).
    pub key: String,
}

/// A certificate authority that signs serving and client certificates.
pub struct Authority {
    params: CertificateParams,
    key: KeyPair,
    /// The CA certificate.
    pub cert_pem: String,
}

impl Authority {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> anyhow::Result<Authority> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert_pem = params.self_signed(&key)?.pem();
        Ok(Authority {
            params,
            key,
            cert_pem,
        })
    }

    /// A serving certificate for localhost and 127.0.0.1.
    pub fn serving(&self, name: &str) -> anyhow::Result<Pem> {
        self.serving_for(name, &[])
    }

    /// A serving certificate for `name`, localhost, 127.0.0.1 and `ips`.
    pub fn serving_for(&self, name: &str, ips: &[IpAddr]) -> anyhow::Result<Pem> {
        let mut params = CertificateParams::new(vec!["localhost".to_string(), name.to_string()])?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .subject_alt_names
            .extend(ips.iter().copied().map(SanType::IpAddress));
        params.distinguished_name = dn(name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate for user `user` in `groups` (Kubernetes reads
    /// the user from CN and groups from O).
    pub fn client(&self, user: &str, groups: &[&str]) -> anyhow::Result<Pem> {
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, user);
        for group in groups {
            name.push(DnType::OrganizationName, *group);
        }
        params.distinguished_name = name;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, mut params: CertificateParams) -> anyhow::Result<Pem> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate()?;
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

fn dn(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

/// A new ECDSA P-256 key pair for signing service-account tokens, as
/// (private key PEM, public key PEM).
pub fn service_account_key() -> anyhow::Result<(String, String)> {
    let key = KeyPair::generate()?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}
