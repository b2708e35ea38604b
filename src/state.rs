//! The shared state and the operations the gRPC service and the tests call: each one takes
//! a consistent view (registry, automaton, settings snapshot, activation), asks the pure
//! router, and persists what the decision changed before answering.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::config::Config;
use crate::conversations::Conversations;
use crate::db::Db;
use crate::error::Result;
use crate::matcher::Matcher;
use crate::registry::Registry;
use crate::router::{self, Activation, Decision, Load, Options};
use crate::settings::{SettingsCache, Snapshot};

/// How many conversations are kept in memory; older ones are re-read from SQLite.
pub const CONVERSATION_CACHE_CAPACITY: u64 = 100_000;

/// Everything one decision reads, consistent with itself: in-flight calls see one view.
#[derive(Debug)]
pub struct View {
    /// The registry.
    pub registry: Arc<Registry>,
    /// The keyword automaton over the registry.
    pub matcher: Arc<Matcher>,
    /// The settings snapshot the activation was derived from.
    pub settings: Arc<Snapshot>,
    /// What the snapshot means for the registry.
    pub activation: Activation,
}

/// The daemon's shared state. Cloning is shallow.
#[derive(Clone)]
pub struct State {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    settings: SettingsCache,
    conversations: Conversations,
    options: Options,
    max_message_bytes: usize,
    view: ArcSwap<View>,
}

impl State {
    /// Opens the database, reads the settings and builds the automaton.
    ///
    /// # Errors
    /// A database fault or an automaton too large to build.
    pub async fn new(registry: Registry, config: &Config) -> Result<State> {
        let db = Db::connect(&config.database).await?;
        let settings = SettingsCache::new(db.clone(), config.settings_ttl).await?;
        let snapshot = settings.get().await?;
        let registry = Arc::new(registry);
        let matcher = Arc::new(Matcher::new(registry.keywords(), config.keyword_match)?);
        let activation = Activation::new(&registry, &snapshot);
        let view = View {
            registry,
            matcher,
            settings: snapshot,
            activation,
        };
        Ok(State {
            inner: Arc::new(Inner {
                conversations: Conversations::new(
                    db.clone(),
                    config.conversation_ttl,
                    CONVERSATION_CACHE_CAPACITY,
                ),
                db,
                settings,
                options: Options {
                    fallback: config.fallback,
                    expose_load_tool_group: config.expose_load_tool_group,
                },
                max_message_bytes: config.max_message_bytes,
                view: ArcSwap::from_pointee(view),
            }),
        })
    }

    /// The largest accepted message, in bytes.
    pub fn max_message_bytes(&self) -> usize {
        self.inner.max_message_bytes
    }

    /// The current view, with settings no older than the TTL.
    ///
    /// # Errors
    /// When a due settings re-read fails.
    pub async fn view(&self) -> Result<Arc<View>> {
        let snapshot = self.inner.settings.get().await?;
        Ok(self.view_for(snapshot))
    }

    /// The view for this snapshot, deriving activation only when the snapshot changed.
    fn view_for(&self, snapshot: Arc<Snapshot>) -> Arc<View> {
        let view = self.inner.view.load_full();
        if Arc::ptr_eq(&view.settings, &snapshot) {
            return view;
        }
        let next = Arc::new(View {
            registry: view.registry.clone(),
            matcher: view.matcher.clone(),
            activation: Activation::new(&view.registry, &snapshot),
            settings: snapshot,
        });
        // Concurrent callers may derive the same view twice; either store is correct.
        self.inner.view.store(next.clone());
        next
    }

    /// Routes one message (SPEC §4), recording new keyword hits in the conversation before
    /// answering.
    ///
    /// # Errors
    /// A database fault reading settings or persisting the conversation.
    pub async fn route(&self, message: &str, conversation_id: Option<&str>) -> Result<(Arc<View>, Decision)> {
        let view = self.view().await?;
        let options = &self.inner.options;
        let Some(id) = conversation_id else {
            let decision = router::route(
                &view.registry,
                &view.matcher,
                &view.activation,
                None,
                message,
                options,
            );
            return Ok((view, decision));
        };
        let convs = &self.inner.conversations;
        let mut entry = convs.lock(id).await?;
        let decision = router::route(
            &view.registry,
            &view.matcher,
            &view.activation,
            Some(&entry.state),
            message,
            options,
        );
        if !decision.new_hits.is_empty() {
            let mut next = entry.state.clone();
            next.record_hits(&view.registry, &decision.new_hits);
            convs.save(id, &mut entry, next).await?;
        }
        Ok((view, decision))
    }

    /// Loads a group into a conversation (SPEC §5), persisted before answering.
    ///
    /// # Errors
    /// `NotFound`/`FailedPrecondition` as the router decides, or a database fault.
    pub async fn load_group(&self, conversation_id: &str, group: &str) -> Result<(Arc<View>, Load)> {
        let view = self.view().await?;
        let convs = &self.inner.conversations;
        let mut entry = convs.lock(conversation_id).await?;
        let load = router::load(&view.registry, &view.activation, &entry.state, group)?;
        if !load.already_loaded {
            let mut next = entry.state.clone();
            next.record_load(group);
            convs.save(conversation_id, &mut entry, next).await?;
        }
        Ok((view, load))
    }

    /// Drops the settings cache and re-reads the table at once.
    ///
    /// # Errors
    /// When the re-read fails.
    pub async fn invalidate_settings(&self) -> Result<Arc<View>> {
        let snapshot = self.inner.settings.invalidate().await?;
        Ok(self.view_for(snapshot))
    }

    /// Forgets one conversation.
    ///
    /// # Errors
    /// A database fault.
    pub async fn reset_conversation(&self, id: &str) -> Result<()> {
        self.inner.conversations.reset(id).await
    }

    /// Runs conversation upkeep every `period` until `shutdown` resolves, then once more.
    pub async fn maintain(&self, period: Duration, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(period) => {}
            }
            if let Err(e) = self.inner.conversations.maintain().await {
                tracing::error!(error = %e, "conversation upkeep failed");
            }
        }
        if let Err(e) = self.inner.conversations.maintain().await {
            tracing::error!(error = %e, "conversation upkeep failed at shutdown");
        }
    }

    /// Flushes idle clocks and closes the database pool.
    pub async fn close(&self) {
        if let Err(e) = self.inner.conversations.maintain().await {
            tracing::error!(error = %e, "conversation flush failed at shutdown");
        }
        self.inner.db.close().await;
    }
}
