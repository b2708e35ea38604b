//! Table-driven tests of scoring: word pairs and the IDF over domains.

use super::*;

/// `forecast` has a tool that says "weather forecast" and tools that say "weather" and
/// "forecast" apart (`sales` forecasts, `garden` weather). `clinic` has many tools that all
/// say "patient"; `notes` has one tool that says "patient" among other words.
const MANIFESTS: &[(&str, &str)] = &[
    (
        "forecast.json",
        r#"{"name":"forecast","tools":[{"name":"get_outlook","description":"Weather forecast for a city"}]}"#,
    ),
    (
        "sales.json",
        r#"{"name":"sales","tools":[{"name":"project_revenue","description":"Forecast revenue and weather a downturn"}]}"#,
    ),
    (
        "garden.json",
        r#"{"name":"garden","tools":[{"name":"plan_beds","description":"Plan garden beds for the weather and the forecast season"}]}"#,
    ),
    (
        "clinic.json",
        r#"{"name":"clinic","tools":[
            {"name":"admit","description":"Admit a patient"},
            {"name":"discharge","description":"Discharge a patient"},
            {"name":"transfer","description":"Transfer a patient to a ward"},
            {"name":"chart","description":"Read a patient chart"}]}"#,
    ),
    (
        "notes.json",
        r#"{"name":"notes","tools":[{"name":"write_note","description":"Write a note about a meeting, a patient or a trip"}]}"#,
    ),
];

fn index() -> (Registry, SearchIndex) {
    let registry = Registry::from_sources(MANIFESTS.iter().copied()).unwrap();
    let index = SearchIndex::new(&registry);
    (registry, index)
}

/// The domains a query ranks, best first, by name.
fn ranked(registry: &Registry, index: &SearchIndex, query: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for hit in index.search_tools(query, 20, None) {
        let name = &registry.domain(hit.domain).name;
        if !out.contains(name) {
            out.push(name.clone());
        }
    }
    out
}

#[test]
fn scoring_ranks_by_word_pairs_and_by_domain_rarity() {
    let (registry, index) = index();
    let cases: &[(&str, &str, &str)] = &[
        (
            "two words said together rank the tool that says them together first",
            "what is the weather forecast",
            "forecast",
        ),
        (
            "the same words apart do not count as a pair",
            "forecast the revenue; weather aside",
            "sales",
        ),
    ];
    for (rule, query, first) in cases {
        let got = ranked(&registry, &index, query);
        assert_eq!(
            got.first().map(String::as_str),
            Some(*first),
            "{rule}: {query:?} ranked {got:?}"
        );
    }
}

#[test]
fn a_pair_is_explained_by_its_words_only() {
    let (registry, index) = index();
    let hits = index.search_tools("weather forecast", 1, None);
    assert_eq!(registry.domain(hits[0].domain).name, "forecast");
    assert_eq!(hits[0].terms, ["weather", "forecast"]);
}

#[test]
fn a_pair_outscores_its_words_apart() {
    let (_, index) = index();
    let together = index.search_tools("weather forecast", 1, None)[0].score;
    // A word the index does not have breaks the pair, as in a document.
    let apart = index.search_tools("weather zebra forecast", 1, None)[0].score;
    assert!(together > apart, "together {together} vs apart {apart}");
}

#[test]
fn a_word_many_tools_of_one_domain_share_counts_more_with_the_domain_idf() {
    let registry = Registry::from_sources(MANIFESTS.iter().copied()).unwrap();
    // "patient": five tools, two domains; "meeting": one tool, one domain.
    let ratio = |domain_idf: f32| {
        let index = SearchIndex::with_params(
            &registry,
            &Bm25 {
                domain_idf,
                ..Bm25::default()
            },
        );
        let patient = index.search_tools("patient", 1, None)[0].score;
        let meeting = index.search_tools("meeting", 1, None)[0].score;
        patient / meeting
    };
    assert!(
        ratio(Bm25::default().domain_idf) > ratio(0.0),
        "{} vs {}",
        ratio(Bm25::default().domain_idf),
        ratio(0.0)
    );
}

/// Every domain one segment scores (a segment is scored on its own), best first, ties by
/// domain.
fn segment_scores(index: &SearchIndex, segment: &str) -> Vec<(DomainId, f32)> {
    let every = SearchOptions {
        min_ratio: 0.0,
        weak_min_ratio: 0.0,
        per_segment: usize::MAX,
        segment_share: 1.0,
        segment_ratio: 0.0,
        ..SearchOptions::default()
    };
    let mut scores: Vec<(DomainId, f32)> = index
        .domain_hits(segment, &every, None, |_| true)
        .into_iter()
        .map(|h| (h.domain, h.score))
        .collect();
    scores.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scores
}

/// The hits the module documentation describes, from each segment's scores: per segment
/// that counts, the best `per_segment` domains at or above `min_ratio` of its best, then
/// those at or above its own share, which rises from `min_ratio` to `weak_min_ratio` as the
/// segment's best falls against the message's best, while their tools (`size` of each)
/// stay within `segment_share` of the registry's `tools` or `segment_min_tools`, whichever
/// is more, the segment's best domain itself always.
fn described_hits(
    segments: &[Vec<(DomainId, f32)>],
    o: &SearchOptions,
    size: impl Fn(DomainId) -> usize,
    tools: usize,
) -> Vec<DomainId> {
    let top = |s: &Vec<(DomainId, f32)>| s.first().map_or(0.0, |h| h.1);
    let message_top = segments.iter().map(top).fold(0f32, f32::max);
    let mut hits: Vec<DomainId> = Vec::new();
    for s in segments {
        let t = top(s);
        if s.is_empty() || t < o.segment_ratio * message_top {
            continue;
        }
        let share = o.min_ratio + (o.weak_min_ratio - o.min_ratio).max(0.0) * (1.0 - t / message_top);
        let mut sent = 0;
        hits.extend(
            s.iter()
                .filter(|h| h.1 >= o.min_ratio * t)
                .take(o.per_segment)
                .take_while(|h| h.1 >= share * t)
                .take_while(|h| {
                    sent += size(h.0);
                    h.1 >= t
                        || sent as f32 <= (o.segment_share * tools as f32).max(o.segment_min_tools as f32)
                })
                .map(|h| h.0),
        );
    }
    hits.sort();
    hits.dedup();
    hits
}

#[test]
fn a_weaker_segment_asks_more_of_its_domains_and_a_segment_brings_a_bounded_share_of_tools() {
    let (registry, index) = index();
    let messages: &[&[&str]] = &[
        &["weather forecast for the city", "plan the beds"],
        &["write a note about the meeting", "weather for the trip"],
        &[
            "admit a patient",
            "transfer a patient to a ward",
            "forecast revenue",
        ],
        &["read the chart", "weather forecast"],
        &["plan garden beds for the forecast season", "a patient"],
    ];
    let options: Vec<SearchOptions> = [(0.5, 0.5), (0.5, 0.3), (0.45, 0.75), (0.3, 0.9), (0.2, 1.0)]
        .iter()
        .flat_map(|&(min_ratio, weak_min_ratio)| {
            [
                (8, 1.0, 0, 0.0),
                (1, 1.0, 0, 0.0),
                (8, 1.0, 0, 0.5),
                (8, 0.3, 0, 0.0),
                (8, 0.0, 0, 0.0),
                (8, 0.0, 2, 0.0),
                (8, 0.1, 5, 0.0),
            ]
            .map(|(per_segment, segment_share, segment_min_tools, segment_ratio)| {
                SearchOptions {
                    min_ratio,
                    weak_min_ratio,
                    per_segment,
                    segment_share,
                    segment_min_tools,
                    segment_ratio,
                    ..SearchOptions::default()
                }
            })
        })
        .collect();
    let names =
        |hits: &[DomainId]| -> Vec<&str> { hits.iter().map(|&d| registry.domain(d).name.as_str()).collect() };
    let size = |d: DomainId| registry.domain(d).tools.len();
    let (mut weakness_mattered, mut share_mattered) = (false, false);
    for segments in messages {
        let scores: Vec<_> = segments.iter().map(|s| segment_scores(&index, s)).collect();
        let message = segments.join(". ");
        for o in &options {
            let got: Vec<DomainId> = index
                .domain_hits(&message, o, None, |_| true)
                .iter()
                .map(|h| h.domain)
                .collect();
            let want = described_hits(&scores, o, size, registry.tool_count());
            assert_eq!(names(&got), names(&want), "{message:?} with {o:?}");
            // Asking no more of weak segments than of the best one is the plain ratio.
            let plain = SearchOptions {
                weak_min_ratio: o.min_ratio,
                ..*o
            };
            let before = described_hits(&scores, &plain, size, registry.tool_count());
            assert!(
                want.iter().all(|d| before.contains(d)),
                "{message:?}: a stricter share added a hit"
            );
            weakness_mattered |= want != before;
            // A cap in tools only takes hits away, never a segment's best.
            let uncapped = described_hits(
                &scores,
                &SearchOptions {
                    segment_share: 1.0,
                    ..*o
                },
                size,
                registry.tool_count(),
            );
            assert!(
                want.iter().all(|d| uncapped.contains(d)),
                "{message:?}: a cap in tools added a hit"
            );
            let message_top = scores
                .iter()
                .filter_map(|s| s.first())
                .map(|b| b.1)
                .fold(0f32, f32::max);
            let mut bests = scores.iter().filter_map(|s| s.first());
            assert!(
                bests.all(|b| b.1 < o.segment_ratio * message_top || want.contains(&b.0)),
                "{message:?}: a cap in tools took a segment's best"
            );
            share_mattered |= want != uncapped;
        }
    }
    assert!(weakness_mattered, "no case where a weak segment lost a domain");
    assert!(share_mattered, "no case where the cap in tools took a domain");
}

#[test]
fn the_cap_in_tools_spares_only_the_segments_best_itself_and_keeps_hits_that_reach_it_exactly() {
    let (registry, index) = index();
    let message = "weather forecast";
    // Every domain that scores, best first: here three of one tool each.
    let scores = segment_scores(&index, message);
    let ranked: Vec<DomainId> = scores.iter().map(|s| s.0).collect();
    assert_eq!(ranked.len(), 3, "{scores:?}");
    assert!(ranked.iter().all(|&d| registry.domain(d).tools.len() == 1));
    let best = ranked[0];
    let capped = |segment_min_tools: usize| SearchOptions {
        min_ratio: 0.0,
        weak_min_ratio: 0.0,
        per_segment: usize::MAX,
        segment_share: 0.0,
        segment_min_tools,
        segment_ratio: 0.0,
        ..SearchOptions::default()
    };
    let hits = |o: &SearchOptions, eligible: &dyn Fn(DomainId) -> bool| -> Vec<DomainId> {
        let mut got: Vec<DomainId> = index
            .domain_hits(message, o, None, eligible)
            .iter()
            .map(|h| h.domain)
            .collect();
        got.sort();
        got
    };
    let sorted = |mut d: Vec<DomainId>| {
        d.sort();
        d
    };
    // (minimum tools, whether the best is a candidate, hits)
    let cases = [
        // A cap of nothing: the best alone, whatever its size.
        (0, true, vec![best]),
        // The best is no candidate (a keyword hit, inactive, hidden): the runner-up behind it
        // is capped like the others, not spared in its place.
        (0, false, vec![]),
        (1, false, vec![ranked[1]]),
        // Hits whose tools reach the cap exactly are kept; one more is not.
        (2, true, sorted(ranked[..2].to_vec())),
        (2, false, sorted(ranked[1..3].to_vec())),
        (3, true, sorted(ranked.clone())),
    ];
    for (min_tools, best_is_candidate, want) in cases {
        let eligible = |d: DomainId| best_is_candidate || d != best;
        assert_eq!(
            hits(&capped(min_tools), &eligible),
            want,
            "min tools {min_tools}, best a candidate: {best_is_candidate}"
        );
    }
}

#[test]
fn a_tool_the_consumer_cannot_see_sets_no_bar_for_its_own_domain() {
    let registry = Registry::from_sources([
        (
            "weather.json",
            r#"{"name":"weather","tools":[
                {"name":"weather_forecast","description":"Get the weather forecast temperature rain for a city"},
                {"name":"conditions_now","description":"Current conditions outside: wind and rain"}]}"#,
        ),
        (
            "news.json",
            r#"{"name":"news","tools":[{"name":"headlines","description":"Read the news headlines"}]}"#,
        ),
        (
            "radar.json",
            r#"{"name":"radar","tools":[{"name":"rain_radar","description":"Rain radar temperature map"}]}"#,
        ),
    ])
    .unwrap();
    let index = SearchIndex::new(&registry);
    let weather = registry.find("weather").unwrap();
    let radar = registry.find("radar").unwrap();
    let every = vec![true; registry.tool_count()];
    // Visibility is in registry order (domains by name, then manifest order).
    let mut forecast_hidden = every.clone();
    forecast_hidden[registry.tool_range(weather).start] = false;
    // (visible tools, whether radar is a candidate, domains hit)
    let cases: [(&str, &[bool], bool, Vec<DomainId>); 6] = [
        ("weather forecast temperature rain", &every, true, vec![weather]),
        // The forecast is none of weather's for this consumer: weather's visible tool is
        // measured against what the consumer may be sent, so it still comes (beside radar,
        // now as close a match).
        (
            "weather forecast temperature rain",
            &forecast_hidden,
            true,
            vec![radar, weather],
        ),
        // A domain that is no candidate (inactive, say) still counts whole: it is the
        // segment's best, and weaker ones are not handed its hits.
        (
            "rain radar temperature weather",
            &forecast_hidden,
            true,
            vec![radar],
        ),
        ("rain radar temperature weather", &forecast_hidden, false, vec![]),
        // Only the hidden tool has the words: its domain scores nothing the consumer may be
        // sent, and nothing is a hit (the message falls back, as if the tool were not there).
        ("forecast for a city", &every, true, vec![weather]),
        ("forecast for a city", &forecast_hidden, true, vec![]),
    ];
    for (message, visible, radar_candidate, want) in cases {
        let mut got: Vec<DomainId> = index
            .domain_hits(message, &SearchOptions::default(), Some(visible), |d| {
                radar_candidate || d != radar
            })
            .iter()
            .map(|h| h.domain)
            .collect();
        got.sort();
        assert_eq!(
            got, want,
            "{message:?}, visible {visible:?}, radar a candidate: {radar_candidate}"
        );
    }
}

/// A hidden tool is no part of its domain for the consumer: a keyword-hit domain's hidden
/// tool sets no bar for the segment (the visible matches it would have outscored are
/// hits), and hidden tools take no room under the segment's cap. A domain hidden whole still
/// sets the bar: its hit does not count, and the message falls back over what the consumer
/// sees (SPEC §10) rather than going to a weaker match.
#[test]
fn a_hidden_tool_sets_no_bar_and_takes_no_room() {
    let bulk = std::iter::once(
        r#"{"name":"bulk_resize","description":"Resize photo album thumbnails"}"#.to_string(),
    )
    .chain((0..30).map(|i| format!(r#"{{"name":"bulk_h{i}","description":"Unrelated chore {i}"}}"#)))
    .collect::<Vec<_>>()
    .join(",");
    let bulk = format!(r#"{{"name":"bulk","tools":[{bulk}]}}"#);
    let registry = Registry::from_sources([
        (
            "weather.json",
            r#"{"name":"weather","keywords":["weather"],"tools":[
                {"name":"weather_forecast","description":"Weather forecast with barometer readings for a city"}]}"#,
        ),
        (
            "zorblax.json",
            r#"{"name":"zorblax","tools":[
                {"name":"zorblax_calibrate","description":"Calibrate the quantum flux capacitor pressure gauge"},
                {"name":"zorblax_purge","description":"Purge the fluxium reservoir"}]}"#,
        ),
        (
            "mixed.json",
            r#"{"name":"mixed","keywords":["widget"],"tools":[
                {"name":"mixed_list","description":"List the widgets"},
                {"name":"mixed_quindle","description":"Vent the quindle reservoir pressure gauge"}]}"#,
        ),
        (
            "gallery.json",
            r#"{"name":"gallery","tools":[
                {"name":"photo_album_list","description":"List the pictures of a photo album"},
                {"name":"photo_album_share","description":"Share a photo album"}]}"#,
        ),
        ("bulk.json", bulk.as_str()),
    ])
    .unwrap();
    let index = SearchIndex::new(&registry);
    let hiding = |tools: &[&str]| -> Vec<bool> {
        registry
            .domains()
            .iter()
            .flat_map(|d| d.tools.iter())
            .map(|t| {
                !tools.iter().any(|h| {
                    t.name == *h || (h.ends_with('*') && t.name.starts_with(h.trim_end_matches('*')))
                })
            })
            .collect()
    };
    // (message, hidden tools, keyword-hit domains (no candidates), domains hit)
    type Case<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);
    let cases: [Case; 7] = [
        (
            "calibrate the quantum capacitor barometer",
            &[],
            &[],
            &["zorblax"],
        ),
        // zorblax hidden whole: not handed on to weather's weaker match.
        (
            "calibrate the quantum capacitor barometer",
            &["zorblax_*"],
            &[],
            &[],
        ),
        // zorblax's calibrating tool hidden: its purge tool is what the domain is here, and
        // weather's match is the best.
        (
            "calibrate the quantum capacitor barometer",
            &["zorblax_calibrate"],
            &[],
            &["weather"],
        ),
        // mixed is a keyword hit; its hidden quindle tool's words set no bar for zorblax.
        (
            "widget: vent quindle reservoir",
            &["mixed_quindle"],
            &["mixed"],
            &["zorblax"],
        ),
        ("widget: vent quindle reservoir", &[], &["mixed"], &[]),
        // bulk's 30 hidden tools take no room beside gallery under the 30-tool cap.
        ("photo album", &["bulk_h*"], &[], &["bulk", "gallery"]),
        ("photo album", &[], &[], &["gallery"]),
    ];
    for (message, hidden, keyword_hits, want) in cases {
        let visible = hiding(hidden);
        let mut got: Vec<&str> = index
            .domain_hits(message, &SearchOptions::default(), Some(&visible), |d| {
                let name = registry.domain(d).name.as_str();
                !keyword_hits.contains(&name) && registry.tool_range(d).any(|t| visible[t])
            })
            .iter()
            .map(|h| registry.domain(h.domain).name.as_str())
            .collect();
        got.sort_unstable();
        assert_eq!(got, want, "{message:?}, hidden {hidden:?}");
    }
}

/// Words around the 15-byte edge of the packed keys, words that differ only in length or
/// past the edge, and non-ASCII words: each finds its own entry and nothing else.
#[test]
fn surface_keys_tell_every_word_apart() {
    let words = [
        "a",
        "ab",
        "ab\u{0}",
        "fifteen-bytes-x",
        "fifteen-bytes-xy",
        "fifteen-bytes-xyz",
        "sixteen-bytes-xy-and-longer",
        "sixteen-bytes-xy-and-longer!",
        "café",
        "cafe",
        "日本語のことば",
        "日本語のことばと長い言葉",
    ];
    let mut surface = Surface::default();
    for (i, word) in words.iter().enumerate() {
        let made = surface.get_or_insert_with(word, || (i % 3 != 0).then_some(i as TermId));
        assert_eq!(made, (i % 3 != 0).then_some(i as TermId), "{word:?}");
    }
    // Inserting again keeps the first entry.
    assert_eq!(surface.get_or_insert_with("café", || Some(99)), Some(8));
    assert_eq!(surface.get_or_insert_with("cafe", || Some(99)), None);
    assert_eq!(
        surface.get_or_insert_with("sixteen-bytes-xy-and-longer", || Some(99)),
        None
    );
    assert_eq!(
        surface.get_or_insert_with("sixteen-bytes-xy-and-longer!", || Some(99)),
        Some(7)
    );
    for (i, word) in words.iter().enumerate() {
        assert_eq!(
            surface.get(word),
            Some((i % 3 != 0).then_some(i as TermId)),
            "{word:?}"
        );
    }
    for unseen in [
        "",
        "abc",
        "fifteen-bytes-",
        "sixteen-bytes-xy-and-longe",
        "caf",
        "日本語",
    ] {
        assert_eq!(surface.get(unseen), None, "{unseen:?}");
    }
}

#[test]
fn every_tool_named_as_asked_ranks_first_when_names_differ_only_in_case() {
    let registry = Registry::from_sources([
        (
            "alpha.json",
            r#"{"name":"alpha","tools":[{"name":"gizmo_maker","description":"Makes a widget widget widget"},{"name":"Widget","description":"Turns things"}]}"#,
        ),
        (
            "beta.json",
            r#"{"name":"beta","tools":[{"name":"widget","description":"Spins"}]}"#,
        ),
    ])
    .unwrap();
    let index = SearchIndex::new(&registry);
    let names = |hits: Vec<ToolMatch>| -> Vec<String> {
        hits.iter()
            .map(|h| registry.domain(h.domain).tools[h.tool].name.clone())
            .collect()
    };
    // Both exact matches first, in registry order, then the tool that only scores.
    assert_eq!(
        names(index.search_tools(" WIDGET ", 5, None)),
        ["Widget", "widget", "gizmo_maker"]
    );
    // A hidden exact match leaves the other one first.
    let visible = [true, false, true];
    assert_eq!(
        names(index.search_tools("Widget", 5, Some(&visible))),
        ["widget", "gizmo_maker"]
    );
    // Each exact match scores at least the best other score.
    let hits = index.search_tools("widget", 5, None);
    assert!(
        hits[0].score >= hits[2].score && hits[1].score >= hits[2].score,
        "{hits:?}"
    );
}

#[test]
fn a_query_word_joined_by_underscores_is_read_as_its_parts() {
    let (registry, index) = index();
    // Not a tool's name, but its words, as a model guessing a name writes them.
    assert_eq!(
        ranked(&registry, &index, "get_outlook_now")
            .first()
            .map(String::as_str),
        Some("forecast")
    );
    assert_eq!(
        ranked(&registry, &index, "beds_plan").first().map(String::as_str),
        Some("garden")
    );
}

#[test]
fn a_query_word_written_as_an_identifier_is_read_as_its_parts() {
    let registry = Registry::from_sources([(
        "alpha.json",
        r#"{"name":"alpha","tools":[{"name":"getQuuxlyReport","description":"Reads the report"},{"name":"sync4plexar","description":"Syncs"},{"name":"other","description":"Something else"}]}"#,
    )])
    .unwrap();
    assert_best_tools(
        &registry,
        &[
            ("quuxlyReport", "getQuuxlyReport"),
            ("QuuxlyReport please", "getQuuxlyReport"),
            ("4plexar", "sync4plexar"),
            ("plexar4", "sync4plexar"),
        ],
    );
}

/// Each query's best tool (by name) is the one given, with a score.
fn assert_best_tools(registry: &Registry, cases: &[(&str, &str)]) {
    let index = SearchIndex::new(registry);
    for &(query, want) in cases {
        let hits = index.search_tools(query, 5, None);
        let first = hits
            .first()
            .map(|h| registry.domain(h.domain).tools[h.tool].name.as_str());
        assert_eq!(first, Some(want), "{query}: {hits:?}");
        assert!(hits[0].score > 0.0, "{query}: {hits:?}");
    }
}

#[test]
fn a_query_word_written_as_its_brand_writes_it_finds_the_text_that_says_it() {
    let registry = Registry::from_sources([(
        "dev.json",
        r#"{"name":"dev","tools":[
            {"name":"open_issue","description":"Open an issue on GitHub"},
            {"name":"convert_audio","description":"Convert an audio file to MP3 or FLAC"},
            {"name":"torrents","description":"List what qBittorrent downloads"},
            {"name":"other","description":"Something else"}]}"#,
    )])
    .unwrap();
    assert_best_tools(
        &registry,
        &[
            ("GitHub", "open_issue"),
            ("github", "open_issue"),
            ("MP3", "convert_audio"),
            ("qBittorrent", "torrents"),
        ],
    );
}

#[test]
fn text_written_without_spaces_is_found_by_its_characters() {
    let registry = Registry::from_sources([
        (
            "docker.json",
            r#"{"name":"docker","tools":[{"name":"restart_container","description":"重启容器"}]}"#,
        ),
        (
            "files.json",
            r#"{"name":"files","tools":[{"name":"delete_file","description":"删除文件"}]}"#,
        ),
    ])
    .unwrap();
    let index = SearchIndex::new(&registry);
    assert_eq!(
        ranked(&registry, &index, "请重启容器")
            .first()
            .map(String::as_str),
        Some("docker")
    );
    assert_eq!(
        ranked(&registry, &index, "删除这个文件")
            .first()
            .map(String::as_str),
        Some("files")
    );
}

#[test]
fn a_default_description_is_not_searched_nor_suggested() {
    // Group arrays without `_meta` get "Tools from <name> group": a message asking what
    // tools there are is about none of them.
    let registry = Registry::from_sources([
        (
            "email.json",
            r#"[{"name":"send_message","description":"Send an email message"}]"#,
        ),
        (
            "spotify.json",
            r#"[{"name":"start_playback","description":"Start playback of a song"}]"#,
        ),
        (
            "notes.json",
            r#"{"name":"notes","description":"Notes and lists","tools":[{"name":"write_note","description":"Write a note"}]}"#,
        ),
    ])
    .unwrap();
    let index = SearchIndex::new(&registry);
    for query in ["what tools do you have?", "which group", "tools from email group"] {
        let hits = index.domain_hits(query, &SearchOptions::default(), None, |_| true);
        let named: Vec<&str> = hits
            .iter()
            .map(|h| registry.domain(h.domain).name.as_str())
            .collect();
        let expected: &[&str] = if query.contains("email") { &["email"] } else { &[] };
        assert_eq!(named, expected, "{query}");
    }
    for suggested in index.suggest_keywords(&registry, 10) {
        for (word, _) in suggested {
            assert!(!["tools", "group"].contains(&word.as_str()), "{word}");
        }
    }
}

#[test]
fn keyword_suggestions_come_from_what_the_tools_say_and_tell_domains_apart() {
    // Every tool of `net` has the `qbt` prefix and a "maximum" in its schema, as every other
    // domain's tools do; its description says "network-wide"; its tools say "blocklist".
    let tool = |name: &str, description: &str| {
        format!(
            r#"{{"name":"{name}","description":"{description}","input_schema":{{"type":"object","properties":{{"limit":{{"type":"integer","description":"The maximum number of results"}}}}}}}}"#
        )
    };
    let domain = |name: &str, description: &str, tools: &[String]| {
        format!(
            r#"{{"name":"{name}","description":"{description}","tools":[{}]}}"#,
            tools.join(",")
        )
    };
    let net = domain(
        "net",
        "Network-wide ad blocking",
        &[
            tool("qbt_add_blocklist", "Add a blocklist"),
            tool("qbt_remove_blocklist", "Remove a blocklist"),
            tool("qbt_list_blocklists", "List every blocklist"),
        ],
    );
    let others: Vec<(String, String)> = ["films", "music", "books", "notes"]
        .iter()
        .map(|n| {
            let t = [
                tool(&format!("{n}_one"), &format!("Find {n} by title")),
                tool(&format!("{n}_two"), "Show details"),
            ];
            (format!("{n}.json"), domain(n, "Things", &t))
        })
        .collect();
    let mut sources = vec![("net.json", net.as_str())];
    sources.extend(others.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let registry = Registry::from_sources(sources).unwrap();
    let index = SearchIndex::new(&registry);
    let net_id = registry.find("net").unwrap().index();
    let suggested: Vec<String> = index.suggest_keywords(&registry, 10)[net_id]
        .iter()
        .map(|(w, _)| w.clone())
        .collect();
    assert_eq!(
        suggested.first().map(String::as_str),
        Some("blocklist"),
        "{suggested:?}"
    );
    for junk in ["qbt", "wide", "network", "maximum", "results"] {
        assert!(!suggested.contains(&junk.to_string()), "{junk}: {suggested:?}");
    }
}

#[test]
fn keyword_suggestions_leave_out_only_what_a_keyword_already_hits() {
    // Its tools say its name (no keyword), and `magnet`, which only a keyword of two words
    // holds; `torrent` is a keyword of its own.
    let registry = Registry::from_sources([
        (
            "qbittorrent.json",
            r#"{"name":"qbittorrent","keywords":["torrent","magnet link"],"tools":[
                {"name":"add","description":"Add a magnet or a torrent to qBittorrent"},
                {"name":"list","description":"List the magnet downloads and torrents in qBittorrent"}]}"#,
        ),
        (
            "other.json",
            r#"{"name":"other","tools":[{"name":"x","description":"Something else entirely"}]}"#,
        ),
    ])
    .unwrap();
    let index = SearchIndex::new(&registry);
    let qbt = registry.find("qbittorrent").unwrap().index();
    let suggested: Vec<String> = index.suggest_keywords(&registry, 10)[qbt]
        .iter()
        .map(|(w, _)| w.clone())
        .collect();
    for wanted in ["qbittorrent", "magnet"] {
        assert!(suggested.contains(&wanted.to_string()), "{wanted}: {suggested:?}");
    }
    assert!(!suggested.contains(&"torrent".to_string()), "{suggested:?}");
}

#[test]
fn keyword_suggestions_are_words_a_user_would_say() {
    let registry = Registry::from_sources([
        (
            "lights.json",
            r#"{"name":"lights","tools":[
                {"name":"dim","description":"Dim a lamp, e.g. light.living, re lamp"},
                {"name":"brighten","description":"Brighten a lamp, e.g. light.living, re lamp"}]}"#,
        ),
        (
            "other.json",
            r#"{"name":"other","tools":[{"name":"x","description":"Something else entirely"}]}"#,
        ),
    ])
    .unwrap();
    let index = SearchIndex::new(&registry);
    let suggested: Vec<String> = index.suggest_keywords(&registry, 10)[0]
        .iter()
        .map(|(w, _)| w.clone())
        .collect();
    assert!(suggested.contains(&"lamp".to_string()), "{suggested:?}");
    for junk in ["e.g", "light.living", "re"] {
        assert!(!suggested.contains(&junk.to_string()), "{junk}: {suggested:?}");
    }
}

/// A word no tool says is stemmed once per thread and index; what it finds is what the
/// stemmer finds, in every index, however many such words a thread has met.
#[test]
fn words_unseen_at_build_find_what_their_stem_finds_in_each_index() {
    let (_, index) = index();
    let other = SearchIndex::new(
        &Registry::from_sources([(
            "trips.json",
            r#"{"name":"trips","tools":[{"name":"book","description":"Book a trip"}]}"#,
        )])
        .unwrap(),
    );
    // (word, found in `index`, found in `other`): "forecasting" and "patients" are not
    // words of either index, their stems are words of `index` only; "bookings" stems to a
    // word of `other` only.
    let cases: &[(&str, bool, bool)] = &[
        ("forecasting", true, false),
        ("patients", true, false),
        ("bookings", false, true),
        ("zebras", false, false),
    ];
    for _ in 0..2 {
        for &(word, in_index, in_other) in cases {
            for (ix, want) in [(&index, in_index), (&other, in_other)] {
                let found = ix.term(word);
                assert_eq!(found, ix.unseen_term(word), "{word}");
                assert_eq!(found.is_ok(), want, "{word}");
            }
        }
    }
    assert_eq!(index.term("ourselves"), Err(true), "a stop word");
    // Past the words a thread keeps, the words met are dropped and found again.
    for i in 0..UNSEEN_KEEP + 100 {
        let word = format!("zq{i}patients");
        assert_eq!(index.term(&word), index.unseen_term(&word), "{word}");
    }
    assert!(index.term("patients").is_ok());
    assert!(other.term("patients").is_err());
}
