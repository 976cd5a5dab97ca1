//! One compiled Triton kernel: the entry of every kind gkm knows today
//! ([`TritonKernel`]), read from the `<kernel>.json` metadata Triton writes
//! next to the binary, and the `.version` line of its PTX.
//!
//! Parsing is pure and never panics, whatever the bytes: it is what the
//! fuzz targets call.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::cache::{CacheError, EntryFacts, Target, backend_from_str};
use crate::gpu::{Arch, Backend};

/// One compiled Triton kernel, as `manifest.json` lists it (GKM's and
/// MCV's entry): the facts of an entry of a Triton cache, and of the
/// Triton kernels an Inductor, Mega-Cache or vLLM cache files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TritonKernel {
    /// Triton's hash of the kernel source and options.
    pub hash: String,
    /// Where the kernel is filed: its Triton cache directory name, or for a
    /// kernel bundled inside a single-file artefact (vLLM's, Mega-Cache's),
    /// that artefact's path.
    #[serde(default)]
    pub dummy_key: String,
    /// PTX ISA version (CUDA only), e.g. 84 for 8.4: the one Triton was told
    /// to use or, when it chose the toolkit's default, the `.version` its PTX
    /// declares.
    #[serde(default)]
    pub ptx_version: Option<u32>,
    /// Software pipelining stages.
    #[serde(default)]
    pub num_stages: u32,
    /// Warps per CTA.
    #[serde(default)]
    pub num_warps: u32,
    /// Whether it was compiled in debug mode.
    #[serde(default)]
    pub debug: bool,
    /// Compiler backend.
    #[serde(deserialize_with = "backend_from_str")]
    pub backend: Backend,
    /// Architecture.
    pub arch: Arch,
    /// Threads per warp.
    pub warp_size: u32,
    /// Triton version that compiled it, when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triton_version: Option<String>,
    /// Kernel name, when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl TritonKernel {
    /// This kernel's compile target.
    pub fn target(&self) -> Target {
        Target {
            backend: self.backend,
            arch: self.arch.clone(),
            warp_size: self.warp_size,
            ptx_version: self.ptx_version,
            cuda_version: None,
            triton_version: self.triton_version.clone(),
        }
    }

    /// The order manifests list kernels in: by where they are filed, then
    /// name, hash and target; the remaining fields keep it total.
    fn order(&self) -> impl Ord + '_ {
        (
            (
                &self.dummy_key,
                &self.name,
                &self.hash,
                &self.backend,
                &self.arch,
            ),
            (
                self.ptx_version,
                self.num_stages,
                self.num_warps,
                self.debug,
            ),
            (self.warp_size, &self.triton_version),
        )
    }
}

impl PartialOrd for TritonKernel {
    fn partial_cmp(&self, other: &TritonKernel) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TritonKernel {
    fn cmp(&self, other: &TritonKernel) -> Ordering {
        self.order().cmp(&other.order())
    }
}

impl EntryFacts for TritonKernel {
    fn key(&self) -> &str {
        &self.dummy_key
    }

    fn target(&self) -> Option<Target> {
        Some(TritonKernel::target(self))
    }

    fn versions(&self) -> Vec<(&'static str, String)> {
        self.triton_version
            .iter()
            .map(|v| ("triton", v.clone()))
            .collect()
    }

    fn kernel(&self) -> Option<&TritonKernel> {
        Some(self)
    }
}

/// What the errors of this module say they were reading.
const WHAT: &str = "kernel metadata";

/// Threads per warp on every NVIDIA architecture, used when a CUDA kernel's
/// metadata does not record it.
const CUDA_WARP_SIZE: u32 = 32;

impl TritonKernel {
    /// Read a Triton kernel's metadata (`<kernel>.json`).
    ///
    /// The target comes from `target` — `{"backend","arch","warp_size"}`
    /// (Triton 3) or `[backend, arch, warp_size]` — or else from the top-level
    /// `backend_name`, `arch` and `warp_size`. A CUDA kernel without a warp
    /// size gets 32; any other backend must record it. `dummy_key` is left
    /// empty: it is the cache directory the file was found in, which the
    /// scanner fills in.
    ///
    /// ```
    /// use gkm_core::cache::TritonKernel;
    /// let json = br#"{"hash":"ab12","name":"add_kernel","num_warps":4,"num_stages":3,
    ///     "target":{"backend":"cuda","arch":75,"warp_size":32},"ptx_version":null}"#;
    /// let entry = TritonKernel::from_kernel_json(json).unwrap();
    /// assert_eq!(entry.target().to_string(), "cuda/75/32");
    /// assert!(TritonKernel::from_kernel_json(b"{\"hash\":\"ab12\"}").is_err());
    /// ```
    pub fn from_kernel_json(bytes: &[u8]) -> Result<TritonKernel, CacheError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        let Value::Object(obj) = value else {
            return Err(invalid("expected a JSON object".to_string()));
        };
        let (backend, arch, warp_size) = target(&obj)?;
        Ok(TritonKernel {
            hash: string(&obj, "hash")?.ok_or_else(|| invalid("missing field `hash`".into()))?,
            dummy_key: String::new(),
            ptx_version: uint(&obj, "ptx_version")?,
            num_stages: uint(&obj, "num_stages")?.unwrap_or(0),
            num_warps: uint(&obj, "num_warps")?.unwrap_or(0),
            debug: match obj.get("debug") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => return Err(wrong_type("debug", "a boolean", other)),
            },
            backend,
            arch,
            warp_size,
            triton_version: string(&obj, "triton_version")?,
            name: string(&obj, "name")?,
        })
    }
}

/// The PTX ISA version a PTX module declares (`.version 8.4` → 84), from the
/// start of its text; `None` when there is no readable `.version` directive.
///
/// ```
/// use gkm_core::cache::ptx_isa_version;
/// assert_eq!(ptx_isa_version(b"//\n// Generated\n//\n\n.version 8.4\n.target sm_75\n"), Some(84));
/// assert_eq!(ptx_isa_version(b".target sm_75\n"), None);
/// ```
pub fn ptx_isa_version(ptx: &[u8]) -> Option<u32> {
    let text = String::from_utf8_lossy(ptx);
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(".version") || l.starts_with(".target"))?;
    let version = line.strip_prefix(".version")?.trim();
    let version = version
        .split(|c: char| c.is_whitespace() || c == ';')
        .next()?;
    let (major, minor) = version.split_once('.')?;
    let major: u32 = major.parse().ok()?;
    let minor: u32 = minor.parse().ok()?;
    if minor > 9 {
        return None;
    }
    major.checked_mul(10)?.checked_add(minor)
}

/// Backend, architecture and warp size of a kernel.
fn target(obj: &Map<String, Value>) -> Result<(Backend, Arch, u32), CacheError> {
    let (backend, arch, warp) = match obj.get("target") {
        Some(Value::Object(t)) => (t.get("backend"), t.get("arch"), t.get("warp_size")),
        Some(Value::Array(t)) => (t.first(), t.get(1), t.get(2)),
        Some(Value::Null) | None => (obj.get("backend_name"), obj.get("arch"), None),
        Some(other) => return Err(wrong_type("target", "an object or an array", other)),
    };
    let warp = warp.or_else(|| obj.get("warp_size"));
    let backend = match backend {
        Some(Value::String(s)) => s
            .parse::<Backend>()
            .map_err(|e| invalid(format!("target backend: {e}")))?,
        Some(other) => return Err(wrong_type("target.backend", "a string", other)),
        None => {
            return Err(invalid(
                "missing field `target` (backend, arch, warp_size)".into(),
            ));
        }
    };
    let arch = match arch {
        // A gfx target may carry its features (`gfx90a:sramecc+:xnack-`);
        // the architecture is the part before them.
        Some(Value::String(s)) => s.split(':').next().unwrap_or_default().parse::<Arch>(),
        Some(Value::Number(n)) => n.to_string().parse::<Arch>(),
        Some(other) => return Err(wrong_type("target.arch", "a string or a number", other)),
        None => return Err(invalid("missing field `target.arch`".into())),
    }
    .map_err(|e| invalid(format!("target arch: {e}")))?;
    let warp_size = match warp {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                invalid(format!(
                    "target.warp_size: expected a positive integer, found {n}"
                ))
            })?,
        Some(Value::Null) | None if backend == Backend::Cuda => CUDA_WARP_SIZE,
        Some(Value::Null) | None => return Err(invalid("missing field `target.warp_size`".into())),
        Some(other) => return Err(wrong_type("target.warp_size", "an integer", other)),
    };
    Ok((backend, arch, warp_size))
}

/// An optional string field.
fn string(obj: &Map<String, Value>, field: &str) -> Result<Option<String>, CacheError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(wrong_type(field, "a string", other)),
    }
}

/// An optional non-negative integer field that fits in a `u32`.
fn uint(obj: &Map<String, Value>, field: &str) -> Result<Option<u32>, CacheError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                invalid(format!(
                    "`{field}`: expected a non-negative integer, found {n}"
                ))
            }),
        Some(other) => Err(wrong_type(field, "an integer", other)),
    }
}

fn wrong_type(field: &str, expected: &str, found: &Value) -> CacheError {
    let found = match found {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    invalid(format!("`{field}`: expected {expected}, found {found}"))
}

fn invalid(reason: String) -> CacheError {
    CacheError::Invalid { what: WHAT, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_rocm_top_level_form() {
        let json = br#"{"hash":"h","backend_name":"hip","arch":"gfx90a","warp_size":64}"#;
        let e = TritonKernel::from_kernel_json(json).unwrap();
        assert_eq!(e.target().to_string(), "hip/gfx90a/64");
    }

    #[test]
    fn gfx_features_are_not_part_of_the_arch() {
        let json = br#"{"hash":"h","target":{"backend":"hip","arch":"gfx90a:sramecc+:xnack-","warp_size":64}}"#;
        let e = TritonKernel::from_kernel_json(json).unwrap();
        assert_eq!(e.arch.as_str(), "gfx90a");
    }

    #[test]
    fn reads_the_array_form() {
        let e = TritonKernel::from_kernel_json(br#"{"hash":"h","target":["cuda",80]}"#).unwrap();
        assert_eq!(e.target().to_string(), "cuda/80/32");
    }

    #[test]
    fn errors_name_the_field() {
        let cases: [(&[u8], &str); 6] = [
            (
                br#"{"hash":"h","target":{"backend":"hip","arch":"gfx90a"}}"#,
                "target.warp_size",
            ),
            (
                br#"{"hash":"h","target":{"backend":"tpu","arch":75}}"#,
                "backend",
            ),
            (
                br#"{"hash":"h","target":{"backend":"cuda","arch":"ampere"}}"#,
                "arch",
            ),
            (
                br#"{"hash":"h","target":{"backend":"cuda","arch":75},"num_warps":-1}"#,
                "num_warps",
            ),
            (br#"{"target":{"backend":"cuda","arch":75}}"#, "hash"),
            (
                br#"{"hash":1,"target":{"backend":"cuda","arch":75}}"#,
                "hash",
            ),
        ];
        for (json, field) in cases {
            let err = TritonKernel::from_kernel_json(json)
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{err} should name {field}");
        }
    }

    #[test]
    fn ptx_version_needs_a_version_line_before_the_target() {
        assert_eq!(ptx_isa_version(b".version 7.8\n.target sm_80"), Some(78));
        assert_eq!(ptx_isa_version(b".version 8.10\n"), None);
        assert_eq!(ptx_isa_version(b".version eight\n"), None);
        assert_eq!(ptx_isa_version(b""), None);
    }
}
