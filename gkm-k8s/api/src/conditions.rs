//! Status conditions that keep their transition time while they hold.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A condition to set: type, whether it holds, a CamelCase reason, a message.
pub struct Cond<'a> {
    /// `Verified`, `Ready`, `Progressing`, `Degraded`.
    pub type_: &'a str,
    /// Whether it holds.
    pub status: bool,
    /// Why, as a CamelCase word.
    pub reason: &'a str,
    /// Why, for people.
    pub message: String,
}

/// `wanted` as conditions, keeping each one's `lastTransitionTime` from
/// `existing` when its status did not change, so an unchanged status
/// compares equal and is not written again.
pub fn merge(
    existing: Option<&[Condition]>,
    wanted: Vec<Cond<'_>>,
    generation: Option<i64>,
) -> Vec<Condition> {
    wanted
        .into_iter()
        .map(|c| {
            let status = if c.status { "True" } else { "False" }.to_string();
            let previous = existing
                .unwrap_or(&[])
                .iter()
                .find(|e| e.type_ == c.type_ && e.status == status);
            Condition {
                type_: c.type_.to_string(),
                status,
                reason: c.reason.to_string(),
                message: c.message,
                observed_generation: generation,
                last_transition_time: previous
                    .map(|p| p.last_transition_time.clone())
                    .unwrap_or_else(|| Time(Timestamp::now())),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unchanged_condition_keeps_its_transition_time() {
        let first = merge(
            None,
            vec![Cond {
                type_: "Ready",
                status: false,
                reason: "Pending",
                message: "m".into(),
            }],
            Some(1),
        );
        let again = merge(
            Some(&first),
            vec![Cond {
                type_: "Ready",
                status: false,
                reason: "Pending",
                message: "m".into(),
            }],
            Some(1),
        );
        assert_eq!(first, again);
        let flipped = merge(
            Some(&first),
            vec![Cond {
                type_: "Ready",
                status: true,
                reason: "Extracted",
                message: "m".into(),
            }],
            Some(1),
        );
        assert_eq!(flipped[0].status, "True");
        assert!(flipped[0].last_transition_time.0 >= first[0].last_transition_time.0);
    }
}
