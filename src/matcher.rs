//! The keyword automaton: one Aho-Corasick automaton over every keyword of every domain, plus
//! the word-boundary and suffix rule of `word` mode. Pure: no I/O, no clock.
//!
//! Case: keywords are lowercased with `str::to_lowercase` when the automaton is built. The
//! automaton is ASCII case-insensitive, so an ASCII message is searched as it is (no
//! allocation); any other message is lowercased first, which is what makes `HÖRBUCH` hit
//! `hörbuch`. Both paths judge boundaries on text equal to the lowercased message, because
//! ASCII case changes neither letters nor digits.
//!
//! Word-mode endings: besides the keyword itself (followed by nothing, or by `s`, `es`, `ing`,
//! `ed`, `er`, `ers`; and `d`, `r`, `rs` when it ends in `e`), two stems are added as
//! patterns of their own: a consonant+`y` keyword without its `y` (`librar` + `ies`/`ied`/
//! `ying`) and an `e` keyword without its `e` (`transcod` + `ing`).

use std::borrow::Cow;
use std::collections::HashMap;

use aho_corasick::automaton::Automaton as _;
use aho_corasick::nfa::contiguous::{Builder, NFA};
use aho_corasick::{Anchored, Input, MatchKind};

use crate::registry::KeywordId;

/// How keywords hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MatchMode {
    /// On word boundaries, with the plural/verb suffix rule.
    #[default]
    Word,
    /// Anywhere in the message, no suffix rules.
    Substring,
}

/// Which endings a pattern accepts after it (word mode only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The whole keyword: end of word, or a common suffix.
    Keyword { ends_in_e: bool },
    /// A consonant+`y` keyword without its `y`.
    YStem,
    /// An `e` keyword without its `e`.
    EStem,
}

const SUFFIXES: &[&str] = &["s", "es", "ing", "ed", "er", "ers"];
const E_SUFFIXES: &[&str] = &["d", "r", "rs"];
const Y_STEM_SUFFIXES: &[&str] = &["ies", "ied", "ying"];
const E_STEM_SUFFIXES: &[&str] = &["ing"];

/// The built automaton for one registry's keywords.
#[derive(Debug, Clone)]
pub struct Matcher {
    /// `None` when there are no keywords at all.
    automaton: Option<NFA>,
    /// For each automaton pattern: the keywords it stands for and how it may end. Equal
    /// patterns (the same keyword in two domains, or a stem equal to another keyword) are
    /// merged, so every pattern id maps to all of them.
    targets: Vec<Vec<(KeywordId, Ending)>>,
    /// How many keywords (one more than the largest id).
    keywords: usize,
    mode: MatchMode,
}

impl Matcher {
    /// Builds the automaton over `keywords`, whose positions are their [`KeywordId`]s.
    ///
    /// # Errors
    /// When the automaton exceeds aho-corasick's size limits.
    pub fn new<'a>(keywords: impl IntoIterator<Item = &'a str>, mode: MatchMode) -> crate::Result<Matcher> {
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut count = 0;
        let mut patterns: Vec<String> = Vec::new();
        let mut targets: Vec<Vec<(KeywordId, Ending)>> = Vec::new();
        let mut add = |pattern: String, target: (KeywordId, Ending)| {
            let id = *index.entry(pattern.clone()).or_insert_with(|| {
                patterns.push(pattern);
                targets.push(Vec::new());
                targets.len() - 1
            });
            targets[id].push(target);
        };
        for (k, keyword) in keywords.into_iter().enumerate() {
            count = k + 1;
            let lower = keyword.to_lowercase();
            if lower.is_empty() {
                continue;
            }
            let ends_in_e = lower.ends_with('e');
            if mode == MatchMode::Word {
                if let Some(stem) = y_stem(&lower) {
                    add(stem.to_string(), (KeywordId::at(k), Ending::YStem));
                }
                if ends_in_e && lower.len() > 1 {
                    add(
                        lower[..lower.len() - 1].to_string(),
                        (KeywordId::at(k), Ending::EStem),
                    );
                }
            }
            add(lower, (KeywordId::at(k), Ending::Keyword { ends_in_e }));
        }
        let automaton = if patterns.is_empty() {
            None
        } else {
            Some(
                Builder::new()
                    // Standard semantics are what overlapping search needs, and overlapping
                    // search is what finds every keyword, also one inside another
                    // (`vault` / `vaultwarden`, `library` / `scan library`).
                    .match_kind(MatchKind::Standard)
                    .ascii_case_insensitive(true)
                    .build(&patterns)?,
            )
        };
        Ok(Matcher {
            automaton,
            targets,
            keywords: count,
            mode,
        })
    }

    /// The automaton itself (`None` when there are no keywords), for measuring the bare
    /// scan of the whole message (unanchored, overlapping) that [`Matcher::find`] is
    /// compared with. It is ASCII case-insensitive and expects what `find` searches: an ASCII
    /// message as it is, any other lowercased.
    pub fn automaton(&self) -> Option<&NFA> {
        self.automaton.as_ref()
    }

    /// The mode this automaton was built for.
    pub fn mode(&self) -> MatchMode {
        self.mode
    }

    /// Every keyword found in `message`, sorted and each once.
    pub fn find(&self, message: &str) -> Vec<KeywordId> {
        let Some(nfa) = &self.automaton else {
            return Vec::new();
        };
        let text = searchable(message);
        let mut hits = Vec::new();
        // Each keyword once, however often it hits: a message that repeats one is not a
        // list that grows with it.
        let mut seen = vec![0u64; self.keywords.div_ceil(64)];
        let mut hit = |pattern: usize, start: usize, end: usize| {
            for &(k, ending) in &self.targets[pattern] {
                let (word, bit) = (k.index() / 64, 1u64 << (k.index() % 64));
                if seen[word] & bit == 0
                    && (self.mode == MatchMode::Substring || word_hit(&text, start, end, ending))
                {
                    seen[word] |= bit;
                    hits.push(k);
                }
            }
        };
        match self.mode {
            MatchMode::Substring => {
                for m in overlapping(nfa, &text) {
                    hit(m.pattern().as_usize(), m.start(), m.end());
                }
            }
            MatchMode::Word => {
                for start in word_starts(&text) {
                    anchored(nfa, &text, start, |pattern, end| hit(pattern, start, end));
                }
            }
        }
        // Each keyword is in once already (`seen`).
        hits.sort_unstable();
        hits
    }
}

/// Every match of the automaton in `text`, overlapping ones included.
fn overlapping<'a>(nfa: &'a NFA, text: &'a str) -> impl Iterator<Item = aho_corasick::Match> + 'a {
    // The automaton is built for unanchored standard-semantics search, which is what
    // overlapping iteration needs, so this cannot fail.
    nfa.try_find_overlapping_iter(Input::new(text))
        .into_iter()
        .flatten()
}

/// Where a word-mode keyword may start: the start of the text and every character that
/// follows one that is not a letter or digit ([`word_hit`]'s first condition).
fn word_starts(text: &str) -> impl Iterator<Item = usize> + '_ {
    let mut after_word_char = false;
    text.char_indices().filter_map(move |(i, c)| {
        let start = !after_word_char;
        after_word_char = is_word_char(c);
        start.then_some(i)
    })
}

/// Calls `found(pattern, end)` for each pattern that matches `text` starting exactly at
/// `start`: a walk down the automaton's trie from its anchored start state (no failure
/// transitions), so a word costs the length of its longest keyword prefix, where a scan of
/// the whole message with the unanchored automaton also walks inside words and follows
/// failure transitions. A turn meets the automaton cold (each answer's bytes pass through
/// the caches between two turns), so every state entered is a wait on memory.
fn anchored(nfa: &NFA, text: &str, start: usize, mut found: impl FnMut(usize, usize)) {
    // The contiguous NFA always has an anchored start state.
    let Ok(mut sid) = nfa.start_state(Anchored::Yes) else {
        return;
    };
    for (len, &byte) in (1..).zip(&text.as_bytes()[start..]) {
        sid = nfa.next_state(Anchored::Yes, sid, byte);
        if nfa.is_dead(sid) {
            return;
        }
        #[cfg(test)]
        tests::WALKED.with(|w| w.set(w.get() + 1));
        if nfa.is_match(sid) {
            // A state also holds the matches of its suffixes (for unanchored search, which
            // reaches them by failure transitions); only the pattern that is this state's
            // own starts here. Patterns are unique, and the automaton lists a state's own
            // match before those it copies from its failure state, so only the first can
            // be: reading on would cost, at every byte, one step per keyword that ends
            // here and starts later.
            let pattern = nfa.match_pattern(sid, 0);
            #[cfg(test)]
            tests::MATCHES_READ.with(|m| m.set(m.get() + 1));
            if nfa.pattern_len(pattern) == len {
                found(pattern.as_usize(), start + len);
            }
        }
    }
}

/// The text the automaton searches: an ASCII message as it is (the automaton is ASCII
/// case-insensitive), any other lowercased.
fn searchable(message: &str) -> Cow<'_, str> {
    if message.is_ascii() {
        Cow::Borrowed(message)
    } else {
        Cow::Owned(message.to_lowercase())
    }
}

/// The stem of a keyword ending in an ASCII consonant followed by `y`.
fn y_stem(lower: &str) -> Option<&str> {
    let stem = lower.strip_suffix('y')?;
    let last = stem.chars().next_back()?;
    (last.is_ascii_alphabetic() && !"aeiouy".contains(last)).then_some(stem)
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric()
}

/// True at the end of the text or before a character that is not a letter or digit.
fn boundary_at(text: &str, pos: usize) -> bool {
    text[pos..].chars().next().is_none_or(|c| !is_word_char(c))
}

fn word_hit(text: &str, start: usize, end: usize, ending: Ending) -> bool {
    if text[..start].chars().next_back().is_some_and(is_word_char) {
        return false;
    }
    let rest = &text[end..];
    let suffix_then_boundary = |suffixes: &[&str]| {
        suffixes.iter().any(|s| {
            rest.len() >= s.len()
                && rest.as_bytes()[..s.len()].eq_ignore_ascii_case(s.as_bytes())
                && boundary_at(text, end + s.len())
        })
    };
    match ending {
        Ending::Keyword { ends_in_e } => {
            boundary_at(text, end)
                || suffix_then_boundary(SUFFIXES)
                || (ends_in_e && suffix_then_boundary(E_SUFFIXES))
        }
        Ending::YStem => suffix_then_boundary(Y_STEM_SUFFIXES),
        Ending::EStem => suffix_then_boundary(E_STEM_SUFFIXES),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (keywords, mode, message, keywords expected to hit)
    type Case = (
        &'static [&'static str],
        MatchMode,
        &'static str,
        &'static [&'static str],
    );
    use MatchMode::{Substring, Word};

    const CASES: &[Case] = &[
        // Plurals and words inside other words.
        (&["light"], Word, "turn on the light", &["light"]),
        (&["light"], Word, "turn off the lights", &["light"]),
        (&["light"], Word, "highlight this", &[]),
        (&["light"], Word, "the lightning", &[]),
        (&["light"], Substring, "highlight this", &["light"]),
        (&["entity"], Word, "verify my identity", &[]),
        (&["entity"], Word, "which entities exist", &["entity"]),
        (&["ratio"], Word, "show the configuration", &[]),
        (&["ratio"], Word, "what is my ratio", &["ratio"]),
        (&["ratio"], Substring, "show the configuration", &["ratio"]),
        (&["library"], Word, "scan all libraries", &["library"]),
        (&["library"], Word, "the library is big", &["library"]),
        (&["library"], Word, "librarying", &["library"]),
        (&["library"], Substring, "scan all libraries", &[]),
        (&["seed"], Word, "is it seeding?", &["seed"]),
        (&["seed"], Word, "seeders and seeds", &["seed"]),
        (&["seed"], Word, "aniseed", &[]),
        (&["queue"], Word, "what got queued", &["queue"]),
        (&["queue"], Word, "queuing now", &["queue"]),
        (&["transcode"], Word, "is it transcoding", &["transcode"]),
        (&["transcode"], Word, "the transcoder is busy", &["transcode"]),
        (&["play"], Word, "plays and playing", &["play"]),
        (&["play"], Word, "plies", &[]),
        // Unicode case folding.
        (&["hörbuch"], Word, "Spiel mein HÖRBUCH ab", &["hörbuch"]),
        (&["HÖRBUCH"], Word, "ein hörbuch bitte", &["HÖRBUCH"]),
        (&["hörbuch"], Word, "Hörbuchs", &["hörbuch"]),
        (&["hörbuch"], Word, "xhörbuch", &[]),
        (&["café"], Word, "Le CAFÉ est ouvert", &["café"]),
        // Keywords with spaces and punctuation.
        (
            &["quality profile"],
            Word,
            "Change the Quality Profile to 1080p",
            &["quality profile"],
        ),
        (
            &["quality profile"],
            Word,
            "two quality profiles",
            &["quality profile"],
        ),
        (&["quality profile"], Word, "quality of the profile", &[]),
        (&["pi-hole"], Word, "is Pi-hole blocking ads", &["pi-hole"]),
        (&["pi-hole"], Word, "pi hole", &[]),
        // Positions and punctuation around the keyword.
        (&["docker"], Word, "docker", &["docker"]),
        (&["docker"], Word, "docker ps", &["docker"]),
        (&["docker"], Word, "restart docker", &["docker"]),
        (&["docker"], Word, "is docker?", &["docker"]),
        (&["docker"], Word, "docker, then nginx", &["docker"]),
        (&["docker"], Word, "(docker)", &["docker"]),
        (&["docker"], Word, "docker2", &[]),
        (&["docker"], Word, "2docker", &[]),
        // Overlapping keywords: every one that hits is found.
        (
            &["vault", "vaultwarden"],
            Word,
            "open vaultwarden",
            &["vaultwarden"],
        ),
        (
            &["vault", "vaultwarden"],
            Substring,
            "open vaultwarden",
            &["vault", "vaultwarden"],
        ),
        (
            &["vault", "vaultwarden"],
            Word,
            "my vault in vaultwarden",
            &["vault", "vaultwarden"],
        ),
        (
            &["scan library", "library"],
            Word,
            "scan library now",
            &["scan library", "library"],
        ),
        (
            &["torrent", "seeding", "plex"],
            Word,
            "torrents seeding to plex",
            &["torrent", "seeding", "plex"],
        ),
        // The same keyword twice (two domains) is reported for both.
        (&["dns", "dns"], Word, "check dns", &["dns", "dns"]),
        // Nothing to find.
        (&["light"], Word, "", &[]),
        (&[], Word, "anything", &[]),
        (&["light"], Word, "灯を消して 💡🔥", &[]),
        (&["灯"], Word, "灯を消して", &[]),
        (&["灯"], Substring, "灯を消して", &["灯"]),
        (&["light"], Word, "💡light💡", &["light"]),
        (&["light"], Word, "lightä", &[]),
        (&["light"], Word, "Élight", &[]),
    ];

    #[test]
    fn the_keyword_table_holds() {
        for &(keywords, mode, message, expected) in CASES {
            let m = Matcher::new(keywords.iter().copied(), mode).unwrap();
            let got: Vec<&str> = m.find(message).into_iter().map(|k| keywords[k.index()]).collect();
            assert_eq!(got, expected, "keywords {keywords:?} ({mode:?}) in {message:?}");
        }
    }

    thread_local! {
        /// Trie states a word-mode walk entered, and matches it read, on this thread.
        pub(super) static WALKED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
        pub(super) static MATCHES_READ: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[test]
    fn keywords_nested_in_each_other_are_each_found_once_in_a_message_that_repeats_them() {
        // "a", "a a", "a a a", ...: every state of the walk ends one keyword and holds the
        // matches of all the shorter ones; each is found, once, in both modes.
        let keywords: Vec<String> = (1..=64).map(|n| vec!["a"; n].join(" ")).collect();
        let message = "a ".repeat(32 * 1024);
        for mode in [Word, Substring] {
            let m = Matcher::new(keywords.iter().map(String::as_str), mode).unwrap();
            WALKED.with(|w| w.set(0));
            MATCHES_READ.with(|m| m.set(0));
            let found = m.find(&message);
            assert_eq!(found.len(), keywords.len(), "{mode:?}");
            assert!(found.iter().enumerate().all(|(i, k)| k.index() == i), "{mode:?}");
            // A walk reads at most one match per state it enters, not every keyword that
            // ends there (up to 64 here).
            let (walked, read) = (WALKED.with(|w| w.get()), MATCHES_READ.with(|m| m.get()));
            assert!(read <= walked, "{mode:?}: {read} matches read in {walked} states");
        }
    }

    #[test]
    fn hits_are_sorted_and_unique_even_when_a_keyword_hits_twice() {
        let m = Matcher::new(["b", "a"], Word).unwrap();
        assert_eq!(m.find("a b a b"), vec![KeywordId::at(0), KeywordId::at(1)]);
    }

    /// Word mode as a scan of the whole message: every match of the unanchored automaton,
    /// kept when [`word_hit`] accepts it.
    fn find_by_full_scan(m: &Matcher, message: &str) -> Vec<KeywordId> {
        let Some(nfa) = &m.automaton else {
            return Vec::new();
        };
        let text = searchable(message);
        let mut hits: Vec<KeywordId> = overlapping(nfa, &text)
            .flat_map(|mt| {
                m.targets[mt.pattern().as_usize()]
                    .iter()
                    .filter(|&&(_, ending)| word_hit(&text, mt.start(), mt.end(), ending))
                    .map(|&(k, _)| k)
                    .collect::<Vec<_>>()
            })
            .collect();
        hits.sort_unstable();
        hits.dedup();
        hits
    }

    proptest::proptest! {
        /// Walking the trie from each word start finds what scanning the whole message
        /// and applying the word rule finds. A small alphabet, so keywords hit often, inside
        /// words and across them, with capitals, suffixes and non-ASCII letters.
        #[test]
        fn walking_from_word_starts_finds_what_a_full_scan_finds(
            keywords in proptest::collection::vec("[abey][abeyé -]{0,5}", 1..12),
            message in "[abeyAEé .-]{0,120}",
        ) {
            let m = Matcher::new(keywords.iter().map(String::as_str), Word).unwrap();
            proptest::prop_assert_eq!(m.find(&message), find_by_full_scan(&m, &message));
        }
    }
}
