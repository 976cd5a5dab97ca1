//! Canonical JSON: object keys sorted at every level, no whitespace, so a
//! document always serialises to the same bytes (and the same digest).

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// Serialise `value` canonically.
pub fn canonical<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    let value = serde_json::to_value(value).map_err(|e| Error::format("JSON document", e))?;
    let mut out = Vec::new();
    write(&value, &mut out);
    Ok(out)
}

fn write(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(&Value::String(k.clone()), out);
                out.push(b':');
                if let Some(v) = map.get(k) {
                    write(v, out);
                }
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(v, out);
            }
            out.push(b']');
        }
        // Scalars have one serialisation.
        scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
    }
}
