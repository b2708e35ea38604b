//! `settings`: edit the settings table as a settings UI would, then ask the running daemon
//! to re-read it (best effort). Guards against editing a database the daemon does not use.

use clap::Subcommand;
use serde_json::{Value, json};

use super::client::{call, within};
use super::connection::Connection;
use super::{Failure, print_json, print_table};
use crate::db::Db;
use crate::proto;

/// `settings` actions.
#[derive(Debug, Subcommand)]
pub enum SettingsAction {
    /// Set KEY to VALUE.
    Set {
        /// The settings key.
        key: String,
        /// Its value.
        value: String,
    },
    /// Remove KEY.
    Unset {
        /// The settings key.
        key: String,
    },
    /// Print every setting.
    List,
}

/// `settings` options besides the action.
pub(super) struct SettingsOptions {
    /// `--database`, when given (flag or environment).
    pub(super) database: Option<String>,
    /// `--force`: write a database other than the daemon's.
    pub(super) force: bool,
    /// `--create`: create a database file that does not exist.
    pub(super) create: bool,
    /// `--json`: print the outcome as JSON.
    pub(super) json: bool,
}

/// The database `settings` used when neither `--database` nor a running daemon names one.
const DEFAULT_DATABASE: &str = "sqlite://toolrouter.db";

pub(super) async fn settings(
    action: SettingsAction,
    opts: &SettingsOptions,
    conn: &Connection,
) -> Result<(), Failure> {
    let addr = &conn.addr;
    let writes = !matches!(action, SettingsAction::List);
    // A value the daemon would ignore is refused before the daemon is asked or anything written.
    // (`unset` takes any key: a blank one another program wrote can be removed.)
    if let SettingsAction::Set { key, value } = &action
        && let Some(why) = crate::router::refused_setting(key, value)
    {
        return Err(Failure::config(format!("{why}; nothing written")));
    }
    // Which database the daemon at --addr uses, when one answers. A daemon that answers but
    // will not say (it wants a token, or speaks TLS) is not "no daemon": without --database
    // this could write a database it does not use.
    let daemon = match conn.client().await {
        Ok(mut c) => match within(conn, c.describe_server(proto::DescribeServerRequest {})).await {
            Some(Ok(r)) => Some(r),
            _ if opts.database.is_some() => None,
            // Connected, then no answer in time (a daemon stopped or overloaded) or none at
            // all: a daemon is there, and the default database may not be its own.
            None => {
                return Err(Failure::config(format!(
                    "the daemon at {addr} did not say within {} which database it uses: pass \
                     --database to name the database, or a longer --timeout",
                    humantime::format_duration(conn.timeout())
                )));
            }
            Some(Err(s)) if s.code() == tonic::Code::Unavailable => {
                return Err(Failure::config(format!(
                    "the daemon at {addr} did not say which database it uses ({}): pass \
                     --database to name the database, or try again",
                    s.message()
                )));
            }
            Some(Err(s)) => {
                return Err(Failure::config(format!(
                    "the daemon at {addr} did not say which database it uses ({:?}: {}): pass \
                     --auth-token (or --tls-ca with an https:// address) so it can, or --database \
                     to name the database",
                    s.code(),
                    s.message()
                )));
            }
        },
        // A bad address, CA file or token is the caller's to fix.
        Err(e @ crate::Error::Config(_)) => return Err(e.into()),
        Err(_) if opts.database.is_some() => None,
        // Something is there that could not be asked (TLS it does not trust, say): without
        // --database this could write a database that daemon does not use.
        Err(e) if conn.listening().await => {
            return Err(Failure::config(format!(
                "the daemon at {addr} could not be asked which database it uses ({e}): pass \
                 --tls-ca with an https:// address, or --auth-token, so it can, or --database to \
                 name the database"
            )));
        }
        // Nothing listens: no daemon to ask.
        Err(_) => None,
    };
    let daemon_postgres = daemon
        .as_ref()
        .filter(|d| d.database_path.is_empty() && crate::db::is_postgres(&d.database));
    let database = match (&opts.database, &daemon) {
        (Some(db), _) => db.clone(),
        // The daemon reports its PostgreSQL URL without credentials, which only the caller has.
        (None, Some(_)) if let Some(d) = daemon_postgres => {
            return Err(Failure::config(format!(
                "the daemon at {addr} uses {}: pass --database with that URL and its credentials",
                d.database
            )));
        }
        // The daemon's own database: its URL, by the absolute path it reported.
        (None, Some(d)) if !d.database_path.is_empty() => format!("sqlite://{}", d.database_path),
        (None, _) => DEFAULT_DATABASE.to_string(),
    };
    crate::db::check_url(&database)?;
    let file = crate::db::database_file(&database)?;
    // What the daemon uses and what this would write, as each names it: a file by its
    // absolute path, a server by its URL without credentials; and the daemon's as an argument
    // to pass (quoted).
    let theirs = daemon.as_ref().and_then(|d| {
        if !d.database_path.is_empty() {
            Some((
                d.database_path.clone(),
                format!("{:?}", format!("sqlite://{}", d.database_path)),
            ))
        } else {
            daemon_postgres.map(|d| {
                (
                    d.database.clone(),
                    format!("{:?} (with its credentials)", d.database),
                )
            })
        }
    });
    let ours = match &file {
        Some(f) => Some(f.display().to_string()),
        None if crate::db::is_postgres(&database) => Some(crate::db::redact_url(&database)),
        None => None,
    };
    // Two server URLs name one database whatever their credentials and parameters.
    let same = |a: &str, b: &str| {
        a == b
            || (crate::db::is_postgres(a)
                && crate::db::is_postgres(b)
                && crate::db::postgres_database(a) == crate::db::postgres_database(b))
    };
    // Whether this writes a database the daemon does not use.
    let elsewhere = match (&theirs, &ours) {
        (Some((theirs, their_url)), Some(ours)) if !same(theirs, ours) => Some((theirs, their_url, ours)),
        _ => None,
    };
    // Why the daemon is not told, when it is not: for the note on stderr and `--json`.
    let mut untold = None;
    if let Some((theirs, their_url, ours)) = elsewhere {
        let edit = format!("the daemon at {addr} uses {theirs}, not {ours}");
        let message = match (writes, opts.force) {
            (true, false) => {
                return Err(Failure::config(format!(
                    "{edit}: pass --database {their_url} to edit its settings, or --force to write the other database anyway"
                )));
            }
            (true, true) => format!("{edit}: writing {ours} anyway (--force); the daemon is not told"),
            (false, _) => format!("{edit}: pass --database {their_url} to list its settings"),
        };
        eprintln!("note: {message}");
        untold = Some(message);
    }
    if let Some(file) = &file
        && !file.exists()
    {
        if !opts.create {
            return Err(Failure::config(format!(
                "the database {} does not exist; pass --create to create it (or --database to name the daemon's)",
                file.display()
            )));
        }
        // SQLite would take a log left beside a deleted file (a daemon may still hold that
        // file) as the new file's own, and fail on it, or lay its pages over the new file.
        let [log, _] = crate::db::log_paths(file);
        if log.exists() {
            return Err(Failure::config(format!(
                "the database {} does not exist, but its write-ahead log {} does: a daemon may still \
                 hold the deleted file. Move a backup over the path, or stop that daemon and remove \
                 {} and its -shm beside it; nothing written",
                file.display(),
                log.display(),
                log.display()
            )));
        }
    }
    // What was done, for --json: the action, the key and (unset) whether it was set.
    let mut done = match action {
        // Listing reads the table as it is: a database of another program is not migrated.
        SettingsAction::List => {
            let mut rows = crate::db::read_settings_only(&database).await?;
            rows.sort();
            if opts.json {
                let map: serde_json::Map<String, Value> =
                    rows.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
                print_json(&json!({ "settings": map }));
            } else {
                let rows: Vec<Vec<String>> = rows.into_iter().map(|(k, v)| vec![k, v]).collect();
                print_table(&["KEY", "VALUE"], &rows);
            }
            return Ok(());
        }
        SettingsAction::Set { key, value } => {
            let db = Db::connect(&database).await?;
            db.set_setting(&key, &value).await?;
            db.close().await;
            if !opts.json {
                out!("set {key}");
            }
            json!({ "action": "set", "key": key })
        }
        SettingsAction::Unset { key } => {
            let db = Db::connect(&database).await?;
            let existed = db.unset_setting(&key).await?;
            db.close().await;
            if !opts.json {
                out!("{} {key}", if existed { "unset" } else { "was not set:" });
            }
            json!({ "action": "unset", "key": key, "wasSet": existed })
        }
    };
    // A database the daemon does not use (written with --force): nothing to tell it.
    if let Some(why) = untold {
        if opts.json {
            done["note"] = Value::String(why);
            print_json(&done);
        }
        return Ok(());
    }
    // Best effort: the change is in the table either way and shows within one TTL.
    let notified = match conn.client().await {
        Ok(mut c) => call(conn, c.invalidate_settings(proto::InvalidateSettingsRequest {})).await,
        Err(e) => Err(e.into()),
    };
    let postgres = crate::db::is_postgres(&database);
    let note = |f: &Failure| {
        format!(
            "{} ({})",
            f.message,
            if postgres {
                "daemons on this database see the change at once: the table's trigger tells them"
            } else {
                "the daemon will see the change within its settings TTL"
            }
        )
    };
    if opts.json {
        // The daemon's answer in its canonical JSON mapping, or why there is none.
        match &notified {
            Ok(r) => done["invalidated"] = serde_json::to_value(r).unwrap_or_default(),
            Err(f) => done["note"] = Value::String(note(f)),
        }
        print_json(&done);
        return Ok(());
    }
    match notified {
        Ok(r) => out!(
            "daemon at {addr} re-read settings; active domains: {}",
            r.active_domains.join(", ")
        ),
        Err(f) => out!("note: {}", note(&f)),
    }
    Ok(())
}
