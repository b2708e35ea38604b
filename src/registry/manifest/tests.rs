//! Manifest parsing and validation, case by case: every rejection names the file and says
//! what is wrong, every accepted form loads as written, and syntax errors carry the
//! line and column a person would count.

use super::{MAX_KEYWORD_BYTES, parse, parse_native};
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

#[test]
fn toml_values_json_has_no_form_for_are_rejected_naming_where() {
    assert_rejected(&[
        (
            "date.toml",
            "name = \"x\"\n[[tools]]\nname = \"t\"\ndescription = \"d\"\n\
             [tools.input_schema.properties.since]\ntype = \"string\"\ndefault = 1979-05-27\n",
            &[
                "`tools.0.input_schema.properties.since.default` is a TOML date or time, which JSON has not: write it as a string",
            ],
        ),
        (
            "nan.toml",
            "name = \"x\"\nkeywords = [\"a\"]\n[[tools]]\nname = \"t\"\ndescription = \"d\"\n\
             [tools.input_schema.properties.n]\ntype = \"number\"\nmaximum = inf\n",
            &["`tools.0.input_schema.properties.n.maximum` is a TOML non-finite number"],
        ),
        // It does not hide the file's other problems.
        (
            "and_more.toml",
            "name = \"x\"\ncore = \"yes\"\n[[tools]]\nname = \"t\"\ndescription = \"d\"\n\
             [tools.input_schema.properties.since]\ntype = \"string\"\ndefault = 1979-05-27\n",
            &["is a TOML date or time", "`core`"],
        ),
    ]);
    // Nor the problems across files.
    assert_load_rejected(
        &[
            (
                "a.toml",
                "name = \"dup\"\n[[tools]]\nname = \"x\"\ndescription = \"d\"\n\
                 [tools.input_schema.properties.when]\ntype = \"string\"\ndefault = 1979-05-27\n",
            ),
            (
                "b.json",
                r#"{"name": "dup", "tools": [{"name": "x", "description": "d"}]}"#,
            ),
        ],
        &[
            "is a TOML date or time",
            "domain `dup` is defined twice",
            "tool `x` is defined in two domains",
        ],
    );
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
fn the_meta_tools_names_are_reserved_in_both_formats() {
    assert_rejected(&[
        (
            "native.json",
            r#"{"name": "x", "tools": [{"name": "load_tool_group", "description": "d"}]}"#,
            &["tool #1 `load_tool_group`: tool name `load_tool_group` is reserved"],
        ),
        (
            "grouped.json",
            r#"[{"name": "search_tools", "description": "d"}]"#,
            &["tool #1 `search_tools`: tool name `search_tools` is reserved"],
        ),
        (
            "x.toml",
            "name = \"x\"\n[[tools]]\nname = \"search_tools\"\ndescription = \"d\"\n",
            &["tool name `search_tools` is reserved"],
        ),
    ]);
    // Names are compared as providers compare them: exactly.
    assert_accepted(&[(
        "other_case.json",
        r#"{"name": "x", "tools": [{"name": "Search_Tools", "description": "d"}]}"#,
    )]);
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
    let group =
        |parameters: &str| format!(r#"[{{"name": "t", "description": "d", "parameters": {parameters}}}]"#);
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
    // Keywords are words and phrases: one over the bound is refused, one at it is not.
    let at = "a ".repeat(MAX_KEYWORD_BYTES / 2);
    assert_eq!(at.len(), MAX_KEYWORD_BYTES);
    assert_eq!(
        parsed("x.json", &format!(r#"{{"name": "x", "keywords": ["{at}"]}}"#)).keywords,
        strings(&[&at])
    );
    assert_rejected(&[(
        "long.json",
        &format!(r#"{{"name": "x", "keywords": ["dns", "{at}a"]}}"#),
        &["keyword #2 is 129 bytes, over the limit of 128 bytes"],
    )]);
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
    // A blank display name or description is one left out, in both formats.
    let blank = [
        (
            "x.json",
            r#"{"name": "pi-hole", "display_name": "  ", "description": ""}"#,
        ),
        (
            "x.toml",
            "name = \"pi-hole\"\ndisplay_name = \"\"\ndescription = \"\\t\"\n",
        ),
        (
            "dir/pi-hole.json",
            r#"[{"_meta": true, "display_name": "\u00a0", "description": " "}]"#,
        ),
    ];
    for (path, text) in blank {
        let d = parsed(path, text);
        assert_eq!(
            (d.display_name.as_str(), d.description.as_str()),
            ("Pi Hole", "Tools from pi-hole group"),
            "{path}"
        );
    }
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
        // The type is the only addition (SPEC §9): no `properties` is invented.
        (r"{}", r#"{"type":"object"}"#),
        (
            r#"{"additionalProperties": false}"#,
            r#"{"type":"object","additionalProperties":false}"#,
        ),
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
    let group =
        |parameters: &str| format!(r#"[{{"name": "t", "description": "d", "parameters": {parameters}}}]"#);
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
    let table: Vec<(&str, &str, &[&str])> = cases.iter().map(|(p, t)| (*p, t.as_str(), invalid)).collect();
    assert_rejected(&table);
}

#[test]
fn every_problem_of_one_schema_is_reported_each_where_it_is() {
    let text = r#"{"name": "x", "tools": [{"name": "t", "description": "d", "input_schema":
        {"type": "object", "properties": {"a": {"type": "strnig"}, "b": {"type": 5}},
         "required": ["a", "zz"]}}]}"#;
    let errors = load_errors(&[("three.json", text)]);
    let shown = shown(&errors);
    for want in [
        "is not a valid JSON Schema (draft 2020-12) at /properties/a/type",
        "is not a valid JSON Schema (draft 2020-12) at /properties/b/type",
        "lists `zz` in `required` but does not define it",
    ] {
        assert_eq!(
            errors.iter().filter(|e| e.message.contains(want)).count(),
            1,
            "{want:?} once in:\n{shown}"
        );
    }
    // A problem the meta-schema reaches along several of its own paths is told once.
    for schema in [
        r#"{"type": "object", "$defs": {"a": 5}}"#,
        r#"{"type": "object", "properties": {"a": {"items": 5}}}"#,
    ] {
        let text = format!(
            r#"{{"name": "x", "tools": [{{"name": "t", "description": "d", "input_schema": {schema}}}]}}"#
        );
        let errors = load_errors(&[("once.json", &text)]);
        assert_eq!(errors.len(), 1, "{schema}:\n{}", self::shown(&errors));
    }
}

#[test]
fn a_required_name_that_the_schema_does_not_define_is_rejected() {
    let native = |schema: &str| {
        format!(
            r#"{{"name": "x", "tools": [{{"name": "t", "description": "d", "input_schema": {schema}}}]}}"#
        )
    };
    let group =
        |parameters: &str| format!(r#"[{{"name": "t", "description": "d", "parameters": {parameters}}}]"#);
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
    // A branch applies to the object its schema describes: what the object's schema and its
    // other branches define counts, and what none of them defines is still refused.
    assert_rejected(&[
        (
            "branch.json",
            &native(
                r#"{"type": "object", "properties": {"a": {}}, "oneOf": [{"required": ["a"]}, {"required": ["zz"]}]}"#,
            ),
            &["`input_schema` at /oneOf/1 lists `zz` in `required`"],
        ),
        // `additionalProperties: false` allows no other property: nothing comes from there.
        (
            "closed.json",
            &native(
                r#"{"type": "object", "properties": {"a": {}}, "required": ["b"], "additionalProperties": false}"#,
            ),
            &["`input_schema` lists `b` in `required`"],
        ),
        (
            "closed_nested.json",
            &native(
                r#"{"type": "object", "properties": {"o": {"type": "object", "properties": {"x": {}},
                    "required": ["y"], "unevaluatedProperties": false}}}"#,
            ),
            &["`input_schema` at /properties/o lists `y` in `required`"],
        ),
        (
            "nested_branch.json",
            &native(
                r#"{"type": "object", "properties": {"o": {"type": "object", "properties": {"x": {}},
                    "anyOf": [{"allOf": [{"required": ["x", "y"]}]}]}}}"#,
            ),
            &["`input_schema` at /properties/o/anyOf/0/allOf/0 lists `y` in `required`"],
        ),
    ]);
    assert_accepted(&[
        // Properties may come from elsewhere where the schema composes them.
        (
            "composed.json",
            &native(r#"{"type": "object", "allOf": [{"properties": {"a": {}}}], "required": ["a"]}"#),
        ),
        (
            "composed_and_listed.json",
            &native(
                r#"{"type": "object", "properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}], "required": ["a", "b"]}"#,
            ),
        ),
        (
            "either_or.json",
            &native(
                r#"{"type": "object", "properties": {"target": {"type": "object",
                    "properties": {"by": {"enum": ["name", "id"]}, "name": {"type": "string"}, "id": {"type": "integer"}},
                    "oneOf": [{"properties": {"by": {"const": "name"}}, "required": ["by", "name"]},
                              {"properties": {"by": {"const": "id"}}, "required": ["by", "id"]}]}},
                    "required": ["target"]}"#,
            ),
        ),
        (
            "sibling.json",
            &native(
                r#"{"type": "object", "properties": {"x": {}}, "allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}, "required": ["a", "b"]}]}"#,
            ),
        ),
        (
            "conditional.json",
            &native(
                r#"{"type": "object", "properties": {"kind": {}, "url": {}},
                    "if": {"properties": {"kind": {"const": "web"}}}, "then": {"required": ["url"]},
                    "dependentSchemas": {"url": {"required": ["kind"]}}}"#,
            ),
        ),
        (
            "referenced.json",
            &native(
                r##"{"type": "object", "$defs": {"base": {"type": "object", "properties": {"id": {}}}},
                    "$ref": "#/$defs/base", "properties": {"x": {}}, "required": ["id", "x"]}"##,
            ),
        ),
        (
            "open.json",
            &native(
                r#"{"type": "object", "properties": {"a": {}}, "required": ["b"], "additionalProperties": {"type": "string"}}"#,
            ),
        ),
        // `not` requiring a name forbids it: nothing need define it.
        (
            "forbidden.json",
            &native(r#"{"type": "object", "properties": {"a": {}}, "not": {"required": ["legacy"]}}"#),
        ),
    ]);
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
fn every_duplicate_key_is_reported_each_at_its_line() {
    // Strings holding braces, commas and escaped quotes are no structure; a key spelled with
    // an escape is the key it decodes to.
    let text = concat!(
        "{\"name\": \"x\", \"description\": \"a \\\"{\\\" , b\", \"description\": \"b\",\n",
        " \"tools\": [{\"name\": \"t\", \"description\": \"d\", \"tier\": \"read\", \"tier\": \"read\"}],\n",
        " \"keywords\": [\"k\"], \"key\\u0077ords\": [\"j\"]}"
    );
    let errors = load_errors(&[("d.json", text)]);
    let listed = shown(&errors);
    let found: Vec<(usize, &str)> = errors
        .iter()
        .map(|e| (e.position.unwrap().0, e.message.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (1, "duplicate key `description` in a JSON object"),
            (2, "duplicate key `tier` in a JSON object"),
            (3, "duplicate key `keywords` in a JSON object"),
        ],
        "{listed}"
    );
}

#[test]
fn a_keyword_listed_twice_in_any_case_is_kept_once_as_first_spelled() {
    let d = parsed(
        "x.json",
        r#"{"name": "x", "keywords": ["light", "Light", "lamp", "light", "LAMP"]}"#,
    );
    assert_eq!(d.keywords, ["light", "lamp"]);
    let g = parsed(
        "g.json",
        r#"[{"_meta": true, "keywords": ["Hörbuch", "hörbuch"]}]"#,
    );
    assert_eq!(g.keywords, ["Hörbuch"]);
}

#[test]
fn a_duplicate_key_does_not_hide_the_files_other_problems() {
    let text = r#"{"name": "Alpha", "name": "alpha", "keywrods": [],
        "tools": [{"name": "t", "description": "d", "tier": "bogus"}]}"#;
    let errors = load_errors(&[("a.json", text)]);
    let listed = shown(&errors);
    assert_eq!(errors.len(), 3, "{listed}");
    assert_eq!(errors[0].position, Some((1, 24)), "{listed}");
    assert!(errors[0].message.contains("duplicate key `name`"), "{listed}");
    assert!(
        errors[1..]
            .iter()
            .any(|e| e.message.contains("unknown field `keywrods`")),
        "{listed}"
    );
    assert!(errors[1..].iter().any(|e| e.message.contains("tier")), "{listed}");
    // A syntax error after the duplicate is reported too.
    let broken = r#"{"name": "a", "name": "b", "tools": [}"#;
    let errors = load_errors(&[("b.json", broken)]);
    let listed = shown(&errors);
    assert_eq!(errors.len(), 2, "{listed}");
    assert!(errors[0].message.contains("duplicate key `name`"), "{listed}");
    assert!(errors[1].message.contains("malformed JSON"), "{listed}");
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

// Positions of syntax errors.

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

#[test]
fn a_file_invalid_in_another_way_still_has_its_names_checked_against_the_others() {
    let err = crate::registry::Registry::from_sources([
        ("a.json", r#"{"name":"schema","tools":[{"name":"t1","description":"d"}]}"#),
        (
            "b.json",
            r#"{"name":"schema","tools":[{"name":"t1","description":"d","tier":"x"},{"name":"t2","description":"d"},{"name":"t2","description":"d"}]}"#,
        ),
        ("c.json", r#"[{"name":"t3","description":"d","tier":"nope"}]"#),
        ("d.json", r#"{"name":"c","tools":[{"name":"t3","description":"d"}]}"#),
    ])
    .unwrap_err();
    let listed = err.to_string();
    for want in [
        "tier",
        "domain `schema` is defined twice: in a.json and in b.json",
        "tool `t1` is defined in two domains: `schema` (a.json) and `schema` (b.json)",
        "tool `t2` appears twice in domain `schema`",
        "domain `c` is defined twice: in c.json and in d.json",
        "tool `t3` is defined in two domains: `c` (c.json) and `c` (d.json)",
    ] {
        assert!(listed.contains(want), "{want:?} in:\n{listed}");
    }
}

// Manifests without a file (domains registered at run time).

/// `parse_native` with the labels the daemon uses for a request.
fn native(text: &str) -> Result<Domain, Vec<ManifestError>> {
    parse_native(text, |name| {
        name.map_or_else(|| "manifest_json".into(), |n| format!("upsert:{n}"))
    })
}

#[test]
fn a_native_json_manifest_without_a_file_parses_as_a_files_would() {
    let text = r#"{"name": "mine", "keywords": ["k"], "tools": [{"name": "t", "description": "d", "tier": "read"}]}"#;
    let d = native(text).unwrap();
    let from_file = parsed("mine.json", text);
    assert_eq!(d.source, "upsert:mine", "labelled with its name");
    assert_eq!(
        Domain {
            source: from_file.source.clone(),
            ..d
        },
        from_file
    );
}

#[test]
fn a_manifest_without_a_file_gets_the_checks_of_a_file_each_naming_the_domain() {
    let cases: &[(&str, &str)] = &[
        (r#"{"name": "mine", "keywrods": []}"#, "unknown field `keywrods`"),
        (
            r#"{"name": "mine", "tools": [{"name": "bad name", "description": "d"}]}"#,
            "tool name is invalid",
        ),
        (
            r#"{"name": "mine", "tools": [{"name": "t", "description": "d", "input_schema": {"type": "object", "properties": {"a": {"type": 5}}}}]}"#,
            "not a valid JSON Schema",
        ),
        (r#"{"name": "Mine"}"#, "domain name `Mine` is invalid"),
    ];
    for (text, want) in cases {
        let errors = native(text).unwrap_err();
        let shown = shown(&errors);
        assert!(
            errors.iter().all(|e| e.path.starts_with("upsert:")),
            "{text}:\n{shown}"
        );
        assert!(
            errors.iter().any(|e| e.message.contains(want)),
            "{text}: want {want:?}:\n{shown}"
        );
    }
}

#[test]
fn a_group_array_or_toml_without_a_file_is_refused_saying_what_is_accepted() {
    let cases: &[(&str, &str, &str)] = &[
        (
            r#"[{"name": "t", "description": "d"}]"#,
            "manifest_json",
            "group-array manifest",
        ),
        ("name = \"mine\"\n", "manifest_json", "malformed JSON"),
        ("\"mine\"", "manifest_json", "must be a JSON object"),
        ("{\"name\": \"mine\",", "manifest_json", "malformed JSON"),
        // Text that reads as JSON names the domain, its duplicate keys too.
        (
            r#"{"name": "mine", "name": "mine"}"#,
            "upsert:mine",
            "duplicate key `name`",
        ),
    ];
    for (text, path, want) in cases {
        let errors = native(text).unwrap_err();
        let shown = shown(&errors);
        assert_eq!(errors.len(), 1, "{text}:\n{shown}");
        assert_eq!(errors[0].path, *path, "{text}");
        assert!(
            errors[0].message.contains(want),
            "{text}: want {want:?}:\n{shown}"
        );
        if !text.starts_with('{') {
            assert!(
                errors[0]
                    .message
                    .contains("group arrays and TOML are manifest-file formats"),
                "{text}: says what is accepted:\n{shown}"
            );
        }
    }
    assert!(
        native("{\"name\": \"mine\",").unwrap_err()[0].position.is_some(),
        "a syntax error keeps its position"
    );
}

/// SPEC §5: a value a message repeats is cut to 128 characters with `…`, so a manifest sent
/// to `UpsertDomain` cannot make its error as large as itself.
#[test]
fn every_value_a_manifest_error_repeats_is_cut_to_128_characters() {
    let long = "x".repeat(1000);
    let cut = format!("{}…", "x".repeat(128));
    let tool = |fields: &str| format!(r#"{{"name": "mine", "tools": [{{"description": "d", {fields}}}]}}"#);
    let cases = [
        // (manifest, what the message says around the cut value)
        (
            format!(r#"{{"name": "{long}"}}"#),
            format!("domain name `{cut}` is invalid"),
        ),
        (
            format!(r#"{{"name": "mine", "{long}": 1}}"#),
            format!("unknown field `{cut}`"),
        ),
        // A control character cannot start a line that passes for another file's.
        (
            r#"{"name": "mine", "typo\nother.json: all good": 1}"#.to_string(),
            r"unknown field `typo\nother.json: all good`".to_string(),
        ),
        (
            format!(r#"{{"name": "mine", "k{long}": 1, "k{long}": 2}}"#),
            format!("duplicate key `k{}…`", "x".repeat(127)),
        ),
        (
            tool(&format!(r#""name": "{long}""#)),
            format!("tool #1 `{cut}`: tool name is invalid"),
        ),
        (
            tool(&format!(r#""name": "t", "{long}": 1"#)),
            format!("unknown field `{cut}`"),
        ),
        (
            tool(&format!(r#""name": "t", "tier": "{long}""#)),
            format!("(got \"{}…)", "x".repeat(127)),
        ),
        (
            tool(&format!(
                r#""name": "t", "input_schema": {{"type": "object", "required": ["{long}"]}}"#
            )),
            format!("lists `{cut}` in `required`"),
        ),
        (
            tool(&format!(
                r#""name": "t", "input_schema": {{"type": "object", "properties": {{"{long}": {{"type": 5}}}}}}"#
            )),
            format!(
                "not a valid JSON Schema (draft 2020-12) at /properties/{}…",
                "x".repeat(116)
            ),
        ),
    ];
    for (text, want) in &cases {
        let errors = native(text).unwrap_err();
        let shown = shown(&errors);
        assert!(shown.contains(want.as_str()), "want {want:?} in:\n{shown}");
        for e in &errors {
            assert!(e.message.chars().count() < 400, "not cut: {}", e.message);
        }
    }
}
