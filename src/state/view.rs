//! The view a call decides in: the registry, its automaton, index and renders, the
//! settings snapshot and what it activates, per consumer; and the answers a view remembers.

use std::any::Any;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;

use crate::error::Result;
use crate::matcher::{MatchMode, Matcher};
use crate::registry::{DomainId, Registry, Tool};
use crate::render::{Format, LazyRenders, Rendered, Renders};
use crate::router::budget::Cost;
use crate::router::{Activation, Decision, Inputs, Options, Profile, ProfileId, Profiles, Snapshot};
use crate::search::SearchIndex;

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
    /// Which registry build the parts are (see [`View::build`]).
    build: u64,
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
    pub(super) fn new(
        parts: Parts,
        settings: Arc<Snapshot>,
        options: &Options,
        profiles: Arc<Profiles>,
    ) -> View {
        let Parts {
            registry,
            matcher,
            index,
            renders,
            build,
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
            build,
        }
    }

    /// The number of the registry build this view serves, unique in the process: a reload
    /// builds anew even when it finds nothing changed, and watchers hear of every reload
    /// (SPEC §11), where a settings re-read keeps the build.
    pub(crate) fn build(&self) -> u64 {
        self.build
    }

    /// Whether answers carry the `load_tool_group` meta-tool (`--expose-load-tool-group`).
    pub(crate) fn exposes_load_tool(&self) -> bool {
        self.expose.0
    }

    /// What the view is built from besides the settings.
    pub(super) fn parts(&self) -> Parts {
        Parts {
            registry: self.registry.clone(),
            matcher: self.matcher.clone(),
            index: self.index.clone(),
            renders: self.renders.clone(),
            build: self.build,
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
pub(super) struct Parts {
    pub(super) registry: Arc<Registry>,
    matcher: Arc<Matcher>,
    index: Arc<SearchIndex>,
    renders: Arc<Renders>,
    build: u64,
}

/// Registry builds so far in the process (see [`View::build`]).
static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Parts {
    /// Builds the automaton, then the search index and the renders (with their token counts)
    /// side by side: both are pure and take tens of milliseconds on a large registry.
    pub(super) fn build(registry: Registry, keyword_match: MatchMode) -> Result<Parts> {
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
            build: BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
        })
    }
}

/// The parts of a view that a new registry build replaces, held weakly. They live on while
/// calls that started before the swap still read them; once the last one ends, what they
/// freed (tens of MiB on a large registry) is to be handed back to the system as well, as
/// after a build: the trim after the build ran while they were still served.
pub(super) struct Retired(Vec<Weak<dyn Any + Send + Sync>>);

impl Retired {
    /// The parts `view` serves from now.
    pub(super) fn of(view: &View) -> Retired {
        fn weak<T: Any + Send + Sync>(part: &Arc<T>) -> Weak<dyn Any + Send + Sync> {
            let part: Arc<dyn Any + Send + Sync> = part.clone();
            Arc::downgrade(&part)
        }
        Retired(vec![
            weak(&view.registry),
            weak(&view.matcher),
            weak(&view.index),
            weak(&view.renders),
        ])
    }

    /// Waits until nothing holds the parts any more, looking every 100 ms: true then, false
    /// after a minute with some still held (a call or stream holding them longer keeps them
    /// past it, and a later trim hands them back).
    pub(super) async fn dropped(self) -> bool {
        const LOOK_EVERY: Duration = Duration::from_millis(100);
        for _ in 0..600 {
            if self.0.iter().all(|part| part.strong_count() == 0) {
                return true;
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
        false
    }
}

/// The trims asked for once retired parts are dropped, at most one a second: registries
/// rebuilt back to back (each build trims at its end too) would otherwise trim twice each.
#[derive(Debug)]
pub(super) struct Trims(std::sync::Mutex<TrimSchedule>);

#[derive(Debug)]
struct TrimSchedule {
    /// When the last one started.
    last: Option<tokio::time::Instant>,
    /// Whether one is waiting to start (its task is dropped only with the runtime).
    waiting: bool,
    /// What a trim runs ([`release_free_memory`]; tests count instead).
    release: fn(),
}

impl Trims {
    pub(super) fn new() -> Trims {
        Trims(std::sync::Mutex::new(TrimSchedule {
            last: None,
            waiting: false,
            release: release_free_memory,
        }))
    }

    fn schedule(&self) -> std::sync::MutexGuard<'_, TrimSchedule> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Hands back what was freed before this call: a trim now when none started in the
    /// last second, else one when that second is up. While one is waiting to start, a call
    /// rides on it: it starts after the call, so it hands back what the call asks for.
    pub(super) async fn soon(&self) {
        const AT_MOST_EVERY: Duration = Duration::from_secs(1);
        let wait = {
            let mut s = self.schedule();
            if std::mem::replace(&mut s.waiting, true) {
                return;
            }
            s.last.map_or(Duration::ZERO, |last| {
                (last + AT_MOST_EVERY).saturating_duration_since(tokio::time::Instant::now())
            })
        };
        tokio::time::sleep(wait).await;
        let release = {
            let mut s = self.schedule();
            s.waiting = false;
            s.last = Some(tokio::time::Instant::now());
            s.release
        };
        // A panic in the allocator's trim would be a bug of its own; nothing to undo.
        let _ = tokio::task::spawn_blocking(release).await;
    }

    /// Runs `release` instead of trimming.
    #[cfg(test)]
    pub(super) fn count_with(&self, release: fn()) {
        self.schedule().release = release;
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
