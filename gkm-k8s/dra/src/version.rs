//! Versions as DRA attributes: the apiserver accepts only semantic versions
//! (`major.minor.patch`, no leading zeros), while drivers and toolkits
//! write `12.4`, `580.65.06` or `6.8.5.1`.

/// `value` as a semantic version: its first three dot-separated numbers
/// (missing ones are 0, leading zeros dropped); `None` when it does not
/// start with a number or a part is not one: `12.4` is `12.4.0`,
/// `580.65.06` is `580.65.6`, `6.8.5.1` is `6.8.5`.
pub fn semver(value: &str) -> Option<String> {
    let mut parts = [0u64; 3];
    let mut seen = 0;
    for (i, part) in value.trim().split('.').enumerate() {
        if i == 3 {
            break;
        }
        parts[i] = part.parse().ok()?;
        seen += 1;
    }
    (seen > 0).then(|| format!("{}.{}.{}", parts[0], parts[1], parts[2]))
}

#[cfg(test)]
mod tests {
    use super::semver;

    #[test]
    fn drivers_and_toolkits_versions_become_semantic_versions() {
        assert_eq!(semver("12.4").as_deref(), Some("12.4.0"));
        assert_eq!(semver("580.65.06").as_deref(), Some("580.65.6"));
        assert_eq!(semver("9.0").as_deref(), Some("9.0.0"));
        assert_eq!(semver("6.8.5.1").as_deref(), Some("6.8.5"));
        assert_eq!(semver("unknown"), None);
    }

    #[test]
    fn odd_versions_are_left_out_rather_than_refused_by_the_apiserver() {
        assert_eq!(semver(""), None);
        assert_eq!(semver("12.x"), None);
        assert_eq!(semver("-1.0"), None);
        assert_eq!(semver("1.2.3-rc1"), None);
        assert_eq!(semver("0550.054.015").as_deref(), Some("550.54.15"));
    }
}
