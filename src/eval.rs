//! `toolrouter eval` (SPEC §8): routes labelled messages in-process and measures how often
//! the answer holds every labelled domain, and what it costs in tools.
//!
//! A labelled file is JSONL: `{"query": str, "domains": [str], "id"?: str, "split"?: str}`
//! per line. Figures per split and overall:
//! - strict recall: share of messages whose answer holds every labelled domain (by any
//!   reason, so a fallback counts only when it really sent them all);
//! - soft recall: mean share of a message's labelled domains in its answer;
//! - tools sent: mean domain tools per answer (the meta-tools, the same on every turn, are
//!   not counted), and as a share of the registry's tools;
//! - oracle tools: mean tools of exactly the labelled domains plus the active core domains;
//!   cost ratio = tools sent / oracle tools;
//! - fallback rate, answers' domains counted by reason, and route time per message.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::registry::DomainId;
use crate::router::{self, Activation, Inputs, Options, Reason};

/// One labelled message.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Labelled {
    /// The user's message.
    pub query: String,
    /// The domains (by name) it needs.
    pub domains: Vec<String>,
    /// Its id in the source set.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// The split it belongs to.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub split: String,
}

/// The most bad lines of a labelled file an error names one by one.
const MAX_BAD_LINES_NAMED: usize = 20;

/// Reads a labelled JSONL file; blank lines are skipped. A query over `max_message_bytes`
/// is refused, as the daemon refuses such a message, rather than measured.
///
/// # Errors
/// An unreadable file, or a line that is not a labelled message or whose query the daemon
/// would refuse (its line number named); all configuration errors, as a bad manifest is.
pub(crate) fn read_labelled(path: &Path, max_message_bytes: usize) -> Result<Vec<Labelled>> {
    let bytes = std::fs::read(path).map_err(|e| {
        Error::Config(format!(
            "cannot read the labelled messages {}: {e}",
            path.display()
        ))
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let before = &e.as_bytes()[..at];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = at - before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) + 1;
        Error::Config(format!(
            "{}:{line}: not UTF-8 text (an invalid byte at column {column}); save the file as UTF-8",
            path.display()
        ))
    })?;
    // Editors on some systems start a file with a byte-order mark; it is not part of a line.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    // Every line is read, and every bad one named, as a manifest check names every problem.
    let (mut labelled, mut bad) = (Vec::new(), Vec::new());
    let lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let bad = |why: String| {
                format!(
                    "{}:{}: not a labelled message ({{\"query\", \"domains\"}}): {why}",
                    path.display(),
                    i + 1
                )
            };
            // serde names the column of a line it sees as line 1 of its own.
            let json = |e: serde_json::Error| {
                let text = e.to_string();
                match text.rfind(" at line ") {
                    Some(cut) if e.line() > 0 => format!("{} at column {}", &text[..cut], e.column()),
                    _ => text,
                }
            };
            if l.starts_with('\u{feff}') {
                return Err(bad(
                    "the line starts with a byte-order mark (U+FEFF); remove it".into()
                ));
            }
            // An object, read as one (so a field given twice is an error), not the same fields
            // in a list (which serde would also take).
            let labelled: Labelled = if l.trim_start().starts_with('{') {
                serde_json::from_str(l).map_err(|e| bad(json(e)))?
            } else {
                serde_json::from_str::<serde_json::Value>(l).map_err(|e| bad(json(e)))?;
                return Err(bad("a line must be a JSON object".into()));
            };
            if labelled.query.len() > max_message_bytes {
                return Err(bad(format!(
                    "the query is {} bytes, over the limit of {max_message_bytes} bytes \
                     (max_message_bytes): the daemon would refuse it",
                    labelled.query.len()
                )));
            }
            Ok(labelled)
        });
    for line in lines {
        match line {
            Ok(l) => labelled.push(l),
            Err(why) => bad.push(why),
        }
    }
    if !bad.is_empty() {
        let more = bad.len().saturating_sub(MAX_BAD_LINES_NAMED);
        bad.truncate(MAX_BAD_LINES_NAMED);
        if more > 0 {
            bad.push(format!("… and {more} more bad lines"));
        }
        return Err(Error::Config(bad.join("\n")));
    }
    if labelled.is_empty() {
        return Err(Error::Config(format!(
            "{}: no labelled message in it (one JSON object per line)",
            path.display()
        )));
    }
    Ok(labelled)
}

/// The figures for one split (or all of them).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Figures {
    /// Messages.
    pub queries: usize,
    /// Share of messages whose answer holds every labelled domain.
    pub strict_recall: f64,
    /// Mean share of labelled domains in the answer.
    pub soft_recall: f64,
    /// Mean domain tools per answer.
    pub tools_sent: f64,
    /// `tools_sent` over the registry's tool count.
    pub registry_share: f64,
    /// Mean tools of exactly the labelled domains plus core.
    pub oracle_tools: f64,
    /// `tools_sent / oracle_tools`; `None` (JSON `null`) when the oracle sends no tool, where
    /// no ratio says what was sent.
    pub cost_ratio: Option<f64>,
    /// Share of answers that were a fallback.
    pub fallback_rate: f64,
    /// Domains in answers, by reason (`core`, `keyword`, `search`, `loaded`, `sticky`,
    /// `fallback`).
    pub reasons: BTreeMap<String, usize>,
    /// Mean route time per message, in microseconds.
    pub us_per_query: f64,
    /// Median route time per message, in microseconds.
    pub us_median: f64,
}

/// The whole report: every split by name, then all of them.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Report {
    /// Per split, by name (messages without a split are under `""`).
    pub splits: BTreeMap<String, Figures>,
    /// Every message.
    pub overall: Figures,
    /// The registry's tool count.
    pub registry_tools: usize,
    /// Labelled domain names the registry does not have (each counts as a miss).
    pub unknown_domains: Vec<String>,
    /// The messages whose answer lacked a labelled domain, in file order (`eval --misses`;
    /// not part of the JSON report).
    #[serde(skip)]
    pub misses: Vec<Miss>,
}

/// A message whose answer lacked a labelled domain: what was asked, what was missed and
/// what was sent instead, for a manifest author to read (`eval --misses`, one JSON line each).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Miss {
    /// The message's id in the labelled file.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// Its split.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub split: String,
    /// The message.
    pub query: String,
    /// The labelled domains the answer lacked (names the registry lacks included), each once,
    /// in label order.
    pub missed: Vec<String>,
    /// The answer's domains as `name:reason`, in answer order (as the call log names them).
    pub answer: Vec<String>,
    /// The tools the answer sent.
    pub tools: usize,
    /// Whether the answer was the fallback.
    pub fallback: bool,
}

/// What one routed message gave.
struct Outcome {
    strict: bool,
    soft: f64,
    sent: usize,
    oracle: usize,
    fallback: bool,
    reasons: Vec<Reason>,
    micros: f64,
}

fn figures<'a>(outcomes: impl Iterator<Item = &'a Outcome>, registry_tools: usize) -> Figures {
    let mut f = Figures::default();
    let mut times = Vec::new();
    let (mut strict, mut soft, mut sent, mut oracle, mut fallback, mut micros) = (0, 0.0, 0, 0, 0, 0.0);
    for o in outcomes {
        f.queries += 1;
        strict += usize::from(o.strict);
        soft += o.soft;
        sent += o.sent;
        oracle += o.oracle;
        fallback += usize::from(o.fallback);
        micros += o.micros;
        times.push(o.micros);
        for r in &o.reasons {
            *f.reasons.entry(r.as_str().to_string()).or_default() += 1;
        }
    }
    if f.queries == 0 {
        return f;
    }
    let n = f.queries as f64;
    f.strict_recall = strict as f64 / n;
    f.soft_recall = soft / n;
    f.tools_sent = sent as f64 / n;
    f.registry_share = f.tools_sent / registry_tools.max(1) as f64;
    f.oracle_tools = oracle as f64 / n;
    f.cost_ratio = (oracle > 0).then(|| sent as f64 / oracle as f64);
    f.fallback_rate = fallback as f64 / n;
    f.us_per_query = micros / n;
    times.sort_by(f64::total_cmp);
    let mid = times.len() / 2;
    f.us_median = if times.len() % 2 == 0 {
        (times[mid - 1] + times[mid]) / 2.0
    } else {
        times[mid]
    };
    f
}

/// Routes every labelled message (without a conversation) and measures the answers.
pub fn evaluate(
    inputs: Inputs<'_>,
    activation: &Activation,
    options: &Options,
    labelled: &[Labelled],
) -> Report {
    let registry = inputs.registry;
    // Unknown labels in the order first met, each once (a set keeps it linear in them).
    let mut unknown: Vec<String> = Vec::new();
    let mut unknown_seen: HashSet<&str> = HashSet::new();
    let mut outcomes: Vec<(&str, Outcome)> = Vec::with_capacity(labelled.len());
    let mut misses = Vec::new();
    // Tools as the daemon sends them: disabled ones are not.
    let tools = |d: DomainId| activation.visible_count(registry, d);
    let core: Vec<DomainId> = activation.active().filter(|&d| registry.domain(d).core).collect();
    let core_tools: usize = core.iter().map(|&d| tools(d)).sum();
    for l in labelled {
        let started = Instant::now();
        let decision = router::route(inputs, activation, None, &l.query, options);
        let micros = started.elapsed().as_secs_f64() * 1e6;
        let included: HashSet<DomainId> = decision.domains.iter().map(|i| i.domain).collect();
        // Each label once; one the registry does not have is never found.
        let mut found = 0;
        let mut oracle = core_tools;
        let mut wanted: HashSet<DomainId> = HashSet::new();
        let mut missing: HashSet<&str> = HashSet::new();
        // The labels the answer lacks, each once, in label order (for `--misses`).
        let mut missed: Vec<&str> = Vec::new();
        for name in &l.domains {
            match registry.find(name) {
                Some(d) => {
                    if !wanted.insert(d) {
                        continue;
                    }
                    if included.contains(&d) {
                        found += 1;
                    } else {
                        missed.push(name);
                    }
                    // Exactly the labelled domains and the core ones: an active core one
                    // is counted already.
                    if !core.contains(&d) {
                        oracle += tools(d);
                    }
                }
                None => {
                    if missing.insert(name) {
                        missed.push(name);
                    }
                    if unknown_seen.insert(name) {
                        unknown.push(name.clone());
                    }
                }
            }
        }
        let labels = wanted.len() + missing.len();
        let sent = decision.domains.iter().map(|i| tools(i.domain)).sum();
        if !missed.is_empty() {
            misses.push(Miss {
                id: l.id.clone(),
                split: l.split.clone(),
                query: l.query.clone(),
                missed: missed.iter().map(|name| name.to_string()).collect(),
                answer: decision
                    .domains
                    .iter()
                    .map(|i| format!("{}:{}", registry.domain(i.domain).name, i.reason.as_str()))
                    .collect(),
                tools: sent,
                fallback: decision.fallback,
            });
        }
        outcomes.push((
            l.split.as_str(),
            Outcome {
                strict: found == labels,
                // No label: nothing to find, all of it found (as strict has it).
                soft: if labels == 0 {
                    1.0
                } else {
                    found as f64 / labels as f64
                },
                sent,
                oracle,
                fallback: decision.fallback,
                reasons: decision.domains.iter().map(|i| i.reason).collect(),
                micros,
            },
        ));
    }
    let registry_tools = registry.tool_count();
    let mut splits = BTreeMap::new();
    let names: std::collections::BTreeSet<&str> = outcomes.iter().map(|(s, _)| *s).collect();
    for split in names {
        let these = outcomes.iter().filter(|(s, _)| *s == split).map(|(_, o)| o);
        splits.insert(split.to_string(), figures(these, registry_tools));
    }
    Report {
        overall: figures(outcomes.iter().map(|(_, o)| o), registry_tools),
        splits,
        registry_tools,
        unknown_domains: unknown,
        misses,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matcher::{MatchMode, Matcher};
    use crate::registry::Registry;
    use crate::router::Snapshot;
    use crate::search::{SearchIndex, SearchMode};

    #[test]
    fn figures_count_strict_soft_cost_and_fallback() {
        let registry = Registry::from_sources(
            [
                ("a.json", r#"{"name":"a","keywords":["alpha"],"tools":[{"name":"a1","description":"first"},{"name":"a2","description":"second"}]}"#),
                ("b.json", r#"{"name":"b","keywords":["beta"],"tools":[{"name":"b1","description":"third"}]}"#),
                ("c.json", r#"{"name":"c","core":true,"tools":[{"name":"c1","description":"core"}]}"#),
            ],
        )
        .unwrap();
        let matcher = Matcher::new(registry.keywords(), MatchMode::Word).unwrap();
        let index = SearchIndex::new(&registry);
        let activation = Activation::new(&registry, &Snapshot::default());
        let mut options = Options::default();
        options.search.mode = SearchMode::Off;
        let label = |q: &str, d: &[&str], split: &str| Labelled {
            query: q.into(),
            domains: d.iter().map(|s| s.to_string()).collect(),
            id: String::new(),
            split: split.into(),
        };
        let labelled = [
            // Hit: a (2 tools) + core (1) sent; oracle a + core = 3.
            label("alpha please", &["a"], "x"),
            // Miss: b sent, a and b wanted.
            label("beta", &["a", "b"], "x"),
            // Fallback sends everything (4 tools), which holds b.
            label("nothing here", &["b"], "y"),
            // A domain the registry lacks is a miss.
            label("alpha", &["zzz"], "y"),
        ];
        let inputs = Inputs {
            registry: &registry,
            matcher: &matcher,
            index: &index,
        };
        let report = evaluate(inputs, &activation, &options, &labelled);
        assert_eq!(report.unknown_domains, ["zzz"]);
        let x = &report.splits["x"];
        assert_eq!(x.queries, 2);
        assert_eq!(x.strict_recall, 0.5);
        assert_eq!(x.soft_recall, 0.75);
        assert_eq!(x.tools_sent, 2.5, "3 for alpha, 2 for beta");
        assert_eq!(x.oracle_tools, 3.5, "3, then a + b + core = 4");
        let y = &report.splits["y"];
        assert_eq!(y.strict_recall, 0.5);
        assert_eq!(y.fallback_rate, 0.5);
        assert_eq!(y.reasons["fallback"], 2);
        let all = &report.overall;
        assert_eq!(all.queries, 4);
        assert_eq!(all.strict_recall, 0.5);
        assert_eq!(report.registry_tools, 4);
        assert_eq!(all.tools_sent, (3 + 2 + 4 + 3) as f64 / 4.0);
        assert_eq!(all.registry_share, all.tools_sent / 4.0);
        // The misses: what each lacked and what it got instead, in file order.
        let miss = |query: &str, split: &str, missed: &[&str], answer: &[&str], tools, fallback| Miss {
            id: String::new(),
            split: split.into(),
            query: query.into(),
            missed: missed.iter().map(|s| s.to_string()).collect(),
            answer: answer.iter().map(|s| s.to_string()).collect(),
            tools,
            fallback,
        };
        assert_eq!(
            report.misses,
            [
                miss("beta", "x", &["a"], &["c:core", "b:keyword"], 2, false),
                miss("alpha", "y", &["zzz"], &["c:core", "a:keyword"], 3, false),
            ]
        );

        // A label given twice is one label; no label at all is nothing missed.
        let labelled = [
            label("alpha", &["a", "a"], "twice"),
            label("alpha", &["zzz", "zzz", "a"], "twice"),
            label("alpha", &[], "none"),
            // Known and unknown alike: a found of yyy, a and zzz; a's tools counted once.
            label("alpha", &["yyy", "a", "zzz", "yyy", "a"], "mixed"),
        ];
        let report = evaluate(inputs, &activation, &options, &labelled);
        assert_eq!(
            report.unknown_domains,
            ["zzz", "yyy"],
            "each once, in the order first met"
        );
        let mixed = &report.splits["mixed"];
        assert_eq!((mixed.strict_recall, mixed.soft_recall), (0.0, 1.0 / 3.0));
        assert_eq!(mixed.oracle_tools, 3.0, "a + core");
        let twice = &report.splits["twice"];
        assert_eq!((twice.strict_recall, twice.soft_recall), (0.5, 0.75));
        let none = &report.splits["none"];
        assert_eq!((none.strict_recall, none.soft_recall), (1.0, 1.0));
        let missed: Vec<&[String]> = report.misses.iter().map(|m| m.missed.as_slice()).collect();
        assert_eq!(
            missed,
            [
                &["zzz".to_string()][..],
                &["yyy".to_string(), "zzz".to_string()][..]
            ],
            "each missed label once, in label order; the found ones not"
        );
    }

    #[test]
    fn a_labelled_file_that_is_unreadable_or_has_a_bad_line_or_a_query_over_the_limit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.jsonl");
        std::fs::write(
            &path,
            "{\"query\": \"a\", \"domains\": [\"x\"]}\n{\"query\": \"b\", \"domains\": [], \"spilt\": \"dev\"}\n",
        )
        .unwrap();
        let e = read_labelled(&path, 1000).unwrap_err().to_string();
        assert!(
            e.contains(":2: not a labelled message") && e.contains("unknown field `spilt`"),
            "{e}"
        );
        std::fs::write(&path, "\u{feff}{\"query\": \"a\", \"domains\": [\"x\"]}\n").unwrap();
        assert_eq!(
            read_labelled(&path, 1000).unwrap().len(),
            1,
            "a byte-order mark is not part of the line"
        );
        // What serde or the file would say is said of the line, with its column.
        for (content, want) in [
            (
                "\n{\"query\": \"a\", \"domains\": [], \"query\": \"b\"}\n",
                ":2: not a labelled message ({\"query\", \"domains\"}): duplicate field `query` at column 37",
            ),
            (
                "{\"query\": \"a\", \"domains\": []}\n\u{feff}{\"query\": \"b\", \"domains\": []}\n",
                ":2: not a labelled message ({\"query\", \"domains\"}): the line starts with a byte-order mark",
            ),
            (
                "{\"query\": \"a\", \"domains\": [}\n",
                "expected value at column 28",
            ),
        ] {
            std::fs::write(&path, content).unwrap();
            let e = read_labelled(&path, 1000).unwrap_err().to_string();
            assert!(e.contains(want), "{content:?}: {e}");
        }
        std::fs::write(
            &path,
            b"{\"query\": \"a\", \"domains\": []}\n{\"query\": \"caf\xe9\"}\n",
        )
        .unwrap();
        let e = read_labelled(&path, 1000).unwrap_err().to_string();
        assert!(
            e.ends_with("q.jsonl:2: not UTF-8 text (an invalid byte at column 15); save the file as UTF-8"),
            "{e}"
        );
        std::fs::write(&path, "\n  \n").unwrap();
        let e = read_labelled(&path, 1000).unwrap_err().to_string();
        assert!(e.contains("no labelled message in it"), "{e}");
        std::fs::write(&path, "[\"list docker containers\", [\"docker\"]]\n").unwrap();
        let e = read_labelled(&path, 1000).unwrap_err().to_string();
        assert!(
            e.contains(":1: not a labelled message") && e.contains("a line must be a JSON object"),
            "{e}"
        );
        // Every bad line is named, each on a line of its own, up to a bound.
        let good = "{\"query\": \"a\", \"domains\": []}\n";
        std::fs::write(&path, format!("{good}nope\n{good}{{\"query\": \"b\"}}\n")).unwrap();
        let e = read_labelled(&path, 1000).unwrap_err().to_string();
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.len(), 2, "{e}");
        assert!(
            lines[0].contains("q.jsonl:2: not a labelled message") && lines[0].contains("expected ident"),
            "{e}"
        );
        assert!(
            lines[1].contains("q.jsonl:4: not a labelled message")
                && lines[1].contains("missing field `domains`"),
            "{e}"
        );
        std::fs::write(&path, "nope\n".repeat(MAX_BAD_LINES_NAMED + 5)).unwrap();
        let e = read_labelled(&path, 1000).unwrap_err().to_string();
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.len(), MAX_BAD_LINES_NAMED + 1, "{e}");
        assert_eq!(lines[MAX_BAD_LINES_NAMED], "… and 5 more bad lines", "{e}");
        // A query the daemon would refuse is not measured.
        let line = |query: &str| format!("{{\"query\": \"{query}\", \"domains\": []}}\n");
        std::fs::write(&path, line(&"x".repeat(1000)) + &line(&"x".repeat(1001))).unwrap();
        let e = read_labelled(&path, 1000).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e:?}");
        assert!(
            e.to_string()
                .contains(":2: not a labelled message ({\"query\", \"domains\"}): the query is 1001 bytes, over the limit of 1000 bytes (max_message_bytes)"),
            "{e}"
        );
        // A file that cannot be read is a configuration error too (exit code 2), naming it.
        let missing = dir.path().join("missing.jsonl");
        let e = read_labelled(&missing, 1000).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e:?}");
        assert!(
            e.to_string().contains("cannot read the labelled messages")
                && e.to_string().contains("missing.jsonl"),
            "{e}"
        );
    }
}
