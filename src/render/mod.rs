//! Provider formats and token counts (SPEC §9): each tool rendered once per registry and
//! format, counted once with the `o200k_base` encoding, and answers assembled from those
//! bytes. Pure: no I/O.
//!
//! A format's renders are kept back to back, each tool followed by a comma, in registry
//! order (domains by name, tools in manifest order). A domain's tools are then one slice,
//! and an answer's `tools_json` is `[`, one copy per domain, and the last comma turned into
//! `]`. The native `Tool` messages are kept the same way, encoded once ([`Encoded`]).

mod gemini;
mod tokens;

use std::ops::Range;
use std::sync::OnceLock;

use bytes::{BufMut, Bytes};
use serde_json::Value;

pub use gemini::check_schema as check_gemini_schema;
pub use tokens::{count as count_tokens, warm_up};

use crate::proto;
use crate::registry::{DomainId, Registry, Tier, Tool};

/// A provider's tool format (the wire `Format` without its native value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// OpenAI Chat Completions: `{"type":"function","function":{name, description, parameters}}`.
    OpenAiChat,
    /// OpenAI Responses: `{"type":"function", name, description, parameters, "strict":false}`.
    OpenAiResponses,
    /// Anthropic Messages: `{name, description, input_schema}`.
    Anthropic,
    /// Gemini `functionDeclarations` entries, `parameters` reduced to its `Schema` object.
    Gemini,
    /// MCP `tools/list` entries: `{name, description, inputSchema, annotations}`.
    Mcp,
}

impl Format {
    /// Every format, in wire order.
    pub const ALL: [Format; 5] = [
        Format::OpenAiChat,
        Format::OpenAiResponses,
        Format::Anthropic,
        Format::Gemini,
        Format::Mcp,
    ];

    /// The name in file names, the CLI and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::OpenAiChat => "openai_chat",
            Format::OpenAiResponses => "openai_responses",
            Format::Anthropic => "anthropic",
            Format::Gemini => "gemini",
            Format::Mcp => "mcp",
        }
    }

    /// The format named `s` (as [`Format::as_str`] spells it).
    pub fn parse(s: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.as_str() == s)
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Appends `s` as a JSON string.
fn push_str(out: &mut Vec<u8>, s: &str) {
    // Writing a `str` into a `Vec` cannot fail: serde_json fails only on I/O or on
    // non-string map keys, and neither is possible here.
    serde_json::to_writer(&mut *out, s).expect("a str serialises into a Vec");
}

fn push_value(out: &mut Vec<u8>, v: &Value) {
    // As above: a `Value` always serialises into a `Vec`.
    serde_json::to_writer(&mut *out, v).expect("a Value serialises into a Vec");
}

/// One tool in one format, as compact JSON. The schema is the manifest's, verbatim (it is
/// already compact JSON), except for Gemini, whose `Schema` object is a subset (see
/// `gemini.rs`).
pub fn render(tool: &Tool, format: Format) -> Vec<u8> {
    let mut out = Vec::with_capacity(tool.input_schema_json.len() + tool.description.len() + 96);
    render_into(&mut out, tool, format);
    out
}

/// Appends `opening` (which ends with the `"name":` key), the tool's name and its
/// description: how every format starts.
fn name_and_description(out: &mut Vec<u8>, opening: &[u8], tool: &Tool) {
    out.extend_from_slice(opening);
    push_str(out, &tool.name);
    out.extend_from_slice(br#","description":"#);
    push_str(out, &tool.description);
}

fn render_into(out: &mut Vec<u8>, tool: &Tool, format: Format) {
    let schema = tool.input_schema_json.as_bytes();
    match format {
        Format::OpenAiChat => {
            name_and_description(out, br#"{"type":"function","function":{"name":"#, tool);
            out.extend_from_slice(br#","parameters":"#);
            push_openai_parameters(out, &tool.input_schema_json);
            out.extend_from_slice(b"}}");
        }
        Format::OpenAiResponses => {
            name_and_description(out, br#"{"type":"function","name":"#, tool);
            out.extend_from_slice(br#","parameters":"#);
            push_openai_parameters(out, &tool.input_schema_json);
            out.extend_from_slice(br#","strict":false}"#);
        }
        Format::Anthropic => {
            name_and_description(out, br#"{"name":"#, tool);
            out.extend_from_slice(br#","input_schema":"#);
            out.extend_from_slice(schema);
            out.push(b'}');
        }
        Format::Gemini => {
            name_and_description(out, br#"{"name":"#, tool);
            // Registry schemas are valid JSON (checked at load); one that were not would
            // only lose its parameters here.
            let parameters = serde_json::from_str::<Value>(&tool.input_schema_json)
                .ok()
                .and_then(|s| gemini::parameters(&s));
            if let Some(p) = parameters {
                out.extend_from_slice(br#","parameters":"#);
                push_value(out, &p);
            }
            out.push(b'}');
        }
        Format::Mcp => {
            name_and_description(out, br#"{"name":"#, tool);
            out.extend_from_slice(br#","inputSchema":"#);
            out.extend_from_slice(schema);
            match tool.tier {
                Tier::Read => out.extend_from_slice(br#","annotations":{"readOnlyHint":true}"#),
                Tier::Modify => {
                    out.extend_from_slice(br#","annotations":{"destructiveHint":false}"#);
                }
                Tier::Destructive => {
                    out.extend_from_slice(br#","annotations":{"destructiveHint":true}"#);
                }
                Tier::Unspecified => {}
            }
            out.push(b'}');
        }
    }
}

/// Appends a tool's schema as OpenAI takes it: verbatim, with an empty `properties` where its
/// top level has none. OpenAI refuses an object schema without `properties` ("object schema
/// missing properties"), strict mode or not, and the whole request with it; an empty one
/// constrains nothing, so the schema means what it meant.
fn push_openai_parameters(out: &mut Vec<u8>, schema: &str) {
    let has_properties = schema.contains(r#""properties""#)
        && serde_json::from_str::<Value>(schema)
            .ok()
            .and_then(|v| v.as_object().map(|o| o.contains_key("properties")))
            // A registry schema is an object (checked at load); anything else is sent as is.
            .unwrap_or(true);
    match schema.strip_suffix('}') {
        Some(open) if !has_properties => {
            out.extend_from_slice(open.as_bytes());
            if open.trim_end() != "{" {
                out.push(b',');
            }
            out.extend_from_slice(br#""properties":{}}"#);
        }
        _ => out.extend_from_slice(schema.as_bytes()),
    }
}

/// Items written back to back, and where each starts: a run of items is one shared slice.
#[derive(Debug, Clone, Default)]
struct Packed {
    bytes: Bytes,
    /// `starts[i]` is where item `i` begins; one more entry marks the end.
    starts: Vec<usize>,
}

impl Packed {
    /// Writes each item with `write`.
    fn new<T>(items: impl IntoIterator<Item = T>, mut write: impl FnMut(T, &mut Vec<u8>)) -> Packed {
        let mut bytes = Vec::new();
        let mut starts = vec![0];
        for item in items {
            write(item, &mut bytes);
            starts.push(bytes.len());
        }
        Packed {
            bytes: Bytes::from(bytes),
            starts,
        }
    }

    fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// Items `range` (shared, not copied).
    fn span(&self, range: Range<usize>) -> Bytes {
        self.bytes.slice(self.starts[range.start]..self.starts[range.end])
    }

    fn heap_bytes(&self) -> usize {
        self.bytes.len() + self.starts.capacity() * 8
    }
}

/// Tools rendered in one format: their JSON back to back, each followed by a comma, and
/// each one's token count.
#[derive(Debug, Clone, Default)]
pub struct Rendered {
    /// Every tool's JSON followed by `,`.
    packed: Packed,
    /// `token_sums[i]` is the tokens of tools `0..i`; one more entry than tools.
    token_sums: Vec<u64>,
}

impl Rendered {
    /// Renders and counts `tools` in `format`.
    pub fn new<'a>(tools: impl IntoIterator<Item = &'a Tool>, format: Format) -> Rendered {
        let mut token_sums = vec![0];
        let mut total = 0u64;
        let packed = Packed::new(tools, |t, bytes| {
            let start = bytes.len();
            render_into(bytes, t, format);
            // Rendered from `&str`s and serde_json output, so UTF-8; checked anyway rather
            // than assumed.
            let text = std::str::from_utf8(&bytes[start..]).unwrap_or_default();
            total += tokens::count(text) as u64;
            bytes.push(b',');
            token_sums.push(total);
        });
        Rendered { packed, token_sums }
    }

    /// How many tools.
    pub fn len(&self) -> usize {
        self.packed.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tool `i`'s JSON.
    pub fn tool(&self, i: usize) -> &[u8] {
        let p = &self.packed;
        &p.bytes[p.starts[i]..p.starts[i + 1] - 1]
    }

    /// Tools `range`'s JSON, each followed by a comma: a piece for [`assemble`] (shared,
    /// not copied).
    pub fn span(&self, range: Range<usize>) -> Bytes {
        self.packed.span(range)
    }

    /// Every tool, each followed by a comma.
    pub fn all(&self) -> Bytes {
        self.packed.bytes.clone()
    }

    /// The tokens of tools `range`.
    pub fn tokens(&self, range: Range<usize>) -> u32 {
        let n = self.token_sums[range.end] - self.token_sums[range.start];
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.packed.heap_bytes() + self.token_sums.capacity() * 8
    }
}

/// The length of the JSON array [`write_array`] writes for `pieces`.
pub fn array_len<P: AsRef<[u8]>>(pieces: &[P]) -> usize {
    let len: usize = pieces.iter().map(|p| p.as_ref().len()).sum();
    // `[` and `]`; the last tool's comma becomes the `]`.
    if len == 0 { 2 } else { len + 1 }
}

/// Writes a JSON array of pieces from [`Rendered::span`] (each tool followed by a comma):
/// one copy of each piece, the last comma made the closing bracket.
pub fn write_array<P: AsRef<[u8]>>(pieces: &[P], out: &mut impl BufMut) {
    out.put_u8(b'[');
    let last = pieces.iter().rposition(|p| !p.as_ref().is_empty());
    for (i, p) in pieces.iter().enumerate() {
        let p = p.as_ref();
        if Some(i) == last {
            // Every piece ends with a tool's comma.
            out.put_slice(&p[..p.len() - 1]);
        } else {
            out.put_slice(p);
        }
    }
    out.put_u8(b']');
}

/// A JSON array of pieces from [`Rendered::span`], as [`write_array`] writes it.
pub fn assemble<P: AsRef<[u8]>>(pieces: &[P]) -> Vec<u8> {
    let mut out = Vec::with_capacity(array_len(pieces));
    write_array(pieces, &mut out);
    out
}

/// The registry's tools as native `Tool` messages, encoded once, back to back in registry
/// order, each as an entry of field 1 (key, length, message): the field that holds the
/// tools in `RouteResponse` and `ListAllToolsResponse`, so a domain's tools are one slice
/// an answer writes as it is.
#[derive(Debug, Clone, Default)]
pub struct Encoded(Packed);

impl Encoded {
    /// The field number the entries are encoded for.
    pub const FIELD: u32 = 1;

    /// Encodes every tool of `registry`.
    pub fn new(registry: &Registry) -> Encoded {
        Encoded::of(
            registry
                .domains()
                .iter()
                .flat_map(|d| d.tools.iter().map(|t| (d.name.as_str(), t))),
        )
    }

    /// Encodes `tools`, each with its domain's name.
    fn of<'a>(tools: impl IntoIterator<Item = (&'a str, &'a Tool)>) -> Encoded {
        Encoded(Packed::new(tools, |(domain, t), out| {
            prost::encoding::message::encode(Self::FIELD, &native(domain, t), out);
        }))
    }

    /// Tools `range`, encoded (shared, not copied).
    pub fn span(&self, range: Range<usize>) -> Bytes {
        self.0.span(range)
    }

    /// Every tool, encoded.
    pub fn all(&self) -> Bytes {
        self.0.bytes.clone()
    }

    /// Bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.0.heap_bytes()
    }
}

/// A tool as the native `Tool` message; `domain` is empty for the meta-tools.
pub fn native(domain: &str, t: &Tool) -> proto::Tool {
    proto::Tool {
        name: t.name.clone(),
        description: t.description.clone(),
        input_schema_json: t.input_schema_json.clone(),
        domain: domain.to_string(),
        tier: t.tier.as_str().to_string(),
    }
}

/// Every tool of a registry rendered, per format: the OpenAI chat format at once (its
/// token counts are `Group.tokens` and what `check` reports), the others on first use.
/// Tools are in registry order, so [`Registry::tool_range`] gives a domain's.
#[derive(Debug)]
pub struct Renders {
    formats: [OnceLock<Rendered>; 5],
    native: OnceLock<Encoded>,
}

impl Renders {
    /// Renders the registry in the OpenAI chat format; the others wait for [`Renders::get`].
    pub fn new(registry: &Registry) -> Renders {
        let renders = Renders {
            formats: Default::default(),
            native: OnceLock::new(),
        };
        renders.get(registry, Format::OpenAiChat);
        renders
    }

    /// The registry's tools in `format`, rendered on first use. `registry` must be the one
    /// these renders were built for.
    pub fn get(&self, registry: &Registry, format: Format) -> &Rendered {
        self.formats[format.index()]
            .get_or_init(|| Rendered::new(registry.domains().iter().flat_map(|d| &d.tools), format))
    }

    /// The registry's tools as native `Tool` messages, encoded on first use. `registry` must
    /// be the one these renders were built for.
    pub fn native(&self, registry: &Registry) -> &Encoded {
        self.native.get_or_init(|| Encoded::new(registry))
    }

    /// Domain `d`'s tokens in the OpenAI chat format.
    pub fn domain_tokens(&self, registry: &Registry, d: DomainId) -> u32 {
        self.get(registry, Format::OpenAiChat)
            .tokens(registry.tool_range(d))
    }

    /// Bytes held by the formats rendered so far.
    pub fn heap_bytes(&self) -> usize {
        let formats: usize = self
            .formats
            .iter()
            .filter_map(OnceLock::get)
            .map(Rendered::heap_bytes)
            .sum();
        formats + self.native.get().map_or(0, Encoded::heap_bytes)
    }
}

/// A short list of tools (the meta-tools of one settings snapshot) rendered per format on
/// first use.
#[derive(Debug, Default)]
pub struct LazyRenders {
    formats: [OnceLock<Rendered>; 5],
    native: OnceLock<Encoded>,
}

impl LazyRenders {
    /// `tools` as native `Tool` entries (without a domain), encoded on the first call;
    /// later calls must pass the same tools.
    pub fn native<'a>(&self, tools: impl FnOnce() -> Vec<&'a Tool>) -> Bytes {
        self.native
            .get_or_init(|| Encoded::of(tools().into_iter().map(|t| ("", t))))
            .all()
    }

    /// `tools` in `format`, rendered on the first call for that format; later calls must
    /// pass the same tools.
    pub fn get<'a>(&self, format: Format, tools: impl FnOnce() -> Vec<&'a Tool>) -> &Rendered {
        self.formats[format.index()].get_or_init(|| Rendered::new(tools(), format))
    }
}

#[cfg(test)]
mod tests;
