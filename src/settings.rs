//! The settings snapshot: every row of the `settings` table, read at once and cached for the
//! TTL. `invalidate` re-reads at once; without it a change becomes visible within one TTL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::db::Db;
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
pub(crate) struct SettingsCache {
    db: Db,
    ttl: Duration,
    current: ArcSwap<Cached>,
    refresh: tokio::sync::Mutex<()>,
}

impl SettingsCache {
    /// Reads the table once and caches it.
    ///
    /// # Errors
    /// When the first read fails: there is no good snapshot to fall back on.
    pub async fn new(db: Db, ttl: Duration) -> Result<SettingsCache> {
        let snapshot = Arc::new(Snapshot::new(db.read_settings().await?));
        warn_if_ignored(&snapshot, None);
        let current = ArcSwap::from_pointee(Cached {
            snapshot,
            read_at: Instant::now(),
            good_at: Instant::now(),
            failure: None,
        });
        Ok(SettingsCache {
            db,
            ttl,
            current,
            refresh: tokio::sync::Mutex::new(()),
        })
    }

    /// The cached snapshot, re-read first when older than the TTL. When the re-read fails
    /// this is the last good snapshot.
    pub async fn get(&self) -> Arc<Snapshot> {
        let cached = self.current.load();
        if cached.read_at.elapsed() < self.ttl {
            return cached.snapshot.clone();
        }
        drop(cached);
        let _guard = self.refresh.lock().await;
        let cached = self.current.load();
        if cached.read_at.elapsed() < self.ttl {
            return cached.snapshot.clone();
        }
        self.reread()
            .await
            .unwrap_or_else(|_| self.current.load().snapshot.clone())
    }

    /// Drops the cache and re-reads the table at once.
    ///
    /// # Errors
    /// `Unavailable` with the cause when the table cannot be read; the last good snapshot
    /// stays in use.
    pub async fn invalidate(&self) -> Result<Arc<Snapshot>> {
        let _guard = self.refresh.lock().await;
        self.reread().await
    }

    /// How long ago the snapshot in use was read from the table (it grows past the TTL only
    /// while re-reads fail, or until the next call re-reads).
    pub(crate) fn age(&self) -> Duration {
        self.current.load().good_at.elapsed()
    }

    /// Why the last read failed, while it keeps failing.
    #[cfg(test)]
    fn failure(&self) -> Option<Arc<str>> {
        self.current.load().failure.clone()
    }

    async fn reread(&self) -> Result<Arc<Snapshot>> {
        let previous = self.current.load_full();
        match self.db.read_settings().await {
            Ok(rows) => {
                if previous.failure.is_some() {
                    tracing::info!("the settings table is readable again");
                }
                let snapshot = Arc::new(Snapshot::new(rows));
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
mod tests {
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
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

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
        let logs = Captured::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let _default = tracing::subscriber::set_default(subscriber);

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

        let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        let failures = text.matches("cannot read the settings table").count();
        assert_eq!(failures, 1, "one log line per failure streak:\n{text}");
        assert_eq!(text.matches("readable again").count(), 1, "{text}");
    }

    #[tokio::test]
    async fn an_invalid_disabled_tools_value_is_ignored_and_logged_once_per_value() {
        let logs = Captured::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let _default = tracing::subscriber::set_default(subscriber);

        let (_dir, cache, ui) = setup(Duration::from_secs(3600)).await;
        let key = crate::router::DISABLED_TOOLS_KEY;
        for value in [r#"["a", 1]"#, "a_tool", r#"["ok", "[bad"]"#, r#"["", "x"]"#] {
            ui.set_setting(key, value).await.unwrap();
            let s = cache.invalidate().await.unwrap();
            assert!(s.disabled().is_empty(), "{value} is ignored");
            assert!(s.disabled_problem().is_some(), "{value}");
            cache.invalidate().await.unwrap();
        }
        ui.set_setting(key, r#"["a*", "b"]"#).await.unwrap();
        let s = cache.invalidate().await.unwrap();
        assert_eq!(s.disabled().as_slice(), ["a*", "b"]);
        assert!(s.disabled().matches("abc") && !s.disabled().matches("bc"));

        let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text.matches("ignoring the disabled tools setting").count(),
            4,
            "once per value, not per re-read:\n{text}"
        );
    }
}
