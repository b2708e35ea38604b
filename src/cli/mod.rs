//! The command line: the clap tree and the dispatch, one file per command family.
//!
//! - [`serve`]: `serve`, its flags over the configuration, signals and logging.
//! - `client`: the commands that call a running daemon (`route`, `search`, `groups`, `load`,
//!   `tools`, `invalidate`, `reset`, `reload`, `describe`, `health`, `domains`), over
//!   [`connection`].
//! - `settings`: edit the settings table like a settings UI would.
//! - `check`: offline manifest validation and `keywords suggest`.
//! - `eval`: routing quality over labelled messages, in-process.
//! - [`bench`]: `bench grpc`, the load generator for a running deployment.
//!
//! Exit codes: 0 ok, 1 runtime failure, 2 bad configuration or manifests.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde_json::Value;

use crate::error::Error;

/// Writes a line to stdout, ignoring a closed pipe (`toolrouter tools | head`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        $crate::cli::written(writeln!(std::io::stdout().lock(), $($arg)*));
    }};
}

/// The first failure to write to stdout other than a closed pipe (a reader such as `head`
/// that has what it wants), reported at exit: a command whose output did not reach its file
/// (a full disk) has failed.
static STDOUT_FAILED: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Notes a write to stdout that failed, for the exit code.
pub(crate) fn written(result: std::io::Result<()>) {
    if let Err(e) = result
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        let mut failed = STDOUT_FAILED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        failed.get_or_insert_with(|| e.to_string());
    }
}

pub mod bench;
mod check;
mod client;
pub mod connection;
mod eval;
pub mod serve;
mod settings;

use bench::BenchCommand;
use check::KeywordsCommand;
use client::{ClientArgs, DomainsCommand};
use connection::{Connection, DEFAULT_ADDR};
use eval::EvalArgs;
use serve::ServeArgs;
use settings::SettingsAction;

/// toolrouter: decides which LLM tool definitions a chat backend sends on each turn.
#[derive(Debug, Parser)]
#[command(name = "toolrouter", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Serve(Box<ServeArgs>),
    /// Route a message: which domains and tools a turn gets, and why.
    Route {
        /// The user's message.
        message: String,
        /// Route within this conversation.
        #[arg(long)]
        conversation: Option<String>,
        /// Compute the answer but record nothing about the conversation.
        #[arg(long)]
        dry_run: bool,
        /// Print the tools as the JSON array a provider takes: openai_chat,
        /// openai_responses, anthropic, gemini or mcp.
        #[arg(long, value_parser = client::parse_format)]
        format: Option<crate::proto::Format>,
        /// At most this many tools [default, and with 0: the daemon's --max-tools].
        #[arg(long)]
        max_tools: Option<u32>,
        /// At most this many tokens [default, and with 0: the daemon's --token-budget].
        #[arg(long)]
        token_budget: Option<u32>,
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Search every tool of the registry by what it does (the `search_tools` meta-tool).
    Search {
        /// What to look for.
        query: String,
        /// How many hits (at most 20).
        #[arg(long, default_value_t = 5)]
        limit: u32,
        /// The conversation to load the top hits' groups into (with `--load`).
        #[arg(long)]
        conversation: Option<String>,
        /// Load the active groups of the top hits (at most 3) into the conversation.
        #[arg(long, requires = "conversation")]
        load: bool,
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Measure routing on labelled messages, in-process (no daemon needed): what routing
    /// chose, before any budget (`--max-tools`, `--token-budget` are not applied).
    Eval(Box<EvalArgs>),
    /// Help for manifest authors.
    Keywords {
        /// What to do.
        #[command(subcommand)]
        command: KeywordsCommand,
    },
    /// List every domain, whether it is active, and the prompt section.
    Groups {
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Load a group's tools into a conversation.
    Load {
        /// The group's name.
        group: String,
        /// The conversation to load it into.
        #[arg(long)]
        conversation: String,
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List every tool of every domain, whatever the settings.
    Tools {
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Ask the daemon to re-read the settings table now.
    Invalidate {
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// May the model call this tool now? Prints whether it is allowed, whether `Route`
    /// answers it for the conversation now, and the reason when it is not allowed.
    CheckCall {
        /// The tool's name.
        tool: String,
        /// The conversation the call is in.
        #[arg(long)]
        conversation: Option<String>,
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Forget one conversation's loaded groups and sticky hits.
    Reset {
        /// The conversation to forget.
        #[arg(long)]
        conversation: String,
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Ask the daemon to reload its manifests (as SIGHUP does); exits 2 when it refuses
    /// invalid manifests (the old registry keeps serving).
    Reload {
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Describe the running daemon: version, registry, database, settings age, uptime and
    /// its effective configuration (secrets left out).
    Describe {
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Register domains at run time (stored in the daemon's database, kept across reloads
    /// and restarts) or remove them.
    Domains {
        /// What to do.
        #[command(subcommand)]
        command: DomainsCommand,
    },
    /// Check the daemon's gRPC health; exits 0 when it is SERVING.
    Health {
        /// Connection and output options.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Validate manifest folders offline; exits 2 on any error. Warnings (a tool without a
    /// tier, a description over 1,024 characters, a schema with `anyOf`-like keywords or a
    /// property name Anthropic refuses at its top level, a folder without manifests, a skipped
    /// file) are printed and do not fail.
    Check {
        /// Folders of `*.json` / `*.toml` manifests.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Print the summary, errors and warnings as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Load-test a running daemon.
    Bench {
        /// Which tool.
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Edit the settings table, then ask a running daemon to invalidate (best effort).
    ///
    /// Without `--database`, the running daemon is asked which database it uses (else
    /// `sqlite://toolrouter.db`). A database other than the daemon's is refused without
    /// `--force`, and one that does not exist without `--create` (exit 2).
    Settings {
        /// What to do with the table.
        #[command(subcommand)]
        action: SettingsAction,
        /// The database to edit [default: the running daemon's, else sqlite://toolrouter.db].
        #[arg(long, global = true, env = "TOOLROUTER_DATABASE")]
        database: Option<String>,
        /// Write even though the daemon at `--addr` uses another database.
        #[arg(long, global = true)]
        force: bool,
        /// Create the database file when it does not exist.
        #[arg(long, global = true)]
        create: bool,
        /// Print the outcome as JSON (`list`: the settings; `set`, `unset`: what was done).
        #[arg(long, global = true)]
        json: bool,
        /// How long to wait for the daemon, e.g. `3s` [default: 10s].
        #[arg(long, global = true, env = "TOOLROUTER_TIMEOUT", value_parser = humantime::parse_duration)]
        timeout: Option<Duration>,
        /// The daemon to notify.
        #[arg(long, global = true, env = "TOOLROUTER_ADDR", default_value = DEFAULT_ADDR)]
        addr: String,
        /// Bearer token, when the daemon requires one.
        #[arg(long, global = true, env = "TOOLROUTER_AUTH_TOKEN", hide_env_values = true)]
        auth_token: Option<String>,
        /// CA certificate (PEM) to trust for an `https://` address.
        #[arg(long, global = true, env = "TOOLROUTER_TLS_CA")]
        tls_ca: Option<PathBuf>,
    },
}

/// A failure with the exit code it maps to.
struct Failure {
    code: u8,
    message: String,
    /// Already said in the log: not printed again.
    logged: bool,
}

impl Failure {
    fn runtime(message: impl Into<String>) -> Self {
        Failure {
            code: 1,
            message: message.into(),
            logged: false,
        }
    }
    fn config(message: impl Into<String>) -> Self {
        Failure {
            code: 2,
            message: message.into(),
            logged: false,
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::Manifests(_) | Error::Config(_) => Failure::config(e.to_string()),
            other => Failure::runtime(other.to_string()),
        }
    }
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        // The daemon says what it wants; the command line says how to give it.
        let hint = if s.code() == tonic::Code::Unauthenticated {
            " Pass --auth-token (or set TOOLROUTER_AUTH_TOKEN)."
        } else {
            ""
        };
        Failure::runtime(format!("{:?}: {}{hint}", s.code(), s.message()))
    }
}

/// Runs the parsed command line and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve(args) => serve::serve(&args).await,
        Command::Route {
            message,
            conversation,
            dry_run,
            format,
            max_tools,
            token_budget,
            client,
        } => {
            let route = client::RouteArgs {
                conversation,
                dry_run,
                format,
                max_tools,
                token_budget,
            };
            client::route(&client, message, route).await
        }
        Command::Search {
            query,
            limit,
            conversation,
            load,
            client,
        } => client::search(&client, query, limit, conversation, load).await,
        Command::Eval(args) => eval::eval(&args),
        Command::Keywords { command } => check::keywords(command),
        Command::Groups { client } => client::groups(&client).await,
        Command::Load {
            group,
            conversation,
            client,
        } => client::load(&client, group, conversation).await,
        Command::Tools { client } => client::tools(&client).await,
        Command::Invalidate { client } => client::invalidate(&client).await,
        Command::CheckCall {
            tool,
            conversation,
            client,
        } => client::check_call(&client, tool, conversation).await,
        Command::Reset { conversation, client } => client::reset(&client, conversation).await,
        Command::Reload { client } => client::reload(&client).await,
        Command::Describe { client } => client::describe(&client).await,
        Command::Domains { command } => client::domains(command).await,
        Command::Health { client } => client::health(client).await,
        Command::Check { dirs, json } => check::check(&dirs, json),
        Command::Settings {
            action,
            database,
            force,
            create,
            json,
            timeout,
            addr,
            auth_token,
            tls_ca,
        } => {
            let conn = Connection {
                addr,
                auth_token,
                tls_ca,
                timeout,
            };
            let opts = settings::SettingsOptions {
                database,
                force,
                create,
                json,
            };
            settings::settings(action, &opts, &conn).await
        }
        Command::Bench { command } => bench::bench(command).await,
    };
    // Output that did not reach stdout fails a command that otherwise succeeded.
    use std::io::Write as _;
    written(std::io::stdout().flush());
    let unwritten = STDOUT_FAILED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    let result = match (result, unwritten) {
        (Ok(()), Some(e)) => Err(Failure::runtime(format!("cannot write the output: {e}"))),
        (result, _) => result,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if !f.logged {
                eprintln!("error: {}", f.message);
            }
            ExitCode::from(f.code)
        }
    }
}

fn print_json(v: &Value) {
    // A `Value` always serialises.
    out!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Prints rows under headers, each column as wide as its widest cell on a terminal (a Han
/// character takes two columns). A cell's control characters are escaped (`\n`, `\u{1b}`):
/// a row stays one line, and text from a manifest cannot send the terminal escape codes.
fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    for line in table_lines(headers, rows) {
        out!("{line}");
    }
}

/// [`print_table`]'s lines.
fn table_lines(headers: &[&str], rows: &[Vec<String>]) -> Vec<String> {
    use unicode_width::UnicodeWidthStr as _;
    let shown = |cell: &str| -> String {
        if cell.chars().any(char::is_control) {
            cell.chars()
                .map(|c| {
                    if c.is_control() {
                        c.escape_default().to_string()
                    } else {
                        c.to_string()
                    }
                })
                .collect()
        } else {
            cell.to_string()
        }
    };
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| shown(c)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.width()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.width());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            text.push_str(cell);
            text.extend(std::iter::repeat_n(' ', w.saturating_sub(cell.width())));
        }
        text.trim_end().to_string()
    };
    let mut lines = vec![line(headers.to_vec())];
    lines.extend(
        rows.iter()
            .map(|row| line(row.iter().map(String::as_str).collect())),
    );
    lines
}

#[cfg(test)]
mod tests {
    use super::table_lines;

    #[test]
    fn a_table_keeps_one_line_per_row_escapes_control_characters_and_aligns_wide_text() {
        let rows = vec![
            vec!["天気予報".to_string(), "yes".to_string()],
            vec!["two\nlines\t\u{1b}[31mred".to_string(), "no".to_string()],
            vec!["plain".to_string(), "yes".to_string()],
        ];
        let lines = table_lines(&["NAME", "ACTIVE"], &rows);
        assert_eq!(
            lines,
            [
                "NAME                       ACTIVE",
                "天気予報                   yes",
                "two\\nlines\\t\\u{1b}[31mred  no",
                "plain                      yes",
            ]
        );
    }
}
