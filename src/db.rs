//! The database: the pool, migrations, and every SQL statement (one fn per statement).
//! Settings UIs write the same SQLite file, so it is opened in WAL mode with a busy timeout.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::error::Result;
use crate::router::Member;

/// How long a statement waits for another writer's lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The shared pool. Cloning is shallow.
#[derive(Debug, Clone)]
pub struct Db {
    pool: SqlitePool,
}

impl Db {
    /// Opens (creating if missing) the database at `url` and applies the embedded migrations.
    ///
    /// # Errors
    /// A bad URL, an unopenable file, or a failed migration.
    pub async fn connect(url: &str) -> Result<Db> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(BUSY_TIMEOUT)
            // A load acknowledged to a client must survive a crash: commit means on disk.
            .synchronous(SqliteSynchronous::Full);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        sqlx::migrate!().run(&pool).await?;
        Ok(Db { pool })
    }

    /// Closes every connection (after the server stopped).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Every settings row.
    #[tracing::instrument(skip(self))]
    pub async fn read_settings(&self) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as("SELECT key, value FROM settings")
            .fetch_all(&self.pool)
            .await?)
    }

    /// Sets one setting (what a settings UI does).
    #[tracing::instrument(skip(self, value))]
    pub async fn set_setting(&self, key: &str, value: &str) -> Result<()> {
        sqlx::query("INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value")
            .bind(key)
            .bind(value)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Removes one setting; true when it existed.
    #[tracing::instrument(skip(self))]
    pub async fn unset_setting(&self, key: &str) -> Result<bool> {
        let r = sqlx::query("DELETE FROM settings WHERE key = ?1")
            .bind(key)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }

    /// A conversation's last-seen time (Unix ms) and members in join order, if it exists.
    #[tracing::instrument(skip(self))]
    pub async fn load_conversation(&self, id: &str) -> Result<Option<(i64, Vec<Member>)>> {
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

    /// Writes members that joined or changed, and the last-seen time, in one transaction.
    /// Flags only ever turn on, so concurrent writers cannot lose each other's changes.
    #[tracing::instrument(skip(self, members))]
    pub async fn save_members(&self, id: &str, now_ms: i64, members: &[(i64, &Member)]) -> Result<()> {
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
            .bind(seq)
            .bind(m.loaded)
            .bind(m.hit)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Moves a conversation's last-seen time forward (the lazy idle-clock flush).
    #[tracing::instrument(skip(self))]
    pub async fn touch_conversation(&self, id: &str, now_ms: i64) -> Result<()> {
        sqlx::query("UPDATE conversations SET last_seen = max(last_seen, ?2) WHERE id = ?1")
            .bind(id)
            .bind(now_ms)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Forgets one conversation.
    #[tracing::instrument(skip(self))]
    pub async fn delete_conversation(&self, id: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM conversation_domains WHERE conversation_id = ?1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM conversations WHERE id = ?1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Forgets every conversation idle since before `cutoff_ms`; returns how many.
    #[tracing::instrument(skip(self))]
    pub async fn delete_idle_conversations(&self, cutoff_ms: i64) -> Result<u64> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn db() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        (dir, Db::connect(&url).await.unwrap())
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
            &[(0, &member("b", true, false)), (1, &member("a", false, true))],
        )
        .await
        .unwrap();
        db.save_members("c", 5, &[(0, &member("b", false, true))])
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
        db.save_members("old", 1, &[(0, &member("a", true, false))])
            .await
            .unwrap();
        db.save_members("new", 100, &[(0, &member("a", true, false))])
            .await
            .unwrap();
        db.save_members("gone", 100, &[(0, &member("a", true, false))])
            .await
            .unwrap();
        db.delete_conversation("gone").await.unwrap();
        assert_eq!(db.load_conversation("gone").await.unwrap(), None);
        assert_eq!(db.delete_idle_conversations(50).await.unwrap(), 1);
        assert_eq!(db.load_conversation("old").await.unwrap(), None);
        assert!(db.load_conversation("new").await.unwrap().is_some());
    }
}
