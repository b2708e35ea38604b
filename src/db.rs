//! The database: the pool, migrations, and every SQL statement (one fn per statement).
//! Settings UIs write the same SQLite file, so it is opened in WAL mode with a busy timeout.
//!
//! The file can be deleted or replaced under a running daemon. Open connections would keep
//! using the old, unlinked file, silently: reads would go stale and acknowledged writes would
//! be lost. So each call first opens a [`Session`], which checks (once, on a blocking-pool
//! thread) that the path still names the file the pool opened; a missing file is an
//! `Unavailable` error, and a replaced one is reopened (and migrated) before use, bumping
//! [`Db::generation`] so cached conversations are re-read. The call's statements then run on
//! that session.
//!
//! Every failed operation counts in [`DATABASE_ERRORS`].

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::error::{Error, Result};
use crate::router::Member;

/// Failed database operations (settings reads, writes, a missing or replaced file), for
/// the `toolrouter_database_errors_total` metric. Process-wide: every daemon in a process
/// shares the database layer's count.
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

/// How long a statement waits for another writer's lock before failing, by default.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The shared pool. Cloning is shallow.
#[derive(Debug, Clone)]
pub struct Db {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    options: SqliteConnectOptions,
    /// The database file; `None` for an in-memory database.
    path: Option<PathBuf>,
    current: ArcSwap<Opened>,
    /// Held while reopening, so concurrent callers reopen once.
    reopen: tokio::sync::Mutex<()>,
    generation: AtomicU64,
}

/// A pool and the file it opened, swapped together.
#[derive(Debug)]
struct Opened {
    pool: SqlitePool,
    /// `None` for an in-memory database.
    file: Option<FileId>,
}

/// Device and inode: what tells a replaced file from the one that was opened.
type FileId = (u64, u64);

fn file_id(path: &Path) -> std::io::Result<FileId> {
    let meta = std::fs::metadata(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        Ok((meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        Ok((0, 0))
    }
}

/// The file a SQLite URL names, made absolute against the working directory (and with links
/// resolved when it exists), so two processes in different directories can compare it;
/// `None` for an in-memory database.
///
/// # Errors
/// A URL that is not a SQLite URL.
pub(crate) fn database_file(url: &str) -> Result<Option<PathBuf>> {
    let options = SqliteConnectOptions::from_str(url)?;
    let filename = options.get_filename();
    if filename.as_os_str() == ":memory:" || url.contains("mode=memory") {
        return Ok(None);
    }
    Ok(Some(absolute(filename)))
}

/// `path` made absolute, links resolved where it exists.
pub(crate) fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// The URL with any user name and password removed, for logs and `DescribeServer`.
pub(crate) fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, tail) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
            match authority.rsplit_once('@') {
                Some((_, host)) => format!("{scheme}://{host}{tail}"),
                None => url.to_string(),
            }
        }
        None => url.to_string(),
    }
}

async fn open(options: &SqliteConnectOptions) -> Result<SqlitePool> {
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options.clone())
        .await?;
    sqlx::migrate!().run(&pool).await?;
    Ok(pool)
}

impl Db {
    /// Opens (creating if missing) the database at `url` and applies the embedded migrations.
    ///
    /// # Errors
    /// A bad URL, an unopenable file, or a failed migration.
    pub async fn connect(url: &str) -> Result<Db> {
        Db::connect_with(url, BUSY_TIMEOUT).await
    }

    /// [`Db::connect`] with a given busy timeout.
    ///
    /// # Errors
    /// A bad URL, an unopenable file, or a failed migration.
    pub(crate) async fn connect_with(url: &str, busy_timeout: Duration) -> Result<Db> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(busy_timeout)
            // A load acknowledged to a client must survive a crash: commit means on disk.
            .synchronous(SqliteSynchronous::Full);
        let filename = options.get_filename();
        let in_memory = filename.as_os_str() == ":memory:" || url.contains("mode=memory");
        let path = (!in_memory).then(|| filename.to_path_buf());
        let pool = open(&options).await?;
        let file = match &path {
            Some(p) => Some(file_id(p).map_err(|e| Error::Io {
                context: format!("cannot inspect the database file {}", p.display()),
                source: e,
            })?),
            None => None,
        };
        Ok(Db {
            inner: Arc::new(Inner {
                options,
                path,
                current: ArcSwap::from_pointee(Opened { pool, file }),
                reopen: tokio::sync::Mutex::new(()),
                generation: AtomicU64::new(0),
            }),
        })
    }

    /// The database file as opened (as the URL names it); `None` for an in-memory database.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// Bumped each time the file was found replaced and reopened.
    pub(crate) fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// A session over the file the path names now, reopening it if it was replaced: the
    /// one file check of a call.
    ///
    /// # Errors
    /// `Unavailable` when the file is missing or cannot be reopened.
    pub(crate) async fn session(&self) -> Result<Session> {
        counted(self.current_pool().await).map(|pool| Session { pool })
    }

    async fn current_pool(&self) -> Result<SqlitePool> {
        let opened = self.inner.current.load_full();
        let Some(path) = &self.inner.path else {
            return Ok(opened.pool.clone());
        };
        let now = self.file_id(path).await?;
        if opened.file == Some(now) {
            return Ok(opened.pool.clone());
        }
        drop(opened);
        let _guard = self.inner.reopen.lock().await;
        let now = self.file_id(path).await?;
        let opened = self.inner.current.load_full();
        if opened.file == Some(now) {
            return Ok(opened.pool.clone());
        }
        let pool = open(&self.inner.options).await.map_err(|e| {
            Error::Unavailable(format!(
                "the database file {} was replaced and cannot be reopened: {e}",
                path.display()
            ))
        })?;
        self.inner.current.store(Arc::new(Opened {
            pool: pool.clone(),
            file: Some(now),
        }));
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
        tracing::warn!(path = %path.display(), "the database file was replaced; reopened it");
        opened.pool.close().await;
        Ok(pool)
    }

    /// The identity of the file at `path` now, read on the blocking pool (a `stat` may wait
    /// on a slow disk or a network file system, and must not hold a runtime thread).
    async fn file_id(&self, path: &Path) -> Result<FileId> {
        let owned = path.to_path_buf();
        let id = tokio::task::spawn_blocking(move || file_id(&owned))
            .await
            .map_err(|e| Error::Internal(format!("the database file check failed: {e}")))?;
        id.map_err(|e| {
            Error::Unavailable(format!(
                "the database file {} cannot be opened: {e}",
                path.display()
            ))
        })
    }

    /// Checks that the file is still there, reopening it if it was replaced.
    ///
    /// # Errors
    /// `Unavailable` when the file is missing or cannot be reopened.
    pub async fn check(&self) -> Result<()> {
        self.session().await.map(drop)
    }

    /// Every settings row (one call: checks the file, then reads).
    ///
    /// # Errors
    /// `Unavailable` for a missing file, or a database fault.
    pub async fn read_settings(&self) -> Result<Vec<(String, String)>> {
        self.session().await?.read_settings().await
    }

    /// Sets one setting, as a settings UI does (one call: checks the file, then writes).
    ///
    /// # Errors
    /// `Unavailable` for a missing file, or a database fault.
    pub async fn set_setting(&self, key: &str, value: &str) -> Result<()> {
        self.session().await?.set_setting(key, value).await
    }

    /// Removes one setting; true when it existed.
    ///
    /// # Errors
    /// `Unavailable` for a missing file, or a database fault.
    pub async fn unset_setting(&self, key: &str) -> Result<bool> {
        self.session().await?.unset_setting(key).await
    }

    /// A conversation's last-seen time and members, as [`Session::load_conversation`] (one
    /// call: checks the file, then reads).
    ///
    /// # Errors
    /// `Unavailable` for a missing file, or a database fault.
    pub async fn load_conversation(&self, id: &str) -> Result<Option<(i64, Vec<Member>)>> {
        self.session().await?.load_conversation(id).await
    }

    /// Every domain registered at run time, as (name, manifest), by name (one call: checks
    /// the file, then reads).
    ///
    /// # Errors
    /// `Unavailable` for a missing file, or a database fault.
    pub async fn read_domains(&self) -> Result<Vec<(String, String)>> {
        self.session().await?.read_domains().await
    }

    /// Stores a run-time domain's manifest, replacing the one of the same name; true when
    /// there was none (one call: checks the file, then writes).
    ///
    /// # Errors
    /// `Unavailable` for a missing file, or a database fault.
    pub async fn upsert_domain(&self, name: &str, manifest: &str, now_ms: i64) -> Result<bool> {
        self.session().await?.upsert_domain(name, manifest, now_ms).await
    }

    /// Removes a run-time domain; true when it existed (one call: checks the file, then
    /// writes).
    ///
    /// # Errors
    /// `Unavailable` for a missing file, or a database fault.
    pub async fn delete_domain(&self, name: &str) -> Result<bool> {
        self.session().await?.delete_domain(name).await
    }

    /// Closes every connection (after the server stopped).
    pub async fn close(&self) {
        self.inner.current.load().pool.close().await;
    }
}

/// The statements of one call, on the file [`Db::session`] checked. Cloning is shallow.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pool: SqlitePool,
}

impl Session {
    /// Every settings row.
    #[tracing::instrument(skip(self))]
    pub async fn read_settings(&self) -> Result<Vec<(String, String)>> {
        counted(
            sqlx::query_as("SELECT key, value FROM settings")
                .fetch_all(&self.pool)
                .await,
        )
    }

    /// Sets one setting (what a settings UI does).
    #[tracing::instrument(skip(self, value))]
    pub async fn set_setting(&self, key: &str, value: &str) -> Result<()> {
        counted(
            sqlx::query("INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value")
                .bind(key)
                .bind(value)
                .execute(&self.pool)
                .await,
        )
        .map(drop)
    }

    /// Removes one setting; true when it existed.
    #[tracing::instrument(skip(self))]
    pub async fn unset_setting(&self, key: &str) -> Result<bool> {
        counted(
            sqlx::query("DELETE FROM settings WHERE key = ?1")
                .bind(key)
                .execute(&self.pool)
                .await,
        )
        .map(|r| r.rows_affected() > 0)
    }

    /// A conversation's last-seen time (Unix ms) and members in join order, if it exists.
    #[tracing::instrument(skip(self))]
    pub async fn load_conversation(&self, id: &str) -> Result<Option<(i64, Vec<Member>)>> {
        counted(self.load_conversation_tx(id).await)
    }

    async fn load_conversation_tx(&self, id: &str) -> sqlx::Result<Option<(i64, Vec<Member>)>> {
        let mut tx = self.pool.begin().await?;
        let last_seen: Option<(i64,)> = sqlx::query_as("SELECT last_seen FROM conversations WHERE id = ?1")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some((last_seen,)) = last_seen else {
            return Ok(None);
        };
        let rows: Vec<(String, bool, bool)> = sqlx::query_as(
            "SELECT domain, loaded, hit FROM conversation_domains WHERE conversation_id = ?1 ORDER BY seq, domain",
        )
        .bind(id)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let members = rows
            .into_iter()
            .map(|(domain, loaded, hit)| Member { domain, loaded, hit })
            .collect();
        Ok(Some((last_seen, members)))
    }

    /// Writes the members that joined or changed (each at its position in join order) and
    /// the last-seen time, in one transaction. Flags only ever turn on, so concurrent writers
    /// cannot lose each other's changes.
    #[tracing::instrument(skip(self, members))]
    pub(crate) async fn save_members(
        &self,
        id: &str,
        now_ms: i64,
        members: &[(usize, Member)],
    ) -> Result<()> {
        counted(self.save_members_tx(id, now_ms, members).await)
    }

    async fn save_members_tx(&self, id: &str, now_ms: i64, members: &[(usize, Member)]) -> sqlx::Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO conversations (id, last_seen) VALUES (?1, ?2) ON CONFLICT (id) DO UPDATE SET last_seen = max(last_seen, excluded.last_seen)",
        )
        .bind(id)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?;
        for (seq, m) in members {
            sqlx::query(
                "INSERT INTO conversation_domains (conversation_id, domain, seq, loaded, hit) VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (conversation_id, domain) DO UPDATE SET loaded = max(loaded, excluded.loaded), hit = max(hit, excluded.hit)",
            )
            .bind(id)
            .bind(&m.domain)
            .bind(i64::try_from(*seq).unwrap_or(i64::MAX))
            .bind(m.loaded)
            .bind(m.hit)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await
    }

    /// Moves a conversation's last-seen time forward (the lazy idle-clock flush).
    #[tracing::instrument(skip(self))]
    pub(crate) async fn touch_conversation(&self, id: &str, now_ms: i64) -> Result<()> {
        counted(
            sqlx::query("UPDATE conversations SET last_seen = max(last_seen, ?2) WHERE id = ?1")
                .bind(id)
                .bind(now_ms)
                .execute(&self.pool)
                .await,
        )
        .map(drop)
    }

    /// Forgets one conversation.
    #[tracing::instrument(skip(self))]
    pub(crate) async fn delete_conversation(&self, id: &str) -> Result<()> {
        counted(self.delete_conversation_tx(id).await)
    }

    async fn delete_conversation_tx(&self, id: &str) -> sqlx::Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM conversation_domains WHERE conversation_id = ?1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM conversations WHERE id = ?1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }

    /// Forgets every conversation idle since before `cutoff_ms`; returns how many.
    #[tracing::instrument(skip(self))]
    pub(crate) async fn delete_idle_conversations(&self, cutoff_ms: i64) -> Result<u64> {
        counted(self.delete_idle_conversations_tx(cutoff_ms).await)
    }

    async fn delete_idle_conversations_tx(&self, cutoff_ms: i64) -> sqlx::Result<u64> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "DELETE FROM conversation_domains WHERE conversation_id IN (SELECT id FROM conversations WHERE last_seen < ?1)",
        )
        .bind(cutoff_ms)
        .execute(&mut *tx)
        .await?;
        let r = sqlx::query("DELETE FROM conversations WHERE last_seen < ?1")
            .bind(cutoff_ms)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(r.rows_affected())
    }

    /// Every run-time domain's manifest, by name.
    #[tracing::instrument(skip(self))]
    pub async fn read_domains(&self) -> Result<Vec<(String, String)>> {
        counted(
            sqlx::query_as("SELECT name, manifest FROM domains ORDER BY name")
                .fetch_all(&self.pool)
                .await,
        )
    }

    /// Stores a run-time domain's manifest; true when the name was new.
    #[tracing::instrument(skip(self, manifest))]
    pub async fn upsert_domain(&self, name: &str, manifest: &str, now_ms: i64) -> Result<bool> {
        counted(self.upsert_domain_tx(name, manifest, now_ms).await)
    }

    async fn upsert_domain_tx(&self, name: &str, manifest: &str, now_ms: i64) -> sqlx::Result<bool> {
        // Writes first: a transaction that reads before it writes cannot wait for the write
        // lock (SQLite fails it at once when another connection committed in between).
        let mut tx = self.pool.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO domains (name, manifest, updated_at) VALUES (?1, ?2, ?3) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(manifest)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            > 0;
        if !inserted {
            sqlx::query("UPDATE domains SET manifest = ?2, updated_at = ?3 WHERE name = ?1")
                .bind(name)
                .bind(manifest)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(inserted)
    }

    /// Removes a run-time domain; true when it existed.
    #[tracing::instrument(skip(self))]
    pub async fn delete_domain(&self, name: &str) -> Result<bool> {
        counted(
            sqlx::query("DELETE FROM domains WHERE name = ?1")
                .bind(name)
                .execute(&self.pool)
                .await,
        )
        .map(|r| r.rows_affected() > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn db() -> (tempfile::TempDir, Session) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let db = Db::connect(&url).await.unwrap();
        (dir, db.session().await.unwrap())
    }

    fn member(domain: &str, loaded: bool, hit: bool) -> Member {
        Member {
            domain: domain.into(),
            loaded,
            hit,
        }
    }

    #[tokio::test]
    async fn settings_can_be_set_replaced_read_and_unset() {
        let (_dir, db) = db().await;
        db.set_setting("a", "1").await.unwrap();
        db.set_setting("a", "2").await.unwrap();
        db.set_setting("b", "x").await.unwrap();
        let mut rows = db.read_settings().await.unwrap();
        rows.sort();
        assert_eq!(rows, vec![("a".into(), "2".into()), ("b".into(), "x".into())]);
        assert!(db.unset_setting("a").await.unwrap());
        assert!(!db.unset_setting("a").await.unwrap());
        assert_eq!(db.read_settings().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn members_are_saved_in_join_order_and_flags_only_turn_on() {
        let (_dir, db) = db().await;
        assert_eq!(db.load_conversation("c").await.unwrap(), None);
        db.save_members(
            "c",
            10,
            &[(0, member("b", true, false)), (1, member("a", false, true))],
        )
        .await
        .unwrap();
        db.save_members("c", 5, &[(0, member("b", false, true))])
            .await
            .unwrap();
        let (seen, members) = db.load_conversation("c").await.unwrap().unwrap();
        assert_eq!(seen, 10, "last_seen never moves back");
        assert_eq!(members, vec![member("b", true, true), member("a", false, true)]);
        db.touch_conversation("c", 20).await.unwrap();
        assert_eq!(db.load_conversation("c").await.unwrap().unwrap().0, 20);
    }

    #[tokio::test]
    async fn conversations_are_deleted_one_by_one_or_when_idle() {
        let (_dir, db) = db().await;
        for (id, seen) in [("old", 1), ("new", 100), ("gone", 100)] {
            db.save_members(id, seen, &[(0, member("a", true, false))])
                .await
                .unwrap();
        }
        db.delete_conversation("gone").await.unwrap();
        assert_eq!(db.load_conversation("gone").await.unwrap(), None);
        assert_eq!(db.delete_idle_conversations(50).await.unwrap(), 1);
        assert_eq!(db.load_conversation("old").await.unwrap(), None);
        assert!(db.load_conversation("new").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn domains_are_stored_replaced_read_by_name_and_deleted() {
        let (_dir, db) = db().await;
        assert!(db.read_domains().await.unwrap().is_empty());
        assert!(db.upsert_domain("b", "{\"name\":\"b\"}", 1).await.unwrap(), "new");
        assert!(db.upsert_domain("a", "{\"name\":\"a\"}", 2).await.unwrap(), "new");
        assert!(
            !db.upsert_domain("b", "{\"name\":\"b\",\"core\":true}", 3)
                .await
                .unwrap(),
            "replaced"
        );
        assert_eq!(
            db.read_domains().await.unwrap(),
            vec![
                ("a".into(), "{\"name\":\"a\"}".into()),
                ("b".into(), "{\"name\":\"b\",\"core\":true}".into())
            ]
        );
        assert!(db.delete_domain("a").await.unwrap());
        assert!(!db.delete_domain("a").await.unwrap(), "already gone");
        assert_eq!(db.read_domains().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_missing_file_is_unavailable_and_counted_once_per_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let db = Db::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        let before = DATABASE_ERRORS.get();
        let err = db.read_settings().await.unwrap_err();
        assert!(matches!(err, Error::Unavailable(_)), "{err}");
        assert!(err.to_string().contains("cannot be opened"), "{err}");
        // Other tests in this process may count too, so only a lower bound holds.
        assert!(DATABASE_ERRORS.get() > before);
    }
}
