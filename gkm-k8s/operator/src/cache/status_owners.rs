//! Taking over status fields that a writer without a field manager owns.
//!
//! A client that writes status with an update or merge patch and names no
//! field manager (and sends no `User-Agent`) is recorded by the apiserver as
//! an `Update` of the `status` subresource by `unknown`
//! ([`LEGACY_STATUS_MANAGERS`]). Such an entry keeps owning the fields it
//! wrote, so a field the operator's apply leaves out (a `pvcStatus` after
//! leaving PVC mode) would never be removed. As client-go's
//! `csaupgrade.UpgradeManagedFields` does, the operator first moves those
//! fields into its own `Apply` entry, in one JSON patch of
//! `metadata.managedFields` guarded by the object's `resourceVersion`; its
//! next apply then owns, and may drop, every status field.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta};
use serde_json::{Value, json};

/// The managers whose status `Update`s the operator takes over: `unknown`,
/// the name the apiserver records for a client that names no field manager
/// and sends no `User-Agent`.
pub const LEGACY_STATUS_MANAGERS: &[&str] = &["unknown"];

const STATUS: &str = "status";

/// The JSON patch (as JSON) that hands `manager` the status fields the
/// `legacy` managers updated, or `None` when none did. It tests
/// `metadata.resourceVersion` first, so it applies only to the object it was
/// computed from.
pub fn upgrade_patch(meta: &ObjectMeta, manager: &str, legacy: &[&str]) -> Option<Value> {
    let entries = upgraded(meta.managed_fields.as_deref()?, manager, legacy)?;
    Some(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta.resource_version},
        {"op": "replace", "path": "/metadata/managedFields", "value": entries},
    ]))
}

/// `entries` with the status `Update`s of the `legacy` managers merged into
/// `manager`'s status `Apply` entry (made from them when it has none), or
/// `None` when there is no such `Update`.
pub fn upgraded(
    entries: &[ManagedFieldsEntry],
    manager: &str,
    legacy: &[&str],
) -> Option<Vec<ManagedFieldsEntry>> {
    let is_legacy = |e: &ManagedFieldsEntry| {
        e.operation.as_deref() == Some("Update")
            && e.subresource.as_deref() == Some(STATUS)
            && e.manager.as_deref().is_some_and(|m| legacy.contains(&m))
    };
    let is_ours = |e: &ManagedFieldsEntry| {
        e.operation.as_deref() == Some("Apply")
            && e.subresource.as_deref() == Some(STATUS)
            && e.manager.as_deref() == Some(manager)
    };
    let (old, mut kept): (Vec<ManagedFieldsEntry>, Vec<ManagedFieldsEntry>) =
        entries.iter().cloned().partition(is_legacy);
    let first = old.first()?;
    let mut fields = Value::Object(Default::default());
    for entry in &old {
        if let Some(FieldsV1(set)) = &entry.fields_v1 {
            merge(&mut fields, set);
        }
    }
    match kept.iter_mut().find(|e| is_ours(e)) {
        Some(ours) => {
            let mut set = ours.fields_v1.take().map_or(Value::Null, |f| f.0);
            merge(&mut set, &fields);
            ours.fields_v1 = Some(FieldsV1(set));
        }
        None => kept.push(ManagedFieldsEntry {
            manager: Some(manager.to_string()),
            operation: Some("Apply".into()),
            subresource: Some(STATUS.into()),
            api_version: first.api_version.clone(),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            time: old
                .iter()
                .filter_map(|e| e.time.clone())
                .max_by_key(|t| t.0),
        }),
    }
    Some(kept)
}

/// Adds the field set `from` to `into` (both `fieldsV1` tries).
fn merge(into: &mut Value, from: &Value) {
    let Value::Object(from) = from else {
        return;
    };
    if !into.is_object() {
        *into = Value::Object(Default::default());
    }
    if let Value::Object(into) = into {
        for (key, value) in from {
            merge(into.entry(key.clone()).or_insert(json!({})), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANAGER: &str = "gkm-operator";

    fn entry(
        manager: &str,
        operation: &str,
        subresource: Option<&str>,
        fields: Value,
    ) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.to_string()),
            operation: Some(operation.into()),
            subresource: subresource.map(Into::into),
            api_version: Some("gkm.io/v1alpha1".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            time: None,
        }
    }

    fn spec_owner() -> ManagedFieldsEntry {
        entry("kubectl", "Apply", None, json!({"f:spec": {"f:image": {}}}))
    }

    #[test]
    fn nothing_to_take_over_is_no_patch() {
        let ours = entry(
            MANAGER,
            "Apply",
            Some(STATUS),
            json!({"f:status": {"f:state": {}}}),
        );
        assert_eq!(
            upgraded(&[spec_owner(), ours], MANAGER, LEGACY_STATUS_MANAGERS),
            None
        );
        // Another client's status update is not the operator's to take.
        let other = entry(
            "kubectl-edit",
            "Update",
            Some(STATUS),
            json!({"f:status": {}}),
        );
        assert_eq!(upgraded(&[other], MANAGER, LEGACY_STATUS_MANAGERS), None);
        // Nor a legacy manager's update of the object itself.
        let main = entry("unknown", "Update", None, json!({"f:metadata": {}}));
        assert_eq!(upgraded(&[main], MANAGER, LEGACY_STATUS_MANAGERS), None);
        assert_eq!(
            upgrade_patch(&ObjectMeta::default(), MANAGER, LEGACY_STATUS_MANAGERS),
            None
        );
    }

    #[test]
    fn the_old_writers_fields_join_the_operators_apply_entry() {
        let old = entry(
            "unknown",
            "Update",
            Some(STATUS),
            json!({"f:status": {".": {}, "f:pvcStatus": {".": {}, "f:ml": {}}, "f:state": {}}}),
        );
        let ours = entry(
            MANAGER,
            "Apply",
            Some(STATUS),
            json!({"f:status": {"f:state": {}, "f:counts": {}}}),
        );
        let got = upgraded(&[spec_owner(), old, ours], MANAGER, LEGACY_STATUS_MANAGERS)
            .expect("upgraded");
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], spec_owner());
        assert_eq!(got[1].manager.as_deref(), Some(MANAGER));
        assert_eq!(got[1].operation.as_deref(), Some("Apply"));
        assert_eq!(
            got[1].fields_v1,
            Some(FieldsV1(json!({"f:status": {
                ".": {}, "f:pvcStatus": {".": {}, "f:ml": {}}, "f:state": {}, "f:counts": {},
            }})))
        );
    }

    #[test]
    fn without_an_apply_entry_the_old_one_becomes_it() {
        let old = entry(
            "unknown",
            "Update",
            Some(STATUS),
            json!({"f:status": {"f:state": {}}}),
        );
        let got = upgraded(&[old], MANAGER, LEGACY_STATUS_MANAGERS).expect("upgraded");
        assert_eq!(
            got,
            [entry(
                MANAGER,
                "Apply",
                Some(STATUS),
                json!({"f:status": {"f:state": {}}})
            )]
        );
    }

    #[test]
    fn the_patch_is_guarded_by_the_resource_version() {
        let meta = ObjectMeta {
            resource_version: Some("42".into()),
            managed_fields: Some(vec![entry(
                "unknown",
                "Update",
                Some(STATUS),
                json!({"f:status": {}}),
            )]),
            ..ObjectMeta::default()
        };
        let patch = upgrade_patch(&meta, MANAGER, LEGACY_STATUS_MANAGERS).expect("a patch");
        assert_eq!(
            patch[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "42"})
        );
        assert_eq!(patch[1]["op"], "replace");
        assert_eq!(patch[1]["path"], "/metadata/managedFields");
        assert_eq!(patch[1]["value"][0]["manager"], MANAGER);
        assert_eq!(patch[1]["value"][0]["operation"], "Apply");
        assert_eq!(patch.as_array().map(Vec::len), Some(2));
    }
}
