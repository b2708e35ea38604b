//! The Gemini Developer API's `Schema` object (its `functionDeclarations[].parameters`): a
//! select subset of OpenAPI 3.0. A manifest's JSON Schema is reduced to it: `$ref`s into
//! `$defs`/`definitions` inlined, `type` arrays with `"null"` turned into `nullable`, a
//! `null` branch of `anyOf`/`oneOf` likewise, enum values as strings, `const` as a one-value
//! enum, `oneOf` as `anyOf`, `allOf` merged into one node (properties and `required` join,
//! bounds take the strictest, other fields the first that sets them), and every keyword the
//! `Schema` object does not have removed.
//! What cannot be expressed is dropped, never invented: a cyclic `$ref` drops the property
//! that holds it, a tuple's `items` is dropped (also `items` beside `prefixItems`, which
//! speaks of the elements after the prefix only), a `format` the API rejects for its type is
//! dropped. Fields the API allows on one type only go where it takes them: a node without a
//! type gets the one its fields say, a union's fields move into the branch of their type, and
//! a field of another type than the node's is dropped (an enum on an integer; the value keeps
//! its own type), as is an enum or `const` of other values than strings on a node that names
//! no type (`{"const": 5}` is no string). Inlining is bounded: a node nested deeper than
//! [`MAX_DEPTH`] levels, the `$ref`s past [`MAX_REF_EXPANSIONS`] in one schema, and those
//! that would inline more than [`INLINE_BUDGET_FACTOR`] times the schema's own size are
//! dropped like a cycle, so no schema a manifest can hold makes the rendering much larger
//! than the manifest.

use std::cell::Cell;

use serde_json::{Map, Value};

/// The fields of the `Schema` object (Gemini API reference, `Schema`), in the order they
/// are written out is the manifest's own order.
const FIELDS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "propertyOrdering",
    "default",
    "items",
    "minimum",
    "maximum",
];

/// The `Type` enum's values, as the API spells them.
const TYPES: &[&str] = &[
    "STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL",
];

/// The fields that take a non-negative integer.
const COUNTS: &[&str] = &[
    "maxItems",
    "minItems",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
];

/// The fields the API allows on one type only ("properties: only allowed for OBJECT type",
/// "enum: only allowed for STRING type"), by that type.
const TYPED: &[(&str, &[&str])] = &[
    (
        "OBJECT",
        &[
            "properties",
            "required",
            "propertyOrdering",
            "minProperties",
            "maxProperties",
        ],
    ),
    ("ARRAY", &["items", "minItems", "maxItems"]),
    ("STRING", &["enum", "minLength", "maxLength", "pattern"]),
];

/// The type a field is allowed on, when it is allowed on one only.
fn owner(field: &str) -> Option<&'static str> {
    TYPED
        .iter()
        .find(|(_, fields)| fields.contains(&field))
        .map(|&(ty, _)| ty)
}

/// Puts each field allowed on one type only where the API takes it. A node without a type
/// gets the type its fields say (`properties` an object, `items` an array, `enum` strings),
/// as JSON Schema reads them. In a union such a field moves into each branch of its type,
/// joining what the branch says itself (both apply: properties name by name, `required`
/// names added, then kept only for properties the branch has). Elsewhere, a field of another type than the node's is dropped
/// (`enum` on an integer): the value keeps its own type.
///
/// A field copied into more than one branch is charged to `budget` (what the reduction may
/// still inline, see [`INLINE_BUDGET_FACTOR`]) for every copy past the first, through
/// `charge` (false: over budget): unions nested in unions would otherwise double the schema
/// at every level. A field the budget cannot pay for is dropped.
fn fit_to_type(out: &mut Map<String, Value>, charge: impl Fn(usize) -> bool) {
    if !out.contains_key("type") && !out.contains_key("anyOf") {
        let implied = TYPED
            .iter()
            .find(|(_, fields)| fields.iter().any(|f| out.contains_key(*f)));
        if let Some(&(ty, _)) = implied {
            out.insert("type".into(), Value::String(ty.into()));
        }
    }
    let ty = out.get("type").and_then(Value::as_str).map(str::to_string);
    let typed: Vec<String> = out.keys().filter(|k| owner(k).is_some()).cloned().collect();
    for field in typed {
        let owner = owner(&field);
        if ty.is_some() && ty.as_deref() == owner {
            // Where it belongs: left in its place, so the manifest's order is kept.
            continue;
        }
        // Of another type than the node's it is dropped; in a union it moves.
        let Some(value) = out.shift_remove(&field) else {
            continue;
        };
        if ty.is_none()
            && let Some(Value::Array(branches)) = out.get_mut("anyOf")
        {
            let mut takers: Vec<&mut Map<String, Value>> = branches
                .iter_mut()
                .filter_map(Value::as_object_mut)
                .filter(|b| b.get("type").and_then(Value::as_str) == owner)
                .collect();
            if !charge(size(&value) * takers.len().saturating_sub(1)) {
                continue;
            }
            for branch in &mut takers {
                // Both the node's field and the branch's own apply: they join.
                join(branch, field.clone(), value.clone());
            }
        }
    }
    // Once every field has moved (`required` may come before `properties`), each branch's
    // names are those of its own properties.
    if let Some(Value::Array(branches)) = out.get_mut("anyOf") {
        for branch in branches.iter_mut().filter_map(Value::as_object_mut) {
            name_only_properties(branch);
        }
    }
}

/// Leaves `required` and `propertyOrdering` naming only properties the node has (ones that
/// were dropped, or that belong to another branch of a union).
fn name_only_properties(node: &mut Map<String, Value>) {
    let names: Vec<String> = node
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    for key in ["required", "propertyOrdering"] {
        if let Some(Value::Array(list)) = node.get_mut(key) {
            list.retain(|n| n.as_str().is_some_and(|n| names.iter().any(|p| p == n)));
            if list.is_empty() {
                node.remove(key);
            }
        }
    }
}

/// How deep `$ref`s are followed before a reference is treated as a cycle.
const MAX_REF_DEPTH: usize = 32;

/// How deep schema nodes nest (a `$ref` counts as a level) before deeper ones are dropped:
/// inlining references can nest a small schema without end, and each level is a frame of
/// the reducer's recursion.
const MAX_DEPTH: usize = 64;

/// How many `$ref`s one tool's schema has inlined before the rest are dropped: a reference
/// used twice in each of a chain of definitions doubles the inlined schema at every link.
const MAX_REF_EXPANSIONS: usize = 1_000;

/// How much one reduction may inline, in [`size`] units (about bytes of JSON): this many
/// times the manifest's schema (its definitions included), and at least
/// [`MIN_INLINE_BUDGET`]. Inlining copies a definition wherever it is referred to, so a few
/// hundred references to one large definition would otherwise render a schema hundreds of
/// times the manifest's size (a 153 KB manifest rendered 115 MB); a reference past the
/// budget is dropped like a cycle, and `required` follows.
const INLINE_BUDGET_FACTOR: usize = 4;
const MIN_INLINE_BUDGET: usize = 64 * 1024;

/// About how many bytes `value` takes as compact JSON (escapes and long numbers aside).
fn size(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len() + 2,
        Value::Array(items) => 1 + items.iter().map(|v| size(v) + 1).sum::<usize>().max(1),
        // A key, its quotes and colon, its value, and a comma or the closing brace.
        Value::Object(map) => {
            1 + map
                .iter()
                .map(|(k, v)| k.len() + 4 + size(v))
                .sum::<usize>()
                .max(1)
        }
        _ => 5,
    }
}

/// The formats the API accepts for a type (it rejects others, e.g. "only 'enum' and
/// 'date-time' are supported for STRING type").
fn format_allowed(ty: Option<&str>, format: &str) -> bool {
    match ty {
        Some("STRING") => matches!(format, "enum" | "date-time"),
        Some("NUMBER") => matches!(format, "float" | "double"),
        Some("INTEGER") => matches!(format, "int32" | "int64"),
        _ => false,
    }
}

/// A tool's `parameters` for Gemini: the reduced schema, or `None` when the tool takes no
/// parameters (an object schema with no property left), since the API wants no `parameters`
/// then.
pub(crate) fn parameters(schema: &Value) -> Option<Value> {
    let reducer = Reducer::new(schema);
    let reduced = reducer.reduce(schema, &mut Vec::new())?;
    let has_properties = reduced
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| !p.is_empty());
    has_properties.then_some(reduced)
}

struct Reducer<'a> {
    /// The root's `$defs` and `definitions`, what local `$ref`s point into.
    root: &'a Value,
    /// How deep the node being reduced is.
    depth: Cell<usize>,
    /// How many `$ref`s have been inlined.
    expansions: Cell<usize>,
    /// How much has been inlined, and how much may be ([`INLINE_BUDGET_FACTOR`]).
    inlined: Cell<usize>,
    budget: usize,
}

impl<'a> Reducer<'a> {
    fn new(root: &'a Value) -> Self {
        Reducer {
            root,
            depth: Cell::new(0),
            expansions: Cell::new(0),
            inlined: Cell::new(0),
            budget: (size(root) * INLINE_BUDGET_FACTOR).max(MIN_INLINE_BUDGET),
        }
    }

    /// Takes `cost` from what the reduction may still inline ([`INLINE_BUDGET_FACTOR`]);
    /// false, taking nothing, when that is less.
    fn charge(&self, cost: usize) -> bool {
        let total = self.inlined.get() + cost;
        (total <= self.budget).then(|| self.inlined.set(total)).is_some()
    }

    /// The schema a local reference names (`#/$defs/X`, `#/definitions/X`, or any other
    /// JSON pointer into the root). The reference is a URI fragment, so its
    /// percent-encoded characters are decoded first (`#/$defs/c%20d` names `c d`).
    fn resolve(&self, reference: &str) -> Option<&'a Value> {
        let fragment = reference.strip_prefix('#')?;
        let pointer = percent_encoding::percent_decode_str(fragment)
            .decode_utf8()
            .ok()?;
        self.root.pointer(&pointer)
    }

    /// One schema node reduced, or `None` when nothing of it can be expressed (or it lies
    /// deeper than [`MAX_DEPTH`]).
    fn reduce(&self, node: &Value, refs: &mut Vec<String>) -> Option<Value> {
        let depth = self.depth.get();
        if depth >= MAX_DEPTH {
            return None;
        }
        self.depth.set(depth + 1);
        let out = self.reduce_node(node, refs);
        self.depth.set(depth);
        out
    }

    fn reduce_node(&self, node: &Value, refs: &mut Vec<String>) -> Option<Value> {
        let node = node.as_object()?;
        if let Some(reference) = node.get("$ref").and_then(Value::as_str) {
            if refs.iter().any(|r| r == reference)
                || refs.len() >= MAX_REF_DEPTH
                || self.expansions.get() >= MAX_REF_EXPANSIONS
            {
                return None;
            }
            self.expansions.set(self.expansions.get() + 1);
            let target = self.resolve(reference)?;
            if !self.charge(size(target)) {
                return None;
            }
            let target = target.as_object()?;
            // The target's keywords, then the referring node's own (2020-12 applies both):
            // the node's own words, like its description, win; its properties join the
            // target's and its required names add to the target's.
            let mut merged = target.clone();
            for (k, v) in node {
                match (k.as_str(), merged.get_mut(k), v) {
                    ("$ref", _, _) => {}
                    ("properties", Some(Value::Object(theirs)), Value::Object(own)) => {
                        for (name, schema) in own {
                            theirs.insert(name.clone(), schema.clone());
                        }
                    }
                    ("required", Some(Value::Array(theirs)), Value::Array(own)) => {
                        for name in own {
                            if !theirs.contains(name) {
                                theirs.push(name.clone());
                            }
                        }
                    }
                    _ => {
                        merged.insert(k.clone(), v.clone());
                    }
                }
            }
            refs.push(reference.to_string());
            let out = self.reduce(&Value::Object(merged), refs);
            refs.pop();
            return out;
        }
        let mut out = Map::new();
        let mut nullable = false;
        let mut any_of: Option<Vec<Value>> = None;
        let mut all_of: Option<Map<String, Value>> = None;
        let mut constraints = Map::new();
        for (key, value) in node {
            match key.as_str() {
                "type" => match value {
                    Value::String(t) if t == "null" => nullable = true,
                    Value::String(t) => {
                        out.insert("type".into(), Value::String(t.to_uppercase()));
                    }
                    Value::Array(types) => {
                        let mut named: Vec<String> = Vec::new();
                        for t in types.iter().filter_map(Value::as_str) {
                            if t == "null" {
                                nullable = true;
                            } else {
                                named.push(t.to_uppercase());
                            }
                        }
                        match named.len() {
                            0 => {}
                            1 => {
                                out.insert("type".into(), Value::String(named.remove(0)));
                            }
                            _ => {
                                any_of = Some(
                                    named
                                        .into_iter()
                                        .map(|t| serde_json::json!({ "type": t }))
                                        .collect(),
                                );
                            }
                        }
                    }
                    _ => {}
                },
                "enum" | "const" => {
                    let values = match value {
                        Value::Array(values) if key == "enum" => values.as_slice(),
                        Value::Array(_) => continue,
                        one => std::slice::from_ref(one),
                    };
                    let mut strings = Vec::with_capacity(values.len());
                    for v in values {
                        match v {
                            Value::Null => nullable = true,
                            Value::String(s) => strings.push(Value::String(s.clone())),
                            other => strings.push(Value::String(other.to_string())),
                        }
                    }
                    // Values of another type on a node that names none: as strings they
                    // would make it a string, which it is not ({"const": 5}); dropped.
                    let invents_a_type =
                        !node.contains_key("type") && values.iter().any(|v| !v.is_string() && !v.is_null());
                    if !strings.is_empty() && !invents_a_type {
                        out.insert("enum".into(), Value::Array(strings));
                    }
                }
                "nullable" if value.as_bool() == Some(true) => nullable = true,
                "title" | "description" | "pattern" | "format" if value.is_string() => {
                    out.insert(key.clone(), value.clone());
                }
                "default" | "example" => {
                    out.insert(key.clone(), value.clone());
                }
                "minimum" | "maximum" if value.is_number() => {
                    out.insert(key.clone(), value.clone());
                }
                k if COUNTS.contains(&k) && value.as_u64().is_some() => {
                    out.insert(key.clone(), value.clone());
                }
                "items" => {
                    // A tuple (`items` as an array, or `prefixItems`, beside which `items`
                    // says only the elements after the prefix) has no Gemini form.
                    if !node.contains_key("prefixItems")
                        && let Some(items) = self.reduce(value, refs)
                    {
                        out.insert("items".into(), items);
                    }
                }
                "properties" => {
                    if let Value::Object(props) = value {
                        let mut kept = Map::new();
                        for (name, schema) in props {
                            if let Some(s) = self.reduce(schema, refs) {
                                kept.insert(name.clone(), s);
                            }
                        }
                        if !kept.is_empty() {
                            out.insert("properties".into(), Value::Object(kept));
                        }
                    }
                }
                "required" | "propertyOrdering" => {
                    if let Value::Array(names) = value {
                        out.insert(key.clone(), Value::Array(names.clone()));
                    }
                }
                "anyOf" | "oneOf" => {
                    if let Value::Array(branches) = value {
                        let mut kept = Vec::new();
                        for b in branches {
                            if is_null_schema(b) {
                                nullable = true;
                            } else if let Some(s) = self.reduce(b, refs) {
                                kept.push(s);
                            }
                        }
                        any_of = Some(kept);
                    }
                }
                "allOf" => {
                    if let Value::Array(branches) = value {
                        let mut reduced = Vec::with_capacity(branches.len());
                        for b in branches {
                            if let Some(Value::Object(s)) = self.reduce(b, refs) {
                                reduced.push(s);
                            }
                            // A branch that only adds constraints ({"minimum": 5}, {"required":
                            // [...]} of properties the others define) names no type and
                            // reduces to nothing: its bounds and names still count.
                            for (k, v) in b.as_object().into_iter().flatten() {
                                let bound = (COUNTS.contains(&k.as_str()) && v.as_u64().is_some())
                                    || (matches!(k.as_str(), "minimum" | "maximum") && v.is_number());
                                if bound || (k == "required" && v.is_array()) {
                                    join(&mut constraints, k.clone(), v.clone());
                                }
                            }
                        }
                        all_of = Some(merge_all_of(reduced));
                    }
                }
                _ => {}
            }
        }
        // `allOf` applies beside the node's own fields, which win where both set one.
        if let Some(merged) = all_of {
            for (k, v) in merged {
                join(&mut out, k, v);
            }
            for (k, v) in constraints {
                join(&mut out, k, v);
            }
        }
        if let Some(mut branches) = any_of {
            match branches.len() {
                0 => {}
                1 => {
                    if let Value::Object(s) = branches.remove(0) {
                        for (k, v) in s {
                            out.entry(k).or_insert(v);
                        }
                    }
                }
                _ => {
                    out.insert("anyOf".into(), Value::Array(branches));
                }
            }
        }
        if nullable {
            out.insert("nullable".into(), Value::Bool(true));
        }
        let ty = out.get("type").and_then(Value::as_str).map(str::to_string);
        if let Some(t) = &ty
            && !TYPES.contains(&t.as_str())
        {
            out.remove("type");
        }
        if out
            .get("format")
            .and_then(Value::as_str)
            .is_some_and(|f| !format_allowed(ty.as_deref(), f))
        {
            out.remove("format");
        }
        fit_to_type(&mut out, |cost| self.charge(cost));
        // A union's branches made from a list of types are checked only now, with the fields
        // of their type moved in: one the API refuses goes, and a single one left is the node.
        if let Some(Value::Array(branches)) = out.get_mut("anyOf") {
            branches.retain(|b| b.as_object().is_some_and(expressible));
            if branches.len() < 2
                && let Some(Value::Array(mut left)) = out.shift_remove("anyOf")
                && let Some(Value::Object(only)) = left.pop()
            {
                for (k, v) in only {
                    join(&mut out, k, v);
                }
            }
        }
        name_only_properties(&mut out);
        expressible(&out).then_some(Value::Object(out))
    }
}

/// `allOf`'s reduced branches as one node (every branch applies): see [`join`]; nullable
/// only when every branch is.
fn merge_all_of(branches: Vec<Map<String, Value>>) -> Map<String, Value> {
    let nullable = !branches.is_empty()
        && branches
            .iter()
            .all(|b| b.get("nullable") == Some(&Value::Bool(true)));
    let mut out = Map::new();
    for branch in branches {
        for (k, v) in branch {
            if k != "nullable" {
                join(&mut out, k, v);
            }
        }
    }
    if nullable {
        out.insert("nullable".into(), Value::Bool(true));
    }
    out
}

/// Adds a field of a schema that applies too (an `allOf` branch) to a reduced node: the
/// properties join (a name both define keeps the node's schema), the `required` names add
/// up, a bound takes the stricter value (larger `min*`, smaller `max*`), and any other field
/// the node has already stays (two values that differ keep one: a constraint dropped, none
/// invented).
fn join(node: &mut Map<String, Value>, key: String, value: Value) {
    let Some(have) = node.get_mut(&key) else {
        node.insert(key, value);
        return;
    };
    match (have, value) {
        (Value::Object(have), Value::Object(more)) if key == "properties" => {
            for (name, schema) in more {
                have.entry(name).or_insert(schema);
            }
        }
        (Value::Array(have), Value::Array(more)) if key == "required" => {
            for name in more {
                if !have.contains(&name) {
                    have.push(name);
                }
            }
        }
        (have, more) if key.starts_with("min") || key.starts_with("max") => {
            if let (Some(a), Some(b)) = (have.as_f64(), more.as_f64())
                && (if key.starts_with("min") { b > a } else { b < a })
            {
                *have = more;
            }
        }
        _ => {}
    }
}

/// Whether the API takes a reduced node: it refuses one without a type ("didn't specify the
/// schema type field"), an ARRAY without `items` ("items: missing field") and an OBJECT
/// without `properties` ("should be non-empty for OBJECT type"). Such a node is dropped with
/// the property that holds it, and `required` follows.
fn expressible(node: &Map<String, Value>) -> bool {
    match node.get("type").and_then(Value::as_str) {
        Some("ARRAY") => node.contains_key("items"),
        Some("OBJECT") => node.contains_key("properties"),
        Some(_) => true,
        None => node.contains_key("anyOf"),
    }
}

/// `{"type": "null"}`: the other half of an optional value.
fn is_null_schema(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("null")
}

/// Checks a schema against the documented `Schema` object: known fields only, `type` one of
/// the `Type` values, enum values strings, counts non-negative integers, `required` naming
/// properties, formats the API accepts for the type, no empty `properties`, and what the API
/// refuses outright (see [`expressible`]). Returns every problem, each with its JSON pointer.
pub fn check_schema(schema: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    check_node(schema, "", &mut problems);
    problems
}

fn check_node(node: &Value, at: &str, problems: &mut Vec<String>) {
    let Some(map) = node.as_object() else {
        problems.push(format!("{at}: a schema must be an object"));
        return;
    };
    for (key, value) in map {
        let here = format!("{at}/{key}");
        if !FIELDS.contains(&key.as_str()) {
            problems.push(format!("{here}: not a field of the Schema object"));
            continue;
        }
        if let Some(ty) = owner(key)
            && map.get("type").and_then(Value::as_str) != Some(ty)
        {
            problems.push(format!("{here}: allowed on {ty} only"));
        }
        let ok = match key.as_str() {
            "type" => value.as_str().is_some_and(|t| TYPES.contains(&t)),
            "format" => value
                .as_str()
                .is_some_and(|f| format_allowed(map.get("type").and_then(Value::as_str), f)),
            "title" | "description" | "pattern" => value.is_string(),
            "nullable" => value.is_boolean(),
            "enum" => value
                .as_array()
                .is_some_and(|a| !a.is_empty() && a.iter().all(Value::is_string)),
            k if COUNTS.contains(&k) => value.as_u64().is_some(),
            "minimum" | "maximum" => value.is_number(),
            "required" | "propertyOrdering" => value.as_array().is_some_and(|a| {
                a.iter().all(|n| {
                    n.as_str().is_some_and(|n| {
                        map.get("properties")
                            .and_then(Value::as_object)
                            .is_some_and(|p| p.contains_key(n))
                    })
                })
            }),
            "properties" => match value.as_object() {
                Some(p) if !p.is_empty() => {
                    for (name, s) in p {
                        check_node(s, &format!("{here}/{name}"), problems);
                    }
                    true
                }
                _ => false,
            },
            "items" => {
                check_node(value, &here, problems);
                true
            }
            "anyOf" => match value.as_array() {
                Some(branches) if !branches.is_empty() => {
                    for (i, s) in branches.iter().enumerate() {
                        check_node(s, &format!("{here}/{i}"), problems);
                    }
                    true
                }
                _ => false,
            },
            // `default` and `example` take any value.
            _ => true,
        };
        if !ok {
            problems.push(format!("{here}: not a valid value for this field"));
        }
    }
    if !expressible(map) {
        problems.push(format!(
            "{at}: a schema needs a type (or anyOf), an ARRAY its items and an OBJECT its properties"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reduce(schema: Value) -> Option<Value> {
        parameters(&schema)
    }

    #[test]
    fn types_are_the_api_enum_and_nullable_replaces_a_null_type() {
        let out = reduce(json!({
            "type": "object",
            "properties": {
                "a": {"type": ["string", "null"], "description": "A"},
                "b": {"type": "integer", "enum": [1, 2]},
                "c": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                "d": {"type": ["string", "integer"]},
            },
            "required": ["a"],
        }))
        .unwrap();
        assert_eq!(
            out,
            json!({
                "type": "OBJECT",
                "properties": {
                    "a": {"type": "STRING", "description": "A", "nullable": true},
                    "b": {"type": "INTEGER"},
                    "c": {"type": "NUMBER", "nullable": true},
                    "d": {"anyOf": [{"type": "STRING"}, {"type": "INTEGER"}]},
                },
                "required": ["a"],
            })
        );
        assert_eq!(check_schema(&out), Vec::<String>::new());
    }

    #[test]
    fn refs_are_inlined_and_unknown_keywords_removed() {
        let out = reduce(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "additionalProperties": false,
            "$defs": {"id": {"type": "string", "format": "uuid", "minLength": 1}},
            "properties": {
                "x": {"$ref": "#/$defs/id", "description": "X"},
                "list": {"type": "array", "items": {"$ref": "#/$defs/id"}, "uniqueItems": true,
                         "default": []},
                "when": {"type": "string", "format": "date-time"},
            },
        }))
        .unwrap();
        assert_eq!(
            out,
            json!({
                "type": "OBJECT",
                "properties": {
                    "x": {"type": "STRING", "minLength": 1, "description": "X"},
                    "list": {"type": "ARRAY", "items": {"type": "STRING", "minLength": 1},
                             "default": []},
                    "when": {"type": "STRING", "format": "date-time"},
                },
            })
        );
        assert_eq!(check_schema(&out), Vec::<String>::new());
    }

    #[test]
    fn a_cyclic_ref_drops_its_property_and_required_follows() {
        let out = reduce(json!({
            "type": "object",
            "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"},
                                                                  "v": {"type": "string"}}}},
            "properties": {"head": {"$ref": "#/$defs/node"}, "n": {"type": "integer"}},
            "required": ["head", "n"],
        }))
        .unwrap();
        assert_eq!(
            out["properties"]["head"],
            json!({"type": "OBJECT", "properties": {"v": {"type": "STRING"}}})
        );
        assert_eq!(check_schema(&out), Vec::<String>::new());
    }

    /// How deep a reduced schema nests (each node a level).
    fn depth(v: &Value) -> usize {
        match v {
            Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
            Value::Array(a) => a.iter().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    #[test]
    fn references_that_nest_without_end_are_cut_at_a_depth() {
        // 32 definitions, each a chain of 55 nested objects ending in a reference to the
        // next: inlined, about 1,800 levels, which no stack would take.
        let mut defs = Map::new();
        for i in 0..32 {
            let mut node = if i < 31 {
                json!({"$ref": format!("#/$defs/d{}", i + 1)})
            } else {
                json!({"type": "string"})
            };
            for _ in 0..55 {
                node = json!({"type": "object", "properties": {"p": node, "s": {"type": "string"}}});
            }
            defs.insert(format!("d{i}"), node);
        }
        let schema = json!({"type": "object", "$defs": defs, "properties": {"root": {"$ref": "#/$defs/d0"}}});
        // A small stack, as a runtime's worker thread has, so a recursion without bound fails.
        let out = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || reduce(schema).unwrap())
            .unwrap()
            .join()
            .unwrap();
        assert!(depth(&out) <= 2 * MAX_DEPTH, "{}", depth(&out));
        assert_eq!(check_schema(&out), Vec::<String>::new());
    }

    #[test]
    fn references_that_double_at_every_link_are_inlined_a_bounded_number_of_times() {
        // Each definition refers to the next twice: 2^20 copies of the last one, inlined.
        let mut defs = Map::new();
        for i in 0..20 {
            let next = json!({"$ref": format!("#/$defs/d{}", i + 1)});
            defs.insert(
                format!("d{i}"),
                json!({"type": "object", "properties": {"a": next, "b": next}}),
            );
        }
        defs.insert("d20".into(), json!({"type": "string", "description": "leaf"}));
        let schema = json!({"type": "object", "$defs": defs, "properties": {"root": {"$ref": "#/$defs/d0"}}});
        let out = reduce(schema).unwrap();
        let bytes = out.to_string().len();
        assert!(bytes < 1 << 20, "{bytes} bytes");
        assert!(out.to_string().contains("leaf"), "what fits is kept");
        assert_eq!(check_schema(&out), Vec::<String>::new());
    }

    #[test]
    fn a_reference_beside_properties_and_required_keeps_the_targets_too() {
        let out = reduce(json!({
            "type": "object",
            "$defs": {
                "base": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                "c d": {"type": "integer"},
            },
            "properties": {
                "x": {"$ref": "#/$defs/base", "properties": {"b": {"type": "integer"}}, "required": ["b"]},
                "q": {"$ref": "#/$defs/c%20d"},
            },
        }))
        .unwrap();
        assert_eq!(
            out["properties"]["x"],
            json!({"type": "OBJECT", "properties": {"a": {"type": "STRING"}, "b": {"type": "INTEGER"}},
                   "required": ["a", "b"]})
        );
        assert_eq!(
            out["properties"]["q"],
            json!({"type": "INTEGER"}),
            "a reference is a URI fragment: %20 is a space"
        );
    }

    #[test]
    fn a_tool_without_parameters_has_none() {
        assert_eq!(reduce(json!({"type": "object", "properties": {}})), None);
        assert_eq!(reduce(json!({"type": "object"})), None);
    }

    #[test]
    fn an_enum_stays_on_strings_only_and_implies_a_type_only_from_strings() {
        let out = reduce(json!({
            "type": "object",
            "properties": {
                "n": {"type": "integer", "enum": [1, 2, 3], "description": "N"},
                "b": {"type": "boolean", "enum": [true]},
                "x": {"type": "number", "const": 1.5},
                "s": {"type": "string", "enum": ["a", "b"]},
                "free": {"enum": ["a", 1]},
                "k": {"const": "only"},
                "five": {"const": 5, "description": "Five"},
                "maybe": {"enum": ["x", null]},
            },
        }))
        .unwrap();
        assert_eq!(
            out,
            json!({
                "type": "OBJECT",
                "properties": {
                    "n": {"type": "INTEGER", "description": "N"},
                    "b": {"type": "BOOLEAN"},
                    "x": {"type": "NUMBER"},
                    "s": {"type": "STRING", "enum": ["a", "b"]},
                    // Not all strings, and no type named: no type is invented for them,
                    // and a property without one is dropped (`free`, `five`).
                    "k": {"enum": ["only"], "type": "STRING"},
                    "maybe": {"enum": ["x"], "nullable": true, "type": "STRING"},
                },
            })
        );
        assert_eq!(check_schema(&out), Vec::<String>::new());
        let integer_enum = json!({"type": "INTEGER", "enum": ["1"]});
        assert_eq!(check_schema(&integer_enum).len(), 1);
    }

    #[test]
    fn fields_of_one_type_go_where_the_api_takes_them() {
        let out = reduce(json!({
            "type": "object",
            "properties": {
                // An object without its type, as JSON Schema allows.
                "data": {"properties": {"id": {"type": "string"}}, "required": ["id"]},
                // An array without its type.
                "tags": {"items": {"type": "string"}, "maxItems": 3},
                // A union: each field moves into the branch of its type.
                "either": {"type": ["string", "array"], "items": {"type": "integer"},
                           "maxLength": 9, "minItems": 1},
                // Fields of another type than the node's are dropped.
                "count": {"type": "integer", "properties": {"x": {"type": "string"}},
                          "items": {"type": "string"}, "pattern": "^a"},
            },
        }))
        .unwrap();
        assert_eq!(
            out,
            json!({
                "type": "OBJECT",
                "properties": {
                    "data": {"properties": {"id": {"type": "STRING"}}, "required": ["id"],
                             "type": "OBJECT"},
                    "tags": {"items": {"type": "STRING"}, "maxItems": 3, "type": "ARRAY"},
                    "either": {"anyOf": [
                        {"type": "STRING", "maxLength": 9},
                        {"type": "ARRAY", "items": {"type": "INTEGER"}, "minItems": 1},
                    ]},
                    "count": {"type": "INTEGER"},
                },
            })
        );
        assert_eq!(check_schema(&out), Vec::<String>::new());
        let union_items = json!({"anyOf": [{"type": "STRING"}, {"type": "ARRAY"}],
                                 "items": {"type": "STRING"}});
        assert_eq!(
            check_schema(&union_items),
            [
                "/anyOf/1: a schema needs a type (or anyOf), an ARRAY its items and an OBJECT its properties",
                "/items: allowed on ARRAY only"
            ]
        );
    }

    #[test]
    fn all_of_branches_merge_into_one_node_and_only_bounds_get_stricter() {
        let out = reduce(json!({
            "type": "object",
            "$defs": {"Address": {"type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                "required": ["street", "city"]}},
            "properties": {
                "address": {"description": "Where to ship", "allOf": [
                    {"$ref": "#/$defs/Address"},
                    {"type": "object", "properties": {"country": {"type": "string"}},
                     "required": ["country"]},
                ]},
                "code": {"allOf": [{"type": "string"}, {"maxLength": 5}], "description": "Short"},
                "bounded": {"type": "integer", "minimum": 1, "maximum": 100,
                            "allOf": [{"minimum": 5}, {"maximum": 500}, {"maximum": 50}]},
                "named": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}},
                          "allOf": [{"properties": {"a": {"type": "integer"},
                                                    "b": {"type": "string"}}},
                                    {"required": ["a", "b", "ghost"]}]},
                "nullable_once": {"allOf": [{"type": ["string", "null"]}, {"minLength": 2}]},
            },
            "required": ["address", "code"],
        }))
        .unwrap();
        assert_eq!(
            out,
            json!({
                "type": "OBJECT",
                "properties": {
                    "address": {"description": "Where to ship", "type": "OBJECT",
                        "properties": {"street": {"type": "STRING"}, "city": {"type": "STRING"},
                                       "country": {"type": "STRING"}},
                        "required": ["street", "city", "country"]},
                    "code": {"description": "Short", "type": "STRING", "maxLength": 5},
                    // The node's own and every branch's bounds all hold: the strictest.
                    "bounded": {"type": "INTEGER", "minimum": 5, "maximum": 50},
                    // A name both define keeps the node's schema; required names of a
                    // branch with nothing else count, for properties that exist.
                    "named": {"type": "OBJECT", "properties": {
                        "a": {"type": "STRING", "maxLength": 3}, "b": {"type": "STRING"}},
                        "required": ["a", "b"]},
                    // Null passes only when every branch lets it.
                    "nullable_once": {"type": "STRING", "minLength": 2},
                },
                "required": ["address", "code"],
            })
        );
        assert_eq!(check_schema(&out), Vec::<String>::new());
    }

    #[test]
    fn what_the_api_refuses_outright_is_dropped_with_its_property_and_required_follows() {
        let out = reduce(json!({
            "type": "object",
            "properties": {
                "keep": {"type": "string"},
                "tuple": {"type": "array", "prefixItems": [{"type": "string"}]},
                "bare_array": {"type": "array"},
                "any_items": {"type": "array", "items": {}},
                "map": {"type": "object", "additionalProperties": {"type": "string"}},
                "tuple_then": {"type": "array", "prefixItems": [{"type": "string"}],
                               "items": {"type": "number"}},
                "null_only": {"type": "null"},
                "either": {"type": ["string", "array"], "description": "E"},
            },
            "required": ["keep", "tuple", "map", "tuple_then", "either"],
        }))
        .unwrap();
        assert_eq!(
            out,
            json!({
                "type": "OBJECT",
                "properties": {
                    "keep": {"type": "STRING"},
                    // The ARRAY branch had no items: the STRING branch is the node.
                    "either": {"description": "E", "type": "STRING"},
                },
                "required": ["keep", "either"],
            })
        );
        assert_eq!(check_schema(&out), Vec::<String>::new());
        // Nothing left: no parameters at all.
        assert_eq!(
            reduce(json!({"type": "object", "properties": {"t": {"type": "array"}}})),
            None
        );
    }

    #[test]
    fn a_unions_branches_keep_required_names_of_their_own_properties_only() {
        // The node's properties join each object branch's own; `required` follows what
        // each branch then has.
        let out = reduce(json!({
            "type": "object",
            "properties": {"u": {
                "properties": {"a": {"type": "string"}},
                "required": ["a"],
                "anyOf": [
                    {"type": "object", "properties": {"b": {"type": "string"}}},
                    {"type": "object", "properties": {"c": {"type": "integer"}}, "required": ["c"]},
                ],
            }},
        }))
        .unwrap();
        assert_eq!(
            out,
            json!({"type": "OBJECT", "properties": {"u": {"anyOf": [
                {"type": "OBJECT", "properties": {"b": {"type": "STRING"}, "a": {"type": "STRING"}},
                 "required": ["a"]},
                {"type": "OBJECT", "properties": {"c": {"type": "INTEGER"}, "a": {"type": "STRING"}},
                 "required": ["c", "a"]},
            ]}}})
        );
        assert_eq!(check_schema(&out), Vec::<String>::new());
        // A branch that came from a reference back to the root, with a `required` of a
        // property only another `allOf` branch defined.
        let out = reduce(json!({
            "allOf": [
                {"properties": {"a": {"enum": ["x", "y"]}}},
                {"$ref": "#/$defs/x", "properties": {"b": {"type": "string"}}, "allOf": []},
            ],
            "$defs": {"x": {"oneOf": [{"type": ["string"]}, {"oneOf": [{"$ref": "#"}]}], "required": ["b"]}},
        }))
        .unwrap();
        assert_eq!(check_schema(&out), Vec::<String>::new());
    }

    /// JSON Schemas as manifests write them: typed and untyped nodes, lists of types,
    /// unions and intersections whose branches bring their own properties, `required` naming
    /// properties that exist or not, enums of any values, formats, and `$ref`s into `$defs`.
    fn json_schema() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        use proptest::sample::select;
        let names = || select(&["a", "b", "c", "d"][..]).prop_map(String::from);
        let ty = prop_oneof![
            select(
                &[
                    "string", "integer", "number", "boolean", "object", "array", "null"
                ][..]
            )
            .prop_map(|t| json!(t)),
            proptest::collection::vec(
                select(&["string", "integer", "object", "array", "null"][..]),
                1..4
            )
            .prop_map(|t| json!(t)),
        ];
        let leaf = (
            proptest::option::weighted(0.8, ty),
            proptest::option::of(prop_oneof![
                Just(json!(["x", "y"])),
                Just(json!([1, 2])),
                Just(json!([])),
                Just(json!(["x", null]))
            ]),
            proptest::option::of(select(&["date-time", "uuid", "int32", "float", "enum"][..])),
            proptest::option::of(select(&["#/$defs/x", "#/$defs/missing", "#"][..])),
        )
            .prop_map(|(ty, en, format, reference)| {
                let mut m = Map::new();
                if let Some(t) = ty {
                    m.insert("type".into(), t);
                }
                if let Some(e) = en {
                    m.insert("enum".into(), e);
                }
                if let Some(f) = format {
                    m.insert("format".into(), json!(f));
                }
                if let Some(r) = reference {
                    m.insert("$ref".into(), json!(r));
                }
                Value::Object(m)
            });
        leaf.prop_recursive(4, 40, 4, move |inner| {
            let keyed = |k: &'static str, s: BoxedStrategy<Value>| {
                proptest::option::weighted(0.3, s.prop_map(move |v| (k, v)))
            };
            (
                inner.clone(),
                proptest::option::weighted(
                    0.5,
                    proptest::collection::btree_map(names(), inner.clone(), 0..4),
                ),
                proptest::option::weighted(
                    0.4,
                    proptest::collection::vec(select(&["a", "b", "c", "d", "ghost"][..]), 0..4),
                ),
                keyed(
                    "anyOf",
                    proptest::collection::vec(inner.clone(), 0..4)
                        .prop_map(Value::Array)
                        .boxed(),
                ),
                keyed(
                    "oneOf",
                    proptest::collection::vec(inner.clone(), 0..3)
                        .prop_map(Value::Array)
                        .boxed(),
                ),
                keyed(
                    "allOf",
                    proptest::collection::vec(inner.clone(), 0..3)
                        .prop_map(Value::Array)
                        .boxed(),
                ),
                keyed("items", inner.clone().boxed()),
                keyed("propertyOrdering", Just(json!(["b", "a", "ghost"])).boxed()),
                proptest::bool::weighted(0.4),
            )
                .prop_map(
                    |(base, props, required, any_of, one_of, all_of, items, ordering, untyped)| {
                        let mut m = base.as_object().cloned().unwrap_or_default();
                        if untyped {
                            m.remove("type");
                        }
                        if let Some(p) = props {
                            m.insert("properties".into(), json!(p));
                        }
                        if let Some(r) = required {
                            m.insert("required".into(), json!(r));
                        }
                        for (k, v) in [any_of, one_of, all_of, items, ordering].into_iter().flatten() {
                            m.insert(k.into(), v);
                        }
                        Value::Object(m)
                    },
                )
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::with_cases(
                std::env::var("GEMINI_SCHEMA_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(2048),
            )
        })]

        /// Whatever JSON Schema a manifest holds, its reduction is one the API takes (or no
        /// parameters at all).
        #[test]
        fn every_reduced_schema_is_one_the_api_takes(
            root in json_schema(),
            def in json_schema(),
        ) {
            let mut schema = root.as_object().cloned().unwrap_or_default();
            schema.insert("$defs".into(), json!({"x": def}));
            let schema = Value::Object(schema);
            if let Some(out) = parameters(&schema) {
                let problems = check_schema(&out);
                proptest::prop_assert!(problems.is_empty(), "{schema}\n-> {out}\n{problems:?}");
            }
        }
    }

    #[test]
    fn many_references_to_a_large_definition_render_a_bounded_schema() {
        let big: Map<String, Value> = (0..200)
            .map(|i| {
                (
                    format!("p{i}"),
                    json!({"type": "string", "description": "A field"}),
                )
            })
            .collect();
        let refs: Map<String, Value> = (0..200)
            .map(|i| (format!("r{i}"), json!({"$ref": "#/$defs/big"})))
            .collect();
        let schema = json!({
            "type": "object",
            "properties": refs,
            "required": ["r0", "r199"],
            "$defs": {"big": {"type": "object", "properties": big}},
        });
        // Inlined in full it is 200 copies of the definition (about 200 times the source).
        let out = reduced_within_budget(&schema);
        // What comes first is kept whole; what is past the budget goes, and `required` follows.
        let props = out["properties"].as_object().unwrap();
        assert_eq!(props["r0"]["properties"].as_object().unwrap().len(), 200);
        assert!(!props.contains_key("r199"));
        assert_eq!(out["required"], json!(["r0"]));
    }

    #[test]
    fn a_union_keeps_required_written_before_its_properties() {
        let out = reduce(json!({
            "type": "object",
            "properties": {"x": {
                "type": ["object", "array"],
                "required": ["a"],
                "properties": {"a": {"type": "string"}},
                "items": {"type": "string"},
            }},
        }))
        .unwrap();
        assert_eq!(
            out["properties"]["x"],
            json!({"anyOf": [
                {"type": "OBJECT", "required": ["a"], "properties": {"a": {"type": "STRING"}}},
                {"type": "ARRAY", "items": {"type": "STRING"}},
            ]})
        );
        assert_eq!(check_schema(&out), Vec::<String>::new());
    }

    #[test]
    fn unions_nested_in_unions_render_a_bounded_schema() {
        // Each level's properties go into both object branches of its union: copied in
        // full, 14 levels are 2^14 copies of the innermost (about 1 MB).
        let branch = json!({"type": "object", "properties": {"z": {"type": "string"}}});
        let mut level = json!({"type": "string"});
        for _ in 0..14 {
            level = json!({"properties": {"x": level}, "anyOf": [branch.clone(), branch.clone()]});
        }
        reduced_within_budget(&json!({"type": "object", "properties": {"top": level}}));
    }

    /// `schema` reduced: no larger than the schema and its inlining budget, and one the API
    /// takes.
    fn reduced_within_budget(schema: &Value) -> Value {
        let source = serde_json::to_string(schema).unwrap().len();
        let out = parameters(schema).unwrap();
        let rendered = serde_json::to_string(&out).unwrap().len();
        assert!(
            rendered <= source + (source * INLINE_BUDGET_FACTOR).max(MIN_INLINE_BUDGET),
            "{rendered} bytes from {source}"
        );
        assert_eq!(check_schema(&out), Vec::<String>::new());
        out
    }

    #[test]
    fn the_check_names_what_the_api_rejects() {
        let bad = json!({"type": "object", "properties": {"a": {"type": "string", "format": "uuid",
                         "enum": [1]}}, "required": ["b"], "additionalProperties": false});
        let problems = check_schema(&bad);
        assert_eq!(
            problems,
            [
                "/type: not a valid value for this field",
                "/properties: allowed on OBJECT only",
                "/properties/a/type: not a valid value for this field",
                "/properties/a/format: not a valid value for this field",
                "/properties/a/enum: allowed on STRING only",
                "/properties/a/enum: not a valid value for this field",
                "/required: allowed on OBJECT only",
                "/required: not a valid value for this field",
                "/additionalProperties: not a field of the Schema object",
            ]
        );
    }
}
