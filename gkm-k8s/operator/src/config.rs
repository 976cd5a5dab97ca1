//! How the operator runs ([`OperatorConfig`]) and what it refuses to run
//! with ([`InvalidConfig`]).

use std::time::Duration;

use gkm_k8s_api::crd::SignaturePolicy;
use gkm_oci::RegistryOptions;

use crate::cache::pvc::PvcOptions;
use crate::cache::{PolicyFloor, TenantSigners};
use crate::capture::CaptureControllerOptions;

/// How the operator runs.
#[derive(Clone)]
pub struct OperatorConfig {
    /// How to reach registries.
    pub registry: RegistryOptions,
    /// The administrator's policy: for caches without `spec.signature`, and
    /// the signers of every cache whose own signers do not count
    /// ([`TenantSigners`]). Without one, such caches are never verified, so
    /// never delivered.
    pub default_policy: Option<SignaturePolicy>,
    /// The namespaces whose caches' own `spec.signature` signers count
    /// (none by default: only the administrator's signers do).
    pub tenant_signers: TenantSigners,
    /// How often tags are resolved again when a cache does not say.
    pub resolve_interval: Duration,
    /// What every cache's signature policy must meet.
    pub floor: PolicyFloor,
    /// How long a verified image stays verified before its signatures are
    /// checked again (also when nothing changed).
    pub reverify_interval: Duration,
    /// The name events are reported under.
    pub instance: String,
    /// How PVC-mode caches get their claims, volumes and fill Jobs.
    pub pvc: PvcOptions,
    /// Whether each cache gets a DeviceClass selecting the gpu.gkm.io
    /// devices it fits ([`crate::cache::device_class`]); needs DRA and the rights on
    /// DeviceClasses the chart grants with it.
    pub device_classes: bool,
    /// The capture controller's options; `None` runs no capture controller
    /// (the `GKMCacheCapture` CRD need not be installed).
    pub capture: Option<CaptureControllerOptions>,
}

/// An [`OperatorConfig`] the operator cannot run with, naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidConfig {
    /// `resolve_interval` is outside what the operator accepts.
    #[error("must be from {min:?} to {max:?}, not {got:?} (the resolve interval)")]
    ResolveInterval {
        /// The shortest allowed.
        min: Duration,
        /// The longest allowed.
        max: Duration,
        /// What was given.
        got: Duration,
    },
    /// `reverify_interval` is too short.
    #[error("must be at least {min:?}, not {got:?} (the re-verify interval)")]
    ReverifyInterval {
        /// The shortest allowed.
        min: Duration,
        /// What was given.
        got: Duration,
    },
    /// `floor.required` names no signer, so it would require nothing.
    #[error("must name at least one signer (the required signers)")]
    NoRequiredSigner,
    /// `floor.allowed_modes` is empty.
    #[error("must name at least one mode (the allowed signature modes; Enforce is always allowed)")]
    NoAllowedMode,
}

impl OperatorConfig {
    /// The shortest resolve and re-verify interval: shorter than a cache
    /// may ask for (tests, labs), never zero, which would spin against the
    /// registry.
    pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

    /// Checks what [`run`](crate::run) relies on; the binary's flags go through this too.
    pub fn validate(&self) -> std::result::Result<(), InvalidConfig> {
        let (min, max) = (Self::MIN_INTERVAL, gkm_k8s_api::crd::MAX_RESOLVE_INTERVAL);
        if self.resolve_interval < min || self.resolve_interval > max {
            return Err(InvalidConfig::ResolveInterval {
                min,
                max,
                got: self.resolve_interval,
            });
        }
        if self.reverify_interval < min {
            return Err(InvalidConfig::ReverifyInterval {
                min,
                got: self.reverify_interval,
            });
        }
        if self.floor.allowed_modes.is_empty() {
            return Err(InvalidConfig::NoAllowedMode);
        }
        if self
            .floor
            .required
            .as_ref()
            .is_some_and(|p| p.signers.as_ref().is_none_or(Vec::is_empty))
        {
            return Err(InvalidConfig::NoRequiredSigner);
        }
        Ok(())
    }
}

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            registry: RegistryOptions::default(),
            default_policy: None,
            tenant_signers: TenantSigners::default(),
            resolve_interval: Duration::from_secs(300),
            floor: PolicyFloor::default(),
            reverify_interval: Duration::from_secs(3600),
            instance: "gkm-operator".into(),
            pvc: PvcOptions::default(),
            device_classes: false,
            capture: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{InvalidConfig, OperatorConfig};
    use gkm_k8s_api::crd::SignaturePolicy;

    #[test]
    fn a_config_is_checked_before_the_operator_runs() {
        assert_eq!(OperatorConfig::default().validate(), Ok(()));
        let spinning = OperatorConfig {
            resolve_interval: Duration::ZERO,
            ..OperatorConfig::default()
        };
        let err = spinning.validate().expect_err("a zero interval spins");
        assert!(
            matches!(err, InvalidConfig::ResolveInterval { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("must be from 1s"), "{err}");
        let never_reverified = OperatorConfig {
            reverify_interval: Duration::from_millis(10),
            ..OperatorConfig::default()
        };
        assert!(matches!(
            never_reverified.validate(),
            Err(InvalidConfig::ReverifyInterval { .. })
        ));
        let mut empty_floor = OperatorConfig::default();
        empty_floor.floor.required = Some(SignaturePolicy::default());
        assert_eq!(empty_floor.validate(), Err(InvalidConfig::NoRequiredSigner));
        let mut no_mode = OperatorConfig::default();
        no_mode.floor.allowed_modes.clear();
        assert_eq!(no_mode.validate(), Err(InvalidConfig::NoAllowedMode));
    }
}
