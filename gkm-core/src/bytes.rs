//! Byte counts as people write them: `1073741824`, `1GiB`, `512 KiB`, or
//! with Kubernetes' binary suffixes, `20Gi`, as Helm values carry them.

/// Binary suffixes, largest first, each with its Kubernetes spelling.
const UNITS: [(&str, &str, u32); 4] = [
    ("TiB", "Ti", 40),
    ("GiB", "Gi", 30),
    ("MiB", "Mi", 20),
    ("KiB", "Ki", 10),
];

/// Why a byte count did not parse; each names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidBytes {
    /// Not a number of bytes.
    #[error(
        "{0:?}: expected a number of bytes, with an optional KiB, MiB, GiB or TiB (or Ki, Mi, Gi, Ti) suffix"
    )]
    NotBytes(String),
    /// More bytes than a `u64` holds.
    #[error("{0:?}: more bytes than 64 bits hold")]
    TooLarge(String),
}

/// Parses a number of bytes with an optional binary suffix: `KiB`, `MiB`,
/// `GiB`, `TiB`, or Kubernetes' `Ki`, `Mi`, `Gi`, `Ti`.
///
/// ```
/// use gkm_core::bytes::parse_bytes;
/// assert_eq!(parse_bytes("64GiB"), Ok(64 << 30));
/// assert_eq!(parse_bytes("20Gi"), Ok(20 << 30));
/// assert_eq!(parse_bytes("512 KiB"), Ok(512 << 10));
/// assert_eq!(parse_bytes("4096"), Ok(4096));
/// assert!(parse_bytes("64GB").is_err());
/// ```
pub fn parse_bytes(s: &str) -> Result<u64, InvalidBytes> {
    let term = s.trim();
    let (digits, shift) = UNITS
        .iter()
        .find_map(|(unit, short, shift)| {
            term.strip_suffix(unit)
                .or_else(|| term.strip_suffix(short))
                .map(|d| (d.trim(), *shift))
        })
        .unwrap_or((term, 0));
    let n = digits
        .parse::<u64>()
        .map_err(|_| InvalidBytes::NotBytes(s.to_string()))?;
    if n.leading_zeros() < shift {
        return Err(InvalidBytes::TooLarge(s.to_string()));
    }
    Ok(n << shift)
}

/// `bytes` as [`parse_bytes`] reads it: in the largest binary unit that
/// divides it (`64GiB`), or plain (`1048577`).
pub fn format_bytes(bytes: u64) -> String {
    match UNITS
        .iter()
        .find(|(_, _, shift)| bytes >= 1 << shift && bytes.is_multiple_of(1 << shift))
    {
        Some((unit, _, shift)) => format!("{}{unit}", bytes >> shift),
        None => bytes.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_spellings_of_each_unit_and_the_bounds() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("3 Mi"), Ok(3 << 20));
        assert_eq!(parse_bytes("3MiB"), Ok(3 << 20));
        assert_eq!(parse_bytes("16777215Ti"), Ok(16_777_215 << 40));
        assert!(matches!(
            parse_bytes("16777216Ti"),
            Err(InvalidBytes::TooLarge(_))
        ));
        assert!(matches!(
            parse_bytes("20GB"),
            Err(InvalidBytes::NotBytes(_))
        ));
        assert_eq!(format_bytes(64 << 30), "64GiB");
        assert_eq!(format_bytes(1_048_577), "1048577");
    }
}
