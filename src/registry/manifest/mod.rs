//! Manifest parsing and validation: native domain manifests (JSON or TOML) and group-array
//! JSON manifests. Both are first read into a `serde_json::Value` (so syntax errors carry a
//! line:column) and then checked field by field, so one file reports every problem at once.

use std::path::Path;

use serde_json::{Map, Value};

mod schema;
mod text;

use schema::{default_schema, undefined_required};
pub(crate) use text::line_col;
use text::{DUPLICATE_KEY, byte_offset, duplicate_keys, json_position};

use super::{Domain, Tier, Tool};
use crate::error::{ManifestError, echo};

/// A manifest file format, chosen by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
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

/// The longest keyword, in bytes. Word-mode matching walks from every word start of a
/// message as far as a keyword's prefix matches, so a keyword's length bounds what one
/// message costs (a 64 KiB message against a keyword of "a a a ...": seconds at 64 KiB, a
/// few milliseconds at this bound). Keywords are words and short phrases.
pub(crate) const MAX_KEYWORD_BYTES: usize = 128;
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
    let format = Format::of(Path::new(path)).unwrap_or(Format::Json);
    let (value, found) = read(path, text, format)?;
    with_found(found, validate(path, value, format))
}

/// What a manifest that failed validation still says of its names, for the checks across
/// files: its domain's name (a group array's, its file's) and its tools' names; `None` when
/// the text cannot be read or names no domain.
pub fn names(path: &str, text: &str) -> Option<(String, Vec<String>)> {
    let format = Format::of(Path::new(path)).unwrap_or(Format::Json);
    let (value, _) = read(path, text, format).ok()?;
    let tool_name = |t: &Value| t.get("name").and_then(Value::as_str).map(str::to_string);
    match value {
        Value::Object(o) => {
            let tools = o.get("tools").and_then(Value::as_array);
            Some((
                o.get("name")?.as_str()?.to_string(),
                tools.map_or_else(Vec::new, |t| t.iter().filter_map(tool_name).collect()),
            ))
        }
        Value::Array(items) if format == Format::Json => Some((
            Path::new(path).file_stem()?.to_str()?.to_string(),
            items
                .iter()
                .filter(|i| i.get("_meta").is_none())
                .filter_map(tool_name)
                .collect(),
        )),
        _ => None,
    }
}

/// A validation's result after the problems [`read`] found without stopping: those first.
fn with_found(
    mut found: Vec<ManifestError>,
    validated: Result<Domain, Vec<ManifestError>>,
) -> Result<Domain, Vec<ManifestError>> {
    match validated {
        Ok(d) if found.is_empty() => Ok(d),
        Ok(_) => Err(found),
        Err(mut errors) => {
            found.append(&mut errors);
            Err(found)
        }
    }
}

/// Parses a manifest that comes without a file (a domain registered at run time): one native
/// manifest as JSON text, validated exactly as a file's. A group array takes its name from
/// a file and TOML is a file format, so both are refused, saying so. `source` names the
/// domain in its messages and as [`Domain::source`]: it is given the manifest's `name` when
/// the text has one (`None` while the text cannot be read).
///
/// # Errors
/// Every problem found in the text.
pub fn parse_native(
    text: &str,
    source: impl Fn(Option<&str>) -> String,
) -> Result<Domain, Vec<ManifestError>> {
    let (value, found) = read(&source(None), text, Format::Json).map_err(|mut errors| {
        // The usual mistake behind text that is not JSON: a TOML manifest.
        if !text.trim_start().starts_with(['{', '[']) {
            for e in &mut errors {
                e.message.push_str(NATIVE_JSON_ONLY);
            }
        }
        errors
    })?;
    let path = source(value.get("name").and_then(Value::as_str));
    // Text that reads as JSON names the domain in every problem, its duplicate keys too.
    let found = found
        .into_iter()
        .map(|e| ManifestError {
            path: path.clone(),
            ..e
        })
        .collect();
    match value {
        Value::Object(_) => with_found(found, validate(&path, value, Format::Json)),
        Value::Array(_) => Err(vec![err(
            &path,
            format!("a group-array manifest (a JSON array) is not accepted here{NATIVE_JSON_ONLY}"),
        )]),
        _ => Err(vec![err(
            &path,
            format!("the manifest must be a JSON object{NATIVE_JSON_ONLY}"),
        )]),
    }
}

/// What [`parse_native`] takes, appended to its refusals of other formats.
const NATIVE_JSON_ONLY: &str = " (a domain registered at run time is one native manifest: a JSON object with `name`; group arrays and TOML are manifest-file formats)";

/// The manifest's text as a JSON value (TOML converted), or its syntax error at line:column.
/// Duplicate object keys and TOML values JSON has no form for do not stop the checks: each
/// is returned beside the value (read with the last of the duplicates, as JSON parsers do;
/// without the TOML value), so the rest of the file is checked too.
fn read(path: &str, text: &str, format: Format) -> Result<(Value, Vec<ManifestError>), Vec<ManifestError>> {
    // Editors on some systems write a byte-order mark; it is not part of the document.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // Each duplicate key before byte `upto`, at its place.
    let duplicates = |upto: usize| -> Vec<ManifestError> {
        duplicate_keys(&text[..upto])
            .into_iter()
            .map(|(at, key)| {
                err_at(
                    path,
                    Some(line_col(text, at)),
                    format!("{DUPLICATE_KEY} `{}` in a JSON object", echo(&key)),
                )
            })
            .collect()
    };
    match format {
        Format::Json => match serde_json::from_str::<Value>(text) {
            Ok(value) => Ok((value, duplicates(text.len()))),
            Err(e) => {
                // serde_json appends " at line L column C"; the position goes in front instead.
                let msg = e.to_string();
                let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
                let (line, column) = json_position(text, e.line(), e.column());
                let mut errors = duplicates(byte_offset(text, line, column));
                errors.push(err_at(
                    path,
                    Some((line, column)),
                    format!("malformed JSON: {msg}"),
                ));
                Err(errors)
            }
        },
        Format::Toml => {
            let table = toml::from_str::<toml::Table>(text).map_err(|e| {
                let pos = e.span().map(|s| line_col(text, s.start));
                vec![err_at(path, pos, format!("malformed TOML: {}", e.message()))]
            })?;
            // A value JSON has no form for does not stop the checks either: it is reported,
            // and the rest of the file (and its names, for the checks across files) checked.
            let mut unjson = Vec::new();
            let value = toml_to_json(toml::Value::Table(table), &mut String::new(), &mut unjson);
            let found = unjson
                .into_iter()
                .map(|(at, what)| {
                    err(
                        path,
                        format!(
                            "`{}` is a TOML {what}, which JSON has not: write it as a string",
                            echo(&at)
                        ),
                    )
                })
                .collect();
            Ok((value, found))
        }
    }
}

/// A TOML value as JSON; each value JSON has no form for (a date or time, `nan`, `inf`) is
/// left out and its place, a dotted path from the top, added to `unjson` with what it is.
fn toml_to_json(value: toml::Value, at: &mut String, unjson: &mut Vec<(String, &'static str)>) -> Value {
    let mut nested = |at: &mut String, key: &str, v: toml::Value| {
        let len = at.len();
        if !at.is_empty() {
            at.push('.');
        }
        at.push_str(key);
        let out = toml_to_json(v, at, unjson);
        at.truncate(len);
        out
    };
    match value {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f).map_or_else(
            || {
                unjson.push((at.clone(), "non-finite number"));
                Value::Null
            },
            Value::Number,
        ),
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(_) => {
            unjson.push((at.clone(), "date or time"));
            Value::Null
        }
        toml::Value::Array(items) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| nested(at, &i.to_string(), v))
                .collect(),
        ),
        toml::Value::Table(table) => Value::Object(
            table
                .into_iter()
                .map(|(k, v)| {
                    let out = nested(at, &k, v);
                    (k, out)
                })
                .collect(),
        ),
    }
}

/// Checks a manifest read as `format`, field by field, reporting every problem.
fn validate(path: &str, value: Value, format: Format) -> Result<Domain, Vec<ManifestError>> {
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

/// `description` default (SPEC §2), which says nothing of what the tools do.
pub fn default_description(name: &str) -> String {
    format!("Tools from {name} group")
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
                    "unknown field `{}` (expected one of: {})",
                    echo(key),
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
            description: meta.description.unwrap_or_else(|| default_description(&name)),
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
                "domain name `{}` is invalid: it must match ^[a-z0-9][a-z0-9_-]{{0,63}}$",
                echo(name)
            ));
        }
    }

    fn meta(&mut self, obj: &Map<String, Value>) -> Meta {
        let mut keywords = self.strings(obj, "keywords");
        for (i, k) in keywords.iter().enumerate() {
            if k.trim().is_empty() {
                self.push(format!("keyword #{} is empty or whitespace-only", i + 1));
            } else if k.len() > MAX_KEYWORD_BYTES {
                self.push(format!(
                    "keyword #{} is {} bytes, over the limit of {MAX_KEYWORD_BYTES} bytes",
                    i + 1,
                    k.len()
                ));
            }
        }
        // Keywords match ignoring case, so a keyword listed twice (in any case) is one: the
        // first spelling is kept, and a hit names it once (SPEC §4, "each once").
        let mut seen = std::collections::HashSet::new();
        keywords.retain(|k| seen.insert(k.to_lowercase()));
        let settings_keys = self.strings(obj, "settings_keys");
        for (i, k) in settings_keys.iter().enumerate() {
            if k.trim().is_empty() {
                self.push(format!("settings key #{} is empty or whitespace-only", i + 1));
            }
        }
        // A blank display name or description says nothing: the defaults stand in for it, as
        // for one left out, rather than an empty name in the texts the model reads.
        let said = |s: &String| !s.trim().is_empty();
        Meta {
            display_name: obj
                .get("display_name")
                .and_then(|v| self.string(v, "`display_name`"))
                .filter(said),
            description: obj
                .get("description")
                .and_then(|v| self.string(v, "`description`"))
                .filter(said),
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
                // The only addition is the type (SPEC §9): no empty `properties` is invented.
                let props_ok = s.get("properties").is_none_or(Value::is_object);
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
        if let Some(n) = &name
            && super::RESERVED_TOOL_NAMES.contains(&n.as_str())
        {
            self.push(format!(
                "{label}: tool name `{n}` is reserved: answers carry a meta-tool of that name"
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
                        "{label}: `tier` must be one of read, modify, destructive (got {})",
                        echo(&v.to_string())
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
                    "{prefix}unknown field `{}` (expected one of: {})",
                    echo(key),
                    allowed.join(", ")
                ));
            }
        }
    }

    /// A tool's input schema must be a valid JSON Schema (draft 2020-12 meta-schema) and its
    /// `required` lists may name only properties it defines. Returns whether it passed.
    fn check_schema(&mut self, label: &str, field: &str, schema: &Value) -> bool {
        // Every problem, each where it is: the meta-schema's, then `required` naming what
        // `properties` does not define.
        let meta = jsonschema::draft202012::meta::validator();
        let mut fine = true;
        // The meta-schema can find one problem along several of its own paths: each is told
        // once.
        let mut told = std::collections::HashSet::new();
        for e in meta.iter_errors(schema) {
            fine = false;
            let at = e.instance_path().to_string();
            let at = if at.is_empty() {
                String::new()
            } else {
                format!(" at {}", echo(&at))
            };
            let problem = format!(
                "{label}: `{field}` is not a valid JSON Schema (draft 2020-12){at}: {}",
                echo(&e.to_string())
            );
            if told.insert(problem.clone()) {
                self.push(problem);
            }
        }
        let mut missing = Vec::new();
        undefined_required(schema, "", true, &mut missing);
        for (at, name) in &missing {
            self.push(format!(
                "{label}: `{field}`{} lists `{}` in `required` but does not define it in `properties`",
                echo(at),
                echo(name)
            ));
        }
        fine && missing.is_empty()
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
        Some(name) => format!("tool #{n} `{}`", echo(name)),
        None => format!("tool #{n}"),
    }
}

#[cfg(test)]
mod tests;
