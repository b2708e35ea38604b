//! The shared state and the operations the gRPC service and the tests call: each one takes
//! a consistent view (registry, automaton, settings snapshot, activation), asks the pure
//! router, and persists what the decision changed before answering.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::config::Config;
use crate::conversations::Conversations;
use crate::db::Db;
use crate::error::{Error, Result};
use crate::matcher::{MatchMode, Matcher};
use crate::registry::{DomainId, Registry};
use crate::render::{Format, LazyRenders, Rendered, Renders};
use crate::router::budget::{self, Cost, Dropped, Limits};
use crate::router::{self, Activation, Decision, Inputs, Load, Mark, Options, Snapshot};
use crate::search::{SearchIndex, ToolMatch};
use crate::settings::SettingsCache;

/// Everything one decision reads, consistent with itself: in-flight calls see one view.
#[derive(Debug)]
pub struct View {
    /// The registry.
    pub registry: Arc<Registry>,
    /// The keyword automaton over the registry.
    pub matcher: Arc<Matcher>,
    /// The search index over the registry.
    pub index: Arc<SearchIndex>,
    /// The settings snapshot the activation was derived from.
    pub settings: Arc<Snapshot>,
    /// What the snapshot means for the registry.
    pub activation: Activation,
    /// The registry's tools rendered per provider format, with their token counts.
    pub renders: Arc<Renders>,
    /// The meta-tools of this activation (as the options expose them), rendered per format.
    meta: LazyRenders,
    /// Whether answers carry the meta-tools (the routing options, fixed for a daemon).
    expose: (bool, bool),
}

impl View {
    fn new(
        registry: Arc<Registry>,
        matcher: Arc<Matcher>,
        index: Arc<SearchIndex>,
        renders: Arc<Renders>,
        settings: Arc<Snapshot>,
        options: &Options,
    ) -> View {
        let activation = Activation::new(&registry, &settings);
        View {
            registry,
            matcher,
            index,
            settings,
            activation,
            renders,
            meta: LazyRenders::default(),
            expose: (options.expose_load_tool_group, options.expose_search_tools),
        }
    }

    /// The registry's tools in `format`.
    pub fn rendered(&self, format: Format) -> &Rendered {
        self.renders.get(&self.registry, format)
    }

    /// The meta-tools answers start with, in `format`: both, either or none, as the options
    /// expose them and the activation has them.
    pub fn meta_rendered(&self, format: Format) -> &Rendered {
        self.meta.get(format, || {
            let load = self.activation.meta_tool().filter(|_| self.expose.0);
            let search = self.activation.search_tool().filter(|_| self.expose.1);
            load.into_iter().chain(search).collect()
        })
    }

    /// What a domain's tools cost in `format`.
    pub fn domain_cost(&self, d: DomainId, format: Format) -> Cost {
        let range = self.renders.domain(d);
        Cost {
            tools: range.len() as u64,
            tokens: u64::from(self.rendered(format).tokens(range)),
        }
    }

    /// What a route reads from the registry.
    pub fn inputs(&self) -> Inputs<'_> {
        Inputs {
            registry: &self.registry,
            matcher: &self.matcher,
            index: &self.index,
        }
    }
}

/// A route's answer and the view it was decided in.
#[derive(Debug)]
pub struct Routed {
    /// The view the decision read.
    pub view: Arc<View>,
    /// What the turn gets, the budget applied.
    pub decision: Decision,
    /// The domains the budget left out, in the order they were dropped.
    pub dropped: Vec<Dropped>,
}

/// What a `Route` call asks beyond the message.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteOptions<'a> {
    /// The conversation, if any.
    pub conversation: Option<&'a str>,
    /// Record nothing about the conversation.
    pub dry_run: bool,
    /// The format tokens are counted in (`None`: native, counted as OpenAI chat).
    pub format: Option<Format>,
    /// The request's `max_tools` (0: the server's).
    pub max_tools: u32,
    /// The request's `token_budget` (0: the server's).
    pub token_budget: u32,
}

/// A load's outcome and the view it was checked in.
#[derive(Debug)]
pub struct Loaded {
    /// The view the load was checked against.
    pub view: Arc<View>,
    /// The group and whether the conversation already had it.
    pub load: Load,
}

/// What `SearchTools` found, and which groups it loaded.
#[derive(Debug)]
pub struct Searched {
    /// The view it was answered from.
    pub view: Arc<View>,
    /// The ranked tools, best first.
    pub hits: Vec<ToolMatch>,
    /// The groups loaded into the conversation, in rank order.
    pub loaded: Vec<crate::registry::DomainId>,
}

/// Builds the search index and the renders (with their token counts) of a registry, side by
/// side: both are pure and take tens of milliseconds on a large registry.
fn index_and_renders(registry: &Registry) -> (SearchIndex, Renders) {
    std::thread::scope(|s| {
        let renders = s.spawn(|| Renders::new(registry));
        let index = SearchIndex::new(registry);
        // A panic while rendering is a bug; it goes on as this thread's panic.
        let renders = renders.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (index, renders)
    })
}

/// The most domains one `SearchTools` call loads into a conversation (SPEC §5).
pub(crate) const MAX_SEARCH_LOADS: usize = 3;

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
    view: ArcSwap<View>,
    /// Where the registry is reloaded from: these folders, or the demo registry when empty.
    manifests: Vec<PathBuf>,
    keyword_match: MatchMode,
    /// Serialises reloads, so the last one to finish is the last one started.
    reload: tokio::sync::Mutex<()>,
    /// When the daemon started, for `DescribeServer`'s uptime.
    started: std::time::Instant,
    /// The effective configuration as TOML, secrets left out, for `DescribeServer`.
    config_toml: String,
    /// The database URL, credentials removed.
    database: String,
    /// The server's budget: `--max-tools` (0: none) and `--token-budget`.
    limits: Limits,
}

/// What `DescribeServer` reports.
#[derive(Debug, Clone)]
pub struct Description {
    /// The registry's version.
    pub registry_version: u64,
    /// Its domains.
    pub domains: usize,
    /// Its tools.
    pub tools: usize,
    /// The database URL, credentials removed.
    pub database: String,
    /// The database file, absolute; `None` in memory.
    pub database_path: Option<PathBuf>,
    /// Age of the settings snapshot in use.
    pub settings_age: Duration,
    /// Time since the state was built.
    pub uptime: Duration,
    /// The effective configuration, secrets left out.
    pub config_toml: String,
}

/// What a reload installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reloaded {
    /// The new registry's version.
    pub registry_version: u64,
    /// Its domains.
    pub domains: usize,
    /// Its tools.
    pub tools: usize,
}

impl State {
    /// Opens the database, reads the settings and builds the automaton.
    ///
    /// # Errors
    /// A database fault or an automaton too large to build.
    pub async fn new(registry: Registry, config: &Config) -> Result<State> {
        let db = Db::connect_with(&config.database, config.busy_timeout).await?;
        let settings = SettingsCache::new(db.clone(), config.settings_ttl).await?;
        let snapshot = settings.get().await;
        let registry = Arc::new(registry);
        let matcher = Arc::new(Matcher::new(registry.keywords(), config.keyword_match)?);
        let (index, renders) = index_and_renders(&registry);
        let (index, renders) = (Arc::new(index), Arc::new(renders));
        let options = config.routing();
        let view = View::new(registry, matcher, index, renders, snapshot, &options);
        Ok(State {
            inner: Arc::new(Inner {
                conversations: Conversations::new(
                    db.clone(),
                    config.conversation_ttl,
                    config.conversation_cache_bytes,
                ),
                db,
                settings,
                options,
                view: ArcSwap::from_pointee(view),
                manifests: config.manifests.clone(),
                keyword_match: config.keyword_match,
                reload: tokio::sync::Mutex::new(()),
                started: std::time::Instant::now(),
                config_toml: config.to_toml(),
                database: crate::db::redact_url(&config.database),
                limits: Limits {
                    max_tools: (config.max_tools > 0).then_some(u64::from(config.max_tools)),
                    token_budget: config.token_budget.map(u64::from),
                },
            }),
        })
    }

    /// What the daemon serves and from where.
    pub fn describe(&self) -> Description {
        let view = self.inner.view.load();
        Description {
            registry_version: view.registry.version(),
            domains: view.registry.domains().len(),
            tools: view.registry.tool_count(),
            database: self.inner.database.clone(),
            database_path: self.inner.db.path().map(crate::db::absolute),
            settings_age: self.inner.settings.age(),
            uptime: self.inner.started.elapsed(),
            config_toml: self.inner.config_toml.clone(),
        }
    }

    /// Conversations held in memory now.
    pub(crate) async fn conversations_cached(&self) -> u64 {
        self.inner.conversations.cached().await
    }

    /// The current view, with settings no older than the TTL (or the last good settings
    /// while the table cannot be read).
    pub(crate) async fn view(&self) -> Arc<View> {
        let snapshot = self.inner.settings.get().await;
        self.view_for(snapshot)
    }

    /// The view for this snapshot, deriving activation only when the snapshot changed.
    fn view_for(&self, snapshot: Arc<Snapshot>) -> Arc<View> {
        let view = self.inner.view.load_full();
        if Arc::ptr_eq(&view.settings, &snapshot) {
            return view;
        }
        let next = Arc::new(View::new(
            view.registry.clone(),
            view.matcher.clone(),
            view.index.clone(),
            view.renders.clone(),
            snapshot,
            &self.inner.options,
        ));
        // Only over the view it was derived from: a registry reloaded meanwhile is kept (this
        // caller still answers from its own consistent view).
        self.inner.view.compare_and_swap(&view, next.clone());
        next
    }

    /// Routes one message (SPEC §4), recording new keyword and search hits in the
    /// conversation before answering, unless `dry_run`, then fits the answer to the budget
    /// (SPEC §9).
    ///
    /// # Errors
    /// None today: a conversation store fault degrades the answer instead (see above).
    pub async fn route(&self, message: &str, options: RouteOptions<'_>) -> Result<Routed> {
        let (view, mut decision) = self.decide(message, options.conversation, options.dry_run).await;
        let format = options.format.unwrap_or(Format::OpenAiChat);
        let limits = Limits {
            max_tools: match options.max_tools {
                0 => self.inner.limits.max_tools,
                n => Some(u64::from(n)),
            },
            token_budget: match options.token_budget {
                0 => self.inner.limits.token_budget,
                n => Some(u64::from(n)),
            },
        };
        let mut dropped = Vec::new();
        if limits != Limits::default() {
            let meta = view.meta_rendered(format);
            let fixed = Cost {
                tools: meta.len() as u64,
                tokens: u64::from(meta.tokens(0..meta.len())),
            };
            dropped = budget::fit(&mut decision, fixed, |d| view.domain_cost(d, format), limits);
        }
        Ok(Routed {
            view,
            decision,
            dropped,
        })
    }

    /// The routing decision for one message, recorded in the conversation unless `dry_run`.
    async fn decide(
        &self,
        message: &str,
        conversation_id: Option<&str>,
        dry_run: bool,
    ) -> (Arc<View>, Decision) {
        let view = self.view().await;
        let decide = |conversation: Option<&router::Conversation>| {
            router::route(
                view.inputs(),
                &view.activation,
                conversation,
                message,
                &self.inner.options,
            )
        };
        let Some(id) = conversation_id else {
            let decision = decide(None);
            return (view, decision);
        };
        let convs = &self.inner.conversations;
        // A turn is answered even when the conversation store cannot be used: without the
        // conversation's memory, and without remembering this turn's hits.
        let mut entry = match convs.lock(id).await {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(error = %e, "conversation unavailable; routing without its memory");
                let decision = decide(None);
                return (view, decision);
            }
        };
        let decision = decide(Some(entry.state()));
        if !decision.new_hits.is_empty() && !dry_run {
            let names = decision
                .new_hits
                .iter()
                .map(|&d| view.registry.domain(d).name.as_str());
            if let Err(e) = entry.record(names, Mark::Hit).await {
                tracing::warn!(error = %e, "cannot remember this turn's keyword hits");
            }
        }
        (view, decision)
    }

    /// Loads a group into a conversation (SPEC §5), persisted before answering.
    ///
    /// # Errors
    /// `NotFound`/`FailedPrecondition` as the router decides, or a database fault.
    pub(crate) async fn load_group(&self, conversation_id: &str, group: &str) -> Result<Loaded> {
        let view = self.view().await;
        let convs = &self.inner.conversations;
        let mut entry = convs.lock(conversation_id).await?;
        let load = router::load(&view.registry, &view.activation, entry.state(), group)?;
        if !load.already_loaded {
            entry.record([group], Mark::Loaded).await?;
        }
        Ok(Loaded { view, load })
    }

    /// Searches the whole registry's tools (SPEC §5 `SearchTools`); with a conversation and
    /// `load`, loads the active non-core groups of the top hits (at most
    /// [`MAX_SEARCH_LOADS`], in rank order) into it, persisted before answering.
    ///
    /// # Errors
    /// A database fault while loading.
    pub async fn search_tools(&self, query: &str, limit: usize, load_into: Option<&str>) -> Result<Searched> {
        let view = self.view().await;
        let hits = view.index.search_tools(query, limit);
        let mut loaded = Vec::new();
        if let Some(id) = load_into {
            let registry = &view.registry;
            let mut groups: Vec<crate::registry::DomainId> = Vec::new();
            for h in &hits {
                let d = registry.domain(h.domain);
                if view.activation.is_active(h.domain)
                    && !d.core
                    && !groups.contains(&h.domain)
                    && groups.len() < MAX_SEARCH_LOADS
                {
                    groups.push(h.domain);
                }
            }
            if !groups.is_empty() {
                let mut entry = self.inner.conversations.lock(id).await?;
                let names = groups.iter().map(|&d| registry.domain(d).name.as_str());
                entry.record(names, Mark::Loaded).await?;
                loaded = groups;
            }
        }
        Ok(Searched { view, hits, loaded })
    }

    /// Drops the settings cache and re-reads the table at once.
    ///
    /// # Errors
    /// `Unavailable` with the cause when the table cannot be read (routing goes on with the
    /// last good settings).
    pub async fn invalidate_settings(&self) -> Result<Arc<View>> {
        let snapshot = self.inner.settings.invalidate().await?;
        Ok(self.view_for(snapshot))
    }

    /// Reloads the registry from where it was first loaded and swaps it in whole: a call in
    /// flight answers from the old registry or the new one, never a mix. Invalid manifests
    /// leave the old registry serving.
    ///
    /// # Errors
    /// `FailedPrecondition` listing every manifest problem, or an automaton too large.
    pub async fn reload(&self) -> Result<Reloaded> {
        let _serial = self.inner.reload.lock().await;
        let dirs = self.inner.manifests.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            Registry::load(&dirs).map(|r| {
                let (index, renders) = index_and_renders(&r);
                (r, index, renders)
            })
        })
        .await
        .map_err(|e| Error::Internal(format!("the reload task failed: {e}")))?;
        let (registry, index, renders) = match loaded {
            Ok((r, index, renders)) => (Arc::new(r), Arc::new(index), Arc::new(renders)),
            Err(Error::Manifests(errors)) => {
                let version = self.inner.view.load().registry.version();
                return Err(Error::ManifestsRefused { version, errors });
            }
            Err(other) => return Err(other),
        };
        let matcher = Arc::new(Matcher::new(registry.keywords(), self.inner.keyword_match)?);
        self.inner.view.rcu(|current| {
            View::new(
                registry.clone(),
                matcher.clone(),
                index.clone(),
                renders.clone(),
                current.settings.clone(),
                &self.inner.options,
            )
        });
        let reloaded = Reloaded {
            registry_version: registry.version(),
            domains: registry.domains().len(),
            tools: registry.tool_count(),
        };
        tracing::info!(
            registry_version = %format!("{:016x}", reloaded.registry_version),
            domains = reloaded.domains,
            tools = reloaded.tools,
            "registry reloaded"
        );
        Ok(reloaded)
    }

    /// Forgets one conversation.
    ///
    /// # Errors
    /// A database fault.
    pub async fn reset_conversation(&self, id: &str) -> Result<()> {
        self.inner.conversations.reset(id).await
    }

    /// Runs conversation upkeep every `period` until `shutdown` resolves (the final flush is
    /// [`State::close`]'s).
    pub(crate) async fn maintain(&self, period: Duration, shutdown: impl std::future::Future<Output = ()>) {
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
    }

    /// Flushes idle clocks and closes the database pool.
    pub async fn close(&self) {
        if let Err(e) = self.inner.conversations.maintain().await {
            tracing::error!(error = %e, "conversation flush failed at shutdown");
        }
        self.inner.db.close().await;
    }
}
