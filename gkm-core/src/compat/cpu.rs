//! Whether a PyTorch cache's C++ kernels fit a node's CPU.
//!
//! Inductor compiles its C++ kernels for the vector ISA it picks on the
//! machine it runs on (`pick_vec_isa`, `torch/_inductor/cpu_vec_isa.py`:
//! the first of `amx_tile`, `avx512_vnni`, `avx512`, `avx2` the CPU
//! supports on x86, `asimd` on Arm), and the ISA is part of the kernels'
//! cache keys: on a node where Inductor picks another ISA it never looks
//! the kernels up. So a CPU-only cache fits a node exactly when the node's
//! CPU ISA, as Inductor would pick it, is the one its builder declared.
//! The tree does not state the ISA: it is declared at build time
//! (`gkm build --cpu-isa`).

use crate::cache::CpuFit;

/// The ISA Inductor would pick on a CPU with these `/proc/cpuinfo` flags
/// (x86 `flags`, Arm `Features`), `None` when it would pick none gkm knows.
///
/// ```
/// use gkm_core::compat::cpu_isa_from_flags;
/// assert_eq!(cpu_isa_from_flags("fpu sse2 avx avx2 fma"), Some("avx2"));
/// assert_eq!(cpu_isa_from_flags("avx2 fma avx512f avx512dq avx512bw avx512vl"), Some("avx512"));
/// assert_eq!(cpu_isa_from_flags("fp asimd evtstrm"), Some("asimd"));
/// assert_eq!(cpu_isa_from_flags("sse2"), None);
/// ```
pub fn cpu_isa_from_flags(flags: &str) -> Option<&'static str> {
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    let avx512 = ["avx512f", "avx512dq", "avx512bw", "avx512vl"]
        .iter()
        .all(|f| has(f));
    if avx512 && has("avx512_vnni") && has("amx_tile") && has("amx_bf16") && has("amx_int8") {
        Some("amx_tile")
    } else if avx512 && has("avx512_vnni") {
        Some("avx512_vnni")
    } else if avx512 {
        Some("avx512")
    } else if has("avx2") && has("fma") {
        Some("avx2")
    } else if has("asimd") {
        Some("asimd")
    } else {
        None
    }
}

/// The ISA Inductor would pick on the CPU `cpuinfo` (the text of
/// `/proc/cpuinfo`) describes, from its first `flags` (x86) or `Features`
/// (Arm) line.
///
/// ```
/// use gkm_core::compat::cpu_isa_from_cpuinfo;
/// let info = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n";
/// assert_eq!(cpu_isa_from_cpuinfo(info), Some("avx2"));
/// assert_eq!(cpu_isa_from_cpuinfo("processor\t: 0\n"), None);
/// ```
pub fn cpu_isa_from_cpuinfo(cpuinfo: &str) -> Option<&'static str> {
    cpuinfo
        .lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            matches!(key.trim(), "flags" | "Features").then_some(value)
        })
        .and_then(cpu_isa_from_flags)
}

/// The ISA Inductor would pick on this host's CPU, read from
/// `/proc/cpuinfo`; `None` when it cannot be read or names no ISA gkm
/// knows. What `gkm check` and the node agent judge CPU-only caches by.
pub fn host_cpu_isa() -> Option<String> {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| cpu_isa_from_cpuinfo(&info).map(str::to_string))
}

/// Why a cache whose C++ kernels were built for `isa` does not fit a node
/// whose CPU ISA is `node`; `None` when it fits.
///
/// ```
/// use gkm_core::compat::cpu_mismatch;
/// assert_eq!(cpu_mismatch("avx2", Some("avx2")), None);
/// assert!(cpu_mismatch("avx2", Some("avx512")).unwrap().contains("avx512"));
/// assert!(cpu_mismatch("avx2", None).is_some());
/// ```
pub fn cpu_mismatch(isa: &str, node: Option<&str>) -> Option<String> {
    mismatch("built for", isa, node)
}

/// Why a cache judged by the CPU kernels `cpu` does not fit a node whose
/// CPU ISA is `node`, saying whether their ISA was declared or read from
/// them; `None` when it fits. Kernels whose ISA is unknown fit no node.
///
/// ```
/// use gkm_core::cache::CpuFit;
/// use gkm_core::compat::cpu_fit_mismatch;
/// let read = CpuFit::read(Some(17), Some("amx_tile".into()));
/// assert_eq!(cpu_fit_mismatch(&read, Some("amx_tile")), None);
/// let declared = CpuFit::declared(None, Some("avx2".into()));
/// assert!(cpu_fit_mismatch(&declared, Some("avx512")).unwrap().contains("declared built for avx2"));
/// assert!(cpu_fit_mismatch(&CpuFit::read(Some(1), None), Some("avx2")).unwrap().contains("record no"));
/// ```
pub fn cpu_fit_mismatch(cpu: &CpuFit, node: Option<&str>) -> Option<String> {
    match (&cpu.isa, cpu.declared) {
        (Some(isa), true) => mismatch("declared built for", isa, node),
        (Some(isa), false) => mismatch("built for", isa, node),
        (None, true) => Some(
            "the cache holds no GPU kernel and no declared CPU ISA (gkm build --cpu-isa)".into(),
        ),
        (None, false) => Some(
            "the cache's C++ kernels record no CPU ISA (their libraries carry no GCC-recorded \
             switches) and none was declared (gkm build --cpu-isa)"
                .into(),
        ),
    }
}

fn mismatch(built: &str, isa: &str, node: Option<&str>) -> Option<String> {
    match node {
        Some(node) if node == isa => None,
        Some(node) => Some(format!(
            "the C++ kernels were {built} {isa}; Inductor picks {node} on this CPU, so their \
             cache keys differ"
        )),
        None => Some(format!(
            "the C++ kernels were {built} {isa}; this CPU's ISA is unknown"
        )),
    }
}
