//! Table-driven tests of every routing rule (SPEC §4 and §8), with search on and off.

use super::*;
use crate::matcher::MatchMode;
use crate::registry::Tier;

/// A small registry that has one domain for each rule:
/// `base` core (with a keyword, which must never count as a hit); `media` activated by a
/// set key; `torrent` activated by a key that is unset; `lights` with no keys; `nokw`
/// without keywords; `quiet` with `fallback = false`; `empty` without tools.
const MANIFESTS: &[(&str, &str)] = &[
    (
        "base.json",
        r#"{"name":"base","core":true,"keywords":["base"],"tools":[{"name":"b1","description":"B"}]}"#,
    ),
    (
        "media.json",
        r#"{"name":"media","settings_keys":["media_url","media_key"],"keywords":["movie","film"],
        "tools":[{"name":"m1","description":"M1"},{"name":"m2","description":"M2"}]}"#,
    ),
    (
        "torrent.json",
        r#"{"name":"torrent","settings_keys":["qbt_url","qbt_pass"],"keywords":["torrent","seeding"],
        "tools":[{"name":"t1","description":"T"}]}"#,
    ),
    (
        "lights.json",
        r#"{"name":"lights","keywords":["light"],"tools":[{"name":"l1","description":"L"}]}"#,
    ),
    (
        "nokw.json",
        r#"{"name":"nokw","tools":[{"name":"n1","description":"N"}]}"#,
    ),
    (
        "quiet.json",
        r#"{"name":"quiet","keywords":["quiet"],"fallback":false,"tools":[{"name":"q1","description":"Q"}]}"#,
    ),
    ("empty.json", r#"{"name":"empty","keywords":["empty"]}"#),
];

struct Fixture {
    registry: Registry,
    matcher: Matcher,
    index: SearchIndex,
    activation: Activation,
}

impl Fixture {
    fn inputs(&self) -> Inputs<'_> {
        Inputs {
            registry: &self.registry,
            matcher: &self.matcher,
            index: &self.index,
        }
    }

    fn route(&self, conversation: Option<&Conversation>, message: &str, options: &Options) -> Decision {
        route(self.inputs(), &self.activation, conversation, message, options)
    }
}

fn fixture() -> Fixture {
    let registry = Registry::from_sources(MANIFESTS.iter().copied()).unwrap();
    let matcher = Matcher::new(registry.keywords(), MatchMode::Word).unwrap();
    let settings = Snapshot::new([
        ("media_key".to_string(), "secret".to_string()),
        ("qbt_url".to_string(), "  ".to_string()),
    ]);
    let activation = Activation::new(&registry, &settings);
    Fixture {
        index: SearchIndex::new(&registry),
        registry,
        matcher,
        activation,
    }
}

fn conv(members: &[(&str, bool, bool)]) -> Conversation {
    Conversation {
        members: members
            .iter()
            .map(|&(d, loaded, hit)| Member {
                domain: d.into(),
                loaded,
                hit,
            })
            .collect(),
    }
}

use Reason::{Core, Fallback, Keyword, Loaded, Search, Sticky};
const ALL: FallbackPolicy = FallbackPolicy::AllActive;
const CORE_ONLY: FallbackPolicy = FallbackPolicy::CoreOnly;
type Members = &'static [(&'static str, bool, bool)];

/// One rule: a turn and what it must get.
struct Case {
    rule: &'static str,
    policy: FallbackPolicy,
    mode: SearchMode,
    /// `None`: no conversation. Members are (domain, loaded, hit).
    conversation: Option<Members>,
    message: &'static str,
    /// (domain, reason, matched keywords or search terms), in tool order.
    domains: &'static [(&'static str, Reason, &'static [&'static str])],
    fallback: bool,
    new_hits: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        rule: "CORE: active core domains come in every answer, first",
        policy: CORE_ONLY,
        mode: SearchMode::Off,
        conversation: None,
        message: "hello",
        domains: &[("base", Core, &[])],
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "HITS: an active non-core domain whose keyword is in the message",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: None,
        message: "play a movie",
        domains: &[("base", Core, &[]), ("media", Keyword, &["movie"])],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "matched keywords are listed in manifest order, each once",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: None,
        message: "film, movie, films",
        domains: &[("base", Core, &[]), ("media", Keyword, &["movie", "film"])],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "a core domain's keyword is never a hit, but it routes the message (no fallback)",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: None,
        message: "base",
        domains: &[("base", Core, &[])],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "a core keyword hit in a conversation joins nothing",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: Some(&[]),
        message: "base",
        domains: &[("base", Core, &[])],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "fallback all-active: core, then every active non-core fallback domain with tools, by name",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: None,
        message: "what can you do?",
        domains: &[
            ("base", Core, &[]),
            ("lights", Fallback, &[]),
            ("media", Fallback, &[]),
            ("nokw", Fallback, &[]),
        ],
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "fallback core-only: only core (and loaded) domains",
        policy: CORE_ONLY,
        mode: SearchMode::Off,
        conversation: None,
        message: "what can you do?",
        domains: &[("base", Core, &[])],
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "never while inactive: a keyword of an inactive domain is no hit",
        policy: CORE_ONLY,
        mode: SearchMode::Off,
        conversation: None,
        message: "is it seeding?",
        domains: &[("base", Core, &[])],
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "never while inactive: not by load",
        policy: CORE_ONLY,
        mode: SearchMode::Off,
        conversation: Some(&[("torrent", true, false)]),
        message: "hi",
        domains: &[("base", Core, &[])],
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "never while inactive: not by stickiness, and an inactive sticky domain does not stop the fallback",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: Some(&[("torrent", false, true)]),
        message: "hi",
        domains: &[
            ("base", Core, &[]),
            ("lights", Fallback, &[]),
            ("media", Fallback, &[]),
            ("nokw", Fallback, &[]),
        ],
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "a domain without keywords is never a hit, even when the message names it",
        policy: CORE_ONLY,
        mode: SearchMode::Off,
        conversation: None,
        message: "nokw n1",
        domains: &[("base", Core, &[])],
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "a hit domain without tools contributes no tools but still is a hit (no fallback)",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: Some(&[]),
        message: "empty",
        domains: &[("base", Core, &[])],
        fallback: false,
        new_hits: &["empty"],
    },
    Case {
        rule: "ordering without a conversation: core, then the other domains by name",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: None,
        message: "quiet light for the movie",
        domains: &[
            ("base", Core, &[]),
            ("lights", Keyword, &["light"]),
            ("media", Keyword, &["movie"]),
            ("quiet", Keyword, &["quiet"]),
        ],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "HITS join the conversation; domains joining on the same turn by name",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: Some(&[]),
        message: "quiet light",
        domains: &[
            ("base", Core, &[]),
            ("lights", Keyword, &["light"]),
            ("quiet", Keyword, &["quiet"]),
        ],
        fallback: false,
        new_hits: &["lights", "quiet"],
    },
    Case {
        rule: "STICKY: a domain hit on an earlier turn stays, and stops the fallback",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: Some(&[("media", false, true)]),
        message: "and now?",
        domains: &[("base", Core, &[]), ("media", Sticky, &[])],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "ordering with a conversation: members in join order before this turn's new hits",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: Some(&[("quiet", false, true)]),
        message: "a movie",
        domains: &[
            ("base", Core, &[]),
            ("quiet", Sticky, &[]),
            ("media", Keyword, &["movie"]),
        ],
        fallback: false,
        new_hits: &["media"],
    },
    Case {
        rule: "KEYWORD is the reason for a member hit again, in its join position; nothing new to record",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: Some(&[("quiet", false, true), ("media", false, true)]),
        message: "quiet movie",
        domains: &[
            ("base", Core, &[]),
            ("quiet", Keyword, &["quiet"]),
            ("media", Keyword, &["movie"]),
        ],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "LOADED: a loaded group comes in with the fallback, before the fallback domains, not twice",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: Some(&[("lights", true, false)]),
        message: "hi",
        domains: &[
            ("base", Core, &[]),
            ("lights", Loaded, &[]),
            ("media", Fallback, &[]),
            ("nokw", Fallback, &[]),
        ],
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "LOADED with core-only fallback: core and loaded",
        policy: CORE_ONLY,
        mode: SearchMode::Off,
        conversation: Some(&[("quiet", true, false)]),
        message: "hi",
        domains: &[("base", Core, &[]), ("quiet", Loaded, &[])],
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "LOADED comes in beside hits too; KEYWORD outranks LOADED; a loaded member that is hit is recorded as hit",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: Some(&[("quiet", true, false), ("media", true, false)]),
        message: "movie",
        domains: &[
            ("base", Core, &[]),
            ("quiet", Loaded, &[]),
            ("media", Keyword, &["movie"]),
        ],
        fallback: false,
        new_hits: &["media"],
    },
    Case {
        rule: "LOADED outranks STICKY",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: Some(&[("media", true, true)]),
        message: "hi",
        domains: &[("base", Core, &[]), ("media", Loaded, &[])],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "fallback domains do not join the conversation",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: Some(&[]),
        message: "hello",
        domains: &[
            ("base", Core, &[]),
            ("lights", Fallback, &[]),
            ("media", Fallback, &[]),
            ("nokw", Fallback, &[]),
        ],
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "a member whose domain no longer exists is skipped",
        policy: CORE_ONLY,
        mode: SearchMode::Off,
        conversation: Some(&[("gone", true, true)]),
        message: "hello",
        domains: &[("base", Core, &[])],
        fallback: true,
        new_hits: &[],
    },
];

/// Routes each case's turn and compares every domain, reason, matched keyword or search
/// term, the fallback flag and the new hits.
fn check(f: &Fixture, cases: &[Case]) {
    for case in cases {
        let mut options = Options {
            fallback: case.policy,
            ..Options::default()
        };
        options.search.mode = case.mode;
        let c = case.conversation.map(conv);
        let d = f.route(c.as_ref(), case.message, &options);
        let got: Vec<(&str, Reason, Vec<String>)> = d
            .domains
            .iter()
            .map(|i| {
                let mut matched: Vec<String> = d
                    .matched(i)
                    .iter()
                    .map(|&k| f.registry.keyword(k).to_string())
                    .collect();
                if i.reason == Search {
                    let hit = d.search_hit(i.domain).expect("a search domain has its hit");
                    assert!(hit.score > 0.0, "rule: {}", case.rule);
                    matched = hit.terms.clone();
                }
                (f.registry.domain(i.domain).name.as_str(), i.reason, matched)
            })
            .collect();
        let want: Vec<(&str, Reason, Vec<String>)> = case
            .domains
            .iter()
            .map(|&(n, r, k)| (n, r, k.iter().map(|s| s.to_string()).collect()))
            .collect();
        assert_eq!(got, want, "rule: {}", case.rule);
        assert_eq!(d.fallback, case.fallback, "fallback flag; rule: {}", case.rule);
        let new: Vec<&str> = d
            .new_hits
            .iter()
            .map(|&h| f.registry.domain(h).name.as_str())
            .collect();
        assert_eq!(new, case.new_hits, "new hits; rule: {}", case.rule);
    }
}

#[test]
fn every_routing_rule_holds() {
    check(&fixture(), CASES);
}

/// A registry whose tools say what they do, for the search rules: `system` core; `climate`,
/// `media`, `lights`, `docs` active; `adblock` inactive (its key is unset).
const SEARCH_MANIFESTS: &[(&str, &str)] = &[
    (
        "system.json",
        r#"{"name":"system","core":true,"keywords":["uptime"],"tools":[
            {"name":"disk_usage","description":"Show disk space used and free on the server"}]}"#,
    ),
    (
        "climate.json",
        r#"{"name":"climate","keywords":["thermostat"],"tools":[
            {"name":"set_temperature","description":"Set the target temperature of the heating"},
            {"name":"get_temperature","description":"Read the current room temperature"}]}"#,
    ),
    (
        "media.json",
        r#"{"name":"media","keywords":["movie"],"tools":[
            {"name":"play_film","description":"Play a film or a TV episode"},
            {"name":"pause_playback","description":"Pause what is playing"}]}"#,
    ),
    (
        "lights.json",
        r#"{"name":"lights","keywords":["lamp"],"tools":[
            {"name":"dim_light","description":"Dim a light in a room such as the hallway or kitchen"}]}"#,
    ),
    (
        "docs.json",
        r#"{"name":"docs","keywords":["paperless"],"tools":[
            {"name":"merge_documents","description":"Combine scanned documents into one PDF"}]}"#,
    ),
    (
        "adblock.json",
        r#"{"name":"adblock","settings_keys":["adblock_url"],"tools":[
            {"name":"block_ads","description":"Block ads and trackers for every phone on the network"}]}"#,
    ),
];

fn search_fixture() -> Fixture {
    let registry = Registry::from_sources(SEARCH_MANIFESTS.iter().copied()).unwrap();
    Fixture {
        matcher: Matcher::new(registry.keywords(), MatchMode::Word).unwrap(),
        index: SearchIndex::new(&registry),
        activation: Activation::new(&registry, &Snapshot::default()),
        registry,
    }
}

const ACTIVE_FALLBACK: &[(&str, Reason, &[&str])] = &[
    ("system", Core, &[]),
    ("climate", Fallback, &[]),
    ("docs", Fallback, &[]),
    ("lights", Fallback, &[]),
    ("media", Fallback, &[]),
];

const SEARCH_CASES: &[Case] = &[
    Case {
        rule: "search finds a domain whose keywords the message does not say",
        policy: ALL,
        mode: SearchMode::Augment,
        conversation: None,
        message: "turn the heating up a bit",
        domains: &[("system", Core, &[]), ("climate", Search, &["heating"])],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "each clause of a multi-request message finds its own domain",
        policy: ALL,
        mode: SearchMode::Augment,
        conversation: None,
        message: "pause the film and dim the hallway",
        domains: &[
            ("system", Core, &[]),
            ("lights", Search, &["dim", "hallway"]),
            // The terms its best tool (`pause_playback`) matched.
            ("media", Search, &["pause"]),
        ],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "search hits join keyword hits; a keyword hit keeps reason KEYWORD",
        policy: ALL,
        mode: SearchMode::Augment,
        conversation: None,
        message: "play the movie, then set the heating to 20 degrees",
        domains: &[
            ("system", Core, &[]),
            ("climate", Search, &["set", "heating"]),
            ("media", Keyword, &["movie"]),
        ],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "an inactive domain is never a search hit, and weaker domains do not take its place",
        policy: ALL,
        mode: SearchMode::Augment,
        conversation: None,
        message: "why do I still see ads on my phone?",
        domains: ACTIVE_FALLBACK,
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "a segment about a core domain gives no search hit",
        policy: ALL,
        mode: SearchMode::Augment,
        conversation: None,
        message: "how much disk space is free on the server",
        domains: ACTIVE_FALLBACK,
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "small talk has no search hit",
        policy: ALL,
        mode: SearchMode::Augment,
        conversation: None,
        message: "ok, thanks! do it please",
        domains: ACTIVE_FALLBACK,
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "greetings and farewells have no search hit either",
        policy: ALL,
        mode: SearchMode::Augment,
        conversation: None,
        message: "Good morning! How are you doing today? Nice one, talk to you later.",
        domains: ACTIVE_FALLBACK,
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "search off is keyword routing",
        policy: ALL,
        mode: SearchMode::Off,
        conversation: None,
        message: "turn the heating up a bit",
        domains: ACTIVE_FALLBACK,
        fallback: true,
        new_hits: &[],
    },
    Case {
        rule: "search fallback runs only when nothing else routed the message",
        policy: ALL,
        mode: SearchMode::Fallback,
        conversation: None,
        message: "play the movie, then set the heating to 20 degrees",
        domains: &[("system", Core, &[]), ("media", Keyword, &["movie"])],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "search fallback routes a message nothing else routed",
        policy: ALL,
        mode: SearchMode::Fallback,
        conversation: None,
        message: "turn the heating up a bit",
        domains: &[("system", Core, &[]), ("climate", Search, &["heating"])],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "search fallback does not run over a sticky conversation",
        policy: ALL,
        mode: SearchMode::Fallback,
        conversation: Some(&[("media", false, true)]),
        message: "turn the heating up a bit",
        domains: &[("system", Core, &[]), ("media", Sticky, &[])],
        fallback: false,
        new_hits: &[],
    },
    Case {
        rule: "a search hit joins the conversation like a keyword hit",
        policy: ALL,
        mode: SearchMode::Augment,
        conversation: Some(&[("lights", true, false)]),
        message: "turn the heating up a bit",
        domains: &[
            ("system", Core, &[]),
            ("lights", Loaded, &[]),
            ("climate", Search, &["heating"]),
        ],
        fallback: false,
        new_hits: &["climate"],
    },
    Case {
        rule: "a domain hit by search earlier is sticky",
        policy: ALL,
        mode: SearchMode::Augment,
        conversation: Some(&[("climate", false, true)]),
        message: "hi",
        domains: &[("system", Core, &[]), ("climate", Sticky, &[])],
        fallback: false,
        new_hits: &[],
    },
];

#[test]
fn every_search_routing_rule_holds() {
    check(&search_fixture(), SEARCH_CASES);
}

#[test]
fn tools_keep_manifest_order_after_the_meta_tool() {
    let f = fixture();
    let d = f.route(None, "movie", &Options::default());
    let names: Vec<(&str, &str)> = d
        .tools(&f.registry, &f.activation)
        .map(|(dom, t)| (dom, t.name.as_str()))
        .collect();
    assert_eq!(
        names,
        vec![
            ("", LOAD_TOOL_GROUP),
            ("", SEARCH_TOOLS),
            ("base", "b1"),
            ("media", "m1"),
            ("media", "m2")
        ]
    );
    assert_eq!(d.tool_count(&f.registry, &f.activation), names.len());
}

#[test]
fn the_meta_tool_enumerates_active_non_core_groups_with_tools_by_name() {
    let f = fixture();
    let meta = f.activation.meta_tool().expect("loadable groups exist");
    assert_eq!(meta.name, LOAD_TOOL_GROUP);
    assert_eq!(meta.tier, Tier::Read);
    let schema: serde_json::Value = serde_json::from_str(&meta.input_schema_json).unwrap();
    assert_eq!(schema["type"], "object");
    assert_eq!(schema["required"], serde_json::json!(["group_name"]));
    assert_eq!(schema["properties"]["group_name"]["type"], "string");
    assert_eq!(
        schema["properties"]["group_name"]["enum"],
        serde_json::json!(["lights", "media", "nokw", "quiet"])
    );
}

#[test]
fn the_meta_tool_is_left_out_when_turned_off_or_when_nothing_is_loadable() {
    let f = fixture();
    let off = Options {
        expose_load_tool_group: false,
        expose_search_tools: false,
        ..Options::default()
    };
    let d = f.route(None, "movie", &off);
    assert!(!d.meta_tool && !d.search_tool);
    assert_eq!(d.tools(&f.registry, &f.activation).next().unwrap().1.name, "b1");
    let search_only = Options {
        expose_load_tool_group: false,
        ..Options::default()
    };
    let d = f.route(None, "movie", &search_only);
    let first: Vec<&str> = d
        .tools(&f.registry, &f.activation)
        .take(2)
        .map(|(_, t)| t.name.as_str())
        .collect();
    assert_eq!(first, [SEARCH_TOOLS, "b1"]);

    let only_core = Registry::from_sources([MANIFESTS[0], MANIFESTS[6]]).unwrap();
    let m = Matcher::new(only_core.keywords(), MatchMode::Word).unwrap();
    let a = Activation::new(&only_core, &Snapshot::default());
    assert!(a.meta_tool().is_none() && a.search_tool().is_none());
    assert_eq!(a.prompt_section(&only_core, true), "");
    let index = SearchIndex::new(&only_core);
    let inputs = Inputs {
        registry: &only_core,
        matcher: &m,
        index: &index,
    };
    let d = route(inputs, &a, None, "x", &Options::default());
    assert!(!d.meta_tool && !d.search_tool);
}

#[test]
fn the_prompt_section_lists_loadable_groups_by_name() {
    let f = fixture();
    assert_eq!(
        f.activation.prompt_section(&f.registry, true),
        "## Available Tool Groups\n\nUse `load_tool_group` to load tools from a group before using them.\n\n\
         - lights: Tools from lights group\n- media: Tools from media group\n- nokw: Tools from nokw group\n- quiet: Tools from quiet group"
    );
}

#[test]
fn loading_answers_each_case_with_the_exact_text() {
    let f = fixture();
    let c = conv(&[("quiet", true, false)]);
    let load = |g: &str| super::load(&f.registry, &f.activation, &c, g);
    assert_eq!(
        load("nope").unwrap_err().to_string(),
        "Tool group 'nope' not found. Available groups: lights, media, nokw, quiet"
    );
    assert!(
        matches!(load("Media"), Err(Error::GroupNotFound { .. })),
        "names match case-sensitively"
    );
    assert!(
        matches!(load(" media"), Err(Error::GroupNotFound { .. })),
        "names are not trimmed"
    );
    let inactive = load("torrent").unwrap_err();
    assert!(matches!(inactive, Error::GroupNotConfigured { .. }));
    assert_eq!(
        inactive.to_string(),
        "Tool group 'torrent' is not configured: set one of qbt_url, qbt_pass."
    );
    let empty = load("empty").unwrap_err();
    assert!(matches!(empty, Error::GroupWithoutTools { .. }));
    assert_eq!(empty.to_string(), "Tool group 'empty' has no available tools.");
    let media = f.registry.find("media").unwrap();
    assert_eq!(
        load("media").unwrap(),
        Load {
            domain: media,
            already_loaded: false
        }
    );
    assert!(
        load("quiet").unwrap().already_loaded,
        "loading twice changes nothing"
    );
    assert!(
        load("base").unwrap().already_loaded,
        "a core domain is always loaded"
    );
}

#[test]
fn the_load_text_lists_each_tool_and_counts_one_tool_in_the_singular() {
    let f = fixture();
    assert_eq!(
        load_text(&f.registry, &f.activation, f.registry.find("media").unwrap()),
        "Loaded 2 tools from group 'Media':\n- m1: M1\n- m2: M2"
    );
    assert_eq!(
        load_text(&f.registry, &f.activation, f.registry.find("lights").unwrap()),
        "Loaded 1 tool from group 'Lights':\n- l1: L"
    );
}

#[test]
fn recording_hits_and_loads_keeps_join_order_and_changes_only_what_it_must() {
    use conversation::Mark::{Hit, Loaded};
    let m = |d: &str, loaded: bool, hit: bool| Member {
        domain: d.into(),
        loaded,
        hit,
    };
    struct Step {
        domains: &'static [&'static str],
        mark: conversation::Mark,
        /// The rows written: (position, domain, loaded, hit).
        rows: &'static [(usize, &'static str, bool, bool)],
        after: Members,
    }
    let steps = [
        Step {
            domains: &["lights", "quiet", "lights"],
            mark: Hit,
            rows: &[(0, "quiet", true, true), (1, "lights", false, true)],
            after: &[("quiet", true, true), ("lights", false, true)],
        },
        Step {
            domains: &["quiet", "lights"],
            mark: Hit,
            rows: &[],
            after: &[("quiet", true, true), ("lights", false, true)],
        },
        Step {
            domains: &["media", "lights", "nokw"],
            mark: Loaded,
            rows: &[
                (1, "lights", true, true),
                (2, "media", true, false),
                (3, "nokw", true, false),
            ],
            after: &[
                ("quiet", true, true),
                ("lights", true, true),
                ("media", true, false),
                ("nokw", true, false),
            ],
        },
    ];
    let mut c = conv(&[("quiet", true, false)]);
    for (n, step) in steps.iter().enumerate() {
        let change = c.change(step.domains.iter().copied(), step.mark);
        let rows: Vec<(usize, Member)> = step.rows.iter().map(|&(i, d, l, h)| (i, m(d, l, h))).collect();
        assert_eq!(change.rows, rows, "step {n}");
        assert_eq!(change.is_empty(), step.rows.is_empty(), "step {n}");
        c.apply(change);
        assert_eq!(c, conv(step.after), "step {n}");
    }
}

/// A profile from glob lists.
fn profile(allow_domains: &[&str], deny_domains: &[&str], deny_tools: &[&str], max_tier: Tier) -> Profile {
    let globs = |p: &[&str]| Patterns::new(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    Profile {
        allow_domains: globs(allow_domains),
        deny_domains: globs(deny_domains),
        deny_tools: globs(deny_tools),
        max_tier,
        ..Profile::open("p")
    }
}

/// One turn under a policy: what it must get.
struct PolicyCase {
    rule: &'static str,
    profile: Option<Profile>,
    /// The `toolrouter.disabled_tools` value, if any.
    disabled: Option<&'static str>,
    conversation: Option<Members>,
    message: &'static str,
    domains: &'static [(&'static str, Reason)],
    /// Every tool of the answer, meta-tools included, in order.
    tools: &'static [&'static str],
    /// The groups `load_tool_group`'s enum offers.
    loadable: &'static [&'static str],
}

#[test]
fn a_policy_routes_over_what_the_consumer_may_see() {
    const D: Tier = Tier::Destructive;
    let meta = ["load_tool_group", "search_tools"];
    let cases = vec![
        PolicyCase {
            rule: "a keyword hit on a domain the profile hides does not count: fallback over what it sees",
            profile: Some(profile(&["base", "media"], &[], &[], D)),
            disabled: None,
            conversation: None,
            message: "turn on the light",
            domains: &[("base", Core), ("media", Fallback)],
            tools: &["load_tool_group", "search_tools", "b1", "m1", "m2"],
            loadable: &["media"],
        },
        PolicyCase {
            rule: "a hit on a domain the profile sees routes as usual",
            profile: Some(profile(&["base", "media"], &[], &[], D)),
            disabled: None,
            conversation: None,
            message: "play a film",
            domains: &[("base", Core), ("media", Keyword)],
            tools: &["load_tool_group", "search_tools", "b1", "m1", "m2"],
            loadable: &["media"],
        },
        PolicyCase {
            rule: "denied tools leave the rest of their domain",
            profile: Some(profile(&[], &[], &["m2", "n*"], D)),
            disabled: None,
            conversation: None,
            message: "play a film",
            domains: &[("base", Core), ("media", Keyword)],
            tools: &["load_tool_group", "search_tools", "b1", "m1"],
            loadable: &["lights", "media", "quiet"],
        },
        PolicyCase {
            rule: "a hidden core domain is not in the answer and its keyword routes nothing",
            profile: Some(profile(&[], &["base"], &[], D)),
            disabled: None,
            conversation: None,
            message: "base",
            domains: &[("lights", Fallback), ("media", Fallback), ("nokw", Fallback)],
            tools: &["load_tool_group", "search_tools", "l1", "m1", "m2", "n1"],
            loadable: &["lights", "media", "nokw", "quiet"],
        },
        PolicyCase {
            rule: "max_tier read hides tools without a tier (they count as destructive)",
            profile: Some(profile(&[], &[], &[], Tier::Read)),
            disabled: None,
            conversation: None,
            message: "play a film",
            domains: &[],
            tools: &[],
            loadable: &[],
        },
        PolicyCase {
            rule: "a profile that hides nothing routes as no profile does: a keyword hit on a domain without tools routes the message",
            profile: Some(profile(&[], &[], &[], D)),
            disabled: None,
            conversation: None,
            message: "empty",
            domains: &[("base", Core)],
            tools: &["load_tool_group", "search_tools", "b1"],
            loadable: &["lights", "media", "nokw", "quiet"],
        },
        PolicyCase {
            rule: "a keyword hit on a domain without tools that the profile's domains leave out does not count",
            profile: Some(profile(&["base", "media"], &[], &[], D)),
            disabled: None,
            conversation: None,
            message: "empty",
            domains: &[("base", Core), ("media", Fallback)],
            tools: &["load_tool_group", "search_tools", "b1", "m1", "m2"],
            loadable: &["media"],
        },
        PolicyCase {
            rule: "disabled tools hide from a consumer without a profile; a domain left without tools is out",
            profile: None,
            disabled: Some(r#"["m*"]"#),
            conversation: None,
            message: "play a film",
            domains: &[("base", Core), ("lights", Fallback), ("nokw", Fallback)],
            tools: &["load_tool_group", "search_tools", "b1", "l1", "n1"],
            loadable: &["lights", "nokw", "quiet"],
        },
        PolicyCase {
            rule: "a disabled tool's words find nothing: search sees only what may be sent, so the message falls back",
            profile: None,
            disabled: Some(r#"["m2"]"#),
            conversation: None,
            message: "m2",
            domains: &[
                ("base", Core),
                ("lights", Fallback),
                ("media", Fallback),
                ("nokw", Fallback),
            ],
            tools: &["load_tool_group", "search_tools", "b1", "l1", "m1", "n1"],
            loadable: &["lights", "media", "nokw", "quiet"],
        },
        PolicyCase {
            rule: "disabled tools hide under every profile too",
            profile: Some(profile(&["lights", "media"], &[], &[], D)),
            disabled: Some(r#"["l1", "m2"]"#),
            conversation: None,
            message: "turn on the light",
            domains: &[("media", Fallback)],
            tools: &["load_tool_group", "search_tools", "m1"],
            loadable: &["media"],
        },
        PolicyCase {
            rule: "a conversation's loaded group the profile hides is not in the answer",
            profile: Some(profile(&["base", "media"], &[], &[], D)),
            disabled: None,
            conversation: Some(&[("lights", true, false), ("media", false, true)]),
            message: "hello",
            domains: &[("base", Core), ("media", Sticky)],
            tools: &["load_tool_group", "search_tools", "b1", "m1", "m2"],
            loadable: &["media"],
        },
        PolicyCase {
            rule: "a disabled-tools value that is not a JSON array is ignored",
            profile: None,
            disabled: Some("m1"),
            conversation: None,
            message: "play a film",
            domains: &[("base", Core), ("media", Keyword)],
            tools: &["load_tool_group", "search_tools", "b1", "m1", "m2"],
            loadable: &["lights", "media", "nokw", "quiet"],
        },
    ];
    let f = fixture();
    for mode in [SearchMode::Off, SearchMode::Augment] {
        for case in &cases {
            let mut rows = vec![("media_key".to_string(), "secret".to_string())];
            if let Some(d) = case.disabled {
                rows.push((DISABLED_TOOLS_KEY.to_string(), d.to_string()));
            }
            let settings = Snapshot::new(rows);
            let activation = Activation::scoped(&f.registry, &settings, case.profile.as_ref());
            let options = Options {
                search: SearchOptions {
                    mode,
                    ..SearchOptions::default()
                },
                ..Options::default()
            };
            let c = case.conversation.map(conv);
            let d = route(f.inputs(), &activation, c.as_ref(), case.message, &options);
            let domains: Vec<(&str, Reason)> = d
                .domains
                .iter()
                .map(|inc| (f.registry.domain(inc.domain).name.as_str(), inc.reason))
                .collect();
            assert_eq!(domains, case.domains, "{} ({mode:?})", case.rule);
            let tools: Vec<&str> = d
                .tools(&f.registry, &activation)
                .map(|(_, t)| t.name.as_str())
                .collect();
            assert_eq!(tools, case.tools, "{}", case.rule);
            assert_eq!(
                d.tool_count(&f.registry, &activation),
                tools.len(),
                "{}",
                case.rule
            );
            let loadable: Vec<&str> = activation
                .loadable()
                .iter()
                .map(|&d| f.registry.domain(d).name.as_str())
                .collect();
            assert_eq!(loadable, case.loadable, "{}", case.rule);
            if let Some(m) = activation.meta_tool() {
                assert!(!case.loadable.is_empty() && tools.starts_with(&meta));
                let schema: serde_json::Value = serde_json::from_str(&m.input_schema_json).unwrap();
                assert_eq!(
                    schema["properties"]["group_name"]["enum"],
                    serde_json::json!(case.loadable),
                    "{}: the meta-tool offers only what the consumer sees",
                    case.rule
                );
            }
        }
    }
}

#[test]
fn a_load_under_a_policy_sees_only_what_the_consumer_may_see() {
    let f = fixture();
    let settings = Snapshot::new([
        ("media_key".to_string(), "secret".to_string()),
        (DISABLED_TOOLS_KEY.to_string(), r#"["l1"]"#.to_string()),
    ]);
    let p = profile(&["media", "lights", "torrent"], &[], &["m2"], Tier::Destructive);
    let activation = Activation::scoped(&f.registry, &settings, Some(&p));
    let c = conv(&[]);
    let load = |g: &str| super::load(&f.registry, &activation, &c, g).map_err(|e| e.to_string());
    assert_eq!(
        load("nokw").unwrap_err(),
        "Tool group 'nokw' has no available tools.",
        "a group the profile's domain patterns refuse has none"
    );
    assert_eq!(
        load("nope").unwrap_err(),
        "Tool group 'nope' not found. Available groups: media",
        "an unknown group lists the groups this consumer may load"
    );
    assert_eq!(
        load("lights").unwrap_err(),
        "Tool group 'lights' has no available tools.",
        "a group whose tools are all hidden has none"
    );
    assert_eq!(
        load("torrent").unwrap_err(),
        "Tool group 'torrent' is not configured: set one of qbt_url, qbt_pass."
    );
    let media = load("media").unwrap();
    assert_eq!(
        load_text(&f.registry, &activation, media.domain),
        "Loaded 1 tool from group 'Media':\n- m1: M1",
        "the load text lists only visible tools"
    );
    // An unconfigured group the profile leaves empty: its keys would not help this consumer.
    let p = profile(&["torrent"], &[], &["t*"], Tier::Destructive);
    let activation = Activation::scoped(&f.registry, &settings, Some(&p));
    assert_eq!(
        super::load(&f.registry, &activation, &c, "torrent")
            .unwrap_err()
            .to_string(),
        "Tool group 'torrent' has no available tools.",
        "a group the profile leaves no tools has none, configured or not"
    );
}

#[test]
fn a_tool_call_check_gives_every_reason_in_order() {
    let f = fixture();
    let settings = Snapshot::new([(DISABLED_TOOLS_KEY.to_string(), r#"["n1"]"#.to_string())]);
    let p = profile(&[], &["quiet"], &["l1"], Tier::Destructive);
    let activation = Activation::scoped(&f.registry, &settings, Some(&p));
    let shown = |d: DomainId| f.registry.domain(d).name != "media" && f.registry.domain(d).name != "torrent";
    let cases: &[(&str, Option<&Profile>, Option<Refusal>)] = &[
        ("nope", Some(&p), Some(Refusal::UnknownTool)),
        ("q1", Some(&p), Some(Refusal::DeniedByProfile)),
        ("l1", Some(&p), Some(Refusal::DeniedByProfile)),
        ("n1", Some(&p), Some(Refusal::Disabled)),
        (
            "t1",
            Some(&p),
            Some(Refusal::NotConfigured {
                keys: vec!["qbt_url".into(), "qbt_pass".into()],
            }),
        ),
        (
            "m1",
            Some(&p),
            Some(Refusal::NotConfigured {
                keys: vec!["media_url".into(), "media_key".into()],
            }),
        ),
        ("b1", Some(&p), None),
        ("l1", None, None),
    ];
    for (tool, profile, want) in cases {
        let activation = match profile {
            Some(_) => activation.clone(),
            None => Activation::new(&f.registry, &settings),
        };
        let (_, got) = check_call(&f.registry, &settings, *profile, &activation, tool, shown);
        assert_eq!(&got, want, "{tool}");
    }
    let configured = Snapshot::new([("media_key".to_string(), "k".to_string())]);
    let activation = Activation::scoped(&f.registry, &configured, Some(&p));
    let (d, got) = check_call(&f.registry, &configured, Some(&p), &activation, "m1", shown);
    assert_eq!(f.registry.domain(d.unwrap()).name, "media");
    assert_eq!(
        got,
        Some(Refusal::NeedsLoad {
            group: "media".into()
        }),
        "configured but not in the answer now: load it"
    );
}
