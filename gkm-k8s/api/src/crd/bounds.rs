//! Bounds on what a cache's spec may hold. The operator and every agent keep
//! each cache whole in memory, so no list, map or string a tenant writes is
//! left unbounded: a field without a bound of its own gets the defaults here
//! (Kubernetes' own types included: tolerations, affinity, label selectors),
//! and the apiserver refuses an oversized object naming the field.

use schemars::Schema;
use serde_json::{Map, Value, json};

/// The longest string with no bound of its own: a qualified name
/// (`prefix/name`: a 253-byte DNS subdomain, `/`, a 63-byte name).
pub const MAX_STRING: u64 = 317;
/// The most items of a list with no bound of its own.
pub const MAX_ITEMS: u64 = 16;
/// The most entries of a map with no bound of its own.
pub const MAX_PROPERTIES: u64 = 32;
/// The most labels or annotations of a launched pod.
pub const MAX_POD_METADATA_ENTRIES: u64 = 64;
/// The longest label value, as Kubernetes allows.
pub const MAX_LABEL_VALUE: u64 = 63;
/// The longest annotation value.
pub const MAX_ANNOTATION_VALUE: u64 = 2048;

/// Bounds every string, list and map under `schema` that has no bound of its
/// own with [`MAX_STRING`], [`MAX_ITEMS`] and [`MAX_PROPERTIES`], and the
/// keys of every map with [`MAX_STRING`].
pub fn bound_unbounded(schema: &mut Schema) {
    if let Some(object) = schema.as_object_mut() {
        bound(object, MAX_STRING);
    }
}

/// Bounds a map of labels: [`MAX_POD_METADATA_ENTRIES`] entries, values of
/// [`MAX_LABEL_VALUE`] bytes.
pub fn labels(schema: &mut Schema) {
    metadata_map(schema, MAX_LABEL_VALUE);
}

/// Bounds a map of annotations: [`MAX_POD_METADATA_ENTRIES`] entries, values
/// of [`MAX_ANNOTATION_VALUE`] bytes.
pub fn annotations(schema: &mut Schema) {
    metadata_map(schema, MAX_ANNOTATION_VALUE);
}

fn metadata_map(schema: &mut Schema, value: u64) {
    if let Some(object) = schema.as_object_mut() {
        object
            .entry("maxProperties")
            .or_insert(MAX_POD_METADATA_ENTRIES.into());
        bound(object, value);
    }
}

/// Whether the schema's `type` is, or includes, `name`.
fn has_type(schema: &Map<String, Value>, name: &str) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == name,
        Some(Value::Array(types)) => types.iter().any(|t| t == name),
        _ => false,
    }
}

/// Sets the missing bounds on `schema` and everything under it, strings
/// taking `string` at most.
fn bound(schema: &mut Map<String, Value>, string: u64) {
    if has_type(schema, "string") && !schema.contains_key("enum") {
        schema.entry("maxLength").or_insert(string.into());
    }
    if has_type(schema, "array") {
        schema.entry("maxItems").or_insert(MAX_ITEMS.into());
    }
    if schema
        .get("additionalProperties")
        .is_some_and(Value::is_object)
    {
        schema
            .entry("maxProperties")
            .or_insert(MAX_PROPERTIES.into());
        let rule = json!({
            "rule": format!("self.all(k, size(k) <= {MAX_STRING})"),
            "message": format!("keys must be at most {MAX_STRING} characters"),
        });
        let rules = schema
            .entry("x-kubernetes-validations")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(rules) = rules
            && !rules.contains(&rule)
        {
            rules.push(rule);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(Value::Object(sub)) = schema.get_mut(key) {
            bound(sub, string);
        }
    }
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        for sub in properties.values_mut() {
            if let Value::Object(sub) = sub {
                bound(sub, string);
            }
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(subs)) = schema.get_mut(key) {
            for sub in subs.iter_mut() {
                if let Value::Object(sub) = sub {
                    bound(sub, string);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every string, list and map of a cache's spec, walked in the
    /// generated CRD, has an upper bound.
    #[test]
    fn every_cache_spec_field_is_bounded() {
        for crd in [
            <super::super::GKMCache as kube::CustomResourceExt>::crd(),
            <super::super::ClusterGKMCache as kube::CustomResourceExt>::crd(),
        ] {
            let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
            let spec = &schema["openAPIV3Schema"]["properties"]["spec"];
            let mut unbounded = Vec::new();
            unbounded_fields(spec, "spec", &mut unbounded);
            assert!(unbounded.is_empty(), "unbounded: {unbounded:?}");
        }
    }

    fn unbounded_fields(schema: &Value, path: &str, out: &mut Vec<String>) {
        let bounded = |key: &str| schema.get(key).is_some();
        match schema["type"].as_str() {
            Some("string") if !bounded("maxLength") && !bounded("enum") => {
                out.push(path.to_owned())
            }
            Some("array") if !bounded("maxItems") => out.push(path.to_owned()),
            _ => {}
        }
        if schema["additionalProperties"].is_object() && !bounded("maxProperties") {
            out.push(path.to_owned());
        }
        if let Some(items) = schema.get("items") {
            unbounded_fields(items, &format!("{path}[]"), out);
        }
        if let Some(values) = schema.get("additionalProperties") {
            unbounded_fields(values, &format!("{path}{{}}"), out);
        }
        if let Some(Value::Object(properties)) = schema.get("properties") {
            for (name, sub) in properties {
                unbounded_fields(sub, &format!("{path}.{name}"), out);
            }
        }
    }
}
