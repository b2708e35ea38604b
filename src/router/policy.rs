//! Policies: what a consumer may see (SPEC §10). A profile (allow and deny globs on domains
//! and tools, a highest tier) and the disabled tools of a settings snapshot decide, tool by
//! tool, what is visible; [`super::Activation`] folds that in, so routing, fallback, budgets
//! and meta-tools are computed over what the consumer may see.

use globset::{Glob, GlobSet, GlobSetBuilder};

use crate::registry::{Tier, Tool};

/// Glob patterns over names (`*`, `?`, `[...]`, `{a,b}`); none matches nothing.
#[derive(Debug, Clone, Default)]
pub struct Patterns {
    /// Shared: a snapshot re-read with the same patterns reuses them compiled.
    set: std::sync::Arc<GlobSet>,
    patterns: std::sync::Arc<[String]>,
}

impl PartialEq for Patterns {
    fn eq(&self, other: &Self) -> bool {
        self.patterns == other.patterns
    }
}

impl Patterns {
    /// Compiles patterns.
    ///
    /// # Errors
    /// The first pattern that is not a valid glob, and why.
    pub fn new(patterns: &[String]) -> Result<Patterns, String> {
        let mut builder = GlobSetBuilder::new();
        for p in patterns {
            let glob = Glob::new(p).map_err(|e| format!("`{p}` is not a valid glob: {}", e.kind()))?;
            builder.add(glob);
        }
        let set = builder
            .build()
            .map_err(|e| format!("the patterns cannot be compiled: {e}"))?;
        Ok(Patterns {
            set: set.into(),
            patterns: patterns.into(),
        })
    }

    /// Whether two are the same compiled patterns (not just equal ones).
    #[cfg(test)]
    pub(crate) fn shares_compiled(&self, other: &Patterns) -> bool {
        std::sync::Arc::ptr_eq(&self.set, &other.set)
    }

    /// Whether there are no patterns.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether a pattern matches the whole name.
    pub fn matches(&self, name: &str) -> bool {
        !self.patterns.is_empty() && self.set.is_match(name)
    }

    /// The positions (in [`Patterns::as_slice`]) of the patterns that match the whole name.
    pub fn matching(&self, name: &str) -> Vec<usize> {
        if self.patterns.is_empty() {
            Vec::new()
        } else {
            self.set.matches(name)
        }
    }

    /// The patterns as written.
    pub fn as_slice(&self) -> &[String] {
        &self.patterns
    }
}

/// Tiers in the order a profile's `max_tier` reads them; an unspecified tier counts as
/// destructive.
fn rank(tier: Tier) -> u8 {
    match tier.effective() {
        Tier::Read => 0,
        Tier::Modify => 1,
        Tier::Destructive | Tier::Unspecified => 2,
    }
}

/// A consumer's view of the registry (SPEC §10): allow and deny globs on domain and tool
/// names (deny wins; no allow pattern allows everything) and the highest tier it may see.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Its name in requests and in the configuration.
    pub name: String,
    /// Domains it may see (all when empty).
    pub allow_domains: Patterns,
    /// Domains it never sees.
    pub deny_domains: Patterns,
    /// Tools it may see (all when empty).
    pub allow_tools: Patterns,
    /// Tools it never sees.
    pub deny_tools: Patterns,
    /// The highest tier it sees.
    pub max_tier: Tier,
    /// Its `max_tools` for `Route` (a request may ask for fewer, not more).
    pub max_tools: Option<u32>,
    /// Its token budget for `Route` (a request may ask for less, not more).
    pub token_budget: Option<u32>,
}

impl Profile {
    /// A profile that sees everything.
    pub fn open(name: &str) -> Profile {
        Profile {
            name: name.to_string(),
            allow_domains: Patterns::default(),
            deny_domains: Patterns::default(),
            allow_tools: Patterns::default(),
            deny_tools: Patterns::default(),
            max_tier: Tier::Destructive,
            max_tools: None,
            token_budget: None,
        }
    }

    /// Whether it may see this domain at all.
    pub fn allows_domain(&self, domain: &str) -> bool {
        (self.allow_domains.is_empty() || self.allow_domains.matches(domain))
            && !self.deny_domains.matches(domain)
    }

    /// Whether it may see this tool of a domain it may see.
    pub fn allows_tool(&self, tool: &Tool) -> bool {
        (self.allow_tools.is_empty() || self.allow_tools.matches(&tool.name))
            && !self.deny_tools.matches(&tool.name)
            && rank(tool.tier) <= rank(self.max_tier)
    }
}

/// The profiles a daemon knows, by name.
#[derive(Debug, Clone, Default)]
pub struct Profiles {
    profiles: Vec<Profile>,
}

/// A profile of one [`Profiles`]: its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProfileId(usize);

impl ProfileId {
    /// Its position among the profiles, by name.
    pub fn index(self) -> usize {
        self.0
    }
}

impl Profiles {
    /// These profiles (names must be unique).
    pub fn new(mut profiles: Vec<Profile>) -> Profiles {
        profiles.sort_by(|a, b| a.name.cmp(&b.name));
        profiles.dedup_by(|a, b| a.name == b.name);
        Profiles { profiles }
    }

    /// The profile with this name.
    pub fn find(&self, name: &str) -> Option<ProfileId> {
        self.profiles
            .binary_search_by(|p| p.name.as_str().cmp(name))
            .ok()
            .map(ProfileId)
    }

    /// A profile by id.
    pub fn get(&self, id: ProfileId) -> &Profile {
        &self.profiles[id.0]
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.profiles.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.profiles.is_empty()
    }

    /// Their names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.profiles.iter().map(|p| p.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns(p: &[&str]) -> Patterns {
        Patterns::new(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn tool(name: &str, tier: Tier) -> Tool {
        Tool {
            name: name.into(),
            description: String::new(),
            input_schema_json: "{}".into(),
            tier,
        }
    }

    #[test]
    fn globs_match_whole_names() {
        let cases: &[(&[&str], &str, bool)] = &[
            (&[], "anything", false),
            (&["jellyfin"], "jellyfin", true),
            (&["jellyfin"], "jellyfin_extra", false),
            (&["jelly*"], "jellyfin", true),
            (&["*_delete_*"], "radarr_delete_movie", true),
            (&["*_delete_*"], "radarr_list", false),
            (&["ha_?et"], "ha_get", true),
            (&["{sonarr,radarr}"], "radarr", true),
            (&["{sonarr,radarr}"], "lidarr", false),
        ];
        for &(p, name, want) in cases {
            assert_eq!(patterns(p).matches(name), want, "{p:?} on {name}");
        }
        let bad = Patterns::new(&["[oops".to_string()]).unwrap_err();
        assert!(bad.contains("`[oops` is not a valid glob"), "{bad}");
    }

    #[test]
    fn deny_wins_and_tiers_cap_what_a_profile_sees() {
        let mut p = Profile::open("p");
        p.allow_domains = patterns(&["media_*", "home"]);
        p.deny_domains = patterns(&["media_private"]);
        p.deny_tools = patterns(&["*_delete*"]);
        p.max_tier = Tier::Modify;
        let cases: &[(&str, bool)] = &[
            ("media_jellyfin", true),
            ("home", true),
            ("media_private", false),
            ("docker", false),
        ];
        for &(d, want) in cases {
            assert_eq!(p.allows_domain(d), want, "{d}");
        }
        let tools: &[(Tool, bool)] = &[
            (tool("list", Tier::Read), true),
            (tool("set", Tier::Modify), true),
            (tool("wipe", Tier::Destructive), false),
            (tool("unlabelled", Tier::Unspecified), false),
            (tool("movie_delete", Tier::Read), false),
        ];
        for (t, want) in tools {
            assert_eq!(p.allows_tool(t), *want, "{}", t.name);
        }
        p.allow_tools = patterns(&["list"]);
        assert!(p.allows_tool(&tools[0].0));
        assert!(!p.allows_tool(&tools[1].0), "an allow list leaves the rest out");
        let open = Profile::open("all");
        assert!(open.allows_domain("x") && open.allows_tool(&tool("t", Tier::Unspecified)));
    }

    #[test]
    fn profiles_are_found_by_name() {
        let ps = Profiles::new(vec![Profile::open("b"), Profile::open("a")]);
        assert_eq!(ps.names().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(ps.get(ps.find("b").unwrap()).name, "b");
        assert!(ps.find("c").is_none());
    }
}
