//! The registry a daemon serves: the manifests' domains and the domains registered at run
//! time, composed, checked against each other, and swapped in whole on a reload, an
//! upsert, a delete, or another daemon's change.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::error::{ManifestErrors, echo};
use crate::registry::{Domain, Registry, manifest};

use super::view::{Parts, Retired, View};
use super::{Reloaded, State, Upserted, blocking, to_the_end};

/// Logged when a replaced SQLite file's run-time domains are served.
pub(super) const REPLACED_FILE: &str =
    "the database file was replaced: serving the run-time domains it holds";

/// Logged when the run-time domains another daemon changed are served.
const CHANGED_BY_ANOTHER_DAEMON: &str = "the run-time domains stored changed (another daemon's change, or a write of this one's that committed after it was cut): serving them as stored";

/// Where the registry a daemon serves comes from, kept so that a reload, an upsert or a
/// delete rebuilds it from what did not change.
pub(super) struct Sources {
    /// The domains of the manifests (the folders, or the built-in demo registry), as last
    /// loaded.
    pub(super) manifests: Vec<Domain>,
    /// The domains registered at run time that the registry serves (all stored in the
    /// database; a stored one that does not fit beside the manifests is not here).
    pub(super) runtime: Vec<Domain>,
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
pub(super) fn parse_stored(rows: Vec<(String, String)>) -> Vec<Domain> {
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
pub(super) fn compose(manifests: &[Domain], runtime: Vec<Domain>) -> (Registry, Vec<Domain>) {
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

impl State {
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
    pub(super) async fn take_stored_domains(&self, why: &'static str) -> Result<Result<()>> {
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
    /// tells `WatchRegistry` streams. The memory of the parts it replaced goes back to the
    /// system once no call reads them any more.
    fn install(&self, parts: &Parts) {
        let retired = Retired::of(&self.inner.view.load());
        self.inner.view.rcu(|current| {
            View::new(
                parts.clone(),
                current.settings.clone(),
                &self.inner.options,
                self.inner.profiles.clone(),
            )
        });
        self.publish();
        let trims = self.inner.trims.clone();
        tokio::spawn(async move {
            if retired.dropped().await {
                trims.soon().await;
            }
        });
    }

    /// Serves the run-time domains as stored now, after a notice that they changed (the
    /// manifests as last loaded: a notice is no reload, and a manifest mid-edit on this
    /// machine must not keep another daemon's change out); when they could not be read,
    /// when to try again (the notice's news is still to take, and no other notice may
    /// come): [`crate::db::NOTICE_RETRY`] after the first failure, twice the wait after
    /// each other (`retry`: the attempt this one is), at most a minute.
    pub(super) async fn take_runtime_domains(
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
}
