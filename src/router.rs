//! The route decision: a pure function of the registry, the settings snapshot (through its
//! [`Activation`]), a conversation's state and the message. No I/O, no clock; the caller
//! persists what the decision says changed.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::matcher::Matcher;
use crate::registry::{DomainId, KeywordId, Registry, Tier, Tool};
use crate::search::{DomainHit, SearchIndex, SearchMode, SearchOptions};
use crate::settings::Snapshot;

/// Name of the meta-tool that loads a group for the rest of a conversation.
pub const LOAD_TOOL_GROUP: &str = "load_tool_group";

/// Name of the meta-tool that searches the registry's tools (SPEC §4, v2).
pub const SEARCH_TOOLS: &str = "search_tools";

/// What a turn with no keyword hit and nothing sticky gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize, clap::ValueEnum)]
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

/// What the settings snapshot means for one registry: which domains are active, and the
/// lists every answer draws from. Derived once per (registry, snapshot) pair, so a route
/// costs what its answer holds, not what the registry holds.
#[derive(Debug, Clone)]
pub struct Activation {
    active: Vec<bool>,
    /// Active core domains, by name.
    core: Vec<DomainId>,
    /// Active non-core domains with `fallback = true`, by name.
    fallback: Vec<DomainId>,
    /// Active non-core domains that have tools, by name: what `load_tool_group` may load.
    loadable: Vec<DomainId>,
    /// The `load_tool_group` meta-tool, present when something is loadable.
    meta_tool: Option<Tool>,
    /// The `search_tools` meta-tool, present when something is loadable.
    search_tool: Option<Tool>,
}

impl Activation {
    /// Derives activation from a settings snapshot.
    pub fn new(registry: &Registry, settings: &Snapshot) -> Activation {
        let active: Vec<bool> = registry
            .domains()
            .iter()
            .map(|d| d.settings_keys.is_empty() || d.settings_keys.iter().any(|k| settings.is_set(k)))
            .collect();
        let ids = |pred: &dyn Fn(DomainId) -> bool| -> Vec<DomainId> {
            (0..active.len()).filter(|&d| active[d] && pred(d)).collect()
        };
        let core = ids(&|d| registry.domain(d).core);
        let fallback = ids(&|d| !registry.domain(d).core && registry.domain(d).fallback);
        let loadable = ids(&|d| !registry.domain(d).core && !registry.domain(d).tools.is_empty());
        let meta_tool = (!loadable.is_empty()).then(|| meta_tool(registry, &loadable));
        let search_tool = (!loadable.is_empty()).then(search_tool);
        Activation {
            active,
            core,
            fallback,
            loadable,
            meta_tool,
            search_tool,
        }
    }

    /// Whether a domain is active.
    pub fn is_active(&self, d: DomainId) -> bool {
        self.active[d]
    }

    /// Active domains, by name.
    pub fn active(&self) -> impl Iterator<Item = DomainId> + '_ {
        (0..self.active.len()).filter(|&d| self.active[d])
    }

    /// The `load_tool_group` meta-tool, when any group is loadable.
    pub fn meta_tool(&self) -> Option<&Tool> {
        self.meta_tool.as_ref()
    }

    /// The `search_tools` meta-tool, when any group is loadable.
    pub fn search_tool(&self) -> Option<&Tool> {
        self.search_tool.as_ref()
    }

    /// Active non-core domains that have tools, by name: what `load_tool_group` may load.
    pub fn loadable(&self) -> &[DomainId] {
        &self.loadable
    }

    /// The system-prompt section that lists loadable groups (empty when there are none).
    pub fn prompt_section(&self, registry: &Registry) -> String {
        if self.loadable.is_empty() {
            return String::new();
        }
        let lines: Vec<String> = self
            .loadable
            .iter()
            .map(|&d| {
                format!(
                    "- {}: {}",
                    registry.domain(d).name,
                    registry.domain(d).description
                )
            })
            .collect();
        format!(
            "## Available Tool Groups\n\nUse `{LOAD_TOOL_GROUP}` to load tools from a group before using them.\n\n{}",
            lines.join("\n")
        )
    }
}

fn meta_tool(registry: &Registry, loadable: &[DomainId]) -> Tool {
    let names: Vec<&str> = loadable
        .iter()
        .map(|&d| registry.domain(d).name.as_str())
        .collect();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "group_name": {
                "type": "string",
                "description": "The name of the tool group to load",
                "enum": names,
            }
        },
        "required": ["group_name"],
    });
    Tool {
        name: LOAD_TOOL_GROUP.to_string(),
        description: "Load the tools of a tool group so they can be used for the rest of this \
                      conversation. Call it when the user needs something none of the current \
                      tools can do."
            .to_string(),
        input_schema_json: schema.to_string(),
        tier: Tier::Read,
    }
}

/// The `search_tools` meta-tool: its schema does not depend on the settings, so the prompt
/// cache holds.
fn search_tool() -> Tool {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "What the user wants to do, in a few words",
            },
            "limit": {
                "type": "integer",
                "description": "How many tools to return (default 5, at most 20)",
                "minimum": 1,
                "maximum": 20,
            }
        },
        "required": ["query"],
    });
    Tool {
        name: SEARCH_TOOLS.to_string(),
        description: "Search all available tools by what they do, and load the groups of the \
                      best matches into this conversation. Call it when none of the current \
                      tools fits the user's request."
            .to_string(),
        input_schema_json: schema.to_string(),
        tier: Tier::Read,
    }
}

/// A conversation's remembered state, in the order domains joined it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conversation {
    /// Domains that joined by keyword hit or explicit load, in join order.
    pub members: Vec<Member>,
}

/// One domain remembered by a conversation, by name (so it survives registry reloads: a
/// name that no longer exists is simply skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The domain's name.
    pub domain: String,
    /// Loaded with `LoadToolGroup`.
    pub loaded: bool,
    /// Hit by a keyword or by search on some turn.
    pub hit: bool,
}

impl Conversation {
    /// Records keyword hits: existing members get `hit`, new ones join at the end in the
    /// given order.
    pub fn record_hits(&mut self, registry: &Registry, hits: &[DomainId]) {
        for &d in hits {
            let name = &registry.domain(d).name;
            match self.members.iter_mut().find(|m| &m.domain == name) {
                Some(m) => m.hit = true,
                None => self.members.push(Member {
                    domain: name.clone(),
                    loaded: false,
                    hit: true,
                }),
            }
        }
    }

    /// Records an explicit load.
    pub fn record_load(&mut self, name: &str) {
        match self.members.iter_mut().find(|m| m.domain == name) {
            Some(m) => m.loaded = true,
            None => self.members.push(Member {
                domain: name.to_string(),
                loaded: true,
                hit: false,
            }),
        }
    }

    /// Whether a group was loaded explicitly.
    pub fn is_loaded(&self, name: &str) -> bool {
        self.members.iter().any(|m| m.loaded && m.domain == name)
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
    /// the caller records them (see [`Conversation::record_hits`]) before answering.
    pub new_hits: Vec<DomainId>,
}

impl Decision {
    /// The keywords that hit an included domain, in manifest order, each once.
    pub fn matched(&self, included: &Included) -> &[KeywordId] {
        &self.keywords[included.matched.clone()]
    }

    /// The search hit that brought a domain in (score and matched terms), if search did.
    pub fn search_hit(&self, domain: DomainId) -> Option<&DomainHit> {
        self.search
            .binary_search_by_key(&domain, |h| h.domain)
            .ok()
            .map(|i| &self.search[i])
    }

    /// The meta-tools the answer starts with, in order.
    fn meta_tools<'a>(&self, activation: &'a Activation) -> impl Iterator<Item = &'a Tool> {
        let load = activation.meta_tool().filter(|_| self.meta_tool);
        let search = activation.search_tool().filter(|_| self.search_tool);
        load.into_iter().chain(search)
    }

    /// How many tools [`Decision::tools`] yields, to size the answer once (a fallback over a
    /// large registry is thousands of tools; growing the vector would copy it repeatedly).
    pub fn tool_count(&self, registry: &Registry, activation: &Activation) -> usize {
        self.meta_tools(activation).count()
            + self
                .domains
                .iter()
                .map(|inc| registry.domain(inc.domain).tools.len())
                .sum::<usize>()
    }

    /// The tools of the answer, in order: the meta-tools (when exposed), then each included
    /// domain's tools in manifest order.
    pub fn tools<'a>(
        &'a self,
        registry: &'a Registry,
        activation: &'a Activation,
    ) -> impl Iterator<Item = (&'a str, &'a Tool)> {
        self.meta_tools(activation)
            .map(|t| ("", t))
            .chain(self.domains.iter().flat_map(move |inc| {
                let d = registry.domain(inc.domain);
                d.tools.iter().map(move |t| (d.name.as_str(), t))
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
        inputs.index.domain_hits(message, &options.search, |d| {
            activation.is_active(d)
                && !registry.domain(d).core
                && !registry.domain(d).tools.is_empty()
                && !keyword_hit(d)
        })
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
                domains.push(included(&hits[i]));
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
    domains.retain(|inc| !registry.domain(inc.domain).tools.is_empty());
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

/// Checks a `LoadToolGroup` request against the registry, settings and conversation
/// (SPEC §5). The group name matches exactly.
///
/// # Errors
/// `NotFound` for an unknown group, `FailedPrecondition` for an inactive group or one
/// without tools, each with the exact text clients depend on.
pub fn load(
    registry: &Registry,
    activation: &Activation,
    conversation: &Conversation,
    group: &str,
) -> Result<Load> {
    let Some(d) = registry.find(group) else {
        let available: Vec<&str> = activation
            .loadable
            .iter()
            .map(|&d| registry.domain(d).name.as_str())
            .collect();
        return Err(Error::NotFound(format!(
            "Tool group '{}' not found. Available groups: {}",
            crate::error::echo(group),
            available.join(", ")
        )));
    };
    let domain = registry.domain(d);
    if !activation.is_active(d) {
        return Err(Error::FailedPrecondition(format!(
            "Tool group '{}' is not configured: set one of {}.",
            crate::error::echo(group),
            domain.settings_keys.join(", ")
        )));
    }
    if domain.tools.is_empty() {
        return Err(Error::FailedPrecondition(format!(
            "Tool group '{}' has no available tools.",
            crate::error::echo(group)
        )));
    }
    let already_loaded = domain.core || conversation.is_loaded(group);
    Ok(Load {
        domain: d,
        already_loaded,
    })
}

/// The text a successful load answers with, for the model to read.
pub fn load_text(registry: &Registry, d: DomainId) -> String {
    let domain = registry.domain(d);
    let n = domain.tools.len();
    let mut text = format!(
        "Loaded {n} {} from group '{}':",
        if n == 1 { "tool" } else { "tools" },
        domain.display_name
    );
    for t in &domain.tools {
        text.push_str(&format!("\n- {}: {}", t.name, t.description));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matcher::MatchMode;

    /// A small registry that has one domain for each rule:
    /// `base` core (with a keyword, which must never count as a hit); `media` activated by a
    /// set key; `torrent` activated by a key that is unset; `lights` with no keys; `nokw`
    /// without keywords; `quiet` with `fallback = false`; `empty` without tools.
    const MANIFESTS: &[(&str, &str)] = &[
        (
            "base.json",
            r#"{"name":"base","core":true,"keywords":["base"],"tools":[{"name":"b1","description":"B"}]}"#,
        ),
        (
            "media.json",
            r#"{"name":"media","settings_keys":["media_url","media_key"],"keywords":["movie","film"],
            "tools":[{"name":"m1","description":"M1"},{"name":"m2","description":"M2"}]}"#,
        ),
        (
            "torrent.json",
            r#"{"name":"torrent","settings_keys":["qbt_url","qbt_pass"],"keywords":["torrent","seeding"],
            "tools":[{"name":"t1","description":"T"}]}"#,
        ),
        (
            "lights.json",
            r#"{"name":"lights","keywords":["light"],"tools":[{"name":"l1","description":"L"}]}"#,
        ),
        (
            "nokw.json",
            r#"{"name":"nokw","tools":[{"name":"n1","description":"N"}]}"#,
        ),
        (
            "quiet.json",
            r#"{"name":"quiet","keywords":["quiet"],"fallback":false,"tools":[{"name":"q1","description":"Q"}]}"#,
        ),
        ("empty.json", r#"{"name":"empty","keywords":["empty"]}"#),
    ];

    struct Fixture {
        registry: Registry,
        matcher: Matcher,
        index: SearchIndex,
        activation: Activation,
    }

    impl Fixture {
        fn inputs(&self) -> Inputs<'_> {
            Inputs {
                registry: &self.registry,
                matcher: &self.matcher,
                index: &self.index,
            }
        }

        fn route(&self, conversation: Option<&Conversation>, message: &str, options: &Options) -> Decision {
            route(self.inputs(), &self.activation, conversation, message, options)
        }
    }

    /// v1 routing: keywords only.
    fn keywords_only() -> Options {
        Options {
            search: SearchOptions {
                mode: SearchMode::Off,
                ..SearchOptions::default()
            },
            ..Options::default()
        }
    }

    fn fixture() -> Fixture {
        let registry = Registry::from_sources(MANIFESTS.iter().copied()).unwrap();
        let matcher = Matcher::new(registry.keywords(), MatchMode::Word).unwrap();
        let settings = Snapshot::new([
            ("media_key".to_string(), "secret".to_string()),
            ("qbt_url".to_string(), "  ".to_string()),
        ]);
        let activation = Activation::new(&registry, &settings);
        Fixture {
            index: SearchIndex::new(&registry),
            registry,
            matcher,
            activation,
        }
    }

    fn conv(members: &[(&str, bool, bool)]) -> Conversation {
        Conversation {
            members: members
                .iter()
                .map(|&(d, loaded, hit)| Member {
                    domain: d.into(),
                    loaded,
                    hit,
                })
                .collect(),
        }
    }

    use Reason::{Core, Fallback, Keyword, Loaded, Search, Sticky};
    const ALL: FallbackPolicy = FallbackPolicy::AllActive;
    const CORE_ONLY: FallbackPolicy = FallbackPolicy::CoreOnly;
    type Members = &'static [(&'static str, bool, bool)];

    struct Case {
        rule: &'static str,
        policy: FallbackPolicy,
        /// `None`: no conversation. Members are (domain, loaded, hit).
        conversation: Option<Members>,
        message: &'static str,
        /// (domain, reason, matched keywords), in tool order.
        domains: &'static [(&'static str, Reason, &'static [&'static str])],
        fallback: bool,
        new_hits: &'static [&'static str],
    }

    const CASES: &[Case] = &[
        Case {
            rule: "CORE: active core domains come in every answer, first",
            policy: CORE_ONLY,
            conversation: None,
            message: "hello",
            domains: &[("base", Core, &[])],
            fallback: true,
            new_hits: &[],
        },
        Case {
            rule: "HITS: an active non-core domain whose keyword is in the message",
            policy: ALL,
            conversation: None,
            message: "play a movie",
            domains: &[("base", Core, &[]), ("media", Keyword, &["movie"])],
            fallback: false,
            new_hits: &[],
        },
        Case {
            rule: "matched keywords are listed in manifest order, each once",
            policy: ALL,
            conversation: None,
            message: "film, movie, films",
            domains: &[("base", Core, &[]), ("media", Keyword, &["movie", "film"])],
            fallback: false,
            new_hits: &[],
        },
        Case {
            rule: "a core domain's keyword is never a hit, but it routes the message (no fallback)",
            policy: ALL,
            conversation: None,
            message: "base",
            domains: &[("base", Core, &[])],
            fallback: false,
            new_hits: &[],
        },
        Case {
            rule: "a core keyword hit in a conversation joins nothing",
            policy: ALL,
            conversation: Some(&[]),
            message: "base",
            domains: &[("base", Core, &[])],
            fallback: false,
            new_hits: &[],
        },
        Case {
            rule: "fallback all-active: core, then every active non-core fallback domain with tools, by name",
            policy: ALL,
            conversation: None,
            message: "what can you do?",
            domains: &[
                ("base", Core, &[]),
                ("lights", Fallback, &[]),
                ("media", Fallback, &[]),
                ("nokw", Fallback, &[]),
            ],
            fallback: true,
            new_hits: &[],
        },
        Case {
            rule: "fallback core-only: only core (and loaded) domains",
            policy: CORE_ONLY,
            conversation: None,
            message: "what can you do?",
            domains: &[("base", Core, &[])],
            fallback: true,
            new_hits: &[],
        },
        Case {
            rule: "never while inactive: a keyword of an inactive domain is no hit",
            policy: CORE_ONLY,
            conversation: None,
            message: "is it seeding?",
            domains: &[("base", Core, &[])],
            fallback: true,
            new_hits: &[],
        },
        Case {
            rule: "never while inactive: not by load",
            policy: CORE_ONLY,
            conversation: Some(&[("torrent", true, false)]),
            message: "hi",
            domains: &[("base", Core, &[])],
            fallback: true,
            new_hits: &[],
        },
        Case {
            rule: "never while inactive: not by stickiness, and an inactive sticky domain does not stop the fallback",
            policy: ALL,
            conversation: Some(&[("torrent", false, true)]),
            message: "hi",
            domains: &[
                ("base", Core, &[]),
                ("lights", Fallback, &[]),
                ("media", Fallback, &[]),
                ("nokw", Fallback, &[]),
            ],
            fallback: true,
            new_hits: &[],
        },
        Case {
            rule: "a domain without keywords is never a hit, even when the message names it",
            policy: CORE_ONLY,
            conversation: None,
            message: "nokw n1",
            domains: &[("base", Core, &[])],
            fallback: true,
            new_hits: &[],
        },
        Case {
            rule: "a hit domain without tools contributes no tools but still is a hit (no fallback)",
            policy: ALL,
            conversation: Some(&[]),
            message: "empty",
            domains: &[("base", Core, &[])],
            fallback: false,
            new_hits: &["empty"],
        },
        Case {
            rule: "ordering without a conversation: core, then the other domains by name",
            policy: ALL,
            conversation: None,
            message: "quiet light for the movie",
            domains: &[
                ("base", Core, &[]),
                ("lights", Keyword, &["light"]),
                ("media", Keyword, &["movie"]),
                ("quiet", Keyword, &["quiet"]),
            ],
            fallback: false,
            new_hits: &[],
        },
        Case {
            rule: "HITS join the conversation; domains joining on the same turn by name",
            policy: ALL,
            conversation: Some(&[]),
            message: "quiet light",
            domains: &[
                ("base", Core, &[]),
                ("lights", Keyword, &["light"]),
                ("quiet", Keyword, &["quiet"]),
            ],
            fallback: false,
            new_hits: &["lights", "quiet"],
        },
        Case {
            rule: "STICKY: a domain hit on an earlier turn stays, and stops the fallback",
            policy: ALL,
            conversation: Some(&[("media", false, true)]),
            message: "and now?",
            domains: &[("base", Core, &[]), ("media", Sticky, &[])],
            fallback: false,
            new_hits: &[],
        },
        Case {
            rule: "ordering with a conversation: members in join order before this turn's new hits",
            policy: ALL,
            conversation: Some(&[("quiet", false, true)]),
            message: "a movie",
            domains: &[
                ("base", Core, &[]),
                ("quiet", Sticky, &[]),
                ("media", Keyword, &["movie"]),
            ],
            fallback: false,
            new_hits: &["media"],
        },
        Case {
            rule: "KEYWORD is the reason for a member hit again, in its join position; nothing new to record",
            policy: ALL,
            conversation: Some(&[("quiet", false, true), ("media", false, true)]),
            message: "quiet movie",
            domains: &[
                ("base", Core, &[]),
                ("quiet", Keyword, &["quiet"]),
                ("media", Keyword, &["movie"]),
            ],
            fallback: false,
            new_hits: &[],
        },
        Case {
            rule: "LOADED: a loaded group comes in with the fallback, before the fallback domains, not twice",
            policy: ALL,
            conversation: Some(&[("lights", true, false)]),
            message: "hi",
            domains: &[
                ("base", Core, &[]),
                ("lights", Loaded, &[]),
                ("media", Fallback, &[]),
                ("nokw", Fallback, &[]),
            ],
            fallback: true,
            new_hits: &[],
        },
        Case {
            rule: "LOADED with core-only fallback: core and loaded",
            policy: CORE_ONLY,
            conversation: Some(&[("quiet", true, false)]),
            message: "hi",
            domains: &[("base", Core, &[]), ("quiet", Loaded, &[])],
            fallback: true,
            new_hits: &[],
        },
        Case {
            rule: "LOADED comes in beside hits too; KEYWORD outranks LOADED; a loaded member that is hit is recorded as hit",
            policy: ALL,
            conversation: Some(&[("quiet", true, false), ("media", true, false)]),
            message: "movie",
            domains: &[
                ("base", Core, &[]),
                ("quiet", Loaded, &[]),
                ("media", Keyword, &["movie"]),
            ],
            fallback: false,
            new_hits: &["media"],
        },
        Case {
            rule: "LOADED outranks STICKY",
            policy: ALL,
            conversation: Some(&[("media", true, true)]),
            message: "hi",
            domains: &[("base", Core, &[]), ("media", Loaded, &[])],
            fallback: false,
            new_hits: &[],
        },
        Case {
            rule: "fallback domains do not join the conversation",
            policy: ALL,
            conversation: Some(&[]),
            message: "hello",
            domains: &[
                ("base", Core, &[]),
                ("lights", Fallback, &[]),
                ("media", Fallback, &[]),
                ("nokw", Fallback, &[]),
            ],
            fallback: true,
            new_hits: &[],
        },
        Case {
            rule: "a member whose domain no longer exists is skipped",
            policy: CORE_ONLY,
            conversation: Some(&[("gone", true, true)]),
            message: "hello",
            domains: &[("base", Core, &[])],
            fallback: true,
            new_hits: &[],
        },
    ];

    #[test]
    fn every_routing_rule_holds() {
        let f = fixture();
        for case in CASES {
            let options = Options {
                fallback: case.policy,
                ..keywords_only()
            };
            let c = case.conversation.map(conv);
            let d = f.route(c.as_ref(), case.message, &options);
            let got: Vec<(&str, Reason, Vec<&str>)> = d
                .domains
                .iter()
                .map(|i| {
                    let kws = d.matched(i).iter().map(|&k| f.registry.keyword(k)).collect();
                    (f.registry.domain(i.domain).name.as_str(), i.reason, kws)
                })
                .collect();
            let want: Vec<(&str, Reason, Vec<&str>)> =
                case.domains.iter().map(|&(n, r, k)| (n, r, k.to_vec())).collect();
            assert_eq!(got, want, "rule: {}", case.rule);
            assert_eq!(d.fallback, case.fallback, "fallback flag; rule: {}", case.rule);
            let new: Vec<&str> = d
                .new_hits
                .iter()
                .map(|&h| f.registry.domain(h).name.as_str())
                .collect();
            assert_eq!(new, case.new_hits, "new hits; rule: {}", case.rule);
        }
    }

    /// A registry whose tools say what they do, for the search rules: `system` core; `climate`,
    /// `media`, `lights`, `docs` active; `adblock` inactive (its key is unset).
    const SEARCH_MANIFESTS: &[(&str, &str)] = &[
        (
            "system.json",
            r#"{"name":"system","core":true,"keywords":["uptime"],"tools":[
                {"name":"disk_usage","description":"Show disk space used and free on the server"}]}"#,
        ),
        (
            "climate.json",
            r#"{"name":"climate","keywords":["thermostat"],"tools":[
                {"name":"set_temperature","description":"Set the target temperature of the heating"},
                {"name":"get_temperature","description":"Read the current room temperature"}]}"#,
        ),
        (
            "media.json",
            r#"{"name":"media","keywords":["movie"],"tools":[
                {"name":"play_film","description":"Play a film or a TV episode"},
                {"name":"pause_playback","description":"Pause what is playing"}]}"#,
        ),
        (
            "lights.json",
            r#"{"name":"lights","keywords":["lamp"],"tools":[
                {"name":"dim_light","description":"Dim a light in a room such as the hallway or kitchen"}]}"#,
        ),
        (
            "docs.json",
            r#"{"name":"docs","keywords":["paperless"],"tools":[
                {"name":"merge_documents","description":"Combine scanned documents into one PDF"}]}"#,
        ),
        (
            "adblock.json",
            r#"{"name":"adblock","settings_keys":["adblock_url"],"tools":[
                {"name":"block_ads","description":"Block ads and trackers for every phone on the network"}]}"#,
        ),
    ];

    fn search_fixture() -> Fixture {
        let registry = Registry::from_sources(SEARCH_MANIFESTS.iter().copied()).unwrap();
        Fixture {
            matcher: Matcher::new(registry.keywords(), MatchMode::Word).unwrap(),
            index: SearchIndex::new(&registry),
            activation: Activation::new(&registry, &Snapshot::default()),
            registry,
        }
    }

    struct SearchCase {
        rule: &'static str,
        mode: SearchMode,
        conversation: Option<Members>,
        message: &'static str,
        /// Domain, reason, and the matched keywords or search terms.
        domains: &'static [(&'static str, Reason, &'static [&'static str])],
        fallback: bool,
        new_hits: &'static [&'static str],
    }

    const ACTIVE_FALLBACK: &[(&str, Reason, &[&str])] = &[
        ("system", Core, &[]),
        ("climate", Fallback, &[]),
        ("docs", Fallback, &[]),
        ("lights", Fallback, &[]),
        ("media", Fallback, &[]),
    ];

    const SEARCH_CASES: &[SearchCase] = &[
        SearchCase {
            rule: "search finds a domain whose keywords the message does not say",
            mode: SearchMode::Augment,
            conversation: None,
            message: "turn the heating up a bit",
            domains: &[("system", Core, &[]), ("climate", Search, &["heating"])],
            fallback: false,
            new_hits: &[],
        },
        SearchCase {
            rule: "each clause of a multi-request message finds its own domain",
            mode: SearchMode::Augment,
            conversation: None,
            message: "pause the film and dim the hallway",
            domains: &[
                ("system", Core, &[]),
                ("lights", Search, &["dim", "hallway"]),
                // The terms its best tool (`pause_playback`) matched.
                ("media", Search, &["pause"]),
            ],
            fallback: false,
            new_hits: &[],
        },
        SearchCase {
            rule: "search hits join keyword hits; a keyword hit keeps reason KEYWORD",
            mode: SearchMode::Augment,
            conversation: None,
            message: "play the movie, then set the heating to 20 degrees",
            domains: &[
                ("system", Core, &[]),
                ("climate", Search, &["set", "heating"]),
                ("media", Keyword, &["movie"]),
            ],
            fallback: false,
            new_hits: &[],
        },
        SearchCase {
            rule: "an inactive domain is never a search hit, and weaker domains do not take its place",
            mode: SearchMode::Augment,
            conversation: None,
            message: "why do I still see ads on my phone?",
            domains: ACTIVE_FALLBACK,
            fallback: true,
            new_hits: &[],
        },
        SearchCase {
            rule: "a segment about a core domain gives no search hit",
            mode: SearchMode::Augment,
            conversation: None,
            message: "how much disk space is free on the server",
            domains: ACTIVE_FALLBACK,
            fallback: true,
            new_hits: &[],
        },
        SearchCase {
            rule: "small talk has no search hit",
            mode: SearchMode::Augment,
            conversation: None,
            message: "ok, thanks! do it please",
            domains: ACTIVE_FALLBACK,
            fallback: true,
            new_hits: &[],
        },
        SearchCase {
            rule: "search off is keyword routing",
            mode: SearchMode::Off,
            conversation: None,
            message: "turn the heating up a bit",
            domains: ACTIVE_FALLBACK,
            fallback: true,
            new_hits: &[],
        },
        SearchCase {
            rule: "search fallback runs only when nothing else routed the message",
            mode: SearchMode::Fallback,
            conversation: None,
            message: "play the movie, then set the heating to 20 degrees",
            domains: &[("system", Core, &[]), ("media", Keyword, &["movie"])],
            fallback: false,
            new_hits: &[],
        },
        SearchCase {
            rule: "search fallback routes a message nothing else routed",
            mode: SearchMode::Fallback,
            conversation: None,
            message: "turn the heating up a bit",
            domains: &[("system", Core, &[]), ("climate", Search, &["heating"])],
            fallback: false,
            new_hits: &[],
        },
        SearchCase {
            rule: "search fallback does not run over a sticky conversation",
            mode: SearchMode::Fallback,
            conversation: Some(&[("media", false, true)]),
            message: "turn the heating up a bit",
            domains: &[("system", Core, &[]), ("media", Sticky, &[])],
            fallback: false,
            new_hits: &[],
        },
        SearchCase {
            rule: "a search hit joins the conversation like a keyword hit",
            mode: SearchMode::Augment,
            conversation: Some(&[("lights", true, false)]),
            message: "turn the heating up a bit",
            domains: &[
                ("system", Core, &[]),
                ("lights", Loaded, &[]),
                ("climate", Search, &["heating"]),
            ],
            fallback: false,
            new_hits: &["climate"],
        },
        SearchCase {
            rule: "a domain hit by search earlier is sticky",
            mode: SearchMode::Augment,
            conversation: Some(&[("climate", false, true)]),
            message: "hi",
            domains: &[("system", Core, &[]), ("climate", Sticky, &[])],
            fallback: false,
            new_hits: &[],
        },
    ];

    #[test]
    fn every_search_routing_rule_holds() {
        let f = search_fixture();
        for case in SEARCH_CASES {
            let mut options = Options::default();
            options.search.mode = case.mode;
            let c = case.conversation.map(conv);
            let d = f.route(c.as_ref(), case.message, &options);
            let got: Vec<(&str, Reason, Vec<String>)> = d
                .domains
                .iter()
                .map(|i| {
                    let mut matched: Vec<String> = d
                        .matched(i)
                        .iter()
                        .map(|&k| f.registry.keyword(k).to_string())
                        .collect();
                    if i.reason == Search {
                        let hit = d.search_hit(i.domain).expect("a search domain has its hit");
                        assert!(hit.score > 0.0, "rule: {}", case.rule);
                        matched = hit.terms.clone();
                    }
                    (f.registry.domain(i.domain).name.as_str(), i.reason, matched)
                })
                .collect();
            let want: Vec<(&str, Reason, Vec<String>)> = case
                .domains
                .iter()
                .map(|&(n, r, k)| (n, r, k.iter().map(|s| s.to_string()).collect()))
                .collect();
            assert_eq!(got, want, "rule: {}", case.rule);
            assert_eq!(d.fallback, case.fallback, "fallback flag; rule: {}", case.rule);
            let new: Vec<&str> = d
                .new_hits
                .iter()
                .map(|&h| f.registry.domain(h).name.as_str())
                .collect();
            assert_eq!(new, case.new_hits, "new hits; rule: {}", case.rule);
        }
    }

    #[test]
    fn tools_keep_manifest_order_after_the_meta_tool() {
        let f = fixture();
        let d = f.route(None, "movie", &Options::default());
        let names: Vec<(&str, &str)> = d
            .tools(&f.registry, &f.activation)
            .map(|(dom, t)| (dom, t.name.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("", LOAD_TOOL_GROUP),
                ("", SEARCH_TOOLS),
                ("base", "b1"),
                ("media", "m1"),
                ("media", "m2")
            ]
        );
        assert_eq!(d.tool_count(&f.registry, &f.activation), names.len());
    }

    #[test]
    fn the_meta_tool_enumerates_active_non_core_groups_with_tools_by_name() {
        let f = fixture();
        let meta = f.activation.meta_tool().expect("loadable groups exist");
        assert_eq!(meta.name, LOAD_TOOL_GROUP);
        assert_eq!(meta.tier, Tier::Read);
        let schema: serde_json::Value = serde_json::from_str(&meta.input_schema_json).unwrap();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["required"], serde_json::json!(["group_name"]));
        assert_eq!(schema["properties"]["group_name"]["type"], "string");
        assert_eq!(
            schema["properties"]["group_name"]["enum"],
            serde_json::json!(["lights", "media", "nokw", "quiet"])
        );
    }

    #[test]
    fn the_meta_tool_is_left_out_when_turned_off_or_when_nothing_is_loadable() {
        let f = fixture();
        let off = Options {
            expose_load_tool_group: false,
            expose_search_tools: false,
            ..Options::default()
        };
        let d = f.route(None, "movie", &off);
        assert!(!d.meta_tool && !d.search_tool);
        assert_eq!(d.tools(&f.registry, &f.activation).next().unwrap().1.name, "b1");
        let search_only = Options {
            expose_load_tool_group: false,
            ..Options::default()
        };
        let d = f.route(None, "movie", &search_only);
        let first: Vec<&str> = d
            .tools(&f.registry, &f.activation)
            .take(2)
            .map(|(_, t)| t.name.as_str())
            .collect();
        assert_eq!(first, [SEARCH_TOOLS, "b1"]);

        let only_core = Registry::from_sources([MANIFESTS[0], MANIFESTS[6]]).unwrap();
        let m = Matcher::new(only_core.keywords(), MatchMode::Word).unwrap();
        let a = Activation::new(&only_core, &Snapshot::default());
        assert!(a.meta_tool().is_none() && a.search_tool().is_none());
        assert_eq!(a.prompt_section(&only_core), "");
        let index = SearchIndex::new(&only_core);
        let inputs = Inputs {
            registry: &only_core,
            matcher: &m,
            index: &index,
        };
        let d = route(inputs, &a, None, "x", &Options::default());
        assert!(!d.meta_tool && !d.search_tool);
    }

    #[test]
    fn the_prompt_section_lists_loadable_groups_by_name() {
        let f = fixture();
        assert_eq!(
            f.activation.prompt_section(&f.registry),
            "## Available Tool Groups\n\nUse `load_tool_group` to load tools from a group before using them.\n\n\
             - lights: Tools from lights group\n- media: Tools from media group\n- nokw: Tools from nokw group\n- quiet: Tools from quiet group"
        );
    }

    #[test]
    fn loading_answers_each_case_with_the_exact_text() {
        let f = fixture();
        let c = conv(&[("quiet", true, false)]);
        let load = |g: &str| super::load(&f.registry, &f.activation, &c, g);
        assert_eq!(
            load("nope").unwrap_err().to_string(),
            "Tool group 'nope' not found. Available groups: lights, media, nokw, quiet"
        );
        assert!(
            matches!(load("Media"), Err(Error::NotFound(_))),
            "names match case-sensitively"
        );
        assert!(
            matches!(load(" media"), Err(Error::NotFound(_))),
            "names are not trimmed"
        );
        let inactive = load("torrent").unwrap_err();
        assert!(matches!(inactive, Error::FailedPrecondition(_)));
        assert_eq!(
            inactive.to_string(),
            "Tool group 'torrent' is not configured: set one of qbt_url, qbt_pass."
        );
        let empty = load("empty").unwrap_err();
        assert!(matches!(empty, Error::FailedPrecondition(_)));
        assert_eq!(empty.to_string(), "Tool group 'empty' has no available tools.");
        let media = f.registry.find("media").unwrap();
        assert_eq!(
            load("media").unwrap(),
            Load {
                domain: media,
                already_loaded: false
            }
        );
        assert!(
            load("quiet").unwrap().already_loaded,
            "loading twice changes nothing"
        );
        assert!(
            load("base").unwrap().already_loaded,
            "a core domain is always loaded"
        );
    }

    #[test]
    fn the_load_text_lists_each_tool_and_counts_one_tool_in_the_singular() {
        let f = fixture();
        assert_eq!(
            load_text(&f.registry, f.registry.find("media").unwrap()),
            "Loaded 2 tools from group 'Media':\n- m1: M1\n- m2: M2"
        );
        assert_eq!(
            load_text(&f.registry, f.registry.find("lights").unwrap()),
            "Loaded 1 tool from group 'Lights':\n- l1: L"
        );
    }

    #[test]
    fn recording_hits_and_loads_keeps_join_order() {
        let f = fixture();
        let mut c = conv(&[("quiet", true, false)]);
        let ids = [
            f.registry.find("lights").unwrap(),
            f.registry.find("quiet").unwrap(),
        ];
        c.record_hits(&f.registry, &ids);
        c.record_load("media");
        c.record_load("lights");
        assert_eq!(
            c,
            conv(&[
                ("quiet", true, true),
                ("lights", true, true),
                ("media", true, false)
            ])
        );
    }
}
