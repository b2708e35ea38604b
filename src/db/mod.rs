//! The database behind one interface: SQLite (the embedded default, [`sqlite`]) or PostgreSQL
//! for several replicas ([`postgres`]). Each backend module holds every SQL statement it runs,
//! one fn each, and its migrations (`migrations/sqlite/`, `migrations/postgres/`, embedded and
//! run on connect); this module picks the backend from the URL and dispatches.
//!
//! Each call first opens a [`Session`] (for SQLite that checks that the file is still there),
//! then runs its statements on it. Every failed operation counts in [`DATABASE_ERRORS`].

mod postgres;
mod reach;
mod sqlite;
pub(crate) use sqlite::log_paths;

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use sqlx::postgres::PgPool;
use sqlx::sqlite::SqlitePool;
use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::router::Member;

/// Failed database operations (settings reads, writes, a missing or replaced file, an
/// unreachable server), for the `toolrouter_database_errors_total` metric. Process-wide:
/// every daemon in a process shares the database layer's count.
pub(crate) static DATABASE_ERRORS: LazyLock<prometheus::IntCounter> = LazyLock::new(|| {
    // The name and help are static and valid, so this cannot fail.
    prometheus::IntCounter::new(
        "toolrouter_database_errors_total",
        "Database operations that failed (unreadable settings table, failed writes, missing file).",
    )
    .expect("a valid metric")
});

/// Counts a failed operation; the error goes on to the caller.
fn counted<T, E: Into<Error>>(result: std::result::Result<T, E>) -> Result<T> {
    result.map_err(|e| {
        DATABASE_ERRORS.inc();
        e.into()
    })
}

/// How long a statement waits (for another writer's lock, for the server, for a pooled
/// connection) before failing, by default.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `url` names a PostgreSQL database (`postgres://` or `postgresql://`); anything
/// else is taken for SQLite.
pub fn is_postgres(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    scheme.eq_ignore_ascii_case("postgres") || scheme.eq_ignore_ascii_case("postgresql")
}

/// Checks what a database URL names: a SQLite file (`sqlite://FILE`, `sqlite:FILE`) or a
/// PostgreSQL server. An in-memory SQLite database is refused: no settings UI can write it,
/// and it ends with the process.
///
/// # Errors
/// `Config` saying which URLs are taken.
pub fn check_url(url: &str) -> Result<()> {
    let sqlite = url.get(..7).is_some_and(|s| s.eq_ignore_ascii_case("sqlite:"));
    if !(sqlite || is_postgres(url)) {
        return Err(Error::Config(format!(
            "database URL {:?} is neither sqlite://FILE nor postgres://USER:PASSWORD@HOST/DB",
            redact_url(url)
        )));
    }
    if sqlite {
        match sqlite::file_of(url) {
            Ok(None) => {
                return Err(Error::Config(format!(
                    "database URL {url:?} is an in-memory database, which no settings UI can write and \
                     which ends with the daemon: name a file, sqlite://FILE"
                )));
            }
            Ok(Some(file)) if file.as_os_str().is_empty() => {
                return Err(Error::Config(format!(
                    "database URL {url:?} names no file: sqlite://FILE"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Refuses a SQLite URL that opens the file read-only (`mode=ro`, `immutable=1`): a daemon
/// on it would serve, and fail every load and run-time domain change.
///
/// # Errors
/// `Config` naming the parameter.
pub fn check_writable_url(url: &str) -> Result<()> {
    if is_postgres(url) {
        return Ok(());
    }
    let query = url.split_once('?').map_or("", |(_, q)| q);
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if (key == "mode" && value == "ro") || (key == "immutable" && matches!(value, "true" | "1")) {
            return Err(Error::Config(format!(
                "database URL {:?} opens the file read-only ({key}={value}), but the daemon stores \
                 conversations and run-time domains there: leave {key} out",
                redact_url(url)
            )));
        }
    }
    Ok(())
}

/// What a database holds for a daemon: its settings, and the domains registered at run time
/// (name, manifest).
#[derive(Debug, Clone, Default)]
pub struct Stored {
    /// The settings table's rows.
    pub settings: Vec<(String, String)>,
    /// The run-time domains' rows, by name (none when the table is not there).
    pub domains: Vec<(String, String)>,
}

/// How an error that names a database server it could not reach begins.
const CANNOT_CONNECT: &str = "cannot connect to the database server at";

/// The settings and run-time domains of the database at `url`, read without changing it (no
/// file created, no migration run): for measuring routing against a deployment (`eval`).
///
/// # Errors
/// `Config` when the database has no settings table; an unopenable file, an unreachable
/// server, or a database fault.
pub async fn read_stored_only(url: &str) -> Result<Stored> {
    let stored = counted(if is_postgres(url) {
        postgres::stored_only(url, BUSY_TIMEOUT).await
    } else {
        sqlite::stored_only(url).await
    })
    // Named, since the driver's words ("unable to open database file") do not say which
    // database (a server that cannot be reached is named already).
    .map_err(|e| match e {
        Error::Unavailable(named) if named.starts_with(CANNOT_CONNECT) => Error::Unavailable(named),
        e => Error::Unavailable(format!("cannot read the settings of {}: {e}", redact_url(url))),
    })?;
    stored.ok_or_else(|| Error::Config(format!("the database {} has no settings table", redact_url(url))))
}

/// The settings of the database at `url`, read without changing it (see
/// [`read_stored_only`]).
///
/// # Errors
/// As [`read_stored_only`].
pub async fn read_settings_only(url: &str) -> Result<Vec<(String, String)>> {
    read_stored_only(url).await.map(|s| s.settings)
}

/// The file a SQLite URL names, made absolute against the working directory (and with links
/// resolved when it exists), so two processes in different directories can compare it;
/// `None` for an in-memory database or a PostgreSQL URL.
///
/// # Errors
/// A URL that is neither SQLite nor PostgreSQL.
pub(crate) fn database_file(url: &str) -> Result<Option<PathBuf>> {
    if is_postgres(url) {
        return Ok(None);
    }
    Ok(sqlite::file_of(url)?.map(|f| absolute(&f)))
}

/// `path` made absolute, links resolved where it exists.
pub(crate) fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// Query parameters that carry credentials in a database URL.
const CREDENTIAL_PARAMS: [&str; 3] = ["user", "password", "sslpassword"];

/// The URL without credentials, for logs, `--print-config` and `DescribeServer`: no user
/// name or password before the host, and no `user`, `password` (or `sslpassword`) query
/// parameter.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // A server URL's credentials end at its last `@`, wherever that is: a password may hold
    // an unencoded `/` or `?` (such a URL does not parse, but is still printed when it fails).
    let rest = if is_postgres(url) {
        rest.rsplit_once('@').map_or(rest, |(_, after)| after)
    } else {
        rest
    };
    let (rest, query) = rest.split_once('?').map_or((rest, None), |(r, q)| (r, Some(q)));
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let mut out = format!("{scheme}://{host}{path}");
    if let Some(query) = query {
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                let name = pair.split_once('=').map_or(*pair, |(n, _)| n);
                !CREDENTIAL_PARAMS.iter().any(|s| s.eq_ignore_ascii_case(name))
            })
            .collect();
        if !kept.is_empty() {
            out.push('?');
            out.push_str(&kept.join("&"));
        }
    }
    out
}

/// Which PostgreSQL database a URL names, to compare two URLs: the server and the database,
/// without credentials or connection parameters (`sslmode`, `application_name`), the scheme
/// as `postgres`, the port 5432 when not given.
pub(crate) fn postgres_database(url: &str) -> String {
    let redacted = redact_url(url);
    let rest = redacted.split_once("://").map_or(redacted.as_str(), |(_, r)| r);
    let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
    let (host, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    // A port follows the host's last `:`, outside an IPv6 address's brackets.
    let port = if host.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']')) {
        ""
    } else {
        ":5432"
    };
    format!("postgres://{}{port}{path}", host.to_ascii_lowercase())
}

/// A conversation as the database holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredConversation {
    /// Unix ms of the latest use recorded.
    pub last_seen: i64,
    /// Its version: every write of its domains changes it (PostgreSQL); always 0 on SQLite,
    /// where one daemon owns the file's conversations.
    pub version: i64,
    /// The groups loaded and the domains hit, in join order.
    pub members: Vec<Member>,
}

/// A conversation row's version and latest recorded use: enough to tell whether a cached
/// copy is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub version: i64,
    pub last_seen: i64,
}

/// Conversation clocks written by one transaction of the idle-clock flush (SQLite holds its
/// write lock meanwhile; PostgreSQL the batch's row locks).
pub(crate) const TOUCH_BATCH: usize = 500;

/// What a write of a conversation's domains did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Saved {
    /// Written: the version it made (PostgreSQL; `None` on SQLite, which keeps none).
    Done(Option<i64>),
    /// Nothing written: the conversation is no longer at the version the writer expected
    /// (another daemon changed or forgot it since the writer's copy was read).
    Stale,
}

/// What other daemons and programs announce (PostgreSQL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Topic {
    /// The settings table (written by anyone, or `InvalidateSettings` on another daemon).
    Settings,
    /// The domains registered at run time (`UpsertDomain`, `DeleteDomain` on another daemon).
    Domains,
}

/// What a listening connection reports (PostgreSQL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice {
    /// The topic changed (the settings table, or the run-time domains), or a daemon asked
    /// every other to re-read it.
    Changed,
    /// The listening connection was (re)established: notifications sent while it was down
    /// are lost, so the settings should be read once.
    Resumed,
}

/// How soon a re-read a notice asked for is tried again when it failed: what the notice
/// covers is still unread, and no other notice may come (one sent while the listening
/// connection was down is lost; a listener that just came back finds the server still
/// marked unreachable, or a pooled connection dead since the restart).
pub(crate) const NOTICE_RETRY: Duration = Duration::from_secs(1);

/// Waits for the next notice and takes those queued behind it, which one re-read covers:
/// `Resumed` if any of them was, else `Changed`; `None` once the listener is gone.
pub(crate) async fn next_notices(notices: &mut mpsc::Receiver<Notice>) -> Option<Notice> {
    let mut notice = notices.recv().await?;
    while let Ok(next) = notices.try_recv() {
        if next == Notice::Resumed {
            notice = next;
        }
    }
    Some(notice)
}

/// The shared database. Cloning is shallow.
#[derive(Debug, Clone)]
pub struct Db {
    backend: Backend,
    /// Every PostgreSQL call is cut after this, client side (see [`bounded`]).
    bound: Duration,
    /// Whether the PostgreSQL server answers, as the last calls found.
    reach: Arc<reach::Reach>,
}

#[derive(Debug, Clone)]
enum Backend {
    Sqlite(sqlite::Store),
    Postgres(postgres::Store),
}

impl Db {
    /// Opens the database at `url` (a SQLite file is created if missing) and applies the
    /// embedded migrations of its backend.
    ///
    /// # Errors
    /// A bad URL, an unopenable file, an unreachable server, or a failed migration.
    pub async fn connect(url: &str) -> Result<Db> {
        Db::connect_with(url, BUSY_TIMEOUT).await
    }

    /// [`Db::connect`] with a given busy timeout: how long a statement or the wait for a
    /// pooled connection may take.
    ///
    /// # Errors
    /// A bad URL, an unopenable file, an unreachable server, or a failed migration.
    pub(crate) async fn connect_with(url: &str, busy_timeout: Duration) -> Result<Db> {
        let backend = if is_postgres(url) {
            Backend::Postgres(postgres::Store::connect(url, busy_timeout).await?)
        } else {
            Backend::Sqlite(sqlite::Store::connect(url, busy_timeout).await?)
        };
        Ok(Db {
            backend,
            bound: busy_timeout.saturating_mul(2),
            reach: Arc::default(),
        })
    }

    /// Cuts each PostgreSQL call at half of `request_timeout` when that is sooner than twice
    /// the busy timeout, so a call that waits for a server that does not answer still ends
    /// (and the outage is noted, see [`reach`]) in time for `Route` to answer from memory
    /// and for the rest to say `UNAVAILABLE`, rather than in the request timeout.
    #[must_use]
    pub(crate) fn within_requests_of(mut self, request_timeout: Duration) -> Db {
        self.bound = self.bound.min(request_timeout / 2);
        self
    }

    /// The database file as opened (as the URL names it); `None` for an in-memory database
    /// or a server.
    pub fn path(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Sqlite(s) => s.path(),
            Backend::Postgres(_) => None,
        }
    }

    /// Whether other daemons may change the conversations this one caches (PostgreSQL), so a
    /// cached conversation is checked against the database before use.
    pub(crate) fn shared(&self) -> bool {
        matches!(self.backend, Backend::Postgres(_))
    }

    /// Claims the SQLite file for this daemon while the database is open, and each file that
    /// replaces it at the path before that one is used (see `sqlite::claim`); nothing for
    /// PostgreSQL, where several daemons share a database.
    ///
    /// # Errors
    /// `Unavailable`: another daemon serves the file, or it cannot be written.
    pub(crate) fn claim(&self) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(s) => s.claim(),
            Backend::Postgres(_) => Ok(()),
        }
    }

    /// Bumped each time the SQLite file was found replaced and reopened.
    pub(crate) fn generation(&self) -> u64 {
        match &self.backend {
            Backend::Sqlite(s) => s.generation(),
            Backend::Postgres(_) => 0,
        }
    }

    /// A session for one call's statements; for SQLite, over the file the path names now,
    /// reopened if it was replaced.
    ///
    /// # Errors
    /// `Unavailable` when the SQLite file is missing or cannot be reopened, or while the
    /// PostgreSQL server is unreachable (see [`reach`]).
    pub(crate) async fn session(&self) -> Result<Session> {
        let admitted = Instant::now();
        let pool = match &self.backend {
            Backend::Sqlite(s) => Pool::Sqlite(counted(s.pool().await)?),
            Backend::Postgres(s) => {
                counted(self.reach.admit(admitted))?;
                Pool::Postgres(s.pool.clone())
            }
        };
        Ok(Session {
            pool,
            bound: self.bound,
            reach: self.reach.clone(),
            admitted,
        })
    }

    /// Checks that the SQLite file is still there, reopening it if it was replaced (nothing
    /// to check for a server: its calls fail on their own).
    ///
    /// # Errors
    /// `Unavailable` when the file is missing or cannot be reopened.
    pub async fn check(&self) -> Result<()> {
        self.session().await.map(drop)
    }

    /// Every settings row (one call: checks the file, then reads).
    ///
    /// # Errors
    /// `Unavailable` for a missing file or an unreachable server, or a database fault.
    pub async fn read_settings(&self) -> Result<Vec<(String, String)>> {
        self.session().await?.read_settings().await
    }

    /// Sets one setting, as a settings UI does (one call: checks the file, then writes).
    ///
    /// # Errors
    /// `Unavailable` for a missing file or an unreachable server, or a database fault.
    pub async fn set_setting(&self, key: &str, value: &str) -> Result<()> {
        self.session().await?.set_setting(key, value).await
    }

    /// Removes one setting; true when it existed.
    ///
    /// # Errors
    /// `Unavailable` for a missing file or an unreachable server, or a database fault.
    pub async fn unset_setting(&self, key: &str) -> Result<bool> {
        self.session().await?.unset_setting(key).await
    }

    /// A conversation as stored, if it exists (one call: checks the file, then reads).
    ///
    /// # Errors
    /// `Unavailable` for a missing file or an unreachable server, or a database fault.
    pub async fn load_conversation(&self, id: &str) -> Result<Option<StoredConversation>> {
        self.session().await?.load_conversation(id).await
    }

    /// Every domain registered at run time, as (name, manifest), by name (one call: checks
    /// the file, then reads).
    ///
    /// # Errors
    /// `Unavailable` for a missing file or an unreachable server, or a database fault.
    pub async fn read_domains(&self) -> Result<Vec<(String, String)>> {
        self.session().await?.read_domains().await
    }

    /// Stores a run-time domain's manifest, replacing the one of the same name; true when
    /// there was none (one call: checks the file, then writes).
    ///
    /// # Errors
    /// `Unavailable` for a missing file or an unreachable server, or a database fault.
    pub async fn upsert_domain(&self, name: &str, manifest: &str, now_ms: i64) -> Result<bool> {
        self.upsert_domain_if(name, manifest, now_ms, |_| Ok(())).await
    }

    /// [`Db::upsert_domain`] when `fits` accepts the change to the stored run-time domains
    /// (every row, name and manifest, by name), read as the write lands (on PostgreSQL under
    /// a lock every daemon's run-time domain change takes); `fits`'s refusal otherwise,
    /// nothing written.
    ///
    /// # Errors
    /// As [`Db::upsert_domain`], or what `fits` returns.
    pub async fn upsert_domain_if(
        &self,
        name: &str,
        manifest: &str,
        now_ms: i64,
        fits: impl FnOnce(Vec<(String, String)>) -> Result<()> + Send,
    ) -> Result<bool> {
        self.session()
            .await?
            .upsert_domain(name, manifest, now_ms, fits)
            .await
    }

    /// Removes a run-time domain; true when it existed (one call: checks the file, then
    /// writes).
    ///
    /// # Errors
    /// `Unavailable` for a missing file or an unreachable server, or a database fault.
    pub async fn delete_domain(&self, name: &str) -> Result<bool> {
        self.delete_domain_if(name, |_| Ok(())).await
    }

    /// [`Db::delete_domain`] when `fits` accepts the change, as [`Db::upsert_domain_if`].
    ///
    /// # Errors
    /// As [`Db::delete_domain`], or what `fits` returns.
    pub async fn delete_domain_if(
        &self,
        name: &str,
        fits: impl FnOnce(Vec<(String, String)>) -> Result<()> + Send,
    ) -> Result<bool> {
        self.session().await?.delete_domain(name, fits).await
    }

    /// Tells every other daemon on this database to re-read the settings (PostgreSQL; a
    /// SQLite file has one daemon).
    ///
    /// # Errors
    /// `Unavailable` for an unreachable server, or a database fault.
    pub(crate) async fn announce_settings(&self) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(()),
            Backend::Postgres(s) => counted(
                bounded(
                    self.bound,
                    &self.reach,
                    None,
                    postgres::announce_settings(&s.pool, &s.origin),
                )
                .await,
            ),
        }
    }

    /// Starts listening for changes of `topic` made by others (PostgreSQL); `None` for
    /// SQLite, one daemon per file, whose settings changes show through the settings TTL.
    /// Listening stops when the receiver is dropped or the database closed.
    pub(crate) fn notices(&self, topic: Topic) -> Option<mpsc::Receiver<Notice>> {
        // A daemon hears its own domain changes too: one whose write it cut (past its bound)
        // may still have committed, and only the notice says so; when it did not, the
        // re-read finds the registry served and changes nothing. Its own settings notices
        // follow a re-read it made itself.
        let (channel, own) = match topic {
            Topic::Settings => (postgres::SETTINGS_CHANNEL, false),
            Topic::Domains => (postgres::DOMAINS_CHANNEL, true),
        };
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(s) => Some(postgres::listen(s, channel, own)),
        }
    }

    /// Closes every connection (after the server stopped).
    pub async fn close(&self) {
        match &self.backend {
            Backend::Sqlite(s) => s.close().await,
            Backend::Postgres(s) => s.close().await,
        }
    }
}

/// A PostgreSQL operation cut after `bound`: its wait for a connection and its statements are
/// bounded by the server too, but a server that stopped answering without closing the
/// connection would hold the call forever. What it found is noted in `reach`. Not run at all
/// when a call found the server unreachable since the session was `admitted` (see
/// [`reach::Reach::proceed`]).
async fn bounded<T>(
    bound: Duration,
    reach: &reach::Reach,
    admitted: Option<Instant>,
    op: impl Future<Output = sqlx::Result<T>>,
) -> Result<T> {
    if let Some(admitted) = admitted {
        reach.proceed(admitted)?;
    }
    let result = match tokio::time::timeout(bound, op).await {
        Ok(result) => result.map_err(Error::from),
        Err(_) => Err(Error::Unavailable(format!(
            "the database did not answer within {} (twice the busy timeout, or half the request timeout)",
            humantime::format_duration(bound)
        ))),
    };
    reach.record(&result, Instant::now());
    result
}

/// The pool one session runs on.
#[derive(Debug, Clone)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// The statements of one call, on the database [`Db::session`] checked. Cloning is shallow.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pool: Pool,
    bound: Duration,
    reach: Arc<reach::Reach>,
    /// When [`Db::session`] let the call use the server.
    admitted: Instant,
}

/// Runs one statement fn of the session's backend, bounded (PostgreSQL) and counted.
macro_rules! dispatch {
    ($session:expr, $statement:ident($($arg:expr),*)) => {{
        let session = $session;
        counted(match &session.pool {
            Pool::Sqlite(pool) => sqlite::$statement(pool, $($arg),*).await.map_err(Error::from),
            Pool::Postgres(pool) => bounded(session.bound, &session.reach, Some(session.admitted), postgres::$statement(pool, $($arg),*)).await,
        })
    }};
}

impl Session {
    /// Every settings row.
    #[tracing::instrument(skip(self))]
    pub async fn read_settings(&self) -> Result<Vec<(String, String)>> {
        dispatch!(self, read_settings())
    }

    /// Sets one setting (what a settings UI does).
    #[tracing::instrument(skip(self, value))]
    pub async fn set_setting(&self, key: &str, value: &str) -> Result<()> {
        dispatch!(self, set_setting(key, value))
    }

    /// Removes one setting; true when it existed.
    #[tracing::instrument(skip(self))]
    pub async fn unset_setting(&self, key: &str) -> Result<bool> {
        dispatch!(self, unset_setting(key))
    }

    /// A conversation's last use, version and members in join order, if it exists.
    #[tracing::instrument(skip(self, id))]
    pub async fn load_conversation(&self, id: &str) -> Result<Option<StoredConversation>> {
        dispatch!(self, load_conversation(id))
    }

    /// A conversation's version and latest recorded use, if it exists: one small read.
    #[tracing::instrument(skip(self, id))]
    pub(crate) async fn conversation_stamp(&self, id: &str) -> Result<Option<Stamp>> {
        dispatch!(self, conversation_stamp(id))
    }

    /// Writes the members that joined or changed (each at its position in join order) and
    /// the last-seen time, in one transaction, on top of the conversation as the writer read
    /// it: at version `expected`, or with no row when `None`. On PostgreSQL, where other
    /// daemons write too, a conversation no longer at that version is left as it is
    /// ([`Saved::Stale`]); on SQLite one daemon owns the file and its calls on one
    /// conversation take turns, so `expected` always holds.
    #[tracing::instrument(skip(self, id, members))]
    pub(crate) async fn save_members(
        &self,
        id: &str,
        now_ms: i64,
        members: &[(usize, Member)],
        expected: Option<i64>,
    ) -> Result<Saved> {
        counted(match &self.pool {
            Pool::Sqlite(pool) => sqlite::save_members(pool, id, now_ms, members)
                .await
                .map(|()| Saved::Done(None))
                .map_err(Error::from),
            Pool::Postgres(pool) => {
                bounded(
                    self.bound,
                    &self.reach,
                    Some(self.admitted),
                    postgres::save_members(pool, id, now_ms, members, expected),
                )
                .await
            }
        })
    }

    /// Moves conversations' last-seen times forward (the lazy idle-clock flush; a time never
    /// moves back, and an id given twice counts its latest time), [`TOUCH_BATCH`] at a time,
    /// one transaction each (on PostgreSQL: its rows locked in id order, then one update).
    #[tracing::instrument(skip_all, fields(conversations = clocks.len()))]
    pub(crate) async fn touch_conversations(&self, clocks: &[(&str, i64)]) -> Result<()> {
        for batch in clocks.chunks(TOUCH_BATCH) {
            dispatch!(self, touch_conversations(batch))?;
        }
        Ok(())
    }

    /// Forgets one conversation.
    #[tracing::instrument(skip(self, id))]
    pub(crate) async fn delete_conversation(&self, id: &str) -> Result<()> {
        dispatch!(self, delete_conversation(id))
    }

    /// Forgets one conversation if no use since `cutoff_ms` is recorded; true when it did (a
    /// use recorded meanwhile, by another daemon, keeps it).
    #[tracing::instrument(skip(self, id))]
    pub(crate) async fn forget_idle_conversation(&self, id: &str, cutoff_ms: i64) -> Result<bool> {
        dispatch!(self, forget_idle_conversation(id, cutoff_ms))
    }

    /// Forgets every conversation idle since before `cutoff_ms`; returns how many.
    #[tracing::instrument(skip(self))]
    pub(crate) async fn delete_idle_conversations(&self, cutoff_ms: i64) -> Result<u64> {
        dispatch!(self, delete_idle_conversations(cutoff_ms))
    }

    /// Every run-time domain's manifest, by name.
    #[tracing::instrument(skip(self))]
    pub async fn read_domains(&self) -> Result<Vec<(String, String)>> {
        dispatch!(self, read_domains())
    }

    /// Stores a run-time domain's manifest when `fits` accepts the change to the stored ones;
    /// true when the name was new.
    #[tracing::instrument(skip(self, manifest, fits))]
    pub async fn upsert_domain(
        &self,
        name: &str,
        manifest: &str,
        now_ms: i64,
        fits: impl FnOnce(Vec<(String, String)>) -> Result<()> + Send,
    ) -> Result<bool> {
        dispatch!(self, upsert_domain(name, manifest, now_ms, fits))?
    }

    /// Removes a run-time domain when `fits` accepts the change; true when it existed.
    #[tracing::instrument(skip(self, fits))]
    pub async fn delete_domain(
        &self,
        name: &str,
        fits: impl FnOnce(Vec<(String, String)>) -> Result<()> + Send,
    ) -> Result<bool> {
        dispatch!(self, delete_domain(name, fits))?
    }
}

/// What the tests of this crate and its integration tests share to reach a PostgreSQL server:
/// `TOOLROUTER_TEST_POSTGRES_URL` (`.ci/postgres.sh` starts a throwaway server and sets it),
/// and a fresh database per test so tests stay independent and run in parallel.
#[doc(hidden)]
pub mod testing {
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The variable naming the test server (an admin URL: tests create databases with it).
    pub const POSTGRES_URL_VAR: &str = "TOOLROUTER_TEST_POSTGRES_URL";

    /// The test server's URL; `None` when the variable is unset, so the PostgreSQL tests
    /// skip.
    ///
    /// # Panics
    /// Under CI (`CI=true`) when the variable is unset: CI must run the PostgreSQL tests.
    pub fn postgres_url() -> Option<String> {
        let url = std::env::var(POSTGRES_URL_VAR).ok().filter(|u| !u.is_empty());
        if url.is_none() && std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
            panic!("{POSTGRES_URL_VAR} is not set under CI: run the tests as `.ci/postgres.sh cargo test`");
        }
        url
    }

    /// Another variable `.ci/postgres.sh` sets about its cluster (`TOOLROUTER_TEST_POSTGRES_CTL`,
    /// `…_CA`); `None` when it is unset or empty, so the tests that need it skip.
    ///
    /// # Panics
    /// Under CI (`CI` set) when it is unset: CI must run those tests.
    pub fn cluster_var(name: &str) -> Option<String> {
        let value = std::env::var(name).ok().filter(|v| !v.is_empty());
        assert!(
            value.is_some() || std::env::var("CI").is_err(),
            "{name} is not set under CI: run the tests as `.ci/postgres.sh cargo test`"
        );
        value
    }

    /// `url` with its database replaced by `name`.
    pub fn with_database(url: &str, name: &str) -> String {
        let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
        let (scheme, rest) = base.split_once("://").unwrap_or(("postgres", base));
        let authority = rest.split_once('/').map_or(rest, |(a, _)| a);
        let mut out = format!("{scheme}://{authority}/{name}");
        if let Some(q) = query {
            out.push('?');
            out.push_str(q);
        }
        out
    }

    /// A new empty database on the test server, by URL.
    ///
    /// # Panics
    /// When the server refuses (a test cannot go on without its database).
    pub async fn fresh_postgres_database(admin_url: &str) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() % 1_000_000_000);
        let name = format!(
            "toolrouter_test_{}_{stamp}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        super::postgres::create_database(admin_url, &name)
            .await
            .unwrap_or_else(|e| panic!("cannot create the test database {name}: {e}"));
        with_database(admin_url, &name)
    }
}

#[cfg(test)]
mod tests;
