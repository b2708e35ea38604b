//! Manifest parsing and validation: native domain manifests (JSON or TOML) and group-array
//! JSON manifests. Both are first read into a `serde_json::Value` (so syntax errors carry a
//! line:column) and then checked field by field, so one file reports every problem at once.

use std::path::Path;

use serde_json::{Map, Value};

use super::{Domain, Tier, Tool};
use crate::error::ManifestError;

/// A manifest file format, chosen by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `*.json`: a native manifest (an object) or a group array (an array).
    Json,
    /// `*.toml`: a native manifest.
    Toml,
}

impl Format {
    /// The format of a file, or `None` when it is not a manifest.
    pub fn of(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "json" => Some(Format::Json),
            "toml" => Some(Format::Toml),
            _ => None,
        }
    }
}

const DOMAIN_FIELDS: &[&str] = &[
    "name",
    "display_name",
    "description",
    "settings_keys",
    "keywords",
    "core",
    "fallback",
    "tools",
];
const TOOL_FIELDS: &[&str] = &["name", "description", "tier", "input_schema"];
/// The fields a group array's `_meta` element may carry.
const META_FIELDS: &[&str] = &[
    "_meta",
    "display_name",
    "description",
    "settings_keys",
    "keywords",
    "core",
    "fallback",
];
/// The fields a group array's tool element may carry; the last three belong to the chat apps
/// that ship these files and are ignored here.
const GROUP_TOOL_FIELDS: &[&str] = &[
    "name",
    "description",
    "tier",
    "parameters",
    "function",
    "timeoutSeconds",
    "requiredPermissions",
];

/// Parses one manifest. `path` names the file in messages and, for group arrays, its stem is
/// the group name.
///
/// # Errors
/// Every problem found in the file.
pub fn parse(path: &str, text: &str) -> Result<Domain, Vec<ManifestError>> {
    // Editors on some systems write a byte-order mark; it is not part of the document.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let format = Format::of(Path::new(path)).unwrap_or(Format::Json);
    let value = match format {
        Format::Json => serde_json::from_str::<Strict>(text).map(|s| s.0).map_err(|e| {
            let msg = e.to_string();
            // serde_json appends " at line L column C"; the position goes in front instead.
            let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
            let msg = if msg.starts_with(DUPLICATE_KEY) {
                msg
            } else {
                format!("malformed JSON: {msg}")
            };
            vec![err_at(path, Some(json_position(text, e.line(), e.column())), msg)]
        })?,
        Format::Toml => {
            let table = toml::from_str::<toml::Table>(text).map_err(|e| {
                let pos = e.span().map(|s| line_col(text, s.start));
                vec![err_at(path, pos, format!("malformed TOML: {}", e.message()))]
            })?;
            serde_json::to_value(table).map_err(|e| vec![err(path, format!("malformed TOML: {e}"))])?
        }
    };
    let mut v = Validator {
        path,
        errors: Vec::new(),
    };
    let domain = match value {
        Value::Object(obj) => v.native(obj),
        Value::Array(items) if format == Format::Json => v.group_array(items),
        _ => {
            v.push("a manifest must be a JSON object (native) or a JSON array (group array)".into());
            None
        }
    };
    match domain {
        Some(d) if v.errors.is_empty() => Ok(d),
        _ => Err(v.errors),
    }
}

/// How a duplicate key in a JSON object is reported (serde_json alone keeps the last one
/// silently, so a repeated `"keywords"` would drop the first list unseen).
const DUPLICATE_KEY: &str = "duplicate key";

/// A JSON value read with duplicate object keys refused, each reported at its line:column.
struct Strict(Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Strict, E> {
        Ok(Strict(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Strict, E> {
        Ok(Strict(Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Strict, E> {
        Ok(Strict(Value::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Strict, E> {
        Ok(Strict(
            serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
        ))
    }
    fn visit_str<E>(self, v: &str) -> Result<Strict, E> {
        Ok(Strict(Value::String(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<Strict, E> {
        Ok(Strict(Value::String(v)))
    }
    fn visit_unit<E>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Strict(Value::Array(items)))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        let mut obj = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if obj.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "{DUPLICATE_KEY} `{key}` in a JSON object"
                )));
            }
            let Strict(v) = map.next_value()?;
            obj.insert(key, v);
        }
        Ok(Strict(Value::Object(obj)))
    }
}

fn err(path: &str, message: String) -> ManifestError {
    err_at(path, None, message)
}

fn err_at(path: &str, position: Option<(usize, usize)>, message: String) -> ManifestError {
    ManifestError {
        path: path.to_string(),
        position,
        message,
    }
}

/// serde_json's (line, byte column) of the last byte read, as a 1-based (line, character
/// column). Column 0 means it had just read a line break: the problem is at the end of the
/// line before.
fn json_position(text: &str, line: usize, column: usize) -> (usize, usize) {
    let lines: Vec<&str> = text.split('\n').collect();
    if column == 0 && line > 1 {
        let prev = lines
            .get(line - 2)
            .map_or(0, |l| l.trim_end_matches('\r').chars().count());
        return (line - 1, prev + 1);
    }
    let l = lines.get(line.saturating_sub(1)).copied().unwrap_or("");
    let upto = column.min(l.len());
    // Back up to a character boundary when the column falls inside a multi-byte character.
    let upto = (0..=upto).rev().find(|&i| l.is_char_boundary(i)).unwrap_or(0);
    (line, l[..upto].chars().count().max(1))
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// True when `name` matches `^[a-z0-9][a-z0-9_-]{0,63}$`.
pub fn valid_domain_name(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=64).contains(&b.len())
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
}

/// True when `name` matches `^[a-zA-Z0-9_-]{1,64}$`, the limit the major LLM APIs share.
pub fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
}

/// `display_name` default: `_`/`-` become spaces and each word is capitalised.
fn default_display_name(name: &str) -> String {
    name.split(['_', '-'])
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The fields shared by both formats' domain-level metadata.
struct Meta {
    display_name: Option<String>,
    description: Option<String>,
    settings_keys: Vec<String>,
    keywords: Vec<String>,
    core: bool,
    fallback: bool,
}

struct Validator<'a> {
    path: &'a str,
    errors: Vec<ManifestError>,
}

impl Validator<'_> {
    fn push(&mut self, message: String) {
        self.errors.push(err(self.path, message));
    }

    fn native(&mut self, obj: Map<String, Value>) -> Option<Domain> {
        for key in obj.keys() {
            if !DOMAIN_FIELDS.contains(&key.as_str()) {
                self.push(format!(
                    "unknown field `{key}` (expected one of: {})",
                    DOMAIN_FIELDS.join(", ")
                ));
            }
        }
        let name = match obj.get("name") {
            None => {
                self.push("missing required field `name`".into());
                None
            }
            Some(v) => self.string(v, "`name`"),
        };
        if let Some(n) = &name {
            self.check_domain_name(n);
        }
        let meta = self.meta(&obj);
        let tools = match obj.get("tools") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .filter_map(|(i, t)| self.native_tool(i + 1, t))
                .collect(),
            Some(_) => {
                self.push("field `tools` must be an array of tool objects".into());
                Vec::new()
            }
        };
        Some(self.domain(name?, meta, tools))
    }

    fn group_array(&mut self, items: Vec<Value>) -> Option<Domain> {
        let stem = Path::new(self.path)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        self.check_domain_name(&stem);
        let mut meta = None;
        let mut tools = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let n = i + 1;
            let Value::Object(obj) = item else {
                self.push(format!("element #{n} must be an object"));
                continue;
            };
            if let Some(flag) = obj.get("_meta") {
                if i > 0 {
                    self.push(format!(
                        "element #{n}: a `_meta` element must be the first element"
                    ));
                } else if flag != &Value::Bool(true) {
                    self.push("element #1: `_meta` must be `true`".into());
                } else {
                    self.unknown_fields(obj, META_FIELDS, "element #1 (`_meta`)");
                    meta = Some(self.meta(obj));
                }
                continue;
            }
            let label = tool_label(n, obj);
            self.unknown_fields(obj, GROUP_TOOL_FIELDS, &label);
            if let Some(t) = self.group_tool(n, obj) {
                tools.push(t);
            }
        }
        let meta = meta.unwrap_or(Meta {
            display_name: None,
            description: None,
            settings_keys: Vec::new(),
            keywords: Vec::new(),
            core: false,
            fallback: true,
        });
        Some(self.domain(stem, meta, tools))
    }

    fn domain(&self, name: String, meta: Meta, tools: Vec<Tool>) -> Domain {
        Domain {
            display_name: meta.display_name.unwrap_or_else(|| default_display_name(&name)),
            description: meta
                .description
                .unwrap_or_else(|| format!("Tools from {name} group")),
            name,
            settings_keys: meta.settings_keys,
            keywords: meta.keywords,
            core: meta.core,
            fallback: meta.fallback,
            tools,
            source: self.path.to_string(),
        }
    }

    fn check_domain_name(&mut self, name: &str) {
        if !valid_domain_name(name) {
            self.push(format!(
                "domain name `{name}` is invalid: it must match ^[a-z0-9][a-z0-9_-]{{0,63}}$"
            ));
        }
    }

    fn meta(&mut self, obj: &Map<String, Value>) -> Meta {
        let keywords = self.strings(obj, "keywords");
        for (i, k) in keywords.iter().enumerate() {
            if k.trim().is_empty() {
                self.push(format!("keyword #{} is empty or whitespace-only", i + 1));
            }
        }
        let settings_keys = self.strings(obj, "settings_keys");
        for (i, k) in settings_keys.iter().enumerate() {
            if k.trim().is_empty() {
                self.push(format!("settings key #{} is empty or whitespace-only", i + 1));
            }
        }
        Meta {
            display_name: obj
                .get("display_name")
                .and_then(|v| self.string(v, "`display_name`")),
            description: obj
                .get("description")
                .and_then(|v| self.string(v, "`description`")),
            settings_keys,
            keywords,
            core: self.bool(obj, "core", false),
            fallback: self.bool(obj, "fallback", true),
        }
    }

    fn native_tool(&mut self, n: usize, value: &Value) -> Option<Tool> {
        let Value::Object(obj) = value else {
            self.push(format!("tool #{n} must be an object"));
            return None;
        };
        let label = tool_label(n, obj);
        self.unknown_fields(obj, TOOL_FIELDS, &label);
        let schema = match obj.get("input_schema") {
            None => Some(default_schema()),
            Some(Value::Object(s)) if s.get("type") == Some(&Value::String("object".into())) => {
                let schema = Value::Object(s.clone());
                self.check_schema(&label, "input_schema", &schema)
                    .then_some(schema)
            }
            Some(_) => {
                self.push(format!(
                    "{label}: `input_schema` must be a JSON object whose `type` is \"object\""
                ));
                None
            }
        };
        self.tool(&label, obj, schema)
    }

    fn group_tool(&mut self, n: usize, obj: &Map<String, Value>) -> Option<Tool> {
        let label = tool_label(n, obj);
        let schema = match obj.get("parameters") {
            None => Some(default_schema()),
            Some(Value::Object(p)) => {
                let mut s = Map::new();
                s.insert("type".into(), Value::String("object".into()));
                let mut ok = true;
                for (k, v) in p {
                    match k.as_str() {
                        "type" if v != "object" => ok = false,
                        "type" => {}
                        _ => {
                            s.insert(k.clone(), v.clone());
                        }
                    }
                }
                s.entry("properties").or_insert_with(|| Value::Object(Map::new()));
                let props_ok = s["properties"].is_object();
                let required_ok = s
                    .get("required")
                    .is_none_or(|r| r.as_array().is_some_and(|a| a.iter().all(Value::is_string)));
                if ok && props_ok && required_ok {
                    let schema = Value::Object(s);
                    self.check_schema(&label, "parameters", &schema).then_some(schema)
                } else {
                    self.push(format!(
                        "{label}: `parameters` must be {{\"properties\": {{...}}, \"required\": [names]}} (its type, if given, \"object\")"
                    ));
                    None
                }
            }
            Some(_) => {
                self.push(format!("{label}: `parameters` must be a JSON object"));
                None
            }
        };
        self.tool(&label, obj, schema)
    }

    /// The checks both formats share: name, description, tier.
    fn tool(&mut self, label: &str, obj: &Map<String, Value>, schema: Option<Value>) -> Option<Tool> {
        let name = match obj.get("name") {
            None => {
                self.push(format!("{label}: missing required field `name`"));
                None
            }
            Some(v) => self.string(v, &format!("{label}: `name`")),
        };
        if let Some(n) = &name
            && !valid_tool_name(n)
        {
            self.push(format!(
                "{label}: tool name is invalid: it must match ^[a-zA-Z0-9_-]{{1,64}}$"
            ));
        }
        let description = match obj.get("description") {
            None => {
                self.push(format!("{label}: missing required field `description`"));
                None
            }
            Some(v) => self.string(v, &format!("{label}: `description`")),
        };
        if description.as_deref().is_some_and(|d| d.trim().is_empty()) {
            self.push(format!("{label}: `description` is empty"));
        }
        let tier = match obj.get("tier") {
            None => Some(Tier::Unspecified),
            Some(v) => {
                let t = v.as_str().and_then(Tier::parse);
                if t.is_none() {
                    self.push(format!(
                        "{label}: `tier` must be one of read, modify, destructive (got {v})"
                    ));
                }
                t
            }
        };
        Some(Tool {
            name: name?,
            description: description?,
            // Serialising a `Value` cannot fail: its keys are strings.
            input_schema_json: serde_json::to_string(&schema?).ok()?,
            tier: tier?,
        })
    }

    /// Reports every key of `obj` not in `allowed`, so a typo (`"keywrods"`) is an error
    /// instead of a silently missing field.
    fn unknown_fields(&mut self, obj: &Map<String, Value>, allowed: &[&str], label: &str) {
        for key in obj.keys() {
            if !allowed.contains(&key.as_str()) {
                let prefix = if label.is_empty() {
                    String::new()
                } else {
                    format!("{label}: ")
                };
                self.push(format!(
                    "{prefix}unknown field `{key}` (expected one of: {})",
                    allowed.join(", ")
                ));
            }
        }
    }

    /// A tool's input schema must be a valid JSON Schema (draft 2020-12 meta-schema) and its
    /// `required` lists may name only properties it defines. Returns whether it passed.
    fn check_schema(&mut self, label: &str, field: &str, schema: &Value) -> bool {
        if let Err(e) = jsonschema::draft202012::meta::validate(schema) {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() {
                String::new()
            } else {
                format!(" at {at}")
            };
            self.push(format!(
                "{label}: `{field}` is not a valid JSON Schema (draft 2020-12){at}: {e}"
            ));
            return false;
        }
        let mut missing = Vec::new();
        undefined_required(schema, "", true, &mut missing);
        for (at, name) in &missing {
            self.push(format!(
                "{label}: `{field}`{at} lists `{name}` in `required` but does not define it in `properties`"
            ));
        }
        missing.is_empty()
    }

    fn string(&mut self, v: &Value, what: &str) -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            _ => {
                self.push(format!("{what} must be a string"));
                None
            }
        }
    }

    fn strings(&mut self, obj: &Map<String, Value>, field: &str) -> Vec<String> {
        match obj.get(field) {
            None => Vec::new(),
            Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
                a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()
            }
            Some(_) => {
                self.push(format!("field `{field}` must be an array of strings"));
                Vec::new()
            }
        }
    }

    fn bool(&mut self, obj: &Map<String, Value>, field: &str, default: bool) -> bool {
        match obj.get(field) {
            None => default,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                self.push(format!("field `{field}` must be true or false"));
                default
            }
        }
    }
}

fn tool_label(n: usize, obj: &Map<String, Value>) -> String {
    match obj.get("name").and_then(Value::as_str) {
        Some(name) => format!("tool #{n} `{name}`"),
        None => format!("tool #{n}"),
    }
}

/// Collects (location, name) for each `required` entry that names no property of its schema
/// object. A nested schema is judged only where it lists `properties` itself (it may take its
/// properties from elsewhere, e.g. `allOf`); the top level also when it lists none, unless it
/// composes or opens its properties.
fn undefined_required(schema: &Value, at: &str, top: bool, out: &mut Vec<(String, String)>) {
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

fn default_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

#[cfg(test)]
mod tests {
    use super::parse;
    use crate::error::ManifestError;
    use crate::registry::{Domain, Registry, Tier, Tool};

    /// Several manifest files: (path, contents).
    type Sources<'a> = &'a [(&'a str, &'a str)];

    /// The schema a tool gets when it declares none.
    const DEFAULT_SCHEMA: &str = r#"{"type":"object","properties":{}}"#;

    /// Loads `sources` through the registry, expecting it to fail; returns every error.
    fn load_errors(sources: &[(&str, &str)]) -> Vec<ManifestError> {
        match Registry::from_sources(sources.iter().copied()) {
            Ok(r) => panic!(
                "expected {sources:?} to be rejected, but {} domains loaded",
                r.domains().len()
            ),
            Err(e) => e.0,
        }
    }

    /// Every error, one per line, as the CLI prints them.
    fn shown(errors: &[ManifestError]) -> String {
        errors
            .iter()
            .map(|e| format!("    {e}\n"))
            .collect::<Vec<_>>()
            .concat()
    }

    /// Each case is one file that must be rejected: every error names that file, and each
    /// expected substring appears in some error's message.
    fn assert_rejected(cases: &[(&str, &str, &[&str])]) {
        for &(path, text, expected) in cases {
            assert_load_rejected(&[(path, text)], expected);
        }
    }

    /// `sources` must be rejected: every error names one of the files, and each expected
    /// substring appears in some error's message.
    fn assert_load_rejected(sources: Sources, expected: &[&str]) {
        let errors = load_errors(sources);
        let shown = shown(&errors);
        assert!(!errors.is_empty(), "{sources:?}: rejected without any error");
        for e in &errors {
            assert!(
                sources.iter().any(|(p, _)| *p == e.path),
                "{sources:?}: error does not name one of the files:\n{shown}"
            );
        }
        for want in expected {
            assert!(
                errors.iter().any(|e| e.message.contains(want)),
                "{sources:?}: expected an error containing {want:?}, got:\n{shown}"
            );
        }
    }

    /// Each case is one file that must load.
    fn assert_accepted(cases: &[(&str, &str)]) {
        for &(path, text) in cases {
            if let Err(e) = Registry::from_sources([(path, text)]) {
                panic!("{path} should load:\n{text}\nbut got:\n{}", shown(&e.0));
            }
        }
    }

    /// Parses one file that must be valid.
    fn parsed(path: &str, text: &str) -> Domain {
        parse(path, text).unwrap_or_else(|e| panic!("{path} should parse:\n{text}\nbut got:\n{}", shown(&e)))
    }

    fn tool(name: &str, description: &str, input_schema_json: &str, tier: Tier) -> Tool {
        Tool {
            name: name.into(),
            description: description.into(),
            input_schema_json: input_schema_json.into(),
            tier,
        }
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_string()).collect()
    }

    // ---- syntax errors ----------------------------------------------------------------------

    #[test]
    fn malformed_json_names_the_file_and_the_line_and_column() {
        // (path, text, (line, column)); columns are 1-based.
        let cases: &[(&str, &str, (usize, usize))] = &[
            (
                "missing_comma.json",
                "{\n  \"name\": \"x\"\n  \"core\": true\n}\n",
                (3, 3),
            ),
            ("trailing_comma.json", r#"{"name": "x",}"#, (1, 14)),
            ("single_quotes.json", "{'name': 'x'}", (1, 2)),
            (
                "bad_literal.json",
                "{\n  \"name\": \"x\",\n  \"core\": tru,\n  \"fallback\": true\n}",
                (3, 14),
            ),
            (
                "group.json",
                "[\n  {\"name\": \"t\", \"description\": \"d\"},\n  {\"name\": \"u\" \"description\": \"e\"}\n]",
                (3, 16),
            ),
        ];
        for &(path, text, position) in cases {
            let errors = load_errors(&[(path, text)]);
            let shown = shown(&errors);
            assert_eq!(
                errors.len(),
                1,
                "{path}: one syntax error expected, got:\n{shown}"
            );
            let e = &errors[0];
            assert_eq!(e.path, path, "{path}: the error names the file:\n{shown}");
            assert_eq!(
                e.position,
                Some(position),
                "{path}: position of the error:\n{shown}"
            );
            assert!(
                e.message.starts_with("malformed JSON"),
                "{path}: message:\n{shown}"
            );
            let prefix = format!("{path}:{}:{}: malformed JSON", position.0, position.1);
            assert!(
                e.to_string().starts_with(&prefix),
                "{path}: display starts with {prefix:?}:\n{shown}"
            );
        }
    }

    #[test]
    fn malformed_toml_names_the_file_and_the_line_and_column() {
        // (path, text, (line, column)); columns are 1-based and count characters.
        let cases: &[(&str, &str, (usize, usize))] = &[
            ("bad_literal.toml", "name = \"x\"\ncore = tru\n", (2, 8)),
            ("duplicate_key.toml", "name = \"x\"\nname = \"y\"\n", (2, 1)),
            (
                "unclosed_table.toml",
                "name = \"x\"\n\n[[tools\nname = \"t\"\n",
                (3, 8),
            ),
            ("non_ascii.toml", "description = \"日本\" x\n", (1, 20)),
        ];
        for &(path, text, position) in cases {
            let errors = load_errors(&[(path, text)]);
            let shown = shown(&errors);
            assert_eq!(
                errors.len(),
                1,
                "{path}: one syntax error expected, got:\n{shown}"
            );
            let e = &errors[0];
            assert_eq!(e.path, path, "{path}: the error names the file:\n{shown}");
            assert_eq!(
                e.position,
                Some(position),
                "{path}: position of the error:\n{shown}"
            );
            assert!(
                e.message.starts_with("malformed TOML"),
                "{path}: message:\n{shown}"
            );
            let prefix = format!("{path}:{}:{}: malformed TOML", position.0, position.1);
            assert!(
                e.to_string().starts_with(&prefix),
                "{path}: display starts with {prefix:?}:\n{shown}"
            );
        }
    }

    #[test]
    fn a_manifest_that_is_neither_an_object_nor_an_array_is_rejected() {
        assert_rejected(&[
            ("string.json", r#""tools""#, &["must be a JSON object"]),
            ("number.json", "42", &["must be a JSON object"]),
            ("null.json", "null", &["must be a JSON object"]),
        ]);
    }

    // ---- native manifest fields -------------------------------------------------------------

    #[test]
    fn a_native_manifest_without_a_name_is_rejected() {
        assert_rejected(&[
            ("empty.json", "{}", &["missing required field `name`"]),
            (
                "only_tools.json",
                r#"{"display_name": "X", "tools": []}"#,
                &["missing required field `name`"],
            ),
            ("empty.toml", "", &["missing required field `name`"]),
            (
                "no_name.toml",
                "display_name = \"X\"\n",
                &["missing required field `name`"],
            ),
        ]);
    }

    #[test]
    fn native_manifest_fields_of_the_wrong_type_are_rejected() {
        assert_rejected(&[
            ("name_number.json", r#"{"name": 5}"#, &["`name` must be a string"]),
            (
                "name_null.json",
                r#"{"name": null}"#,
                &["`name` must be a string"],
            ),
            (
                "name_array.toml",
                "name = [\"x\"]\n",
                &["`name` must be a string"],
            ),
            (
                "display_name.json",
                r#"{"name": "x", "display_name": 5}"#,
                &["`display_name` must be a string"],
            ),
            (
                "description.json",
                r#"{"name": "x", "description": false}"#,
                &["`description` must be a string"],
            ),
            (
                "core_string.json",
                r#"{"name": "x", "core": "yes"}"#,
                &["field `core` must be true or false"],
            ),
            (
                "core_number.toml",
                "name = \"x\"\ncore = 1\n",
                &["field `core` must be true or false"],
            ),
            (
                "fallback.json",
                r#"{"name": "x", "fallback": "no"}"#,
                &["field `fallback` must be true or false"],
            ),
            (
                "keywords_string.json",
                r#"{"name": "x", "keywords": "dns"}"#,
                &["field `keywords` must be an array of strings"],
            ),
            (
                "keywords_numbers.json",
                r#"{"name": "x", "keywords": [1]}"#,
                &["field `keywords` must be an array of strings"],
            ),
            (
                "keywords_mixed.toml",
                "name = \"x\"\nkeywords = [\"a\", 2]\n",
                &["field `keywords` must be an array of strings"],
            ),
            (
                "settings_keys.json",
                r#"{"name": "x", "settings_keys": "url"}"#,
                &["field `settings_keys` must be an array of strings"],
            ),
            (
                "tools_object.json",
                r#"{"name": "x", "tools": {}}"#,
                &["field `tools` must be an array"],
            ),
            (
                "tool_string.json",
                r#"{"name": "x", "tools": ["t"]}"#,
                &["tool #1 must be an object"],
            ),
        ]);
    }

    #[test]
    fn unknown_fields_in_a_native_manifest_or_its_tools_are_rejected_by_name() {
        assert_rejected(&[
            (
                "top.json",
                r#"{"name": "x", "colour": "red"}"#,
                &["unknown field `colour`"],
            ),
            (
                "typo.json",
                r#"{"name": "x", "keyword": ["dns"]}"#,
                &["unknown field `keyword`"],
            ),
            (
                "top.toml",
                "name = \"x\"\ncolour = \"red\"\n",
                &["unknown field `colour`"],
            ),
            (
                "tool.json",
                r#"{"name": "x", "tools": [{"name": "t", "description": "d", "parameters": {}}]}"#,
                &["tool #1 `t`: unknown field `parameters`"],
            ),
            (
                "tool.toml",
                "name = \"x\"\n[[tools]]\nname = \"t\"\ndescription = \"d\"\ntimeout = 5\n",
                &["tool #1 `t`: unknown field `timeout`"],
            ),
            (
                "both.json",
                r#"{"name": "x", "extra": 1, "tools": [{"name": "t", "description": "d", "teir": "read"}]}"#,
                &["unknown field `extra`", "unknown field `teir`"],
            ),
        ]);
    }

    // ---- tools ------------------------------------------------------------------------------

    #[test]
    fn a_tool_without_a_name_or_a_description_is_rejected() {
        assert_rejected(&[
            (
                "no_name.json",
                r#"{"name": "x", "tools": [{"description": "d"}]}"#,
                &["tool #1: missing required field `name`"],
            ),
            (
                "no_description.json",
                r#"{"name": "x", "tools": [{"name": "t"}]}"#,
                &["tool #1 `t`: missing required field `description`"],
            ),
            (
                "second_tool.json",
                r#"{"name": "x", "tools": [{"name": "a", "description": "d"}, {"name": "b"}]}"#,
                &["tool #2 `b`: missing required field `description`"],
            ),
            (
                "name_number.json",
                r#"{"name": "x", "tools": [{"name": 1, "description": "d"}]}"#,
                &["`name` must be a string"],
            ),
            (
                "description_array.json",
                r#"{"name": "x", "tools": [{"name": "t", "description": ["d"]}]}"#,
                &["`description` must be a string"],
            ),
            (
                "blank_description.json",
                r#"{"name": "x", "tools": [{"name": "t", "description": "  "}]}"#,
                &["`description` is empty"],
            ),
            (
                "no_name.toml",
                "name = \"x\"\n[[tools]]\ndescription = \"d\"\n",
                &["missing required field `name`"],
            ),
            (
                "no_description.toml",
                "name = \"x\"\n[[tools]]\nname = \"t\"\n",
                &["missing required field `description`"],
            ),
            (
                "group_no_name.json",
                r#"[{"description": "d"}]"#,
                &["tool #1: missing required field `name`"],
            ),
            (
                "group_no_description.json",
                r#"[{"name": "t"}]"#,
                &["tool #1 `t`: missing required field `description`"],
            ),
            (
                "group_element.json",
                r#"[{"name": "t", "description": "d"}, "u"]"#,
                &["element #2 must be an object"],
            ),
        ]);
    }

    #[test]
    fn a_tool_name_must_match_the_pattern_the_llm_apis_share() {
        let long = format!(
            r#"{{"name": "x", "tools": [{{"name": "{}", "description": "d"}}]}}"#,
            "a".repeat(65)
        );
        let with =
            |name: &str| format!(r#"{{"name": "x", "tools": [{{"name": "{name}", "description": "d"}}]}}"#);
        let (space, dot, empty, slash, accent) = (
            with("list items"),
            with("list.items"),
            with(""),
            with("a/b"),
            with("café"),
        );
        let group = r#"[{"name": "has space", "description": "d"}]"#;
        let toml = "name = \"x\"\n[[tools]]\nname = \"a.b\"\ndescription = \"d\"\n";
        let invalid = "tool name is invalid";
        assert_rejected(&[
            ("65_chars.json", &long, &[invalid]),
            ("space.json", &space, &[invalid]),
            ("dot.json", &dot, &[invalid]),
            ("empty.json", &empty, &[invalid]),
            ("slash.json", &slash, &[invalid]),
            ("non_ascii.json", &accent, &[invalid]),
            ("group.json", group, &[invalid]),
            ("dot.toml", toml, &[invalid]),
        ]);
    }

    #[test]
    fn tool_names_of_one_to_64_letters_digits_underscores_and_dashes_are_accepted() {
        let name64 = format!("{}b", "a".repeat(63));
        let long = format!(r#"{{"name": "x", "tools": [{{"name": "{name64}", "description": "d"}}]}}"#);
        assert_accepted(&[
            ("64_chars.json", &long),
            (
                "one_char.json",
                r#"{"name": "x", "tools": [{"name": "a", "description": "d"}]}"#,
            ),
            (
                "mixed.json",
                r#"{"name": "x", "tools": [{"name": "Get_Item-2", "description": "d"}]}"#,
            ),
            (
                "leading_dash.json",
                r#"{"name": "x", "tools": [{"name": "-_-", "description": "d"}]}"#,
            ),
        ]);
        assert_eq!(parsed("64_chars.json", &long).tools[0].name, name64);
    }

    #[test]
    fn a_domain_name_must_match_the_domain_pattern() {
        let long = format!(r#"{{"name": "{}"}}"#, "a".repeat(65));
        let long_stem = format!("{}.json", "a".repeat(65));
        let invalid = "is invalid: it must match ^[a-z0-9][a-z0-9_-]{0,63}$";
        assert_rejected(&[
            (
                "uppercase.json",
                r#"{"name": "Media"}"#,
                &["domain name `Media`", invalid],
            ),
            (
                "leading_underscore.json",
                r#"{"name": "_media"}"#,
                &["domain name `_media`", invalid],
            ),
            (
                "leading_dash.json",
                r#"{"name": "-media"}"#,
                &["domain name `-media`", invalid],
            ),
            ("65_chars.json", &long, &[invalid]),
            ("empty.json", r#"{"name": ""}"#, &["domain name ``", invalid]),
            ("dot.json", r#"{"name": "media.server"}"#, &[invalid]),
            (
                "space.toml",
                "name = \"media server\"\n",
                &["domain name `media server`", invalid],
            ),
            // A group array is named by its file stem.
            ("manifests/Media.json", "[]", &["domain name `Media`", invalid]),
            ("manifests/_tools.json", "[]", &["domain name `_tools`", invalid]),
            (
                "manifests/my tools.json",
                "[]",
                &["domain name `my tools`", invalid],
            ),
            (
                "manifests/media.v2.json",
                "[]",
                &["domain name `media.v2`", invalid],
            ),
            (&long_stem, "[]", &[invalid]),
        ]);
    }

    #[test]
    fn domain_names_up_to_64_lowercase_letters_digits_underscores_and_dashes_are_accepted() {
        let long = format!(r#"{{"name": "{}"}}"#, "a".repeat(64));
        let long_stem = format!("{}.json", "a".repeat(64));
        assert_accepted(&[
            ("64_chars.json", &long),
            ("digit.json", r#"{"name": "0day"}"#),
            ("one.json", r#"{"name": "a"}"#),
            ("mixed.json", r#"{"name": "a-b_c9"}"#),
            ("manifests/uptime_kuma.json", "[]"),
            ("manifests/pi-hole.json", "[]"),
            (&long_stem, "[]"),
        ]);
    }

    #[test]
    fn an_input_schema_that_is_not_an_object_of_type_object_is_rejected() {
        let with = |schema: &str| {
            format!(
                r#"{{"name": "x", "tools": [{{"name": "t", "description": "d", "input_schema": {schema}}}]}}"#
            )
        };
        let cases = [
            ("string.json", with(r#""object""#)),
            ("array.json", with("[]")),
            ("null.json", with("null")),
            ("type_array.json", with(r#"{"type": "array", "items": {}}"#)),
            ("missing_type.json", with(r#"{"properties": {}}"#)),
            ("type_list.json", with(r#"{"type": ["object"]}"#)),
            ("type_array.toml", "name = \"x\"\n[[tools]]\nname = \"t\"\ndescription = \"d\"\ninput_schema = { type = \"array\" }\n".into()),
        ];
        let table: Vec<(&str, &str, &[&str])> = cases
            .iter()
            .map(|(p, t)| {
                (
                    *p,
                    t.as_str(),
                    &["tool #1 `t`: `input_schema` must be a JSON object whose `type` is \"object\""][..],
                )
            })
            .collect();
        assert_rejected(&table);

        // A group array's `parameters` must fit `{"properties": {...}, "required": [...]}`.
        let group = |parameters: &str| {
            format!(r#"[{{"name": "t", "description": "d", "parameters": {parameters}}}]"#)
        };
        let cases = [
            (
                "not_object.json",
                group("[]"),
                "`parameters` must be a JSON object",
            ),
            (
                "type_array.json",
                group(r#"{"type": "array", "properties": {}}"#),
                "`parameters` must be",
            ),
            (
                "properties_array.json",
                group(r#"{"properties": []}"#),
                "`parameters` must be",
            ),
            (
                "required_string.json",
                group(r#"{"properties": {}, "required": "a"}"#),
                "`parameters` must be",
            ),
            (
                "required_numbers.json",
                group(r#"{"properties": {}, "required": [1]}"#),
                "`parameters` must be",
            ),
        ];
        for (path, text, want) in &cases {
            assert_rejected(&[(path, text, &[want])]);
        }
    }

    #[test]
    fn a_tier_other_than_read_modify_or_destructive_is_rejected() {
        let with = |tier: &str| {
            format!(r#"{{"name": "x", "tools": [{{"name": "t", "description": "d", "tier": {tier}}}]}}"#)
        };
        let cases = [
            ("write.json", with(r#""write""#)),
            ("uppercase.json", with(r#""READ""#)),
            ("empty.json", with(r#""""#)),
            ("number.json", with("1")),
            ("null.json", with("null")),
            (
                "admin.toml",
                "name = \"x\"\n[[tools]]\nname = \"t\"\ndescription = \"d\"\ntier = \"admin\"\n".into(),
            ),
            (
                "group.json",
                r#"[{"name": "t", "description": "d", "tier": "delete"}]"#.into(),
            ),
        ];
        for (path, text) in &cases {
            assert_rejected(&[(
                path,
                text,
                &["tool #1 `t`: `tier` must be one of read, modify, destructive"],
            )]);
        }
    }

    #[test]
    fn each_of_the_three_tiers_is_accepted() {
        for (spelling, tier) in [
            ("read", Tier::Read),
            ("modify", Tier::Modify),
            ("destructive", Tier::Destructive),
        ] {
            let text = format!(
                r#"{{"name": "x", "tools": [{{"name": "t", "description": "d", "tier": "{spelling}"}}]}}"#
            );
            assert_eq!(parsed("x.json", &text).tools[0].tier, tier, "tier {spelling}");
        }
    }

    // ---- keywords and _meta -----------------------------------------------------------------

    #[test]
    fn an_empty_or_whitespace_only_keyword_is_rejected() {
        assert_rejected(&[
            (
                "empty.json",
                r#"{"name": "x", "keywords": ["dns", ""]}"#,
                &["keyword #2 is empty or whitespace-only"],
            ),
            (
                "spaces.json",
                r#"{"name": "x", "keywords": ["   "]}"#,
                &["keyword #1 is empty or whitespace-only"],
            ),
            (
                "tabs.json",
                r#"{"name": "x", "keywords": ["\t\n"]}"#,
                &["keyword #1 is empty or whitespace-only"],
            ),
            (
                "nbsp.json",
                r#"{"name": "x", "keywords": ["\u00a0\u2003"]}"#,
                &["keyword #1 is empty or whitespace-only"],
            ),
            (
                "empty.toml",
                "name = \"x\"\nkeywords = [\"dns\", \" \"]\n",
                &["keyword #2 is empty or whitespace-only"],
            ),
            (
                "group.json",
                r#"[{"_meta": true, "keywords": ["dns", " "]}]"#,
                &["keyword #2 is empty or whitespace-only"],
            ),
        ]);
        // A keyword with spaces inside (a phrase) is fine.
        assert_eq!(
            parsed("x.json", r#"{"name": "x", "keywords": [" smart home "]}"#).keywords,
            strings(&[" smart home "])
        );
    }

    #[test]
    fn a_meta_element_must_come_first_and_be_true() {
        let tool = r#"{"name": "t", "description": "d"}"#;
        let second = format!(r#"[{tool}, {{"_meta": true, "display_name": "X"}}]"#);
        let third = format!(r#"[{{"_meta": true}}, {tool}, {{"_meta": true}}]"#);
        assert_rejected(&[
            (
                "second.json",
                &second,
                &["element #2: a `_meta` element must be the first element"],
            ),
            (
                "third.json",
                &third,
                &["element #3: a `_meta` element must be the first element"],
            ),
            (
                "false.json",
                r#"[{"_meta": false, "display_name": "X"}]"#,
                &["element #1: `_meta` must be `true`"],
            ),
            (
                "yes.json",
                r#"[{"_meta": "yes"}]"#,
                &["element #1: `_meta` must be `true`"],
            ),
            (
                "one.json",
                r#"[{"_meta": 1}]"#,
                &["element #1: `_meta` must be `true`"],
            ),
            (
                "null.json",
                r#"[{"_meta": null}]"#,
                &["element #1: `_meta` must be `true`"],
            ),
        ]);
    }

    #[test]
    fn meta_fields_of_the_wrong_type_are_rejected() {
        assert_rejected(&[
            (
                "core.json",
                r#"[{"_meta": true, "core": "yes"}]"#,
                &["field `core` must be true or false"],
            ),
            (
                "fallback.json",
                r#"[{"_meta": true, "fallback": 0}]"#,
                &["field `fallback` must be true or false"],
            ),
            (
                "keywords.json",
                r#"[{"_meta": true, "keywords": "dns"}]"#,
                &["field `keywords` must be an array of strings"],
            ),
            (
                "display_name.json",
                r#"[{"_meta": true, "display_name": ["X"]}]"#,
                &["`display_name` must be a string"],
            ),
        ]);
    }

    // ---- rules across files -----------------------------------------------------------------

    #[test]
    fn the_same_domain_name_in_two_files_is_rejected_naming_both_paths() {
        let cases: &[(Sources, &[&str])] = &[
            (
                &[
                    ("a/one.json", r#"{"name": "media"}"#),
                    ("b/two.json", r#"{"name": "media"}"#),
                ],
                &["domain `media` is defined twice", "a/one.json", "b/two.json"],
            ),
            (
                &[
                    ("a/one.json", r#"{"name": "media"}"#),
                    ("b/two.toml", "name = \"media\"\n"),
                ],
                &["domain `media` is defined twice", "a/one.json", "b/two.toml"],
            ),
            // A group array named by its stem clashes with a native manifest's `name`.
            (
                &[("a/media.json", "[]"), ("b/other.json", r#"{"name": "media"}"#)],
                &["domain `media` is defined twice", "a/media.json", "b/other.json"],
            ),
            (
                &[("a/media.json", "[]"), ("b/media.json", "[]")],
                &["domain `media` is defined twice", "a/media.json", "b/media.json"],
            ),
        ];
        for (sources, expected) in cases {
            assert_load_rejected(sources, expected);
            let errors = load_errors(sources);
            let both = errors
                .iter()
                .any(|e| expected[1..].iter().all(|p| e.message.contains(p)));
            assert!(
                both,
                "{sources:?}: one message names both paths:\n{}",
                shown(&errors)
            );
        }
        // Three definitions: each later one is reported against the first.
        let sources = [
            ("a.json", r#"{"name": "m"}"#),
            ("b.json", r#"{"name": "m"}"#),
            ("c.json", r#"{"name": "m"}"#),
        ];
        let errors = load_errors(&sources);
        assert_eq!(errors.len(), 2, "{}", shown(&errors));
    }

    #[test]
    fn the_same_tool_name_twice_is_rejected_naming_both_domains_and_files() {
        let alpha = r#"{"name": "alpha", "tools": [{"name": "t", "description": "d"}]}"#;
        let beta = r#"{"name": "beta", "tools": [{"name": "t", "description": "other"}]}"#;
        let twice = r#"{"name": "alpha", "tools": [{"name": "t", "description": "d"}, {"name": "t", "description": "e"}]}"#;
        let cases: &[(Sources, &[&str])] = &[
            (
                &[("a/alpha.json", twice)],
                &["tool `t` appears twice in domain `alpha`"],
            ),
            (
                &[(
                    "g/tools.json",
                    r#"[{"name": "t", "description": "d"}, {"name": "t", "description": "e"}]"#,
                )],
                &["tool `t` appears twice in domain `tools`"],
            ),
            (
                &[("a/alpha.json", alpha), ("b/beta.json", beta)],
                &[
                    "tool `t` is defined in two domains",
                    "`alpha` (a/alpha.json)",
                    "`beta` (b/beta.json)",
                ],
            ),
            (
                &[
                    ("a/alpha.json", alpha),
                    (
                        "b/beta.toml",
                        "name = \"beta\"\n[[tools]]\nname = \"t\"\ndescription = \"e\"\n",
                    ),
                ],
                &[
                    "tool `t` is defined in two domains",
                    "`alpha` (a/alpha.json)",
                    "`beta` (b/beta.toml)",
                ],
            ),
            (
                &[
                    ("a/alpha.json", alpha),
                    ("g/gamma.json", r#"[{"name": "t", "description": "e"}]"#),
                ],
                &[
                    "tool `t` is defined in two domains",
                    "`alpha` (a/alpha.json)",
                    "`gamma` (g/gamma.json)",
                ],
            ),
        ];
        for (sources, expected) in cases {
            assert_load_rejected(sources, expected);
        }
        // Tool names are compared exactly: case differs, so both load.
        let upper = r#"{"name": "beta", "tools": [{"name": "T", "description": "d"}]}"#;
        assert!(Registry::from_sources([("a.json", alpha), ("b.json", upper)]).is_ok());
    }

    // ---- every problem at once --------------------------------------------------------------

    #[test]
    fn every_problem_in_one_file_is_reported() {
        let native = r#"{
            "name": "Bad_Name",
            "keywords": ["ok", " "],
            "colour": "red",
            "core": "yes",
            "tools": [
                {"name": "has space", "description": "d", "tier": "admin"},
                {"description": "no name"},
                {"name": "no_description", "input_schema": {"type": "array"}}
            ]
        }"#;
        let group = r#"[
            {"name": "t", "description": "d"},
            {"_meta": true},
            {"name": "u"},
            {"name": "v.w", "description": "d", "parameters": []}
        ]"#;
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "native.json",
                native,
                &[
                    "unknown field `colour`",
                    "domain name `Bad_Name` is invalid",
                    "keyword #2 is empty",
                    "field `core` must be true or false",
                    "tool #1 `has space`: tool name is invalid",
                    "tool #1 `has space`: `tier` must be one of",
                    "tool #2: missing required field `name`",
                    "tool #3 `no_description`: `input_schema` must be",
                    "tool #3 `no_description`: missing required field `description`",
                ],
            ),
            (
                "Group.json",
                group,
                &[
                    "domain name `Group` is invalid",
                    "element #2: a `_meta` element must be the first element",
                    "tool #3 `u`: missing required field `description`",
                    "tool #4 `v.w`: `parameters` must be a JSON object",
                    "tool #4 `v.w`: tool name is invalid",
                ],
            ),
        ];
        for &(path, text, expected) in cases {
            assert_rejected(&[(path, text, expected)]);
            let errors = load_errors(&[(path, text)]);
            assert_eq!(
                errors.len(),
                expected.len(),
                "{path}: one error per problem:\n{}",
                shown(&errors)
            );
        }
    }

    #[test]
    fn problems_in_several_files_are_reported_together() {
        let sources = [
            ("a.json", r#"{"name": "a", "tools": [{"name": "t"}]}"#),
            ("ok.json", r#"{"name": "ok"}"#),
            ("b.toml", "name = \"b\"\nextra = 1\n"),
            ("c.json", "{\n  \"name\": \"c\"\n  \"core\": true\n}"),
            ("D.json", "[]"),
        ];
        let errors = load_errors(&sources);
        let shown = shown(&errors);
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            ["a.json", "b.toml", "c.json", "D.json"],
            "one error per bad file, in order:\n{shown}"
        );
        assert!(
            errors[0].message.contains("missing required field `description`"),
            "{shown}"
        );
        assert!(errors[1].message.contains("unknown field `extra`"), "{shown}");
        assert_eq!(errors[2].position, Some((3, 3)), "{shown}");
        assert!(
            errors[3].message.contains("domain name `D` is invalid"),
            "{shown}"
        );
    }

    // ---- what valid manifests load as -------------------------------------------------------

    #[test]
    fn omitted_native_fields_take_their_defaults() {
        let d = parsed(
            "dir/ha.json",
            r#"{"name": "home_assistant", "tools": [{"name": "t", "description": "d"}]}"#,
        );
        assert_eq!(
            d,
            Domain {
                name: "home_assistant".into(),
                display_name: "Home Assistant".into(),
                description: "Tools from home_assistant group".into(),
                settings_keys: vec![],
                keywords: vec![],
                core: false,
                fallback: true,
                tools: vec![tool("t", "d", DEFAULT_SCHEMA, Tier::Unspecified)],
                source: "dir/ha.json".into(),
            }
        );
        let d = parsed("x.toml", "name = \"pi-hole\"\n");
        assert_eq!(
            (d.display_name.as_str(), d.description.as_str()),
            ("Pi Hole", "Tools from pi-hole group")
        );
        assert!(d.tools.is_empty() && d.keywords.is_empty() && d.settings_keys.is_empty());
        assert!(!d.core && d.fallback);
    }

    #[test]
    fn the_default_display_name_capitalises_each_word() {
        let cases = [
            ("home_assistant", "Home Assistant"),
            ("pi-hole", "Pi Hole"),
            ("plex", "Plex"),
            ("a_b-c", "A B C"),
            ("3d_printer", "3d Printer"),
            ("uptime_kuma2", "Uptime Kuma2"),
        ];
        for (name, display) in cases {
            let d = parsed("x.json", &format!(r#"{{"name": "{name}"}}"#));
            assert_eq!(d.display_name, display, "native manifest named {name}");
            let d = parsed(&format!("dir/{name}.json"), "[]");
            assert_eq!(d.display_name, display, "group array {name}.json");
        }
    }

    #[test]
    fn given_native_fields_are_kept_as_written() {
        let d = parsed(
            "q.json",
            r#"{"name": "qbittorrent", "display_name": "qBittorrent", "description": "Torrents",
                "settings_keys": ["qbittorrent_url"], "keywords": ["torrent", "magnet link"],
                "core": true, "fallback": false, "tools": []}"#,
        );
        assert_eq!(d.display_name, "qBittorrent");
        assert_eq!(d.description, "Torrents");
        assert_eq!(d.settings_keys, strings(&["qbittorrent_url"]));
        assert_eq!(d.keywords, strings(&["torrent", "magnet link"]));
        assert!(d.core && !d.fallback);
    }

    #[test]
    fn a_toml_manifest_loads_like_the_equivalent_json() {
        let json = r#"{
            "name": "media",
            "display_name": "Media Server",
            "description": "Movies and shows",
            "settings_keys": ["media_url", "media_token"],
            "keywords": ["movie", "tv show"],
            "core": true,
            "fallback": false,
            "tools": [
                {"name": "media_search", "description": "Search the library", "tier": "read",
                 "input_schema": {"type": "object",
                                  "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "default": 20}},
                                  "required": ["query"]}},
                {"name": "media_delete", "description": "Delete an item", "tier": "destructive"}
            ]
        }"#;
        let toml = r#"
name = "media"
display_name = "Media Server"
description = "Movies and shows"
settings_keys = ["media_url", "media_token"]
keywords = ["movie", "tv show"]
core = true
fallback = false

[[tools]]
name = "media_search"
description = "Search the library"
tier = "read"

[tools.input_schema]
type = "object"

[tools.input_schema.properties.query]
type = "string"

[tools.input_schema.properties.limit]
type = "integer"
minimum = 1
default = 20

[[tools]]
name = "media_delete"
description = "Delete an item"
tier = "destructive"
"#;
        // Inline tables give the same result, `required` included.
        let inline = r#"
name = "media"
display_name = "Media Server"
description = "Movies and shows"
settings_keys = ["media_url", "media_token"]
keywords = ["movie", "tv show"]
core = true
fallback = false
tools = [
  { name = "media_search", description = "Search the library", tier = "read", input_schema = { type = "object", properties = { query = { type = "string" }, limit = { type = "integer", minimum = 1, default = 20 } }, required = ["query"] } },
  { name = "media_delete", description = "Delete an item", tier = "destructive" },
]
"#;
        let from_json = parsed("media.json", json);
        assert_eq!(
            from_json.tools[0].input_schema_json,
            r#"{"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer","minimum":1,"default":20}},"required":["query"]}"#
        );
        assert_eq!(from_json.tools[1].input_schema_json, DEFAULT_SCHEMA);
        let from_inline = parsed("media.toml", inline);
        assert_eq!(
            Domain {
                source: from_json.source.clone(),
                ..from_inline
            },
            from_json,
            "inline TOML"
        );

        // Table headers cannot put `required` after the sub-tables, so compare without it.
        let mut without_required = from_json.clone();
        without_required.tools[0].input_schema_json =
            r#"{"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer","minimum":1,"default":20}}}"#.into();
        let from_toml = parsed("media.toml", toml);
        assert_eq!(from_toml.source, "media.toml");
        assert_eq!(
            Domain {
                source: from_json.source.clone(),
                ..from_toml
            },
            without_required,
            "TOML tables"
        );
    }

    #[test]
    fn a_group_array_is_named_by_its_file_stem_and_takes_its_meta_fields() {
        let text = r#"[
            {"_meta": true, "display_name": "Pi-hole", "description": "DNS ad blocker",
             "settings_keys": ["pihole_url"], "keywords": ["pihole", "dns"], "core": true, "fallback": false},
            {"name": "pihole_stats", "description": "Query statistics",
             "parameters": {"properties": {"days": {"type": "integer"}}, "required": ["days"]},
             "function": "async ({days}) => fetchStats(days)", "timeoutSeconds": 30, "requiredPermissions": ["admin"]},
            {"name": "pihole_disable", "description": "Disable blocking", "tier": "modify"}
        ]"#;
        let d = parsed("manifests/pi-hole.json", text);
        assert_eq!(
            d,
            Domain {
                name: "pi-hole".into(),
                display_name: "Pi-hole".into(),
                description: "DNS ad blocker".into(),
                settings_keys: strings(&["pihole_url"]),
                keywords: strings(&["pihole", "dns"]),
                core: true,
                fallback: false,
                tools: vec![
                    tool(
                        "pihole_stats",
                        "Query statistics",
                        r#"{"type":"object","properties":{"days":{"type":"integer"}},"required":["days"]}"#,
                        Tier::Unspecified,
                    ),
                    tool("pihole_disable", "Disable blocking", DEFAULT_SCHEMA, Tier::Modify),
                ],
                source: "manifests/pi-hole.json".into(),
            }
        );
        // The same file loads through the registry.
        let r = Registry::from_sources([("manifests/pi-hole.json", text)]).expect("valid group array");
        assert_eq!(r.domains()[0].name, "pi-hole");
    }

    #[test]
    fn group_array_parameters_become_an_object_schema() {
        // (parameters, input_schema_json)
        let cases = [
            (
                r#"{"properties": {"q": {"type": "string"}}, "required": ["q"]}"#,
                r#"{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}"#,
            ),
            // `type` goes first even when written last.
            (
                r#"{"properties": {"q": {"type": "string"}}, "required": [], "type": "object"}"#,
                r#"{"type":"object","properties":{"q":{"type":"string"}},"required":[]}"#,
            ),
            (r#"{"properties": {}}"#, DEFAULT_SCHEMA),
            (r"{}", DEFAULT_SCHEMA),
            // Property order is kept.
            (
                r#"{"properties": {"z": {"type": "string"}, "a": {"type": "integer"}, "m": {}}}"#,
                r#"{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"},"m":{}}}"#,
            ),
        ];
        for (parameters, schema) in cases {
            let text = format!(r#"[{{"name": "t", "description": "d", "parameters": {parameters}}}]"#);
            assert_eq!(
                parsed("g.json", &text).tools[0].input_schema_json,
                schema,
                "parameters {parameters}"
            );
        }
        let d = parsed("g.json", r#"[{"name": "t", "description": "d"}]"#);
        assert_eq!(d.tools[0].input_schema_json, DEFAULT_SCHEMA, "absent parameters");
    }

    #[test]
    fn a_group_array_without_meta_takes_the_defaults() {
        let d = parsed(
            "tools/uptime_kuma.json",
            r#"[{"name": "kuma_status", "description": "Monitor status", "function": "x", "timeoutSeconds": 5}]"#,
        );
        assert_eq!(
            d,
            Domain {
                name: "uptime_kuma".into(),
                display_name: "Uptime Kuma".into(),
                description: "Tools from uptime_kuma group".into(),
                settings_keys: vec![],
                keywords: vec![],
                core: false,
                fallback: true,
                tools: vec![tool(
                    "kuma_status",
                    "Monitor status",
                    DEFAULT_SCHEMA,
                    Tier::Unspecified
                )],
                source: "tools/uptime_kuma.json".into(),
            }
        );
        // A `_meta` element with only some fields keeps the defaults for the rest.
        let d = parsed(
            "tools/uptime_kuma.json",
            r#"[{"_meta": true, "keywords": ["uptime"]}]"#,
        );
        assert_eq!(d.display_name, "Uptime Kuma");
        assert_eq!(d.description, "Tools from uptime_kuma group");
        assert_eq!(d.keywords, strings(&["uptime"]));
        assert!(!d.core && d.fallback && d.tools.is_empty());
    }

    #[test]
    fn the_key_order_of_an_input_schema_is_preserved() {
        let schemas = [
            r#"{"type":"object","required":["z"],"properties":{"z":{"type":"string"},"a":{"type":"number"}},"additionalProperties":false}"#,
            r#"{"properties":{"b":{"description":"second","type":"string"}},"type":"object","$schema":"x"}"#,
            r#"{"type":"object","properties":{"n":{"type":"integer","maximum":10,"minimum":1,"enum":[3,1,2]}}}"#,
        ];
        for schema in schemas {
            let text = format!(
                r#"{{"name": "x", "tools": [{{"name": "t", "description": "d", "input_schema": {schema}}}]}}"#
            );
            assert_eq!(parsed("x.json", &text).tools[0].input_schema_json, schema);
            // Whitespace in the file does not reach the rendered text.
            let spaced = text.replace(',', ", ").replace(':', ": ");
            assert_eq!(parsed("x.json", &spaced).tools[0].input_schema_json, schema);
        }
    }

    #[test]
    fn unknown_fields_in_a_group_array_meta_or_tool_element_are_rejected_by_name() {
        assert_rejected(&[
            (
                "meta_typos.json",
                r#"[{"_meta": true, "setings_keys": ["url"], "keywrods": ["x"]}]"#,
                &[
                    "element #1 (`_meta`): unknown field `setings_keys`",
                    "element #1 (`_meta`): unknown field `keywrods`",
                ][..],
            ),
            (
                "tool_typo.json",
                r#"[{"name": "t", "description": "d", "paramaters": {"properties": {}}}]"#,
                &["tool #1 `t`: unknown field `paramaters`"],
            ),
            (
                "native_field_in_group.json",
                r#"[{"name": "t", "description": "d", "input_schema": {"type": "object"}}]"#,
                &["tool #1 `t`: unknown field `input_schema`"],
            ),
        ]);
        // The chat apps' own fields are carried without complaint.
        assert_accepted(&[(
            "app_fields.json",
            r#"[{"_meta": true, "display_name": "X", "description": "d", "settings_keys": [], "keywords": ["x"], "core": false, "fallback": true},
                {"name": "t", "description": "d", "tier": "read", "parameters": {"properties": {}},
                 "function": "f", "timeoutSeconds": 5, "requiredPermissions": ["admin"]}]"#,
        )]);
    }

    #[test]
    fn an_input_schema_that_is_not_a_valid_json_schema_is_rejected() {
        let native = |schema: &str| {
            format!(
                r#"{{"name": "x", "tools": [{{"name": "t", "description": "d", "input_schema": {schema}}}]}}"#
            )
        };
        let group = |parameters: &str| {
            format!(r#"[{{"name": "t", "description": "d", "parameters": {parameters}}}]"#)
        };
        let invalid: &[&str] = &["is not a valid JSON Schema (draft 2020-12)"];
        let cases = [
            ("properties_string.json", native(r#"{"type": "object", "properties": "oops"}"#)),
            (
                "bad_type.json",
                native(r#"{"type": "object", "properties": {"a": {"type": "strnig"}}}"#),
            ),
            (
                "min_string.json",
                native(r#"{"type": "object", "properties": {"a": {"type": "string", "minLength": "3"}}}"#),
            ),
            (
                "required_not_unique.json",
                native(r#"{"type": "object", "properties": {"a": {}}, "required": ["a", "a"]}"#),
            ),
            (
                "group_nested.json",
                group(r#"{"properties": {"a": {"type": "array", "items": 5}}}"#),
            ),
            (
                "schema.toml",
                "name = \"x\"\n[[tools]]\nname = \"t\"\ndescription = \"d\"\ninput_schema = { type = \"object\", properties = { a = { type = 1 } } }\n".into(),
            ),
        ];
        let table: Vec<(&str, &str, &[&str])> =
            cases.iter().map(|(p, t)| (*p, t.as_str(), invalid)).collect();
        assert_rejected(&table);
    }

    #[test]
    fn a_required_name_that_the_schema_does_not_define_is_rejected() {
        let native = |schema: &str| {
            format!(
                r#"{{"name": "x", "tools": [{{"name": "t", "description": "d", "input_schema": {schema}}}]}}"#
            )
        };
        let group = |parameters: &str| {
            format!(r#"[{{"name": "t", "description": "d", "parameters": {parameters}}}]"#)
        };
        assert_rejected(&[
            (
                "top.json",
                &native(r#"{"type": "object", "properties": {"a": {}}, "required": ["a", "b"]}"#),
                &["`input_schema` lists `b` in `required` but does not define it"],
            ),
            (
                "no_properties.json",
                &native(r#"{"type": "object", "required": ["a"]}"#),
                &["lists `a` in `required`"],
            ),
            (
                "nested.json",
                &native(
                    r#"{"type": "object", "properties": {"o": {"type": "object", "properties": {"x": {}}, "required": ["y"]}}}"#,
                ),
                &["`input_schema` at /properties/o lists `y` in `required`"],
            ),
            (
                "group.json",
                &group(r#"{"properties": {"days": {"type": "integer"}}, "required": ["dayz"]}"#),
                &["`parameters` lists `dayz` in `required`"],
            ),
        ]);
        // Properties may come from elsewhere where the schema composes them.
        assert_accepted(&[(
            "composed.json",
            &native(r#"{"type": "object", "allOf": [{"properties": {"a": {}}}], "required": ["a"]}"#),
        )]);
    }

    #[test]
    fn a_duplicate_key_in_a_json_object_is_rejected_at_its_position() {
        // (path, text, the key, (line, column)).
        let cases: &[(&str, &str, &str, (usize, usize))] = &[
            (
                "top.json",
                "{\n  \"name\": \"x\",\n  \"keywords\": [\"a\"],\n  \"keywords\": [\"b\"]\n}",
                "keywords",
                (4, 12),
            ),
            (
                "tool.json",
                r#"{"name": "x", "tools": [{"name": "t", "description": "d", "name": "u"}]}"#,
                "name",
                (1, 64),
            ),
            (
                "schema.json",
                r#"[{"name": "t", "description": "d", "parameters": {"properties": {"a": {}, "a": {}}}}]"#,
                "a",
                (1, 77),
            ),
        ];
        for &(path, text, key, position) in cases {
            let errors = load_errors(&[(path, text)]);
            let shown = shown(&errors);
            assert_eq!(errors.len(), 1, "{path}: one error expected:\n{shown}");
            assert_eq!(errors[0].path, path, "{shown}");
            assert_eq!(errors[0].position, Some(position), "{path}:\n{shown}");
            assert!(
                errors[0]
                    .message
                    .contains(&format!("duplicate key `{key}` in a JSON object")),
                "{path}:\n{shown}"
            );
        }
    }

    #[test]
    fn a_tool_without_a_tier_is_unspecified_not_read() {
        for (path, text) in [
            (
                "n.json",
                r#"{"name": "x", "tools": [{"name": "t", "description": "d"}]}"#,
            ),
            ("g.json", r#"[{"name": "t", "description": "d"}]"#),
            (
                "n.toml",
                "name = \"x\"\n[[tools]]\nname = \"t\"\ndescription = \"d\"\n",
            ),
        ] {
            let tier = parsed(path, text).tools[0].tier;
            assert_eq!(tier, Tier::Unspecified, "{path}");
            assert_eq!(tier.as_str(), "", "{path}: reported as an empty string");
            assert_eq!(
                tier.effective(),
                Tier::Destructive,
                "{path}: decides as destructive"
            );
        }
    }
}

#[cfg(test)]
mod position_tests {
    use super::*;

    fn position(path: &str, text: &str) -> Option<(usize, usize)> {
        parse(path, text).unwrap_err()[0].position
    }

    #[test]
    fn a_json_error_at_a_line_end_is_reported_on_that_line() {
        assert_eq!(
            position("a.json", "{\n  \"name\": \"x\",\n  \"core\": tru\n}"),
            Some((3, 14))
        );
        assert_eq!(position("a.json", "{\n  \"name\": \"x\",\n"), Some((2, 15)));
    }

    #[test]
    fn json_columns_count_characters_like_toml_columns() {
        assert_eq!(position("a.json", "{\"name\": \"日本\" x}"), Some((1, 15)));
    }

    #[test]
    fn a_byte_order_mark_is_not_an_error() {
        assert!(parse("a.json", "\u{feff}{\"name\":\"a\"}").is_ok());
    }

    #[test]
    fn a_broken_file_does_not_hide_a_duplicate_between_two_others() {
        let err = crate::registry::Registry::from_sources([
            ("a.json", "{"),
            ("b.json", r#"{"name":"m"}"#),
            ("c.json", r#"{"name":"m"}"#),
        ])
        .unwrap_err();
        assert_eq!(err.0.len(), 2, "{err}");
        assert!(err.0[1].message.contains("b.json") && err.0[1].message.contains("c.json"));
    }
}
