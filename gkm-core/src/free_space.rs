//! How much of a filesystem must stay free: the free-space reserve the
//! node agent keeps while it extracts, and the CSI driver while it makes
//! relocation layers, on the same filesystem.

use std::fmt;
use std::str::FromStr;

use crate::bytes::{format_bytes, parse_bytes};

/// How much of a filesystem must stay free after an extraction: a
/// percentage of its size plus a number of bytes.
///
/// Written and parsed as `12%`, `1073741824` (bytes, or with a `KiB`,
/// `MiB`, `GiB` or `TiB` suffix: `1GiB`) or both (`10%+1GiB`); `0` keeps
/// nothing free.
///
/// ```
/// use gkm_core::free_space::FreeSpaceReserve;
/// assert_eq!(FreeSpaceReserve::default(), FreeSpaceReserve::NONE);
/// let node = FreeSpaceReserve::KUBELET_EVICTION_PLUS_MARGIN;
/// assert_eq!(node.to_string(), "12%");
/// assert_eq!(node.bytes_of(100 << 30), 12 << 30);
/// let both: FreeSpaceReserve = "10%+1GiB".parse().unwrap();
/// assert_eq!(both, FreeSpaceReserve { percent: 10, bytes: 1 << 30 });
/// assert_eq!(both.bytes_of(100 << 30), 11 << 30);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeSpaceReserve {
    /// A percentage (0 to 100) of the filesystem's size...
    pub percent: u8,
    /// ...plus this many bytes.
    pub bytes: u64,
}

impl FreeSpaceReserve {
    /// 12%: the kubelet's default hard eviction threshold on the node's
    /// filesystem, `nodefs.available<10%`, plus a 2% margin. An extraction
    /// stops while the node still has room before the kubelet would start
    /// evicting pods; the margin covers what other writers add meanwhile.
    /// It is a share of the filesystem, not a fixed size, so that small
    /// volumes (a 1 GiB claim) stay usable.
    pub const KUBELET_EVICTION_PLUS_MARGIN: FreeSpaceReserve = FreeSpaceReserve::percent(12);

    /// No reserve: the filesystem may be filled.
    pub const NONE: FreeSpaceReserve = FreeSpaceReserve {
        percent: 0,
        bytes: 0,
    };

    /// `percent` of the filesystem's size.
    pub const fn percent(percent: u8) -> FreeSpaceReserve {
        FreeSpaceReserve { percent, bytes: 0 }
    }

    /// `bytes` bytes.
    pub const fn bytes(bytes: u64) -> FreeSpaceReserve {
        FreeSpaceReserve { percent: 0, bytes }
    }

    /// The reserve in bytes on a filesystem of `size` bytes.
    pub fn bytes_of(self, size: u64) -> u64 {
        let share = u128::from(size) * u128::from(self.percent.min(100)) / 100;
        (share as u64).saturating_add(self.bytes)
    }
}

/// [`FreeSpaceReserve::NONE`]: only the caller knows whose filesystem it
/// writes to. A node agent extracting onto the kubelet's filesystem passes
/// [`FreeSpaceReserve::KUBELET_EVICTION_PLUS_MARGIN`] (its default);
/// `gkm extract` takes `--keep-free`.
impl Default for FreeSpaceReserve {
    fn default() -> Self {
        FreeSpaceReserve::NONE
    }
}

/// Why a free-space reserve did not parse; each names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidReserve {
    /// Not a reserve ([`FreeSpaceReserve`]'s text).
    #[error(
        "{0:?}: expected a percentage of the filesystem, a number of bytes \
         (with an optional KiB, MiB, GiB or TiB suffix) or both, as in 10%+1GiB"
    )]
    NotReserve(String),
    /// A percentage over 100%, or more than one.
    #[error("{0:?}: one percentage, a whole number from 0% to 100%")]
    BadPercentage(String),
}

impl fmt::Display for FreeSpaceReserve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = || format_bytes(self.bytes);
        match (self.percent, self.bytes) {
            (0, _) => f.write_str(&bytes()),
            (p, 0) => write!(f, "{p}%"),
            (p, _) => write!(f, "{p}%+{}", bytes()),
        }
    }
}

impl FromStr for FreeSpaceReserve {
    type Err = InvalidReserve;

    fn from_str(s: &str) -> Result<Self, InvalidReserve> {
        let bad = || InvalidReserve::NotReserve(s.to_string());
        let mut reserve = FreeSpaceReserve::NONE;
        let (mut percent_seen, mut bytes_seen) = (false, false);
        for term in s.trim().split('+').map(str::trim) {
            if let Some(p) = term.strip_suffix('%') {
                let p = p.trim().parse::<u8>().map_err(|_| bad())?;
                if p > 100 || percent_seen {
                    return Err(InvalidReserve::BadPercentage(s.to_string()));
                }
                percent_seen = true;
                reserve.percent = p;
                continue;
            }
            if bytes_seen {
                return Err(bad());
            }
            bytes_seen = true;
            reserve.bytes = parse_bytes(term).map_err(|_| bad())?;
        }
        Ok(reserve)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_parse_and_print() {
        for (text, reserve) in [
            ("12%", FreeSpaceReserve::KUBELET_EVICTION_PLUS_MARGIN),
            (
                "10%+1GiB",
                FreeSpaceReserve {
                    percent: 10,
                    bytes: 1 << 30,
                },
            ),
            ("15%", FreeSpaceReserve::percent(15)),
            ("100%", FreeSpaceReserve::percent(100)),
            ("0", FreeSpaceReserve::NONE),
            ("1GiB", FreeSpaceReserve::bytes(1 << 30)),
            ("1048577", FreeSpaceReserve::bytes((1 << 20) + 1)),
            (
                "5%+512MiB",
                FreeSpaceReserve {
                    percent: 5,
                    bytes: 512 << 20,
                },
            ),
        ] {
            assert_eq!(text.parse::<FreeSpaceReserve>(), Ok(reserve), "{text}");
            assert_eq!(reserve.to_string(), text);
        }
        assert_eq!(
            " 1 GiB + 10 % ".parse::<FreeSpaceReserve>(),
            Ok(FreeSpaceReserve {
                percent: 10,
                bytes: 1 << 30
            })
        );
        for bad in [
            "101%",
            "-1",
            "ten",
            "1.5%",
            "",
            "1%+2%",
            "1+2",
            "99999999TiB",
            "1GB",
        ] {
            assert!(bad.parse::<FreeSpaceReserve>().is_err(), "{bad:?} parsed");
        }
    }
}
