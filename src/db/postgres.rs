//! PostgreSQL: several daemons (replicas) share one database. Every PostgreSQL statement,
//! one fn each, and the listening connection that hears about settings changes.
//!
//! **Timeouts.** The busy timeout bounds waiting for a pooled connection (`acquire_timeout`,
//! which covers connecting) and each statement (`statement_timeout`, on the server); the
//! caller also cuts a whole call at twice that on the client side (see `db::bounded`), so an
//! unreachable server ends a call, it never hangs it.
//!
//! **Notifications.** A trigger on `settings` (migration 0001) sends a notification on
//! [`SETTINGS_CHANNEL`] for every change, and `InvalidateSettings` sends one too; a trigger
//! on `domains` (migration 0003) sends one on [`DOMAINS_CHANNEL`]; each carries the writer's
//! application name as payload. Each daemon connects under an application name of its own
//! (its origin) and ignores what it sent itself. [`listen`] keeps one connection listening to
//! one channel, reconnecting with backoff, and reports a resumed connection, since whatever
//! was sent while it was down is lost.
//!
//! **Versions.** Every write of a conversation's domains takes a new version from one
//! sequence, so a daemon can tell that its cached copy is current ([`conversation_stamp`]),
//! and a write happens only on top of the version its writer read ([`save_members`]): two
//! daemons' calls on one conversation take effect one after the other, each on the other's
//! result.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::mpsc;

use super::{Notice, Saved, Stamp, StoredConversation};
use crate::error::{Error, Result};
use crate::router::Member;

/// The channel settings changes are announced on (the migration's trigger names it too).
pub(super) const SETTINGS_CHANNEL: &str = "toolrouter_settings";

/// The channel run-time domain changes are announced on (migration 0003's trigger).
pub(super) const DOMAINS_CHANNEL: &str = "toolrouter_domains";

/// Connections one daemon keeps to the server at most (plus the listening one).
const MAX_CONNECTIONS: u32 = 16;

/// A pooled connection idle longer than this is pinged before use: one that served a call a
/// moment ago is trusted, so a busy daemon pays no extra round trip per call.
const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

/// The listening connection's first retry after a failure, doubling up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long a listening connection may be silent, in busy timeouts, before it is asked to
/// answer a statement (within one busy timeout). A flow a network forgot without a reset (a
/// NAT or a firewall timing it out, a failover) reports no error: the wait would last
/// forever, and changes would reach this daemon only through the settings TTL (run-time
/// domains not at all). Between 1 s and 60 s: 30 s with the default busy timeout.
const QUIET_CHECK_BUSY_TIMEOUTS: u32 = 6;

/// Listening connections: one per channel, and room for connections found dead while the
/// statement that unlistens on each (sent as it is dropped) waits for the network to give up
/// on it (about 15 minutes with Linux's default retries): an idle one costs a socket, and
/// a network that forgets flows again and again must not leave no room to listen.
const LISTEN_CONNECTIONS: u32 = 16;

/// The connection parameters sqlx takes from a URL's query (its `PgConnectOptions` parser).
const KNOWN_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// The options a database URL gives. A query parameter sqlx does not take (libpq's
/// `sslpassword`, say) is left out with a warning naming it but not its value: sqlx's own
/// warning printed the value, which may be a secret (SPEC §12: credentials in the URL are
/// never printed).
pub(super) fn connect_options(url: &str) -> Result<PgConnectOptions> {
    let mut parsed =
        url::Url::parse(url).map_err(|e| Error::Config(format!("the database URL is invalid: {e}")))?;
    type Pairs = Vec<(String, String)>;
    let (known, unknown): (Pairs, Pairs) = parsed
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .partition(|(k, _)| KNOWN_PARAMETERS.contains(&k.as_str()));
    if unknown.is_empty() {
        return Ok(PgConnectOptions::from_str(url)?);
    }
    for (key, _) in &unknown {
        tracing::warn!(%key, "ignoring a database URL parameter this daemon does not take");
    }
    if known.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(known);
    }
    Ok(PgConnectOptions::from_str(parsed.as_str())?)
}

/// A PostgreSQL database. Cloning is shallow.
#[derive(Debug, Clone)]
pub(super) struct Store {
    pub(super) pool: PgPool,
    /// Connections of their own for LISTEN (one per channel), so the pool's connections
    /// stay for calls.
    listen_pool: PgPool,
    /// This daemon's mark on the notifications it sends: its connections' application name.
    pub(super) origin: std::sync::Arc<str>,
    busy_timeout: Duration,
}

impl Store {
    /// Connects to the database at `url` and applies the migrations (under PostgreSQL's
    /// advisory lock, so replicas starting together migrate once).
    pub(super) async fn connect(url: &str, busy_timeout: Duration) -> Result<Store> {
        let statement_ms = busy_timeout.as_millis().max(1).to_string();
        let origin: std::sync::Arc<str> = format!("toolrouter-{:016x}", rand_u64()).into();
        let options = connect_options(url)?
            .application_name(&origin)
            // Waiting for another writer's lock is bounded like a statement.
            .options([
                ("statement_timeout", statement_ms.as_str()),
                ("lock_timeout", statement_ms.as_str()),
                // A transaction whose client went silent (a network that forgot the flow)
                // ends on the server too, and lets go of its locks: an upsert's holds the
                // one every daemon's upsert waits for.
                ("idle_in_transaction_session_timeout", statement_ms.as_str()),
            ]);
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(busy_timeout)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > PING_IDLE_AFTER {
                        use sqlx::Connection as _;
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            });
        let pool = open(pool, &options, url, busy_timeout).await?;
        sqlx::migrate!("migrations/postgres").run(&pool).await?;
        let listen_pool = PgPoolOptions::new()
            .max_connections(LISTEN_CONNECTIONS)
            .acquire_timeout(busy_timeout)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_lazy_with(options);
        Ok(Store {
            pool,
            listen_pool,
            origin,
            busy_timeout,
        })
    }

    /// Closes every connection, the listening one too (its task then ends). A listening
    /// connection the network forgot is not waited for past the busy timeout: it holds
    /// nothing to write, and the statement that unlistens on it as it is dropped would wait
    /// for the network to give up on it.
    pub(super) async fn close(&self) {
        let _ = tokio::time::timeout(self.busy_timeout, self.listen_pool.close()).await;
        self.pool.close().await;
    }
}

/// A number unlikely to repeat across the daemons of one database: the clock and the process.
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Starts listening on `channel`: the receiver gets [`Notice::Changed`] for each
/// notification another sender sent (this daemon's own too when `own`), and
/// [`Notice::Resumed`] each time the listening
/// connection is (re)established, the first time included. The task ends when the receiver
/// is dropped or the store is closed.
pub(super) fn listen(store: &Store, channel: &'static str, own: bool) -> mpsc::Receiver<Notice> {
    // A full channel already holds a re-read to come, which covers any notice dropped.
    let (tx, rx) = mpsc::channel(4);
    let pool = store.listen_pool.clone();
    let origin = (!own).then(|| store.origin.clone());
    let busy = store.busy_timeout;
    tokio::spawn(async move {
        tokio::select! {
            () = tx.closed() => {}
            () = run_listener(&pool, channel, origin.as_deref(), busy, &tx) => {}
        }
    });
    rx
}

/// Listens on `channel`, leaving out notifications whose payload is `ignored` (this daemon's
/// own).
async fn run_listener(
    pool: &PgPool,
    channel: &str,
    ignored: Option<&str>,
    busy: Duration,
    tx: &mpsc::Sender<Notice>,
) {
    let quiet = busy
        .saturating_mul(QUIET_CHECK_BUSY_TIMEOUTS)
        .clamp(Duration::from_secs(1), Duration::from_secs(60));
    let mut backoff = MIN_BACKOFF;
    let mut failing = false;
    while !pool.is_closed() {
        let error = match subscribe(pool, channel).await {
            Ok(mut listener) => {
                if failing {
                    tracing::info!(
                        channel,
                        "listening for notifications again; re-reading what they cover"
                    );
                    failing = false;
                }
                backoff = MIN_BACKOFF;
                let _ = tx.try_send(Notice::Resumed);
                loop {
                    // Waiting for a message can be cut: sqlx reads a message whole or not
                    // at all.
                    let Ok(received) = tokio::time::timeout(quiet, listener.try_recv()).await else {
                        if let Err(e) = still_answers(&mut listener, busy).await {
                            break e;
                        }
                        continue;
                    };
                    match received {
                        Ok(Some(n)) if Some(n.payload()) == ignored => {}
                        Ok(Some(_)) => {
                            let _ = tx.try_send(Notice::Changed);
                        }
                        // The connection dropped and PgListener made a new one at once:
                        // whatever was sent in between is lost.
                        Ok(None) => {
                            let _ = tx.try_send(Notice::Resumed);
                        }
                        Err(e) => break e,
                    }
                }
            }
            Err(e) => e,
        };
        if pool.is_closed() {
            break;
        }
        if !failing {
            tracing::warn!(
                error = %error,
                channel,
                "lost the connection that listens for notifications; retrying (the settings TTL applies meanwhile)"
            );
            failing = true;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Whether a listening connection that has been quiet still answers a statement within
/// `busy` (see [`QUIET_CHECK_BUSY_TIMEOUTS`]).
async fn still_answers(listener: &mut PgListener, busy: Duration) -> sqlx::Result<()> {
    match tokio::time::timeout(busy, sqlx::query("SELECT 1").execute(&mut *listener)).await {
        Ok(result) => result.map(drop),
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the listening connection did not answer within the busy timeout ({})",
                humantime::format_duration(busy)
            ),
        ))),
    }
}

async fn subscribe(pool: &PgPool, channel: &str) -> sqlx::Result<PgListener> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

// The statements.

/// The settings of the database at `url`, read without changing it: no migration; `None`
/// when it has no settings table.
pub(super) async fn stored_only(url: &str, busy_timeout: Duration) -> Result<Option<super::Stored>> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(busy_timeout);
    let pool = open(pool, &connect_options(url)?, url, busy_timeout).await?;
    let (settings, domains): (bool, bool) =
        sqlx::query_as("SELECT to_regclass('settings') IS NOT NULL, to_regclass('domains') IS NOT NULL")
            .fetch_one(&pool)
            .await?;
    let stored = if settings {
        Some(super::Stored {
            settings: read_settings(&pool).await?,
            domains: if domains {
                read_domains(&pool).await?
            } else {
                Vec::new()
            },
        })
    } else {
        None
    };
    pool.close().await;
    Ok(stored)
}

/// Opens `pool` on `options`. When no connection came within the busy timeout, one more
/// attempt says why (refused, no such host, authentication...): the pool says only that none
/// came.
async fn open(
    pool: PgPoolOptions,
    options: &PgConnectOptions,
    url: &str,
    busy_timeout: Duration,
) -> Result<PgPool> {
    match pool.connect_with(options.clone()).await {
        Ok(pool) => return Ok(pool),
        Err(sqlx::Error::PoolTimedOut) => {}
        Err(e) => return Err(Error::from(e)),
    }
    use sqlx::Connection as _;
    let why = match tokio::time::timeout(busy_timeout, sqlx::PgConnection::connect_with(options)).await {
        Ok(Err(e)) => e.to_string(),
        Ok(Ok(c)) => {
            let _ = c.close().await;
            format!(
                "no connection within the busy timeout ({})",
                humantime::format_duration(busy_timeout)
            )
        }
        Err(_) => format!(
            "no answer within the busy timeout ({})",
            humantime::format_duration(busy_timeout)
        ),
    };
    Err(Error::Unavailable(format!(
        "{} {}: {why}",
        super::CANNOT_CONNECT,
        super::redact_url(url)
    )))
}

/// Every row, each value as text whatever the column's type (a table a settings UI created
/// may hold numbers); a NULL key or value is no setting.
pub(super) async fn read_settings(pool: &PgPool) -> sqlx::Result<Vec<(String, String)>> {
    let rows: Vec<(Option<String>, Option<String>)> =
        sqlx::query_as("SELECT key::text, value::text FROM settings")
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(key, value)| Some((key?, value?)))
        .collect())
}

pub(super) async fn set_setting(pool: &PgPool, key: &str, value: &str) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )
    .bind(key)
    .bind(value)
    .execute(pool)
    .await
    .map(drop)
}

pub(super) async fn unset_setting(pool: &PgPool, key: &str) -> sqlx::Result<bool> {
    sqlx::query("DELETE FROM settings WHERE key = $1")
        .bind(key)
        .execute(pool)
        .await
        .map(|r| r.rows_affected() > 0)
}

pub(super) async fn announce_settings(pool: &PgPool, origin: &str) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(SETTINGS_CHANNEL)
        .bind(origin)
        .execute(pool)
        .await
        .map(drop)
}

/// A conversation row joined with one of its domains (all `None` when it has none).
type ConversationRow = (i64, i64, Option<String>, Option<bool>, Option<bool>);

pub(super) async fn load_conversation(pool: &PgPool, id: &str) -> sqlx::Result<Option<StoredConversation>> {
    // One statement, so the row and its domains come from one snapshot. Domains two
    // daemons added at once share a `seq`; they sort by name in byte order, as the router
    // and SQLite order names, whatever collation the database was created with.
    let rows: Vec<ConversationRow> = sqlx::query_as(
        "SELECT c.last_seen, c.version, d.domain, d.loaded, d.hit FROM conversations c \
         LEFT JOIN conversation_domains d ON d.conversation_id = c.id \
         WHERE c.id = $1 ORDER BY d.seq, d.domain COLLATE \"C\"",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let Some(&(last_seen, version, ..)) = rows.first() else {
        return Ok(None);
    };
    let members = rows
        .into_iter()
        .filter_map(|(_, _, domain, loaded, hit)| {
            Some(Member {
                domain: domain?,
                loaded: loaded.unwrap_or(false),
                hit: hit.unwrap_or(false),
            })
        })
        .collect();
    Ok(Some(StoredConversation {
        last_seen,
        version,
        members,
    }))
}

pub(super) async fn conversation_stamp(pool: &PgPool, id: &str) -> sqlx::Result<Option<Stamp>> {
    let row: Option<(i64, i64)> =
        sqlx::query_as("SELECT version, last_seen FROM conversations WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|(version, last_seen)| Stamp { version, last_seen }))
}

pub(super) async fn save_members(
    pool: &PgPool,
    id: &str,
    now_ms: i64,
    members: &[(usize, Member)],
    expected: Option<i64>,
) -> sqlx::Result<Saved> {
    let mut tx = pool.begin().await?;
    // The conversation row moves to a new version only from the expected one (or is created
    // only where there is none). Either statement locks the row until commit, or waits for
    // the writer that holds it and then finds its version (or its row) gone: writers of one
    // conversation take turns, and one that lost the turn writes nothing.
    let version: Option<i64> = match expected {
        Some(expected) => {
            sqlx::query_scalar(
                "UPDATE conversations SET last_seen = GREATEST(last_seen, $2), previous = version, \
             version = nextval('conversation_versions') WHERE id = $1 AND version = $3 RETURNING version",
            )
            .bind(id)
            .bind(now_ms)
            .bind(expected)
            .fetch_optional(&mut *tx)
            .await?
        }
        None => {
            sqlx::query_scalar(
                "INSERT INTO conversations (id, last_seen, version, previous) \
             VALUES ($1, $2, nextval('conversation_versions'), NULL) \
             ON CONFLICT (id) DO NOTHING RETURNING version",
            )
            .bind(id)
            .bind(now_ms)
            .fetch_optional(&mut *tx)
            .await?
        }
    };
    let Some(version) = version else {
        // Dropped uncommitted: rolled back.
        return Ok(Saved::Stale);
    };
    // Rows come in the order of their positions. A domain not stored yet joins after every
    // stored one, in that order. (The writer's copy is the stored state, so that is the
    // position it gave; the statement does not rely on it.)
    let (mut domains, mut loaded, mut hit) = (Vec::new(), Vec::new(), Vec::new());
    for (_, m) in members {
        domains.push(m.domain.as_str());
        loaded.push(m.loaded);
        hit.push(m.hit);
    }
    sqlx::query(
        "INSERT INTO conversation_domains (conversation_id, domain, seq, loaded, hit) \
         SELECT $1, i.domain, \
         COALESCE(c.seq, n.next + ROW_NUMBER() OVER (PARTITION BY c.seq IS NULL ORDER BY i.ord) - 1), \
         i.loaded, i.hit \
         FROM UNNEST($2::text[], $3::boolean[], $4::boolean[]) WITH ORDINALITY AS i(domain, loaded, hit, ord) \
         CROSS JOIN (SELECT COALESCE(MAX(seq) + 1, 0) AS next FROM conversation_domains \
                     WHERE conversation_id = $1) AS n \
         LEFT JOIN conversation_domains AS c ON c.conversation_id = $1 AND c.domain = i.domain \
         WHERE TRUE \
         ON CONFLICT (conversation_id, domain) DO UPDATE SET \
         loaded = conversation_domains.loaded OR excluded.loaded, hit = conversation_domains.hit OR excluded.hit",
    )
    .bind(id)
    .bind(&domains)
    .bind(&loaded)
    .bind(&hit)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Saved::Done(Some(version)))
}

pub(super) async fn touch_conversations(pool: &PgPool, clocks: &[(&str, i64)]) -> sqlx::Result<()> {
    let (ids, seen): (Vec<&str>, Vec<i64>) = clocks.iter().copied().unzip();
    let mut tx = pool.begin().await?;
    // Every statement that locks several conversations locks them in id order first, so
    // two replicas' clock flushes and idle deletes wait for each other instead of
    // deadlocking. (A statement that locks one conversation, a write of its domains, holds
    // no other.)
    sqlx::query("SELECT COUNT(*) FROM (SELECT id FROM conversations WHERE id = ANY($1) ORDER BY id FOR UPDATE) AS locked")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "UPDATE conversations c SET last_seen = GREATEST(c.last_seen, v.seen) \
         FROM (SELECT id, MAX(seen) AS seen FROM UNNEST($1::text[], $2::bigint[]) AS u(id, seen) GROUP BY id) AS v \
         WHERE c.id = v.id",
    )
    .bind(&ids)
    .bind(&seen)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

pub(super) async fn delete_conversation(pool: &PgPool, id: &str) -> sqlx::Result<()> {
    // Its domains go with it (ON DELETE CASCADE).
    sqlx::query("DELETE FROM conversations WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .map(drop)
}

pub(super) async fn forget_idle_conversation(pool: &PgPool, id: &str, cutoff_ms: i64) -> sqlx::Result<bool> {
    // One statement: a replica's write in between moves last_seen and the row stays.
    sqlx::query("DELETE FROM conversations WHERE id = $1 AND last_seen < $2")
        .bind(id)
        .bind(cutoff_ms)
        .execute(pool)
        .await
        .map(|r| r.rows_affected() > 0)
}

pub(super) async fn delete_idle_conversations(pool: &PgPool, cutoff_ms: i64) -> sqlx::Result<u64> {
    let mut tx = pool.begin().await?;
    // In id order, as `touch_conversations` locks them.
    sqlx::query("SELECT COUNT(*) FROM (SELECT id FROM conversations WHERE last_seen < $1 ORDER BY id FOR UPDATE) AS locked")
        .bind(cutoff_ms)
        .execute(&mut *tx)
        .await?;
    let deleted = sqlx::query("DELETE FROM conversations WHERE last_seen < $1")
        .bind(cutoff_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    Ok(deleted)
}

pub(super) async fn read_domains(
    conn: impl sqlx::Executor<'_, Database = sqlx::Postgres>,
) -> sqlx::Result<Vec<(String, String)>> {
    sqlx::query_as(r#"SELECT name, manifest FROM domains ORDER BY name COLLATE "C""#)
        .fetch_all(conn)
        .await
}

/// The advisory lock every run-time domain upsert takes, whichever daemon makes it.
const DOMAINS_LOCK: i64 = 0x7472_646f_6d61_696e;

/// A transaction holding the lock every run-time domain change takes, once `fits` accepted
/// the rows as stored (every row, by name); `fits`'s refusal otherwise (the transaction
/// dropped uncommitted: rolled back).
async fn checked_under_lock(
    pool: &PgPool,
    fits: impl FnOnce(Vec<(String, String)>) -> Result<()>,
) -> sqlx::Result<Result<sqlx::Transaction<'static, sqlx::Postgres>>> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(DOMAINS_LOCK)
        .execute(&mut *tx)
        .await?;
    let checked = fits(read_domains(&mut *tx).await?);
    Ok(checked.map(|()| tx))
}

/// Stores a run-time domain when `fits` accepts the change to the stored ones (every row, by
/// name; its refusal otherwise, nothing written). The rows are read under a lock every
/// daemon's run-time domain change takes, so two daemons cannot each store a domain that fits
/// beside what it read and clashes with the other's.
pub(super) async fn upsert_domain(
    pool: &PgPool,
    name: &str,
    manifest: &str,
    now_ms: i64,
    fits: impl FnOnce(Vec<(String, String)>) -> Result<()>,
) -> sqlx::Result<Result<bool>> {
    let mut tx = match checked_under_lock(pool, fits).await? {
        Ok(tx) => tx,
        Err(refused) => return Ok(Err(refused)),
    };
    // `xmax` is 0 on a row this statement inserted, and set on one it updated.
    let (inserted,): (bool,) = sqlx::query_as(
        "INSERT INTO domains (name, manifest, updated_at) VALUES ($1, $2, $3) \
         ON CONFLICT (name) DO UPDATE SET manifest = excluded.manifest, updated_at = excluded.updated_at \
         RETURNING (xmax = 0)",
    )
    .bind(name)
    .bind(manifest)
    .bind(now_ms)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Ok(inserted))
}

/// Removes a run-time domain when `fits` accepts the change (as [`upsert_domain`], under the
/// same lock); true when it existed.
pub(super) async fn delete_domain(
    pool: &PgPool,
    name: &str,
    fits: impl FnOnce(Vec<(String, String)>) -> Result<()>,
) -> sqlx::Result<Result<bool>> {
    let mut tx = match checked_under_lock(pool, fits).await? {
        Ok(tx) => tx,
        Err(refused) => return Ok(Err(refused)),
    };
    let deleted = sqlx::query("DELETE FROM domains WHERE name = $1")
        .bind(name)
        .execute(&mut *tx)
        .await?
        .rows_affected()
        > 0;
    tx.commit().await?;
    Ok(Ok(deleted))
}

/// Creates an empty database `name` on the server `admin_url` reaches (tests give each test
/// a database of its own).
pub(super) async fn create_database(admin_url: &str, name: &str) -> sqlx::Result<()> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(admin_url).await?;
    // A name cannot be a bind parameter; the caller's name is quoted as an identifier.
    let statement = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
    sqlx::query(sqlx::AssertSqlSafe(statement))
        .execute(&mut conn)
        .await?;
    conn.close().await
}
