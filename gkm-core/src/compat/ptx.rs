//! Which PTX ISA versions a CUDA driver understands.

/// The first CUDA release of each PTX ISA version since CUDA 9.0, oldest
/// first, as NVIDIA's PTX ISA release history lists them: `((major, minor),
/// ptx)` with PTX 8.4 written 84, Triton's encoding. CUDA 12.6 brought no new
/// ISA (it stays at 8.5) and PTX 8.6 came with 12.7, so the minor numbers
/// stop lining up after 12.5.
const FIRST_CUDA_OF_PTX: [((u32, u32), u32); 26] = [
    ((9, 0), 60),
    ((9, 1), 61),
    ((9, 2), 62),
    ((10, 0), 63),
    ((10, 1), 64),
    ((10, 2), 65),
    ((11, 0), 70),
    ((11, 1), 71),
    ((11, 2), 72),
    ((11, 3), 73),
    ((11, 4), 74),
    ((11, 5), 75),
    ((11, 6), 76),
    ((11, 7), 77),
    ((11, 8), 78),
    ((12, 0), 80),
    ((12, 1), 81),
    ((12, 2), 82),
    ((12, 3), 83),
    ((12, 4), 84),
    ((12, 5), 85),
    ((12, 7), 86),
    ((12, 8), 87),
    ((12, 9), 88),
    ((13, 0), 90),
    ((13, 1), 91),
];

/// The newest PTX ISA version (84 for 8.4) a driver supporting CUDA
/// `cuda_version` (`"12.4"`, `"12.4.1"`, `"12"`) can load, from NVIDIA's PTX
/// ISA release history:
///
/// | CUDA  | PTX ISA | | CUDA | PTX ISA |
/// |-------|---------|-|------|---------|
/// | 11.0–11.8 | 7.0–7.8 | | 12.5, 12.6 | 8.5 |
/// | 12.0–12.4 | 8.0–8.4 | | 12.8 | 8.7 |
/// | 12.9 | 8.8 | | 13.0, 13.1 | 9.0, 9.1 |
///
/// (back to CUDA 9.0 → PTX 6.0). `None` when the version does not parse, is
/// older than CUDA 9.0, or is newer than the newest release in the table: a
/// newer driver loads every ISA the table knows, but which newer ones is not
/// known here.
///
/// ```
/// use gkm_core::compat::max_ptx_version;
/// assert_eq!(max_ptx_version("12.4"), Some(84));
/// assert_eq!(max_ptx_version("12.6.2"), Some(85));
/// assert_eq!(max_ptx_version("11.8"), Some(78));
/// assert_eq!(max_ptx_version("99.0"), None);
/// ```
pub fn max_ptx_version(cuda_version: &str) -> Option<u32> {
    let driver = parse_version(cuda_version)?;
    let newest = FIRST_CUDA_OF_PTX.last()?.0;
    if driver > newest {
        return None;
    }
    FIRST_CUDA_OF_PTX
        .iter()
        .rev()
        .find(|(cuda, _)| *cuda <= driver)
        .map(|(_, ptx)| *ptx)
}

/// The drivers' CUDA versions [`max_ptx_version`] knows, as the first one
/// and the first one past them: ((9, 0), (13, 2)) for a table from CUDA 9.0
/// to 13.1. The PTX rule checks only these.
pub(crate) fn checked_drivers() -> ((u32, u32), (u32, u32)) {
    let first = FIRST_CUDA_OF_PTX[0].0;
    let (major, minor) = FIRST_CUDA_OF_PTX[FIRST_CUDA_OF_PTX.len() - 1].0;
    (first, (major, minor + 1))
}

/// The CUDA major version whose toolkits emit PTX ISA `ptx` (84 for 8.4):
/// the major of the release that introduced it, or, for an ISA newer than
/// the table that keeps the newest known ISA major (9.2 after 9.1), that
/// release's major, since a new CUDA major version starts a new ISA major
/// version (7.0 with 11.0, 8.0 with 12.0, 9.0 with 13.0). `None` for an ISA
/// of an unknown newer major (10.0), or older than the table (before 6.0).
pub(crate) fn cuda_major_of_ptx(ptx: u32) -> Option<u32> {
    let ((major, _), known) = FIRST_CUDA_OF_PTX
        .iter()
        .rev()
        .find(|(_, known)| *known <= ptx)?;
    (known / 10 == ptx / 10).then_some(*major)
}

/// `12.4` → (12, 4); `12` → (12, 0); extra components are ignored.
pub(crate) fn parse_version(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = match parts.next() {
        Some(m) => m.parse().ok()?,
        None => 0,
    };
    Some((major, minor))
}

/// 84 → "8.4".
pub(crate) fn ptx_display(ptx: u32) -> String {
    format!("{}.{}", ptx / 10, ptx % 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_ordered() {
        assert!(
            FIRST_CUDA_OF_PTX
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1)
        );
    }

    #[test]
    fn driver_versions() {
        assert_eq!(max_ptx_version("12.0"), Some(80));
        assert_eq!(max_ptx_version("12.7"), Some(86));
        assert_eq!(max_ptx_version("12.8"), Some(87));
        assert_eq!(max_ptx_version("13.1"), Some(91));
        assert_eq!(max_ptx_version("12"), Some(80));
        assert_eq!(max_ptx_version("8.0"), None);
        assert_eq!(max_ptx_version("13.2"), None);
        assert_eq!(max_ptx_version("twelve"), None);
        assert_eq!(max_ptx_version(""), None);
    }

    #[test]
    fn checked_drivers_are_those_with_a_known_ptx_isa() {
        let (first, past) = checked_drivers();
        assert_eq!((first, past), ((9, 0), (13, 2)));
        assert!(max_ptx_version("9.0").is_some() && max_ptx_version("8.9").is_none());
        assert!(max_ptx_version("13.1").is_some() && max_ptx_version("13.2").is_none());
    }

    #[test]
    fn ptx_majors() {
        assert_eq!(cuda_major_of_ptx(87), Some(12));
        assert_eq!(cuda_major_of_ptx(80), Some(12));
        assert_eq!(cuda_major_of_ptx(78), Some(11));
        assert_eq!(cuda_major_of_ptx(90), Some(13));
        assert_eq!(cuda_major_of_ptx(92), Some(13));
        assert_eq!(cuda_major_of_ptx(64), Some(10));
        assert_eq!(cuda_major_of_ptx(100), None);
        assert_eq!(cuda_major_of_ptx(50), None);
    }
}
