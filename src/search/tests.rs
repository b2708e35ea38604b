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
