use std::path::PathBuf;

use serde_json::{Value, json};

use super::*;
use crate::registry::Registry;
use crate::router::{Activation, Snapshot};

/// The demo registry's meta-tools (every group active) and then every tool, in registry
/// order: what the golden files hold.
fn demo_tools(registry: &Registry) -> Vec<Tool> {
    let activation = Activation::new(registry, &Snapshot::every_key_set(registry));
    let mut tools: Vec<Tool> = activation.meta_tools().cloned().collect();
    tools.extend(registry.domains().iter().flat_map(|d| d.tools.iter().cloned()));
    tools
}

fn parse(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(bytes)))
}

/// The schema a rendered tool carries, if any.
fn schema_of(format: Format, tool: &Value) -> Option<&Value> {
    match format {
        Format::OpenAiChat => tool["function"].get("parameters"),
        Format::OpenAiResponses | Format::Gemini => tool.get("parameters"),
        Format::Anthropic => tool.get("input_schema"),
        Format::Mcp => tool.get("inputSchema"),
    }
}

fn name_of(format: Format, tool: &Value) -> &str {
    let name = match format {
        Format::OpenAiChat => &tool["function"]["name"],
        _ => &tool["name"],
    };
    name.as_str().unwrap()
}

#[test]
fn the_demo_registry_renders_as_the_golden_files_say() {
    let registry = Registry::demo();
    let tools = demo_tools(&registry);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    for format in Format::ALL {
        let rendered = Rendered::new(&tools, format);
        let array = parse(&assemble(&[rendered.all()]));
        let mut text = serde_json::to_string_pretty(&array).unwrap();
        text.push('\n');
        let path = dir.join(format!("demo.{}.json", format.as_str()));
        if update {
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        let golden = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (UPDATE_GOLDEN=1 cargo test --lib render writes it)",
                path.display()
            )
        });
        assert!(
            golden == text,
            "{} differs from the rendering (UPDATE_GOLDEN=1 cargo test --lib render rewrites it)",
            path.display()
        );
    }
}

#[test]
fn every_rendered_schema_is_valid_and_lossless_where_the_provider_allows() {
    let registry = Registry::demo();
    let tools = demo_tools(&registry);
    for format in Format::ALL {
        let rendered = Rendered::new(&tools, format);
        assert_eq!(rendered.len(), tools.len());
        for (i, tool) in tools.iter().enumerate() {
            let v = parse(rendered.tool(i));
            assert_eq!(name_of(format, &v), tool.name);
            let original: Value = serde_json::from_str(&tool.input_schema_json).unwrap();
            let schema = schema_of(format, &v);
            if format == Format::Gemini {
                match schema {
                    Some(s) => {
                        let problems = check_gemini_schema(s);
                        assert!(problems.is_empty(), "{}: {problems:?}", tool.name);
                    }
                    None => assert!(
                        original["properties"].as_object().is_none_or(|p| p.is_empty()),
                        "{} lost its parameters",
                        tool.name
                    ),
                }
            } else {
                let schema = schema.unwrap_or_else(|| panic!("{} has no schema", tool.name));
                assert!(
                    jsonschema::draft202012::meta::validate(schema).is_ok(),
                    "{} in {}: not a valid JSON Schema",
                    tool.name,
                    format.as_str()
                );
                assert_eq!(
                    schema,
                    &original,
                    "{} in {}: schema changed",
                    tool.name,
                    format.as_str()
                );
            }
        }
    }
}

#[test]
fn each_format_has_the_providers_shape() {
    let tool = Tool {
        name: "x_get".into(),
        description: "Gets \"x\"".into(),
        input_schema_json: r#"{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}"#
            .into(),
        tier: Tier::Read,
    };
    let schema = json!({"type":"object","properties":{"id":{"type":"string"}},"required":["id"]});
    let shape = |f| parse(&render(&tool, f));
    assert_eq!(
        shape(Format::OpenAiChat),
        json!({"type":"function","function":{"name":"x_get","description":"Gets \"x\"","parameters":schema}})
    );
    assert_eq!(
        shape(Format::OpenAiResponses),
        json!({"type":"function","name":"x_get","description":"Gets \"x\"","parameters":schema,"strict":false})
    );
    assert_eq!(
        shape(Format::Anthropic),
        json!({"name":"x_get","description":"Gets \"x\"","input_schema":schema})
    );
    assert_eq!(
        shape(Format::Gemini),
        json!({"name":"x_get","description":"Gets \"x\"","parameters":
            {"type":"OBJECT","properties":{"id":{"type":"STRING"}},"required":["id"]}})
    );
    assert_eq!(
        shape(Format::Mcp),
        json!({"name":"x_get","description":"Gets \"x\"","inputSchema":schema,
               "annotations":{"readOnlyHint":true}})
    );
}

#[test]
fn mcp_annotations_follow_the_tier_and_an_unspecified_tier_has_none() {
    for (tier, annotations) in [
        (Tier::Read, Some(json!({"readOnlyHint": true}))),
        (Tier::Modify, Some(json!({"destructiveHint": false}))),
        (Tier::Destructive, Some(json!({"destructiveHint": true}))),
        (Tier::Unspecified, None),
    ] {
        let tool = Tool {
            name: "t".into(),
            description: "d".into(),
            input_schema_json: r#"{"type":"object","properties":{}}"#.into(),
            tier,
        };
        let v = parse(&render(&tool, Format::Mcp));
        assert_eq!(v.get("annotations").cloned(), annotations, "{tier:?}");
    }
}

#[test]
fn openai_formats_give_a_schema_without_properties_an_empty_one_and_the_others_keep_it_verbatim() {
    // (manifest schema, what both OpenAI formats send)
    let cases = [
        (r#"{"type":"object"}"#, r#"{"type":"object","properties":{}}"#),
        (
            r#"{"type":"object","required":[]}"#,
            r#"{"type":"object","required":[],"properties":{}}"#,
        ),
        // `properties` below the top level is not the top level's.
        (
            r#"{"type":"object","$defs":{"d":{"type":"object","properties":{"a":{}}}}}"#,
            r#"{"type":"object","$defs":{"d":{"type":"object","properties":{"a":{}}}},"properties":{}}"#,
        ),
        (
            r#"{"type":"object","description":"has \"properties\" in words"}"#,
            r#"{"type":"object","description":"has \"properties\" in words","properties":{}}"#,
        ),
        (
            r#"{"type":"object","properties":{}}"#,
            r#"{"type":"object","properties":{}}"#,
        ),
        (
            r#"{"properties":{"a":{"type":"string"}},"type":"object"}"#,
            r#"{"properties":{"a":{"type":"string"}},"type":"object"}"#,
        ),
    ];
    for (schema, openai) in cases {
        let tool = Tool {
            name: "t".into(),
            description: "d".into(),
            input_schema_json: schema.into(),
            tier: Tier::Read,
        };
        let chat = parse(&render(&tool, Format::OpenAiChat));
        assert_eq!(
            chat["function"]["parameters"],
            parse(openai.as_bytes()),
            "{schema}"
        );
        let text = String::from_utf8(render(&tool, Format::OpenAiResponses)).unwrap();
        assert!(
            text.contains(&format!(r#""parameters":{openai},"#)),
            "{schema}: {text}"
        );
        assert_eq!(
            parse(&render(&tool, Format::Anthropic))["input_schema"],
            parse(schema.as_bytes())
        );
        let mcp = String::from_utf8(render(&tool, Format::Mcp)).unwrap();
        assert!(
            mcp.contains(&format!(r#""inputSchema":{schema}"#)),
            "{schema}: {mcp}"
        );
    }
}

#[test]
fn schema_numbers_are_kept_as_the_manifest_wrote_them() {
    let registry = Registry::from_sources([(
        "n.json",
        r#"{"name": "n", "tools": [{"name": "t", "description": "d", "input_schema":
            {"type": "object", "properties": {"big": {"type": "integer",
             "default": 12345678901234567890123, "maximum": 1e3, "minimum": -0.50}}}}]}"#,
    )])
    .unwrap();
    let tool = &registry.domains()[0].tools[0];
    // Digits as written, none lost to a float; only an exponent gets its sign spelled.
    let written = r#""default":12345678901234567890123,"maximum":1e+3,"minimum":-0.50"#;
    assert!(
        tool.input_schema_json.contains(written),
        "{}",
        tool.input_schema_json
    );
    for format in [
        Format::OpenAiChat,
        Format::OpenAiResponses,
        Format::Anthropic,
        Format::Mcp,
    ] {
        let text = String::from_utf8(render(tool, format)).unwrap();
        assert!(text.contains(written), "{format:?}: {text}");
    }
}

#[test]
fn a_gemini_tool_without_parameters_has_no_parameters() {
    let tool = Tool {
        name: "ping".into(),
        description: "Ping".into(),
        input_schema_json: r#"{"type":"object","properties":{}}"#.into(),
        tier: Tier::Read,
    };
    assert_eq!(
        parse(&render(&tool, Format::Gemini)),
        json!({"name":"ping","description":"Ping"})
    );
}

#[test]
fn tokens_are_each_tools_exact_count_and_spans_assemble_into_arrays() {
    let registry = Registry::demo();
    let renders = Renders::new(&registry);
    for format in Format::ALL {
        let r = renders.get(&registry, format);
        let mut total = 0;
        for i in 0..r.len() {
            let n = count_tokens(std::str::from_utf8(r.tool(i)).unwrap()) as u32;
            assert!(n > 0);
            assert_eq!(r.tokens(i..i + 1), n);
            total += n;
        }
        assert_eq!(r.tokens(0..r.len()), total);
        let mut domain_sum = 0;
        let mut pieces = Vec::new();
        for d in registry.domain_ids() {
            domain_sum += r.tokens(registry.tool_range(d));
            pieces.push(r.span(registry.tool_range(d)));
        }
        assert_eq!(domain_sum, total);
        let array = parse(&assemble(&pieces));
        assert_eq!(array.as_array().unwrap().len(), registry.tool_count());
        assert_eq!(array, parse(&assemble(&[r.all()])));
    }
    assert_eq!(parse(&assemble::<&[u8]>(&[])), json!([]));
    // A known count, so a change of encoding shows: "hello world" is 2 tokens in o200k_base.
    assert_eq!(count_tokens("hello world"), 2);
}
