//! The crate's error type and its single mapping onto gRPC status codes.

use std::fmt;

/// Shorthand for results whose error is the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One problem found in one manifest file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// The file's path as given (or the demo manifest's name).
    pub path: String,
    /// `(line, column)`, 1-based, for syntax errors.
    pub position: Option<(usize, usize)>,
    /// What is wrong, naming the field, tool or domain.
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, col)) => write!(f, "{}:{line}:{col}: {}", self.path, self.message),
            None => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

/// Every problem found while loading a set of manifests (loading fails as a whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestErrors(pub Vec<ManifestError>);

impl fmt::Display for ManifestErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// What went wrong, phrased for the caller. The request variants' `Display` is the exact
/// text of SPEC §5 that clients depend on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Manifests failed validation; every problem is listed.
    #[error("{0}")]
    Manifests(ManifestErrors),
    /// A reload found invalid manifests; the registry still served is named.
    #[error("The manifests are invalid; still serving registry version {version:016x}.\n{errors}")]
    ManifestsRefused {
        /// The version of the registry that keeps serving.
        version: u64,
        /// What is wrong with the new manifests.
        errors: ManifestErrors,
    },
    /// A required request field is empty (or only whitespace).
    #[error("Required parameter '{field}' is missing.")]
    MissingParameter {
        /// The field's name in the request.
        field: &'static str,
    },
    /// A field required only together with another one is empty.
    #[error("Required parameter '{field}' is missing (needed with '{with}').")]
    MissingWith {
        /// The missing field.
        field: &'static str,
        /// The field that needs it.
        with: &'static str,
    },
    /// A free-text field is longer than `max_message_bytes`.
    #[error("'{field}' is {len} bytes, over the limit of {limit} bytes (max_message_bytes).")]
    MessageTooLong {
        /// The field's name in the request.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// A name-like field (conversation id, group name) is too long.
    #[error("'{field}' is {len} bytes, over the limit of {limit} bytes.")]
    NameTooLong {
        /// The field's name in the request.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// A name-like field holds control characters (Unicode category Cc).
    #[error("'{field}' must not contain control characters.")]
    ControlCharacters {
        /// The field's name in the request.
        field: &'static str,
    },
    /// An enum field holds a value this daemon does not know (a newer client's).
    #[error("'{field}' has an unknown value {value}.")]
    UnknownEnumValue {
        /// The field's name in the request.
        field: &'static str,
        /// The number sent.
        value: i32,
    },
    /// No domain has this name; the groups that could be loaded are listed.
    #[error(
        "Tool group '{}' not found. Available groups: {}",
        echo(group),
        listed(available)
    )]
    GroupNotFound {
        /// The name asked for.
        group: String,
        /// Active non-core groups with tools, by name.
        available: Vec<String>,
    },
    /// The group exists but none of its settings keys has a value.
    #[error(
        "Tool group '{}' is not configured: set one of {}.",
        echo(group),
        listed(keys)
    )]
    GroupNotConfigured {
        /// The group.
        group: String,
        /// Its settings keys.
        keys: Vec<String>,
    },
    /// The group exists and is active but has no tools.
    #[error("Tool group '{}' has no available tools.", echo(group))]
    GroupWithoutTools {
        /// The group.
        group: String,
    },
    /// The request names a profile the daemon does not have.
    #[error("Unknown profile '{}'. Profiles: {}.", echo(name), if known.is_empty() { "none configured".into() } else { listed(known) })]
    UnknownProfile {
        /// The name asked for.
        name: String,
        /// The daemon's profiles, by name.
        known: Vec<String>,
    },
    /// The request names a profile other than the one its auth token is bound to.
    #[error(
        "This auth token is bound to profile '{bound}'; it cannot use profile '{}'.",
        echo(named)
    )]
    ProfileNotAllowed {
        /// The profile the request named.
        named: String,
        /// The profile the token is bound to.
        bound: String,
    },
    /// A call with an auth token bound to a profile asks to change the registry: such a
    /// token is a consumer's, limited to what its profile sees, and a run-time domain is
    /// served to every consumer.
    #[error(
        "This auth token is bound to profile '{bound}'; it cannot change the registry ({method} needs the \
         daemon's --auth-token)."
    )]
    RegistryChangeNotAllowed {
        /// The profile the token is bound to.
        bound: String,
        /// The RPC asked for.
        method: &'static str,
    },
    /// A run-time domain's manifest (`UpsertDomain`) is invalid, alone or beside the rest of
    /// the registry; every problem is listed, each naming the domain.
    #[error("The domain is refused; nothing changed.\n{0}")]
    DomainRefused(ManifestErrors),
    /// `UpsertDomain`'s manifest is over its limit.
    #[error(
        "'manifest_json' is {len} bytes, over the limit of {limit} bytes ({factor} times max_message_bytes)."
    )]
    ManifestTooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        limit: usize,
        /// The limit as a multiple of `max_message_bytes`.
        factor: usize,
    },
    /// `UpsertDomain` names a domain of the manifests the daemon loads.
    #[error(
        "Domain '{}' comes from the manifests the daemon loads ({}), so it cannot be replaced at run time: \
         {}, or register the domain under another name.",
        echo(name),
        manifest,
        if *demo { "it is built in (serve your own manifests with --manifests)" } else { "change that manifest and reload" }
    )]
    DomainFromManifestsExists {
        /// The domain.
        name: String,
        /// The manifest that defines it.
        manifest: String,
        /// It is the built-in demo registry's: no file to change.
        demo: bool,
    },
    /// `DeleteDomain` names a domain of the manifests the daemon loads.
    #[error(
        "Domain '{}' comes from the manifests the daemon loads ({}), so it cannot be deleted at run time: {}.",
        echo(name),
        manifest,
        if *demo { "it is built in; serve your own manifests with --manifests" } else { "remove that manifest and reload" }
    )]
    DomainFromManifestsKept {
        /// The domain.
        name: String,
        /// The manifest that defines it.
        manifest: String,
        /// It is the built-in demo registry's: no file to remove.
        demo: bool,
    },
    /// `DeleteDomain` names no domain registered at run time.
    #[error(
        "Run-time domain '{}' not found. Domains registered at run time: {}",
        echo(name),
        if registered.is_empty() { "none".into() } else { listed(registered) }
    )]
    DomainNotFound {
        /// The name asked for.
        name: String,
        /// The domains registered at run time, by name.
        registered: Vec<String>,
    },
    /// A run-time domain change would stop serving other run-time domains: stored ones it
    /// lets back in clash with them (SPEC §10, §12: every daemon builds the same registry
    /// from the stored rows, in name order).
    #[error(
        "{} would stop serving {}: a stored domain it lets back in clashes with {}. Nothing changed; delete or fix the clashing domain first.",
        change,
        listed(lost),
        if lost.len() == 1 { "it" } else { "them" }
    )]
    ChangeLeavesOut {
        /// What was asked (`Upserting domain 'x'`, `Deleting domain 'x'`).
        change: String,
        /// The domains served now that would not be.
        lost: Vec<String>,
    },
    /// A dependency (the database, a daemon) cannot be used right now; retrying later may work.
    #[error("{0}")]
    Unavailable(String),
    /// Bad configuration (flags, environment, config file).
    #[error("{0}")]
    Config(String),
    /// A database fault.
    #[error("database error: {}", DatabaseText(.0))]
    Database(#[from] sqlx::Error),
    /// A migration could not be applied.
    #[error("database migration failed: {}", MigrateText(.0))]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The keyword automaton could not be built.
    #[error("keyword automaton: {0}")]
    Automaton(#[from] aho_corasick::BuildError),
    /// A request that is not a valid protobuf encoding of its message (including a string
    /// field that is not UTF-8).
    #[error("The request could not be decoded: {0}")]
    Decode(prost::DecodeError),
    /// Reading a manifest folder or another file failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being read.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A task the daemon started failed (a panic): a bug, logged with its cause.
    #[error("{0}")]
    Internal(String),
}

/// Whether [`echo`] escapes a character: a control character (Unicode Cc), a line or
/// paragraph separator (Zl, Zp), or an invisible format character that changes how a line
/// reads (zero-width ones, bidirectional overrides and isolates, the byte-order mark).
fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}')
}

/// The most characters of a caller's value an error message repeats (SPEC §5).
pub(crate) const MAX_ECHO_CHARS: usize = 128;

/// A caller's value as an error message may repeat it: cut to [`MAX_ECHO_CHARS`] characters
/// with `…` appended, so an error never grows with the input (some gRPC clients refuse
/// large status messages), and its control characters, line and paragraph separators and
/// invisible format characters escaped (`\n`, `\u{2028}`, `\u{202e}`), so a value cannot
/// break the message's line, pass for another line of output, or reorder how it displays.
pub(crate) fn echo(value: &str) -> std::borrow::Cow<'_, str> {
    let cut = value.char_indices().nth(MAX_ECHO_CHARS).map(|(at, _)| at);
    let kept = &value[..cut.unwrap_or(value.len())];
    if cut.is_none() && !kept.chars().any(escaped) {
        return kept.into();
    }
    let mut out = String::with_capacity(kept.len() + 3);
    for c in kept.chars() {
        if escaped(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    if cut.is_some() {
        out.push('…');
    }
    out.into()
}

impl Error {
    /// Whether retrying later may succeed: the database could not be used for a reason
    /// outside the daemon (locked, missing, corrupt, full, unreachable).
    fn is_unavailable(&self) -> bool {
        match self {
            Error::Unavailable(_) => true,
            Error::Database(e) => database_unavailable(e),
            _ => false,
        }
    }
}

/// The database faults a retry may get past: a busy or locked file, a file that cannot be
/// opened, read or written (missing, corrupt, not a database, disk full, read-only), a
/// server that cannot be reached, is shutting down or starting, cancelled a statement at the
/// busy timeout or is out of resources, or a pool that cannot hand out a connection. Anything
/// else (a constraint, a column that does not decode) is a fault of the daemon's own.
fn database_unavailable(e: &sqlx::Error) -> bool {
    if let sqlx::Error::Database(db) = e
        && let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
    {
        return postgres_unavailable(pg.code());
    }
    /// SQLite primary result codes (the low byte of an extended code).
    const BUSY: i32 = 5;
    const LOCKED: i32 = 6;
    const NOMEM: i32 = 7;
    const READONLY: i32 = 8;
    const IOERR: i32 = 10;
    const CORRUPT: i32 = 11;
    const FULL: i32 = 13;
    const CANTOPEN: i32 = 14;
    const PROTOCOL: i32 = 15;
    const NOTADB: i32 = 26;
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().and_then(|c| c.parse::<i32>().ok()).is_some_and(|code| {
            matches!(
                code & 0xff,
                BUSY | LOCKED | NOMEM | READONLY | IOERR | CORRUPT | FULL | CANTOPEN | PROTOCOL | NOTADB
            )
        }),
        _ => false,
    }
}

/// A database fault as the caller and the log read it: sqlx's text, except that a
/// PostgreSQL error leaves out the line of the server's own C source it was raised at ("at
/// line 3211"), which reads as a line of the statement.
struct DatabaseText<'a>(&'a sqlx::Error);

impl std::fmt::Display for DatabaseText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let sqlx::Error::Database(db) = self.0
            && let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        {
            return write!(f, "error returned from database: {}", pg.message());
        }
        self.0.fmt(f)
    }
}

/// A failed migration as the operator reads it: sqlx's text, except that a migration the
/// database holds and this build does not (a newer daemon wrote it) says so.
struct MigrateText<'a>(&'a sqlx::migrate::MigrateError);

impl std::fmt::Display for MigrateText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            sqlx::migrate::MigrateError::VersionMissing(v) => write!(
                f,
                "the database holds migration {v}, which this build does not have: a newer \
                 toolrouter wrote it (run that version, or this one on a database from before it)"
            ),
            e => e.fmt(f),
        }
    }
}

/// PostgreSQL SQLSTATE codes a retry may get past: connection exceptions (class 08),
/// insufficient resources (53), operator intervention (57: shutdown, starting up, a statement
/// cancelled at `statement_timeout`), system errors (58), a lock not available, a
/// serialization failure, a deadlock, or a write refused as read-only (25006: a hot standby
/// after a failover, or `default_transaction_read_only` set for maintenance).
fn postgres_unavailable(code: &str) -> bool {
    matches!(code.get(..2), Some("08" | "53" | "57" | "58"))
        || matches!(code, "55P03" | "40001" | "40P01" | "25006")
}

/// The most bytes a status message takes on the wire (`grpc-message`, percent-encoded).
/// Clients refuse response headers past a limit: gRPC's C core (Python's `grpcio`, Ruby,
/// PHP) past 8 KiB by default, with `RESOURCE_EXHAUSTED` instead of the answer; h2 past
/// 16 KiB, with a protocol error. With the rest of the trailers, 7 KiB stays under both.
const STATUS_MESSAGE_BYTES: usize = 7 * 1024;

/// The bytes `text` takes as a `grpc-message` header: tonic percent-encodes control
/// characters, every byte outside ASCII, and ` "#%<>`?{}`, each as three bytes.
fn on_the_wire(text: &str) -> usize {
    text.bytes()
        .map(|b| {
            if !(0x20..0x7f).contains(&b) || b" \"#%<>`?{}".contains(&b) {
                3
            } else {
                1
            }
        })
        .sum()
}

/// The most bytes on the wire a list in a status message takes: room for the rest of the
/// message (a caller's value echoed, 128 characters of up to 4 UTF-8 bytes, each encoded as
/// 3: 1,536 bytes, and the text around it).
const LIST_BYTES: usize = STATUS_MESSAGE_BYTES - 2048;

/// Names joined by `, `, as SPEC's messages list them, as many as fit in [`LIST_BYTES`] on
/// the wire, then `and N more`: a registry of a thousand domains still gets its answer to
/// the client, where the whole list would pass the header limits.
fn listed(names: &[String]) -> std::borrow::Cow<'_, str> {
    let total: usize = names.iter().map(|n| on_the_wire(n) + 4).sum();
    if total <= LIST_BYTES {
        return names.join(", ").into();
    }
    // Room for the "and N more" suffix.
    let budget = LIST_BYTES - 64;
    let mut out = String::new();
    let mut used = 0;
    for (i, name) in names.iter().enumerate() {
        used += on_the_wire(name) + 4;
        if used > budget {
            out.push_str(&format!("and {} more", names.len() - i));
            break;
        }
        out.push_str(name);
        out.push_str(", ");
    }
    out.into()
}

/// `head`, then one problem a line, as many as fit in [`STATUS_MESSAGE_BYTES`]; the rest
/// counted in a last line, and then every one of them logged, so none is lost.
fn problems_within(head: &str, errors: &ManifestErrors) -> String {
    // Room for the line counting the rest.
    let budget = STATUS_MESSAGE_BYTES - 120;
    let mut message = head.to_string();
    let mut used = on_the_wire(head);
    for (i, e) in errors.0.iter().enumerate() {
        let line = format!("\n{e}");
        used += on_the_wire(&line);
        if used > budget {
            let more = errors.0.len() - i;
            message.push_str(&format!(
                "\n... and {more} more problem{} (the daemon's log lists every one).",
                if more == 1 { "" } else { "s" }
            ));
            tracing::warn!(problems = %errors, "{head} The answer lists {i} of the {} problems.", errors.0.len());
            return message;
        }
        message.push_str(&line);
    }
    message
}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        use tonic::Status;
        match &err {
            Error::MissingParameter { .. }
            | Error::MissingWith { .. }
            | Error::MessageTooLong { .. }
            | Error::NameTooLong { .. }
            | Error::ControlCharacters { .. }
            | Error::UnknownEnumValue { .. }
            | Error::UnknownProfile { .. }
            | Error::ManifestTooLong { .. } => Status::invalid_argument(err.to_string()),
            Error::DomainRefused(errors) => {
                Status::invalid_argument(problems_within("The domain is refused; nothing changed.", errors))
            }
            Error::ProfileNotAllowed { .. } | Error::RegistryChangeNotAllowed { .. } => {
                Status::permission_denied(err.to_string())
            }
            // The caller sent bytes that are not its request message: its mistake, not ours.
            Error::Decode(_) => {
                // The call log's line says it failed and why; this is for debugging a client.
                tracing::debug!(error = %err, "request refused: not decodable");
                Status::invalid_argument(err.to_string())
            }
            Error::GroupNotFound { .. } | Error::DomainNotFound { .. } => Status::not_found(err.to_string()),
            Error::DomainFromManifestsExists { .. } => Status::already_exists(err.to_string()),
            Error::GroupNotConfigured { .. }
            | Error::GroupWithoutTools { .. }
            | Error::DomainFromManifestsKept { .. }
            | Error::ChangeLeavesOut { .. } => Status::failed_precondition(err.to_string()),
            Error::ManifestsRefused { version, errors } => Status::failed_precondition(problems_within(
                &format!("The manifests are invalid; still serving registry version {version:016x}."),
                errors,
            )),
            // The database cannot be used: the caller may retry, and learns why.
            _ if err.is_unavailable() => {
                tracing::warn!(error = %err, "request failed: database unavailable");
                Status::unavailable(err.to_string())
            }
            _ => {
                // A retry will not help, and the cause is for the operator's log, not for
                // the client.
                tracing::error!(error = %err, "internal error");
                Status::internal("internal error")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoed_values_are_cut_to_128_characters_with_an_ellipsis() {
        let cases: &[(String, String)] = &[
            (String::new(), String::new()),
            ("abc".into(), "abc".into()),
            ("x".repeat(128), "x".repeat(128)),
            ("x".repeat(129), format!("{}…", "x".repeat(128))),
            ("é".repeat(20_000), format!("{}…", "é".repeat(128))),
            // Control characters escaped: a value keeps to its line.
            ("a\nb\u{0}c\td".into(), "a\\nb\\0c\\td".into()),
            (format!("{}\n", "x".repeat(128)), format!("{}…", "x".repeat(128))),
            // Separators and invisible format characters likewise: no forged line, no
            // reordered display; other letters and emoji as they are.
            (
                "a\u{2028}b\u{2029}c\u{202e}d\u{200b}e\u{feff}f\u{85}g".into(),
                "a\\u{2028}b\\u{2029}c\\u{202e}d\\u{200b}e\\u{feff}f\\u{85}g".into(),
            ),
            ("名前 ключ 🎬".into(), "名前 ключ 🎬".into()),
        ];
        for (value, want) in cases {
            assert_eq!(echo(value), want.as_str(), "{} chars", value.chars().count());
        }
    }

    #[test]
    fn each_error_maps_to_its_status_code_with_the_contract_text() {
        use tonic::Code;
        let cases: Vec<(Error, Code, &str)> = vec![
            (
                Error::MissingParameter {
                    field: "conversation_id",
                },
                Code::InvalidArgument,
                "Required parameter 'conversation_id' is missing.",
            ),
            (
                Error::MissingWith {
                    field: "conversation_id",
                    with: "load",
                },
                Code::InvalidArgument,
                "Required parameter 'conversation_id' is missing (needed with 'load').",
            ),
            (
                Error::MessageTooLong {
                    field: "message",
                    len: 1001,
                    limit: 1000,
                },
                Code::InvalidArgument,
                "'message' is 1001 bytes, over the limit of 1000 bytes (max_message_bytes).",
            ),
            (
                Error::NameTooLong {
                    field: "group_name",
                    len: 300,
                    limit: 256,
                },
                Code::InvalidArgument,
                "'group_name' is 300 bytes, over the limit of 256 bytes.",
            ),
            (
                Error::ControlCharacters {
                    field: "conversation_id",
                },
                Code::InvalidArgument,
                "'conversation_id' must not contain control characters.",
            ),
            (
                Error::GroupNotFound {
                    group: "nope".into(),
                    available: vec!["a".into(), "b".into()],
                },
                Code::NotFound,
                "Tool group 'nope' not found. Available groups: a, b",
            ),
            (
                Error::GroupNotConfigured {
                    group: "media".into(),
                    keys: vec!["k1".into(), "k2".into()],
                },
                Code::FailedPrecondition,
                "Tool group 'media' is not configured: set one of k1, k2.",
            ),
            (
                Error::GroupWithoutTools {
                    group: "empty".into(),
                },
                Code::FailedPrecondition,
                "Tool group 'empty' has no available tools.",
            ),
            (
                Error::ManifestTooLong {
                    len: 2000,
                    limit: 1600,
                    factor: 16,
                },
                Code::InvalidArgument,
                "'manifest_json' is 2000 bytes, over the limit of 1600 bytes (16 times max_message_bytes).",
            ),
            (
                Error::DomainRefused(ManifestErrors(vec![ManifestError {
                    path: "upsert:mine".into(),
                    position: None,
                    message: "tool #1: missing required field `name`".into(),
                }])),
                Code::InvalidArgument,
                "The domain is refused; nothing changed.\nupsert:mine: tool #1: missing required field `name`",
            ),
            (
                Error::DomainFromManifestsExists {
                    name: "sonarr".into(),
                    manifest: "sonarr.json".into(),
                    demo: false,
                },
                Code::AlreadyExists,
                "Domain 'sonarr' comes from the manifests the daemon loads (sonarr.json), so it cannot be \
                 replaced at run time: change that manifest and reload, or register the domain under another name.",
            ),
            (
                Error::DomainFromManifestsKept {
                    name: "sonarr".into(),
                    manifest: "sonarr.json".into(),
                    demo: false,
                },
                Code::FailedPrecondition,
                "Domain 'sonarr' comes from the manifests the daemon loads (sonarr.json), so it cannot be \
                 deleted at run time: remove that manifest and reload.",
            ),
            (
                Error::DomainFromManifestsKept {
                    name: "sonarr".into(),
                    manifest: "sonarr.json".into(),
                    demo: true,
                },
                Code::FailedPrecondition,
                "Domain 'sonarr' comes from the manifests the daemon loads (sonarr.json), so it cannot be \
                 deleted at run time: it is built in; serve your own manifests with --manifests.",
            ),
            (
                Error::DomainFromManifestsExists {
                    name: "sonarr".into(),
                    manifest: "sonarr.json".into(),
                    demo: true,
                },
                Code::AlreadyExists,
                "Domain 'sonarr' comes from the manifests the daemon loads (sonarr.json), so it cannot be \
                 replaced at run time: it is built in (serve your own manifests with --manifests), or register \
                 the domain under another name.",
            ),
            (
                Error::DomainNotFound {
                    name: "nope".into(),
                    registered: vec!["a".into(), "b".into()],
                },
                Code::NotFound,
                "Run-time domain 'nope' not found. Domains registered at run time: a, b",
            ),
            (
                Error::RegistryChangeNotAllowed {
                    bound: "mcp-media".into(),
                    method: "UpsertDomain",
                },
                Code::PermissionDenied,
                "This auth token is bound to profile 'mcp-media'; it cannot change the registry \
                 (UpsertDomain needs the daemon's --auth-token).",
            ),
            (
                Error::DomainNotFound {
                    name: "nope".into(),
                    registered: vec![],
                },
                Code::NotFound,
                "Run-time domain 'nope' not found. Domains registered at run time: none",
            ),
            (
                Error::Unavailable("the database file /x cannot be opened: gone".into()),
                Code::Unavailable,
                "the database file /x cannot be opened: gone",
            ),
            (
                Error::Database(sqlx::Error::PoolTimedOut),
                Code::Unavailable,
                "database error: pool timed out while waiting for an open connection",
            ),
            // A fault of the daemon's own: a retry will not help, the cause stays in the log.
            (
                Error::Database(sqlx::Error::RowNotFound),
                Code::Internal,
                "internal error",
            ),
            (
                Error::Internal("a task panicked".into()),
                Code::Internal,
                "internal error",
            ),
        ];
        for (err, code, text) in cases {
            let shown = format!("{err:?}");
            let status = tonic::Status::from(err);
            assert_eq!((status.code(), status.message()), (code, text), "{shown}");
        }
    }

    #[test]
    fn postgres_faults_a_retry_may_get_past_are_unavailable_and_the_rest_internal() {
        // Connection lost, shutting down, starting up, statement_timeout, too many
        // connections, lock not available, serialization failure, read-only transaction.
        for code in [
            "08006", "57P01", "57P03", "57014", "53300", "55P03", "40001", "25006",
        ] {
            assert!(postgres_unavailable(code), "{code}");
        }
        // Unique violation, undefined table, bad input: the daemon's own faults.
        for code in ["23505", "42P01", "22P02", ""] {
            assert!(!postgres_unavailable(code), "{code}");
        }
    }

    #[tokio::test]
    async fn sqlite_faults_a_retry_may_get_past_are_unavailable_and_the_rest_internal() {
        use sqlx::Connection as _;
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        let mut holder = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::query("CREATE TABLE t (k TEXT PRIMARY KEY)")
            .execute(&mut holder)
            .await
            .unwrap();
        sqlx::query("INSERT INTO t VALUES ('a')")
            .execute(&mut holder)
            .await
            .unwrap();
        let duplicate = sqlx::query("INSERT INTO t VALUES ('a')")
            .execute(&mut holder)
            .await
            .unwrap_err();
        let no_table = sqlx::query("SELECT * FROM missing")
            .execute(&mut holder)
            .await
            .unwrap_err();
        sqlx::query("BEGIN IMMEDIATE").execute(&mut holder).await.unwrap();
        let opts = <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(&url)
            .unwrap()
            .busy_timeout(std::time::Duration::ZERO);
        let mut other = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
        let busy = sqlx::query("INSERT INTO t VALUES ('b')")
            .execute(&mut other)
            .await
            .unwrap_err();
        let cases = [
            (busy, tonic::Code::Unavailable),
            (duplicate, tonic::Code::Internal),
            (no_table, tonic::Code::Internal),
        ];
        for (err, code) in cases {
            let shown = err.to_string();
            assert_eq!(tonic::Status::from(Error::Database(err)).code(), code, "{shown}");
        }
    }

    #[test]
    fn a_long_list_in_a_status_is_cut_to_fit_the_header_and_counts_the_rest() {
        let names = |n: usize| (0..n).map(|i| format!("group name {i:04}")).collect::<Vec<_>>();
        let few = Error::GroupNotFound {
            group: "x".into(),
            available: names(2),
        };
        assert_eq!(
            few.to_string(),
            "Tool group 'x' not found. Available groups: group name 0000, group name 0001",
            "a list that fits is SPEC's, whole"
        );
        let n = 2000;
        // The longest echo on the wire: 128 characters of 4 UTF-8 bytes, each byte encoded.
        let long = "𝄞".repeat(200);
        for (err, head) in [
            (
                Error::GroupNotFound {
                    group: long.clone(),
                    available: names(n),
                },
                "Available groups: ",
            ),
            (
                Error::DomainNotFound {
                    name: long.clone(),
                    registered: names(n),
                },
                "Domains registered at run time: ",
            ),
            (
                Error::GroupNotConfigured {
                    group: long.clone(),
                    keys: names(n),
                },
                "set one of ",
            ),
            (
                Error::UnknownProfile {
                    name: long.clone(),
                    known: names(n),
                },
                "Profiles: ",
            ),
        ] {
            let status = tonic::Status::from(err);
            let mut headers = tonic::codegen::http::HeaderMap::new();
            status.add_header(&mut headers).unwrap();
            let sent = headers["grpc-message"].len();
            assert!(sent <= STATUS_MESSAGE_BYTES, "{head}: {sent} bytes");
            let text = status.message();
            let list = &text[text.find(head).unwrap() + head.len()..];
            let items: Vec<&str> = list.trim_end_matches('.').split(", ").collect();
            let (last, shown) = items.split_last().unwrap();
            assert!(shown.len() > 100, "{head}: {}", shown.len());
            for (i, item) in shown.iter().enumerate() {
                assert_eq!(*item, format!("group name {i:04}"), "{head}");
            }
            assert_eq!(*last, format!("and {} more", n - shown.len()), "{head}");
        }
    }

    #[test]
    fn a_refusal_with_many_problems_fits_in_a_status_header_and_counts_the_rest() {
        // Spaces, quotes, `#`, `?`, braces and letters outside ASCII: what tonic encodes.
        let problem = |i: usize| ManifestError {
            path: format!("/a/long/folder/with/many manifests/ünïcode-{i}?.json"),
            position: None,
            message: format!("tool #{i}: tier must be one of read, modify, destructive (got `{{\"nope\"}}`)"),
        };
        // Few: every one, as Display has them.
        let few = ManifestErrors((0..3).map(problem).collect());
        let status = tonic::Status::from(Error::DomainRefused(few.clone()));
        assert_eq!(status.message(), Error::DomainRefused(few).to_string());
        // Many: as many as fit, then the count of the rest.
        for n in [150, 2000] {
            let many = ManifestErrors((0..n).map(problem).collect());
            for err in [
                Error::DomainRefused(many.clone()),
                Error::ManifestsRefused {
                    version: 7,
                    errors: many.clone(),
                },
            ] {
                let head = err.to_string().lines().next().unwrap().to_string();
                let status = tonic::Status::from(err);
                let text = status.message();
                // Measured as tonic writes it, not as this module estimates it.
                let mut headers = tonic::codegen::http::HeaderMap::new();
                status.add_header(&mut headers).unwrap();
                let sent = headers["grpc-message"].len();
                assert!(sent <= STATUS_MESSAGE_BYTES, "{n}: {sent}");
                assert_eq!(on_the_wire(text), sent, "{n}: the estimate is what tonic sends");
                let lines: Vec<&str> = text.lines().collect();
                assert_eq!(lines[0], head);
                let listed = lines.len() - 2;
                assert!(listed > 10, "{n}: {listed}");
                for (i, line) in lines[1..=listed].iter().enumerate() {
                    assert_eq!(*line, problem(i).to_string());
                }
                assert_eq!(
                    *lines.last().unwrap(),
                    format!(
                        "... and {} more problems (the daemon's log lists every one).",
                        n - listed
                    )
                );
            }
        }
    }
}
