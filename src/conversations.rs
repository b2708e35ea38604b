//! Conversations: the groups loaded and the domains hit per conversation, persisted to the
//! database before an operation answers, with a bounded in-memory cache in front (the
//! database stays the source of truth). The idle clock lives in memory and is flushed lazily
//! by [`Conversations::maintain`], so a `Route` that changes nothing writes nothing. A
//! conversation the cache drops to save memory leaves its unflushed clock behind (see
//! [`Clocks`]), so a conversation in use is never forgotten for being out of the cache.
//!
//! **Several daemons (PostgreSQL).** Another daemon may change a conversation this one
//! caches, so each call first reads the conversation's version and latest recorded use (one
//! small read) and re-reads the conversation when the version moved; its idle time counts
//! from the latest use any daemon recorded. Another daemon may still write between that read
//! and this call's write, so a write names the version it builds on and happens only on top
//! of it; when it finds another, the call re-reads the conversation and decides again
//! ([`ConversationGuard::update`]). Calls on one conversation thus take effect one after
//! the other across daemons, each answered on the state it recorded on top of. When the
//! database cannot be reached, a call goes on with the copy it holds.
//!
//! **One entry per conversation.** The lock that serialises operations on a conversation is
//! the entry's own mutex, so two live entries for one id would let an operation read the
//! database before another's commit and keep that stale copy. The cache may evict an entry
//! while a call still holds it; a table of live entries (weak references, not owned by the
//! cache) hands the next call that same entry instead of a fresh read. An entry is read from
//! the database only under its lock and only when no other copy is alive, so whatever it
//! reads includes every acknowledged write.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use moka::future::Cache;
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::db::{Db, Saved, Session, StoredConversation};
use crate::error::{Error, Result};
use crate::router::{Conversation, Mark, Member};

/// Default memory budget of the conversation cache: 64 MiB, about 120,000 conversations with
/// short ids (see BENCHMARKS.md for the measured resident memory).
pub(crate) const DEFAULT_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// How often conversation idle clocks are flushed and idle conversations forgotten, at most.
const UPKEEP_PERIOD: Duration = Duration::from_secs(60);

/// How many times one call tries to record on a conversation that other daemons keep
/// changing under it (PostgreSQL), re-reading it each time, before it gives up. Each lost try
/// is another daemon's write that went through, so a call gives up only while others record.
const MAX_ATTEMPTS: u32 = 8;

/// The upkeep period for a conversation TTL: [`UPKEEP_PERIOD`], or a quarter of a shorter
/// TTL (100 ms at least). Idle clocks live in memory between flushes, and another daemon on
/// the same database forgets a conversation by the clock written there: a flush must come
/// well within the TTL, or a conversation in use on one daemon looks idle to the others.
pub(crate) fn upkeep_period(conversation_ttl: Duration) -> Duration {
    UPKEEP_PERIOD
        .min(conversation_ttl / 4)
        .max(Duration::from_millis(100))
}

/// Memory a cached conversation costs beyond its id and members: the cache's own bookkeeping,
/// the entry and its lock, and its slot in the live table. Measured: 200,000 conversations
/// with 16-byte ids, all cached, cost 550 bytes each in resident memory (BENCHMARKS.md).
const ENTRY_OVERHEAD_BYTES: usize = 530;

/// The live table is swept of dead entries when it grows past this (and then past twice
/// what the sweep left), so sweeping costs O(1) per new entry.
const MIN_SWEEP_AT: usize = 1024;

/// One conversation in memory.
#[derive(Debug, Default)]
struct Entry {
    /// What the conversation remembers.
    state: Conversation,
    /// Unix ms of the last `Route` or `LoadToolGroup`.
    last_seen: i64,
    /// The last-seen time the database holds.
    flushed: i64,
    /// Whether the database has a row for it (a conversation that never changed has none).
    in_db: bool,
    /// Whether `state` was read from the database (a new entry is read under its lock).
    loaded: bool,
    /// The database generation it was read from; a replaced database file means re-reading.
    generation: u64,
    /// The version of the row it matches (PostgreSQL; 0 on SQLite).
    version: i64,
    /// Set while a write is in flight: if the operation is cancelled (client gone, request
    /// timeout) the write may or may not have committed, so the next lock re-reads it.
    unsure: bool,
}

/// A conversation as the database holds it (empty when it has no row).
async fn read(session: &Session, generation: u64, id: &str) -> Result<Entry> {
    Ok(match session.load_conversation(id).await? {
        Some(StoredConversation {
            last_seen,
            version,
            members,
        }) => Entry {
            state: Conversation { members },
            last_seen,
            flushed: last_seen,
            in_db: true,
            loaded: true,
            generation,
            version,
            unsure: false,
        },
        None => Entry {
            generation,
            loaded: true,
            ..Entry::default()
        },
    })
}

/// Brings a cached conversation up to date with what other daemons wrote: one small read of
/// its version and latest use, and a full re-read only when the version moved (or the row
/// appeared or went). When the database cannot be reached the copy serves as it is.
async fn check(session: &Session, entry: &mut Entry, id: &str) -> Result<()> {
    match session.conversation_stamp(id).await {
        Ok(Some(stamp)) if entry.in_db && stamp.version == entry.version => {
            entry.last_seen = entry.last_seen.max(stamp.last_seen);
            entry.flushed = entry.flushed.max(stamp.last_seen);
        }
        Ok(None) if !entry.in_db => {}
        Ok(_) => {
            // Another daemon's change: its state, and the later of the two uses.
            let seen = entry.last_seen;
            reread(session, entry, entry.generation, id, Some(seen)).await?;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot check the conversation; using the copy held in memory");
        }
    }
    Ok(())
}

/// Replaces `entry` with the conversation as stored, keeping the later of the stored use and
/// `held`: a use a copy held that the database may not (the clock is written at upkeep, and a
/// failed or raced write leaves it unwritten) still counts, or a conversation in use could
/// look idle. On an error `entry` is unchanged.
async fn reread(
    session: &Session,
    entry: &mut Entry,
    generation: u64,
    id: &str,
    held: Option<i64>,
) -> Result<()> {
    *entry = read(session, generation, id).await?;
    if let Some(seen) = held {
        entry.last_seen = entry.last_seen.max(seen);
    }
    Ok(())
}

/// Estimated bytes a cached conversation holds.
fn weight(id: &str, state: &Conversation) -> u32 {
    let members: usize = state
        .members
        .iter()
        .map(|m| std::mem::size_of::<Member>() + m.domain.len())
        .sum();
    u32::try_from(ENTRY_OVERHEAD_BYTES + id.len() + members).unwrap_or(u32::MAX)
}

/// A cache slot: the shared entry and its weight when it was (re)inserted.
#[derive(Clone)]
struct Cached {
    entry: Arc<Mutex<Entry>>,
    weight: u32,
}

/// Every entry still alive, cached or held by a call, by id.
#[derive(Default)]
struct Live {
    entries: HashMap<Arc<str>, Weak<Mutex<Entry>>>,
    sweep_at: usize,
}

/// The idle clocks (Unix ms of the last use) of conversations the cache dropped to save
/// memory before their clock was written, by id: the next upkeep writes them, and a call that
/// reads such a conversation back from the database takes its clock from here, so its idle
/// time still counts from its last use.
#[derive(Clone, Default)]
struct Clocks(Arc<std::sync::Mutex<HashMap<Arc<str>, i64>>>);

impl Clocks {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, i64>> {
        // A poisoned lock means a panic while holding it; every step leaves the map whole.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `entry`'s clock when the database does not have it yet.
    fn keep(&self, id: &Arc<str>, entry: &Entry) {
        if entry.in_db && entry.last_seen > entry.flushed {
            let mut map = self.map();
            let kept = map.entry(id.clone()).or_insert(entry.last_seen);
            *kept = (*kept).max(entry.last_seen);
        }
    }

    /// The clock kept for `id`, removed.
    fn take(&self, id: &str) -> Option<i64> {
        self.map().remove(id)
    }
}

/// A locked conversation, for one call: what it remembers, and the one way to change it.
/// Dropping it unlocks it.
pub(crate) struct ConversationGuard {
    entry: OwnedMutexGuard<Entry>,
    /// A dry lock of a conversation idle past the TTL: it answers as a forgotten one, and
    /// its entry is left as it was (a dry run records nothing).
    seen_as_forgotten: bool,
    id: Arc<str>,
    /// The call's database session (the file was checked when it was locked).
    session: Session,
    cache: Cache<Arc<str>, Cached>,
    clocks: Clocks,
}

impl Drop for ConversationGuard {
    /// An entry the cache dropped while this call held it (the eviction could not read it
    /// then) leaves its clock behind now.
    fn drop(&mut self) {
        if self.entry.last_seen > self.entry.flushed && !self.cache.contains_key(&self.id) {
            self.clocks.keep(&self.id, &self.entry);
        }
    }
}

impl ConversationGuard {
    /// What the conversation remembers.
    pub fn state(&self) -> &Conversation {
        /// A forgotten conversation's state.
        static FORGOTTEN: Conversation = Conversation { members: Vec::new() };
        if self.seen_as_forgotten {
            &FORGOTTEN
        } else {
            &self.entry.state
        }
    }

    /// Decides on what the conversation remembers and records `mark` on the domains the
    /// decision names: writes exactly the rows that change, then adopts them. Returns the
    /// decision, and whether recording it failed (the state is then unchanged, so nothing is
    /// acknowledged that was not written).
    ///
    /// `decide` must be pure: on PostgreSQL, when another daemon changed the conversation
    /// since this copy was read, nothing is written, the copy is re-read and the decision is
    /// made again on it, so what is returned is what was recorded on top of the other
    /// daemons' changes. A call that loses that race [`MAX_ATTEMPTS`] times in a row (each
    /// time to another daemon's write) gives up: `Unavailable`.
    pub(crate) async fn update<'a, T>(
        &mut self,
        mark: Mark,
        mut decide: impl FnMut(&Conversation) -> (T, Vec<&'a str>),
    ) -> (T, Result<()>) {
        debug_assert!(!self.seen_as_forgotten, "a dry lock records nothing");
        let mut attempt = 1;
        loop {
            let (decision, domains) = decide(&self.entry.state);
            let written = self.record(domains, mark).await;
            match written {
                Ok(true) => return (decision, Ok(())),
                Ok(false) if attempt < MAX_ATTEMPTS => attempt += 1,
                Ok(false) => {
                    let e = Error::Unavailable(format!(
                        "the conversation was changed by other daemons {MAX_ATTEMPTS} times while this call \
                         tried to record on it; try again"
                    ));
                    return (decision, Err(e));
                }
                Err(e) => return (decision, Err(e)),
            }
            // Another daemon's write came first: decide again on what it left.
            let (generation, held) = (self.entry.generation, self.entry.last_seen);
            if let Err(e) = reread(&self.session, &mut self.entry, generation, &self.id, Some(held)).await {
                return (decision, Err(e));
            }
        }
    }

    /// Records `mark` on these domains on top of the version this copy was read at; `false`
    /// when another daemon's write came first and nothing was written (see
    /// [`ConversationGuard::update`]).
    async fn record<'a>(&mut self, domains: impl IntoIterator<Item = &'a str>, mark: Mark) -> Result<bool> {
        let change = self.entry.state.change(domains, mark);
        if change.is_empty() {
            return Ok(true);
        }
        let entry = &mut *self.entry;
        entry.unsure = true;
        let expected = entry.in_db.then_some(entry.version);
        let saved = self
            .session
            .save_members(&self.id, entry.last_seen, &change.rows, expected)
            .await?;
        let Saved::Done(version) = saved else {
            // Still unsure: re-read before it is used again.
            return Ok(false);
        };
        entry.unsure = false;
        entry.version = version.unwrap_or(0);
        entry.state.apply(change);
        entry.in_db = true;
        entry.flushed = entry.last_seen;
        // The entry grew: put it back with its new weight.
        let weight = weight(&self.id, &entry.state);
        let shared = OwnedMutexGuard::mutex(&self.entry).clone();
        self.cache
            .insert(
                self.id.clone(),
                Cached {
                    entry: shared,
                    weight,
                },
            )
            .await;
        Ok(true)
    }
}

/// The conversation store.
#[derive(Clone)]
pub struct Conversations {
    db: Db,
    ttl: Duration,
    /// How much longer than the TTL a stored clock must be idle before this daemon forgets
    /// the conversation: on a database several daemons share, one upkeep period (another
    /// daemon writes a use at its next upkeep, so until then the stored clock is that much
    /// behind); none on a daemon's own database.
    grace: Duration,
    cache: Cache<Arc<str>, Cached>,
    /// Not owned by the cache: it only holds weak references, so an evicted entry lives
    /// exactly as long as some call holds it.
    live: Arc<std::sync::Mutex<Live>>,
    clocks: Clocks,
}

/// Unix milliseconds now.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Conversations {
    /// A store over `db`; conversations idle longer than `ttl` are forgotten, and the cache
    /// keeps about `capacity_bytes` of them in memory (least used first out).
    pub fn new(db: Db, ttl: Duration, capacity_bytes: u64) -> Conversations {
        // Time-to-idle equal to the conversation TTL: a cached entry expires exactly when its
        // conversation would.
        let clocks = Clocks::default();
        let kept = clocks.clone();
        let cache = Cache::builder()
            .max_capacity(capacity_bytes)
            .weigher(|_: &Arc<str>, c: &Cached| c.weight)
            .time_to_idle(ttl)
            // Dropped to save memory: its clock stays behind. (Expired means idle for the
            // TTL already; replaced and invalidated entries are still, or no longer, in use.)
            .eviction_listener(move |id: Arc<Arc<str>>, c: Cached, cause| {
                if cause == moka::notification::RemovalCause::Size
                    && let Ok(entry) = c.entry.try_lock()
                {
                    kept.keep(&id, &entry);
                }
            })
            .build();
        let grace = if db.shared() {
            upkeep_period(ttl)
        } else {
            Duration::ZERO
        };
        Conversations {
            db,
            ttl,
            grace,
            cache,
            live: Arc::default(),
            clocks,
        }
    }

    /// The clock before which a stored conversation is idle past the TTL (and the grace for
    /// uses other daemons have not written yet), at `now`.
    fn idle_cutoff(&self, now: i64) -> i64 {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        now.saturating_sub(ms(self.ttl)).saturating_sub(ms(self.grace))
    }

    /// The one live entry for `id`: the cached one, else one a call still holds, else a new
    /// one not yet read; with the key to cache it under when it is not cached.
    async fn entry(&self, id: &str) -> (Arc<Mutex<Entry>>, Option<Arc<str>>) {
        if let Some(c) = self.cache.get(id).await {
            return (c.entry, None);
        }
        // A poisoned lock means a panic while holding it, and the table is consistent at
        // every step, so the data is still good.
        let mut live = self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((key, weak)) = live.entries.get_key_value(id)
            && let Some(entry) = weak.upgrade()
        {
            return (entry, Some(key.clone()));
        }
        if live.entries.len() >= live.sweep_at {
            live.entries.retain(|_, w| w.strong_count() > 0);
            live.sweep_at = (live.entries.len() * 2).max(MIN_SWEEP_AT);
        }
        let key: Arc<str> = Arc::from(id);
        let entry = Arc::new(Mutex::new(Entry::default()));
        live.entries.insert(key.clone(), Arc::downgrade(&entry));
        (entry, Some(key))
    }

    /// The state this daemon holds for a conversation, read from the database in use (not
    /// one a replaced file held), for answering while the database cannot be used (SPEC §12);
    /// `None` when it holds none.
    pub async fn held(&self, id: &str) -> Option<Conversation> {
        let cached = self.cache.get(id).await?;
        let entry = cached.entry.lock().await;
        (entry.loaded && entry.generation == self.db.generation()).then(|| entry.state.clone())
    }

    /// Locks a conversation for one call, loading it from the database and forgetting it
    /// first if it has been idle past the TTL. The idle clock restarts now.
    ///
    /// # Errors
    /// A database fault while loading or forgetting it.
    pub async fn lock(&self, id: &str) -> Result<ConversationGuard> {
        self.lock_for(id, true).await
    }

    /// As [`Conversations::lock`], for a call that records nothing about the conversation
    /// (a `dry_run`, SPEC §4): its idle clock is left where it was.
    ///
    /// # Errors
    /// As [`Conversations::lock`].
    pub async fn lock_dry(&self, id: &str) -> Result<ConversationGuard> {
        self.lock_for(id, false).await
    }

    async fn lock_for(&self, id: &str, used: bool) -> Result<ConversationGuard> {
        // A replaced database file is noticed here, before the cached entry is trusted.
        let session = self.db.session().await?;
        let (entry, uncached) = self.entry(id).await;
        let mut guard = entry.clone().lock_owned().await;
        let generation = self.db.generation();
        if !guard.loaded || guard.unsure || guard.generation != generation {
            // A use this copy of this database holds still counts after the re-read.
            let held = (guard.loaded && guard.generation == generation).then_some(guard.last_seen);
            match reread(&session, &mut guard, generation, id, held).await {
                Ok(()) => {
                    // A use the cache dropped before it was written.
                    if let Some(seen) = self.clocks.take(id) {
                        guard.last_seen = guard.last_seen.max(seen);
                    }
                }
                // Unsure of a copy of this database only because a write failed (it was
                // never adopted) or raced another daemon's: while the database cannot be
                // read, that copy is the state held (SPEC §12), as when a check fails.
                Err(e) if guard.loaded && guard.generation == generation => {
                    tracing::warn!(error = %e, "cannot re-read the conversation; using the copy held in memory");
                }
                Err(e) => return Err(e),
            }
        } else if self.db.shared() {
            check(&session, &mut guard, id).await?;
        }
        let now = now_ms();
        let cutoff = self.idle_cutoff(now);
        let idle = guard.in_db && guard.last_seen < cutoff;
        // A dry run records nothing, not even forgetting: it sees the conversation as
        // forgotten and leaves it, and its copy, as they are for the next call that records
        // (which forgets it, unless upkeep did first).
        let seen_as_forgotten = idle && !used;
        if idle && used {
            if session.forget_idle_conversation(id, cutoff).await? {
                *guard = Entry {
                    generation,
                    loaded: true,
                    ..Entry::default()
                };
            } else {
                // Another daemon recorded a use meanwhile: it is not idle after all.
                *guard = read(&session, generation, id).await?;
            }
        }
        if used {
            guard.last_seen = now;
        }
        let key = match uncached {
            Some(key) => {
                let weight = weight(id, &guard.state);
                self.cache.insert(key.clone(), Cached { entry, weight }).await;
                key
            }
            None => Arc::from(id),
        };
        Ok(ConversationGuard {
            entry: guard,
            seen_as_forgotten,
            id: key,
            session,
            cache: self.cache.clone(),
            clocks: self.clocks.clone(),
        })
    }

    /// Conversations held in memory now.
    pub(crate) async fn cached(&self) -> u64 {
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
        let (entry, _) = self.entry(id).await;
        let mut guard = entry.lock_owned().await;
        self.db.session().await?.delete_conversation(id).await?;
        // Re-read on next use (it has no row now, so that costs one empty read).
        *guard = Entry::default();
        self.clocks.take(id);
        self.cache.invalidate(id).await;
        Ok(())
    }

    /// Flushes the idle clocks that moved (also those the cache left behind) and forgets
    /// conversations idle past the TTL.
    ///
    /// # Errors
    /// A database fault.
    pub(crate) async fn maintain(&self) -> Result<()> {
        // Idle as of now, before the clocks are written: a call that uses a conversation
        // after this finds it either idle past this cutoff (and forgets it itself) or with
        // a stored clock at or past it, however long upkeep then waits on a call.
        let cutoff = self.idle_cutoff(now_ms());
        let session = self.db.session().await?;
        // The clocks the cache left behind, and those of the conversations it holds whose
        // clock moved: the latter as the loop meets them, or once the call holding one is
        // done (below).
        let left: Vec<(Arc<str>, i64)> = self.clocks.map().iter().map(|(id, &t)| (id.clone(), t)).collect();
        let mut in_use: Vec<(Arc<str>, Arc<Mutex<Entry>>)> = Vec::new();
        let mut due: Vec<(Arc<str>, Arc<Mutex<Entry>>, i64)> = Vec::new();
        for (id, cached) in self.cache.iter() {
            let entry = &cached.entry;
            let Ok(e) = entry.try_lock() else {
                in_use.push(((*id).clone(), entry.clone()));
                continue;
            };
            if e.in_db && e.last_seen > e.flushed {
                due.push(((*id).clone(), entry.clone(), e.last_seen));
            }
        }
        // The conversations calls hold (cached or not): a call's clock may be newer than the
        // stored one, which the delete below reads (a call waiting on a locked database file
        // for long enough saw its conversation's earlier groups deleted under it). Each
        // one's clock is written once its call is done, before the delete.
        let held: Vec<(Arc<str>, Arc<Mutex<Entry>>)> = self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entries
            .iter()
            .filter_map(|(id, weak)| Some((id.clone(), weak.upgrade()?)))
            .filter(|(_, entry)| entry.try_lock().is_err())
            .collect();
        for (id, entry) in held {
            if !in_use.iter().any(|(_, e)| Arc::ptr_eq(e, &entry)) {
                in_use.push((id, entry));
            }
        }
        for (id, entry) in in_use {
            let seen = {
                let e = entry.lock().await;
                (e.in_db && e.last_seen > e.flushed).then_some(e.last_seen)
            };
            if let Some(seen) = seen {
                due.push((id, entry, seen));
            }
        }
        let clocks: Vec<(&str, i64)> = left
            .iter()
            .map(|(id, seen)| (&**id, *seen))
            .chain(due.iter().map(|(id, _, seen)| (&**id, *seen)))
            .collect();
        session.touch_conversations(&clocks).await?;
        {
            let mut map = self.clocks.map();
            for (id, seen) in &left {
                if map.get(id).is_some_and(|&t| t <= *seen) {
                    map.remove(id);
                }
            }
        }
        for (_, entry, seen) in due {
            // One a call holds again by now is flushed again next time, at worst.
            if let Ok(mut e) = entry.try_lock() {
                e.flushed = e.flushed.max(seen);
            }
        }
        session.delete_idle_conversations(cutoff).await?;
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

    /// Loads `a`, as `LoadToolGroup` does.
    async fn load_a(s: &Conversations, id: &str) -> i64 {
        let mut e = s.lock(id).await.unwrap();
        e.record(["a"], Mark::Loaded).await.unwrap();
        e.entry.last_seen
    }

    #[tokio::test]
    async fn a_reopened_store_finds_the_state_intact() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let first = store(&path, Duration::from_secs(3600)).await;
        let mut e = first.lock("c1").await.unwrap();
        e.record(["b"], Mark::Loaded).await.unwrap();
        e.record(["a", "b"], Mark::Hit).await.unwrap();
        drop(e);
        let next = Conversation {
            members: vec![member("b", true, true), member("a", false, true)],
        };

        let second = store(&path, Duration::from_secs(3600)).await;
        assert_eq!(second.lock("c1").await.unwrap().state(), &next);
        assert_eq!(
            second.lock("other").await.unwrap().state(),
            &Conversation::default()
        );
    }

    #[tokio::test]
    async fn an_idle_conversation_is_forgotten_after_the_ttl() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let ttl = Duration::from_millis(200);
        let s = store(&path, ttl).await;
        load_a(&s, "c1").await;
        assert_eq!(
            s.lock("c1").await.unwrap().state().members.len(),
            1,
            "still there within the TTL"
        );
        tokio::time::sleep(ttl * 2).await;
        assert_eq!(s.lock("c1").await.unwrap().state(), &Conversation::default());
        // A fresh store reading the same file agrees: the row was deleted.
        let again = store(&path, Duration::from_secs(3600)).await;
        assert_eq!(again.lock("c1").await.unwrap().state(), &Conversation::default());
    }

    #[tokio::test]
    async fn a_dry_lock_leaves_the_idle_clock_and_an_idle_conversation_as_they_were() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let ttl = Duration::from_secs(1);
        let s = store(&path, ttl).await;
        let saved_at = load_a(&s, "c1").await;
        tokio::time::sleep(ttl / 2).await;
        let e = s.lock_dry("c1").await.unwrap();
        assert_eq!(e.entry.last_seen, saved_at);
        assert_eq!(e.state().members.len(), 1, "still there within the TTL");
        drop(e);
        tokio::time::sleep(ttl * 2 / 3).await;
        // Idle since the load, the dry lock notwithstanding: a dry lock answers as if it was
        // forgotten, and forgets nothing itself (SPEC §4: it records nothing).
        let stored = async || {
            s.db.session()
                .await
                .unwrap()
                .load_conversation("c1")
                .await
                .unwrap()
        };
        assert_eq!(s.lock_dry("c1").await.unwrap().state(), &Conversation::default());
        assert!(
            stored().await.is_some(),
            "a dry lock deleted the idle conversation"
        );
        assert_eq!(s.lock("c1").await.unwrap().state(), &Conversation::default());
        assert_eq!(stored().await, None, "the next call forgets it");
    }

    #[tokio::test]
    async fn a_conversation_in_use_outlives_the_ttl_out_of_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let ttl = Duration::from_secs(1);
        // No room for any entry: every conversation is dropped from the cache at once.
        let s = store(&path, ttl).await;
        let saved_at = load_a(&s, "c1").await;
        for _ in 0..3 {
            tokio::time::sleep(ttl / 2).await;
            let e = s.lock("c1").await.unwrap();
            assert_eq!(e.state().members.len(), 1, "forgotten while in use");
            drop(e);
            s.cache.run_pending_tasks().await;
        }
        assert_eq!(s.cached().await, 0, "the test needs it out of the cache");
        // Upkeep writes the clock the cache left behind, and deletes nothing in use.
        s.maintain().await.unwrap();
        let db = Db::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap()
            .session()
            .await
            .unwrap();
        let stored = db.load_conversation("c1").await.unwrap().expect("kept");
        assert!(stored.last_seen > saved_at + 1_000, "the last use was written");
    }

    #[tokio::test]
    async fn a_use_held_in_memory_outlives_a_re_read_after_a_write_that_may_have_failed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let ttl = Duration::from_secs(1);
        // Room in the cache: the copy stays cached (one the cache drops leaves its clock
        // behind on its own way).
        let db = Db::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        let s = Conversations::new(db, ttl, 1 << 20);
        load_a(&s, "c1").await;
        tokio::time::sleep(ttl * 3 / 5).await;
        {
            // A use (its clock held in memory until upkeep), then a write that failed or
            // was cancelled, which leaves the copy to be re-read.
            let mut e = s.lock("c1").await.unwrap();
            e.entry.unsure = true;
        }
        tokio::time::sleep(ttl * 3 / 5).await;
        // The stored clock (the load's) is past the TTL; the last use is not.
        assert_eq!(
            s.lock("c1").await.unwrap().state().members,
            vec![member("a", true, false)],
            "forgotten within the TTL of its last use"
        );
    }

    #[tokio::test]
    async fn upkeep_deletes_nothing_a_call_holds_while_its_stored_clock_is_old() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let ttl = Duration::from_secs(1);
        let s = Arc::new(store(&path, ttl).await);
        load_a(&s, "c1").await;
        tokio::time::sleep(ttl * 3 / 5).await;
        // A call takes the conversation (a use, within the TTL) and is slow to finish, as
        // one waiting on a locked database file is; meanwhile the stored clock (the load's)
        // passes the TTL and upkeep runs.
        let mut e = s.lock("c1").await.unwrap();
        tokio::time::sleep(ttl * 3 / 5).await;
        let upkeep = tokio::spawn({
            let s = s.clone();
            async move { s.maintain().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        e.record(["b"], Mark::Loaded).await.unwrap();
        drop(e);
        upkeep.await.unwrap().unwrap();
        let again = store(&path, Duration::from_secs(3600)).await;
        assert_eq!(
            again.lock("c1").await.unwrap().state(),
            &Conversation {
                members: vec![member("a", true, false), member("b", true, false)],
            },
            "the load before the slow call survives"
        );
    }

    #[tokio::test]
    async fn upkeep_waiting_on_one_call_deletes_nothing_used_while_it_waited() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let ttl = Duration::from_secs(1);
        let s = Arc::new(store(&path, ttl).await);
        load_a(&s, "used").await;
        tokio::time::sleep(ttl * 2 / 5).await;
        // A slow call on another conversation holds upkeep up after it wrote the clocks;
        // meanwhile `used` is used again (within the TTL of its stored clock, the load's),
        // and that stored clock passes the TTL before upkeep deletes.
        let slow = s.lock("slow").await.unwrap();
        let upkeep = tokio::spawn({
            let s = s.clone();
            async move { s.maintain().await }
        });
        tokio::time::sleep(ttl * 2 / 5).await;
        drop(s.lock("used").await.unwrap());
        tokio::time::sleep(ttl * 2 / 5).await;
        drop(slow);
        upkeep.await.unwrap().unwrap();
        let again = store(&path, Duration::from_secs(3600)).await;
        assert_eq!(
            again.lock("used").await.unwrap().state(),
            &Conversation {
                members: vec![member("a", true, false)],
            },
            "the load of a conversation used within its TTL survives upkeep"
        );
    }

    #[tokio::test]
    async fn reset_forgets_a_conversation_in_memory_and_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let s = store(&path, Duration::from_secs(3600)).await;
        load_a(&s, "c1").await;
        s.reset("c1").await.unwrap();
        s.reset("never-seen").await.unwrap();
        assert_eq!(s.lock("c1").await.unwrap().state(), &Conversation::default());
        let again = store(&path, Duration::from_secs(3600)).await;
        assert_eq!(again.lock("c1").await.unwrap().state(), &Conversation::default());
    }

    #[tokio::test]
    async fn upkeep_flushes_the_idle_clock_without_touching_unchanged_conversations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let s = store(&path, Duration::from_secs(3600)).await;
        let saved_at = load_a(&s, "c1").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(s.lock("c1").await.unwrap());
        let db = Db::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap()
            .session()
            .await
            .unwrap();
        assert_eq!(
            db.load_conversation("c1").await.unwrap().unwrap().last_seen,
            saved_at,
            "a lock alone writes nothing"
        );
        s.maintain().await.unwrap();
        assert!(
            db.load_conversation("c1").await.unwrap().unwrap().last_seen > saved_at,
            "upkeep flushed the clock"
        );
    }

    #[tokio::test]
    async fn a_record_writes_only_the_rows_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let s = store(&path, Duration::from_secs(3600)).await;
        let mut e = s.lock("c1").await.unwrap();
        e.record(["a", "b"], Mark::Hit).await.unwrap();
        drop(e);
        // Another writer changes `a` behind the cache's back; a record that changes only
        // `b` must not write `a`'s row again (flags only turn on, so it would not undo it,
        // but it would not be exactly the change either). Seen through the database.
        let other = Db::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap()
            .session()
            .await
            .unwrap();
        other
            .save_members("c1", 0, &[(0, member("a", true, true))], None)
            .await
            .unwrap();
        let mut e = s.lock("c1").await.unwrap();
        e.record(["b", "a"], Mark::Hit).await.unwrap();
        assert_eq!(
            e.state().members,
            vec![member("a", false, true), member("b", false, true)]
        );
        e.record(["b"], Mark::Loaded).await.unwrap();
        drop(e);
        let members = other.load_conversation("c1").await.unwrap().unwrap().members;
        assert_eq!(members, vec![member("a", true, true), member("b", true, true)]);
    }

    #[test]
    fn upkeep_comes_well_within_the_conversation_ttl() {
        let s = Duration::from_secs;
        let cases = [
            (s(24 * 3600), s(60)),
            (s(240), s(60)),
            (s(120), s(30)),
            (s(10), Duration::from_millis(2500)),
            (Duration::from_millis(100), Duration::from_millis(100)),
        ];
        for (ttl, want) in cases {
            assert_eq!(upkeep_period(ttl), want, "ttl {ttl:?}");
        }
    }

    /// Two daemons' stores on one fresh PostgreSQL database; `None` without a test server.
    async fn replicas(ttl: Duration) -> Option<(Conversations, Conversations)> {
        replicas_on(ttl).await.map(|(_, a, b)| (a, b))
    }

    /// [`replicas`], with the database's URL.
    async fn replicas_on(ttl: Duration) -> Option<(String, Conversations, Conversations)> {
        let admin = crate::db::testing::postgres_url()?;
        let url = crate::db::testing::fresh_postgres_database(&admin).await;
        let a = Conversations::new(Db::connect(&url).await.unwrap(), ttl, 1 << 20);
        let b = Conversations::new(Db::connect(&url).await.unwrap(), ttl, 1 << 20);
        Some((url, a, b))
    }

    /// Each row: what another daemon does to a conversation (which held `a` loaded) while
    /// this one holds its copy, read and checked current; what this one then records; and
    /// the state stored after. The write finds the other daemon's, so the call decides again
    /// on the state that daemon left: its answer and what every daemon then reads agree.
    #[tokio::test]
    async fn on_postgres_a_call_records_on_top_of_what_another_daemon_wrote_meanwhile() {
        let Some((a, b)) = replicas(Duration::from_secs(3600)).await else {
            return;
        };
        type Marks = &'static [(&'static str, Mark)];
        type Members = &'static [(&'static str, bool, bool)];
        // (case, what the other daemon records, whether it then resets, what this one
        // records, what is stored after)
        type Case = (&'static str, Marks, bool, (&'static str, Mark), Members);
        let cases: [Case; 4] = [
            (
                "domains another daemon added join first",
                &[("zeta", Mark::Hit), ("eta", Mark::Hit)],
                false,
                ("beta", Mark::Hit),
                &[
                    ("a", true, false),
                    ("zeta", false, true),
                    ("eta", false, true),
                    ("beta", false, true),
                ],
            ),
            (
                "a group another daemon loaded is loaded already",
                &[("x", Mark::Loaded)],
                false,
                ("x", Mark::Loaded),
                &[("a", true, false), ("x", true, false)],
            ),
            (
                "a reset conversation stays reset: a hit brings no load back",
                &[],
                true,
                ("a", Mark::Hit),
                &[("a", false, true)],
            ),
            (
                "a reset conversation takes a load from empty",
                &[],
                true,
                ("y", Mark::Loaded),
                &[("y", true, false)],
            ),
        ];
        for (n, (case, meanwhile, reset, (name, mark), want)) in cases.into_iter().enumerate() {
            let id = format!("c{n}");
            load_a(&a, &id).await;
            let mut held = b.lock(&id).await.unwrap();
            assert_eq!(held.state().members, vec![member("a", true, false)], "{case}");
            // What the other daemon leaves, as this one will read it.
            let mut left = held.state().clone();
            for &(other, mark) in meanwhile {
                assert!(
                    a.lock(&id).await.unwrap().record([other], mark).await.unwrap(),
                    "{case}"
                );
                left.apply(left.change([other], mark));
            }
            if reset {
                a.reset(&id).await.unwrap();
                left = Conversation::default();
            }
            let mut decisions = 0;
            let (decided_on, recorded) = held
                .update(mark, |state| {
                    decisions += 1;
                    (state.clone(), vec![name])
                })
                .await;
            recorded.unwrap();
            assert_eq!(decisions, 2, "{case}: decided again once");
            assert_eq!(decided_on, left, "{case}: on the state the other daemon left");
            let want: Vec<Member> = want.iter().map(|&(d, l, h)| member(d, l, h)).collect();
            let stored =
                b.db.session()
                    .await
                    .unwrap()
                    .load_conversation(&id)
                    .await
                    .unwrap();
            assert_eq!(stored.map(|s| s.members).unwrap_or_default(), want, "{case}");
            assert_eq!(
                held.state().members,
                want,
                "{case}: the copy held is what is stored"
            );
            drop(held);
            assert_eq!(
                a.lock(&id).await.unwrap().state().members,
                want,
                "{case}: on the other daemon"
            );
        }
    }

    /// A call the other daemons keep beating to the write gives up after [`MAX_ATTEMPTS`]
    /// decisions, with the state it last read, and writes nothing of its own.
    #[tokio::test]
    async fn on_postgres_a_call_that_keeps_losing_the_race_gives_up_unavailable() {
        let Some((url, a, b)) = replicas_on(Duration::from_secs(3600)).await else {
            return;
        };
        load_a(&a, "c1").await;
        let mut held = b.lock("c1").await.unwrap();
        let mut decisions = 0;
        let (_, recorded) = held
            .update(Mark::Hit, |_| {
                decisions += 1;
                // Another daemon writes between every decision and its write (on its own
                // runtime: this one waits for it).
                let (url, name) = (url.clone(), format!("other{decisions}"));
                std::thread::spawn(move || {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                        .block_on(async {
                            let s = Db::connect(&url).await.unwrap().session().await.unwrap();
                            let read = s.conversation_stamp("c1").await.unwrap().map(|s| s.version);
                            let row = [(usize::MAX, member(&name, false, true))];
                            let saved = s.save_members("c1", 0, &row, read).await.unwrap();
                            assert!(matches!(saved, Saved::Done(_)), "{saved:?}");
                        });
                })
                .join()
                .unwrap();
                ((), vec!["mine"])
            })
            .await;
        let err = recorded.unwrap_err();
        assert_eq!(decisions, MAX_ATTEMPTS);
        assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
        assert!(err.to_string().contains("try again"), "{err}");
        drop(held);
        let members = a.lock("c1").await.unwrap().state().members.clone();
        assert_eq!(members.len(), 1 + MAX_ATTEMPTS as usize);
        assert!(members.iter().all(|m| m.domain != "mine"), "{members:?}");
    }

    #[tokio::test]
    async fn on_postgres_a_change_on_one_daemon_is_seen_by_another_that_cached_it() {
        let Some((a, b)) = replicas(Duration::from_secs(3600)).await else {
            return;
        };
        assert_eq!(b.lock("c1").await.unwrap().state(), &Conversation::default());
        load_a(&a, "c1").await;
        assert_eq!(
            b.lock("c1").await.unwrap().state().members,
            vec![member("a", true, false)]
        );
        // b writes from a stale copy: a loaded `c` meanwhile. Nothing is lost either way,
        // and b's next call sees both.
        let mut e = a.lock("c1").await.unwrap();
        e.record(["c"], Mark::Loaded).await.unwrap();
        drop(e);
        let mut e = b.lock("c1").await.unwrap();
        e.record(["b"], Mark::Hit).await.unwrap();
        drop(e);
        let mut domains: Vec<String> = b
            .lock("c1")
            .await
            .unwrap()
            .state()
            .members
            .iter()
            .map(|m| m.domain.clone())
            .collect();
        domains.sort();
        assert_eq!(domains, ["a", "b", "c"]);
        a.reset("c1").await.unwrap();
        assert_eq!(b.lock("c1").await.unwrap().state(), &Conversation::default());
    }

    #[tokio::test]
    async fn on_postgres_idle_time_counts_from_the_latest_use_any_daemon_recorded() {
        let ttl = Duration::from_millis(600);
        let Some((a, b)) = replicas(ttl).await else {
            return;
        };
        load_a(&a, "c1").await;
        // b caches it, then only a keeps using it (and flushes its idle clock).
        drop(b.lock("c1").await.unwrap());
        for _ in 0..4 {
            tokio::time::sleep(ttl / 3).await;
            drop(a.lock("c1").await.unwrap());
            a.maintain().await.unwrap();
        }
        // b's own last use is older than the TTL; a's recorded one is not.
        assert_eq!(
            b.lock("c1").await.unwrap().state().members,
            vec![member("a", true, false)]
        );
    }

    /// A use another daemon holds in memory until its next upkeep keeps the conversation:
    /// the stored clock must be idle for the TTL and one upkeep period before a daemon
    /// forgets it by that clock alone.
    #[tokio::test]
    async fn on_postgres_a_use_not_yet_written_by_another_daemon_keeps_the_conversation() {
        let ttl = Duration::from_secs(4);
        let Some((a, b)) = replicas(ttl).await else {
            return;
        };
        load_a(&a, "c1").await;
        tokio::time::sleep(ttl * 9 / 10).await;
        // A use on b just within the TTL; b writes its clock at its next upkeep, not now.
        drop(b.lock("c1").await.unwrap());
        tokio::time::sleep(ttl * 3 / 20).await;
        // The stored clock (the load's) is past the TTL, by less than the grace.
        assert_eq!(
            a.lock("c1").await.unwrap().state().members,
            vec![member("a", true, false)],
            "forgotten a moment after a use on another daemon"
        );
        // Once b writes its clock, that use counts for every daemon, as with any upkeep.
        b.maintain().await.unwrap();
        a.maintain().await.unwrap();
        assert_eq!(
            b.lock("c1").await.unwrap().state().members,
            vec![member("a", true, false)]
        );
    }
}
