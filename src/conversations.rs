//! Conversations: the groups loaded and the domains hit per conversation, persisted to
//! SQLite before an operation answers, with a bounded in-memory cache in front (SQLite stays
//! the source of truth). The idle clock lives in memory and is flushed lazily by
//! [`Conversations::maintain`], so a `Route` that changes nothing writes nothing.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use moka::future::Cache;
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::db::Db;
use crate::error::Result;
use crate::router::{Conversation, Member};

/// One cached conversation.
#[derive(Debug, Default)]
pub struct Entry {
    /// What the conversation remembers.
    pub state: Conversation,
    /// Unix ms of the last `Route` or `LoadToolGroup`.
    last_seen: i64,
    /// The last-seen time the database holds.
    flushed: i64,
    /// Whether the database has a row for it (a conversation that never changed has none).
    in_db: bool,
    /// The database generation it was read from; a replaced database file means re-reading.
    generation: u64,
    /// Set while a write is in flight: if the operation is cancelled (client gone, request
    /// timeout) the write may or may not have committed, so the next lock re-reads it.
    unsure: bool,
}

/// A conversation as the database holds it (empty when it has no row).
async fn read(db: &Db, id: &str) -> Result<Entry> {
    let generation = db.generation();
    Ok(match db.load_conversation(id).await? {
        Some((last_seen, members)) => Entry {
            state: Conversation { members },
            last_seen,
            flushed: last_seen,
            in_db: true,
            generation,
            unsure: false,
        },
        None => Entry {
            generation,
            ..Entry::default()
        },
    })
}

/// The conversation store.
#[derive(Clone)]
pub struct Conversations {
    db: Db,
    ttl: Duration,
    cache: Cache<String, Arc<Mutex<Entry>>>,
}

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Conversations {
    /// A store over `db`; conversations idle longer than `ttl` are forgotten, and at most
    /// `capacity` are kept in memory.
    pub fn new(db: Db, ttl: Duration, capacity: u64) -> Conversations {
        // Time-to-idle equal to the conversation TTL: a cached entry expires exactly when its
        // conversation would.
        let cache = Cache::builder().max_capacity(capacity).time_to_idle(ttl).build();
        Conversations { db, ttl, cache }
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// Locks a conversation for one operation, loading it from the database and forgetting
    /// it first if it has been idle past the TTL. The idle clock restarts now.
    ///
    /// # Errors
    /// A database fault while loading or forgetting it.
    pub async fn lock(&self, id: &str) -> Result<OwnedMutexGuard<Entry>> {
        // A replaced database file is noticed here, before the cached entry is trusted.
        self.db.check().await?;
        let db = self.db.clone();
        let owned_id = id.to_string();
        let entry = self
            .cache
            .try_get_with(id.to_string(), async move {
                Ok::<_, crate::Error>(Arc::new(Mutex::new(read(&db, &owned_id).await?)))
            })
            .await
            .map_err(|e: Arc<crate::Error>| {
                Arc::try_unwrap(e).unwrap_or_else(|e| crate::Error::Shared(e.to_string()))
            })?;
        let mut guard = entry.lock_owned().await;
        if guard.unsure || guard.generation != self.db.generation() {
            *guard = read(&self.db, id).await?;
        }
        let now = now_ms();
        if guard.in_db && guard.last_seen.saturating_add(self.ttl_ms()) < now {
            self.db.delete_conversation(id).await?;
            *guard = Entry {
                generation: guard.generation,
                ..Entry::default()
            };
        }
        guard.last_seen = now;
        Ok(guard)
    }

    /// Persists `next` as the conversation's new state, then adopts it. On failure the
    /// cached state is unchanged, so nothing is acknowledged that was not written.
    ///
    /// # Errors
    /// A database fault.
    pub async fn save(&self, id: &str, entry: &mut Entry, next: Conversation) -> Result<()> {
        let changed: Vec<(i64, &Member)> = next
            .members
            .iter()
            .enumerate()
            .filter(|(i, m)| entry.state.members.get(*i) != Some(m))
            .map(|(i, m)| (i as i64, m))
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        entry.unsure = true;
        self.db.save_members(id, entry.last_seen, &changed).await?;
        entry.unsure = false;
        entry.state = next;
        entry.in_db = true;
        entry.flushed = entry.last_seen;
        Ok(())
    }

    /// Conversations held in memory now.
    pub async fn cached(&self) -> u64 {
        // The cache counts lazily; settle its pending bookkeeping first.
        self.cache.run_pending_tasks().await;
        self.cache.entry_count()
    }

    /// Forgets one conversation (an unknown id is fine).
    ///
    /// # Errors
    /// A database fault.
    pub async fn reset(&self, id: &str) -> Result<()> {
        // Lock first so an operation in flight on it cannot write it back afterwards.
        let entry = self.cache.get(id).await;
        let guard = match &entry {
            Some(e) => Some(e.clone().lock_owned().await),
            None => None,
        };
        self.db.delete_conversation(id).await?;
        if let Some(mut g) = guard {
            *g = Entry::default();
        }
        self.cache.invalidate(id).await;
        Ok(())
    }

    /// Flushes the idle clocks that moved and forgets conversations idle past the TTL.
    ///
    /// # Errors
    /// A database fault.
    pub async fn maintain(&self) -> Result<()> {
        for (id, entry) in self.cache.iter() {
            let (seen, due) = {
                let Ok(e) = entry.try_lock() else { continue };
                (e.last_seen, e.in_db && e.last_seen > e.flushed)
            };
            if due {
                self.db.touch_conversation(&id, seen).await?;
                if let Ok(mut e) = entry.try_lock() {
                    e.flushed = e.flushed.max(seen);
                }
            }
        }
        self.db
            .delete_idle_conversations(now_ms() - self.ttl_ms())
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn store(path: &std::path::Path, ttl: Duration) -> Conversations {
        let db = Db::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        Conversations::new(db, ttl, 100)
    }

    fn member(domain: &str, loaded: bool, hit: bool) -> Member {
        Member {
            domain: domain.into(),
            loaded,
            hit,
        }
    }

    #[tokio::test]
    async fn a_reopened_store_finds_the_state_intact() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let first = store(&path, Duration::from_secs(3600)).await;
        let mut e = first.lock("c1").await.unwrap();
        let next = Conversation {
            members: vec![member("b", true, false), member("a", false, true)],
        };
        first.save("c1", &mut e, next.clone()).await.unwrap();
        drop(e);

        let second = store(&path, Duration::from_secs(3600)).await;
        assert_eq!(second.lock("c1").await.unwrap().state, next);
        assert_eq!(second.lock("other").await.unwrap().state, Conversation::default());
    }

    #[tokio::test]
    async fn an_idle_conversation_is_forgotten_after_the_ttl() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let ttl = Duration::from_millis(200);
        let s = store(&path, ttl).await;
        let mut e = s.lock("c1").await.unwrap();
        s.save(
            "c1",
            &mut e,
            Conversation {
                members: vec![member("a", true, false)],
            },
        )
        .await
        .unwrap();
        drop(e);
        assert_eq!(
            s.lock("c1").await.unwrap().state.members.len(),
            1,
            "still there within the TTL"
        );
        tokio::time::sleep(ttl * 2).await;
        assert_eq!(s.lock("c1").await.unwrap().state, Conversation::default());
        // A fresh store reading the same file agrees: the row was deleted.
        let again = store(&path, Duration::from_secs(3600)).await;
        assert_eq!(again.lock("c1").await.unwrap().state, Conversation::default());
    }

    #[tokio::test]
    async fn reset_forgets_a_conversation_in_memory_and_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let s = store(&path, Duration::from_secs(3600)).await;
        let mut e = s.lock("c1").await.unwrap();
        s.save(
            "c1",
            &mut e,
            Conversation {
                members: vec![member("a", true, false)],
            },
        )
        .await
        .unwrap();
        drop(e);
        s.reset("c1").await.unwrap();
        s.reset("never-seen").await.unwrap();
        assert_eq!(s.lock("c1").await.unwrap().state, Conversation::default());
        let again = store(&path, Duration::from_secs(3600)).await;
        assert_eq!(again.lock("c1").await.unwrap().state, Conversation::default());
    }

    #[tokio::test]
    async fn upkeep_flushes_the_idle_clock_without_touching_unchanged_conversations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let s = store(&path, Duration::from_secs(3600)).await;
        let mut e = s.lock("c1").await.unwrap();
        s.save(
            "c1",
            &mut e,
            Conversation {
                members: vec![member("a", true, false)],
            },
        )
        .await
        .unwrap();
        let saved_at = e.last_seen;
        drop(e);
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(s.lock("c1").await.unwrap());
        let db = Db::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        assert_eq!(
            db.load_conversation("c1").await.unwrap().unwrap().0,
            saved_at,
            "a lock alone writes nothing"
        );
        s.maintain().await.unwrap();
        assert!(
            db.load_conversation("c1").await.unwrap().unwrap().0 > saved_at,
            "upkeep flushed the clock"
        );
    }
}
