//! Activation: what a settings snapshot means for one registry (which domains are active,
//! and the lists every answer draws from), and the meta-tools built from it.

use std::collections::HashMap;

use std::ops::Range;

use super::policy::{Patterns, Profile};
use super::{LOAD_TOOL_GROUP, SEARCH_TOOLS};
use crate::registry::{DomainId, Registry, Tier, Tool};

/// The settings key that holds the disabled tools: a JSON array of tool names or globs.
pub const DISABLED_TOOLS_KEY: &str = "toolrouter.disabled_tools";

/// All settings rows at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    values: HashMap<String, String>,
    /// The tools no consumer sees (from [`DISABLED_TOOLS_KEY`]).
    disabled: Patterns,
    /// Why the [`DISABLED_TOOLS_KEY`] value was ignored, when it was.
    disabled_problem: Option<String>,
}

impl Snapshot {
    /// A snapshot of these rows.
    pub fn new(rows: impl IntoIterator<Item = (String, String)>) -> Snapshot {
        Snapshot::of(rows.into_iter().collect(), None)
    }

    /// A snapshot of these rows read after `previous`: disabled tools that did not change
    /// are taken as `previous` compiled them (thousands of globs take a second to compile).
    pub fn after(rows: impl IntoIterator<Item = (String, String)>, previous: &Snapshot) -> Snapshot {
        Snapshot::of(rows.into_iter().collect(), Some(previous))
    }

    fn of(values: HashMap<String, String>, previous: Option<&Snapshot>) -> Snapshot {
        let unchanged =
            previous.filter(|p| p.values.get(DISABLED_TOOLS_KEY) == values.get(DISABLED_TOOLS_KEY));
        if let Some(p) = unchanged {
            return Snapshot {
                disabled: p.disabled.clone(),
                disabled_problem: p.disabled_problem.clone(),
                values,
            };
        }
        let (disabled, disabled_problem) = match values.get(DISABLED_TOOLS_KEY) {
            Some(v) if !v.trim().is_empty() => match disabled_tools(v) {
                Ok(p) => (p, None),
                Err(why) => (Patterns::default(), Some(why)),
            },
            _ => (Patterns::default(), None),
        };
        Snapshot {
            values,
            disabled,
            disabled_problem,
        }
    }

    /// The tools no consumer sees.
    pub fn disabled(&self) -> &Patterns {
        &self.disabled
    }

    /// Why the disabled-tools value was ignored (it is not a JSON array of names or globs).
    pub fn disabled_problem(&self) -> Option<&str> {
        self.disabled_problem.as_deref()
    }

    /// A snapshot that sets every settings key of `registry`, so every domain is active (for
    /// evaluation and benchmark workloads).
    pub fn every_key_set(registry: &crate::registry::Registry) -> Snapshot {
        Snapshot::new(
            registry
                .domains()
                .iter()
                .flat_map(|d| d.settings_keys.iter().map(|k| (k.clone(), "set".to_string()))),
        )
    }

    /// Every (key, value) row.
    pub fn rows(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// True when `key` has a value that is not empty after trimming Unicode whitespace.
    pub(crate) fn is_set(&self, key: &str) -> bool {
        self.values.get(key).is_some_and(|v| !v.trim().is_empty())
    }
}

/// Why a value for the settings key `key` would be ignored, if it would: an empty or
/// whitespace-only key (no manifest may name one, so it activates nothing), and
/// [`DISABLED_TOOLS_KEY`]'s values, the only ones with a form (a JSON array of tool names or
/// globs; empty is none), for a settings editor to check before writing.
pub fn refused_setting(key: &str, value: &str) -> Option<String> {
    if key.trim().is_empty() {
        return Some(
            "the settings key is empty or whitespace-only (manifests refuse such a key, so it would activate nothing)"
                .into(),
        );
    }
    (key == DISABLED_TOOLS_KEY && !value.trim().is_empty())
        .then(|| disabled_tools(value).err())
        .flatten()
}

/// The most names or globs the disabled-tools value may hold: past it a value is ignored, as
/// an invalid one is (forty thousand globs took a second and 400 MB to compile).
pub const MAX_DISABLED_PATTERNS: usize = 4096;

/// Parses the disabled-tools value: a JSON array of non-empty tool names or globs.
fn disabled_tools(value: &str) -> Result<Patterns, String> {
    let names: Vec<String> = serde_json::from_str(value)
        .map_err(|e| format!("`{DISABLED_TOOLS_KEY}` must be a JSON array of tool names or globs ({e})"))?;
    if names.len() > MAX_DISABLED_PATTERNS {
        return Err(format!(
            "`{DISABLED_TOOLS_KEY}` holds {} names or globs; at most {MAX_DISABLED_PATTERNS} (use globs that cover several)",
            names.len()
        ));
    }
    if names.iter().any(|n| n.trim().is_empty()) {
        return Err(format!("`{DISABLED_TOOLS_KEY}` holds an empty name"));
    }
    Patterns::new(&names).map_err(|e| format!("`{DISABLED_TOOLS_KEY}`: {e}"))
}

/// What a policy hides of a registry, tool by tool (absent when it hides nothing).
#[derive(Debug, Clone)]
struct Hidden {
    /// `visible[t]` for every tool in registry order (domain order, then manifest order).
    visible: Vec<bool>,
    /// Visible tools per domain.
    counts: Vec<u32>,
    /// Domains the profile's domain patterns let through.
    allowed: Vec<bool>,
    /// Domains the consumer sees: allowed, and left with tools (or never had any).
    shown: Vec<bool>,
}

/// What the settings snapshot means for one registry: which domains are active, and the
/// lists every answer draws from. Derived once per (registry, snapshot) pair, so a route
/// costs what its answer holds, not what the registry holds.
#[derive(Debug, Clone)]
pub struct Activation {
    /// Configured (by the settings) and visible (under the policy).
    pub(super) active: Vec<bool>,
    /// Configured by the settings, whatever the policy.
    configured: Vec<bool>,
    /// What the policy hides; `None` when it hides nothing.
    hidden: Option<Hidden>,
    /// Active core domains, by name.
    pub(super) core: Vec<DomainId>,
    /// Active non-core domains with `fallback = true`, by name.
    pub(super) fallback: Vec<DomainId>,
    /// Active non-core domains that have tools, by name: what `load_tool_group` may load.
    pub(super) loadable: Vec<DomainId>,
    /// The `load_tool_group` meta-tool, present when something is loadable.
    pub(super) meta_tool: Option<Tool>,
    /// The `search_tools` meta-tool, present when something is loadable.
    pub(super) search_tool: Option<Tool>,
}

impl Activation {
    /// Derives activation from a settings snapshot, for a consumer without a profile.
    pub fn new(registry: &Registry, settings: &Snapshot) -> Activation {
        Activation::scoped(registry, settings, None)
    }

    /// Derives activation from a settings snapshot for a consumer with this profile (none:
    /// only the disabled tools are hidden). A domain is active when its settings are and the
    /// policy leaves it visible: a domain the profile's domain patterns refuse, or whose
    /// tools are all hidden, is not.
    pub fn scoped(registry: &Registry, settings: &Snapshot, profile: Option<&Profile>) -> Activation {
        let configured: Vec<bool> = registry
            .domains()
            .iter()
            .map(|d| d.settings_keys.is_empty() || d.settings_keys.iter().any(|k| settings.is_set(k)))
            .collect();
        let hidden = hide(registry, settings.disabled(), profile);
        let active: Vec<bool> = match &hidden {
            None => configured.clone(),
            Some(h) => configured.iter().zip(&h.shown).map(|(&c, &s)| c && s).collect(),
        };
        let ids = |pred: &dyn Fn(DomainId) -> bool| -> Vec<DomainId> {
            registry
                .domain_ids()
                .filter(|&d| active[d.index()] && pred(d))
                .collect()
        };
        let core = ids(&|d| registry.domain(d).core);
        let fallback = ids(&|d| !registry.domain(d).core && registry.domain(d).fallback);
        let count = |d: DomainId| {
            hidden
                .as_ref()
                .map_or(registry.domain(d).tools.len(), |h| h.counts[d.index()] as usize)
        };
        let loadable = ids(&|d| !registry.domain(d).core && count(d) > 0);
        let meta_tool = (!loadable.is_empty()).then(|| meta_tool(registry, &loadable));
        let search_tool = (!loadable.is_empty()).then(search_tool);
        Activation {
            active,
            configured,
            hidden,
            core,
            fallback,
            loadable,
            meta_tool,
            search_tool,
        }
    }

    /// Whether a domain is active.
    pub fn is_active(&self, d: DomainId) -> bool {
        self.active[d.index()]
    }

    /// Whether a domain's settings keys have values, whatever the policy.
    pub fn is_configured(&self, d: DomainId) -> bool {
        self.configured[d.index()]
    }

    /// Whether the consumer sees a domain (whatever the settings): the profile's domain
    /// patterns let it through and the policy leaves it tools, or it never had any.
    pub fn is_visible(&self, d: DomainId) -> bool {
        self.hidden.as_ref().is_none_or(|h| h.shown[d.index()])
    }

    /// Whether the profile's domain patterns let a domain through.
    pub fn is_allowed(&self, d: DomainId) -> bool {
        self.hidden.as_ref().is_none_or(|h| h.allowed[d.index()])
    }

    /// Visibility of every tool in registry order; `None` when every tool is visible.
    pub fn tool_mask(&self) -> Option<&[bool]> {
        self.hidden.as_ref().map(|h| h.visible.as_slice())
    }

    /// How many of a domain's tools are visible.
    pub fn visible_count(&self, registry: &Registry, d: DomainId) -> usize {
        self.hidden
            .as_ref()
            .map_or(registry.domain(d).tools.len(), |h| h.counts[d.index()] as usize)
    }

    /// A domain's visible tools, in manifest order.
    pub fn visible_tools<'a>(
        &'a self,
        registry: &'a Registry,
        d: DomainId,
    ) -> impl Iterator<Item = &'a Tool> + 'a {
        let mask = self.hidden.as_ref().map(|h| &h.visible[registry.tool_range(d)]);
        registry
            .domain(d)
            .tools
            .iter()
            .enumerate()
            .filter(move |&(i, _)| mask.is_none_or(|m| m[i]))
            .map(|(_, t)| t)
    }

    /// Splits a domain's tools, given as their registry-order `range`, into the runs of
    /// visible ones (the whole range when nothing is hidden), in order.
    pub fn runs(&self, range: Range<usize>) -> impl Iterator<Item = Range<usize>> + '_ {
        let mask = self.hidden.as_ref().map(|h| &h.visible[range.clone()]);
        let mut i = 0;
        std::iter::from_fn(move || {
            let n = range.len();
            match mask {
                None if i == 0 && n > 0 => {
                    i = n;
                    Some(range.clone())
                }
                None => None,
                Some(m) => {
                    while i < n && !m[i] {
                        i += 1;
                    }
                    let start = i;
                    while i < n && m[i] {
                        i += 1;
                    }
                    (start < i).then(|| range.start + start..range.start + i)
                }
            }
        })
    }

    /// Active domains, by name.
    pub fn active(&self) -> impl Iterator<Item = DomainId> + '_ {
        (0..self.active.len())
            .filter(|&d| self.active[d])
            .map(DomainId::at)
    }

    /// The `load_tool_group` meta-tool, when any group is loadable.
    pub fn meta_tool(&self) -> Option<&Tool> {
        self.meta_tool.as_ref()
    }

    /// Both meta-tools, in answer order, when any group is loadable.
    pub fn meta_tools(&self) -> impl Iterator<Item = &Tool> {
        self.meta_tool.iter().chain(self.search_tool.iter())
    }

    /// The `search_tools` meta-tool, when any group is loadable.
    pub(crate) fn search_tool(&self) -> Option<&Tool> {
        self.search_tool.as_ref()
    }

    /// Active non-core domains that have tools, by name: what `load_tool_group` may load.
    pub fn loadable(&self) -> &[DomainId] {
        &self.loadable
    }

    /// The system-prompt section that lists loadable groups (empty when there are none),
    /// telling the model to load them with the meta-tool when answers carry it
    /// (`load_tool`); without it the groups are listed only.
    pub fn prompt_section(&self, registry: &Registry, load_tool: bool) -> String {
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
        let how = if load_tool {
            format!("Use `{LOAD_TOOL_GROUP}` to load tools from a group before using them.\n\n")
        } else {
            String::new()
        };
        format!("## Available Tool Groups\n\n{how}{}", lines.join("\n"))
    }
}

/// What the disabled tools and the profile hide; `None` when they hide nothing.
fn hide(registry: &Registry, disabled: &Patterns, profile: Option<&Profile>) -> Option<Hidden> {
    if disabled.is_empty() && profile.is_none() {
        return None;
    }
    let domains = registry.domains();
    let mut hidden = Hidden {
        visible: Vec::with_capacity(registry.tool_count()),
        counts: Vec::with_capacity(domains.len()),
        allowed: Vec::with_capacity(domains.len()),
        shown: Vec::with_capacity(domains.len()),
    };
    for d in domains {
        let allowed = profile.is_none_or(|p| p.allows_domain(&d.name));
        hidden.allowed.push(allowed);
        let mut count = 0;
        for t in &d.tools {
            let visible = allowed && !disabled.matches(&t.name) && profile.is_none_or(|p| p.allows_tool(t));
            count += u32::from(visible);
            hidden.visible.push(visible);
        }
        hidden.counts.push(count);
        // Hidden: out of the profile's domains, or every tool it has hidden. A domain without
        // tools has none to hide, so a profile that allows it sees it as a consumer without
        // a profile does (its keyword hits count).
        hidden.shown.push(allowed && (count > 0 || d.tools.is_empty()));
    }
    Some(hidden)
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
