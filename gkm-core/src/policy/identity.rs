//! Who may sign: a public key or a keyless identity (an OIDC issuer and a
//! subject or subject pattern).

use std::fmt;

use super::PolicyError;
use super::keys::PublicKey;

/// How a keyless certificate's subject (its email or URI SAN) must match.
#[derive(Debug, Clone)]
pub enum SubjectMatch {
    /// Equal to this string.
    Exact(String),
    /// Matched in full by this regular expression.
    Regexp(regex::Regex),
}

impl SubjectMatch {
    /// A pattern the whole subject must match (as cosign's
    /// `--certificate-identity-regexp`, anchored at both ends).
    pub fn regexp(pattern: &str) -> Result<SubjectMatch, PolicyError> {
        if pattern.is_empty() {
            return Err(PolicyError::Identity("the subject pattern is empty".into()));
        }
        regex::Regex::new(&format!("^(?:{pattern})$"))
            .map(SubjectMatch::Regexp)
            .map_err(|e| PolicyError::SubjectPattern {
                pattern: pattern.into(),
                reason: e.to_string(),
            })
    }

    /// Whether `subject` matches.
    pub fn matches(&self, subject: &str) -> bool {
        match self {
            SubjectMatch::Exact(s) => s == subject,
            SubjectMatch::Regexp(r) => r.is_match(subject),
        }
    }
}

impl PartialEq for SubjectMatch {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl fmt::Display for SubjectMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubjectMatch::Exact(s) => write!(f, "{s}"),
            SubjectMatch::Regexp(r) => {
                let s = r.as_str();
                let inner = s
                    .strip_prefix("^(?:")
                    .and_then(|s| s.strip_suffix(")$"))
                    .unwrap_or(s);
                write!(f, "/{inner}/")
            }
        }
    }
}

/// A keyless signer: the OIDC issuer and subject its certificate must name.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    issuer: String,
    subject: SubjectMatch,
}

impl Identity {
    /// An identity; the issuer is matched exactly.
    pub fn new(issuer: &str, subject: SubjectMatch) -> Result<Identity, PolicyError> {
        if issuer.is_empty() {
            return Err(PolicyError::Identity("the OIDC issuer is empty".into()));
        }
        if matches!(&subject, SubjectMatch::Exact(s) if s.is_empty()) {
            return Err(PolicyError::Identity("the subject is empty".into()));
        }
        Ok(Identity {
            issuer: issuer.into(),
            subject,
        })
    }

    /// The OIDC issuer.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The subject match.
    pub fn subject(&self) -> &SubjectMatch {
        &self.subject
    }
}

/// One accepted signer.
#[derive(Debug, Clone, PartialEq)]
pub enum Signer {
    /// A public key.
    Key(PublicKey),
    /// A keyless identity.
    Keyless(Identity),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_pattern_matches_the_whole_subject() {
        let m = SubjectMatch::regexp(r".*@example\.com").expect("pattern");
        assert!(m.matches("ci@example.com"));
        assert!(!m.matches("ci@example.com.evil"));
        assert_eq!(m.to_string(), r"/.*@example\.com/");
        assert!(matches!(
            SubjectMatch::regexp("("),
            Err(PolicyError::SubjectPattern { .. })
        ));
    }
}
