//! What the manifest checks ask of a tool's input schema beyond JSON Schema validity.

use serde_json::Value;

/// Collects (location, name) for each `required` entry that names no property of the object
/// it applies to. An object's schema is taken with its branches (`allOf`, `anyOf`, `oneOf`,
/// `if`/`then`/`else`, `dependentSchemas`, at any depth): they apply to the same object, so
/// a name any of them defines in `properties` is defined for all
/// (`{"properties": {"id": {}}, "oneOf": [{"required": ["id"]}]}` is whole). Such an object is
/// not judged when one of them takes properties from elsewhere (`$ref`,
/// `additionalProperties`, `patternProperties`, ...); a nested one only where some of them
/// lists `properties`, the top level always.
pub(super) fn undefined_required(schema: &Value, at: &str, top: bool, out: &mut Vec<(String, String)>) {
    let mut object = Object::default();
    object.gather(schema, at.to_string());
    if !object.open && (top || object.listed) {
        for (at, required) in &object.required {
            for name in required.iter().filter_map(Value::as_str) {
                if !object.names.contains(&name) {
                    let loc = if at.is_empty() {
                        String::new()
                    } else {
                        format!(" at {at}")
                    };
                    out.push((loc, name.to_string()));
                }
            }
        }
    }
    for (at, child) in object.nested {
        undefined_required(child, &at, false, out);
    }
}

/// One object's schema with its branches: what they define and require, and the schemas
/// below them that apply to other values (properties, items, ...).
#[derive(Default)]
struct Object<'a> {
    names: std::collections::HashSet<&'a str>,
    /// Some of them lists `properties`.
    listed: bool,
    /// Some of them takes properties from elsewhere.
    open: bool,
    required: Vec<(String, &'a Vec<Value>)>,
    nested: Vec<(String, &'a Value)>,
}

impl<'a> Object<'a> {
    fn gather(&mut self, schema: &'a Value, at: String) {
        let Value::Object(obj) = schema else { return };
        const OPENING: [&str; 5] = [
            "$ref",
            "$dynamicRef",
            "patternProperties",
            "additionalProperties",
            "unevaluatedProperties",
        ];
        // `false` closes instead: no property but those listed is allowed.
        self.open |= OPENING
            .iter()
            .any(|k| obj.get(*k).is_some_and(|v| *v != Value::Bool(false)));
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            self.listed = true;
            self.names.extend(props.keys().map(String::as_str));
        }
        if let Some(Value::Array(required)) = obj.get("required") {
            self.required.push((at.clone(), required));
        }
        for (key, value) in obj {
            match key.as_str() {
                "properties" | "$defs" | "definitions" | "patternProperties" => {
                    if let Value::Object(children) = value {
                        for (name, child) in children {
                            self.nested.push((format!("{at}/{key}/{name}"), child));
                        }
                    }
                }
                "dependentSchemas" => {
                    if let Value::Object(children) = value {
                        for (name, child) in children {
                            self.gather(child, format!("{at}/{key}/{name}"));
                        }
                    }
                }
                "allOf" | "anyOf" | "oneOf" => {
                    if let Value::Array(children) = value {
                        for (i, child) in children.iter().enumerate() {
                            self.gather(child, format!("{at}/{key}/{i}"));
                        }
                    }
                }
                "if" | "then" | "else" => self.gather(value, format!("{at}/{key}")),
                // What `not` requires must be absent: it may name what nothing defines.
                "not"
                | "items"
                | "additionalProperties"
                | "contains"
                | "unevaluatedItems"
                | "unevaluatedProperties"
                | "propertyNames" => self.nested.push((format!("{at}/{key}"), value)),
                "prefixItems" => {
                    if let Value::Array(children) = value {
                        for (i, child) in children.iter().enumerate() {
                            self.nested.push((format!("{at}/{key}/{i}"), child));
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

pub(super) fn default_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}
