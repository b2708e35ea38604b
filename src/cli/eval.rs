//! `eval`: routing quality over labelled messages, in-process with the same manifest and
//! routing options as `serve` (the measuring is `crate::eval`; this prints it).

use std::path::{Path, PathBuf};

use clap::Args;

use super::serve::ServeArgs;
use super::{Failure, print_table};
use crate::config::Config;
use crate::registry::Registry;

/// `eval` options: the labelled messages, and the same manifest and routing options as
/// `serve` (every domain active unless `--database` is given).
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Labelled messages, JSONL: `{"query", "domains", "id"?, "split"?}` per line.
    #[arg(long)]
    pub queries: PathBuf,
    /// Print only the final JSON line.
    #[arg(long)]
    pub json: bool,
    /// Also write every message whose answer lacked a labelled domain to this file (created,
    /// or emptied once the run is done; a run that fails leaves it as it was), one JSON
    /// object per line: `{"id"?, "split"?, "query", "missed",
    /// "answer" ("name:reason" in answer order), "tools", "fallback"}`.
    #[arg(long, value_name = "FILE")]
    pub misses: Option<PathBuf>,
    /// Manifests, database and routing options, as for `serve`.
    #[command(flatten)]
    pub serve: Box<ServeArgs>,
}

pub(super) fn eval(args: &EvalArgs) -> Result<(), Failure> {
    use crate::eval::Figures;
    // Nothing is served: an address in use, TLS files or tokens a shell set for `serve` do
    // not stop a measurement (values that do not parse still do, as in `serve`).
    let config = args.serve.offline_config()?;
    if args.serve.print_config {
        out!("{}", config.to_toml());
        return Ok(());
    }
    let labelled = crate::eval::read_labelled(&args.queries, config.max_message_bytes)?;
    let manifests = Registry::load(&config.manifests)?;
    // Opened before routing, so a path that cannot be written stops the run at once.
    let misses = args
        .misses
        .as_deref()
        .map(|path| MissesFile::create(path, &args.queries))
        .transpose()?;
    // Every domain active, unless a database is named (by flag, environment or config file):
    // then its settings table, and the registry it serves (the manifests' domains and the
    // ones registered at run time in it). A named database must exist, not be created empty.
    let named = args.serve.database.is_some() || Config::file_sets(args.serve.config.as_deref(), "database")?;
    let (registry, snapshot) = match named.then_some(&config.database) {
        None => {
            let snapshot = crate::router::Snapshot::every_key_set(&manifests);
            (manifests, snapshot)
        }
        Some(url) => {
            if let Some(file) = crate::db::database_file(url)?
                && !file.exists()
            {
                return Err(Failure::config(format!(
                    "the database {} does not exist",
                    file.display()
                )));
            }
            let runtime = tokio::runtime::Handle::current();
            let stored = tokio::task::block_in_place(|| runtime.block_on(crate::db::read_stored_only(url)))
                .map_err(|e| match e {
                // A file that is not a database (or a damaged one) is the caller's to fix, as
                // one without a settings table is; a locked or unreadable one is not.
                crate::Error::Unavailable(why)
                    if why.contains("file is not a database") || why.contains("disk image is malformed") =>
                {
                    Failure::config(why)
                }
                e => e.into(),
            })?;
            (
                crate::state::with_stored_domains(manifests, stored.domains),
                crate::router::Snapshot::new(stored.settings),
            )
        }
    };
    let matcher = crate::matcher::Matcher::new(registry.keywords(), config.keyword_match)?;
    let started = std::time::Instant::now();
    let index = crate::search::SearchIndex::new(&registry);
    let index_ms = started.elapsed().as_secs_f64() * 1e3;
    let activation = crate::router::Activation::new(&registry, &snapshot);
    let inputs = crate::router::Inputs {
        registry: &registry,
        matcher: &matcher,
        index: &index,
    };
    let report = crate::eval::evaluate(inputs, &activation, &config.routing(), &labelled);
    if !report.unknown_domains.is_empty() {
        eprintln!(
            "warning: {} labelled domains are not in the registry (counted as misses): {}",
            report.unknown_domains.len(),
            report
                .unknown_domains
                .iter()
                .map(|d| format!("{d:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if let Some(file) = misses {
        file.write(&report.misses)?;
    }
    if !args.json {
        let row = |name: &str, f: &Figures| {
            vec![
                name.to_string(),
                f.queries.to_string(),
                format!("{:.3}", f.strict_recall),
                format!("{:.3}", f.soft_recall),
                format!("{:.1}", f.tools_sent),
                format!("{:.1} %", f.registry_share * 100.0),
                format!("{:.1}", f.oracle_tools),
                f.cost_ratio.map_or_else(|| "n/a".into(), |c| format!("{c:.2}x")),
                format!("{:.1} %", f.fallback_rate * 100.0),
                format!("{:.1}", f.us_median),
            ]
        };
        let mut rows: Vec<Vec<String>> = report
            .splits
            .iter()
            .map(|(n, f)| {
                // A split named like a row of the table's own is shown quoted.
                let shown = match n.as_str() {
                    "" => "(no split)".to_string(),
                    "overall" | "(no split)" => format!("{n:?}"),
                    _ => n.clone(),
                };
                row(&shown, f)
            })
            .collect();
        rows.push(row("overall", &report.overall));
        print_table(
            &[
                "SPLIT",
                "QUERIES",
                "STRICT",
                "SOFT",
                "TOOLS",
                "SHARE",
                "ORACLE",
                "COST",
                "FALLBACK",
                "US MEDIAN",
            ],
            &rows,
        );
        let reasons: Vec<String> = report
            .overall
            .reasons
            .iter()
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        out!(
            "\n{} domains, {} tools; index built in {index_ms:.0} ms; domains by reason: {}",
            registry.domains().len(),
            report.registry_tools,
            reasons.join(", ")
        );
        if let Some(path) = &args.misses {
            out!(
                "{} {} lacked a labelled domain: written to {}",
                report.misses.len(),
                if report.misses.len() == 1 {
                    "message"
                } else {
                    "messages"
                },
                path.display()
            );
        }
    }
    let line = serde_json::to_string(&report).map_err(|e| Failure::runtime(e.to_string()))?;
    out!("{line}");
    Ok(())
}

/// The file `eval --misses` names. It is opened at start without being emptied, so a path
/// that cannot be written stops the run before routing and a run that fails leaves the file
/// as it was (one it created is removed); the misses are written into it, emptied, once the
/// run is done. Writing through the path itself (not a file renamed over it) keeps a
/// symbolic link, a device (`/dev/stdout`) or a mounted file what it is.
struct MissesFile<'a> {
    path: &'a Path,
    file: std::fs::File,
    /// The run created the file: removed unless the misses were written.
    created: bool,
}

impl<'a> MissesFile<'a> {
    /// Opens `path` for writing (created when missing, not emptied); refuses it when it is
    /// the labelled file.
    fn create(path: &'a Path, queries: &Path) -> Result<Self, Failure> {
        let cannot = |e: &dyn std::fmt::Display| {
            Failure::config(format!("cannot write the misses to {}: {e}", path.display()))
        };
        let existed = path.exists();
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .map_err(|e| cannot(&e))?;
        let opened = MissesFile {
            path,
            file,
            created: !existed,
        };
        // The labelled file is never written over, however the two paths are spelled.
        if let Ok(labelled) = std::fs::File::open(queries)
            && same_file(&opened.file, &labelled)
        {
            return Err(cannot(
                &"it is the labelled file --queries reads; name another file",
            ));
        }
        Ok(opened)
    }

    /// Empties the file and writes the misses into it, one JSON object per line.
    fn write(mut self, misses: &[crate::eval::Miss]) -> Result<(), Failure> {
        use std::io::Write as _;
        let cannot = |e: &dyn std::fmt::Display| {
            Failure::runtime(format!("cannot write the misses to {}: {e}", self.path.display()))
        };
        // A device or a pipe cannot be emptied, and has nothing to empty.
        if self.file.metadata().is_ok_and(|m| m.is_file()) {
            self.file.set_len(0).map_err(|e| cannot(&e))?;
        }
        let mut out = std::io::BufWriter::new(&self.file);
        misses
            .iter()
            .try_for_each(|miss| {
                serde_json::to_writer(&mut out, miss)?;
                out.write_all(b"\n").map_err(serde_json::Error::io)
            })
            .and_then(|()| out.flush().map_err(serde_json::Error::io))
            .map_err(|e| cannot(&e))?;
        self.created = false;
        Ok(())
    }
}

impl Drop for MissesFile<'_> {
    fn drop(&mut self) {
        // A file this run created and did not write (the run failed) goes.
        if self.created {
            let _ = std::fs::remove_file(self.path);
        }
    }
}

/// Whether two open files are one file (on Unix, the same device and inode).
fn same_file(a: &std::fs::File, b: &std::fs::File) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        match (a.metadata(), b.metadata()) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (a, b);
        false
    }
}
