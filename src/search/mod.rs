//! The search index: finds the domains a message is about when it says none of their
//! keywords. Built with the registry (and rebuilt on reload), immutable, pure: no I/O, no
//! clock.
//!
//! Each tool is a document with five fields: the words of its name (split at `_`, `-`, case
//! changes and digits), its description, a walk of its input schema (property names and
//! descriptions, enum values, nested objects and items), its domain's display name,
//! description (unless the default, which says nothing) and keywords, and the pairs of informative words that follow each other in
//! those four ("weather forecast", "rental car"), so that a message saying two words together
//! ranks the tool that says them together above tools with one of them each. Words are
//! analysed by [`analysis`] (UAX #29 words, lowercase, stop words, Snowball English stems).
//! Scoring is BM25F (Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and
//! Beyond", 2009): each field's term frequency is length-normalised and weighted, the sum
//! saturated once with `k1`, times the term's IDF. Since search picks domains, the IDF mixes a
//! term's rarity among tools with its rarity among domains: a word most tools of one domain
//! share says that domain as clearly as a rare word. Per (term, tool) that product is computed
//! at build, so a query only adds weights from posting lists.
//!
//! Routing ([`SearchIndex::domain_hits`]) scores each segment of the message (sentences and
//! clauses) on its own, so a message with several requests finds each one's domain. A domain
//! scores what its best tool scores. Within a segment a domain is a hit when it scores at
//! least a share of the segment's best domain, at most [`SearchOptions::per_segment`] of
//! them, and only while they bring at most [`SearchOptions::segment_share`] of the registry's
//! tools or [`SearchOptions::segment_min_tools`], whichever is more (the segment's best domain
//! itself always counts; no runner-up stands in for a best that is no candidate); a segment
//! counts only when its best is at least [`SearchOptions::segment_ratio`] of the message's
//! best segment. The share is
//! [`SearchOptions::min_ratio`] in the message's best segment and rises linearly towards
//! [`SearchOptions::weak_min_ratio`] as a segment's best
//! falls towards nothing against the message's best: a sentence that matches every tool only
//! loosely ("I need some information for my project") brings its best domain, not the six
//! nearly as loose behind it, while the request the message is about keeps its runners-up.
//! Every threshold is relative to the message's own scores, so they carry over between
//! registries of different sizes, where absolute BM25 scores do not; the cap in tools carries
//! over between registries that cut the same tools into few large domains or many small ones,
//! where a cap in domains does not.

pub mod analysis;
mod build;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ops::Range;

use crate::registry::{DomainId, Registry};
use analysis::Analyzer;

/// A term (a stem) of the index.
type TermId = u32;

/// How search takes part in routing (SPEC §8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SearchMode {
    /// No search: routing by keywords only (SPEC v1).
    Off,
    /// Search only when nothing else routed the message.
    Fallback,
    /// Search on every message; its hits join the keyword hits.
    #[default]
    Augment,
}

impl SearchMode {
    /// The spelling on the command line and in config files.
    pub fn as_str(self) -> &'static str {
        match self {
            SearchMode::Off => "off",
            SearchMode::Fallback => "fallback",
            SearchMode::Augment => "augment",
        }
    }
}

impl std::str::FromStr for SearchMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(SearchMode::Off),
            "fallback" => Ok(SearchMode::Fallback),
            "augment" => Ok(SearchMode::Augment),
            other => Err(format!(
                "unknown search mode {other:?}: use off, fallback or augment"
            )),
        }
    }
}

/// The routing thresholds of search. Defaults chosen on Seal-Tools' `dev` split only (see
/// BENCHMARKS.md, "Routing quality").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchOptions {
    /// When search runs.
    pub mode: SearchMode,
    /// A domain is a hit in the message's best segment when it scores at least this share of
    /// that segment's best domain (0..=1); see [`SearchOptions::weak_min_ratio`] for the
    /// other segments.
    pub min_ratio: f32,
    /// The share a segment whose best scored nothing against the message's best would ask of
    /// its domains: a segment's share rises linearly from `min_ratio` (a segment as strong as
    /// the message's best) to this (0..=1; at most `min_ratio` keeps `min_ratio` everywhere).
    pub weak_min_ratio: f32,
    /// At most this many domains per segment.
    pub per_segment: usize,
    /// A segment's hits, best first, stop before the one that would bring their tools past
    /// this share of the registry's tools (0..=1) or `segment_min_tools`, whichever is more;
    /// the segment's best domain itself is a hit whatever its size (a runner-up behind a best
    /// that is no candidate is capped like the rest). A domain counts the tools the consumer
    /// may be sent (a profile or disabled tools may leave fewer); the cap itself is a share
    /// of every tool in the registry, the same for every caller.
    pub segment_share: f32,
    /// The tools a segment's hits may always bring, however small the registry: beside a
    /// segment's best domain there is room for its runners-up where sending them costs little.
    pub segment_min_tools: usize,
    /// A segment counts only when its best score is at least this share of the message's
    /// best segment (0..=1): scene-setting sentences ("I'm planning a trip") score low.
    pub segment_ratio: f32,
}

impl SearchOptions {
    /// The share of its best a domain must score in a segment whose best is `top`, in a
    /// message whose best segment's is `message_top` (see [`SearchOptions::weak_min_ratio`]).
    /// Never below `min_ratio`, which the candidates of every segment already passed.
    fn segment_floor(&self, top: f32, message_top: f32) -> f32 {
        let strength = if message_top > 0.0 {
            (top / message_top).min(1.0)
        } else {
            1.0
        };
        let weakness = 1.0 - strength;
        let rise = (self.weak_min_ratio - self.min_ratio).max(0.0);
        self.min_ratio + rise * weakness
    }
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            mode: SearchMode::Augment,
            min_ratio: DEFAULT_MIN_RATIO,
            weak_min_ratio: DEFAULT_WEAK_MIN_RATIO,
            per_segment: DEFAULT_PER_SEGMENT,
            segment_share: DEFAULT_SEGMENT_SHARE,
            segment_min_tools: DEFAULT_SEGMENT_MIN_TOOLS,
            segment_ratio: DEFAULT_SEGMENT_RATIO,
        }
    }
}

/// Default [`SearchOptions::min_ratio`].
pub(crate) const DEFAULT_MIN_RATIO: f32 = 0.48;
/// Default [`SearchOptions::weak_min_ratio`].
pub(crate) const DEFAULT_WEAK_MIN_RATIO: f32 = 0.75;
/// Default [`SearchOptions::per_segment`].
pub(crate) const DEFAULT_PER_SEGMENT: usize = 12;
/// Default [`SearchOptions::segment_share`].
pub(crate) const DEFAULT_SEGMENT_SHARE: f32 = 0.08;
/// Default [`SearchOptions::segment_min_tools`]: a model still picks well among a few dozen
/// tools; past 30-50 it starts to pick the wrong one.
pub(crate) const DEFAULT_SEGMENT_MIN_TOOLS: usize = 30;
/// The weight of the word-pair field against the description.
pub(crate) const PAIR_WEIGHT: f32 = 0.75;
/// Default [`SearchOptions::segment_ratio`].
pub(crate) const DEFAULT_SEGMENT_RATIO: f32 = 0.2;

/// One document field: its weight and how strongly its length is normalised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Field {
    /// How much a term in this field counts against one in the description.
    pub weight: f32,
    /// Length normalisation (0: none, 1: full).
    pub b: f32,
}

/// The BM25F parameters of an index.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bm25 {
    /// Term-frequency saturation.
    pub k1: f32,
    /// Name, description, schema, domain text, word pairs.
    pub fields: [Field; FIELDS],
    /// How much a term's rarity among domains counts against its rarity among tools in its
    /// IDF (0: tools only, 1: domains only; the two are mixed geometrically).
    pub domain_idf: f32,
}

/// How many fields a tool document has.
pub(crate) const FIELDS: usize = 5;

/// Chosen on Seal-Tools' `dev` split (BENCHMARKS.md): a strong saturation (`k1` 2) and full
/// length normalisation, names counting twice a description word, schemas half, word pairs
/// three quarters, and IDF mixed evenly over tools and over domains.
impl Default for Bm25 {
    fn default() -> Self {
        Bm25 {
            k1: 2.0,
            fields: [
                Field { weight: 2.0, b: 1.0 },
                Field { weight: 1.0, b: 1.0 },
                Field { weight: 0.5, b: 1.0 },
                Field { weight: 1.0, b: 1.0 },
                Field {
                    weight: PAIR_WEIGHT,
                    b: 1.0,
                },
            ],
            domain_idf: 0.5,
        }
    }
}

/// A domain the search index chose for a message.
#[derive(Debug, Clone, PartialEq)]
pub struct DomainHit {
    /// The domain.
    pub domain: DomainId,
    /// What its best tool scored, in the best segment for it.
    pub score: f32,
    /// The message's words (lowercased) that matched that tool, in message order.
    pub terms: Vec<String>,
}

/// A tool the search index ranked for a query.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolMatch {
    /// The tool's domain.
    pub domain: DomainId,
    /// The tool's position in its domain.
    pub tool: usize,
    /// Its score (for an exact name match, at least the best other score).
    pub score: f32,
    /// The query's words (lowercased) that matched it, in query order.
    pub terms: Vec<String>,
}

/// The index over one registry's tools.
#[derive(Debug)]
pub struct SearchIndex {
    analyzer: Analyzer,
    /// Stem -> term.
    terms: HashMap<String, TermId, foldhash::fast::FixedState>,
    /// Every lowercase word seen at build -> its term, so most query words skip the stemmer.
    surface: Surface,
    /// Two word terms that follow each other -> their pair term. Pair terms are numbered
    /// after the word terms.
    pair_terms: HashMap<(TermId, TermId), TermId, foldhash::fast::FixedState>,
    /// A word that stands for each word term (the first seen), for suggestions; one entry
    /// per word term, so its length is where pair terms start.
    term_words: Vec<String>,
    /// Posting lists: term `t`'s are `post[post_start[t]..post_start[t + 1]]`, (tool,
    /// precomputed BM25F weight) in tool order.
    post_start: Vec<u32>,
    post: Vec<(u32, f32)>,
    /// Per (term, domain): term `t`'s are `dom_post[dom_post_start[t]..dom_post_start[t + 1]]`,
    /// sorted by domain, each with the term's best weight among the domain's tools (its bound
    /// there). Tools of a domain are contiguous, so entry `j`'s tool postings are
    /// `post[dom_tools[j]..dom_tools[j + 1]]` (one more entry at the end).
    dom_post_start: Vec<u32>,
    dom_post: Vec<DomainBound>,
    dom_tools: Vec<u32>,
    /// The most tools any domain has.
    max_domain_tools: usize,
    /// Global tool -> its domain, and the first global tool of each domain (one more entry
    /// at the end).
    tool_domain: Vec<u32>,
    domain_start: Vec<u32>,
    /// (lowercased tool name, global tool), sorted, for exact-name lookups: names that differ
    /// only in case are distinct tools with one entry each.
    names: Vec<(String, u32)>,
    /// This index's number, unique in the process (see [`Unseen`]).
    id: u64,
}

/// Asks the processor to load the cache line holding `item`, without waiting for it: a hint,
/// so that several misses known ahead overlap instead of following one another.
#[inline(always)]
fn prefetch<T>(item: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing into the program and cannot fault; SSE, which it
    // needs, is part of every x86_64 processor.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(item).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = item;
}

/// A term's bound in one domain: the largest weight of the term among the domain's tools.
#[derive(Debug, Clone, Copy)]
struct DomainBound {
    domain: u32,
    max: f32,
}

/// Lowercase word -> its term (`None`: a stop word). A word of up to 15 bytes, nearly every
/// word, is its own key, its bytes and length packed in a `u128`, so a lookup reads one entry
/// of the table and follows no pointer; longer words are keyed by their text.
#[derive(Debug, Default)]
struct Surface {
    short: HashMap<u128, Option<TermId>, foldhash::fast::FixedState>,
    long: HashMap<String, Option<TermId>, foldhash::fast::FixedState>,
}

impl Surface {
    /// A word's bytes, zero-padded, and its length in the last byte; `None` past 15 bytes.
    fn packed(word: &str) -> Option<u128> {
        let bytes = word.as_bytes();
        (bytes.len() < 16).then(|| {
            let mut key = [0u8; 16];
            key[..bytes.len()].copy_from_slice(bytes);
            key[15] = bytes.len() as u8;
            u128::from_le_bytes(key)
        })
    }

    /// A word's entry: `None` for a word not seen at build.
    fn get(&self, word: &str) -> Option<Option<TermId>> {
        match Surface::packed(word) {
            Some(key) => self.short.get(&key).copied(),
            None => self.long.get(word).copied(),
        }
    }

    /// A word's entry, made by `make` when the word is new.
    fn get_or_insert_with(&mut self, word: &str, make: impl FnOnce() -> Option<TermId>) -> Option<TermId> {
        match Surface::packed(word) {
            Some(key) => *self.short.entry(key).or_insert_with(make),
            None => match self.long.get(word) {
                Some(&known) => known,
                None => {
                    let term = make();
                    self.long.insert(word.to_string(), term);
                    term
                }
            },
        }
    }
}

/// The words of up to 15 bytes a thread met that no index saw at build, with what
/// [`SearchIndex::term`] found for each in the index numbered `index`. Query words repeat
/// from message to message far more often than they are new, and the stemmer is the dearest
/// step of reading a word: this runs it once per word, index and thread. The answer is the
/// same either way.
#[derive(Default)]
struct Unseen {
    index: u64,
    terms: HashMap<u128, Result<TermId, bool>, foldhash::fast::FixedState>,
}

/// [`Unseen`] is emptied when it holds this many words (about 200 KiB per thread).
const UNSEEN_KEEP: usize = 1 << 13;

thread_local! {
    static UNSEEN: std::cell::RefCell<Unseen> = std::cell::RefCell::default();
}

/// The number of the next index built, so a thread's [`Unseen`] words are never read
/// against another index (0: none).
static INDEXES_BUILT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// No entry: the end of a domain's chain in [`Chains`], or a domain without one.
const NONE: u32 = u32::MAX;

/// One segment's domains: walking each term's domain postings once adds up each domain's
/// bound and links its postings in term order, so scoring a domain follows its chain instead
/// of searching every term's list for it. Reused between segments.
#[derive(Debug, Default)]
struct Chains {
    /// Per domain: its bound, its first and last entry ([`NONE`]: no term of the segment is
    /// in it, and the bound is 0).
    slots: Vec<Slot>,
    /// A bound's tool postings (a range of `post`) and the next entry of the same domain or
    /// [`NONE`].
    entries: Vec<(u32, u32, u32)>,
    /// The domains with a chain, in the order first reached.
    domains: Vec<u32>,
}

/// A domain's bound and chain in [`Chains`].
#[derive(Debug, Clone, Copy)]
struct Slot {
    bound: f32,
    head: u32,
    tail: u32,
}

const EMPTY: Slot = Slot {
    bound: 0.0,
    head: NONE,
    tail: NONE,
};

impl Chains {
    /// Empties every chain, for `domains` domains.
    fn reset(&mut self, domains: usize) {
        self.clear();
        self.slots.resize(domains, EMPTY);
    }

    /// Adds the tool postings `post[from..to]` of weight up to `max` to domain `d`.
    fn push(&mut self, d: u32, (from, to): (u32, u32), max: f32) {
        let at = self.entries.len() as u32;
        self.entries.push((from, to, NONE));
        let slot = &mut self.slots[d as usize];
        slot.bound += max;
        if slot.tail == NONE {
            slot.head = at;
            self.domains.push(d);
        } else {
            self.entries[slot.tail as usize].2 = at;
        }
        slot.tail = at;
    }

    /// Domain `d`'s bound.
    fn bound(&self, d: u32) -> f32 {
        self.slots[d as usize].bound
    }

    /// Domain `d`'s tool postings (ranges of `post`), in term order.
    fn of(&self, d: u32) -> impl Iterator<Item = Range<usize>> + '_ {
        let mut at = self.slots[d as usize].head;
        std::iter::from_fn(move || {
            (at != NONE).then(|| {
                let (from, to, next) = self.entries[at as usize];
                at = next;
                from as usize..to as usize
            })
        })
    }

    /// Empties every chain.
    fn clear(&mut self) {
        for &d in &self.domains {
            self.slots[d as usize] = EMPTY;
        }
        self.domains.clear();
        self.entries.clear();
    }
}

/// What [`SearchIndex::domain_hits`] works in, kept per thread between calls: once warm,
/// routing a message allocates only its answer. Every part is emptied on entry, so a call
/// that unwound midway leaves nothing behind.
#[derive(Debug, Default)]
struct Scratch {
    text: analysis::Segmented,
    chains: Chains,
    /// Per tool of the domain being scored: its score so far (all zero between domains).
    local: Vec<f32>,
    /// Domains worth scoring exactly, and those scored: (domain, score, best tool, eligible).
    queue: Vec<u32>,
    scored: Vec<(DomainId, f32, u32, bool)>,
    /// The best `per_segment` scores of eligible domains so far, best first.
    kept: Vec<f32>,
    /// Per segment that found anything: its best score, its candidate hits (a range of
    /// `candidates`: domain, score, best tool) and its terms (a range of `terms`).
    found: Vec<(f32, Range<usize>, Range<usize>)>,
    candidates: Vec<(DomainId, f32, u32)>,
    terms: Vec<(TermId, Range<usize>)>,
    /// A segment's word-pair terms while its words are read.
    pairs: Vec<(TermId, Range<usize>)>,
    /// Per domain hit: its best candidate and the range of that segment's terms.
    best: Vec<(DomainId, f32, u32, Range<usize>)>,
}

/// A thread keeps its [`Scratch`] while its buffer of lowercase words stays under this many
/// bytes and that of a segment's postings under this many entries: one long message does not
/// pin its memory.
const SCRATCH_KEEP: usize = 1 << 16;

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

impl Scratch {
    /// Empties every part for an index of `domains` domains, at most `tools` per domain.
    fn reset(&mut self, domains: usize, tools: usize) {
        self.chains.reset(domains);
        self.local.clear();
        self.local.resize(tools, 0.0);
        self.queue.clear();
        self.scored.clear();
        self.kept.clear();
        self.found.clear();
        self.candidates.clear();
        self.terms.clear();
        self.best.clear();
    }
}

impl SearchIndex {
    /// How many of a domain's tools are `visible` (all when `None`).
    fn visible_size(&self, domain: DomainId, visible: Option<&[bool]>) -> u32 {
        let d = domain.index();
        let (from, to) = (self.domain_start[d], self.domain_start[d + 1]);
        match visible {
            None => to - from,
            Some(v) => v[from as usize..to as usize].iter().map(|&b| u32::from(b)).sum(),
        }
    }

    /// Whether a term is a word pair (pairs explain nothing a word does not).
    fn is_pair(&self, term: TermId) -> bool {
        term as usize >= self.term_words.len()
    }

    /// The term of a lowercase word: `Err(true)` for a stop word, `Err(false)` for a word the
    /// index does not have.
    fn term(&self, word: &str) -> Result<TermId, bool> {
        if let Some(known) = self.surface.get(word) {
            return known.ok_or(true);
        }
        let Some(key) = Surface::packed(word) else {
            return self.unseen_term(word);
        };
        UNSEEN
            .try_with(|unseen| {
                let Ok(mut unseen) = unseen.try_borrow_mut() else {
                    return self.unseen_term(word);
                };
                if unseen.index != self.id || unseen.terms.len() >= UNSEEN_KEEP {
                    unseen.index = self.id;
                    unseen.terms.clear();
                }
                *unseen.terms.entry(key).or_insert_with(|| self.unseen_term(word))
            })
            .unwrap_or_else(|_| self.unseen_term(word))
    }

    /// [`SearchIndex::term`] of a word not seen at build: a stop word, or the term of its
    /// stem when the index has that.
    fn unseen_term(&self, word: &str) -> Result<TermId, bool> {
        if self.analyzer.is_stop(word) {
            return Err(true);
        }
        self.terms
            .get(self.analyzer.stem(word).as_ref())
            .copied()
            .ok_or(false)
    }

    /// The distinct terms of some words (span, lowercase word), each with the first words
    /// that stand for it, appended to `out` (distinct among those appended, not from what
    /// `out` held): the word terms, then the pairs of word terms that follow each other
    /// (stop words skipped, as in the index; a word the index does not have breaks a pair).
    /// With the `message` the spans are in, small talk is left out: a clause made of a word
    /// of courtesy (thanks, a greeting, a farewell) and at most one word that is not a stop
    /// word ("many thanks", "thanks for your time", "good night"). A comma after a word of
    /// courtesy, or before one, ends a clause, so the request beside it is judged on its own
    /// ("thanks, pause the film", "hi, what is playing?", "pause it, thanks").
    fn segment_terms<'w>(
        &self,
        words: impl IntoIterator<Item = (Range<usize>, &'w str)>,
        message: Option<&str>,
        out: &mut Vec<(TermId, Range<usize>)>,
        pairs: &mut Vec<(TermId, Range<usize>)>,
    ) {
        let from = out.len();
        pairs.clear();
        let mut previous: Option<(TermId, usize)> = None;
        // The clause being read: where its terms and pairs start, whether it has a word of
        // courtesy, and how many other words it says.
        let (mut clause_terms, mut clause_pairs) = (from, 0);
        let (mut courtesy, mut said) = (false, 0usize);
        let mut end_clause = |out: &mut Vec<(TermId, Range<usize>)>,
                              pairs: &mut Vec<(TermId, Range<usize>)>,
                              courtesy: bool,
                              said: usize| {
            if message.is_some() && courtesy && said <= 1 {
                out.truncate(clause_terms);
                pairs.truncate(clause_pairs);
            }
            (clause_terms, clause_pairs) = (out.len(), pairs.len());
        };
        for (span, word) in words {
            match self.term(word) {
                Ok(term) => {
                    said += 1;
                    if let Some((first, start)) = previous
                        && let Some(&pair) = self.pair_terms.get(&(first, term))
                        && !pairs.iter().any(|(t, _)| *t == pair)
                    {
                        pairs.push((pair, start..span.end));
                    }
                    previous = Some((term, span.start));
                    if !out[from..].iter().any(|(t, _)| *t == term) {
                        out.push((term, span));
                    }
                }
                Err(true) if analysis::is_courtesy(word) => {
                    // A comma before it ends the clause before it too ("pause, thanks").
                    if message.is_some_and(|m| analysis::comma_precedes(&m[..span.start])) {
                        end_clause(out, pairs, courtesy, said);
                        (said, previous) = (0, None);
                    }
                    courtesy = true;
                    if message.is_some_and(|m| analysis::comma_follows(&m[span.end..])) {
                        end_clause(out, pairs, courtesy, said);
                        (courtesy, said, previous) = (false, 0, None);
                    }
                }
                Err(true) => {}
                Err(false) => {
                    said += 1;
                    previous = None;
                }
            }
        }
        end_clause(out, pairs, courtesy, said);
        out.append(pairs);
    }

    /// The distinct terms of a piece of text, each with the first words that stand for it.
    /// A word written as an identifier (`quuxlyReport`, `HTTPServer`, `sync4plexar`, as a
    /// model guessing a tool's name writes it) is read as its parts too, as names are
    /// indexed; and as itself, as descriptions say it (`GitHub`, `MP3`, `qBittorrent`).
    fn query_terms(&self, text: &str) -> Vec<(TermId, Range<usize>)> {
        let mut words: Vec<(Range<usize>, String)> = Vec::new();
        analysis::for_each_word(text, &mut String::new(), |span, word| {
            let written = &text[span.clone()];
            let split = analysis::split_identifier(written);
            words.push((span.clone(), word.to_string()));
            if !split.contains(' ') {
                return;
            }
            // Each part is a piece of the word as written, in order.
            let mut at = 0;
            for part in split.split(' ').filter(|p| !p.is_empty()) {
                let Some(found) = written[at..].find(part) else {
                    continue;
                };
                let start = span.start + at + found;
                at += found + part.len();
                words.push((start..start + part.len(), part.to_lowercase()));
            }
        });
        let mut out = Vec::new();
        // A query is what the model searches for: all of it, courtesy or not.
        self.segment_terms(
            words.iter().map(|(span, w)| (span.clone(), w.as_str())),
            None,
            &mut out,
            &mut Vec::new(),
        );
        out
    }

    /// A term's bounds by domain, with the index of the first in `dom_post`.
    fn domain_bounds(&self, term: TermId) -> (usize, &[DomainBound]) {
        let from = self.dom_post_start[term as usize] as usize;
        (
            from,
            &self.dom_post[from..self.dom_post_start[term as usize + 1] as usize],
        )
    }

    /// A domain's exact score for a segment's terms (what its best tool scores) and that
    /// tool (ties go to the earlier tool, so the explanation is deterministic). `chains`
    /// holds the domain's postings for the terms, in term order; each tool's weights are
    /// summed in that order, as [`SearchIndex::accumulate`] does. `local` is scratch of at
    /// least the domain's tool count, all zero, and left so. Only the `visible` tools count
    /// (one the consumer cannot see is no part of the domain for it); also the best score of
    /// any of its tools, for a domain hidden whole (see [`SearchIndex::segment_share`]).
    fn domain_score(
        &self,
        d: u32,
        chains: &Chains,
        local: &mut [f32],
        visible: Option<&[bool]>,
    ) -> ((f32, u32), f32) {
        let first = self.domain_start[d as usize];
        // Every piece's first line is asked for before any is read, so their misses overlap.
        for range in chains.of(d) {
            prefetch(&self.post[range.start]);
        }
        let mut postings = 0;
        for range in chains.of(d) {
            let tools = &self.post[range];
            postings += tools.len();
            for &(tool, w) in tools {
                local[(tool - first) as usize] += w;
            }
        }
        // The first tool of the highest positive score, the scratch zeroed on the way: over
        // the domain's tools in order when they are no more than the postings, else over the
        // postings (a tool met again has its score taken already, 0).
        let mut best = (0f32, 0u32);
        let mut any = 0f32;
        // A hidden tool is never the domain's best (its score is still taken, to zero the
        // scratch, and counts in `any`).
        let shown = |tool: u32| visible.is_none_or(|v| v[tool as usize]);
        let tools = (self.domain_start[d as usize + 1] - first) as usize;
        if tools <= postings {
            for (i, s) in local[..tools].iter_mut().enumerate() {
                let s = std::mem::take(s);
                any = any.max(s);
                if s > best.0 && shown(first + i as u32) {
                    best = (s, first + i as u32);
                }
            }
        } else {
            for range in chains.of(d) {
                for &(tool, _) in &self.post[range] {
                    let s = std::mem::take(&mut local[(tool - first) as usize]);
                    any = any.max(s);
                    if (s > best.0 || (s == best.0 && s > 0.0 && tool < best.1)) && shown(tool) {
                        best = (s, tool);
                    }
                }
            }
        }
        (best, any)
    }

    /// What a domain scored in a segment counts towards the segment's best, candidate or
    /// not: its best tool the consumer may be sent (a keyword hit, core or inactive domain
    /// still counts, so a segment about it does not hand its hits to weaker matches; a tool
    /// the consumer cannot see is no part of its domain for it). A domain hidden whole counts
    /// its best tool: a segment about it hands nothing on either, its hit does not count, and
    /// a message about it falls back over what the consumer may see (SPEC §10).
    fn segment_share(&self, d: u32, visible_best: f32, any: f32, visible: Option<&[bool]>) -> f32 {
        if visible.is_none() || self.visible_size(DomainId::at(d as usize), visible) > 0 {
            visible_best
        } else {
            any
        }
    }

    /// A term's postings: (tool, weight) in tool order.
    fn postings(&self, term: TermId) -> &[(u32, f32)] {
        &self.post[self.post_start[term as usize] as usize..self.post_start[term as usize + 1] as usize]
    }

    /// The tool postings behind bound `j` of `dom_post`: its term's in its domain.
    fn domain_tools(&self, j: usize) -> &[(u32, f32)] {
        &self.post[self.dom_tools[j] as usize..self.dom_tools[j + 1] as usize]
    }

    /// Adds every term's postings to `scores`, recording tools touched for the first time.
    fn accumulate(&self, terms: &[(TermId, Range<usize>)], scores: &mut [f32], touched: &mut Vec<u32>) {
        for (term, _) in terms {
            for &(tool, w) in self.postings(*term) {
                let s = &mut scores[tool as usize];
                if *s == 0.0 {
                    touched.push(tool);
                }
                *s += w;
            }
        }
    }

    /// Whether a tool's document holds a term.
    fn has_term(&self, tool: u32, term: TermId) -> bool {
        // Among the term's postings in the tool's domain: fewer than all of its postings.
        let d = self.tool_domain[tool as usize];
        let (from, list) = self.domain_bounds(term);
        list.binary_search_by_key(&d, |p| p.domain).is_ok_and(|i| {
            self.domain_tools(from + i)
                .binary_search_by_key(&tool, |&(t, _)| t)
                .is_ok()
        })
    }

    /// The words of `text` whose terms the tool holds, lowercased, in order.
    fn matched_words(&self, text: &str, terms: &[(TermId, Range<usize>)], tool: u32) -> Vec<String> {
        terms
            .iter()
            .filter(|(term, _)| !self.is_pair(*term) && self.has_term(tool, *term))
            .map(|(_, span)| {
                let word = &text[span.clone()];
                if word.is_ascii() {
                    word.to_ascii_lowercase()
                } else {
                    word.to_lowercase()
                }
            })
            .collect()
    }

    /// The domains a message is about, by segment (see the module documentation), among
    /// those `eligible` accepts (the router passes active, non-core domains with tools).
    /// Every domain competes for a segment's best score, so a segment about a core or an
    /// inactive domain does not hand its hits to weaker ones. A domain scores by its best
    /// tool among the `visible` ones (registry order; all when `None`). Sorted by domain.
    pub(crate) fn domain_hits(
        &self,
        message: &str,
        options: &SearchOptions,
        visible: Option<&[bool]>,
        eligible: impl Fn(DomainId) -> bool,
    ) -> Vec<DomainHit> {
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => {
                let hits = self.domain_hits_in(&mut scratch, message, options, visible, eligible);
                if scratch.text.capacity().max(scratch.chains.entries.capacity()) > SCRATCH_KEEP {
                    *scratch = Scratch::default();
                }
                hits
            }
            // Called again from `eligible`: scratch of its own.
            Err(_) => self.domain_hits_in(&mut Scratch::default(), message, options, visible, eligible),
        })
    }

    /// [`SearchIndex::domain_hits`] in some scratch.
    fn domain_hits_in(
        &self,
        scratch: &mut Scratch,
        message: &str,
        options: &SearchOptions,
        visible: Option<&[bool]>,
        eligible: impl Fn(DomainId) -> bool,
    ) -> Vec<DomainHit> {
        scratch.reset(self.domain_start.len() - 1, self.max_domain_tools);
        let Scratch {
            text,
            chains,
            local,
            queue,
            scored,
            kept,
            found,
            candidates,
            terms,
            pairs,
            best,
        } = scratch;
        text.analyse(message);
        let cap = options.per_segment;
        let keep = |kept: &mut Vec<f32>, s: f32| {
            if cap > 0 && (kept.len() < cap || kept.last().is_some_and(|&k| s > k)) {
                let at = kept.partition_point(|&k| k >= s);
                kept.insert(at, s);
                kept.truncate(cap);
            }
        };
        // A domain scored below `pruning * top` cannot be a hit nor the best (min_ratio
        // above 1 prunes as 1 would; NaN as 1 too, and then nothing passes the filter).
        let pruning = options.min_ratio.min(1.0);

        for segment in 0..text.segment_count() {
            let terms_from = terms.len();
            self.segment_terms(text.segment_words(segment), Some(message), terms, pairs);
            if terms.len() == terms_from {
                continue;
            }
            let segment_terms = &terms[terms_from..];
            // The terms' bounds are asked for before any is read, so their misses overlap.
            for (term, _) in segment_terms {
                prefetch(&self.dom_post_start[*term as usize]);
            }
            for (term, _) in segment_terms {
                let (from, list) = self.domain_bounds(*term);
                if let Some(p) = list.first() {
                    prefetch(p);
                    prefetch(&self.dom_tools[from]);
                }
            }
            // Bounds (exact pruning, MaxScore style): a domain's bound is the sum, in term
            // order, of each term's largest weight among its tools. Float addition is
            // monotone, so it is at least the score of every tool of the domain, whose
            // weights are summed in the same order.
            for (term, _) in segment_terms {
                let (from, list) = self.domain_bounds(*term);
                let tools = &self.dom_tools[from..=from + list.len()];
                for (p, ends) in list.iter().zip(tools.windows(2)) {
                    chains.push(p.domain, (ends[0], ends[1]), p.max);
                }
            }
            // The domain with the largest bound gives a first best score; only domains
            // whose bound reaches `pruning` of it are scored, largest bound first, until
            // the next bound falls below `pruning` of the best so far. Every skipped domain
            // scores below `pruning * top` <= `min_ratio * top` and below `top`, so `top`
            // and the candidates are exactly those of scoring every domain.
            let mut top = 0f32;
            if let Some(&first) = chains
                .domains
                .iter()
                .max_by(|&&a, &&b| chains.bound(a).total_cmp(&chains.bound(b)).then(b.cmp(&a)))
            {
                let ((s, tool), any) = self.domain_score(first, chains, local, visible);
                let ok = eligible(DomainId::at(first as usize));
                top = self.segment_share(first, s, any, visible);
                if ok {
                    keep(kept, s);
                }
                scored.push((DomainId::at(first as usize), s, tool, ok));
                let floor = pruning * top;
                queue.extend(
                    chains
                        .domains
                        .iter()
                        .copied()
                        .filter(|&d| d != first && chains.bound(d) >= floor),
                );
                queue.sort_by(|&a, &b| chains.bound(b).total_cmp(&chains.bound(a)).then(a.cmp(&b)));
                for &d in queue.iter() {
                    let b = chains.bound(d);
                    // Once `per_segment` eligible domains score above a bound, a domain
                    // under it cannot make the cut either (nor be the best).
                    if b < pruning * top || (kept.len() == cap && kept.last().is_some_and(|&k| b < k)) {
                        break;
                    }
                    let ((s, tool), any) = self.domain_score(d, chains, local, visible);
                    let ok = eligible(DomainId::at(d as usize));
                    top = top.max(self.segment_share(d, s, any, visible));
                    if ok {
                        keep(kept, s);
                    }
                    scored.push((DomainId::at(d as usize), s, tool, ok));
                }
                kept.clear();
                queue.clear();
            }
            chains.clear();
            let from = candidates.len();
            candidates.extend(
                scored
                    .drain(..)
                    // A domain whose matching tools the consumer cannot see scores 0: no hit,
                    // even in a segment where nothing else scores (`top` 0 too).
                    .filter(|&(_, s, _, ok)| s > 0.0 && s >= options.min_ratio * top && ok)
                    .map(|(d, s, tool, _)| (d, s, tool)),
            );
            candidates[from..].sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            candidates.truncate(from + options.per_segment.min(candidates.len() - from));
            found.push((top, from..candidates.len(), terms_from..terms.len()));
        }

        // Per domain, its best candidate among the segments that count (the first of equal
        // scores), and that segment's terms; the words its tool matched only for those.
        let message_top = found.iter().map(|(top, _, _)| *top).fold(0f32, f32::max);
        let tool_cap =
            (options.segment_share * self.tool_domain.len() as f32).max(options.segment_min_tools as f32);
        for (top, segment_candidates, segment_terms) in found.iter() {
            if *top < options.segment_ratio * message_top {
                continue;
            }
            let floor = options.segment_floor(*top, message_top) * top;
            let mut tools = 0;
            for &(domain, score, tool) in &candidates[segment_candidates.clone()] {
                // Candidates are sorted by score, best first. Only the segment's best domain
                // itself passes whatever its size: when that is no candidate (a keyword hit,
                // inactive), the runner-up behind it is capped like the others. A domain
                // brings the tools the consumer may be sent.
                tools += self.visible_size(domain, visible);
                if score < floor || (score < *top && tools as f32 > tool_cap) {
                    break;
                }
                match best.iter_mut().find(|h| h.0 == domain) {
                    Some(h) if h.1 >= score => {}
                    Some(h) => *h = (domain, score, tool, segment_terms.clone()),
                    None => best.push((domain, score, tool, segment_terms.clone())),
                }
            }
        }
        best.sort_by_key(|h| h.0);
        best.iter()
            .map(|(domain, score, tool, segment_terms)| DomainHit {
                domain: *domain,
                score: *score,
                terms: self.matched_words(message, &terms[segment_terms.clone()], *tool),
            })
            .collect()
    }

    /// The best tools for a query over the whole registry, best first (SPEC §5
    /// `SearchTools`): the tools whose name equals the query (ignoring case and surrounding
    /// space) first, in registry order, then by score, ties by registry order. At most `limit`, among the
    /// `visible` tools (registry order; all when `None`).
    pub fn search_tools(&self, query: &str, limit: usize, visible: Option<&[bool]>) -> Vec<ToolMatch> {
        let terms = self.query_terms(query);
        let mut scores = vec![0f32; self.tool_domain.len()];
        let mut touched = Vec::new();
        self.accumulate(&terms, &mut scores, &mut touched);
        let shown = |tool: u32| visible.is_none_or(|v| v[tool as usize]);
        touched.retain(|&t| shown(t));
        touched.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]).then(a.cmp(&b)));
        // Every tool named as asked, ignoring case, in registry order.
        let name = query.trim().to_lowercase();
        let from = self.names.partition_point(|(n, _)| *n < name);
        let exact: Vec<u32> = self.names[from..]
            .iter()
            .take_while(|(n, _)| *n == name)
            .map(|&(_, t)| t)
            .filter(|&t| shown(t))
            .collect();
        let top = touched.first().map_or(0.0, |&t| scores[t as usize]);
        let ranked = exact
            .iter()
            .copied()
            .chain(touched.into_iter().filter(|t| !exact.contains(t)))
            .take(limit);
        ranked
            .map(|tool| {
                let d = self.tool_domain[tool as usize];
                let mut terms_hit = self.matched_words(query, &terms, tool);
                let score = if exact.contains(&tool) {
                    if terms_hit.is_empty() {
                        terms_hit.push(name.clone());
                    }
                    scores[tool as usize].max(top)
                } else {
                    scores[tool as usize]
                };
                ToolMatch {
                    domain: DomainId::at(d as usize),
                    tool: (tool - self.domain_start[d as usize]) as usize,
                    score,
                    terms: terms_hit,
                }
            })
            .collect()
    }

    /// For each domain, up to `limit` words that best separate its tools from the rest of
    /// the registry and that none of its keywords already is, best first: terms ranked
    /// by the share of the domain's tools that hold them times their IDF outside it (SPEC §8
    /// `keywords suggest`).
    pub(crate) fn suggest_keywords(&self, registry: &Registry, limit: usize) -> Vec<Vec<(String, f32)>> {
        // A word a user would say: letters, digits and hyphens, three characters at least
        // (a Han character is a word alone), not an abbreviation (`e.g`) or an identifier
        // (`light.living`).
        fn typable(word: &str) -> bool {
            word.chars().all(|c| c.is_alphanumeric() || c == '-')
                && (word.chars().count() >= 3 || word.chars().any(analysis::is_han))
        }
        // Each tool's own stems (its name words, description and schema; not its domain's
        // text, which every tool of the domain carries alike), each marked when the tool's
        // prose says it: a word only tool names hold (`qbt_...`) is no word a user says.
        let mut bags: Vec<HashMap<String, bool>> = Vec::with_capacity(self.tool_domain.len());
        for d in registry.domain_ids() {
            for t in 0..registry.domain(d).tools.len() {
                let [name, description, schema, _] = build::tool_fields(registry, d, t);
                let mut bag = HashMap::new();
                for stem in self.analyzer.stems(&name) {
                    bag.entry(stem).or_insert(false);
                }
                for stem in self
                    .analyzer
                    .stems(&description)
                    .into_iter()
                    .chain(self.analyzer.stems(&schema))
                {
                    bag.insert(stem, true);
                }
                bags.push(bag);
            }
        }
        // In how many tools, and in how many domains, each stem is.
        let mut tools_with: HashMap<&str, usize> = HashMap::new();
        let mut domains_with: HashMap<&str, usize> = HashMap::new();
        for (d, _) in registry.domains().iter().enumerate() {
            let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
            for bag in &bags[self.domain_start[d] as usize..self.domain_start[d + 1] as usize] {
                for stem in bag.keys() {
                    *tools_with.entry(stem).or_default() += 1;
                    seen.insert(stem);
                }
            }
            for stem in seen {
                *domains_with.entry(stem).or_default() += 1;
            }
        }
        let n = bags.len() as f32;
        let domains = registry.domains().len() as f32;
        registry
            .domains()
            .iter()
            .enumerate()
            .map(|(d, domain)| {
                let own = &bags[self.domain_start[d] as usize..self.domain_start[d + 1] as usize];
                let size = own.len() as f32;
                if size == 0.0 {
                    return Vec::new();
                }
                // Its keywords of one word. One of several words (`magnet link`) is no keyword
                // for any word of it alone: a message saying only `magnet` does not hit it.
                // Its name is no keyword either: a message naming it hits none.
                let covered: Vec<String> = domain
                    .keywords
                    .iter()
                    .filter(|k| !k.trim().contains(char::is_whitespace))
                    .flat_map(|k| self.analyzer.stems(&analysis::split_identifier(k)))
                    .collect();
                let mut inside: HashMap<&str, (usize, bool)> = HashMap::new();
                for bag in own {
                    for (stem, &prose) in bag {
                        let e = inside.entry(stem).or_default();
                        e.0 += 1;
                        e.1 |= prose;
                    }
                }
                let mut ranked: Vec<(String, f32)> = inside
                    .into_iter()
                    .filter_map(|(stem, (count, prose))| {
                        let count = count as f32;
                        if !prose || count < 2f32.min(size) || covered.iter().any(|c| c == stem) {
                            return None;
                        }
                        let outside = tools_with[stem] as f32 - count;
                        let idf = ((n - size + 1.0) / (outside + 1.0)).ln();
                        // A word most domains say tells none of them apart: none that half
                        // of them or more say, the fewer the better.
                        let said_by = domains_with[stem] as f32;
                        let spread = if domains < 2.0 {
                            1.0
                        } else if said_by * 2.0 >= domains && domains >= 4.0 {
                            0.0
                        } else {
                            (domains / said_by).ln() / domains.ln()
                        };
                        let word = self
                            .terms
                            .get(stem)
                            .map_or(stem, |&t| self.term_words[t as usize].as_str());
                        (idf > 0.0 && spread > 0.0 && typable(word))
                            .then(|| (word.to_string(), count / size * idf * spread))
                    })
                    .collect();
                ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                ranked.truncate(limit);
                ranked
            })
            .collect()
    }
}
