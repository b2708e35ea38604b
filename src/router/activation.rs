//! Activation: what a settings snapshot means for one registry (which domains are active,
//! and the lists every answer draws from), and the meta-tools built from it.

use std::collections::HashMap;

use super::{LOAD_TOOL_GROUP, SEARCH_TOOLS};
use crate::registry::{DomainId, Registry, Tier, Tool};

/// All settings rows at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    values: HashMap<String, String>,
}

impl Snapshot {
    /// A snapshot of these rows.
    pub fn new(rows: impl IntoIterator<Item = (String, String)>) -> Snapshot {
        Snapshot {
            values: rows.into_iter().collect(),
        }
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

/// What the settings snapshot means for one registry: which domains are active, and the
/// lists every answer draws from. Derived once per (registry, snapshot) pair, so a route
/// costs what its answer holds, not what the registry holds.
#[derive(Debug, Clone)]
pub struct Activation {
    pub(super) active: Vec<bool>,
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
    /// Derives activation from a settings snapshot.
    pub fn new(registry: &Registry, settings: &Snapshot) -> Activation {
        let active: Vec<bool> = registry
            .domains()
            .iter()
            .map(|d| d.settings_keys.is_empty() || d.settings_keys.iter().any(|k| settings.is_set(k)))
            .collect();
        let ids = |pred: &dyn Fn(DomainId) -> bool| -> Vec<DomainId> {
            registry
                .domain_ids()
                .filter(|&d| active[d.index()] && pred(d))
                .collect()
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
        self.active[d.index()]
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
