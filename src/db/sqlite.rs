//! SQLite: the embedded default. Every SQLite statement, one fn each, plus the file's
//! upkeep. Settings UIs write the same file, so it is opened in WAL mode with a busy timeout.
//!
//! The file can be deleted or replaced under a running daemon. Open connections would keep
//! using the old, unlinked file, silently: reads would go stale and acknowledged writes would
//! be lost. So each call first opens a session ([`Store::pool`]), which checks (once, on a
//! blocking-pool thread) that the path still names the file the pool opened; a missing file
//! is an `Unavailable` error, and a replaced one is reopened (and migrated) before use,
//! bumping [`Store::generation`] so cached conversations are re-read.
//!
//! One daemon owns a file's conversations, so rows carry no versions: every conversation is
//! version 0 here.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use sqlx::Connection as _;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};

use super::{Stamp, StoredConversation};
use crate::error::{Error, Result};
use crate::router::Member;

/// An open SQLite database. Cloning is shallow.
#[derive(Debug, Clone)]
pub(super) struct Store {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    options: SqliteConnectOptions,
    busy_timeout: Duration,
    /// The database file; `None` for an in-memory database.
    path: Option<PathBuf>,
    current: ArcSwap<Opened>,
    /// Held while reopening, so concurrent callers reopen once.
    reopen: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    /// The daemon's claim on the file ([`Store::claim`]): taken again on each file that
    /// replaces it at the path before that file is used. `None` when nothing was claimed.
    claim: std::sync::Mutex<Option<std::fs::File>>,
}

/// A pool and the file it opened, swapped together.
#[derive(Debug)]
struct Opened {
    pool: SqlitePool,
    /// `None` for an in-memory database.
    file: Option<FileId>,
    /// The write-ahead log and its index the pool's connections use (`-wal`, `-shm` beside
    /// the file), as they were when it was opened.
    log: [Option<FileId>; 2],
}

/// The write-ahead log's and its index's paths beside a database file.
pub(crate) fn log_paths(path: &Path) -> [std::path::PathBuf; 2] {
    ["-wal", "-shm"].map(|suffix| {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        std::path::PathBuf::from(p)
    })
}

/// The identities of the log files beside `path` now.
fn log_ids(path: &Path) -> [Option<FileId>; 2] {
    log_paths(path).map(|p| file_id(&p).ok())
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

/// The file a SQLite URL names as given (`None` for an in-memory database).
///
/// # Errors
/// A URL that is not a SQLite URL.
pub(super) fn file_of(url: &str) -> Result<Option<PathBuf>> {
    let options = SqliteConnectOptions::from_str(url)?;
    let filename = options.get_filename();
    // sqlx names `sqlite::memory:` a shared `file:sqlx-in-memory-N`, so the URL tells.
    if filename.as_os_str() == ":memory:" || url.contains(":memory:") || url.contains("mode=memory") {
        return Ok(None);
    }
    Ok(Some(filename.to_path_buf()))
}

/// Claims the database file at `path` for this daemon, while the returned file stays open:
/// an exclusive `flock` on it (SQLite's own locks are POSIX record locks, which `flock`
/// leaves alone). A second daemon on the file would cache conversations the first one
/// changes, so each would answer without the other's loads. A file the daemon may read but
/// not write is refused too: it would serve, and fail every load.
///
/// # Errors
/// `Unavailable` naming the file: another daemon holds it, or it cannot be written.
#[cfg(unix)]
pub(super) fn claim(path: &Path) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd as _;
    // Opened for writing (nothing is written through it): a file the daemon may not write
    // fails here.
    let file = std::fs::OpenOptions::new().write(true).open(path).map_err(|e| {
        Error::Unavailable(format!(
            "cannot write the database file {}: {e} (the daemon stores conversations and run-time domains there)",
            path.display()
        ))
    })?;
    // SAFETY: flock on a descriptor this function owns; it has no memory effects.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::Unavailable(
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                format!(
                    "another toolrouter daemon is serving the database file {}: one daemon per SQLite \
                     file (several daemons share a PostgreSQL database)",
                    path.display()
                )
            } else {
                format!("cannot lock the database file {}: {e}", path.display())
            },
        ));
    }
    Ok(file)
}

/// The most connections a pool holds: enough that calls which only read (a `Route` reading
/// its conversation) find one while writes wait on another program's write lock, each in
/// SQLite's busy handler with its connection, for up to the busy timeout.
const MAX_CONNECTIONS: u32 = 16;

async fn open(options: &SqliteConnectOptions, busy_timeout: Duration) -> Result<SqlitePool> {
    // A statement's wait for another writer's lock is SQLite's busy timeout; the wait for a
    // pooled connection is bounded the same (and by a second at least: opening one on a busy
    // machine can take longer than a short busy timeout), so a call whose connections are all
    // taken by waiting writes answers UNAVAILABLE instead of running into the request timeout.
    let pool = SqlitePoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .acquire_timeout(busy_timeout.max(Duration::from_secs(1)))
        .connect_with(options.clone())
        .await?;
    sqlx::migrate!("migrations/sqlite").run(&pool).await?;
    Ok(pool)
}

impl Store {
    /// Opens (creating if missing) the database at `url` and applies the migrations.
    pub(super) async fn connect(url: &str, busy_timeout: Duration) -> Result<Store> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(busy_timeout)
            // A load acknowledged to a client must survive a crash: commit means on disk.
            .synchronous(SqliteSynchronous::Full);
        let path = file_of(url)?;
        // What SQLite would only call "unable to open database file".
        if let Some(p) = &path {
            let parent = p.parent().filter(|d| !d.as_os_str().is_empty());
            let why = if p.is_dir() {
                Some("it is a directory".to_string())
            } else {
                parent
                    .filter(|d| !d.is_dir())
                    .map(|d| format!("its folder {} does not exist", d.display()))
            };
            if let Some(why) = why {
                return Err(Error::Unavailable(format!(
                    "cannot open the database file {}: {why}",
                    p.display()
                )));
            }
        }
        // Named, since SQLite's own words (`unable to open database file`, `file is not a
        // database`) do not say which.
        let pool = open(&options, busy_timeout).await.map_err(|e| match &path {
            Some(p) => Error::Unavailable(format!("cannot open the database file {}: {e}", p.display())),
            None => e,
        })?;
        let file = match &path {
            Some(p) => Some(file_id(p).map_err(|e| Error::Io {
                context: format!("cannot inspect the database file {}", p.display()),
                source: e,
            })?),
            None => None,
        };
        let log = path.as_deref().map_or([None, None], log_ids);
        Ok(Store {
            inner: Arc::new(Inner {
                options,
                busy_timeout,
                path,
                current: ArcSwap::from_pointee(Opened { pool, file, log }),
                reopen: tokio::sync::Mutex::new(()),
                generation: AtomicU64::new(0),
                claim: std::sync::Mutex::new(None),
            }),
        })
    }

    /// The database file as opened (as the URL names it); `None` for an in-memory database.
    pub(super) fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// Claims the file for this daemon while the store lives (see [`claim`]), and each file
    /// that later replaces it at the path before that one is used: a backup restored under a
    /// running daemon is still its own alone. Nothing for an in-memory database.
    ///
    /// # Errors
    /// `Unavailable` naming the file: another daemon holds it, or it cannot be written.
    pub(super) fn claim(&self) -> Result<()> {
        #[cfg(unix)]
        if let Some(path) = &self.inner.path {
            let file = claim(&super::absolute(path))?;
            *self
                .inner
                .claim
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(file);
        }
        Ok(())
    }

    /// Bumped each time the file was found replaced and reopened.
    pub(super) fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// The pool over the file the path names now, reopening it if it was replaced: the one
    /// file check of a call. The connections to a file another replaced at the path are
    /// closed first, before any to the new one, and the old file's write-ahead log and its
    /// index moved aside: SQLite finds them by the path and leaves a moved file's log there,
    /// so the new file would read the old one's log, its pages laid over it (a backup moved
    /// into place came out corrupt). A file missing from the path keeps its connections
    /// and its log: it may come back.
    pub(super) async fn pool(&self) -> Result<SqlitePool> {
        let opened = self.inner.current.load_full();
        let Some(path) = &self.inner.path else {
            return Ok(opened.pool.clone());
        };
        if let Ok(now) = self.file_id(path).await
            && opened.file == Some(now)
        {
            return Ok(opened.pool.clone());
        }
        drop(opened);
        let _guard = self.inner.reopen.lock().await;
        let now = self.stat(path).await?;
        let opened = self.inner.current.load_full();
        if let Ok(now) = &now
            && opened.file == Some(*now)
        {
            // Another call reopened it meanwhile.
            return Ok(opened.pool.clone());
        }
        // Another file at the path: the connections to the one opened go. Not when none is
        // there: a file moved away may come back, and its log, which holds its latest
        // commits until a checkpoint, must be where it was.
        if opened.file.is_some() && now.is_ok() {
            self.inner.current.store(Arc::new(Opened {
                pool: opened.pool.clone(),
                file: None,
                log: opened.log,
            }));
            opened.pool.close().await;
            // SQLite leaves the log of a file that moved where it was (it checkpoints only
            // into a file still at its path), and would read it as the new file's: the old
            // file's log is moved aside. One another program made for the new file stays.
            for (at, was) in log_paths(path).iter().zip(opened.log) {
                if was.is_some() && file_id(at).ok() == was {
                    let mut aside = at.as_os_str().to_owned();
                    aside.push(".replaced");
                    if let Err(e) = std::fs::rename(at, &aside) {
                        tracing::error!(path = %at.display(), error = %e, "cannot move the replaced database file's log aside");
                    }
                }
            }
            tracing::warn!(path = %path.display(), "the database file was replaced; closed the connections to it and moved its log aside");
        }
        let now = now.map_err(|e| Self::unopenable(path, &e))?;
        // The new file is claimed before it is opened: another daemon started on it since
        // it replaced this one's keeps it, and this one answers `Unavailable` until it goes.
        #[cfg(unix)]
        {
            let mut held = self
                .inner
                .claim
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if held.is_some() {
                *held = Some(claim(&super::absolute(path)).map_err(|e| {
                    Error::Unavailable(format!(
                        "the database file was replaced and cannot be reopened: {e}"
                    ))
                })?);
            }
        }
        let pool = open(&self.inner.options, self.inner.busy_timeout)
            .await
            .map_err(|e| {
                Error::Unavailable(format!(
                    "the database file {} was replaced and cannot be reopened: {e}",
                    path.display()
                ))
            })?;
        self.inner.current.store(Arc::new(Opened {
            pool: pool.clone(),
            file: Some(now),
            log: log_ids(path),
        }));
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
        tracing::warn!(path = %path.display(), "the database file was replaced; reopened it");
        Ok(pool)
    }

    /// The identity of the file at `path` now, read on the blocking pool (a `stat` may wait
    /// on a slow disk or a network file system, and must not hold a runtime thread).
    async fn file_id(&self, path: &Path) -> Result<FileId> {
        self.stat(path).await?.map_err(|e| Self::unopenable(path, &e))
    }

    /// [`file_id`] on the blocking pool; the outer error only when that task failed.
    async fn stat(&self, path: &Path) -> Result<std::io::Result<FileId>> {
        let owned = path.to_path_buf();
        tokio::task::spawn_blocking(move || file_id(&owned))
            .await
            .map_err(|e| Error::Internal(format!("the database file check failed: {e}")))
    }

    fn unopenable(path: &Path, e: &std::io::Error) -> Error {
        Error::Unavailable(format!(
            "the database file {} cannot be opened: {e}",
            path.display()
        ))
    }

    /// Closes every connection.
    pub(super) async fn close(&self) {
        self.inner.current.load().pool.close().await;
    }
}

// The statements.

/// Runs `work` in a transaction on a pooled connection, committing when it succeeds. A
/// connection whose transaction failed is closed, not pooled again: when SQLite refuses a
/// COMMIT (a full disk) it may end the transaction itself or leave it open, and sqlx's count
/// of open transactions then no longer agrees with it, so that connection would run every
/// later write inside a transaction that never commits (answering as if they were saved) and
/// hold the write lock. Closing it ends whatever is open.
pub(super) async fn in_transaction<T>(
    pool: &SqlitePool,
    work: impl AsyncFnOnce(&mut SqliteConnection) -> sqlx::Result<T>,
) -> sqlx::Result<T> {
    let mut conn = pool.acquire().await?;
    let result = async {
        let mut tx = conn.begin().await?;
        let out = work(&mut tx).await?;
        tx.commit().await?;
        Ok(out)
    }
    .await;
    if result.is_err() {
        conn.close_on_drop();
    }
    result
}

/// The settings of the database at `url`, read without changing it: opened read-only, no
/// migration; `None` when it has no settings table.
pub(super) async fn stored_only(url: &str) -> Result<Option<super::Stored>> {
    let options = SqliteConnectOptions::from_str(url)?.read_only(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?;
    let has = async |table: &str| -> sqlx::Result<bool> {
        let found: Option<(i64,)> =
            sqlx::query_as("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1")
                .bind(table)
                .fetch_optional(&pool)
                .await?;
        Ok(found.is_some())
    };
    let stored = if has("settings").await? {
        Some(super::Stored {
            settings: read_settings(&pool).await?,
            domains: if has("domains").await? {
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

/// Every row, each value as text whatever a settings UI stored (SQLite keeps what it is
/// given, a number or bytes too): as bytes, read as UTF-8 (an invalid sequence replaced), so
/// one odd row neither hides nor freezes the others. A NULL key or value is no setting.
pub(super) async fn read_settings(pool: &SqlitePool) -> sqlx::Result<Vec<(String, String)>> {
    /// A key and its value, as bytes (NULL as `None`).
    type Row = (Option<Vec<u8>>, Option<Vec<u8>>);
    let rows: Vec<Row> = sqlx::query_as("SELECT CAST(key AS BLOB), CAST(value AS BLOB) FROM settings")
        .fetch_all(pool)
        .await?;
    let text = |bytes: Vec<u8>| {
        String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    };
    Ok(rows
        .into_iter()
        .filter_map(|(key, value)| Some((text(key?), text(value?))))
        .collect())
}

/// Keys are matched as [`read_settings`] reads them, as bytes: a key another program stored
/// as a blob is the same setting (the primary key tells a blob from text, so the blob row is
/// replaced rather than kept beside a text one).
pub(super) async fn set_setting(pool: &SqlitePool, key: &str, value: &str) -> sqlx::Result<()> {
    in_transaction(pool, async |tx| {
        sqlx::query("DELETE FROM settings WHERE CAST(key AS BLOB) = CAST(?1 AS BLOB) AND typeof(key) <> 'text'")
            .bind(key)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )
        .bind(key)
        .bind(value)
        .execute(&mut *tx)
        .await
        .map(drop)
    })
    .await
}

/// Removes the key however it is stored (see [`set_setting`]).
pub(super) async fn unset_setting(pool: &SqlitePool, key: &str) -> sqlx::Result<bool> {
    sqlx::query("DELETE FROM settings WHERE CAST(key AS BLOB) = CAST(?1 AS BLOB)")
        .bind(key)
        .execute(pool)
        .await
        .map(|r| r.rows_affected() > 0)
}

pub(super) async fn load_conversation(
    pool: &SqlitePool,
    id: &str,
) -> sqlx::Result<Option<StoredConversation>> {
    in_transaction(pool, async |tx| {
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
        let members = rows
            .into_iter()
            .map(|(domain, loaded, hit)| Member { domain, loaded, hit })
            .collect();
        Ok(Some(StoredConversation {
            last_seen,
            version: 0,
            members,
        }))
    })
    .await
}

pub(super) async fn conversation_stamp(pool: &SqlitePool, id: &str) -> sqlx::Result<Option<Stamp>> {
    let row: Option<(i64,)> = sqlx::query_as("SELECT last_seen FROM conversations WHERE id = ?1")
        .bind(id)
        .fetch_optional(pool)
        .await?;
    Ok(row.map(|(last_seen,)| Stamp {
        version: 0,
        last_seen,
    }))
}

pub(super) async fn save_members(
    pool: &SqlitePool,
    id: &str,
    now_ms: i64,
    members: &[(usize, Member)],
) -> sqlx::Result<()> {
    in_transaction(pool, async |tx| {
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
        Ok(())
    })
    .await
}

pub(super) async fn touch_conversations(pool: &SqlitePool, clocks: &[(&str, i64)]) -> sqlx::Result<()> {
    // One commit (one sync of the log) for the batch.
    in_transaction(pool, async |tx| {
        for &(id, seen) in clocks {
            sqlx::query("UPDATE conversations SET last_seen = max(last_seen, ?2) WHERE id = ?1")
                .bind(id)
                .bind(seen)
                .execute(&mut *tx)
                .await?;
        }
        Ok(())
    })
    .await
}

pub(super) async fn delete_conversation(pool: &SqlitePool, id: &str) -> sqlx::Result<()> {
    in_transaction(pool, async |tx| {
        sqlx::query("DELETE FROM conversation_domains WHERE conversation_id = ?1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM conversations WHERE id = ?1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        Ok(())
    })
    .await
}

pub(super) async fn forget_idle_conversation(
    pool: &SqlitePool,
    id: &str,
    cutoff_ms: i64,
) -> sqlx::Result<bool> {
    in_transaction(pool, async |tx| {
        sqlx::query(
            "DELETE FROM conversation_domains WHERE conversation_id = ?1 \
             AND EXISTS (SELECT 1 FROM conversations WHERE id = ?1 AND last_seen < ?2)",
        )
        .bind(id)
        .bind(cutoff_ms)
        .execute(&mut *tx)
        .await?;
        let r = sqlx::query("DELETE FROM conversations WHERE id = ?1 AND last_seen < ?2")
            .bind(id)
            .bind(cutoff_ms)
            .execute(&mut *tx)
            .await?;
        Ok(r.rows_affected() > 0)
    })
    .await
}

pub(super) async fn delete_idle_conversations(pool: &SqlitePool, cutoff_ms: i64) -> sqlx::Result<u64> {
    in_transaction(pool, async |tx| {
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
        Ok(r.rows_affected())
    })
    .await
}

pub(super) async fn read_domains(pool: &SqlitePool) -> sqlx::Result<Vec<(String, String)>> {
    sqlx::query_as("SELECT name, manifest FROM domains ORDER BY name")
        .fetch_all(pool)
        .await
}

/// Stores a run-time domain when `fits` accepts the change to the stored ones (every row, by
/// name; its refusal otherwise, nothing written). A file has one daemon, whose run-time
/// changes are serialised in memory: the rows are read before the write.
pub(super) async fn upsert_domain(
    pool: &SqlitePool,
    name: &str,
    manifest: &str,
    now_ms: i64,
    fits: impl FnOnce(Vec<(String, String)>) -> Result<()>,
) -> sqlx::Result<Result<bool>> {
    if let Err(refused) = fits(read_domains(pool).await?) {
        return Ok(Err(refused));
    }
    // Writes first: a transaction that reads before it writes cannot wait for the write
    // lock (SQLite fails it at once when another connection committed in between).
    in_transaction(pool, async |tx| {
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
        Ok(inserted)
    })
    .await
    .map(Ok)
}

/// Removes a run-time domain when `fits` accepts the change (as [`upsert_domain`]); true when
/// it existed.
pub(super) async fn delete_domain(
    pool: &SqlitePool,
    name: &str,
    fits: impl FnOnce(Vec<(String, String)>) -> Result<()>,
) -> sqlx::Result<Result<bool>> {
    if let Err(refused) = fits(read_domains(pool).await?) {
        return Ok(Err(refused));
    }
    // In a transaction, as every write here: one cut before its commit leaves nothing done.
    in_transaction(pool, async |tx| {
        sqlx::query("DELETE FROM domains WHERE name = ?1")
            .bind(name)
            .execute(&mut *tx)
            .await
            .map(|r| r.rows_affected() > 0)
    })
    .await
    .map(Ok)
}
