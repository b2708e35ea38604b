//! `check` (validate manifest folders offline) and `keywords suggest` (help for manifest
//! authors): both read manifests from disk, no daemon.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::{Value, json};

use super::{Failure, print_json, print_table};
use crate::error::Error;
use crate::registry::Registry;

/// `keywords` tools.
#[derive(Debug, Subcommand)]
pub enum KeywordsCommand {
    /// For each domain, the words that best separate its tools from the rest of the
    /// registry and that its keywords do not cover yet, best first.
    Suggest {
        /// Folders of `*.json` / `*.toml` manifests.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Suggestions per domain.
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub(super) fn keywords(command: KeywordsCommand) -> Result<(), Failure> {
    match command {
        KeywordsCommand::Suggest { dirs, limit, json } => suggest_keywords(&dirs, limit, json),
    }
}

fn suggest_keywords(dirs: &[PathBuf], limit: usize, json: bool) -> Result<(), Failure> {
    // What `check` would warn of, said here too: a folder without manifests suggests nothing.
    let (registry, warnings) = Registry::check_dirs(dirs);
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    let registry = registry?;
    let index = crate::search::SearchIndex::new(&registry);
    let suggestions = index.suggest_keywords(&registry, limit);
    if json {
        let domains: Vec<Value> = registry
            .domains()
            .iter()
            .zip(&suggestions)
            .map(|(d, s)| {
                json!({
                    "domain": d.name,
                    "suggestions": s.iter().map(|(w, score)| json!({"term": w, "score": score})).collect::<Vec<_>>(),
                })
            })
            .collect();
        print_json(&json!({ "domains": domains }));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = registry
        .domains()
        .iter()
        .zip(&suggestions)
        .map(|(d, s)| {
            let words: Vec<&str> = s.iter().map(|(w, _)| w.as_str()).collect();
            vec![d.name.clone(), words.join(", ")]
        })
        .collect();
    print_table(&["DOMAIN", "SUGGESTED KEYWORDS"], &rows);
    Ok(())
}

pub(super) fn check(dirs: &[PathBuf], as_json: bool) -> Result<(), Failure> {
    let (registry, warnings) = Registry::check_dirs(dirs);
    // One JSON shape for problems of both kinds; lowerCamelCase like the RPCs' JSON.
    let problem = |e: &crate::error::ManifestError| {
        let mut v = json!({ "path": e.path, "message": e.message });
        if let Some((line, column)) = e.position {
            v["line"] = json!(line);
            v["column"] = json!(column);
        }
        v
    };
    let warnings_json: Vec<Value> = warnings.iter().map(problem).collect();
    if !as_json {
        for w in &warnings {
            eprintln!("warning: {w}");
        }
    }
    let registry = match registry {
        Ok(r) => r,
        Err(Error::Manifests(errors)) if as_json => {
            print_json(&json!({
                "ok": false,
                "errors": errors.0.iter().map(problem).collect::<Vec<_>>(),
                "warnings": warnings_json,
            }));
            return Err(Failure::config(format!(
                "{} manifest problem(s); see the JSON above",
                errors.0.len()
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let keywords = registry.keywords().count();
    // Exact o200k_base counts of each tool as the OpenAI chat format renders it (SPEC §9).
    let renders = crate::render::Renders::new(&registry);
    let per_domain: Vec<(&str, usize, u32)> = registry
        .domain_ids()
        .map(|d| {
            let domain = registry.domain(d);
            (
                domain.name.as_str(),
                domain.tools.len(),
                renders.domain_tokens(&registry, d),
            )
        })
        .collect();
    let total: u64 = per_domain.iter().map(|(_, _, t)| u64::from(*t)).sum();
    if as_json {
        print_json(&json!({
            "ok": true,
            "domains": registry.domains().len(),
            "tools": registry.tool_count(),
            "keywords": keywords,
            "schemaTokens": total,
            "domainTokens": per_domain
                .iter()
                .map(|(name, tools, tokens)| json!({"domain": name, "tools": tools, "tokens": tokens}))
                .collect::<Vec<_>>(),
            // 64-bit, so a string as in the RPCs' JSON.
            "registryVersion": registry.version().to_string(),
            "errors": [],
            "warnings": warnings_json,
        }));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = per_domain
        .iter()
        .map(|(name, tools, tokens)| vec![name.to_string(), tools.to_string(), tokens.to_string()])
        .collect();
    print_table(&["DOMAIN", "TOOLS", "TOKENS"], &rows);
    out!(
        "\nok: {} domains, {} tools, {} keywords, {} schema tokens (o200k_base, OpenAI chat format)",
        registry.domains().len(),
        registry.tool_count(),
        keywords,
        total
    );
    Ok(())
}
