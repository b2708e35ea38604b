//! What the manifest checks ask of a tool's input schema beyond JSON Schema validity.

use serde_json::Value;

/// Collects (location, name) for each `required` entry that names no property of its schema
/// object. A nested schema is judged only where it lists `properties` itself (it may take its
/// properties from elsewhere, e.g. `allOf`); the top level also when it lists none, unless it
/// composes or opens its properties.
pub(super) fn undefined_required(schema: &Value, at: &str, top: bool, out: &mut Vec<(String, String)>) {
    let Value::Object(obj) = schema else { return };
    let open = [
        "allOf",
        "anyOf",
        "oneOf",
        "$ref",
        "$dynamicRef",
        "patternProperties",
        "additionalProperties",
        "if",
        "dependentSchemas",
        "unevaluatedProperties",
    ]
    .iter()
    .any(|k| obj.contains_key(*k));
    let props = obj.get("properties").and_then(Value::as_object);
    if let Some(Value::Array(required)) = obj.get("required")
        && (props.is_some() || (top && !open))
    {
        for name in required.iter().filter_map(Value::as_str) {
            if !props.is_some_and(|p| p.contains_key(name)) {
                let loc = if at.is_empty() {
                    String::new()
                } else {
                    format!(" at {at}")
                };
                out.push((loc, name.to_string()));
            }
        }
    }
    for (key, value) in obj {
        match key.as_str() {
            "properties" | "$defs" | "definitions" | "patternProperties" | "dependentSchemas" => {
                if let Value::Object(children) = value {
                    for (name, child) in children {
                        undefined_required(child, &format!("{at}/{key}/{name}"), false, out);
                    }
                }
            }
            "items"
            | "additionalProperties"
            | "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "unevaluatedItems"
            | "unevaluatedProperties"
            | "propertyNames" => {
                undefined_required(value, &format!("{at}/{key}"), false, out);
            }
            "allOf" | "anyOf" | "oneOf" | "prefixItems" => {
                if let Value::Array(children) = value {
                    for (i, child) in children.iter().enumerate() {
                        undefined_required(child, &format!("{at}/{key}/{i}"), false, out);
                    }
                }
            }
            _ => {}
        }
    }
}

pub(super) fn default_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}
