//! The shared state and the operations the gRPC service and the tests call: each one takes
//! a consistent view (registry, automaton, settings snapshot, activation), asks the pure
//! router, and persists what the decision changed before answering. The registry it serves
//! is the manifests' domains plus the domains registered at run time (stored in the
//! database); reloads, upserts and deletes rebuild it one at a time and swap it in whole.

use std::any::Any;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use bytes::Bytes;

use crate::config::Config;
use crate::conversations::Conversations;
use crate::db::Db;
use crate::error::{Error, Result};
use crate::error::{ManifestErrors, echo};
use crate::matcher::{MatchMode, Matcher};
use crate::registry::{Domain, DomainId, Registry, Tool, manifest};
use crate::render::{Format, LazyRenders, Rendered, Renders};
use crate::router::budget::{self, Cost, Dropped, Limits};
use crate::router::{
    self, Activation, Decision, Inputs, Load, Mark, Options, Profile, ProfileId, Profiles, Snapshot,
};
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
    /// What the snapshot means for the registry, for a consumer without a profile.
    pub activation: Activation,
    /// The registry's tools rendered per provider format, with their token counts.
    pub renders: Arc<Renders>,
    /// The meta-tools of this activation (as the options expose them), rendered per format.
    meta: LazyRenders,
    /// The last fallback answer built per format, for a consumer without a profile.
    remembered: Remembered,
    /// Whether answers carry the meta-tools (the routing options, fixed for a daemon).
    expose: (bool, bool),
    /// The daemon's profiles.
    profiles: Arc<Profiles>,
    /// Activation and meta-tools per profile, derived on the profile's first call.
    scoped: Box<[OnceLock<Scoped>]>,
}

/// Activation under one profile, and its meta-tools.
#[derive(Debug)]
struct Scoped {
    activation: Activation,
    meta: LazyRenders,
    remembered: Remembered,
}

/// One consumer's view: a [`View`] under a profile (or none).
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// The view.
    pub view: &'a View,
    /// What the settings and the profile leave this consumer.
    pub activation: &'a Activation,
    /// The profile, if any.
    pub profile: Option<&'a Profile>,
    meta: &'a LazyRenders,
    remembered: &'a Remembered,
}

/// Per answer format (native first), the parts of the last fallback answer a caller built in
/// one view and profile, with the decision they answer: a message that matches nothing gets
/// the decision the previous such message got, and on a large registry that answer is the
/// largest and its per-domain parts the costliest to build. Kept in the view, so it never
/// outlives the registry and settings it was built from.
#[derive(Debug, Default)]
struct Remembered {
    slots: [ArcSwapOption<Answer>; 1 + Format::ALL.len()],
}

/// Parts of an answer (opaque here; built by the caller) and the decision they answer.
struct Answer {
    decision: Decision,
    parts: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("decision", &self.decision)
            .finish_non_exhaustive()
    }
}

impl View {
    fn new(parts: Parts, settings: Arc<Snapshot>, options: &Options, profiles: Arc<Profiles>) -> View {
        let Parts {
            registry,
            matcher,
            index,
            renders,
        } = parts;
        let activation = Activation::new(&registry, &settings);
        View {
            registry,
            matcher,
            index,
            settings,
            activation,
            renders,
            meta: LazyRenders::default(),
            remembered: Remembered::default(),
            expose: (options.expose_load_tool_group, options.expose_search_tools),
            scoped: (0..profiles.len()).map(|_| OnceLock::new()).collect(),
            profiles,
        }
    }

    /// Whether answers carry the `load_tool_group` meta-tool (`--expose-load-tool-group`).
    pub(crate) fn exposes_load_tool(&self) -> bool {
        self.expose.0
    }

    /// What the view is built from besides the settings.
    fn parts(&self) -> Parts {
        Parts {
            registry: self.registry.clone(),
            matcher: self.matcher.clone(),
            index: self.index.clone(),
            renders: self.renders.clone(),
        }
    }

    /// The registry's tools in `format`.
    pub fn rendered(&self, format: Format) -> &Rendered {
        self.renders.get(&self.registry, format)
    }

    /// The view for a consumer with this profile (none: only disabled tools are hidden).
    pub fn scope(&self, profile: Option<ProfileId>) -> Scope<'_> {
        let Some(id) = profile else {
            return Scope {
                view: self,
                activation: &self.activation,
                profile: None,
                meta: &self.meta,
                remembered: &self.remembered,
            };
        };
        let p = self.profiles.get(id);
        let scoped = self.scoped[id.index()].get_or_init(|| Scoped {
            activation: Activation::scoped(&self.registry, &self.settings, Some(p)),
            meta: LazyRenders::default(),
            remembered: Remembered::default(),
        });
        Scope {
            view: self,
            activation: &scoped.activation,
            profile: Some(p),
            meta: &scoped.meta,
            remembered: &scoped.remembered,
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

impl<'a> Scope<'a> {
    /// The meta-tools answers start with, in `format`: both, either or none, as the options
    /// expose them and the activation has them.
    pub fn meta_rendered(&self, format: Format) -> &'a Rendered {
        self.meta.get(format, || self.meta_tools())
    }

    /// The meta-tools answers start with, as native `Tool` entries.
    pub fn meta_native(&self) -> Bytes {
        self.meta.native(|| self.meta_tools())
    }

    /// The system-prompt section of the groups this consumer may load, telling the model to
    /// load them with `load_tool_group` only when answers carry it.
    pub fn prompt_section(&self) -> String {
        self.activation
            .prompt_section(&self.view.registry, self.view.exposes_load_tool())
    }

    fn meta_tools(&self) -> Vec<&'a Tool> {
        let (activation, expose) = (self.activation, self.view.expose);
        let load = activation.meta_tool().filter(|_| expose.0);
        let search = activation.search_tool().filter(|_| expose.1);
        load.into_iter().chain(search).collect()
    }

    /// A domain's visible tools as runs of rendered tools (registry-order ranges).
    pub fn runs(&self, d: DomainId) -> impl Iterator<Item = std::ops::Range<usize>> + 'a {
        self.activation.runs(self.view.registry.tool_range(d))
    }

    /// A domain's visible tools' tokens in `format`.
    pub fn domain_tokens(&self, d: DomainId, format: Format) -> u32 {
        let rendered = self.view.rendered(format);
        self.runs(d).map(|r| rendered.tokens(r)).sum()
    }

    /// What a domain's visible tools cost in `format`.
    pub fn domain_cost(&self, d: DomainId, format: Format) -> Cost {
        Cost {
            tools: self.activation.visible_count(&self.view.registry, d) as u64,
            tokens: u64::from(self.domain_tokens(d, format)),
        }
    }

    /// Pushes a domain's visible tools, rendered in `format`, onto an answer's pieces.
    pub fn push_pieces(&self, d: DomainId, format: Format, pieces: &mut Vec<Bytes>) {
        let rendered = self.view.rendered(format);
        pieces.extend(self.runs(d).map(|r| rendered.span(r)));
    }

    /// The parts of the answer to `decision` in `format` (`None`: native) that `build` makes:
    /// built now, or the ones remembered from the last fallback answer of this scope and
    /// format when `decision` equals its decision. A fallback's parts are remembered.
    /// `build` must depend on nothing but this scope, `decision` and `format`.
    pub fn answer_parts<T: Any + Send + Sync>(
        &self,
        decision: &Decision,
        format: Option<Format>,
        build: impl FnOnce() -> T,
    ) -> Arc<T> {
        let slot = &self.remembered.slots[format.map_or(0, |f| 1 + f.index())];
        if decision.fallback
            && let Some(answer) = &*slot.load()
            && answer.decision == *decision
            && let Ok(parts) = Arc::clone(&answer.parts).downcast::<T>()
        {
            return parts;
        }
        let parts = Arc::new(build());
        if decision.fallback {
            slot.store(Some(Arc::new(Answer {
                decision: decision.clone(),
                parts: parts.clone(),
            })));
        }
        parts
    }

    /// Appends a domain's visible tools as native `Tool` entries encoded once per registry.
    pub fn push_native(&self, d: DomainId, entries: &mut Vec<Bytes>) {
        let encoded = self.view.renders.native(&self.view.registry);
        entries.extend(self.runs(d).map(|r| encoded.span(r)));
    }
}

/// What a view is built from besides the settings: all derived from one registry.
#[derive(Debug, Clone)]
struct Parts {
    registry: Arc<Registry>,
    matcher: Arc<Matcher>,
    index: Arc<SearchIndex>,
    renders: Arc<Renders>,
}

impl Parts {
    /// Builds the automaton, then the search index and the renders (with their token counts)
    /// side by side: both are pure and take tens of milliseconds on a large registry.
    fn build(registry: Registry, keyword_match: MatchMode) -> Result<Parts> {
        let matcher = Matcher::new(registry.keywords(), keyword_match)?;
        let (index, renders) = std::thread::scope(|s| {
            let renders = s.spawn(|| Renders::new(&registry));
            let index = SearchIndex::new(&registry);
            // A panic while rendering is a bug; it goes on as this thread's panic.
            let renders = renders.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            (index, renders)
        });
        release_free_memory();
        Ok(Parts {
            registry: Arc::new(registry),
            matcher: Arc::new(matcher),
            index: Arc::new(index),
            renders: Arc::new(renders),
        })
    }
}

/// Hands the memory freed by a registry build (manifest documents, schema checks, the index
/// and render builders' scratch: tens of MiB on a large registry) back to the system. glibc
/// keeps freed memory between live allocations for reuse, and a build happens at start and
/// on reloads only, so the process would otherwise hold its peak for good.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only returns free pages to the system.
    unsafe {
        libc::malloc_trim(0);
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

/// Where the registry a daemon serves comes from, kept so that a reload, an upsert or a
/// delete rebuilds it from what did not change.
struct Sources {
    /// The domains of the manifests (the folders, or the built-in demo registry), as last
    /// loaded.
    manifests: Vec<Domain>,
    /// The domains registered at run time that the registry serves (all stored in the
    /// database; a stored one that does not fit beside the manifests is not here).
    runtime: Vec<Domain>,
}

impl Sources {
    /// The manifests' domain of this name.
    fn manifest_domain(&self, name: &str) -> Option<&Domain> {
        self.manifests.iter().find(|d| d.name == name)
    }

    /// Every domain served, except the run-time domain `name`.
    fn without(&self, name: &str) -> Vec<Domain> {
        let mut domains = self.manifests.clone();
        domains.extend(self.runtime.iter().filter(|d| d.name != name).cloned());
        domains
    }
}

/// `Domain::source` (and the label of every problem) of a manifest sent to `UpsertDomain`:
/// the domain's name once the text has one, else the request field.
fn upsert_source(name: Option<&str>) -> String {
    name.map_or_else(|| "manifest_json".to_string(), |n| format!("upsert:{}", echo(n)))
}

/// `Domain::source` of a run-time domain read back from the database.
fn stored_source(name: &str) -> String {
    format!("database domain {}", echo(name))
}

/// The stored run-time domains that still parse, by name. One that does not (a manifest
/// written by another version, or edited by hand) is logged with why and left out; its row
/// stays.
fn parse_stored(rows: Vec<(String, String)>) -> Vec<Domain> {
    rows.into_iter()
        .filter_map(|(name, text)| {
            let parsed = manifest::parse_native(&text, |_| stored_source(&name))
                .map_err(|e| ManifestErrors(e).to_string())
                .and_then(|d| {
                    if d.name == name {
                        Ok(d)
                    } else {
                        Err(format!("its manifest names another domain, `{}`", d.name))
                    }
                });
            parsed
                .map_err(|cause| {
                    tracing::warn!(
                        domain = %name,
                        %cause,
                        "a domain registered at run time does not parse; left out of the registry (its row stays)"
                    );
                })
                .ok()
        })
        .collect()
}

/// Whether a run-time domain change (`name` upserted as `new`, or deleted when `new` is
/// none) is one every daemon will serve as asked, judged on the run-time domains as `stored`
/// (every row, by name) beside the manifests, as every daemon composes them: the new domain
/// fits beside the others served, and no domain served now stops being served (a stored one
/// the change lets back in would push it out). How the change is refused when it is not.
fn check_change(
    manifests: &[Domain],
    stored: Vec<(String, String)>,
    name: &str,
    new: Option<Domain>,
) -> Result<()> {
    let parsed = parse_stored(stored);
    let (before, _) = Registry::compose(manifests.to_vec(), parsed.clone());
    let mut after: Vec<Domain> = parsed.into_iter().filter(|d| d.name != name).collect();
    let upsert = new.is_some();
    if let Some(domain) = new {
        // Beside the others as they would be served, last: a clash is the new domain's,
        // naming the one it clashes with.
        let (others, _) = Registry::compose(manifests.to_vec(), after.clone());
        let mut domains = others.into_domains();
        domains.push(domain.clone());
        Registry::new(domains).map_err(Error::DomainRefused)?;
        // Rows come by name, in byte order (PostgreSQL's "C" collation, SQLite's binary one).
        let at = after.partition_point(|d| d.name.as_str() < domain.name.as_str());
        after.insert(at, domain);
    }
    let (after, _) = Registry::compose(manifests.to_vec(), after);
    let lost: Vec<String> = before
        .domains()
        .iter()
        .filter(|d| d.name != name && after.find(&d.name).is_none())
        .map(|d| d.name.clone())
        .collect();
    if lost.is_empty() {
        return Ok(());
    }
    let verb = if upsert { "Upserting" } else { "Deleting" };
    Err(Error::ChangeLeavesOut {
        change: format!("{verb} domain '{}'", crate::error::echo(name)),
        lost,
    })
}

/// The registry a daemon on a database holding these run-time domains (name, manifest)
/// serves over `manifests` (as [`State::new`] composes it; `eval` measures it).
pub fn with_stored_domains(manifests: Registry, rows: Vec<(String, String)>) -> Registry {
    compose(&manifests.into_domains(), parse_stored(rows)).0
}

/// The registry of the manifests' domains and of each run-time domain that fits beside them.
/// One that does not (a manifest now defines its name, or one of its tool names) is logged
/// with why and left out; it stays stored, and comes back once it fits again.
fn compose(manifests: &[Domain], runtime: Vec<Domain>) -> (Registry, Vec<Domain>) {
    let (registry, left_out) = Registry::compose(manifests.to_vec(), runtime);
    for (d, cause) in &left_out {
        tracing::warn!(
            domain = %d.name,
            %cause,
            "a domain registered at run time clashes with the manifests or another run-time domain; left out of the registry (it stays stored)"
        );
    }
    let from_manifests: std::collections::HashSet<&str> = manifests.iter().map(|d| d.name.as_str()).collect();
    let runtime = registry
        .domains()
        .iter()
        .filter(|d| !from_manifests.contains(d.name.as_str()))
        .cloned()
        .collect();
    (registry, runtime)
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

/// Logged when a replaced SQLite file's run-time domains are served.
const REPLACED_FILE: &str = "the database file was replaced: serving the run-time domains it holds";

/// Logged when the run-time domains another daemon changed are served.
const CHANGED_BY_ANOTHER_DAEMON: &str = "the run-time domains stored changed (another daemon's change, or a write of this one's that committed after it was cut): serving them as stored";

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
    /// they are told: the registry version, the active domains or the disabled tools. The
    /// view is read under the channel's lock, not handed in by the swap that calls this: a
    /// swapper that publishes late (after a newer swap published) tells the newest view
    /// again, never its own older one.
    fn publish(&self) {
        self.inner.events.send_if_modified(|seen| {
            let view = self.inner.view.load_full();
            let changed = seen.registry.version() != view.registry.version()
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

    /// Reloads the manifests from where they were first loaded, with the run-time domains
    /// re-read from the database, and swaps the registry in whole: a call in flight answers
    /// from the old registry or the new one, never a mix. Invalid manifests leave the old
    /// registry serving. A run-time domain that no longer fits beside the manifests is left
    /// out with a warning (it stays stored); while the database cannot be read, the run-time
    /// domains served so far are kept.
    ///
    /// # Errors
    /// `FailedPrecondition` listing every manifest problem, or an automaton too large.
    pub async fn reload(&self) -> Result<Reloaded> {
        let mut sources = self.inner.sources.lock().await;
        let read = self.inner.db.read_domains().await;
        let runtime_read = read.is_ok();
        let (rows, kept) = match read {
            Ok(rows) => (Some(rows), Vec::new()),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot read the domains registered at run time; the reload keeps the ones served"
                );
                (None, sources.runtime.clone())
            }
        };
        let dirs = self.inner.manifests.clone();
        let keyword_match = self.inner.keyword_match;
        let built = blocking(move || {
            let manifests = Registry::load(&dirs)?.into_domains();
            let (registry, runtime) = compose(&manifests, rows.map_or(kept, parse_stored));
            Ok::<_, Error>((Parts::build(registry, keyword_match)?, manifests, runtime))
        })
        .await?;
        let (parts, manifests, runtime) = match built {
            Ok(built) => built,
            Err(Error::Manifests(errors)) => {
                let version = self.inner.view.load().registry.version();
                return Err(Error::ManifestsRefused { version, errors });
            }
            Err(other) => return Err(other),
        };
        self.install(&parts);
        *sources = Sources { manifests, runtime };
        let registry = &parts.registry;
        let reloaded = Reloaded {
            runtime_read,
            registry_version: registry.version(),
            domains: registry.domains().len(),
            tools: registry.tool_count(),
        };
        tracing::info!(
            registry_version = %format!("{:016x}", reloaded.registry_version),
            domain_count = reloaded.domains,
            runtime_domains = sources.runtime.len(),
            tools = reloaded.tools,
            "registry reloaded"
        );
        Ok(reloaded)
    }

    /// Serves the run-time domains as stored now, beside the manifests as last loaded (the
    /// manifest folders are not read again: that is a reload's), when they make another
    /// registry: after the SQLite file was replaced by a backup, whose stored domains may
    /// differ from those read at start, and after another daemon changed them (PostgreSQL).
    /// `why` is logged when the registry changed. The domains are read under the lock that
    /// orders registry changes, so a local upsert cannot be undone by an older read.
    ///
    /// # Errors
    /// `Ok(Err(_))` for a database fault reading them (the caller decides when to try
    /// again); `Err` for an automaton too large.
    async fn take_stored_domains(&self, why: &'static str) -> Result<Result<()>> {
        let mut sources = self.inner.sources.lock().await;
        let rows = match self.inner.db.read_domains().await {
            Ok(rows) => rows,
            Err(e) => return Ok(Err(e)),
        };
        let manifests = sources.manifests.clone();
        let keyword_match = self.inner.keyword_match;
        let served = self.inner.view.load().registry.version();
        let built = blocking(move || {
            let (registry, runtime) = compose(&manifests, parse_stored(rows));
            if registry.version() == served {
                return Ok(None);
            }
            Parts::build(registry, keyword_match).map(|parts| Some((parts, runtime)))
        })
        .await??;
        if let Some((parts, runtime)) = built {
            self.install(&parts);
            sources.runtime = runtime;
            tracing::info!(
                registry_version = %format!("{:016x}", parts.registry.version()),
                runtime_domains = sources.runtime.len(),
                "{why}"
            );
        }
        Ok(Ok(()))
    }

    /// Registers a domain from one native JSON manifest (SPEC §10), validated as a manifest
    /// file is and beside the rest of the registry, or replaces the one registered under its
    /// name. It is stored before the new registry is swapped in (as [`State::reload`] swaps):
    /// when the database write fails, nothing changed.
    ///
    /// # Errors
    /// `DomainRefused` listing every problem; `DomainFromManifestsExists` for a name the
    /// manifests define; a database fault; an automaton too large.
    pub async fn upsert_domain(&self, manifest_json: &str) -> Result<Upserted> {
        let (state, manifest_json) = (self.clone(), Arc::<str>::from(manifest_json));
        to_the_end(async move { state.upsert_domain_now(manifest_json).await }).await
    }

    /// [`State::upsert_domain`], cut short if its caller goes.
    async fn upsert_domain_now(&self, manifest_json: Arc<str>) -> Result<Upserted> {
        let text = manifest_json.clone();
        let domain = blocking(move || manifest::parse_native(&text, upsert_source))
            .await?
            .map_err(|e| Error::DomainRefused(ManifestErrors(e)))?;
        let mut sources = self.inner.sources.lock().await;
        if let Some(d) = sources.manifest_domain(&domain.name) {
            return Err(Error::DomainFromManifestsExists {
                name: domain.name,
                manifest: d.source.clone(),
                demo: self.inner.manifests.is_empty(),
            });
        }
        let mut domains = sources.without(&domain.name);
        // Last, so that a clash is reported at the new domain, naming the one it clashes with.
        domains.push(domain.clone());
        let parts = self.prepare(domains).await?;
        // What this daemon serves may lag what another one stored a moment ago: the domain
        // is stored only if it also fits beside the run-time domains as stored.
        let (manifests, candidate) = (sources.manifests.clone(), domain.clone());
        let created = self
            .inner
            .db
            .upsert_domain_if(
                &domain.name,
                &manifest_json,
                crate::conversations::now_ms(),
                move |stored| check_change(&manifests, stored, &candidate.name.clone(), Some(candidate)),
            )
            .await?;
        self.install(&parts);
        let upserted = Upserted {
            domain: domain.name.clone(),
            created,
            tools: domain.tools.len(),
            registry_version: parts.registry.version(),
        };
        sources.runtime.retain(|d| d.name != domain.name);
        sources.runtime.push(domain);
        Ok(upserted)
    }

    /// Removes a domain registered at run time (SPEC §10): deleted from the database first,
    /// then the registry without it is swapped in. Returns the registry's version now.
    ///
    /// # Errors
    /// `DomainFromManifestsKept` for a name the manifests define; `DomainNotFound` for one
    /// not registered at run time; a database fault (nothing changed).
    pub async fn delete_domain(&self, name: &str) -> Result<u64> {
        let (state, name) = (self.clone(), name.to_string());
        to_the_end(async move { state.delete_domain_now(&name).await }).await
    }

    /// [`State::delete_domain`], cut short if its caller goes.
    async fn delete_domain_now(&self, name: &str) -> Result<u64> {
        let mut sources = self.inner.sources.lock().await;
        if let Some(d) = sources.manifest_domain(name) {
            return Err(Error::DomainFromManifestsKept {
                name: name.to_string(),
                manifest: d.source.clone(),
                demo: self.inner.manifests.is_empty(),
            });
        }
        // A stored domain left out of the registry (it did not fit) is deleted from the
        // database only: the registry does not change. Fewer domains than a registry that
        // was valid cannot clash.
        let served = sources.runtime.iter().any(|d| d.name == name);
        let parts = if served {
            Some(self.prepare(sources.without(name)).await?)
        } else {
            None
        };
        // Deleting it must not let a stored domain back in that pushes out one served now.
        let manifests = sources.manifests.clone();
        let stored = self
            .inner
            .db
            .delete_domain_if(name, |rows| check_change(&manifests, rows, name, None))
            .await?;
        if !stored && !served {
            // Every stored domain, served or left out (a left-out one can be deleted too).
            let mut registered: Vec<String> = match self.inner.db.read_domains().await {
                Ok(rows) => rows.into_iter().map(|(name, _)| name).collect(),
                Err(_) => sources.runtime.iter().map(|d| d.name.clone()).collect(),
            };
            registered.sort();
            return Err(Error::DomainNotFound {
                name: name.to_string(),
                registered,
            });
        }
        let Some(parts) = parts else {
            return Ok(self.inner.view.load().registry.version());
        };
        self.install(&parts);
        sources.runtime.retain(|d| d.name != name);
        Ok(parts.registry.version())
    }

    /// The registry of `domains`, checked as [`Registry::new`] checks, and what answers read
    /// beside it, built on the blocking pool.
    ///
    /// # Errors
    /// `DomainRefused` listing every clash, or an automaton too large.
    async fn prepare(&self, domains: Vec<Domain>) -> Result<Parts> {
        let keyword_match = self.inner.keyword_match;
        blocking(move || {
            let registry = Registry::new(domains).map_err(Error::DomainRefused)?;
            Parts::build(registry, keyword_match)
        })
        .await?
    }

    /// Swaps a new registry in, keeping the settings snapshot of the view it replaces, and
    /// tells `WatchRegistry` streams.
    fn install(&self, parts: &Parts) {
        self.inner.view.rcu(|current| {
            View::new(
                parts.clone(),
                current.settings.clone(),
                &self.inner.options,
                self.inner.profiles.clone(),
            )
        });
        self.publish();
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

    /// Serves the run-time domains as stored now, after a notice that they changed (the
    /// manifests as last loaded: a notice is no reload, and a manifest mid-edit on this
    /// machine must not keep another daemon's change out); when they could not be read,
    /// when to try again (the notice's news is still to take, and no other notice may
    /// come): [`crate::db::NOTICE_RETRY`] after the first failure, twice the wait after
    /// each other (`retry`: the attempt this one is), at most a minute.
    async fn take_runtime_domains(
        &self,
        retry: Option<(tokio::time::Instant, Duration)>,
    ) -> Option<(tokio::time::Instant, Duration)> {
        match self.take_stored_domains(CHANGED_BY_ANOTHER_DAEMON).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => {
                let wait = retry.map_or(crate::db::NOTICE_RETRY, |(_, w)| {
                    (w * 2).min(Duration::from_secs(60))
                });
                tracing::warn!(
                    error = %e,
                    retry_in = %humantime::format_duration(wait),
                    "cannot read the run-time domains another daemon changed; the registry serves on"
                );
                Some((tokio::time::Instant::now() + wait, wait))
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot take the run-time domains another daemon changed; the registry serves on");
                None
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
mod tests {
    use super::*;

    #[tokio::test]
    async fn run_time_domains_that_cannot_be_read_after_a_notice_are_tried_again_later_and_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let config = Config {
            database: format!("sqlite://{}", path.display()),
            ..Config::default()
        };
        let state = State::new(Registry::demo(), &config).await.unwrap();
        assert_eq!(state.take_runtime_domains(None).await, None, "read: done");
        std::fs::rename(&path, dir.path().join("moved.db")).unwrap();
        let first = state.take_runtime_domains(None).await.expect("a retry");
        assert_eq!(first.1, crate::db::NOTICE_RETRY);
        let second = state.take_runtime_domains(Some(first)).await.expect("another");
        assert_eq!(second.1, crate::db::NOTICE_RETRY * 2);
        assert!(second.0 > first.0);
        std::fs::rename(dir.path().join("moved.db"), &path).unwrap();
        assert_eq!(state.take_runtime_domains(Some(second)).await, None);
    }

    /// Two daemons on one PostgreSQL database, the second not yet told of the first's new
    /// domain: its upsert of a domain with the same tool name is refused, as on one daemon,
    /// instead of both being stored and one of them served by neither.
    #[tokio::test]
    async fn on_postgres_an_upsert_clashing_with_one_another_daemon_just_stored_is_refused() {
        let Some(admin) = crate::db::testing::postgres_url() else {
            return;
        };
        let config = Config {
            database: crate::db::testing::fresh_postgres_database(&admin).await,
            ..Config::default()
        };
        let a = State::new(Registry::demo(), &config).await.unwrap();
        let b = State::new(Registry::demo(), &config).await.unwrap();
        let lab = |name: &str| {
            format!(
                r#"{{"name": "{name}", "tools": [{{"name": "lab_probe", "description": "Probe the lab"}}]}}"#
            )
        };
        a.upsert_domain(&lab("lab_one")).await.unwrap();
        let refused = b.upsert_domain(&lab("lab_two")).await.unwrap_err();
        let status = tonic::Status::from(refused);
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("lab_probe"), "{}", status.message());
        let stored: Vec<String> = a
            .inner
            .db
            .read_domains()
            .await
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(stored, ["lab_one"]);
        // Replacing a domain by itself is no clash.
        b.upsert_domain(&lab("lab_one")).await.unwrap();
    }

    /// A change that lets a stored domain back in (first in name order, it wins a clash)
    /// would push out one served now, on every daemon that composes the stored rows: it is
    /// refused, naming what would be lost, and nothing changes. A change that loses nothing
    /// is made.
    #[tokio::test]
    async fn a_domain_change_that_would_stop_serving_another_domain_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let domain = |name: &str, tools: &[&str]| {
            let tools: Vec<String> = tools
                .iter()
                .map(|t| format!(r#"{{"name": "{t}", "description": "Does {t}"}}"#))
                .collect();
            format!(r#"{{"name": "{name}", "tools": [{}]}}"#, tools.join(", "))
        };
        let state = demo_state(dir.path()).await;
        state.upsert_domain(&domain("a_old", &["xtool"])).await.unwrap();
        state.upsert_domain(&domain("c_new", &["ytool"])).await.unwrap();
        // A row that clashes with both, as an older daemon could leave behind.
        state
            .inner
            .db
            .upsert_domain("b_mid", &domain("b_mid", &["xtool", "ytool"]), 1)
            .await
            .unwrap();
        drop(state);
        let state = demo_state(dir.path()).await;
        let served = |state: &State| {
            let view = state.inner.view.load();
            ["a_old", "b_mid", "c_new"]
                .into_iter()
                .filter(|n| view.registry.find(n).is_some())
                .collect::<Vec<_>>()
        };
        assert_eq!(served(&state), ["a_old", "c_new"], "b_mid is left out");
        let version = state.inner.view.load().registry.version();
        let refused = |e: Error, verb: &str| {
            let status = tonic::Status::from(e);
            assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
            assert_eq!(
                status.message(),
                format!(
                    "{verb} domain 'a_old' would stop serving c_new: a stored domain it lets back in clashes with it. \
                     Nothing changed; delete or fix the clashing domain first."
                )
            );
        };
        refused(
            state
                .upsert_domain(&domain("a_old", &["ztool"]))
                .await
                .unwrap_err(),
            "Upserting",
        );
        refused(state.delete_domain("a_old").await.unwrap_err(), "Deleting");
        assert_eq!(
            state.inner.view.load().registry.version(),
            version,
            "nothing changed"
        );
        assert_eq!(state.inner.db.read_domains().await.unwrap().len(), 3);
        // Without the left-out row, both are made.
        state.delete_domain("b_mid").await.unwrap();
        state.upsert_domain(&domain("a_old", &["ztool"])).await.unwrap();
        state.delete_domain("a_old").await.unwrap();
        assert_eq!(served(&state), ["c_new"]);
    }

    /// The demo registry over a SQLite database in `dir`.
    async fn demo_state(dir: &std::path::Path) -> State {
        let config = Config {
            database: format!("sqlite://{}", dir.join("s.db").display()),
            ..Config::default()
        };
        State::new(Registry::demo(), &config).await.unwrap()
    }

    /// Writes the setting that activates the Sonarr domain, as a settings UI does.
    async fn configure_sonarr(state: &State) {
        let db = &state.inner.db;
        db.set_setting("sonarr_url", "http://nas:8989").await.unwrap();
    }

    /// Whether `view` serves the Sonarr domain (active once `sonarr_url` is set).
    fn sonarr_active(view: &View) -> bool {
        let sonarr = view.registry.find("sonarr").expect("a demo domain");
        view.activation.is_active(sonarr)
    }

    /// A caller that took the settings before an invalidation re-read them answers from its
    /// own view, but never puts the older settings back for everyone (nor tells watchers).
    #[tokio::test]
    async fn a_snapshot_older_than_the_newest_read_is_never_served_to_others() {
        let dir = tempfile::tempdir().unwrap();
        let state = demo_state(dir.path()).await;
        let (mut watcher, _) = state.watch();
        let older = state.inner.settings.get().await;
        configure_sonarr(&state).await;
        let newer = state.invalidate_settings().await.unwrap();
        assert!(sonarr_active(&newer));
        assert!(watcher.has_changed().unwrap());
        assert!(sonarr_active(&watcher.borrow_and_update()));

        let own = state.view_for(older);
        assert!(
            !sonarr_active(&own),
            "the caller answers from the settings it took"
        );
        assert!(
            sonarr_active(&state.inner.view.load()),
            "the others keep the newest"
        );
        assert!(!watcher.has_changed().unwrap(), "watchers are told nothing");
        assert!(sonarr_active(&*state.view().await));
    }

    /// Settings re-read while a registry is swapped in reach every caller and watcher over
    /// the new registry, whichever swap comes first.
    #[tokio::test]
    async fn settings_read_while_a_registry_is_swapped_in_are_served_over_it_and_told() {
        let dir = tempfile::tempdir().unwrap();
        let state = demo_state(dir.path()).await;
        let (watcher, _) = state.watch();
        // An invalidation takes the view served and re-reads the table; a reload swaps a
        // registry in before the invalidation's view is swapped in.
        let taken = state.inner.view.load_full();
        configure_sonarr(&state).await;
        let snapshot = state.inner.settings.invalidate().await.unwrap();
        state.reload().await.unwrap();
        let reloaded = state.inner.view.load_full();
        assert!(!Arc::ptr_eq(&reloaded, &taken));

        state.settle(taken, snapshot.clone());
        let served = state.inner.view.load_full();
        assert!(
            Arc::ptr_eq(&served.settings, &snapshot),
            "the settings re-read are served"
        );
        assert!(
            Arc::ptr_eq(&served.registry, &reloaded.registry),
            "over the registry reloaded"
        );
        assert!(sonarr_active(&served));
        assert!(sonarr_active(&watcher.borrow()), "and watchers are told");
    }

    /// A registry change its caller gave up on while its write waited for another writer's
    /// lock still ends as one: the domain is gone from the database and from the registry
    /// served, or from neither.
    #[tokio::test]
    async fn a_domain_change_cut_at_its_callers_deadline_is_stored_and_served_alike() {
        use sqlx::{Connection as _, Executor as _};
        let dir = tempfile::tempdir().unwrap();
        let state = demo_state(dir.path()).await;
        state
            .upsert_domain(
                r#"{"name": "weather", "keywords": ["forecast"],
                    "tools": [{"name": "get_forecast", "description": "The forecast"}]}"#,
            )
            .await
            .unwrap();
        // A settings UI holds the write lock for a while.
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let mut ui = sqlx::SqliteConnection::connect(&url).await.unwrap();
        ui.execute("BEGIN IMMEDIATE").await.unwrap();
        let cut = tokio::time::timeout(Duration::from_millis(200), state.delete_domain("weather")).await;
        assert!(cut.is_err(), "the caller gave up while the write waited");
        ui.execute("COMMIT").await.unwrap();
        let stored = || async {
            state
                .inner
                .db
                .read_domains()
                .await
                .unwrap()
                .iter()
                .any(|(name, _)| name == "weather")
        };
        let served = || state.inner.view.load().registry.find("weather").is_some();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while stored().await && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Let the change finish what it started, if it did.
        let _ = state.inner.sources.lock().await;
        assert_eq!(
            served(),
            stored().await,
            "the database and the registry served agree"
        );
        assert!(
            !served(),
            "the delete, once its write went through, went through whole"
        );
    }

    /// A settings swap that publishes after a reload swapped in and published a newer view
    /// (the two run on different threads) leaves watchers at the newer view.
    #[tokio::test]
    async fn a_swap_that_publishes_late_does_not_tell_watchers_an_older_view() {
        let dir = tempfile::tempdir().unwrap();
        let state = demo_state(dir.path()).await;
        let (watcher, _) = state.watch();
        configure_sonarr(&state).await;
        let snapshot = state.inner.settings.invalidate().await.unwrap();
        // The settings swap, up to its publish: its view is served.
        let taken = state.inner.view.load_full();
        let settled = Arc::new(View::new(
            taken.parts(),
            snapshot,
            &state.inner.options,
            state.inner.profiles.clone(),
        ));
        state.inner.view.store(settled.clone());
        // A run-time domain swaps a new registry in over it, and publishes.
        state
            .upsert_domain(
                r#"{"name": "weather", "description": "Forecasts",
                    "tools": [{"name": "get_forecast", "description": "The forecast"}]}"#,
            )
            .await
            .unwrap();
        let newest = state.inner.view.load_full().registry.version();
        assert_ne!(newest, settled.registry.version());
        // Then the settings swap publishes.
        state.publish();
        let seen = watcher.borrow().clone();
        assert_eq!(
            seen.registry.version(),
            newest,
            "watchers keep the newest registry"
        );
        assert!(sonarr_active(&seen));
    }

    /// A notice that another daemon changed the run-time domains serves them beside the
    /// manifests as last loaded: a manifest broken on this machine meanwhile (mid-edit)
    /// neither keeps the change out nor goes live without a reload.
    #[tokio::test]
    async fn another_daemons_domains_are_served_without_reading_the_manifests_again() {
        let dir = tempfile::tempdir().unwrap();
        let manifests = dir.path().join("manifests");
        std::fs::create_dir(&manifests).unwrap();
        let config = Config {
            database: format!("sqlite://{}", dir.path().join("s.db").display()),
            manifests: vec![manifests.clone()],
            ..Config::default()
        };
        let state = State::new(Registry::demo(), &config).await.unwrap();
        let other = State::new(Registry::demo(), &config).await.unwrap();
        std::fs::write(manifests.join("mid_edit.json"), "{").unwrap();
        other
            .upsert_domain(
                r#"{"name": "weather", "description": "Forecasts", "keywords": ["forecast"],
                    "tools": [{"name": "get_forecast", "description": "The forecast",
                               "input_schema": {"type": "object"}}]}"#,
            )
            .await
            .unwrap();
        let demo = state.view().await.registry.domains().len();
        assert_eq!(state.take_runtime_domains(None).await, None);
        let registry = state.view().await.registry.clone();
        assert!(
            registry.find("weather").is_some(),
            "the other daemon's domain is served"
        );
        assert_eq!(
            registry.domains().len(),
            demo + 1,
            "and the manifests as last loaded"
        );
        // Read under the registry lock, an unchanged store changes nothing.
        let version = registry.version();
        assert_eq!(state.take_runtime_domains(None).await, None);
        assert_eq!(state.view().await.registry.version(), version);
    }
}
