//! Benchmark workloads: a registry, the settings that make its domains active, and the
//! messages to route over it.
//!
//! - [`demo`]: the built-in home-server registry with a fixed set of realistic messages.
//! - [`seal`] and [`stb`]: the third-party evaluation sets (Seal-Tools and StableToolBench,
//!   read from an eval folder at run time), one domain per category, keyed by category and
//!   subcategory/service.
//! - [`scale`]: a synthetic registry of any size whose messages always route to the same 20
//!   tools, so route time can be compared across registry sizes.
//!
//! [`by_name`] picks one by the name `toolrouter-bench export` takes; [`crate::export`]
//! writes it out.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;
use serde_json::json;

use toolrouter::registry::{Domain, Registry, Tier, Tool};
use toolrouter::router::Snapshot;

/// A registry plus the messages to route over it, all domains active.
#[derive(Debug)]
pub struct Workload {
    /// Short name for reports (`demo`, `seal`, `stb`, `scale-N`).
    pub name: String,
    /// The domains and tools.
    pub registry: Registry,
    /// A settings snapshot under which every domain of `registry` is active.
    pub settings: Snapshot,
    /// The user messages, in a fixed order.
    pub messages: Vec<String>,
    /// For the eval sets: each message with the domains it needs (empty otherwise).
    pub labelled: Vec<toolrouter::eval::Labelled>,
}

/// The schema of every eval tool: the eval sets carry no parameter schemas.
const EMPTY_SCHEMA: &str = r#"{"type":"object","properties":{}}"#;

/// Messages a home-server assistant gets: hits on one domain, on several, on none (only the
/// core domain or nothing at all), short and long, and a few that are not ASCII.
const DEMO_MESSAGES: &[&str] = &[
    // One domain.
    "Turn off the living room light",
    "What's the thermostat set to right now?",
    "Add the movie Dune Part Two to my collection",
    "When does the next episode of Severance air?",
    "Spiel das Hörbuch weiter",
    "Pause all torrents that are still seeding",
    "How many queries did Pi-hole block today?",
    "Restart the nginx container, it stopped answering",
    "Find the invoice from the electricity company",
    "Create a share link for the holiday photos in Nextcloud",
    "Is anything down? Check the status page",
    "Look up my password for the router admin page",
    "What's playing on Jellyfin in the bedroom?",
    "List the containers that keep restarting",
    "Add Oppenheimer on Blu-ray quality to the wanted list",
    "Who is the narrator of the audiobook I'm listening to?",
    "Enable two-factor on my Bitwarden account",
    "Quelle est la température du thermostat dans le salon ?",
    // Several domains.
    "Download the new season of The Bear and tell me when the torrent is done",
    "Dim the lamp and start the movie on Jellyfin",
    "Back up the Vaultwarden container and then snapshot the VM it runs on",
    "Scan the receipt from dinner and add the appointment to my calendar",
    "Is DNS slow because the Pi-hole blocklist is too large, or is the monitor wrong?",
    "Which podcast episodes did I finish, and which TV show episodes are still unwatched?",
    "Check the download speed of the torrents and whether Radarr has imported the film yet",
    "Turn on the heating at six and run the morning automation scene",
    "What's my listening progress on Project Hail Mary, and is the Jellyfin library scan finished?",
    "I'm going away for two weeks: set the thermostat to eco, turn off every smart plug, take a \
     backup of the Proxmox host, pause the torrent client and make sure Uptime Kuma alerts me if \
     anything goes down while I'm away.",
    "Tag all documents from the tax office and move the scanned letters into the shared folder",
    "Whitelist example.com in Pi-hole, it is blocking my bank, and restart the DNS container",
    // Only the core domain, or nothing at all.
    "How much disk space is left on the server?",
    "Show me the CPU and memory usage",
    "Hi there",
    "Thanks, that's all for now",
    "What's the weather like tomorrow?",
    "Tell me a joke",
    "Can you summarise our conversation so far?",
    "Wie spät ist es in Tokio?",
    "Schalte die Lampe im Büro aus",
    "Remind me what we talked about yesterday",
    "I've been thinking about reorganising how everything at home works, maybe simplifying some \
     of it, but I'm not sure where to start or what would make the biggest difference. Any \
     general advice?",
];

/// The built-in demo registry with every settings key of every domain set, and
/// [`DEMO_MESSAGES`].
pub fn demo() -> Workload {
    let registry = Registry::demo();
    let settings = Snapshot::every_key_set(&registry);
    Workload {
        name: "demo".into(),
        registry,
        settings,
        messages: DEMO_MESSAGES.iter().map(|m| (*m).to_string()).collect(),
        labelled: Vec::new(),
    }
}

/// The workload called `name`: `demo`, `seal`, `stb` or `scale-N` (N tools), the eval sets
/// read from `eval_dir`.
///
/// # Errors
/// `Config` for an unknown name; as [`seal`] and [`stb`] for the eval sets.
pub fn by_name(name: &str, eval_dir: &Path) -> toolrouter::Result<Workload> {
    match name {
        "demo" => Ok(demo()),
        "seal" => seal(eval_dir),
        "stb" => stb(eval_dir),
        other => match other.strip_prefix("scale-").and_then(|n| n.parse().ok()) {
            Some(n) => Ok(scale(n)),
            None => Err(toolrouter::Error::Config(format!(
                "unknown workload {other:?}: use demo, seal, stb or scale-N"
            ))),
        },
    }
}

/// Which eval set a folder holds: they differ in the field under the category.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Seal-Tools: `subcategory`; tool names are made manifest-valid.
    Seal,
    /// StableToolBench: `service`; tool names (`svc::endpoint`) are kept as given.
    Stb,
}

#[derive(Deserialize)]
struct EvalTool {
    name: String,
    description: String,
    category: String,
    #[serde(default)]
    subcategory: String,
    #[serde(default)]
    service: String,
    #[serde(default)]
    api: String,
}

#[derive(Deserialize)]
struct EvalQuery {
    query: String,
    #[serde(default)]
    category: Vec<String>,
    #[serde(default)]
    id: String,
    #[serde(default)]
    split: String,
}

/// The Seal-Tools set in `eval_dir` (`tools.json` and `queries.jsonl`): one domain per
/// category (146), keyed by the category and the distinct subcategories of its tools
/// (lowercased, in first-appearance order); no settings keys, none core, all fallback. Tool
/// names go through [`manifest_tool_name`] so [`crate::export::write_manifests`] output loads; the messages
/// are every query, in file order.
///
/// # Errors
/// A file that cannot be read or parsed, or tools the registry rejects.
pub fn seal(eval_dir: &Path) -> toolrouter::Result<Workload> {
    load_eval("seal", eval_dir, Source::Seal).map(|(w, _)| w)
}

/// The StableToolBench set in `eval_dir/stabletoolbench`: one domain per category (47),
/// keyed by the category and the distinct services of its tools, lowercased. Tool names
/// (`service::endpoint`) are kept as given, so this registry is for in-process use only:
/// its tool names (and some empty descriptions) do not pass manifest validation.
///
/// # Errors
/// A file that cannot be read or parsed, or tools the registry rejects.
pub fn stb(eval_dir: &Path) -> toolrouter::Result<Workload> {
    load_eval("stb", &eval_dir.join("stabletoolbench"), Source::Stb).map(|(w, _)| w)
}

/// The name [`seal`] gives a Seal-Tools tool: every character outside `[A-Za-z0-9_-]`
/// becomes `_`, cut to 64 bytes. Only 2 of the 4,076 names change (`requestFirst Aid
/// Assistance`, `getPM2.5Level`); apply it to the `tools` of `queries.jsonl` to compare gold
/// labels with routed tools.
pub fn manifest_tool_name(raw: &str) -> String {
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    name.truncate(64);
    if name.is_empty() {
        name.push('_');
    }
    name
}

/// A category as a domain name matching `^[a-z0-9][a-z0-9_-]{0,63}$`: lowercased, each run
/// of other characters one `_`, `_` trimmed at both ends, cut to 64.
fn slug(category: &str) -> String {
    let mut out = String::new();
    for c in category.to_lowercase().chars() {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('_') {
            out.push('_');
        }
    }
    let mut out = out.trim_matches('_').to_string();
    out.truncate(64);
    let out = out.trim_end_matches('_').to_string();
    if out.is_empty() { "domain".into() } else { out }
}

/// `slug(category)`, with `_2`, `_3`, … appended when an earlier category took it.
fn unique_slug(category: &str, taken: &mut HashSet<String>) -> String {
    let base = slug(category);
    let mut name = base.clone();
    let mut n = 2;
    while taken.contains(&name) {
        let suffix = format!("_{n}");
        let mut b = base.clone();
        b.truncate(64 - suffix.len());
        name = format!("{b}{suffix}");
        n += 1;
    }
    taken.insert(name.clone());
    name
}

fn io_error(context: String) -> impl FnOnce(std::io::Error) -> toolrouter::Error {
    move |source| toolrouter::Error::Io { context, source }
}

fn parse_error(path: &Path, e: serde_json::Error) -> toolrouter::Error {
    toolrouter::Error::Io {
        context: format!("cannot parse {}", path.display()),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    }
}

/// Loads one eval folder; also returns how many tools were skipped as duplicate names
/// (first one kept). Both sets as shipped have none.
fn load_eval(name: &str, dir: &Path, source: Source) -> toolrouter::Result<(Workload, usize)> {
    let tools_path = dir.join("tools.json");
    let text = std::fs::read_to_string(&tools_path)
        .map_err(io_error(format!("cannot read {}", tools_path.display())))?;
    let tools: Vec<EvalTool> = serde_json::from_str(&text).map_err(|e| parse_error(&tools_path, e))?;

    let mut domains: Vec<Domain> = Vec::new();
    let mut by_category: HashMap<String, usize> = HashMap::new();
    let mut taken = HashSet::new();
    let mut tool_names = HashSet::new();
    let mut skipped = 0;
    for t in tools {
        let tool_name = match source {
            Source::Seal => manifest_tool_name(&t.name),
            // `service::endpoint` names become manifest-valid, numbered when that makes
            // two equal.
            Source::Stb => {
                let base = manifest_tool_name(&t.name);
                let mut name = base.clone();
                let mut n = 2;
                while tool_names.contains(&name) {
                    let suffix = format!("_{n}");
                    name = format!("{}{suffix}", &base[..base.len().min(64 - suffix.len())]);
                    n += 1;
                }
                name
            }
        };
        if !tool_names.insert(tool_name.clone()) {
            skipped += 1;
            continue;
        }
        // A few StableToolBench endpoints have no description: their service and endpoint
        // names say what they do.
        let description = if t.description.trim().is_empty() {
            format!("{}: {}", t.service, t.api)
        } else {
            t.description
        };
        let i = *by_category.entry(t.category.clone()).or_insert_with(|| {
            domains.push(Domain {
                name: unique_slug(&t.category, &mut taken),
                display_name: t.category.clone(),
                description: format!("Tools for {}", t.category),
                settings_keys: Vec::new(),
                keywords: Vec::new(),
                core: false,
                fallback: true,
                tools: Vec::new(),
                source: tools_path.display().to_string(),
            });
            domains.len() - 1
        });
        let d = &mut domains[i];
        let sub = match source {
            Source::Seal => &t.subcategory,
            Source::Stb => &t.service,
        };
        for keyword in [&t.category, sub] {
            let k = keyword.trim().to_lowercase();
            if !k.is_empty() && !d.keywords.contains(&k) {
                d.keywords.push(k);
            }
        }
        d.tools.push(Tool {
            name: tool_name,
            description,
            input_schema_json: EMPTY_SCHEMA.into(),
            tier: Tier::Read,
        });
    }
    let category_domain: HashMap<String, String> = by_category
        .iter()
        .map(|(category, &i)| (category.clone(), domains[i].name.clone()))
        .collect();
    let registry = Registry::new(domains).map_err(toolrouter::Error::Manifests)?;

    let queries_path = dir.join("queries.jsonl");
    let text = std::fs::read_to_string(&queries_path)
        .map_err(io_error(format!("cannot read {}", queries_path.display())))?;
    let queries = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<EvalQuery>(l).map_err(|e| parse_error(&queries_path, e)))
        .collect::<toolrouter::Result<Vec<EvalQuery>>>()?;
    // Categories become the domain names they were given above.
    let domain_of = |category: &String| {
        category_domain
            .get(category)
            .cloned()
            .unwrap_or_else(|| slug(category))
    };
    let labelled = queries
        .iter()
        .map(|q| toolrouter::eval::Labelled {
            query: q.query.clone(),
            domains: q.category.iter().map(domain_of).collect(),
            id: q.id.clone(),
            split: q.split.clone(),
        })
        .collect();
    let workload = Workload {
        name: name.into(),
        registry,
        settings: Snapshot::default(),
        messages: queries.into_iter().map(|q| q.query).collect(),
        labelled,
    };
    Ok((workload, skipped))
}

/// The four keywords of synthetic domain `d`: distinct per domain and word-like, one with a
/// space.
fn scale_keywords(d: usize) -> Vec<String> {
    vec![
        format!("zeta{d}"),
        format!("alpha{d}x"),
        format!("beta {d}"),
        format!("gamma{d}y"),
    ]
}

/// Messages that name keywords of synthetic domains 0 and 1 only, among ordinary words
/// (none with a digit, so they cannot hit another domain's keywords).
const SCALE_MESSAGES: &[&str] = &[
    "Please check zeta0 and then compare it with alpha1x before the weekly report goes out tomorrow morning.",
    "Can you restart beta 0 and also look at gamma1y? The dashboard shows both of them as degraded since lunch.",
    "I need the latest numbers from alpha0x plus whatever zeta1 logged overnight, summarised in a short table.",
    "gamma0y keeps timing out; is beta 1 affected as well, or is it only the first cluster that has trouble today?",
    "Summarise what changed in zeta0, alpha0x, beta 1 and gamma1y this week and flag anything that looks unusual.",
    "Quick question: does zeta1 depend on gamma0y, or can I take one of them offline for maintenance tonight?",
    "Move the archived records from beta 0 into alpha1x, keep a copy, and tell me when the transfer has finished.",
    "Why is alpha0x so slow compared to zeta1? Users have been complaining about it all afternoon.",
    "Show me the error rate for gamma0y and gamma1y side by side over the past few days.",
    "Before the release, run the health checks on zeta0 and beta 1, then send the summary to the team channel \
     and remind everyone that the freeze starts on Friday evening.",
];

/// A synthetic registry of `tools` tools: `tools / 10` domains (at least 2) of 10 tools,
/// each domain with 4 keywords and each tool with a one-string-property schema; no settings
/// keys (all active), none core. Every message hits keywords of domains 0 and 1 only, so it
/// routes to the same 20 tools whatever the registry size.
pub fn scale(tools: usize) -> Workload {
    let n = (tools / 10).max(2);
    let domains = (0..n)
        .map(|d| {
            let name = format!("scale_{d:06}");
            let tools = (0..10)
                .map(|t| Tool {
                    name: format!("{name}_t{t}"),
                    description: format!("Synthetic tool {t} of domain {d}"),
                    input_schema_json: json!({
                        "type": "object",
                        "properties": {"query": {"type": "string", "description": "What to look up"}},
                        "required": ["query"],
                    })
                    .to_string(),
                    tier: Tier::Read,
                })
                .collect();
            Domain {
                display_name: format!("Scale {d}"),
                description: format!("Synthetic domain {d}"),
                settings_keys: Vec::new(),
                keywords: scale_keywords(d),
                core: false,
                fallback: true,
                tools,
                source: format!("scale({n} domains)"),
                name,
            }
        })
        .collect();
    let registry = Registry::new(domains).unwrap_or_else(|e| panic!("synthetic registry is invalid:\n{e}"));
    Workload {
        name: format!("scale-{tools}"),
        registry,
        settings: Snapshot::default(),
        messages: SCALE_MESSAGES.iter().map(|m| (*m).to_string()).collect(),
        labelled: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_json::Value;
    use toolrouter::registry::manifest::valid_domain_name;

    use super::*;
    use toolrouter::matcher::{MatchMode, Matcher};
    use toolrouter::router::{Activation, Inputs, Options, Reason, route};
    use toolrouter::search::{SearchIndex, SearchMode};

    /// Keyword routing only: these workloads are keyed for the automaton.
    fn keywords_only() -> Options {
        let mut options = Options::default();
        options.search.mode = SearchMode::Off;
        options
    }

    fn eval_dir() -> Option<PathBuf> {
        let dir = crate::eval_dir();
        if dir.join("tools.json").is_file() {
            Some(dir)
        } else {
            eprintln!("note: {} is missing; skipping the eval-set test", dir.display());
            None
        }
    }

    /// Runs `f` over the workload's routing inputs (word-mode automaton, search index),
    /// after checking that its settings make every domain active.
    fn with_every_domain_active(w: &Workload, f: impl FnOnce(Inputs<'_>, &Activation)) {
        let matcher = Matcher::new(w.registry.keywords(), MatchMode::Word).unwrap();
        let index = SearchIndex::new(&w.registry);
        let inputs = Inputs {
            registry: &w.registry,
            matcher: &matcher,
            index: &index,
        };
        let activation = Activation::new(&w.registry, &w.settings);
        assert_eq!(
            activation.active().count(),
            w.registry.domains().len(),
            "all active"
        );
        f(inputs, &activation);
    }

    fn keyword_count(r: &Registry) -> usize {
        r.keywords().count()
    }

    /// Whether every tool name of a registry passes manifest validation.
    fn all_tool_names_valid(registry: &Registry) -> bool {
        registry.domains().iter().all(|d| {
            d.tools
                .iter()
                .all(|t| toolrouter::registry::manifest::valid_tool_name(&t.name))
        })
    }

    #[test]
    fn scale_messages_route_to_the_tools_of_domains_0_and_1_at_every_size() {
        for m in SCALE_MESSAGES {
            assert!(
                (60..=200).contains(&m.chars().count()),
                "{m:?} is {} chars",
                m.len()
            );
        }
        for size in [100, 1000, 10_000] {
            let w = scale(size);
            assert_eq!(w.name, format!("scale-{size}"));
            assert_eq!(w.registry.tool_count(), size);
            assert_eq!(w.registry.domains().len(), size / 10);
            assert_eq!(keyword_count(&w.registry), 4 * size / 10);
            with_every_domain_active(&w, |inputs, activation| {
                for m in &w.messages {
                    let d = route(inputs, activation, None, m, &keywords_only());
                    assert!(!d.fallback, "{m:?}");
                    let got: Vec<(usize, Reason)> =
                        d.domains.iter().map(|i| (i.domain.index(), i.reason)).collect();
                    assert_eq!(got, vec![(0, Reason::Keyword), (1, Reason::Keyword)], "{m:?}");
                    let tools: Vec<&str> = d
                        .tools(&w.registry, activation)
                        .filter(|(dom, _)| !dom.is_empty())
                        .map(|(_, t)| t.name.as_str())
                        .collect();
                    assert_eq!(tools.len(), 20, "{m:?}");
                    assert!(tools[..10].iter().all(|t| t.starts_with("scale_000000_")));
                    assert!(tools[10..].iter().all(|t| t.starts_with("scale_000001_")));
                }
            });
        }
    }

    #[test]
    fn demo_messages_route_with_every_domain_active() {
        let w = demo();
        assert!(w.messages.len() >= 40);
        let (mut none, mut one, mut several) = (0, 0, 0);
        with_every_domain_active(&w, |inputs, activation| {
            for m in &w.messages {
                let d = route(inputs, activation, None, m, &keywords_only());
                match d.domains.iter().filter(|i| i.reason == Reason::Keyword).count() {
                    0 => none += 1,
                    1 => one += 1,
                    _ => several += 1,
                }
            }
        });
        assert!(
            none >= 5 && one >= 10 && several >= 5,
            "{none} / {one} / {several}"
        );
        assert!(w.messages.iter().any(|m| !m.is_ascii()));
    }

    #[test]
    fn categories_become_unique_valid_domain_names() {
        let mut taken = HashSet::new();
        let names: Vec<String> = [
            "Travel and Tourism",
            "travel-and tourism",
            "Zoë!",
            "__",
            &"x".repeat(80),
        ]
        .iter()
        .map(|c| unique_slug(c, &mut taken))
        .collect();
        assert_eq!(
            names[..4],
            ["travel_and_tourism", "travel_and_tourism_2", "zo", "domain"]
        );
        assert_eq!(names[4].len(), 64);
        assert!(names.iter().all(|n| valid_domain_name(n)), "{names:?}");
        assert_eq!(manifest_tool_name("getPM2.5Level"), "getPM2_5Level");
        assert_eq!(
            manifest_tool_name("requestFirst Aid Assistance"),
            "requestFirst_Aid_Assistance"
        );
    }

    #[test]
    fn the_eval_sets_load_and_seal_round_trips_through_written_manifests() {
        let Some(dir) = eval_dir() else { return };
        let (seal, skipped) = load_eval("seal", &dir, Source::Seal).unwrap();
        assert_eq!(skipped, 0, "duplicate Seal-Tools names");
        assert_eq!(seal.registry.domains().len(), 146);
        assert_eq!(seal.registry.tool_count(), 4076);
        assert_eq!(seal.messages.len(), 2054);
        assert!(seal.registry.domains().iter().all(|d| valid_domain_name(&d.name)));
        assert!(all_tool_names_valid(&seal.registry));
        let raw: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(dir.join("tools.json")).unwrap()).unwrap();
        let renamed = raw
            .iter()
            .filter_map(|t| t["name"].as_str())
            .filter(|n| manifest_tool_name(n) != *n)
            .count();
        assert_eq!(renamed, 2, "only two Seal-Tools names needed changing");

        let (stb, skipped) = load_eval("stb", &dir.join("stabletoolbench"), Source::Stb).unwrap();
        assert_eq!(skipped, 0, "duplicate StableToolBench names");
        assert_eq!(stb.registry.domains().len(), 47);
        assert_eq!(stb.registry.tool_count(), 2490);
        assert_eq!(stb.messages.len(), 765);
        assert!(stb.registry.domains().iter().all(|d| valid_domain_name(&d.name)));
        assert!(
            stb.registry
                .domains()
                .iter()
                .flat_map(|d| &d.tools)
                .all(|t| toolrouter::registry::manifest::valid_tool_name(&t.name)
                    && !t.description.trim().is_empty()),
            "names and descriptions are manifest-valid"
        );
        assert_eq!(stb.labelled.len(), 765);
        assert_eq!(seal.labelled.len(), 2054);
        for w in [&seal, &stb] {
            for l in &w.labelled {
                assert!(
                    !l.domains.is_empty() && !l.split.is_empty() && !l.id.is_empty(),
                    "{l:?}"
                );
                for d in &l.domains {
                    assert!(w.registry.find(d).is_some(), "label {d} is a domain");
                }
            }
        }
        for w in [&seal, &stb] {
            for d in w.registry.domains() {
                assert_eq!(d.keywords[0], d.display_name.to_lowercase(), "category first");
                assert!(d.keywords.iter().all(|k| !k.is_empty() && *k == k.to_lowercase()));
                let distinct: HashSet<&String> = d.keywords.iter().collect();
                assert_eq!(distinct.len(), d.keywords.len());
            }
            with_every_domain_active(w, |inputs, activation| {
                for m in w.messages.iter().take(200) {
                    route(inputs, activation, None, m, &Options::default());
                }
            });
        }

        let out = tempfile::tempdir().unwrap();
        crate::export::write_manifests(&seal.registry, out.path()).unwrap();
        let loaded = Registry::load_dirs(&[out.path().to_path_buf()]).unwrap();
        assert_eq!(loaded.version(), seal.registry.version());
        assert_eq!(loaded.tool_count(), 4076);
    }
}
