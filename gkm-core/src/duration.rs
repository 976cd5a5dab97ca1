//! Durations as cache specs write them (`spec.resolveInterval`: `90s`,
//! `5m`, `1h30m`, `250ms`), and the bounds the operator holds a cache's
//! resolve interval to.

use std::time::Duration;

/// Parses a duration made of whole units (`90s`, `5m`, `1h30m`, `250ms`);
/// `None` for anything else, a value that overflows included. Never panics.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let value: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(value), 2)
        } else if rest.starts_with('s') {
            (Duration::from_secs(value), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(value.checked_mul(60)?), 1)
        } else if rest.starts_with('h') {
            (Duration::from_secs(value.checked_mul(3600)?), 1)
        } else {
            return None;
        };
        total = total.checked_add(unit)?;
        rest = &rest[len..];
    }
    Some(total)
}

/// The interval a cache's tags are resolved again at: `spec.resolveInterval`
/// within [`MIN_RESOLVE_INTERVAL`] and [`MAX_RESOLVE_INTERVAL`], else
/// `default`; with a note when the spec's value was not used as written.
pub fn resolve_interval(spec: Option<&str>, default: Duration) -> (Duration, Option<String>) {
    let Some(text) = spec else {
        return (default, None);
    };
    match parse_duration(text) {
        None => (
            default,
            Some(format!(
                "resolveInterval {text:?} is not a duration; using {default:?}"
            )),
        ),
        Some(d) if d < MIN_RESOLVE_INTERVAL => (
            MIN_RESOLVE_INTERVAL,
            Some(format!(
                "resolveInterval {text:?} is below the minimum; using {MIN_RESOLVE_INTERVAL:?}"
            )),
        ),
        Some(d) if d > MAX_RESOLVE_INTERVAL => (
            MAX_RESOLVE_INTERVAL,
            Some(format!(
                "resolveInterval {text:?} is above the maximum; using {MAX_RESOLVE_INTERVAL:?}"
            )),
        ),
        Some(d) => (d, None),
    }
}

/// The shortest `resolveInterval` honoured (the CRD refuses shorter ones).
pub const MIN_RESOLVE_INTERVAL: Duration = Duration::from_secs(10);
/// The longest `resolveInterval` honoured (the CRD refuses longer ones).
pub const MAX_RESOLVE_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_like_the_crd_pattern() {
        assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("5 minutes"), None);
        assert_eq!(parse_duration(""), None);
        assert_eq!(parse_duration("10"), None);
    }

    #[test]
    fn durations_that_overflow_are_refused_not_panics() {
        assert_eq!(parse_duration("9999999999999999h"), None);
        assert_eq!(parse_duration("18446744073709551615m"), None);
        assert_eq!(parse_duration("18446744073709551615s1s"), None);
        assert_eq!(parse_duration("99999999999999999999s"), None);
    }

    #[test]
    fn resolve_intervals_are_bounded() {
        use super::{MAX_RESOLVE_INTERVAL, MIN_RESOLVE_INTERVAL, resolve_interval};
        let default = Duration::from_secs(300);
        assert_eq!(resolve_interval(None, default), (default, None));
        assert_eq!(
            resolve_interval(Some("1m"), default).0,
            Duration::from_secs(60)
        );
        let (d, note) = resolve_interval(Some("0s"), default);
        assert_eq!(d, MIN_RESOLVE_INTERVAL);
        assert!(note.is_some_and(|n| n.contains("minimum")));
        assert_eq!(
            resolve_interval(Some("9999h"), default).0,
            MAX_RESOLVE_INTERVAL
        );
        let (d, note) = resolve_interval(Some("9999999999999999h"), default);
        assert_eq!(d, default);
        assert!(note.is_some_and(|n| n.contains("not a duration")));
    }

    proptest::proptest! {
        /// No text makes the parser panic.
        #[test]
        fn parsing_never_panics(text in "\\PC{0,40}|[0-9]{0,25}(ms|s|m|h)([0-9]{0,25}(ms|s|m|h)){0,3}") {
            let _ = parse_duration(&text);
        }
    }
}
