//! Targets in reports: the fields of [`Target`] in camelCase, as Kubernetes
//! status fields are (the image label keeps MCV's snake_case).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::cache::Target;
use crate::gpu::{Arch, Backend};

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Camel {
    backend: Backend,
    arch: Arch,
    warp_size: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ptx_version: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cuda_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    triton_version: Option<String>,
}

impl From<&Target> for Camel {
    fn from(t: &Target) -> Camel {
        Camel {
            backend: t.backend,
            arch: t.arch.clone(),
            warp_size: t.warp_size,
            ptx_version: t.ptx_version,
            cuda_version: t.cuda_version.clone(),
            triton_version: t.triton_version.clone(),
        }
    }
}

impl From<Camel> for Target {
    fn from(c: Camel) -> Target {
        Target {
            backend: c.backend,
            arch: c.arch,
            warp_size: c.warp_size,
            ptx_version: c.ptx_version,
            cuda_version: c.cuda_version,
            triton_version: c.triton_version,
        }
    }
}

/// One target.
pub(super) mod one {
    use super::*;

    pub(in crate::compat) fn serialize<S: Serializer>(t: &Target, s: S) -> Result<S::Ok, S::Error> {
        Camel::from(t).serialize(s)
    }

    pub(in crate::compat) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Target, D::Error> {
        Camel::deserialize(d).map(Target::from)
    }
}

/// A list of targets.
pub(super) mod many {
    use super::*;

    pub(in crate::compat) fn serialize<S: Serializer>(
        ts: &[Target],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(ts.iter().map(Camel::from))
    }

    pub(in crate::compat) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<Target>, D::Error> {
        Ok(Vec::<Camel>::deserialize(d)?
            .into_iter()
            .map(Target::from)
            .collect())
    }
}
