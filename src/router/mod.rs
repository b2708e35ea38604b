//! The route decision: a pure function of the registry, the settings snapshot (through its
//! [`Activation`]), a conversation's state and the message. No I/O, no clock; the caller
//! persists what the decision says changed.

use std::ops::Range;

mod activation;
pub mod budget;
mod conversation;
pub mod policy;

pub use activation::{Activation, DISABLED_TOOLS_KEY, MAX_DISABLED_PATTERNS, Snapshot, refused_setting};
pub(crate) use conversation::Mark;
pub use conversation::{Conversation, Member};
pub use policy::{Patterns, Profile, ProfileId, Profiles};

use crate::error::{Error, Result};
use crate::matcher::Matcher;
use crate::registry::{DomainId, KeywordId, Registry, Tool};
use crate::search::{DomainHit, SearchIndex, SearchMode, SearchOptions};

pub(crate) use crate::registry::{LOAD_TOOL_GROUP, SEARCH_TOOLS};

/// What a turn with no keyword hit and nothing sticky gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FallbackPolicy {
    /// Core, loaded, and every active non-core domain with `fallback = true`.
    #[default]
    AllActive,
    /// Core and loaded domains only.
    CoreOnly,
}

/// Routing options from the configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// See [`FallbackPolicy`].
    pub fallback: FallbackPolicy,
    /// Whether answers start with the `load_tool_group` meta-tool.
    pub expose_load_tool_group: bool,
    /// Whether answers carry the `search_tools` meta-tool (after `load_tool_group`).
    pub expose_search_tools: bool,
    /// When and how the search index routes (SPEC §8).
    pub search: SearchOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            fallback: FallbackPolicy::AllActive,
            expose_load_tool_group: true,
            expose_search_tools: true,
            search: SearchOptions::default(),
        }
    }
}

/// Why a domain is in an answer (the first that applies, in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// An active core domain.
    Core,
    /// This message hit one of its keywords.
    Keyword,
    /// The search index chose it for this message.
    Search,
    /// Loaded explicitly in the conversation.
    Loaded,
    /// Hit (by keyword or search) on an earlier turn of the conversation.
    Sticky,
    /// Nothing hit, so every active fallback domain came in.
    Fallback,
}

impl Reason {
    /// The reason's name in reports, logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Core => "core",
            Reason::Keyword => "keyword",
            Reason::Search => "search",
            Reason::Loaded => "loaded",
            Reason::Sticky => "sticky",
            Reason::Fallback => "fallback",
        }
    }
}

/// One domain in an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Included {
    /// The domain.
    pub domain: DomainId,
    /// The first reason that applies.
    pub reason: Reason,
    /// With [`Reason::Keyword`]: where in [`Decision::keywords`] the keywords that hit this
    /// domain are (see [`Decision::matched`]); empty otherwise.
    pub matched: Range<usize>,
    /// The conversation loaded it, whatever reason comes first: a budget never drops it.
    pub loaded: bool,
}

/// The answer to one turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Whether the tool list starts with the `load_tool_group` meta-tool.
    pub meta_tool: bool,
    /// Whether the `search_tools` meta-tool follows it.
    pub search_tool: bool,
    /// The included domains that contribute tools, in tool order.
    pub domains: Vec<Included>,
    /// Every keyword that hit an active non-core domain, sorted (so grouped by domain, in
    /// manifest order); [`Included::matched`] ranges index into it.
    pub keywords: Vec<KeywordId>,
    /// The search hits of this message that no keyword hit, by domain (see
    /// [`Decision::search_hit`]).
    pub search: Vec<DomainHit>,
    /// Nothing hit (by keyword, core keyword or search) and nothing was sticky.
    pub fallback: bool,
    /// Domains this message hit that the conversation had not recorded as hit, by name;
    /// the caller records them (see [`Conversation::change`]) before answering.
    pub new_hits: Vec<DomainId>,
}

impl Decision {
    /// The keywords that hit an included domain, in manifest order, each once.
    pub fn matched(&self, included: &Included) -> &[KeywordId] {
        &self.keywords[included.matched.clone()]
    }

    /// The search hit that brought a domain in (score and matched terms), if search did.
    pub(crate) fn search_hit(&self, domain: DomainId) -> Option<&DomainHit> {
        self.search
            .binary_search_by_key(&domain, |h| h.domain)
            .ok()
            .map(|i| &self.search[i])
    }

    /// The meta-tools the answer starts with, in order.
    pub fn meta_tools<'a>(&self, activation: &'a Activation) -> impl Iterator<Item = &'a Tool> {
        let load = activation.meta_tool().filter(|_| self.meta_tool);
        let search = activation.search_tool().filter(|_| self.search_tool);
        load.into_iter().chain(search)
    }

    /// How many tools [`Decision::tools`] yields: the answer's tool count, without walking
    /// every tool.
    pub fn tool_count(&self, registry: &Registry, activation: &Activation) -> usize {
        self.meta_tools(activation).count()
            + self
                .domains
                .iter()
                .map(|inc| activation.visible_count(registry, inc.domain))
                .sum::<usize>()
    }

    /// The tools of the answer, in order: the meta-tools (when exposed), then each included
    /// domain's visible tools in manifest order.
    pub fn tools<'a>(
        &'a self,
        registry: &'a Registry,
        activation: &'a Activation,
    ) -> impl Iterator<Item = (&'a str, &'a Tool)> {
        self.meta_tools(activation)
            .map(|t| ("", t))
            .chain(self.domains.iter().flat_map(move |inc| {
                let name = registry.domain(inc.domain).name.as_str();
                activation
                    .visible_tools(registry, inc.domain)
                    .map(move |t| (name, t))
            }))
    }
}

/// What the registry offers a route: the domains, their keyword automaton and their search
/// index, all built from the same registry.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The registry.
    pub registry: &'a Registry,
    /// Its keyword automaton.
    pub matcher: &'a Matcher,
    /// Its search index.
    pub index: &'a SearchIndex,
}

/// A domain this message hit, and how.
#[derive(Debug, Clone)]
enum Hit {
    /// By keyword: its range of [`Decision::keywords`].
    Keyword(Range<usize>),
    /// By search.
    Search,
}

/// Decides which domains a turn gets (SPEC §4).
pub fn route(
    inputs: Inputs<'_>,
    activation: &Activation,
    conversation: Option<&Conversation>,
    message: &str,
    options: &Options,
) -> Decision {
    let registry = inputs.registry;
    // Keyword HITS: active non-core domains with a keyword found. A domain without keywords
    // has no patterns in the automaton, so it can never be a hit (rule 6). An active core
    // domain's hit routes the message (no fallback) but is never a HIT.
    let mut keywords = inputs.matcher.find(message);
    let mut core_hit = false;
    keywords.retain(|&k| {
        let d = registry.keyword_domain(k);
        let active = activation.is_active(d);
        core_hit |= active && registry.domain(d).core;
        !registry.domain(d).core && active
    });
    // Keyword ids are sorted, and a domain's ids are contiguous, so each hit domain owns one
    // range of `keywords`, already in manifest order.
    let mut hits: Vec<(DomainId, Hit)> = Vec::new();
    for (i, &k) in keywords.iter().enumerate() {
        let d = registry.keyword_domain(k);
        match hits.last_mut() {
            Some((last, Hit::Keyword(range))) if *last == d => range.end = i + 1,
            _ => hits.push((d, Hit::Keyword(i..i + 1))),
        }
    }

    // Members still in the registry, still active, not core (core comes first anyway).
    let members: Vec<(DomainId, &Member)> = conversation
        .map(|c| {
            c.members
                .iter()
                .filter_map(|m| registry.find(&m.domain).map(|d| (d, m)))
                .filter(|&(d, _)| activation.is_active(d) && !registry.domain(d).core)
                .collect()
        })
        .unwrap_or_default();
    let any_sticky = members.iter().any(|(_, m)| m.hit);

    // Search HITS (SPEC §8): active non-core domains with tools that no keyword hit.
    let run_search = match options.search.mode {
        SearchMode::Off => false,
        SearchMode::Fallback => hits.is_empty() && !any_sticky && !core_hit,
        SearchMode::Augment => true,
    };
    let search = if run_search {
        let keyword_hit = |d: DomainId| hits.binary_search_by_key(&d, |(h, _)| *h).is_ok();
        let eligible = |d: DomainId| {
            activation.is_active(d)
                && !registry.domain(d).core
                && activation.visible_count(registry, d) > 0
                && !keyword_hit(d)
        };
        inputs
            .index
            .domain_hits(message, &options.search, activation.tool_mask(), eligible)
    } else {
        Vec::new()
    };
    if !search.is_empty() {
        hits.extend(search.iter().map(|h| (h.domain, Hit::Search)));
        hits.sort_by_key(|(d, _)| *d);
    }

    let hit_of = |d: DomainId| hits.binary_search_by_key(&d, |(h, _)| *h).ok();
    let included = |(d, hit): &(DomainId, Hit)| match hit {
        Hit::Keyword(range) => Included {
            domain: *d,
            reason: Reason::Keyword,
            matched: range.clone(),
            loaded: false,
        },
        Hit::Search => because(*d, Reason::Search),
    };

    let all_active = options.fallback == FallbackPolicy::AllActive;
    let fallback = hits.is_empty() && !any_sticky && !core_hit;
    let mut domains: Vec<Included> = Vec::with_capacity(
        activation.core.len()
            + members.len()
            + hits
                .len()
                .max(if all_active { activation.fallback.len() } else { 0 }),
    );
    domains.extend(activation.core.iter().map(|&d| because(d, Reason::Core)));
    let mut new_hits = Vec::new();

    if conversation.is_none() {
        if !fallback {
            domains.extend(hits.iter().map(included));
        } else if all_active {
            domains.extend(activation.fallback.iter().map(|&d| because(d, Reason::Fallback)));
        }
    } else {
        for &(d, m) in &members {
            if let Some(i) = hit_of(d) {
                domains.push(Included {
                    loaded: m.loaded,
                    ..included(&hits[i])
                });
            } else if m.loaded {
                domains.push(because(d, Reason::Loaded));
            } else if m.hit {
                domains.push(because(d, Reason::Sticky));
            }
        }
        // Hits new to the conversation join now, after earlier members, by name.
        for hit in &hits {
            let member = members.iter().find(|(m, _)| *m == hit.0).map(|(_, m)| *m);
            if member.is_none_or(|m| !m.hit) {
                new_hits.push(hit.0);
            }
            if member.is_none() {
                domains.push(included(hit));
            }
        }
        if fallback && all_active {
            // Fallback domains do not join the conversation; loaded ones are in already.
            for &d in &activation.fallback {
                if !members.iter().any(|&(m, mem)| m == d && mem.loaded) {
                    domains.push(because(d, Reason::Fallback));
                }
            }
        }
    }
    domains.retain(|inc| activation.visible_count(registry, inc.domain) > 0);
    Decision {
        meta_tool: options.expose_load_tool_group && activation.meta_tool.is_some(),
        search_tool: options.expose_search_tools && activation.search_tool.is_some(),
        domains,
        keywords,
        search,
        fallback,
        new_hits,
    }
}

fn because(domain: DomainId, reason: Reason) -> Included {
    Included {
        domain,
        reason,
        matched: 0..0,
        loaded: reason == Reason::Loaded,
    }
}

/// What an explicit load of a group means for a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Load {
    /// The group.
    pub domain: DomainId,
    /// The conversation already had it (or it is core, so it always has it).
    pub already_loaded: bool,
}

/// Checks a `LoadToolGroup` request against the registry, settings, policy and
/// conversation (SPEC §5, §10). The group name matches exactly; a group the policy leaves
/// without tools (the profile's domain or tool patterns, or the disabled tools) has none.
///
/// # Errors
/// [`Error::GroupNotFound`], [`Error::GroupNotConfigured`] or [`Error::GroupWithoutTools`].
pub fn load(
    registry: &Registry,
    activation: &Activation,
    conversation: &Conversation,
    group: &str,
) -> Result<Load> {
    let Some(d) = registry.find(group) else {
        return Err(Error::GroupNotFound {
            group: group.to_string(),
            available: activation
                .loadable
                .iter()
                .map(|&d| registry.domain(d).name.clone())
                .collect(),
        });
    };
    let domain = registry.domain(d);
    // A group the profile or the disabled tools leave empty has none whatever the settings:
    // setting its keys would not help, so they are not what the answer asks for (as
    // `CheckToolCall` names a denied or disabled tool before an unconfigured group). A
    // profile's domain patterns leave a group no tools as its tool patterns do (SPEC §10).
    if !activation.is_allowed(d) || activation.visible_count(registry, d) == 0 {
        return Err(Error::GroupWithoutTools {
            group: group.to_string(),
        });
    }
    if !activation.is_configured(d) {
        return Err(Error::GroupNotConfigured {
            group: group.to_string(),
            keys: domain.settings_keys.clone(),
        });
    }
    let already_loaded = domain.core || conversation.is_loaded(group);
    Ok(Load {
        domain: d,
        already_loaded,
    })
}

/// The text a successful load answers with, for the model to read: the group's visible
/// tools.
pub(crate) fn load_text(registry: &Registry, activation: &Activation, d: DomainId) -> String {
    let domain = registry.domain(d);
    let n = activation.visible_count(registry, d);
    let mut text = format!(
        "Loaded {n} {} from group '{}':",
        if n == 1 { "tool" } else { "tools" },
        domain.display_name
    );
    for t in activation.visible_tools(registry, d) {
        text.push_str(&format!("\n- {}: {}", t.name, t.description));
    }
    text
}

/// Why a tool may not be called now (SPEC §10 `CheckToolCall`), in the order checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No tool has this name.
    UnknownTool,
    /// The consumer's profile does not let it see the tool.
    DeniedByProfile,
    /// The settings' disabled tools name it.
    Disabled,
    /// None of its domain's settings keys has a value.
    NotConfigured {
        /// The domain's settings keys.
        keys: Vec<String>,
    },
    /// Its domain is not in what `Route` answers for the conversation now; loading the
    /// group brings it in.
    NeedsLoad {
        /// The group to load.
        group: String,
    },
}

impl Refusal {
    /// The reason's name on the wire.
    pub fn as_str(&self) -> &'static str {
        match self {
            Refusal::UnknownTool => "unknown_tool",
            Refusal::DeniedByProfile => "denied_by_profile",
            Refusal::Disabled => "disabled",
            Refusal::NotConfigured { .. } => "not_configured",
            Refusal::NeedsLoad { .. } => "needs_load",
        }
    }
}

/// Where a tool call stands: the tool's domain when the name is known, and why the call is
/// refused, if it is (SPEC §10). `activation` is the consumer's (its profile and the
/// settings applied); `shown` says whether a domain is in what `Route` answers for the
/// conversation now.
pub fn check_call(
    registry: &Registry,
    settings: &Snapshot,
    profile: Option<&Profile>,
    activation: &Activation,
    tool: &str,
    shown: impl Fn(DomainId) -> bool,
) -> (Option<DomainId>, Option<Refusal>) {
    let found = registry.domain_ids().find_map(|d| {
        let tools = &registry.domain(d).tools;
        tools.iter().position(|t| t.name == tool).map(|i| (d, i))
    });
    let Some((d, i)) = found else {
        return (None, Some(Refusal::UnknownTool));
    };
    let domain = registry.domain(d);
    let t = &domain.tools[i];
    let refusal = if profile.is_some_and(|p| !p.allows_domain(&domain.name) || !p.allows_tool(t)) {
        Some(Refusal::DeniedByProfile)
    } else if settings.disabled().matches(&t.name) {
        Some(Refusal::Disabled)
    } else if !activation.is_configured(d) {
        Some(Refusal::NotConfigured {
            keys: domain.settings_keys.clone(),
        })
    } else if !shown(d) {
        Some(Refusal::NeedsLoad {
            group: domain.name.clone(),
        })
    } else {
        None
    };
    (Some(d), refusal)
}

#[cfg(test)]
mod tests;
