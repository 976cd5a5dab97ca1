//! The one pod the operator's Jobs run (the PVC fill Job and the capture
//! Job): Pod Security `restricted`, as [`FILL_UID`], no service account
//! token, one container with no privilege, no capabilities and a read-only
//! root file system. Each Job adds its own volumes, mounts and placement.

use std::fmt;
use std::str::FromStr;

use serde_json::{Value, json};

use crate::names::FILL_UID;

/// A Job container's `imagePullPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImagePullPolicy {
    /// Pull the image every time the pod starts.
    Always,
    /// Pull the image only when the node does not have it.
    #[default]
    IfNotPresent,
    /// Never pull the image: the node must have it.
    Never,
}

impl ImagePullPolicy {
    /// The policy as Kubernetes spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ImagePullPolicy::Always => "Always",
            ImagePullPolicy::IfNotPresent => "IfNotPresent",
            ImagePullPolicy::Never => "Never",
        }
    }
}

impl fmt::Display for ImagePullPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A text that is no `imagePullPolicy`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an imagePullPolicy (Always, IfNotPresent or Never)")]
pub struct UnknownPullPolicy(String);

impl FromStr for ImagePullPolicy {
    type Err = UnknownPullPolicy;

    fn from_str(text: &str) -> Result<ImagePullPolicy, UnknownPullPolicy> {
        [
            ImagePullPolicy::Always,
            ImagePullPolicy::IfNotPresent,
            ImagePullPolicy::Never,
        ]
        .into_iter()
        .find(|p| p.as_str() == text)
        .ok_or_else(|| UnknownPullPolicy(text.to_string()))
    }
}

/// The container a Job runs.
#[derive(Debug, Clone, PartialEq)]
pub struct JobContainer<'a> {
    /// The container's name.
    pub name: &'a str,
    /// Its image.
    pub image: &'a str,
    /// When its image is pulled.
    pub image_pull_policy: ImagePullPolicy,
    /// Its arguments (the image's entrypoint runs them).
    pub args: &'a [String],
}

/// The pod spec of a Job running `container` once (`restartPolicy:
/// Never`), Pod Security `restricted`.
pub fn restricted_pod(container: &JobContainer<'_>) -> Value {
    json!({
        "restartPolicy": "Never",
        "automountServiceAccountToken": false,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": FILL_UID,
            "runAsGroup": FILL_UID,
            "fsGroup": FILL_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": container.name,
            "image": container.image,
            "imagePullPolicy": container.image_pull_policy.as_str(),
            "args": container.args,
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"]},
            },
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policies_read_as_kubernetes_spells_them() {
        for policy in [
            ImagePullPolicy::Always,
            ImagePullPolicy::IfNotPresent,
            ImagePullPolicy::Never,
        ] {
            assert_eq!(policy.to_string().parse(), Ok(policy));
        }
        assert!("ifnotpresent".parse::<ImagePullPolicy>().is_err());
        assert_eq!(ImagePullPolicy::default(), ImagePullPolicy::IfNotPresent);
    }

    #[test]
    fn the_pod_passes_pod_security_restricted() {
        let args = vec!["fill".to_string()];
        let pod = restricted_pod(&JobContainer {
            name: "fill",
            image: "gkm",
            image_pull_policy: ImagePullPolicy::Never,
            args: &args,
        });
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(pod["securityContext"]["runAsUser"], FILL_UID);
        assert_eq!(pod["automountServiceAccountToken"], false);
        let container = &pod["containers"][0];
        assert_eq!(container["imagePullPolicy"], "Never");
        assert_eq!(
            container["securityContext"]["capabilities"]["drop"][0],
            "ALL"
        );
        assert_eq!(container["args"][0], "fill");
    }
}
