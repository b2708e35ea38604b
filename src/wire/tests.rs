#![allow(clippy::single_range_in_vec_init)] // cuts of the tool list, one range or several

use bytes::Bytes;
use prost::Message;

use super::*;
use crate::registry::Registry;
use crate::render::{Encoded, Format, Renders, assemble, native};

/// The first byte of a message with only field `f` set: its key, when `f` < 16.
fn key_of(encoded: &[u8]) -> u32 {
    u32::from(encoded[0]) >> 3
}

#[test]
fn the_field_numbers_are_the_protos() {
    let tool = Some(proto::Tool::default()).into_iter().collect::<Vec<_>>();
    let route = |m: proto::RouteResponse| key_of(&m.encode_to_vec());
    let all = |m: proto::ListAllToolsResponse| key_of(&m.encode_to_vec());
    assert_eq!(
        route(proto::RouteResponse {
            tools: tool.clone(),
            ..Default::default()
        }),
        Encoded::FIELD
    );
    assert_eq!(
        all(proto::ListAllToolsResponse {
            tools: tool,
            ..Default::default()
        }),
        Encoded::FIELD
    );
    assert_eq!(
        route(proto::RouteResponse {
            tools_json: b"[]".to_vec(),
            ..Default::default()
        }),
        ROUTE_TOOLS_JSON
    );
    assert_eq!(
        all(proto::ListAllToolsResponse {
            tools_json: b"[]".to_vec(),
            ..Default::default()
        }),
        LIST_ALL_TOOLS_JSON
    );
}

/// Every way of cutting the registry's tools into runs, with and without tools of the
/// message's own, decodes as the plain message holding the same tools in the same order.
#[test]
fn spliced_native_tools_decode_as_the_plain_message() {
    let registry = Registry::demo();
    let encoded = Encoded::new(&registry);
    let all: Vec<proto::Tool> = registry
        .domains()
        .iter()
        .flat_map(|d| d.tools.iter().map(|t| native(&d.name, t)))
        .collect();
    let own = native("", &registry.domains()[0].tools[0]);
    let n = all.len();
    for cuts in [vec![], vec![0..n], vec![0..1, 1..n], vec![2..5, 7..9, 9..n]] {
        for with_own in [false, true] {
            let mut message = proto::RouteResponse {
                fallback: true,
                registry_version: 42,
                tokens: 7,
                ..Default::default()
            };
            if with_own {
                message.tools.push(own.clone());
            }
            let entries: Vec<Bytes> = cuts.iter().map(|r| encoded.span(r.clone())).collect();
            let spliced = Spliced::new(message.clone()).with_entries(entries);
            let bytes = spliced.encode_to_vec();
            assert_eq!(bytes.len(), spliced.encoded_len());
            let mut expected = message;
            expected
                .tools
                .extend(cuts.iter().flat_map(|r| all[r.clone()].iter().cloned()));
            assert_eq!(proto::RouteResponse::decode(&bytes[..]).unwrap(), expected);
            // And the spliced answer decodes as itself (its fields land in the message).
            assert_eq!(RouteResponse::decode(&bytes[..]).unwrap().message, expected);
        }
    }
}

#[test]
fn a_spliced_json_array_decodes_as_the_assembled_one() {
    let registry = Registry::demo();
    let renders = Renders::new(&registry);
    let r = renders.get(&registry, Format::Anthropic);
    let n = r.len();
    for cuts in [
        vec![],
        vec![0..0],
        vec![0..n],
        vec![0..1, 1..1, 1..n],
        vec![3..4, 6..n, 0..0],
    ] {
        let pieces: Vec<Bytes> = cuts.iter().map(|c| r.span(c.clone())).collect();
        let message = proto::ListAllToolsResponse {
            tokens: 3,
            registry_version: 9,
            ..Default::default()
        };
        let spliced = Spliced::new(message.clone()).with_array(LIST_ALL_TOOLS_JSON, pieces.clone());
        let bytes = spliced.encode_to_vec();
        assert_eq!(bytes.len(), spliced.encoded_len());
        let decoded = proto::ListAllToolsResponse::decode(&bytes[..]).unwrap();
        let tools_json = assemble(&pieces);
        let parsed: serde_json::Value = serde_json::from_slice(&tools_json).unwrap();
        let tools: usize = cuts.iter().map(|c| c.len()).sum();
        assert_eq!(parsed.as_array().unwrap().len(), tools);
        assert_eq!(
            decoded,
            proto::ListAllToolsResponse {
                tools_json,
                ..message
            }
        );
    }
}

/// Decisions written from borrowed values are the bytes prost writes for the message.
#[test]
fn a_decision_is_written_as_prost_writes_it() {
    let terms = ["heating".to_string(), "thermostat".to_string()];
    let long = "d".repeat(200);
    /// (domain, reason, matched keywords, matched terms, score, tokens)
    type Case<'a> = (&'a str, proto::Reason, Vec<&'a str>, &'a [String], f32, u32);
    let cases: Vec<Case> = vec![
        ("docker", proto::Reason::Fallback, vec![], &[], 0.0, 1234),
        (
            "docker",
            proto::Reason::Keyword,
            vec!["container", "docker"],
            &[],
            0.0,
            7,
        ),
        ("climate", proto::Reason::Search, vec![], &terms, 3.25, 300_000),
        ("", proto::Reason::Unspecified, vec![""], &[], -0.0, 0),
        (
            &long,
            proto::Reason::Core,
            vec![&long],
            &terms[..1],
            f32::MIN_POSITIVE,
            u32::MAX,
        ),
    ];
    for (domain, reason, keywords, terms, score, tokens) in cases {
        let want = proto::RouteResponse {
            domains: vec![proto::DomainDecision {
                domain: domain.to_string(),
                reason: reason.into(),
                matched_keywords: keywords.iter().map(|k| k.to_string()).collect(),
                matched_terms: terms.to_vec(),
                score,
                tokens,
            }],
            ..Default::default()
        }
        .encode_to_vec();
        let mut got = Vec::new();
        Decision {
            domain,
            reason,
            matched_keywords: keywords.iter().copied(),
            matched_terms: terms,
            score,
            tokens,
        }
        .put(&mut got);
        assert_eq!(got, want, "{domain} {reason:?}");
    }
}
