//! Property tests for the pure core: manifest loading, keyword matching and the route decision.
//!
//! Expected facts are computed here from SPEC §2 and §4 (activity from the settings rows,
//! keyword hits from a plain re-statement of the matching rule), never from the library's own
//! derived lists, so the properties check the library against the contract.
//!
//! Failure persistence is off: a failing case is printed (minimal, after shrinking) but not
//! written next to the sources.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::OnceLock;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, subsequence};
use serde_json::{Map, Value, json};

use toolrouter::matcher::{MatchMode, Matcher};
use toolrouter::registry::{Domain, Registry, Tier, Tool, manifest};
use toolrouter::router::{
    Activation, Conversation, Decision, FallbackPolicy, Inputs, Member, Options, Reason, route,
};
use toolrouter::router::{DISABLED_TOOLS_KEY, Patterns, Profile, Snapshot};
use toolrouter::search::{SearchIndex, SearchMode, SearchOptions};

/// `cases` cases, a cheap RNG, and no regression files written into the source tree.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        // ChaCha costs most of the run time in a debug build; XorShift is plenty here.
        rng_algorithm: proptest::test_runner::RngAlgorithm::XorShift,
        ..ProptestConfig::with_cases(cases)
    }
}

// ---------------------------------------------------------------------------------------------
// The matching rule of SPEC §4, restated plainly (slow, obviously correct): the oracle.
// ---------------------------------------------------------------------------------------------

const SUFFIXES: &[&str] = &["", "s", "es", "ing", "ed", "er", "ers"];
const E_SUFFIXES: &[&str] = &["d", "r", "rs"];
const Y_STEM_SUFFIXES: &[&str] = &["ies", "ied", "ying"];
const E_STEM_SUFFIXES: &[&str] = &["ing"];

/// Every byte offset where `pattern` starts in `text`, overlapping ones included.
fn occurrences(text: &str, pattern: &str) -> Vec<usize> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(p) = text[from..].find(pattern) {
        let at = from + p;
        found.push(at);
        match text[at..].chars().next() {
            Some(c) => from = at + c.len_utf8(),
            None => break,
        }
    }
    found
}

fn not_letter_or_digit(c: char) -> bool {
    !c.is_alphanumeric()
}

/// Whether the keyword (lowercased) hits the message (lowercased) under SPEC §4.
fn spec_hit(message: &str, keyword: &str, mode: MatchMode) -> bool {
    if keyword.is_empty() {
        return false;
    }
    if mode == MatchMode::Substring {
        return message.contains(keyword);
    }
    let mut forms: Vec<(&str, Vec<&str>)> = Vec::new();
    let mut endings = SUFFIXES.to_vec();
    if keyword.ends_with('e') {
        endings.extend_from_slice(E_SUFFIXES);
    }
    forms.push((keyword, endings));
    if let Some(stem) = keyword.strip_suffix('y')
        && stem
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphabetic() && !"aeiouy".contains(c))
    {
        forms.push((stem, Y_STEM_SUFFIXES.to_vec()));
    }
    if let Some(stem) = keyword.strip_suffix('e')
        && !stem.is_empty()
    {
        forms.push((stem, E_STEM_SUFFIXES.to_vec()));
    }
    forms.iter().any(|(form, endings)| {
        occurrences(message, form).into_iter().any(|at| {
            let before_ok = message[..at].chars().next_back().is_none_or(not_letter_or_digit);
            let rest = &message[at + form.len()..];
            before_ok
                && endings.iter().any(|e| {
                    rest.strip_prefix(e)
                        .is_some_and(|r| r.chars().next().is_none_or(not_letter_or_digit))
                })
        })
    })
}

/// Keyword ids (registry order: domain by name, then manifest order) that the oracle says
/// hit `message`, regardless of domain.
fn spec_keyword_hits(registry: &Registry, message: &str, mode: MatchMode) -> Vec<usize> {
    let lower = message.to_lowercase();
    registry
        .keywords()
        .enumerate()
        .filter(|(_, k)| spec_hit(&lower, &k.to_lowercase(), mode))
        .map(|(i, _)| i)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 1. Manifest loading never panics.
// ---------------------------------------------------------------------------------------------

const FIELD_NAMES: &[&str] = &[
    "name",
    "display_name",
    "description",
    "settings_keys",
    "keywords",
    "core",
    "fallback",
    "tools",
    "tier",
    "input_schema",
    "parameters",
    "properties",
    "required",
    "type",
    "_meta",
    "function",
    "timeoutSeconds",
    "requiredPermissions",
];

const ODD_STRINGS: &[&str] = &[
    "",
    " ",
    "\t\n",
    "\u{3000}",
    "read",
    "modify",
    "destructive",
    "write",
    "READ",
    "object",
    "array",
    "string",
    "media",
    "Media",
    "a b",
    "a",
    "0",
    "-x",
    "_",
    "t0",
    "t1",
    "é",
    "İ",
    "ẞ",
    "灯",
    "🔥",
    "\u{feff}",
    "\0",
    "\u{301}",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
];

fn odd_string() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(ODD_STRINGS).prop_map(String::from),
        2 => "[a-z0-9_-]{0,10}",
        1 => ".{0,12}",
    ]
}

fn json_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(FIELD_NAMES).prop_map(String::from),
        1 => "[a-zA-Z_]{0,8}",
    ]
}

/// Any JSON value, with the manifest field names as most object keys.
fn any_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        odd_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            vec((json_key(), inner), 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
    .boxed()
}

/// A field: usually present, usually of the right type, sometimes anything at all.
fn field(typed: impl Strategy<Value = Value> + 'static) -> BoxedStrategy<Option<Value>> {
    proptest::option::weighted(0.75, prop_oneof![6 => typed, 1 => any_json()]).boxed()
}

fn string_value() -> impl Strategy<Value = Value> {
    odd_string().prop_map(Value::String)
}

fn strings_value() -> impl Strategy<Value = Value> {
    vec(odd_string(), 0..4).prop_map(|v| json!(v))
}

fn bool_value() -> impl Strategy<Value = Value> {
    any::<bool>().prop_map(Value::Bool)
}

fn tool_name_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => select(&["t0", "t1", "t2"][..]).prop_map(|s| json!(s)),
        1 => "[a-zA-Z0-9_-]{1,8}".prop_map(Value::String),
        1 => string_value(),
    ]
}

fn tier_value() -> impl Strategy<Value = Value> {
    select(&["read", "modify", "destructive", "write", "Read"][..]).prop_map(|s| json!(s))
}

fn object(fields: Vec<(&str, Option<Value>)>, extra: Option<(String, Value)>) -> Value {
    let mut obj: Map<String, Value> = fields
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
        .collect();
    if let Some((k, v)) = extra {
        obj.insert(k, v);
    }
    Value::Object(obj)
}

fn native_tool() -> BoxedStrategy<Value> {
    let schema = prop_oneof![
        Just(json!({"type": "object", "properties": {}})),
        any_json().prop_map(|p| json!({"type": "object", "properties": p})),
        any_json(),
    ];
    (
        field(tool_name_value()),
        field(string_value()),
        field(tier_value()),
        field(schema),
        proptest::option::weighted(0.1, (json_key(), any_json())),
    )
        .prop_map(|(name, description, tier, schema, extra)| {
            object(
                vec![
                    ("name", name),
                    ("description", description),
                    ("tier", tier),
                    ("input_schema", schema),
                ],
                extra,
            )
        })
        .boxed()
}

fn native_manifest() -> BoxedStrategy<Value> {
    let name = prop_oneof![
        3 => select(&["media", "lights", "a", "x-y_z"][..]).prop_map(|s| json!(s)),
        1 => string_value(),
    ];
    (
        field(name),
        field(string_value()),
        field(string_value()),
        field(strings_value()),
        field(strings_value()),
        field(bool_value()),
        field(bool_value()),
        field(vec(native_tool(), 0..4).prop_map(Value::Array)),
        proptest::option::weighted(0.1, (json_key(), any_json())),
    )
        .prop_map(
            |(name, display, description, keys, keywords, core, fallback, tools, extra)| {
                object(
                    vec![
                        ("name", name),
                        ("display_name", display),
                        ("description", description),
                        ("settings_keys", keys),
                        ("keywords", keywords),
                        ("core", core),
                        ("fallback", fallback),
                        ("tools", tools),
                    ],
                    extra,
                )
            },
        )
        .boxed()
}

fn group_tool() -> BoxedStrategy<Value> {
    let parameters = prop_oneof![
        any_json().prop_map(|p| json!({"properties": p})),
        (any_json(), vec(odd_string(), 0..3))
            .prop_map(|(p, r)| json!({"type": "object", "properties": p, "required": r})),
        any_json(),
    ];
    (
        field(tool_name_value()),
        field(string_value()),
        field(tier_value()),
        field(parameters),
        proptest::option::weighted(0.2, (json_key(), any_json())),
    )
        .prop_map(|(name, description, tier, parameters, extra)| {
            object(
                vec![
                    ("name", name),
                    ("description", description),
                    ("tier", tier),
                    ("parameters", parameters),
                ],
                extra,
            )
        })
        .boxed()
}

fn group_array() -> BoxedStrategy<Value> {
    let flag = prop_oneof![4 => Just(json!(true)), 1 => any_json()];
    let meta = (
        field(flag),
        field(string_value()),
        field(string_value()),
        field(strings_value()),
        field(strings_value()),
        field(bool_value()),
        field(bool_value()),
    )
        .prop_map(|(flag, display, description, keys, keywords, core, fallback)| {
            object(
                vec![
                    ("_meta", flag),
                    ("display_name", display),
                    ("description", description),
                    ("settings_keys", keys),
                    ("keywords", keywords),
                    ("core", core),
                    ("fallback", fallback),
                ],
                None,
            )
        });
    (
        proptest::option::weighted(0.6, meta),
        vec(group_tool(), 0..4),
        proptest::option::weighted(0.1, (any::<prop::sample::Index>(), any_json())),
    )
        .prop_map(|(meta, tools, stray)| {
            let mut items: Vec<Value> = meta.into_iter().chain(tools).collect();
            if let Some((at, v)) = stray {
                items.insert(at.index(items.len() + 1), v);
            }
            Value::Array(items)
        })
        .boxed()
}

/// How a generated document is turned into bytes.
#[derive(Debug, Clone)]
enum Mutation {
    None,
    Truncate(prop::sample::Index),
    Insert(prop::sample::Index, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        6 => Just(Mutation::None),
        1 => any::<prop::sample::Index>().prop_map(Mutation::Truncate),
        1 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
    ]
}

fn mutate(text: &str, m: &Mutation) -> String {
    let mut bytes = text.as_bytes().to_vec();
    match m {
        Mutation::None => {}
        Mutation::Truncate(i) => bytes.truncate(i.index(bytes.len() + 1)),
        Mutation::Insert(i, b) => bytes.insert(i.index(bytes.len() + 1), *b),
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

const DEMO_JSON: &str = include_str!("../src/registry/demo/jellyfin.json");
const DEMO_GROUP: &str = include_str!("../src/registry/demo/docker.json");
const DEMO_TOML: &str = include_str!("../src/registry/demo/home_assistant.toml");

/// A manifest that is valid on its own, so that loads succeed often enough for the
/// cross-file checks (duplicate domains and tools) and the success path to be exercised.
fn clean_native() -> BoxedStrategy<Value> {
    (
        select(&["media", "lights", "a", "x-y_z", "b0"][..]),
        subsequence(VOCAB, 0..3),
        subsequence(KEYS, 0..2),
        any::<bool>(),
        any::<bool>(),
        vec(
            (
                select(&["t0", "t1", "t2", "t3"][..]),
                select(&["read", "modify", "destructive"][..]),
            ),
            0..3,
        ),
    )
        .prop_map(|(name, keywords, keys, core, fallback, tools)| {
            let tools: Vec<Value> = tools
                .into_iter()
                .map(|(n, tier)| json!({"name": n, "description": "D", "tier": tier}))
                .collect();
            json!({
                "name": name, "keywords": keywords, "settings_keys": keys,
                "core": core, "fallback": fallback, "tools": tools,
            })
        })
        .boxed()
}

fn clean_group() -> BoxedStrategy<Value> {
    (
        subsequence(VOCAB, 0..3),
        any::<bool>(),
        vec(select(&["t0", "t1", "t2", "t3"][..]), 0..3),
    )
        .prop_map(|(keywords, with_meta, tools)| {
            let meta = json!({"_meta": true, "display_name": "G", "keywords": keywords});
            let tools = tools.into_iter().map(|n| {
                json!({"name": n, "description": "D", "parameters": {"properties": {}, "required": []},
                       "function": "x", "timeoutSeconds": 3})
            });
            Value::Array(with_meta.then_some(meta).into_iter().chain(tools).collect())
        })
        .boxed()
}

/// One (path, text): a generated document rendered as the path's format (now and then as
/// the other one), a real manifest, raw bytes or short text; maybe mutated afterwards.
fn manifest_source() -> BoxedStrategy<(String, String)> {
    let document = prop_oneof![
        3 => clean_native(),
        1 => clean_group(),
        3 => native_manifest(),
        1 => group_array(),
        1 => any_json(),
    ];
    let rendered = (manifest_path(), document, 0..8u8).prop_map(|(path, v, how)| {
        let text = if path.ends_with(".toml") && how < 6 {
            // TOML cannot hold nulls or a top-level array; JSON text is written then.
            toml::to_string(&v).unwrap_or_else(|_| v.to_string())
        } else if how % 2 == 0 {
            v.to_string()
        } else {
            serde_json::to_string_pretty(&v).unwrap_or_default()
        };
        (path, text)
    });
    let demo = select(&[DEMO_JSON, DEMO_GROUP, DEMO_TOML][..]).prop_map(String::from);
    let raw = vec(any::<u8>(), 0..256).prop_map(|b| String::from_utf8_lossy(&b).into_owned());
    let short = (any::<bool>(), ".{0,40}").prop_map(|(bom, t)| if bom { format!("\u{feff}{t}") } else { t });
    let text = prop_oneof![2 => demo, 2 => raw, 1 => short];
    prop_oneof![
        8 => (rendered, mutation()).prop_map(|((p, t), m)| (p, mutate(&t, &m))),
        3 => (manifest_path(), text, mutation()).prop_map(|(p, t, m)| (p, mutate(&t, &m))),
    ]
    .boxed()
}

fn manifest_path() -> impl Strategy<Value = String> {
    (
        select(&["", "m/", "/srv/manifests/", "ä/"][..]),
        select(
            &[
                "media", "lights", "a", "docker", "Bad", "a b", "é", "x.y", "_x", "0", "-", "",
            ][..],
        ),
        select(&[".json", ".toml"][..]),
    )
        .prop_map(|(dir, stem, ext)| format!("{dir}{stem}{ext}"))
}

fn load(sources: &[(String, String)]) -> Result<Registry, toolrouter::error::ManifestErrors> {
    Registry::from_sources(sources.iter().map(|(p, t)| (p.as_str(), t.as_str())))
}

fn check_loader(sources: &[(String, String)]) -> Result<(), TestCaseError> {
    let result = load(sources);
    match &result {
        Err(errors) => {
            prop_assert!(!errors.0.is_empty(), "rejected without any error");
            for e in &errors.0 {
                // Two sources may share a path; the error belongs to one of them.
                let texts: Vec<&str> = sources
                    .iter()
                    .filter(|(p, _)| *p == e.path)
                    .map(|(_, t)| t.as_str())
                    .collect();
                prop_assert!(!texts.is_empty(), "error does not name a given path: {e}");
                prop_assert!(e.to_string().starts_with(&e.path), "shown without its path: {e}");
                if let Some((line, col)) = e.position {
                    prop_assert!(line >= 1 && col >= 1, "positions are 1-based: {e}");
                    let within = |text: &str| {
                        let lines: Vec<&str> = text.split('\n').collect();
                        line <= lines.len() && col <= lines[line - 1].chars().count() + 1
                    };
                    prop_assert!(texts.iter().any(|t| within(t)), "position past the text: {e}");
                }
            }
            let _ = errors.to_string();
        }
        Ok(registry) => {
            prop_assert_eq!(registry.domains().len(), sources.len(), "one domain per file");
            let mut tools = HashSet::new();
            for (i, d) in registry.domains().iter().enumerate() {
                prop_assert!(manifest::valid_domain_name(&d.name), "{:?}", d.name);
                if i > 0 {
                    prop_assert!(registry.domains()[i - 1].name < d.name, "sorted, unique");
                }
                prop_assert!(d.keywords.iter().all(|k| !k.trim().is_empty()));
                for t in &d.tools {
                    prop_assert!(manifest::valid_tool_name(&t.name), "{:?}", t.name);
                    prop_assert!(tools.insert(t.name.clone()), "tool {} twice", t.name);
                    let schema: Value = serde_json::from_str(&t.input_schema_json)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(&schema["type"], &json!("object"));
                }
            }
        }
    }
    match (result, load(sources)) {
        (Ok(a), Ok(b)) => prop_assert_eq!(a.version(), b.version()),
        (Err(a), Err(b)) => prop_assert_eq!(a, b),
        _ => prop_assert!(false, "loading the same files twice disagreed"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn arbitrary_manifest_bytes_never_panic_the_loader(
        sources in vec(manifest_source(), 1..4)
    ) {
        check_loader(&sources)?;
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Arbitrary messages never panic `route`, over a fixed registry.
// ---------------------------------------------------------------------------------------------

/// Domains added to the demo registry: keywords whose case mapping changes their length or
/// needs context, and keywords made of punctuation, spaces and stems.
const EXTRA_MANIFESTS: &[(&str, &str)] = &[
    (
        "unicode.json",
        r#"{"name":"unicode","keywords":["straße","İstanbul","灯","café","ΟΔΟΣ","🔥","naïve","ǅemal","e\u0301clair","ﬁle"],
           "tools":[{"name":"unicode_t","description":"U"}]}"#,
    ),
    (
        "words.toml",
        "name = \"words\"\nkeywords = [\"entity\", \"queue\", \"vault\", \"a.b\", \"c++\", \"x  y\", \"-\", \"ey\", \"e\"]\n\
         [[tools]]\nname = \"words_t\"\ndescription = \"W\"\n",
    ),
];

struct Fixed {
    registry: Registry,
    word: Matcher,
    substring: Matcher,
    index: SearchIndex,
    activation: Activation,
    keywords: Vec<String>,
}

fn fixed() -> &'static Fixed {
    static FIXED: OnceLock<Fixed> = OnceLock::new();
    FIXED.get_or_init(|| {
        let mut domains = Registry::demo().domains().to_vec();
        for (path, text) in EXTRA_MANIFESTS {
            domains.push(manifest::parse(path, text).expect("extra manifest is valid"));
        }
        let registry = Registry::new(domains).expect("extra manifests fit the demo");
        let every_key_set = Snapshot::new(
            registry
                .domains()
                .iter()
                .flat_map(|d| d.settings_keys.iter().map(|k| (k.clone(), "set".to_string()))),
        );
        Fixed {
            word: Matcher::new(registry.keywords(), MatchMode::Word).unwrap(),
            substring: Matcher::new(registry.keywords(), MatchMode::Substring).unwrap(),
            activation: Activation::new(&registry, &every_key_set),
            index: SearchIndex::new(&registry),
            keywords: registry.keywords().map(String::from).collect(),
            registry,
        }
    })
}

const MAX_MESSAGE: usize = 65_536;

/// Cuts to at most [`MAX_MESSAGE`] bytes, on a character boundary.
fn cap(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut at = MAX_MESSAGE;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

const TRICKY_CHARS: &[char] = &[
    'İ',
    'ẞ',
    'ß',
    'Σ',
    'ς',
    'K',
    'Å',
    'Ω',
    'ǅ',
    'ﬁ',
    'ŉ',
    'I',
    'ı',
    '\u{200d}',
    '\u{fe0f}',
    '\u{feff}',
    '\u{0}',
    '\u{301}',
    '\u{307}',
    '\u{3000}',
    '\u{a0}',
    '\u{10ffff}',
    'Ⅻ',
    '٣',
];

fn any_char_mix() -> impl Strategy<Value = char> {
    prop_oneof![
        3 => any::<char>(),
        2 => proptest::char::range('\u{1F300}', '\u{1FAFF}'),
        2 => proptest::char::range('\u{4E00}', '\u{9FFF}'),
        1 => proptest::char::range('\u{3040}', '\u{30FF}'),
        2 => proptest::char::range('\u{0300}', '\u{036F}'),
        3 => select(TRICKY_CHARS),
        3 => proptest::char::range('a', 'z'),
        2 => proptest::char::range('A', 'Z'),
        2 => select(&[' ', '-', '.', ',', '!', '?', '\n', '_', '\''][..]),
    ]
}

fn unicode_text(max_chars: usize) -> impl Strategy<Value = String> {
    vec(any_char_mix(), 0..max_chars).prop_map(|cs| cs.into_iter().collect())
}

/// Text made of the registry's own keywords, re-cased, with suffixes and punctuation.
fn keyword_text() -> impl Strategy<Value = String> {
    let keyword = select(fixed().keywords.clone());
    let casing = 0..4u8;
    let glue = select(
        &[
            " ", ", ", ".", "!", "-", "_", "'", "(", ")", "", "\u{200d}", "\u{301}", "s", "es", "ing", "ed",
            "er", "ers", "ies", "ied", "ying", "d", "r", "rs", "İ", "ẞ", "灯", "🔥", "2", "\n",
        ][..],
    );
    vec((keyword, casing, glue), 0..10).prop_map(|parts| {
        let mut s = String::new();
        for (k, casing, glue) in parts {
            match casing {
                0 => s.push_str(&k),
                1 => s.push_str(&k.to_uppercase()),
                2 => {
                    for (i, c) in k.chars().enumerate() {
                        if i % 2 == 0 {
                            s.extend(c.to_uppercase());
                        } else {
                            s.push(c);
                        }
                    }
                }
                _ => {
                    s.push_str(&k);
                    s.pop();
                }
            }
            s.push_str(glue);
        }
        s
    })
}

/// Mostly short messages; now and then up to [`MAX_MESSAGE`] bytes.
fn message() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => unicode_text(48),
        8 => keyword_text(),
        2 => any::<String>(),
        1 => (prop_oneof![keyword_text(), unicode_text(16)], 1..8192usize)
            .prop_map(|(s, n)| cap(s.repeat(n))),
        1 => (unicode_text(4096), 1..64usize).prop_map(|(s, n)| cap(s.repeat(n))),
    ]
}

fn check_decision_bounds(registry: &Registry, d: &Decision) -> Result<(), TestCaseError> {
    let total = registry.keywords().count();
    prop_assert!(
        d.keywords.windows(2).all(|w| w[0] < w[1]),
        "keywords sorted, unique"
    );
    prop_assert!(
        d.keywords.iter().all(|&k| k.index() < total),
        "keyword id out of range"
    );
    for inc in &d.domains {
        prop_assert!(inc.domain.index() < registry.domains().len());
        prop_assert!(
            inc.matched.start <= inc.matched.end && inc.matched.end <= d.keywords.len(),
            "matched range {:?} outside {} keywords",
            inc.matched,
            d.keywords.len()
        );
        for &k in d.matched(inc) {
            prop_assert_eq!(registry.keyword_domain(k), inc.domain);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(384))]

    #[test]
    fn arbitrary_messages_never_panic_route(message in message()) {
        prop_assert!(message.len() <= MAX_MESSAGE);
        let f = fixed();
        let lower = message.to_lowercase();
        let conversation = Conversation {
            members: vec![
                Member { domain: "sonarr".into(), loaded: true, hit: false },
                Member { domain: "gone".into(), loaded: false, hit: true },
            ],
        };
        for matcher in [&f.word, &f.substring] {
            for fallback in [FallbackPolicy::AllActive, FallbackPolicy::CoreOnly] {
                let options = Options { fallback, ..Options::default() };
                let inputs = Inputs { registry: &f.registry, matcher, index: &f.index };
                for c in [None, Some(&conversation)] {
                    let d = route(inputs, &f.activation, c, &message, &options);
                    check_decision_bounds(&f.registry, &d)?;
                    prop_assert_eq!(
                        d.tools(&f.registry, &f.activation).count(),
                        d.tool_count(&f.registry, &f.activation),
                        "the answer is sized exactly"
                    );
                    if matcher.mode() == MatchMode::Substring {
                        for &k in &d.keywords {
                            let kw = f.registry.keyword(k).to_lowercase();
                            prop_assert!(
                                lower.contains(&kw),
                                "{:?} reported, but not in the lowercased message", kw
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_matcher_finds_exactly_the_keywords_the_spec_rule_finds(message in message()) {
        let f = fixed();
        for matcher in [&f.word, &f.substring] {
            let got: Vec<usize> = matcher.find(&message).iter().map(|k| k.index()).collect();
            let want = spec_keyword_hits(&f.registry, &message, matcher.mode());
            let name = |ids: &[usize]| -> Vec<String> {
                let keywords: Vec<&str> = f.registry.keywords().collect();
                ids.iter().map(|&k| keywords[k].to_string()).collect()
            };
            prop_assert_eq!(
                name(&got), name(&want),
                "{:?} mode in {:?}", matcher.mode(), message
            );
        }
    }
}

/// Letters whose case mapping is irregular (length changes, context, folding to ASCII), the
/// letters the suffix rules look at, and separators.
const KEYWORD_ALPHABET: &[&str] = &[
    "a", "e", "y", "s", "i", "d", "r", "n", "g", "İ", "ı", "ẞ", "ß", "Σ", "σ", "ς", "K", "k", "É", "é",
    "e\u{301}", "灯", "🔥", " ", "-", ".",
];

fn random_keyword() -> impl Strategy<Value = String> {
    vec(select(KEYWORD_ALPHABET), 1..5)
        .prop_map(|parts| parts.concat())
        .prop_filter("a keyword is not blank (manifests reject it)", |k| {
            !k.trim().is_empty()
        })
}

/// Keywords, and a message made of them (re-cased, with endings) and of the same alphabet.
fn random_keywords_and_message() -> impl Strategy<Value = (Vec<String>, String)> {
    vec(random_keyword(), 1..6).prop_flat_map(|keywords| {
        let piece = prop_oneof![
            2 => (select(keywords.clone()), any::<bool>()).prop_map(|(k, upper)| {
                if upper { k.to_uppercase() } else { k }
            }),
            2 => select(KEYWORD_ALPHABET).prop_map(String::from),
            1 => select(&["s", "es", "ing", "ed", "ers", "d", "rs", "ies", "ying", "x", "1"][..])
                .prop_map(String::from),
        ];
        (Just(keywords), vec(piece, 0..10).prop_map(|p| p.concat()))
    })
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn the_matcher_agrees_with_the_spec_rule_for_random_keywords(
        (keywords, message) in random_keywords_and_message()
    ) {
        let lower = message.to_lowercase();
        for mode in [MatchMode::Word, MatchMode::Substring] {
            let matcher = Matcher::new(keywords.iter().map(String::as_str), mode).unwrap();
            let got: Vec<&str> = matcher.find(&message).into_iter().map(|k| keywords[k.index()].as_str()).collect();
            let want: Vec<&str> = keywords
                .iter()
                .filter(|k| spec_hit(&lower, &k.to_lowercase(), mode))
                .map(String::as_str)
                .collect();
            prop_assert_eq!(got, want, "{:?} mode, message {:?}", mode, message);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Routing invariants over random registries, settings, conversations and messages.
// ---------------------------------------------------------------------------------------------

const VOCAB: &[&str] = &[
    "light",
    "movie",
    "film",
    "seed",
    "queue",
    "library",
    "dns",
    "vault",
    "vaultwarden",
    "scan library",
    "pi-hole",
    "hörbuch",
    "灯",
    "straße",
];
const KEYS: &[&str] = &["k1", "k2", "k3", "k4"];
const VALUES: &[&str] = &["", " ", "\t\u{3000}", "\u{a0}\n", "x", " y ", "0"];
const UNKNOWN_MEMBERS: &[&str] = &["zzz", "gone"];

#[derive(Debug, Clone)]
struct DomainSpec {
    keywords: Vec<&'static str>,
    settings_keys: Vec<&'static str>,
    core: bool,
    fallback: bool,
    tools: usize,
}

#[derive(Debug, Clone)]
struct Scenario {
    names: Vec<String>,
    domains: Vec<DomainSpec>,
    /// `(key, value)` rows of the settings table.
    settings: Vec<(String, String)>,
    /// Members, each name at most once, in join order.
    conversation: Option<Vec<Member>>,
    message: String,
    expose_load_tool_group: bool,
}

fn domain_spec() -> impl Strategy<Value = DomainSpec> {
    (
        subsequence(VOCAB, 0..=4).prop_shuffle(),
        subsequence(KEYS, 0..=2).prop_shuffle(),
        proptest::bool::weighted(0.25),
        any::<bool>(),
        0..=3usize,
    )
        .prop_map(|(keywords, settings_keys, core, fallback, tools)| DomainSpec {
            keywords,
            settings_keys,
            core,
            fallback,
            tools,
        })
}

fn vocab_message() -> impl Strategy<Value = String> {
    let word = prop_oneof![
        4 => (select(VOCAB), select(&["", "", "", "s", "es", "ing", "ed", "er", "ers", "d"][..]), any::<bool>())
            .prop_map(|(w, suffix, upper)| {
                let w = format!("{w}{suffix}");
                if upper { w.to_uppercase() } else { w }
            }),
        2 => select(
            &[
                "hi", "the", "x", "ligh", "highlight", "(film)", "vaultwarden.", "libraries",
                "queuing", "queued", "seeding", "HÖRBUCH", "STRAẞE", "🔥", "é", "pi hole",
            ][..],
        )
        .prop_map(String::from),
    ];
    let sep = select(&[" ", " ", ", ", "-", "", ".", "\n"][..]);
    vec((word, sep), 0..7).prop_map(|parts| parts.into_iter().map(|(w, s)| format!("{w}{s}")).collect())
}

fn scenario() -> impl Strategy<Value = Scenario> {
    proptest::collection::btree_set("[a-e]{1,3}", 1..12).prop_flat_map(|names| {
        let names: Vec<String> = names.into_iter().collect();
        let mut member_names = names.clone();
        member_names.extend(UNKNOWN_MEMBERS.iter().map(|s| s.to_string()));
        let members = vec((select(member_names), any::<bool>(), any::<bool>()), 0..6);
        (
            vec(domain_spec(), names.len()),
            vec(proptest::option::of(select(VALUES)), KEYS.len()),
            proptest::option::of(members),
            vocab_message(),
            any::<bool>(),
            Just(names),
        )
            .prop_map(|(domains, values, members, message, expose, names)| {
                let settings = KEYS
                    .iter()
                    .zip(values)
                    .filter_map(|(k, v)| v.map(|v| (k.to_string(), v.to_string())))
                    .collect();
                let conversation = members.map(|ms| {
                    let mut seen = HashSet::new();
                    ms.into_iter()
                        .filter(|(n, _, _)| seen.insert(n.clone()))
                        .map(|(domain, loaded, hit)| Member { domain, loaded, hit })
                        .collect()
                });
                Scenario {
                    names,
                    domains,
                    settings,
                    conversation,
                    message,
                    expose_load_tool_group: expose,
                }
            })
    })
}

fn build_registry(s: &Scenario) -> Registry {
    let domains = s
        .names
        .iter()
        .zip(&s.domains)
        .map(|(name, d)| Domain {
            name: name.clone(),
            display_name: name.clone(),
            description: format!("Tools from {name} group"),
            settings_keys: d.settings_keys.iter().map(|k| k.to_string()).collect(),
            keywords: d.keywords.iter().map(|k| k.to_string()).collect(),
            core: d.core,
            fallback: d.fallback,
            tools: (0..d.tools)
                .map(|i| Tool {
                    name: format!("{name}_t{i}"),
                    description: format!("tool {i} of {name}"),
                    input_schema_json: r#"{"type":"object","properties":{}}"#.to_string(),
                    tier: Tier::Read,
                })
                .collect(),
            source: format!("{name}.json"),
        })
        .collect();
    Registry::new(domains).expect("generated names are unique")
}

/// A scenario's registry, built with what routing over it needs (keywords in word mode) and
/// activated by its settings.
struct Built {
    registry: Registry,
    activation: Activation,
    matcher: Matcher,
    index: SearchIndex,
}

impl Built {
    fn new(s: &Scenario) -> Built {
        let registry = build_registry(s);
        Built {
            activation: Activation::new(&registry, &Snapshot::new(s.settings.clone())),
            matcher: Matcher::new(registry.keywords(), MatchMode::Word).unwrap(),
            index: SearchIndex::new(&registry),
            registry,
        }
    }

    fn inputs(&self) -> Inputs<'_> {
        Inputs {
            registry: &self.registry,
            matcher: &self.matcher,
            index: &self.index,
        }
    }
}

/// What the spec says about one (registry, settings, message, mode), computed here.
struct Facts {
    active: Vec<bool>,
    by_name: HashMap<String, usize>,
    /// Ids of keywords that hit an active non-core domain, ascending.
    keywords: Vec<usize>,
    /// Active non-core domains with a keyword hit.
    hits: BTreeSet<usize>,
    /// `owner[k]` is the domain of keyword `k`.
    owner: Vec<usize>,
    /// Whether an active core domain has a keyword hit (it routes the message: no fallback).
    core_hit: bool,
}

/// Keyword routing only (`--search off`): what the model below describes.
fn keywords_only(fallback: FallbackPolicy, expose_load_tool_group: bool) -> Options {
    Options {
        fallback,
        expose_load_tool_group,
        search: SearchOptions {
            mode: SearchMode::Off,
            ..SearchOptions::default()
        },
        ..Options::default()
    }
}

fn facts(registry: &Registry, settings: &[(String, String)], message: &str, mode: MatchMode) -> Facts {
    let values: HashMap<&str, &str> = settings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let active: Vec<bool> = registry
        .domains()
        .iter()
        .map(|d| {
            d.settings_keys.is_empty()
                || d.settings_keys
                    .iter()
                    .any(|k| values.get(k.as_str()).is_some_and(|v| !v.trim().is_empty()))
        })
        .collect();
    let mut owner = Vec::new();
    for (i, d) in registry.domains().iter().enumerate() {
        owner.extend(std::iter::repeat_n(i, d.keywords.len()));
    }
    let countable = |d: usize| active[d] && !registry.domains()[d].core;
    let all_hits = spec_keyword_hits(registry, message, mode);
    let core_hit = all_hits
        .iter()
        .any(|&k| active[owner[k]] && registry.domains()[owner[k]].core);
    let keywords: Vec<usize> = all_hits.into_iter().filter(|&k| countable(owner[k])).collect();
    let hits = keywords.iter().map(|&k| owner[k]).collect();
    let by_name = registry
        .domains()
        .iter()
        .enumerate()
        .map(|(i, d)| (d.name.clone(), i))
        .collect();
    Facts {
        active,
        by_name,
        keywords,
        hits,
        owner,
        core_hit,
    }
}

/// One routed turn and everything a property needs to judge it.
struct Turn<'a> {
    registry: &'a Registry,
    activation: &'a Activation,
    facts: &'a Facts,
    policy: FallbackPolicy,
    expose: bool,
    conversation: Option<&'a Conversation>,
    decision: Decision,
}

impl Turn<'_> {
    fn name(&self, d: usize) -> &str {
        &self.registry.domains()[d].name
    }

    fn has_tools(&self, d: usize) -> bool {
        !self.registry.domains()[d].tools.is_empty()
    }

    fn is_core(&self, d: usize) -> bool {
        self.registry.domains()[d].core
    }

    /// Domains sorted by name.
    fn by_name(&self, mut ids: Vec<usize>) -> Vec<usize> {
        ids.sort_by(|&a, &b| self.name(a).cmp(self.name(b)));
        ids
    }

    fn all(&self) -> Vec<usize> {
        self.by_name((0..self.registry.domains().len()).collect())
    }

    /// Members that exist, are active and are not core, with their domain.
    fn live_members(&self) -> Vec<(usize, &Member)> {
        self.conversation
            .map(|c| {
                c.members
                    .iter()
                    .filter_map(|m| self.facts.by_name.get(&m.domain).map(|&d| (d, m)))
                    .filter(|&(d, _)| self.facts.active[d] && !self.is_core(d))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn expected_fallback(&self) -> bool {
        self.facts.hits.is_empty() && !self.facts.core_hit && !self.live_members().iter().any(|(_, m)| m.hit)
    }

    /// The whole answer SPEC §4 prescribes: (domain, reason) in tool order.
    fn expected_domains(&self) -> Vec<(usize, Reason)> {
        let f = self.facts;
        let fallback = self.expected_fallback();
        let all_active = self.policy == FallbackPolicy::AllActive;
        let core: Vec<usize> = self
            .all()
            .into_iter()
            .filter(|&d| f.active[d] && self.is_core(d))
            .collect();
        let fallback_domains: Vec<usize> = self
            .all()
            .into_iter()
            .filter(|&d| f.active[d] && !self.is_core(d) && self.registry.domains()[d].fallback)
            .collect();
        let hits = self.by_name(f.hits.iter().copied().collect());
        let mut out: Vec<(usize, Reason)> = core.iter().map(|&d| (d, Reason::Core)).collect();
        if self.conversation.is_none() {
            if !fallback {
                out.extend(hits.iter().map(|&d| (d, Reason::Keyword)));
            } else if all_active {
                out.extend(fallback_domains.iter().map(|&d| (d, Reason::Fallback)));
            }
        } else {
            let members = self.live_members();
            for &(d, m) in &members {
                if f.hits.contains(&d) {
                    out.push((d, Reason::Keyword));
                } else if m.loaded {
                    out.push((d, Reason::Loaded));
                } else if m.hit {
                    out.push((d, Reason::Sticky));
                }
            }
            for &d in &hits {
                if !members.iter().any(|&(m, _)| m == d) {
                    out.push((d, Reason::Keyword));
                }
            }
            if fallback && all_active {
                for &d in &fallback_domains {
                    if !out.iter().any(|&(o, _)| o == d) {
                        out.push((d, Reason::Fallback));
                    }
                }
            }
        }
        out.retain(|&(d, _)| self.has_tools(d));
        out
    }

    fn expected_new_hits(&self) -> Vec<usize> {
        if self.conversation.is_none() {
            return Vec::new();
        }
        let members = self.live_members();
        self.by_name(self.facts.hits.iter().copied().collect())
            .into_iter()
            .filter(|&d| !members.iter().any(|&(m, mem)| m == d && mem.hit))
            .collect()
    }

    fn included(&self) -> Vec<(usize, Reason)> {
        self.decision
            .domains
            .iter()
            .map(|i| (i.domain.index(), i.reason))
            .collect()
    }

    fn named(&self, ds: &[(usize, Reason)]) -> Vec<(String, Reason)> {
        ds.iter().map(|&(d, r)| (self.name(d).to_string(), r)).collect()
    }
}

/// Routes the scenario in both modes, under both policies, with and without its
/// conversation, and runs `check` on each turn.
fn each_turn(s: &Scenario, check: impl Fn(&Turn) -> Result<(), TestCaseError>) -> Result<(), TestCaseError> {
    let registry = build_registry(s);
    let snapshot = Snapshot::new(s.settings.clone());
    let activation = Activation::new(&registry, &snapshot);
    let conversation = s.conversation.clone().map(|members| Conversation { members });
    let index = SearchIndex::new(&registry);
    for mode in [MatchMode::Word, MatchMode::Substring] {
        let matcher = Matcher::new(registry.keywords(), mode).unwrap();
        let facts = facts(&registry, &s.settings, &s.message, mode);
        for (d, &active) in registry.domain_ids().zip(&facts.active) {
            prop_assert_eq!(
                activation.is_active(d),
                active,
                "activity of {}",
                registry.domain(d).name
            );
        }
        for policy in [FallbackPolicy::AllActive, FallbackPolicy::CoreOnly] {
            let options = keywords_only(policy, s.expose_load_tool_group);
            let inputs = Inputs {
                registry: &registry,
                matcher: &matcher,
                index: &index,
            };
            for c in [None, conversation.as_ref()] {
                if c.is_none() && conversation.is_some() && policy == FallbackPolicy::CoreOnly {
                    // Covered by the scenarios without a conversation; keeps cases cheap.
                    continue;
                }
                let decision = route(inputs, &activation, c, &s.message, &options);
                let turn = Turn {
                    registry: &registry,
                    activation: &activation,
                    facts: &facts,
                    policy,
                    expose: s.expose_load_tool_group,
                    conversation: c,
                    decision,
                };
                check(&turn).map_err(|e| {
                    TestCaseError::fail(format!(
                        "{e}\n  mode {mode:?}, policy {policy:?}, conversation {}\n  decision {:?}",
                        if c.is_some() { "given" } else { "none" },
                        turn.decision
                    ))
                })?;
            }
        }
    }
    Ok(())
}

const ROUTE_CASES: u32 = 512;

proptest! {
    #![proptest_config(config(ROUTE_CASES))]

    #[test]
    fn an_inactive_domain_is_never_included(s in scenario()) {
        each_turn(&s, |t| {
            for inc in &t.decision.domains {
                prop_assert!(t.facts.active[inc.domain.index()], "inactive {} included", t.name(inc.domain.index()));
            }
            Ok(())
        })?;
    }

    #[test]
    fn every_active_core_domain_with_tools_comes_first_by_name_with_reason_core(s in scenario()) {
        each_turn(&s, |t| {
            let want: Vec<(usize, Reason)> = t
                .all()
                .into_iter()
                .filter(|&d| t.facts.active[d] && t.is_core(d) && t.has_tools(d))
                .map(|d| (d, Reason::Core))
                .collect();
            let got = t.included();
            prop_assert!(got.len() >= want.len(), "core missing");
            prop_assert_eq!(t.named(&got[..want.len()]), t.named(&want));
            prop_assert!(
                got[want.len()..].iter().all(|&(_, r)| r != Reason::Core),
                "reason Core after the core domains"
            );
            Ok(())
        })?;
    }

    #[test]
    fn fallback_happens_exactly_when_nothing_hit_and_nothing_is_sticky(s in scenario()) {
        each_turn(&s, |t| {
            let fallback = t.expected_fallback();
            prop_assert_eq!(t.decision.fallback, fallback, "fallback flag");
            let reasons: Vec<Reason> = t.decision.domains.iter().map(|i| i.reason).collect();
            if !fallback || t.policy == FallbackPolicy::CoreOnly {
                prop_assert!(!reasons.contains(&Reason::Fallback), "reason Fallback without a fallback under {:?}", t.policy);
            } else {
                for d in t.all() {
                    let r = &t.registry.domains()[d];
                    if t.facts.active[d] && !r.core && r.fallback && t.has_tools(d) {
                        prop_assert!(
                            t.decision.domains.iter().any(|i| i.domain.index() == d),
                            "fallback domain {} left out", r.name
                        );
                    }
                }
            }
            Ok(())
        })?;
    }

    #[test]
    fn no_domain_appears_twice_and_every_included_domain_has_tools(s in scenario()) {
        each_turn(&s, |t| {
            let mut seen = HashSet::new();
            for inc in &t.decision.domains {
                prop_assert!(seen.insert(inc.domain.index()), "{} twice", t.name(inc.domain.index()));
                prop_assert!(t.has_tools(inc.domain.index()), "{} has no tools", t.name(inc.domain.index()));
            }
            Ok(())
        })?;
    }

    #[test]
    fn only_keyword_domains_list_matched_keywords_and_those_are_the_ones_that_hit(s in scenario()) {
        each_turn(&s, |t| {
            check_decision_bounds(t.registry, &t.decision)?;
            prop_assert_eq!(&t.decision.keywords.iter().map(|k| k.index()).collect::<Vec<_>>(), &t.facts.keywords, "decision keywords");
            for inc in &t.decision.domains {
                let matched = t.decision.matched(inc).to_vec();
                if inc.reason == Reason::Keyword {
                    prop_assert!(!matched.is_empty(), "{} by keyword, none listed", t.name(inc.domain.index()));
                    let want: Vec<usize> = t
                        .facts
                        .keywords
                        .iter()
                        .copied()
                        .filter(|&k| t.facts.owner[k] == inc.domain.index())
                        .collect();
                    let matched: Vec<usize> = matched.iter().map(|k| k.index()).collect();
                    prop_assert_eq!(matched, want, "matched keywords of {}", t.name(inc.domain.index()));
                } else {
                    prop_assert!(inc.matched.is_empty(), "{} ({:?}) lists keywords", t.name(inc.domain.index()), inc.reason);
                }
            }
            Ok(())
        })?;
    }

    #[test]
    fn new_hits_are_this_messages_hits_the_conversation_had_not_recorded(s in scenario()) {
        each_turn(&s, |t| {
            for d in t.decision.new_hits.iter().map(|d| d.index()) {
                prop_assert!(t.facts.hits.contains(&d), "{} is no hit of this message", t.name(d));
                prop_assert!(t.facts.active[d] && !t.is_core(d));
                if let Some(c) = t.conversation {
                    prop_assert!(
                        !c.members.iter().any(|m| m.hit && m.domain == t.name(d)),
                        "{} was already recorded as hit", t.name(d)
                    );
                }
            }
            let got: Vec<&str> = t.decision.new_hits.iter().map(|d| t.name(d.index())).collect();
            let expected = t.expected_new_hits();
            let want: Vec<&str> = expected.iter().map(|&d| t.name(d)).collect();
            prop_assert_eq!(got, want);
            Ok(())
        })?;
    }

    #[test]
    fn the_answer_is_exactly_the_one_spec_section_4_prescribes(s in scenario()) {
        each_turn(&s, |t| {
            prop_assert_eq!(t.named(&t.included()), t.named(&t.expected_domains()), "domains, reasons and order");
            let loadable = t
                .all()
                .into_iter()
                .any(|d| t.facts.active[d] && !t.is_core(d) && t.has_tools(d));
            prop_assert_eq!(t.decision.meta_tool, t.expose && loadable, "meta-tool");
            let first = t.decision.tools(t.registry, t.activation).next().map(|(_, tool)| tool.name.clone());
            if t.decision.meta_tool {
                prop_assert_eq!(first.as_deref(), Some("load_tool_group"));
            }
            Ok(())
        })?;
    }
}

proptest! {
    #![proptest_config(config(ROUTE_CASES))]

    #[test]
    fn search_never_includes_an_inactive_or_core_domain_and_explains_every_hit(s in scenario()) {
        let built = Built::new(&s);
        let (registry, activation, inputs) = (&built.registry, &built.activation, built.inputs());
        let conversation = s.conversation.clone().map(|members| Conversation { members });
        for mode in [SearchMode::Fallback, SearchMode::Augment] {
            let mut options = Options::default();
            options.search.mode = mode;
            for c in [None, conversation.as_ref()] {
                let d = route(inputs, activation, c, &s.message, &options);
                let again = route(inputs, activation, c, &s.message, &options);
                prop_assert_eq!(&d, &again, "deterministic");
                for inc in &d.domains {
                    prop_assert!(activation.is_active(inc.domain), "inactive {} included", registry.domain(inc.domain).name);
                }
                for hit in &d.search {
                    let dom = registry.domain(hit.domain);
                    prop_assert!(activation.is_active(hit.domain) && !dom.core && !dom.tools.is_empty(), "search hit {}", dom.name);
                    prop_assert!(hit.score > 0.0 && !hit.terms.is_empty(), "search hit {} unexplained", dom.name);
                }
                if !d.search.is_empty() {
                    prop_assert!(!d.fallback, "a search hit routes the message");
                }
                prop_assert_eq!(d.tools(registry, activation).count(), d.tool_count(registry, activation));
            }
        }
    }
}

proptest! {
    #![proptest_config(config(ROUTE_CASES))]

    #[test]
    fn asking_more_of_weak_segments_only_takes_search_hits_away(s in scenario()) {
        let built = Built::new(&s);
        let inputs = built.inputs();
        let hits = |min_ratio: f32, weak_min_ratio: f32| -> Vec<_> {
            let mut options = Options::default();
            options.search.min_ratio = min_ratio;
            options.search.weak_min_ratio = weak_min_ratio;
            route(inputs, &built.activation, None, &s.message, &options).search.iter().map(|h| h.domain).collect()
        };
        for min_ratio in [0.2f32, 0.45, 0.7] {
            let plain = hits(min_ratio, min_ratio);
            // A weak share at or below the plain one changes nothing.
            prop_assert_eq!(&hits(min_ratio, min_ratio / 2.0), &plain);
            let mut previous = plain;
            for weak_min_ratio in [0.5f32, 0.75, 1.0] {
                let now = hits(min_ratio, weak_min_ratio.max(min_ratio));
                prop_assert!(now.iter().all(|d| previous.contains(d)), "a stricter weak share added a hit");
                previous = now;
            }
        }
    }

    #[test]
    fn a_smaller_share_of_tools_per_segment_only_takes_search_hits_away(s in scenario()) {
        let built = Built::new(&s);
        let inputs = built.inputs();
        let hits = |segment_share: f32| -> Vec<_> {
            let mut options = Options::default();
            options.search.segment_share = segment_share;
            options.search.segment_min_tools = 0;
            route(inputs, &built.activation, None, &s.message, &options).search.iter().map(|h| h.domain).collect()
        };
        let mut previous = hits(1.0);
        for segment_share in [0.5f32, 0.2, 0.06, 0.0] {
            let now = hits(segment_share);
            prop_assert!(now.iter().all(|d| previous.contains(d)), "a smaller share added a hit");
            previous = now;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The budget (SPEC §9): a pure function of the included domains and the limits.
// ---------------------------------------------------------------------------------------------

mod budget {
    use super::*;
    use toolrouter::router::budget::{Candidate, Cost, Limits, select as fit};

    fn reason() -> impl Strategy<Value = Reason> {
        prop_oneof![
            Just(Reason::Core),
            Just(Reason::Keyword),
            Just(Reason::Search),
            Just(Reason::Loaded),
            Just(Reason::Sticky),
            Just(Reason::Fallback),
        ]
    }

    fn droppable(c: &Candidate) -> bool {
        !c.loaded && matches!(c.reason, Reason::Fallback | Reason::Search | Reason::Sticky)
    }

    fn rank(r: Reason) -> u8 {
        match r {
            Reason::Fallback => 0,
            Reason::Search => 1,
            _ => 2,
        }
    }

    /// Distinct domains (one answer never holds a domain twice), each with a reason, a
    /// score, tools, tokens, and whether the conversation loaded it (a loaded domain may
    /// show any reason that comes first: a keyword or search hit, or `LOADED`).
    fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
        let part = (reason(), 0u8..8, 0u64..20, 0u64..3_000, any::<bool>()).prop_map(
            |(reason, score, tools, tokens, loaded)| {
                let loaded = match reason {
                    Reason::Loaded => true,
                    Reason::Keyword | Reason::Search => loaded,
                    _ => false,
                };
                (reason, score, tools, tokens, loaded)
            },
        );
        vec(part, 0..16).prop_flat_map(|parts| {
            let n = parts.len();
            Just(parts)
                .prop_flat_map(move |parts| {
                    (
                        Just(parts),
                        proptest::sample::subsequence((0..64usize).collect::<Vec<_>>(), n),
                    )
                })
                .prop_map(|(parts, ids)| {
                    parts
                        .into_iter()
                        .zip(ids)
                        .map(|((reason, score, tools, tokens, loaded), id)| Candidate {
                            domain: toolrouter::registry::DomainId::at(id),
                            reason,
                            score: f32::from(score) / 2.0,
                            loaded,
                            cost: Cost { tools, tokens },
                        })
                        .collect()
                })
        })
    }

    fn limits() -> impl Strategy<Value = Limits> {
        (
            proptest::option::of(0u64..200),
            proptest::option::of(0u64..30_000),
        )
            .prop_map(|(max_tools, token_budget)| Limits {
                max_tools,
                token_budget,
            })
    }

    fn sum(fixed: Cost, cs: &[Candidate], keep: impl Fn(usize) -> bool) -> Cost {
        cs.iter()
            .enumerate()
            .filter(|(i, _)| keep(*i))
            .fold(fixed, |a, (_, c)| Cost {
                tools: a.tools + c.cost.tools,
                tokens: a.tokens + c.cost.tokens,
            })
    }

    fn fits(c: Cost, l: Limits) -> bool {
        l.max_tools.is_none_or(|m| c.tools <= m) && l.token_budget.is_none_or(|b| c.tokens <= b)
    }

    proptest! {
        #![proptest_config(config(2_000))]

        #[test]
        fn the_budget_never_drops_core_keyword_or_loaded_and_fits_when_the_rest_does(
            cs in candidates(),
            limits in limits(),
            meta_tools in 0u64..3,
            meta_tokens in 0u64..400,
        ) {
            let fixed = Cost { tools: meta_tools, tokens: meta_tokens };
            let dropped = fit(fixed, &cs, limits);
            // Deterministic.
            prop_assert_eq!(&dropped, &fit(fixed, &cs, limits));
            let mut seen = HashSet::new();
            for &i in &dropped {
                prop_assert!(i < cs.len() && seen.insert(i), "each position once");
                prop_assert!(droppable(&cs[i]), "dropped a {:?} domain (loaded: {})", cs[i].reason, cs[i].loaded);
            }
            let kept = sum(fixed, &cs, |i| !dropped.contains(&i));
            let undroppable = sum(fixed, &cs, |i| !droppable(&cs[i]));
            if fits(undroppable, limits) {
                prop_assert!(fits(kept, limits), "the undroppable part fits, so the answer must");
            }
            if fits(sum(fixed, &cs, |_| true), limits) {
                prop_assert!(dropped.is_empty(), "nothing dropped from an answer that fits");
            }
            // No more than needed: before the last drop, the answer did not fit.
            if let Some((&last, earlier)) = dropped.split_last() {
                let before = sum(fixed, &cs, |i| i == last || !earlier.contains(&i));
                prop_assert!(!fits(before, limits));
            }
            // In the SPEC's order: fallback, then search, then sticky, each by its own key.
            for pair in dropped.windows(2) {
                let (a, b) = (&cs[pair[0]], &cs[pair[1]]);
                prop_assert!(rank(a.reason) <= rank(b.reason));
                if a.reason == b.reason {
                    match a.reason {
                        Reason::Fallback => prop_assert!(
                            (std::cmp::Reverse(a.cost.tokens), a.domain)
                                < (std::cmp::Reverse(b.cost.tokens), b.domain)
                        ),
                        Reason::Search => prop_assert!((a.score, a.domain) < (b.score, b.domain)),
                        _ => prop_assert!(pair[0] < pair[1], "sticky: earliest joined first"),
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Profiles and disabled tools (SPEC §10): no answer shows a consumer a tool outside its view.
// ---------------------------------------------------------------------------------------------

/// Glob patterns over some of these names, some exact and some with a wildcard.
fn some_patterns(names: Vec<String>) -> impl Strategy<Value = Vec<String>> {
    let n = names.len();
    subsequence(names, 0..=n.min(4)).prop_flat_map(|picked| {
        let len = picked.len();
        (Just(picked), vec(any::<bool>(), len)).prop_map(|(picked, wild)| {
            picked
                .into_iter()
                .zip(wild)
                .map(|(name, w)| {
                    if w {
                        format!("{}*", &name[..name.len().min(3)])
                    } else {
                        name
                    }
                })
                .collect()
        })
    })
}

/// Any profile over the fixed registry's names (or none).
fn any_profile() -> impl Strategy<Value = Option<Profile>> {
    let f = fixed();
    let domains: Vec<String> = f.registry.domains().iter().map(|d| d.name.clone()).collect();
    let tools: Vec<String> = f
        .registry
        .domains()
        .iter()
        .flat_map(|d| d.tools.iter().map(|t| t.name.clone()))
        .collect();
    let compile = |p: &[String]| Patterns::new(p).unwrap();
    let profile = (
        some_patterns(domains.clone()),
        some_patterns(domains),
        some_patterns(tools.clone()),
        some_patterns(tools),
        select(&[Tier::Read, Tier::Modify, Tier::Destructive][..]),
    )
        .prop_map(move |(ad, dd, at, dt, tier)| Profile {
            allow_domains: compile(&ad),
            deny_domains: compile(&dd),
            allow_tools: compile(&at),
            deny_tools: compile(&dt),
            max_tier: tier,
            ..Profile::open("p")
        });
    prop_oneof![1 => Just(None), 4 => profile.prop_map(Some)]
}

/// Whether a consumer with `profile` may see a tool, with `disabled` names disabled.
fn may_see(profile: Option<&Profile>, disabled: &Patterns, domain: &str, tool: &Tool) -> bool {
    !disabled.matches(&tool.name) && profile.is_none_or(|p| p.allows_domain(domain) && p.allows_tool(tool))
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn no_answer_under_a_policy_holds_a_tool_outside_it(
        message in keyword_text(),
        profile in any_profile(),
        disabled in some_patterns(fixed().registry.domains().iter().flat_map(|d| d.tools.iter().map(|t| t.name.clone())).collect()),
        members in subsequence(fixed().registry.domains().iter().map(|d| d.name.clone()).collect::<Vec<_>>(), 0..4),
    ) {
        let f = fixed();
        let mut rows: Vec<(String, String)> = f
            .registry
            .domains()
            .iter()
            .flat_map(|d| d.settings_keys.iter().map(|k| (k.clone(), "set".to_string())))
            .collect();
        rows.push((DISABLED_TOOLS_KEY.to_string(), serde_json::to_string(&disabled).unwrap()));
        let settings = Snapshot::new(rows);
        let activation = Activation::scoped(&f.registry, &settings, profile.as_ref());
        let conversation = Conversation {
            members: members
                .iter()
                .enumerate()
                .map(|(i, d)| Member { domain: d.clone(), loaded: i % 2 == 0, hit: i % 2 == 1 })
                .collect(),
        };
        let inputs = Inputs { registry: &f.registry, matcher: &f.word, index: &f.index };
        for c in [None, Some(&conversation)] {
            for mode in [SearchMode::Off, SearchMode::Augment] {
                let options = Options {
                    search: SearchOptions { mode, ..SearchOptions::default() },
                    ..Options::default()
                };
                let d = route(inputs, &activation, c, &message, &options);
                let mut n = 0;
                for (domain, tool) in d.tools(&f.registry, &activation) {
                    n += 1;
                    if domain.is_empty() {
                        continue; // a meta-tool
                    }
                    prop_assert!(
                        may_see(profile.as_ref(), settings.disabled(), domain, tool),
                        "{} of {} is outside the consumer's view", tool.name, domain
                    );
                }
                prop_assert_eq!(n, d.tool_count(&f.registry, &activation));
            }
        }
        // The meta-tool offers only groups the consumer sees tools of.
        if let Some(meta) = activation.meta_tool() {
            let schema: Value = serde_json::from_str(&meta.input_schema_json).unwrap();
            for g in schema["properties"]["group_name"]["enum"].as_array().unwrap() {
                let d = f.registry.find(g.as_str().unwrap()).unwrap();
                let domain = f.registry.domain(d);
                prop_assert!(
                    domain.tools.iter().any(|t| may_see(profile.as_ref(), settings.disabled(), &domain.name, t)),
                    "load_tool_group offers {}, which the consumer sees no tool of", domain.name
                );
            }
        }
        // Search finds only what the consumer sees.
        for hit in f.index.search_tools(&message, 20, activation.tool_mask()) {
            let domain = f.registry.domain(hit.domain);
            prop_assert!(may_see(profile.as_ref(), settings.disabled(), &domain.name, &domain.tools[hit.tool]));
        }
    }
}
