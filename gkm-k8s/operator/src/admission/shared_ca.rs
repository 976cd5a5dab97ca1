//! The webhook CA every operator replica shares, as it is kept in a Secret
//! of the operator's namespace. Pure: what the Secret holds, what the
//! apiserver must trust, and when a replica rotates or moves its serving
//! certificate; the Kubernetes calls are in [`super`].
//!
//! The rules:
//! - One CA for all replicas: the first replica to start creates the Secret
//!   (create-if-absent, so the first writer wins) and every other reads it.
//! - In the last third of its life the CA is replaced by whichever replica
//!   notices first (an update conditional on the Secret's resourceVersion,
//!   so only one replacement wins); the replaced CA stays trusted until it
//!   expires, so certificates it signed keep working through the overlap.
//! - The bundle the apiserver trusts is the signing CA and the replaced one
//!   while it is still valid.
//! - A replica moves its serving certificate to a new CA only once the CA
//!   has been in the Secret (and so in the bundle) for a full check
//!   interval; a replica that starts serves from the signing CA at once.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::certs::Ca;

/// The Secret's name, in the operator's namespace.
pub const SECRET_NAME: &str = "gkm-operator-webhook-ca";

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const CA_NOT_AFTER: &str = "ca.not-after";
const CA_SINCE: &str = "ca.since";
const PREVIOUS_CERT: &str = "previous.crt";
const PREVIOUS_NOT_AFTER: &str = "previous.not-after";

/// A CA that signs no more but stays trusted until it expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired {
    /// Its certificate.
    pub cert_pem: String,
    /// When it expires.
    pub not_after: Timestamp,
}

/// What the shared Secret holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedCa {
    /// The CA that signs every replica's serving certificate.
    pub signing: Ca,
    /// When it started signing.
    pub since: Timestamp,
    /// The CA it replaced, trusted until it expires.
    pub previous: Option<Retired>,
}

/// The Secret's content is not a shared CA.
#[derive(Debug, thiserror::Error)]
#[error("Secret {SECRET_NAME}: {0} (delete the Secret to have the operator issue a new CA)")]
pub struct BadSecret(String);

impl SharedCa {
    /// A first CA, signing from `now`.
    pub fn new(signing: Ca, now: Timestamp) -> SharedCa {
        SharedCa {
            signing,
            since: now,
            previous: None,
        }
    }

    /// `next` signs from `now`; the signing CA retires.
    pub fn rotated(&self, next: Ca, now: Timestamp) -> SharedCa {
        SharedCa {
            previous: Some(Retired {
                cert_pem: self.signing.cert_pem.clone(),
                not_after: self.signing.not_after,
            }),
            signing: next,
            since: now,
        }
    }

    /// Whether the signing CA, issued for `validity`, is to be replaced at
    /// `now`: in the last third of its life.
    pub fn due(&self, now: Timestamp, validity: Duration) -> bool {
        super::certs::due(self.signing.not_after, now, validity)
    }

    /// What the apiserver trusts at `now` (PEM): the signing CA, and the
    /// retired one until it expires.
    pub fn bundle(&self, now: Timestamp) -> String {
        let mut out = self.signing.cert_pem.clone();
        if let Some(previous) = self.previous.as_ref().filter(|p| p.not_after > now) {
            if !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&previous.cert_pem);
        }
        out
    }

    /// Whether a replica serving a certificate of another CA moves to the
    /// signing one at `now`: once it has signed for `interval`, by which
    /// time every replica has published it in the bundle.
    pub fn may_move_to(&self, now: Timestamp, interval: Duration) -> bool {
        SignedDuration::try_from(interval)
            .ok()
            .and_then(|d| self.since.checked_add(d).ok())
            .is_some_and(|at| now >= at)
    }

    /// The Secret's `data`.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        let mut data = BTreeMap::from([
            (CA_CERT.to_string(), self.signing.cert_pem.clone()),
            (CA_KEY.to_string(), self.signing.key_pem.clone()),
            (CA_NOT_AFTER.to_string(), self.signing.not_after.to_string()),
            (CA_SINCE.to_string(), self.since.to_string()),
        ]);
        if let Some(previous) = &self.previous {
            data.insert(PREVIOUS_CERT.into(), previous.cert_pem.clone());
            data.insert(PREVIOUS_NOT_AFTER.into(), previous.not_after.to_string());
        }
        data
    }

    /// Reads the Secret's `data`; an error names what is missing or wrong.
    pub fn from_data(data: &BTreeMap<String, Vec<u8>>) -> Result<SharedCa, BadSecret> {
        let text = |key: &str| -> Result<Option<String>, BadSecret> {
            data.get(key)
                .map(|bytes| {
                    String::from_utf8(bytes.clone())
                        .map_err(|_| BadSecret(format!("{key} is not text")))
                })
                .transpose()
        };
        let required = |key: &str| text(key)?.ok_or_else(|| BadSecret(format!("no {key}")));
        let time = |key: &str, value: String| {
            value
                .trim()
                .parse::<Timestamp>()
                .map_err(|e| BadSecret(format!("{key} {value:?} is not a time: {e}")))
        };
        let cert_pem = required(CA_CERT)?;
        let key_pem = required(CA_KEY)?;
        if !cert_pem.contains("BEGIN CERTIFICATE") {
            return Err(BadSecret(format!("{CA_CERT} holds no PEM certificate")));
        }
        let signing = Ca {
            cert_pem,
            key_pem,
            not_after: time(CA_NOT_AFTER, required(CA_NOT_AFTER)?)?,
        };
        let since = time(CA_SINCE, required(CA_SINCE)?)?;
        let previous = match (text(PREVIOUS_CERT)?, text(PREVIOUS_NOT_AFTER)?) {
            (Some(cert_pem), Some(not_after)) => Some(Retired {
                cert_pem,
                not_after: time(PREVIOUS_NOT_AFTER, not_after)?,
            }),
            (None, None) => None,
            _ => {
                return Err(BadSecret(format!(
                    "{PREVIOUS_CERT} and {PREVIOUS_NOT_AFTER} go together"
                )));
            }
        };
        Ok(SharedCa {
            signing,
            since,
            previous,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(name: &str, not_after: Timestamp) -> Ca {
        Ca {
            cert_pem: format!("-----BEGIN CERTIFICATE-----\n{name}\n-----END CERTIFICATE-----\n"),
            key_pem: format!("key of {name}"),
            not_after,
        }
    }

    fn at(hours: i64) -> Timestamp {
        Timestamp::UNIX_EPOCH
            .checked_add(SignedDuration::from_hours(1_000_000 + hours))
            .expect("a time")
    }

    fn bytes(data: BTreeMap<String, String>) -> BTreeMap<String, Vec<u8>> {
        data.into_iter().map(|(k, v)| (k, v.into_bytes())).collect()
    }

    #[test]
    fn the_replaced_ca_stays_trusted_until_it_expires() {
        let validity = Duration::from_secs(30 * 24 * 3600);
        let first = SharedCa::new(ca("one", at(30 * 24)), at(0));
        assert_eq!(first.bundle(at(1)), first.signing.cert_pem);
        assert!(!first.due(at(19 * 24), validity));
        assert!(first.due(at(21 * 24), validity));
        let second = first.rotated(ca("two", at(51 * 24)), at(21 * 24));
        let overlap = second.bundle(at(21 * 24));
        assert!(
            overlap.contains("two") && overlap.contains("one"),
            "{overlap}"
        );
        assert!(overlap.starts_with(&second.signing.cert_pem));
        let after = second.bundle(at(30 * 24 + 1));
        assert!(after.contains("two") && !after.contains("one"), "{after}");
    }

    #[test]
    fn replicas_move_to_a_new_ca_one_interval_after_it_signs() {
        let shared = SharedCa::new(ca("one", at(100)), at(0));
        let interval = Duration::from_secs(3600);
        assert!(!shared.may_move_to(at(0), interval));
        assert!(shared.may_move_to(at(1), interval));
    }

    #[test]
    fn the_secret_round_trips_and_bad_content_is_named() {
        let shared = SharedCa::new(ca("one", at(100)), at(0)).rotated(ca("two", at(200)), at(50));
        let back = SharedCa::from_data(&bytes(shared.to_data())).expect("reads back");
        assert_eq!(back, shared);

        let mut data = bytes(shared.to_data());
        data.remove(CA_KEY);
        let err = SharedCa::from_data(&data).expect_err("no key");
        assert!(err.to_string().contains("no ca.key"), "{err}");
        assert!(err.to_string().contains(SECRET_NAME), "{err}");

        let mut data = bytes(shared.to_data());
        data.insert(CA_SINCE.into(), b"yesterday".to_vec());
        let err = SharedCa::from_data(&data).expect_err("bad time");
        assert!(err.to_string().contains("ca.since \"yesterday\""), "{err}");

        let mut data = bytes(shared.to_data());
        data.remove(PREVIOUS_NOT_AFTER);
        let err = SharedCa::from_data(&data).expect_err("half a previous CA");
        assert!(err.to_string().contains("go together"), "{err}");
    }
}
