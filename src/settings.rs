//! The settings snapshot: every row of the `settings` table, read at once and cached for the
//! TTL. `invalidate` re-reads at once (and, on PostgreSQL, tells every other daemon to);
//! without it a change becomes visible within one TTL, or, on PostgreSQL, as soon as the
//! notification the table's trigger sends arrives.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::db::{Db, NOTICE_RETRY, Notice, Topic, next_notices};
use crate::error::{Error, Result};
use crate::router::Snapshot;

struct Cached {
    snapshot: Arc<Snapshot>,
    /// When the table was last read, or last failed to be read: the next try is a TTL later.
    read_at: Instant,
    /// When `snapshot` was read: its age is what `DescribeServer` and the metrics report.
    good_at: Instant,
    /// Why the last read failed; `None` after a good read.
    failure: Option<Arc<str>>,
}

/// The TTL cache in front of the settings table. Readers never lock: they load the current
/// snapshot; only a stale read takes the refresh lock, and concurrent stale readers wait for
/// one re-read instead of each querying.
///
/// A failed re-read keeps the last good snapshot: routing goes on with it, the failure is
/// logged once per streak of failures, and the table is tried again each TTL.
///
/// On PostgreSQL a task follows the database's notifications and re-reads on each (several
/// waiting notifications make one re-read); the TTL stays the safety net for notifications
/// lost while the listening connection was down. The task ends with the cache.
pub(crate) struct SettingsCache {
    shared: Arc<Shared>,
    follower: Option<tokio::task::AbortHandle>,
}

struct Shared {
    db: Db,
    ttl: Duration,
    current: ArcSwap<Cached>,
    refresh: tokio::sync::Mutex<()>,
    /// Signalled after a re-read a notification caused, for whoever must pass the news on
    /// without waiting for a call (`WatchRegistry` streams).
    noticed: tokio::sync::Notify,
}

impl Drop for SettingsCache {
    fn drop(&mut self) {
        if let Some(follower) = &self.follower {
            follower.abort();
        }
    }
}

impl SettingsCache {
    /// Reads the table once and caches it; on PostgreSQL, starts following notifications.
    ///
    /// # Errors
    /// When the first read fails: there is no good snapshot to fall back on.
    pub async fn new(db: Db, ttl: Duration) -> Result<SettingsCache> {
        let notices = db.notices(Topic::Settings);
        SettingsCache::following(db, ttl, notices).await
    }

    /// As [`SettingsCache::new`], re-reading on each of `notices`.
    async fn following(
        db: Db,
        ttl: Duration,
        notices: Option<tokio::sync::mpsc::Receiver<Notice>>,
    ) -> Result<SettingsCache> {
        let snapshot = Arc::new(Snapshot::new(db.read_settings().await?));
        warn_if_ignored(&snapshot, None);
        let current = ArcSwap::from_pointee(Cached {
            snapshot,
            read_at: Instant::now(),
            good_at: Instant::now(),
            failure: None,
        });
        let shared = Arc::new(Shared {
            db,
            ttl,
            current,
            refresh: tokio::sync::Mutex::new(()),
            noticed: tokio::sync::Notify::new(),
        });
        let follower = notices.map(|rx| tokio::spawn(follow(Arc::downgrade(&shared), rx)).abort_handle());
        Ok(SettingsCache { shared, follower })
    }

    /// The cached snapshot, re-read first when older than the TTL. When the re-read fails
    /// this is the last good snapshot.
    pub async fn get(&self) -> Arc<Snapshot> {
        let shared = &self.shared;
        let cached = shared.current.load();
        if cached.read_at.elapsed() < shared.ttl {
            return cached.snapshot.clone();
        }
        drop(cached);
        let _guard = shared.refresh.lock().await;
        let cached = shared.current.load();
        if cached.read_at.elapsed() < shared.ttl {
            return cached.snapshot.clone();
        }
        shared
            .reread()
            .await
            .unwrap_or_else(|_| shared.current.load().snapshot.clone())
    }

    /// Drops the cache and re-reads the table at once, then tells every other daemon on the
    /// database to re-read too (PostgreSQL; best effort: they have the TTL).
    ///
    /// # Errors
    /// `Unavailable` with the cause when the table cannot be read; the last good snapshot
    /// stays in use.
    pub async fn invalidate(&self) -> Result<Arc<Snapshot>> {
        let snapshot = self.shared.refresh().await?;
        if let Err(e) = self.shared.db.announce_settings().await {
            tracing::warn!(error = %e, "cannot tell the other daemons to re-read the settings");
        }
        Ok(snapshot)
    }

    /// Resolves after the next re-read a notification caused (PostgreSQL; never on SQLite).
    /// One waiter: a re-read while nobody waits is kept for the next call.
    pub(crate) async fn reread_on_notice(&self) {
        self.shared.noticed.notified().await;
    }

    /// The newest snapshot read (re-reads are serialised, so it is also the last stored).
    pub(crate) fn newest(&self) -> Arc<Snapshot> {
        self.shared.current.load().snapshot.clone()
    }

    /// When the snapshot in use turns stale: the next call after it re-reads the table.
    pub(crate) fn stale_at(&self) -> Instant {
        self.shared.current.load().read_at + self.shared.ttl
    }

    /// How long ago the snapshot in use was read from the table (it grows past the TTL only
    /// while re-reads fail, or until the next call re-reads).
    pub(crate) fn age(&self) -> Duration {
        self.shared.current.load().good_at.elapsed()
    }

    /// Why the last read failed, while it keeps failing.
    #[cfg(test)]
    fn failure(&self) -> Option<Arc<str>> {
        self.shared.current.load().failure.clone()
    }
}

/// Re-reads the settings on each notice, until the cache is gone or the database closed. A
/// re-read that fails is tried again every [`NOTICE_RETRY`] until one succeeds (or the next
/// notice asks anyway).
async fn follow(cache: Weak<Shared>, mut notices: tokio::sync::mpsc::Receiver<Notice>) {
    while let Some(notice) = next_notices(&mut notices).await {
        if notice == Notice::Resumed {
            tracing::debug!("listening for settings changes; re-reading the settings once");
        }
        loop {
            let Some(shared) = cache.upgrade() else { return };
            // A failure is logged by the re-read, once per streak.
            if shared.refresh().await.is_ok() {
                shared.noticed.notify_one();
                break;
            }
            drop(shared);
            tokio::select! {
                () = tokio::time::sleep(NOTICE_RETRY) => {}
                more = next_notices(&mut notices) => {
                    if more.is_none() {
                        return;
                    }
                }
            }
        }
    }
}

impl Shared {
    /// Re-reads at once, after any re-read in progress.
    async fn refresh(&self) -> Result<Arc<Snapshot>> {
        let _guard = self.refresh.lock().await;
        self.reread().await
    }

    async fn reread(&self) -> Result<Arc<Snapshot>> {
        let previous = self.current.load_full();
        match self.db.read_settings().await {
            Ok(rows) => {
                if previous.failure.is_some() {
                    tracing::info!("the settings table is readable again");
                }
                let snapshot = Arc::new(Snapshot::after(rows, &previous.snapshot));
                warn_if_ignored(&snapshot, Some(&previous.snapshot));
                self.current.store(Arc::new(Cached {
                    snapshot: snapshot.clone(),
                    read_at: Instant::now(),
                    good_at: Instant::now(),
                    failure: None,
                }));
                Ok(snapshot)
            }
            Err(e) => {
                let cause: Arc<str> = e.to_string().into();
                if previous.failure.is_none() {
                    tracing::error!(
                        error = %cause,
                        retry_every = ?self.ttl,
                        "cannot read the settings table; routing with the last settings read"
                    );
                }
                self.current.store(Arc::new(Cached {
                    snapshot: previous.snapshot.clone(),
                    read_at: Instant::now(),
                    good_at: previous.good_at,
                    failure: Some(cause.clone()),
                }));
                Err(Error::Unavailable(format!(
                    "cannot read the settings table ({cause}); still routing with the settings read before"
                )))
            }
        }
    }
}

/// Logs a disabled-tools value that is ignored (SPEC §10), once per value: when the
/// previous snapshot did not already ignore it for the same reason.
fn warn_if_ignored(snapshot: &Snapshot, previous: Option<&Snapshot>) {
    if let Some(problem) = snapshot.disabled_problem()
        && previous.and_then(Snapshot::disabled_problem) != Some(problem)
    {
        tracing::warn!(problem, "ignoring the disabled tools setting");
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn an_empty_or_whitespace_value_counts_as_unset() {
        let s = Snapshot::new([
            ("a".to_string(), "x".to_string()),
            ("b".to_string(), String::new()),
            ("c".to_string(), " \t\n\u{3000}\u{a0}".to_string()),
            ("d".to_string(), " y ".to_string()),
        ]);
        assert!(s.is_set("a"));
        assert!(!s.is_set("b"));
        assert!(!s.is_set("c"), "Unicode whitespace is trimmed");
        assert!(s.is_set("d"));
        assert!(!s.is_set("missing"));
    }

    /// A second connection, as a settings UI would, writes the file the cache reads.
    async fn setup(ttl: Duration) -> (tempfile::TempDir, SettingsCache, Db) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let daemon = Db::connect(&url).await.unwrap();
        let ui = Db::connect(&url).await.unwrap();
        (dir, SettingsCache::new(daemon, ttl).await.unwrap(), ui)
    }

    #[tokio::test]
    async fn a_change_is_visible_at_once_after_invalidation() {
        let (_dir, cache, ui) = setup(Duration::from_secs(3600)).await;
        assert!(!cache.get().await.is_set("k"));
        ui.set_setting("k", "v").await.unwrap();
        assert!(
            !cache.get().await.is_set("k"),
            "cached until the TTL or an invalidation"
        );
        assert!(cache.invalidate().await.unwrap().is_set("k"));
        assert!(cache.get().await.is_set("k"));
    }

    #[tokio::test]
    async fn a_change_is_visible_after_the_ttl_without_invalidation() {
        let ttl = Duration::from_millis(200);
        let (_dir, cache, ui) = setup(ttl).await;
        assert!(!cache.get().await.is_set("k"));
        ui.set_setting("k", "v").await.unwrap();
        tokio::time::sleep(ttl + Duration::from_millis(50)).await;
        assert!(cache.get().await.is_set("k"));
        ui.set_setting("k", "   ").await.unwrap();
        tokio::time::sleep(ttl + Duration::from_millis(50)).await;
        assert!(!cache.get().await.is_set("k"), "whitespace counts as unset");
    }

    /// Captures this thread's log output.
    #[derive(Clone, Default)]
    pub(crate) struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    thread_local! {
        /// Where this thread's log output goes while a test captures it.
        static SINK: std::cell::RefCell<Option<Captured>> = const { std::cell::RefCell::new(None) };
    }

    /// Writes to the capturing test's buffer on this thread, or nowhere.
    struct ThisThread;

    impl std::io::Write for ThisThread {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            SINK.with(|sink| {
                if let Some(logs) = sink.borrow_mut().as_mut() {
                    logs.write_all(buf)?;
                }
                Ok(buf.len())
            })
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Ends a capture when dropped.
    pub(crate) struct Capturing;

    impl Drop for Capturing {
        fn drop(&mut self) {
            SINK.with(|sink| sink.borrow_mut().take());
        }
    }

    impl Captured {
        /// Captures this thread's log output while the guard lives.
        ///
        /// One subscriber for the whole test binary, set once as the global default, writes
        /// to the buffer of the thread that logs. A subscriber set per thread instead lost
        /// lines: tracing caches each call site's interest process-wide, and a test thread
        /// with no subscriber that reached a call site first cached it as never wanted.
        pub(crate) fn on_this_thread() -> (Captured, Capturing) {
            static GLOBAL: std::sync::Once = std::sync::Once::new();
            GLOBAL.call_once(|| {
                let subscriber = tracing_subscriber::fmt()
                    .with_writer(|| ThisThread)
                    .with_ansi(false)
                    .finish();
                tracing::subscriber::set_global_default(subscriber)
                    .expect("no other global subscriber in the tests");
            });
            let logs = Captured::default();
            SINK.with(|sink| *sink.borrow_mut() = Some(logs.clone()));
            (logs, Capturing)
        }

        pub(crate) fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_failing_table_keeps_the_last_snapshot_logs_once_per_streak_and_recovers() {
        let (logs, _default) = Captured::on_this_thread();

        let ttl = Duration::from_millis(50);
        let (dir, cache, ui) = setup(ttl).await;
        ui.set_setting("k", "v").await.unwrap();
        assert!(cache.invalidate().await.unwrap().is_set("k"));
        let path = dir.path().join("s.db");
        std::fs::rename(&path, dir.path().join("moved.db")).unwrap();
        for _ in 0..4 {
            tokio::time::sleep(ttl + Duration::from_millis(10)).await;
            assert!(cache.get().await.is_set("k"), "the last good snapshot serves");
            assert!(cache.failure().is_some());
        }
        let err = cache.invalidate().await.unwrap_err();
        assert!(matches!(err, Error::Unavailable(_)), "{err}");
        std::fs::rename(dir.path().join("moved.db"), &path).unwrap();
        tokio::time::sleep(ttl + Duration::from_millis(10)).await;
        assert!(cache.get().await.is_set("k"));
        assert!(cache.failure().is_none(), "recovered by itself");

        let text = logs.text();
        let failures = text.matches("cannot read the settings table").count();
        assert_eq!(failures, 1, "one log line per failure streak:\n{text}");
        assert_eq!(text.matches("readable again").count(), 1, "{text}");
    }

    #[tokio::test]
    async fn a_re_read_a_notice_asked_for_is_tried_again_until_it_succeeds() {
        // A notice whose re-read fails (here the file is away; on PostgreSQL, a server still
        // marked unreachable when the listener came back) is not lost to the TTL.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let url = format!("sqlite://{}", path.display());
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let cache = SettingsCache::following(
            Db::connect(&url).await.unwrap(),
            Duration::from_secs(3600),
            Some(rx),
        )
        .await
        .unwrap();
        let ui = Db::connect(&url).await.unwrap();
        ui.set_setting("k", "v").await.unwrap();
        ui.close().await;
        std::fs::rename(&path, dir.path().join("moved.db")).unwrap();
        tx.send(Notice::Resumed).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(cache.failure().is_some(), "the re-read failed");
        std::fs::rename(dir.path().join("moved.db"), &path).unwrap();
        tokio::time::timeout(NOTICE_RETRY * 5, cache.reread_on_notice())
            .await
            .expect("re-read again without another notice");
        assert!(cache.get().await.is_set("k"));
    }

    #[tokio::test]
    async fn an_invalid_disabled_tools_value_is_ignored_and_logged_once_per_value() {
        let (logs, _default) = Captured::on_this_thread();

        let (_dir, cache, ui) = setup(Duration::from_secs(3600)).await;
        let key = crate::router::DISABLED_TOOLS_KEY;
        for value in [r#"["a", 1]"#, "a_tool", r#"["ok", "[bad"]"#, r#"["", "x"]"#] {
            ui.set_setting(key, value).await.unwrap();
            let s = cache.invalidate().await.unwrap();
            assert!(s.disabled().is_empty(), "{value} is ignored");
            assert!(s.disabled_problem().is_some(), "{value}");
            cache.invalidate().await.unwrap();
        }
        // More names or globs than allowed: ignored too, saying why.
        let many: Vec<String> = (0..=crate::router::MAX_DISABLED_PATTERNS)
            .map(|i| format!("t{i}_*"))
            .collect();
        ui.set_setting(key, &serde_json::to_string(&many).unwrap())
            .await
            .unwrap();
        let s = cache.invalidate().await.unwrap();
        assert!(s.disabled().is_empty());
        assert!(
            s.disabled_problem()
                .is_some_and(|p| p.contains("holds 4097 names or globs; at most 4096")),
            "{:?}",
            s.disabled_problem()
        );
        ui.set_setting(key, r#"["a*", "b"]"#).await.unwrap();
        let s = cache.invalidate().await.unwrap();
        assert_eq!(s.disabled().as_slice(), ["a*", "b"]);
        assert!(s.disabled().matches("abc") && !s.disabled().matches("bc"));
        // Re-read with the same value (another setting changed), it is not compiled again.
        ui.set_setting("other", "x").await.unwrap();
        let again = cache.invalidate().await.unwrap();
        assert!(again.is_set("other"));
        assert!(again.disabled().shares_compiled(s.disabled()));

        let text = logs.text();
        assert_eq!(
            text.matches("ignoring the disabled tools setting").count(),
            5,
            "once per value, not per re-read:\n{text}"
        );
    }

    /// Two daemons' caches and a settings UI's connection on one fresh PostgreSQL database;
    /// `None` without a test server.
    async fn postgres_setup(ttl: Duration) -> Option<(SettingsCache, SettingsCache, Db, String)> {
        let admin = crate::db::testing::postgres_url()?;
        let url = crate::db::testing::fresh_postgres_database(&admin).await;
        let a = SettingsCache::new(Db::connect(&url).await.unwrap(), ttl)
            .await
            .unwrap();
        let b = SettingsCache::new(Db::connect(&url).await.unwrap(), ttl)
            .await
            .unwrap();
        Some((a, b, Db::connect(&url).await.unwrap(), url))
    }

    /// Waits until `cache` sees `key` set (or unset); the bound only ends a test that would
    /// otherwise wait forever.
    async fn until_seen(cache: &SettingsCache, key: &str, set: bool) {
        let started = Instant::now();
        while cache.get().await.is_set(key) != set {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{key} never became {set}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn on_postgres_a_write_by_anyone_reaches_every_cache_without_invalidation() {
        let Some((a, b, ui, _)) = postgres_setup(Duration::from_secs(3600)).await else {
            return;
        };
        ui.set_setting("k", "v").await.unwrap();
        until_seen(&a, "k", true).await;
        until_seen(&b, "k", true).await;
        ui.unset_setting("k").await.unwrap();
        until_seen(&a, "k", false).await;
        until_seen(&b, "k", false).await;
    }

    #[tokio::test]
    async fn on_postgres_an_invalidation_on_one_daemon_makes_the_others_re_read() {
        use sqlx::Connection as _;
        let Some((a, b, ui, url)) = postgres_setup(Duration::from_secs(3600)).await else {
            return;
        };
        // A writer the trigger does not see: only the invalidation can tell the daemons.
        let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::query("ALTER TABLE settings DISABLE TRIGGER settings_changed")
            .execute(&mut admin)
            .await
            .unwrap();
        ui.set_setting("k", "v").await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!b.get().await.is_set("k"), "not yet: nothing told b");
        assert!(a.invalidate().await.unwrap().is_set("k"));
        until_seen(&b, "k", true).await;
    }
}
