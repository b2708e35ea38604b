//! The registry: every domain and tool loaded from manifests, as one immutable snapshot.
//!
//! Domains are kept sorted by name, so a [`DomainId`] order is name order; every keyword of
//! every domain also has a global [`KeywordId`] in domain order, then manifest order, which is
//! what the matcher reports and what the router sorts by.

pub mod manifest;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use crate::error::{ManifestError, ManifestErrors, Result};

/// A domain of one registry: its position in [`Registry::domains`] (domains are sorted by
/// name, so id order is name order). Meaningless for another registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DomainId(usize);

/// A keyword of one registry: domain order, then manifest order. Ids of one domain are
/// contiguous, so sorting keyword ids groups them by domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeywordId(usize);

impl DomainId {
    /// The domain at this position of [`Registry::domains`].
    pub fn at(index: usize) -> DomainId {
        DomainId(index)
    }

    /// The domain's position in [`Registry::domains`].
    pub fn index(self) -> usize {
        self.0
    }
}

impl KeywordId {
    /// The keyword at this position of [`Registry::keywords`].
    pub(crate) fn at(index: usize) -> KeywordId {
        KeywordId(index)
    }

    /// Its position in [`Registry::keywords`].
    pub fn index(self) -> usize {
        self.0
    }
}

/// How much a tool can change; clients may gate on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Only reads.
    Read,
    /// Changes state that can be changed back.
    Modify,
    /// Deletes or otherwise loses data.
    Destructive,
    /// The manifest gave no tier. Reported as `""`, and treated as [`Tier::Destructive`]
    /// wherever a tier decides something (see [`Tier::effective`]): a client that
    /// auto-approves read-only tools must never run an unlabelled one unasked.
    Unspecified,
}

impl Tier {
    /// The manifest and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Read => "read",
            Tier::Modify => "modify",
            Tier::Destructive => "destructive",
            Tier::Unspecified => "",
        }
    }

    /// The tier that decides what a tool may do: an unspecified tier counts as destructive.
    pub fn effective(self) -> Tier {
        match self {
            Tier::Unspecified => Tier::Destructive,
            t => t,
        }
    }

    /// Parses the manifest spelling.
    pub fn parse(s: &str) -> Option<Tier> {
        match s {
            "read" => Some(Tier::Read),
            "modify" => Some(Tier::Modify),
            "destructive" => Some(Tier::Destructive),
            _ => None,
        }
    }
}

/// One tool definition, as sent to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Unique across the registry; matches `^[a-zA-Z0-9_-]{1,64}$`.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// The input's JSON Schema as compact JSON (an object whose `type` is `"object"`),
    /// rendered once at load time because every response sends it as text.
    pub input_schema_json: String,
    /// See [`Tier`].
    pub tier: Tier,
}

/// One domain (group) of tools.
#[derive(Debug, Clone, PartialEq)]
pub struct Domain {
    /// Unique; matches `^[a-z0-9][a-z0-9_-]{0,63}$`.
    pub name: String,
    /// Human name, used in `LoadToolGroup` text.
    pub display_name: String,
    /// One line for the model's prompt section.
    pub description: String,
    /// The domain is active when this is empty or one of these keys has a non-blank value.
    pub settings_keys: Vec<String>,
    /// As written in the manifest.
    pub keywords: Vec<String>,
    /// Included in every answer while active.
    pub core: bool,
    /// Included in the `all-active` fallback.
    pub fallback: bool,
    /// In manifest order.
    pub tools: Vec<Tool>,
    /// Where the domain was defined, for error messages.
    pub source: String,
}

/// The immutable snapshot of every domain and tool.
#[derive(Debug)]
pub struct Registry {
    domains: Vec<Domain>,
    by_name: HashMap<String, DomainId>,
    /// `keyword_domain[k]` is the domain that owns keyword `k`.
    keyword_domain: Vec<DomainId>,
    /// `keyword_start[d]` is the position of domain `d`'s first keyword.
    keyword_start: Vec<usize>,
    /// `tool_start[d]` is the registry-order index of domain `d`'s first tool; one more
    /// entry marks the end.
    tool_start: Vec<usize>,
    version: u64,
}

/// The demo manifests built into the binary: (file name, contents).
const DEMO: &[(&str, &str)] = &[
    ("audiobookshelf.json", include_str!("demo/audiobookshelf.json")),
    ("docker.json", include_str!("demo/docker.json")),
    ("home_assistant.toml", include_str!("demo/home_assistant.toml")),
    ("jellyfin.json", include_str!("demo/jellyfin.json")),
    ("nextcloud.json", include_str!("demo/nextcloud.json")),
    ("paperless.toml", include_str!("demo/paperless.toml")),
    ("pihole.json", include_str!("demo/pihole.json")),
    ("proxmox.json", include_str!("demo/proxmox.json")),
    ("qbittorrent.json", include_str!("demo/qbittorrent.json")),
    ("radarr.json", include_str!("demo/radarr.json")),
    ("sonarr.json", include_str!("demo/sonarr.json")),
    ("system.json", include_str!("demo/system.json")),
    ("uptime_kuma.json", include_str!("demo/uptime_kuma.json")),
    ("vaultwarden.json", include_str!("demo/vaultwarden.json")),
];

impl Registry {
    /// Builds a registry from parsed domains, checking what spans files: duplicate domain
    /// names and duplicate tool names.
    ///
    /// # Errors
    /// Every cross-file problem, each naming both places.
    pub fn new(domains: Vec<Domain>) -> Result<Registry, ManifestErrors> {
        let errors = conflicts(&domains);
        if !errors.is_empty() {
            return Err(ManifestErrors(errors));
        }
        Ok(Self::build(domains))
    }

    /// The registry of `base` (domains valid together, such as a registry's) and of each
    /// `extra` domain that fits beside them, taken in the order given; one whose name or
    /// tool names are already taken, by `base` or by an earlier extra domain, is left out
    /// and returned with every problem (the checks of [`Registry::new`]).
    pub fn compose(base: Vec<Domain>, extra: Vec<Domain>) -> (Registry, Vec<(Domain, ManifestErrors)>) {
        let mut domains = base;
        // The names taken so far, so each extra domain is checked once against them (the full
        // check, which names what clashes, runs only for one that does not fit).
        let mut names: HashSet<String> = domains.iter().map(|d| d.name.clone()).collect();
        let mut tools: HashSet<String> = domains
            .iter()
            .flat_map(|d| d.tools.iter().map(|t| t.name.clone()))
            .collect();
        let mut left_out = Vec::new();
        for d in extra {
            let mut own = HashSet::new();
            let fits = !names.contains(&d.name)
                && d.tools
                    .iter()
                    .all(|t| !tools.contains(&t.name) && own.insert(t.name.as_str()));
            if fits {
                names.insert(d.name.clone());
                tools.extend(d.tools.iter().map(|t| t.name.clone()));
                domains.push(d);
                continue;
            }
            domains.push(d);
            let errors = conflicts(&domains);
            if let Some(d) = domains.pop() {
                left_out.push((d, ManifestErrors(errors)));
            }
        }
        (Self::build(domains), left_out)
    }

    /// Every domain, by name, giving the registry up.
    pub fn into_domains(self) -> Vec<Domain> {
        self.domains
    }

    /// The registry of domains already checked by [`conflicts`].
    fn build(mut domains: Vec<Domain>) -> Registry {
        domains.sort_by(|a, b| a.name.cmp(&b.name));
        let by_name = domains
            .iter()
            .enumerate()
            .map(|(i, d)| (d.name.clone(), DomainId(i)))
            .collect();
        let mut keyword_domain = Vec::new();
        let mut keyword_start = Vec::with_capacity(domains.len());
        let mut tool_start = Vec::with_capacity(domains.len() + 1);
        tool_start.push(0);
        for (i, d) in domains.iter().enumerate() {
            keyword_start.push(keyword_domain.len());
            keyword_domain.extend(std::iter::repeat_n(DomainId(i), d.keywords.len()));
            tool_start.push(tool_start[i] + d.tools.len());
        }
        let version = content_hash(&domains);
        Registry {
            domains,
            by_name,
            keyword_domain,
            keyword_start,
            tool_start,
            version,
        }
    }

    /// The registry a daemon serves: the manifests in `dirs`, or the built-in demo registry
    /// when no folder is given.
    ///
    /// # Errors
    /// As [`Registry::load_dirs`].
    pub fn load(dirs: &[PathBuf]) -> Result<Registry> {
        if dirs.is_empty() {
            Ok(Registry::demo())
        } else {
            Registry::load_dirs(dirs)
        }
    }

    /// Loads every `*.json` and `*.toml` file directly inside each folder.
    ///
    /// # Errors
    /// `Manifests` with every problem found: folders or files that cannot be read, and every
    /// problem in the files that can.
    pub fn load_dirs(dirs: &[PathBuf]) -> Result<Registry> {
        let (registry, warnings) = Self::check_dirs(dirs);
        for w in &warnings {
            tracing::warn!(warning = %w, "manifest warning");
        }
        registry
    }

    /// As [`Registry::load_dirs`], and also what deserves a warning without failing: a folder
    /// holding no manifest, a file skipped for its extension, and (when the manifests load) a
    /// tool without a tier or a description over [`MAX_DESCRIPTION_CHARS`]. A folder named
    /// twice (also through another spelling of its path) is read once.
    pub(crate) fn check_dirs(dirs: &[PathBuf]) -> (Result<Registry>, Vec<ManifestError>) {
        let mut warnings = Vec::new();
        let mut seen_dirs = std::collections::HashSet::new();
        let mut sources = Vec::new();
        let mut unreadable = Vec::new();
        let mut problem = |path: &std::path::Path, what: &str, e: std::io::Error| {
            unreadable.push(ManifestError {
                path: path.display().to_string(),
                position: None,
                message: format!("cannot read {what}: {e}"),
            });
        };
        for dir in dirs {
            let identity = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
            if !seen_dirs.insert(identity) {
                continue;
            }
            let entries = match std::fs::read_dir(dir) {
                Ok(entries) => entries,
                Err(e) => {
                    problem(dir, "manifest folder", e);
                    continue;
                }
            };
            // Files, and anything else named like a manifest but a folder (a link to nowhere
            // is read, and fails naming itself, rather than leave its domain out unsaid).
            // Hidden files are not read, as a shell's `*.json` leaves them out: editors keep
            // locks and copies there (`.#a.json`, `.a.json.swp`, macOS's `._a.json`). One
            // named like a manifest is said to be skipped.
            let (hidden, entries): (Vec<PathBuf>, Vec<PathBuf>) =
                entries.filter_map(|e| e.ok().map(|e| e.path())).partition(|p| {
                    p.file_name()
                        .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."))
                });
            let mut hidden: Vec<PathBuf> = hidden
                .into_iter()
                .filter(|p| manifest::Format::of(p).is_some() && !p.is_dir())
                .collect();
            hidden.sort();
            for path in &hidden {
                warnings.push(warning(
                    path.display().to_string(),
                    "skipped: a hidden file is not a manifest (an editor's lock or copy, say)".into(),
                ));
            }
            let mut files: Vec<PathBuf> = entries
                .into_iter()
                .filter(|p| p.is_file() || (manifest::Format::of(p).is_some() && !p.is_dir()))
                .collect();
            files.sort();
            let (paths, skipped): (Vec<PathBuf>, Vec<PathBuf>) =
                files.into_iter().partition(|p| manifest::Format::of(p).is_some());
            for path in &skipped {
                warnings.push(warning(
                    path.display().to_string(),
                    "skipped: only *.json and *.toml files are manifests".into(),
                ));
            }
            if paths.is_empty() {
                warnings.push(warning(
                    dir.display().to_string(),
                    "the folder holds no manifest (*.json or *.toml)".into(),
                ));
            }
            for path in paths {
                // A FIFO, socket or device named like a manifest is refused unread: reading a
                // FIFO waits for a writer, for ever (a link to nowhere fails its read below).
                if std::fs::metadata(&path).is_ok_and(|m| !m.is_file()) {
                    problem(&path, "manifest", std::io::Error::other("not a regular file"));
                    continue;
                }
                match std::fs::read_to_string(&path) {
                    Ok(text) => sources.push((path.display().to_string(), text)),
                    Err(e) => problem(&path, "manifest", e),
                }
            }
        }
        let result = match Self::from_sources(sources.iter().map(|(p, t)| (p.as_str(), t.as_str()))) {
            Ok(registry) if unreadable.is_empty() => Ok(registry),
            Ok(_) => Err(crate::Error::Manifests(ManifestErrors(unreadable))),
            Err(ManifestErrors(mut errors)) => {
                unreadable.append(&mut errors);
                Err(crate::Error::Manifests(ManifestErrors(unreadable)))
            }
        };
        if let Ok(registry) = &result {
            warnings.extend(registry.warnings());
        }
        (result, warnings)
    }

    /// What the registry's manifests should fix but that does not stop them loading: a tool
    /// without a tier (it counts as destructive), a description over
    /// [`MAX_DESCRIPTION_CHARS`] characters (the limit some LLM APIs put on it), an input
    /// schema with `anyOf`, `oneOf`, `allOf`, `not` or `enum` at its top level, or a property
    /// name Anthropic refuses (providers refuse such a schema; SPEC §9 keeps schemas as
    /// written), and a domain with keywords but no tools (its hit turns the fallback off and
    /// brings no tool).
    pub fn warnings(&self) -> Vec<ManifestError> {
        let mut out = Vec::new();
        for d in &self.domains {
            if d.tools.is_empty() && !d.keywords.is_empty() {
                out.push(warning(
                    d.source.clone(),
                    format!(
                        "domain `{}` has keywords but no tools: a message that hits them gets no fallback and no tool of it, nor do later turns of its conversation (the hit stays)",
                        d.name
                    ),
                ));
            }
            // Both are read as written. A keyword (SPEC §4) with a space at an end matches only
            // a message with the space there too, beside a non-letter; a settings key (SPEC §3)
            // only a settings row whose key has the same spaces, which a settings UI hardly
            // ever writes.
            let padded = [
                (
                    &d.keywords,
                    "keyword",
                    ", which a message must have there too: it hardly ever matches",
                ),
                (
                    &d.settings_keys,
                    "settings key",
                    ": only a settings row whose key has the same spaces there activates it",
                ),
            ];
            for (list, what, consequence) in padded {
                for k in list.iter().filter(|k| k.trim() != k.as_str()) {
                    out.push(warning(
                        d.source.clone(),
                        format!(
                            "domain `{}`'s {what} \"{}\" begins or ends with white space{consequence} (remove the space)",
                            d.name,
                            crate::error::echo(k)
                        ),
                    ));
                }
            }
            let long = |what: &str, text: &str| {
                let n = text.chars().count();
                (n > MAX_DESCRIPTION_CHARS).then(|| {
                    warning(
                        d.source.clone(),
                        format!("{what} has a description of {n} characters (over {MAX_DESCRIPTION_CHARS})"),
                    )
                })
            };
            out.extend(long(&format!("domain `{}`", d.name), &d.description));
            for t in &d.tools {
                if t.tier == Tier::Unspecified {
                    out.push(warning(
                        d.source.clone(),
                        format!(
                            "tool `{}` has no tier: it is reported as \"\" and treated as destructive",
                            t.name
                        ),
                    ));
                }
                out.extend(long(&format!("tool `{}`", t.name), &t.description));
                // Read once for both checks (valid JSON: checked at load).
                let schema: serde_json::Value =
                    serde_json::from_str(&t.input_schema_json).unwrap_or_default();
                if let Some(key) = anthropic_refused_property(&schema) {
                    out.push(warning(
                        d.source.clone(),
                        format!(
                            "tool `{}`'s input schema has a property named `{}`: Anthropic refuses a property name outside `a-z A-Z 0-9 _ . -` or over 64 characters, and the whole request that carries it (rename it)",
                            t.name,
                            crate::error::echo(key)
                        ),
                    ));
                }
                if let Some(key) = top_level_combinator(&schema) {
                    out.push(warning(
                        d.source.clone(),
                        format!(
                            "tool `{}`'s input schema has `{key}` at its top level: OpenAI and Anthropic refuse such a schema, and the whole request that carries it (put the alternatives under a property)",
                            t.name
                        ),
                    ));
                }
            }
        }
        out
    }

    /// Parses and validates manifests given as (path, contents); the path's extension picks
    /// the format and its stem names group-array manifests.
    ///
    /// # Errors
    /// Every problem in every file.
    pub fn from_sources<'a>(
        sources: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Registry, ManifestErrors> {
        let mut domains = Vec::new();
        let mut errors = Vec::new();
        // Per file in order: its domain (an index into `domains`), or what a file that failed
        // still says of its names.
        let mut files: Vec<Read> = Vec::new();
        for (path, text) in sources {
            match manifest::parse(path, text) {
                Ok(d) => {
                    files.push(Read::Parsed(domains.len()));
                    domains.push(d);
                }
                Err(mut e) => {
                    errors.append(&mut e);
                    if let Some((name, tools)) = manifest::names(path, text) {
                        files.push(Read::Failed {
                            name,
                            source: path.to_string(),
                            tools,
                        });
                    }
                }
            }
        }
        if errors.is_empty() {
            return Registry::new(domains);
        }
        // Cross-file checks run over every file whose names can be read, so a file broken in
        // another way neither hides a duplicate of its own nor one between two others.
        let names: Vec<Names<'_>> = files
            .iter()
            .map(|f| match f {
                Read::Parsed(i) => Names::of(&domains[*i]),
                Read::Failed { name, source, tools } => Names {
                    name,
                    source,
                    tools: tools.iter().map(String::as_str).collect(),
                },
            })
            .collect();
        errors.extend(conflicts_of(&names));
        Err(ManifestErrors(errors))
    }

    /// The built-in demo registry (a home-server assistant), validated like any manifests.
    pub fn demo() -> Registry {
        // The demo manifests are checked by a unit test, so this cannot fail in a build
        // whose tests pass.
        Self::from_sources(DEMO.iter().map(|(p, t)| (*p, *t)))
            .unwrap_or_else(|e| panic!("built-in demo manifests are invalid:\n{e}"))
    }

    /// Every domain, by name.
    pub fn domains(&self) -> &[Domain] {
        &self.domains
    }

    /// One domain.
    ///
    /// # Panics
    /// When `id` does not come from this registry.
    pub fn domain(&self, id: DomainId) -> &Domain {
        &self.domains[id.0]
    }

    /// Every domain's id, in name order.
    pub fn domain_ids(&self) -> impl ExactSizeIterator<Item = DomainId> + use<> {
        (0..self.domains.len()).map(DomainId)
    }

    /// The domain with exactly this name.
    pub fn find(&self, name: &str) -> Option<DomainId> {
        self.by_name.get(name).copied()
    }

    /// Every keyword of every domain, in [`KeywordId`] order.
    pub fn keywords(&self) -> impl Iterator<Item = &str> {
        self.domains
            .iter()
            .flat_map(|d| d.keywords.iter().map(String::as_str))
    }

    /// The domain owning a keyword.
    pub fn keyword_domain(&self, k: KeywordId) -> DomainId {
        self.keyword_domain[k.0]
    }

    /// The keyword as written in its manifest.
    pub fn keyword(&self, k: KeywordId) -> &str {
        let d = self.keyword_domain[k.0].0;
        &self.domains[d].keywords[k.0 - self.keyword_start[d]]
    }

    /// Number of tools in all domains.
    pub fn tool_count(&self) -> usize {
        self.tool_start[self.domains.len()]
    }

    /// Domain `d`'s tools as registry-order indices (every domain's tools in domain order,
    /// each in manifest order): how renders and tool masks are laid out.
    pub fn tool_range(&self, d: DomainId) -> std::ops::Range<usize> {
        self.tool_start[d.0]..self.tool_start[d.0 + 1]
    }

    /// A 64-bit hash of the content: equal registries give equal versions, across restarts.
    pub fn version(&self) -> u64 {
        self.version
    }
}

/// One manifest file of a load: its domain (an index), or the names a file that failed
/// validation still gives.
enum Read {
    Parsed(usize),
    Failed {
        name: String,
        source: String,
        tools: Vec<String>,
    },
}

/// What the checks across domains read of one: its name, where it is defined and its tools'
/// names.
struct Names<'a> {
    name: &'a str,
    source: &'a str,
    tools: Vec<&'a str>,
}

impl<'a> Names<'a> {
    fn of(d: &'a Domain) -> Self {
        Names {
            name: &d.name,
            source: &d.source,
            tools: d.tools.iter().map(|t| t.name.as_str()).collect(),
        }
    }
}

/// What spans domains: a domain name defined twice (both places named) and a tool name used
/// twice, in one domain or in two (both domains and places named). A problem is reported at
/// the later of the two domains, in the order given.
fn conflicts(domains: &[Domain]) -> Vec<ManifestError> {
    conflicts_of(&domains.iter().map(Names::of).collect::<Vec<_>>())
}

/// [`conflicts`] over the names alone.
fn conflicts_of(domains: &[Names<'_>]) -> Vec<ManifestError> {
    let mut errors = Vec::new();
    let mut seen_domains: HashMap<&str, usize> = HashMap::new();
    let mut seen_tools: HashMap<&str, usize> = HashMap::new();
    for (i, d) in domains.iter().enumerate() {
        if let Some(first) = seen_domains.insert(d.name, i) {
            errors.push(ManifestError {
                path: d.source.to_string(),
                position: None,
                message: format!(
                    "domain `{}` is defined twice: in {} and in {}",
                    d.name, domains[first].source, d.source
                ),
            });
            seen_domains.insert(d.name, first);
        }
        for &t in &d.tools {
            if let Some(other) = seen_tools.insert(t, i) {
                let message = if other == i {
                    format!("tool `{t}` appears twice in domain `{}`", d.name)
                } else {
                    let o = &domains[other];
                    format!(
                        "tool `{t}` is defined in two domains: `{}` ({}) and `{}` ({})",
                        o.name, o.source, d.name, d.source
                    )
                };
                errors.push(ManifestError {
                    path: d.source.to_string(),
                    position: None,
                    message,
                });
            }
        }
    }
    errors
}

/// Descriptions longer than this draw a warning from `check`: OpenAI refuses longer function
/// descriptions.
pub(crate) const MAX_DESCRIPTION_CHARS: usize = 1024;

/// Name of the meta-tool that loads a group for the rest of a conversation (SPEC §4).
pub(crate) const LOAD_TOOL_GROUP: &str = "load_tool_group";

/// Name of the meta-tool that searches the registry's tools (SPEC §4, v2).
pub(crate) const SEARCH_TOOLS: &str = "search_tools";

/// Tool names a manifest cannot use: an answer's meta-tools have them, and a provider
/// refuses a request that names two tools alike.
pub(crate) const RESERVED_TOOL_NAMES: [&str; 2] = [LOAD_TOOL_GROUP, SEARCH_TOOLS];

/// The first keyword of a schema's top level that OpenAI ("must not have 'oneOf'/'anyOf'/
/// 'allOf'/'enum'/'not' at the top level") or Anthropic (no `oneOf`, `allOf` or `anyOf` at
/// the top level) refuses.
fn top_level_combinator(schema: &serde_json::Value) -> Option<&'static str> {
    const REFUSED: [&str; 5] = ["anyOf", "oneOf", "allOf", "not", "enum"];
    let top = schema.as_object()?;
    REFUSED.into_iter().find(|k| top.contains_key(*k))
}

/// The first of a schema's top-level property names that Anthropic refuses: each must match
/// `^[a-zA-Z0-9_.-]{1,64}$` ("Property keys should match pattern ...").
fn anthropic_refused_property(schema: &serde_json::Value) -> Option<&str> {
    let properties = schema.get("properties")?.as_object()?;
    let accepted = |k: &str| {
        (1..=64).contains(&k.len())
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    };
    properties.keys().map(String::as_str).find(|k| !accepted(k))
}

fn warning(path: String, message: String) -> ManifestError {
    ManifestError {
        path,
        position: None,
        message,
    }
}

/// FNV-1a over every field that reaches a client, each length-prefixed. A fixed algorithm
/// (not `DefaultHasher`, whose output may change between Rust releases) keeps versions stable
/// across builds, so clients can cache schemas by version.
fn content_hash(domains: &[Domain]) -> u64 {
    struct Fnv(u64);
    impl Fnv {
        fn bytes(&mut self, b: &[u8]) {
            for &x in b {
                self.0 ^= u64::from(x);
                self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        fn str(&mut self, s: &str) {
            self.bytes(&(s.len() as u64).to_le_bytes());
            self.bytes(s.as_bytes());
        }
        fn list(&mut self, l: &[String]) {
            self.bytes(&(l.len() as u64).to_le_bytes());
            l.iter().for_each(|s| self.str(s));
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    for d in domains {
        h.str(&d.name);
        h.str(&d.display_name);
        h.str(&d.description);
        h.list(&d.settings_keys);
        h.list(&d.keywords);
        h.bytes(&[u8::from(d.core), u8::from(d.fallback)]);
        h.bytes(&(d.tools.len() as u64).to_le_bytes());
        for t in &d.tools {
            h.str(&t.name);
            h.str(&t.description);
            h.str(&t.input_schema_json);
            h.str(t.tier.as_str());
        }
    }
    h.0
}

#[cfg(test)]
mod tests;
