//! The shared state and the operations the gRPC service and the tests call: each one takes
//! a consistent view (registry, automaton, settings snapshot, activation), asks the pure
//! router, and persists what the decision changed before answering. The registry it serves
//! is the manifests' domains plus the domains registered at run time (stored in the
//! database); reloads, upserts and deletes rebuild it one at a time and swap it in whole.
//!
//! - `view`: the [`View`] a call decides in, and a consumer's [`Scope`] of it.
//! - `domains`: the registry composed of the manifests and the run-time domains: reload,
//!   upsert, delete, and another daemon's change.

mod domains;
mod view;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::config::Config;
use crate::conversations::Conversations;
use crate::db::Db;
use crate::error::{Error, Result};
use crate::matcher::MatchMode;
use crate::registry::{DomainId, Registry};
use crate::render::Format;
use crate::router::budget::{self, Cost, Dropped, Limits};
use crate::router::{self, Decision, Load, Mark, Options, ProfileId, Profiles, Snapshot};
use crate::search::ToolMatch;
use crate::settings::SettingsCache;

pub use domains::with_stored_domains;
use domains::{REPLACED_FILE, Sources, compose, parse_stored};
use view::Parts;
pub use view::{Scope, View};

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
    /// The consumer's profile, if any.
    pub profile: Option<ProfileId>,
}

/// A load's outcome and the view it was checked in.
#[derive(Debug)]
pub struct Loaded {
    /// The view the load was checked against.
    pub view: Arc<View>,
    /// The group and whether the conversation already had it.
    pub load: Load,
}

/// Where a tool call stands (SPEC §10 `CheckToolCall`).
#[derive(Debug)]
pub struct CallCheck {
    /// The view it was checked in.
    pub view: Arc<View>,
    /// The tool's domain, when the name is known.
    pub domain: Option<DomainId>,
    /// Why the call is refused; `None` when it is allowed.
    pub refusal: Option<router::Refusal>,
    /// Whether `Route` answers the tool for the conversation now.
    pub visible_now: bool,
}

/// What `SearchTools` found, and which groups it loaded.
#[derive(Debug)]
pub struct Searched {
    /// The view it was answered from.
    pub view: Arc<View>,
    /// The ranked tools, best first.
    pub hits: Vec<ToolMatch>,
    /// The groups loaded into the conversation, in rank order.
    pub loaded: Vec<DomainId>,
    /// Those of them the conversation had not loaded before.
    pub newly_loaded: Vec<DomainId>,
}

/// Runs a change of the stored domains to its end, its caller gone or not: the database
/// write and the registry swap that follows it go together. A call cut at its deadline
/// between the two (a write waiting on a lock another writer held, then committing) left
/// the database changed and the old registry served until the next reload.
async fn to_the_end<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    tokio::spawn(work)
        .await
        .map_err(|e| Error::Internal(format!("a registry change failed: {e}")))?
}

/// Runs pure, CPU-bound work (parsing, building a registry) on the blocking pool.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Internal(format!("a registry task failed: {e}")))
}

/// Resolves when `notices` has news (several waiting make one); pending forever once there
/// is no receiver or it is closed.
async fn next_notice(notices: &mut Option<tokio::sync::mpsc::Receiver<crate::db::Notice>>) {
    if let Some(rx) = notices {
        if crate::db::next_notices(rx).await.is_some() {
            return;
        }
        *notices = None;
    }
    std::future::pending::<()>().await;
}

/// Resolves at the retry's time; never without one.
async fn retry_at(retry: Option<(tokio::time::Instant, Duration)>) {
    match retry {
        Some((at, _)) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
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
    /// Where the registry comes from. Its lock serialises every registry change (reloads,
    /// upserts, deletes), so the last one to finish is the last one started, and the
    /// database and the served registry change in the same order.
    sources: tokio::sync::Mutex<Sources>,
    /// When the daemon started, for `DescribeServer`'s uptime.
    started: std::time::Instant,
    /// The effective configuration, for `DescribeServer` (as TOML, secrets left out).
    config: Config,
    /// The database URL, credentials removed.
    database: String,
    /// The server's budget: `--max-tools` (0: none) and `--token-budget`.
    limits: Limits,
    /// The profiles consumers name (SPEC §10).
    profiles: Arc<Profiles>,
    /// The view `WatchRegistry` streams follow: replaced when the registry, the active
    /// domains or the disabled tools change (SPEC §11).
    events: tokio::sync::watch::Sender<Arc<View>>,
    /// Turns true when the daemon starts draining: streams end.
    stopping: tokio::sync::watch::Sender<bool>,
    /// The trims that hand back a replaced registry's memory once no call reads it.
    trims: Arc<view::Trims>,
    /// The settings TTL: how often the settings are re-read while someone watches.
    settings_ttl: Duration,
}

/// What `DescribeServer` reports.
#[derive(Debug, Clone)]
pub struct Description {
    /// The registry's version.
    pub registry_version: u64,
    /// Its domains (those a bound profile sees, whatever the settings activate).
    pub domains: usize,
    /// Its tools (those a bound profile sees, whatever the settings activate, less the
    /// disabled tools).
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

/// What `UpsertDomain` changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upserted {
    /// The domain's name.
    pub domain: String,
    /// Whether no domain of this name was stored before.
    pub created: bool,
    /// Its tools.
    pub tools: usize,
    /// The registry's version now.
    pub registry_version: u64,
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
    /// Whether the run-time domains were read from the database (else the ones served so
    /// far were kept).
    pub runtime_read: bool,
}

impl State {
    /// Opens the database, reads the settings and the domains registered at run time, and
    /// builds the automaton. `registry` is the manifests' (files or the demo); the state
    /// serves it with the run-time domains that fit beside it (see [`State::reload`]).
    ///
    /// # Errors
    /// A database fault or an automaton too large to build.
    pub async fn new(registry: Registry, config: &Config) -> Result<State> {
        let db = Db::connect_with(&config.database, config.busy_timeout)
            .await?
            .within_requests_of(config.request_timeout);
        let settings = SettingsCache::new(db.clone(), config.settings_ttl).await?;
        let snapshot = settings.get().await;
        let manifests = registry.into_domains();
        let (registry, runtime) = compose(&manifests, parse_stored(db.read_domains().await?));
        if !runtime.is_empty() {
            tracing::info!(
                runtime_domains = runtime.len(),
                registry_version = %format!("{:016x}", registry.version()),
                "serving the domains registered at run time too"
            );
        }
        let parts = Parts::build(registry, config.keyword_match)?;
        let options = config.routing();
        let profiles = Arc::new(config.profiles()?);
        let view = Arc::new(View::new(parts, snapshot, &options, profiles.clone()));
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
                view: ArcSwap::new(view.clone()),
                events: tokio::sync::watch::Sender::new(view),
                stopping: tokio::sync::watch::Sender::new(false),
                trims: Arc::new(view::Trims::new()),
                settings_ttl: config.settings_ttl,
                manifests: config.manifests.clone(),
                keyword_match: config.keyword_match,
                sources: tokio::sync::Mutex::new(Sources { manifests, runtime }),
                started: std::time::Instant::now(),
                config: config.clone(),
                database: crate::db::redact_url(&config.database),
                limits: Limits {
                    max_tools: (config.max_tools > 0).then_some(u64::from(config.max_tools)),
                    token_budget: config.token_budget.filter(|&b| b > 0).map(u64::from),
                },
                profiles,
            }),
        })
    }

    /// What the daemon serves and from where, as a caller bound to `profile` (SPEC §10)
    /// may see it.
    pub fn describe(&self, profile: Option<&str>) -> Description {
        let view = self.inner.view.load();
        let registry = &view.registry;
        // A bound token counts what its profile sees, as `ListAllTools` lists it.
        let (domains, tools) = match profile.and_then(|p| self.inner.profiles.find(p)) {
            Some(id) => {
                let scope = view.scope(Some(id));
                registry
                    .domain_ids()
                    .filter(|&d| scope.activation.is_visible(d))
                    .fold((0, 0), |(domains, tools), d| {
                        (domains + 1, tools + scope.activation.visible_count(registry, d))
                    })
            }
            None => (registry.domains().len(), registry.tool_count()),
        };
        Description {
            registry_version: registry.version(),
            domains,
            tools,
            database: self.inner.database.clone(),
            database_path: self.inner.db.path().map(crate::db::absolute),
            settings_age: self.inner.settings.age(),
            uptime: self.inner.started.elapsed(),
            config_toml: self.inner.config.to_toml_for(profile),
        }
    }

    /// The registry served now, without reading the settings (however old they are).
    pub(crate) fn served_registry(&self) -> Arc<Registry> {
        self.inner.view.load().registry.clone()
    }

    /// Claims the SQLite file for this daemon until it exits: one daemon per file, also for
    /// a file restored over it later (see `Db::claim`). Nothing on PostgreSQL.
    ///
    /// # Errors
    /// `Unavailable` naming the file: another daemon serves it, or it cannot be written.
    pub fn claim_database(&self) -> Result<()> {
        self.inner.db.claim()
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

    /// The view for this snapshot, deriving activation only when the snapshot changed. It is
    /// served to every caller (and told to watchers) when it is the newest snapshot read: a
    /// caller that took the snapshot before a re-read answers from its own view, and never
    /// puts the older settings back.
    fn view_for(&self, snapshot: Arc<Snapshot>) -> Arc<View> {
        self.settle(self.inner.view.load_full(), snapshot)
    }

    /// [`State::view_for`] starting from `view`, the view served when `snapshot` was taken,
    /// which may have been replaced since.
    fn settle(&self, mut view: Arc<View>, snapshot: Arc<Snapshot>) -> Arc<View> {
        loop {
            if Arc::ptr_eq(&view.settings, &snapshot) {
                return view;
            }
            let next = Arc::new(View::new(
                view.parts(),
                snapshot.clone(),
                &self.inner.options,
                self.inner.profiles.clone(),
            ));
            if !Arc::ptr_eq(&self.inner.settings.newest(), &snapshot) {
                return next;
            }
            // Only over the view it was derived from. When another swap came first (a
            // reload, which keeps the settings it found, or a newer snapshot's view), this
            // snapshot is tried again over what won: without it, settings re-read while a
            // registry was swapped in would reach watchers only with the next call.
            let previous = self.inner.view.compare_and_swap(&view, next.clone());
            if Arc::ptr_eq(&previous, &view) {
                self.publish();
                return next;
            }
            view = arc_swap::Guard::into_inner(previous);
        }
    }

    /// Tells watchers about the view served now when it differs from what they saw in what
    /// they are told (the active domains or the disabled tools) or is another registry build:
    /// every reload is news (SPEC §11), even one that found nothing changed. The
    /// view is read under the channel's lock, not handed in by the swap that calls this: a
    /// swapper that publishes late (after a newer swap published) tells the newest view
    /// again, never its own older one.
    fn publish(&self) {
        self.inner.events.send_if_modified(|seen| {
            let view = self.inner.view.load_full();
            let changed = seen.build() != view.build()
                || !seen.activation.active().eq(view.activation.active())
                || seen.settings.disabled() != view.settings.disabled();
            if changed {
                *seen = view;
            }
            changed
        });
    }

    /// A receiver of the view as watchers see it (the current one first), and a receiver
    /// that turns true when the daemon starts draining.
    pub(crate) fn watch(
        &self,
    ) -> (
        tokio::sync::watch::Receiver<Arc<View>>,
        tokio::sync::watch::Receiver<bool>,
    ) {
        (self.inner.events.subscribe(), self.inner.stopping.subscribe())
    }

    /// Ends every `WatchRegistry` stream (the daemon is draining).
    pub(crate) fn stop_watchers(&self) {
        self.inner.stopping.send_replace(true);
    }

    /// The profile a request names, checked against the one its auth token is bound to
    /// (SPEC §10): an empty name means the bound profile, or none.
    ///
    /// # Errors
    /// `UnknownProfile`, or `ProfileNotAllowed` when the token is bound to another one.
    pub fn profile(&self, named: &str, bound: Option<&str>) -> Result<Option<ProfileId>> {
        let name = match (named, bound) {
            ("", None) => return Ok(None),
            ("", Some(b)) => b,
            (n, Some(b)) if n != b => {
                return Err(Error::ProfileNotAllowed {
                    named: n.to_string(),
                    bound: b.to_string(),
                });
            }
            (n, _) => n,
        };
        let profiles = &self.inner.profiles;
        profiles
            .find(name)
            .map(Some)
            .ok_or_else(|| Error::UnknownProfile {
                name: name.to_string(),
                known: profiles.names().map(str::to_string).collect(),
            })
    }

    /// A profile's name.
    pub fn profile_name(&self, id: ProfileId) -> &str {
        &self.inner.profiles.get(id).name
    }

    /// Routes one message (SPEC §4) for a consumer, recording new keyword and search hits in
    /// the conversation before answering, unless `dry_run`, then fits the answer to the
    /// budget (SPEC §9).
    ///
    /// # Errors
    /// None today: a conversation store fault degrades the answer instead (see above).
    pub async fn route(&self, message: &str, options: RouteOptions<'_>) -> Result<Routed> {
        let (view, mut decision) = self
            .decide(message, options.conversation, options.profile, options.dry_run)
            .await;
        let scope = view.scope(options.profile);
        let format = options.format.unwrap_or(Format::OpenAiChat);
        let limits = Limits::resolve(
            (options.max_tools, options.token_budget),
            scope.profile.map(|p| (p.max_tools, p.token_budget)),
            self.inner.limits,
        );
        let mut dropped = Vec::new();
        if limits != Limits::default() {
            let meta = scope.meta_rendered(format);
            let fixed = Cost {
                tools: meta.len() as u64,
                tokens: u64::from(meta.tokens(0..meta.len())),
            };
            dropped = budget::fit(&mut decision, fixed, |d| scope.domain_cost(d, format), limits);
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
        profile: Option<ProfileId>,
        dry_run: bool,
    ) -> (Arc<View>, Decision) {
        let view = self.view().await;
        let decide = |conversation: Option<&router::Conversation>| {
            router::route(
                view.inputs(),
                view.scope(profile).activation,
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
        // A turn is answered even when the conversation store cannot be used: with the
        // conversation's state this daemon holds (none if it holds none), and without
        // remembering this turn's hits.
        // A dry run records nothing about the conversation: not its idle clock, nor that it
        // was idle long enough to be forgotten.
        let locked = if dry_run {
            convs.lock_dry(id).await
        } else {
            convs.lock(id).await
        };
        let mut entry = match locked {
            Ok(entry) => entry,
            Err(e) => {
                let held = convs.held(id).await;
                tracing::warn!(
                    error = %e,
                    held = held.is_some(),
                    "conversation unavailable; routing with the state held in memory, if any"
                );
                let decision = decide(held.as_ref());
                return (view, decision);
            }
        };
        if dry_run {
            let decision = decide(Some(entry.state()));
            return (view, decision);
        }
        let registry = &view.registry;
        let (decision, recorded) = entry
            .update(Mark::Hit, |state| {
                let decision = decide(Some(state));
                let names = decision
                    .new_hits
                    .iter()
                    .map(|&d| registry.domain(d).name.as_str())
                    .collect();
                (decision, names)
            })
            .await;
        if let Err(e) = recorded {
            tracing::warn!(error = %e, "cannot remember this turn's keyword hits");
        }
        (view, decision)
    }

    /// Loads a group into a conversation (SPEC §5), persisted before answering.
    ///
    /// # Errors
    /// `NotFound`/`FailedPrecondition` as the router decides, or a database fault.
    pub(crate) async fn load_group(
        &self,
        conversation_id: &str,
        group: &str,
        profile: Option<ProfileId>,
    ) -> Result<Loaded> {
        let view = self.view().await;
        let convs = &self.inner.conversations;
        let mut entry = convs.lock(conversation_id).await?;
        let activation = view.scope(profile).activation;
        let (load, recorded) = entry
            .update(Mark::Loaded, |state| {
                let load = router::load(&view.registry, activation, state, group);
                let names = match &load {
                    Ok(load) if !load.already_loaded => vec![group],
                    _ => Vec::new(),
                };
                (load, names)
            })
            .await;
        recorded?;
        Ok(Loaded { view, load: load? })
    }

    /// Searches the tools a consumer may see (SPEC §5 `SearchTools`); with a conversation
    /// and `load`, loads the active non-core groups of the top hits (at most
    /// [`MAX_SEARCH_LOADS`], chosen in rank order, joining by name) into it, persisted
    /// before answering.
    ///
    /// # Errors
    /// A database fault while loading.
    pub async fn search_tools(
        &self,
        query: &str,
        limit: usize,
        load_into: Option<&str>,
        profile: Option<ProfileId>,
    ) -> Result<Searched> {
        let view = self.view().await;
        let activation = view.scope(profile).activation;
        let hits = view.index.search_tools(query, limit, activation.tool_mask());
        let (mut loaded, mut newly_loaded) = (Vec::new(), Vec::new());
        if let Some(id) = load_into {
            let registry = &view.registry;
            let mut groups: Vec<DomainId> = Vec::new();
            for h in &hits {
                let d = registry.domain(h.domain);
                if activation.is_active(h.domain)
                    && !d.core
                    && !groups.contains(&h.domain)
                    && groups.len() < MAX_SEARCH_LOADS
                {
                    groups.push(h.domain);
                }
            }
            if !groups.is_empty() {
                let mut entry = self.inner.conversations.lock(id).await?;
                // Domains joining on one turn join by name (SPEC §4); the answer keeps rank.
                let mut joining = groups.clone();
                joining.sort_unstable();
                let names: Vec<&str> = joining
                    .iter()
                    .map(|&d| registry.domain(d).name.as_str())
                    .collect();
                let recorded;
                (newly_loaded, recorded) = entry
                    .update(Mark::Loaded, |state| {
                        let newly: Vec<DomainId> = groups
                            .iter()
                            .copied()
                            .filter(|&d| !state.is_loaded(&registry.domain(d).name))
                            .collect();
                        (newly, names.clone())
                    })
                    .await;
                recorded?;
                loaded = groups;
            }
        }
        Ok(Searched {
            view,
            hits,
            loaded,
            newly_loaded,
        })
    }

    /// Where a call of `tool` stands for a consumer in a conversation (SPEC §10
    /// `CheckToolCall`): visible now when `Route` would answer it for the conversation's
    /// state (a message that hits nothing, nothing recorded, the budget applied). A
    /// meta-tool that answer carries is allowed and visible; one it does not is unknown.
    ///
    /// # Errors
    /// None today (as [`State::route`]).
    pub async fn check_call(
        &self,
        tool: &str,
        conversation: Option<&str>,
        profile: Option<ProfileId>,
    ) -> Result<CallCheck> {
        let options = RouteOptions {
            conversation,
            dry_run: true,
            profile,
            ..RouteOptions::default()
        };
        let routed = self.route("", options).await?;
        let scope = routed.view.scope(profile);
        // The meta-tools an answer starts with are the daemon's own: callable whenever the
        // answer carries them.
        if routed
            .decision
            .meta_tools(scope.activation)
            .any(|t| t.name == tool)
        {
            return Ok(CallCheck {
                view: routed.view.clone(),
                domain: None,
                refusal: None,
                visible_now: true,
            });
        }
        let shown = |d: DomainId| routed.decision.domains.iter().any(|inc| inc.domain == d);
        let (domain, refusal) = router::check_call(
            &routed.view.registry,
            &routed.view.settings,
            scope.profile,
            scope.activation,
            tool,
            shown,
        );
        let visible_now = domain.is_some_and(|d| {
            shown(d)
                && scope
                    .activation
                    .visible_tools(&routed.view.registry, d)
                    .any(|t| t.name == tool)
        });
        Ok(CallCheck {
            view: routed.view,
            domain,
            refusal,
            visible_now,
        })
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

    /// Forgets one conversation.
    ///
    /// # Errors
    /// A database fault.
    pub async fn reset_conversation(&self, id: &str) -> Result<()> {
        self.inner.conversations.reset(id).await
    }

    /// Runs conversation upkeep every `period`, and re-reads the settings every TTL (and
    /// takes the settings a notification brought, on PostgreSQL) while a `WatchRegistry`
    /// stream is open (so it hears of a change without other traffic); on PostgreSQL,
    /// reloads the registry when another daemon changed the run-time domains; until
    /// `shutdown` resolves (the final flush is [`State::close`]'s).
    pub(crate) async fn maintain(&self, period: Duration, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut domains = self.inner.db.notices(crate::db::Topic::Domains);
        let mut domains_retry = None;
        let mut upkeep = tokio::time::interval(period);
        upkeep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        upkeep.reset();
        let mut file_generation = self.inner.db.generation();
        // Upkeep runs as a task of its own, beside the other duties and not in their way:
        // with many conversations its writes take seconds, and another daemon's domain change
        // must not wait for them (nor it for theirs, holding a conversation's lock).
        let mut running: Option<tokio::task::JoinHandle<u64>> = None;
        // The settings are re-read for watchers when the snapshot turns stale, not on a clock
        // of its own: a tick just before that would skip a read and hear a change a TTL late.
        let settings = tokio::time::sleep(self.inner.settings_ttl);
        tokio::pin!(settings);
        loop {
            tokio::select! {
                () = &mut shutdown => {
                    // An upkeep under way ends first: cut, it could leave clocks unwritten.
                    if let Some(upkeep) = running.take() {
                        let _ = upkeep.await;
                    }
                    break;
                }
                _ = upkeep.tick(), if running.is_none() => {
                    let state = self.clone();
                    running = Some(tokio::spawn(async move { state.upkeep(file_generation).await }));
                }
                ended = async {
                    match running.as_mut() {
                        Some(upkeep) => upkeep.await,
                        None => std::future::pending().await,
                    }
                } => {
                    running = None;
                    match ended {
                        Ok(generation) => file_generation = generation,
                        Err(e) => tracing::error!(error = %e, "conversation upkeep failed"),
                    }
                }
                () = &mut settings => {
                    let watched = self.inner.events.receiver_count() > 0;
                    if watched {
                        self.view().await;
                    }
                    // Without watchers nobody needs the read: look again a TTL on.
                    let now = std::time::Instant::now();
                    let next = if watched { self.inner.settings.stale_at() } else { now + self.inner.settings_ttl };
                    let next = next.max(now + Duration::from_millis(10));
                    settings.as_mut().reset(tokio::time::Instant::from_std(next));
                }
                // Re-read on another daemon's or a settings UI's notice (PostgreSQL).
                () = self.inner.settings.reread_on_notice() => {
                    if self.inner.events.receiver_count() > 0 {
                        self.view().await;
                    }
                }
                // Another daemon upserted or deleted a run-time domain, or the listening
                // connection came back (what it missed is unknown): rebuild (PostgreSQL).
                () = next_notice(&mut domains) => {
                    domains_retry = self.take_runtime_domains(None).await;
                }
                () = retry_at(domains_retry) => {
                    domains_retry = self.take_runtime_domains(domains_retry).await;
                }
            }
        }
    }

    /// One conversation upkeep; then, when a backup moved over the SQLite file since the
    /// file `generation` served, the run-time domains it holds. Returns the generation now
    /// served.
    async fn upkeep(&self, generation: u64) -> u64 {
        if let Err(e) = self.inner.conversations.maintain().await {
            tracing::error!(error = %e, "conversation upkeep failed");
        }
        let now = self.inner.db.generation();
        if now == generation {
            return generation;
        }
        match self
            .take_stored_domains(REPLACED_FILE)
            .await
            .and_then(|read| read)
        {
            Ok(()) => now,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot read the run-time domains of the replaced database file; trying again at the next upkeep"
                );
                generation
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

#[cfg(test)]
mod tests;
