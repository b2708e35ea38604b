//! Text analysis shared by the index and the queries: Unicode word segmentation (UAX #29),
//! lowercase, stop words, Snowball English stemming, identifier splitting for tool and
//! property names, and the cut of a message into segments (sentences and clauses). Pure.

use std::ops::Range;

use rust_stemmers::{Algorithm, Stemmer};
use unicode_segmentation::UnicodeSegmentation;

/// Words that carry no routing information: the Snowball English stop list, plus the words of
/// small talk and of asking ("hi", "thanks", "ok", "please", "could you tell me"), so that a
/// greeting or a bare "ok do it" finds nothing.
const STOP_WORDS: &[&str] = &[
    // Snowball English stop list.
    "i",
    "me",
    "my",
    "myself",
    "we",
    "our",
    "ours",
    "ourselves",
    "you",
    "your",
    "yours",
    "yourself",
    "yourselves",
    "he",
    "him",
    "his",
    "himself",
    "she",
    "her",
    "hers",
    "herself",
    "it",
    "its",
    "itself",
    "they",
    "them",
    "their",
    "theirs",
    "themselves",
    "what",
    "which",
    "who",
    "whom",
    "this",
    "that",
    "these",
    "those",
    "am",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "being",
    "have",
    "has",
    "had",
    "having",
    "do",
    "does",
    "did",
    "doing",
    "would",
    "should",
    "could",
    "ought",
    "i'm",
    "you're",
    "he's",
    "she's",
    "it's",
    "we're",
    "they're",
    "i've",
    "you've",
    "we've",
    "they've",
    "i'd",
    "you'd",
    "he'd",
    "she'd",
    "we'd",
    "they'd",
    "i'll",
    "you'll",
    "he'll",
    "she'll",
    "we'll",
    "they'll",
    "isn't",
    "aren't",
    "wasn't",
    "weren't",
    "hasn't",
    "haven't",
    "hadn't",
    "doesn't",
    "don't",
    "didn't",
    "won't",
    "wouldn't",
    "shan't",
    "shouldn't",
    "can't",
    "cannot",
    "couldn't",
    "mustn't",
    "let's",
    "that's",
    "who's",
    "what's",
    "here's",
    "there's",
    "when's",
    "where's",
    "why's",
    "how's",
    "a",
    "an",
    "the",
    "and",
    "but",
    "if",
    "or",
    "because",
    "as",
    "until",
    "while",
    "of",
    "at",
    "by",
    "for",
    "with",
    "about",
    "against",
    "between",
    "into",
    "through",
    "during",
    "before",
    "after",
    "above",
    "below",
    "to",
    "from",
    "up",
    "down",
    "in",
    "out",
    "on",
    "off",
    "over",
    "under",
    "again",
    "further",
    "then",
    "once",
    "here",
    "there",
    "when",
    "where",
    "why",
    "how",
    "all",
    "any",
    "both",
    "each",
    "few",
    "more",
    "most",
    "other",
    "some",
    "such",
    "no",
    "nor",
    "not",
    "only",
    "own",
    "same",
    "so",
    "than",
    "too",
    "very",
    "s",
    "t",
    "can",
    "will",
    "just",
    "should",
    "now",
    // Small talk and the words of asking.
    "hi",
    "hello",
    "hey",
    "thanks",
    "thank",
    "thx",
    "ok",
    "okay",
    "please",
    "pls",
    "yes",
    "yeah",
    "yep",
    "nope",
    "sure",
    "great",
    "cool",
    "nice",
    "bye",
    "goodbye",
    "lol",
    "hmm",
    "wow",
    "awesome",
    "perfect",
    "fine",
    "also",
    "maybe",
    "really",
    "want",
    "wanna",
    "need",
    "like",
    "know",
    "tell",
    "let",
    "help",
    "may",
    "might",
    "must",
    "shall",
    "something",
    "anything",
    "everything",
    "thing",
    "things",
    "get",
    "got",
    "give",
    "provide",
    "me",
    "kindly",
    "able",
    "using",
    "use",
    "would",
    "im",
    "id",
    "ive",
    "youre",
    "dont",
    "cant",
];

/// A lowercase word and where it is in the text it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Word {
    /// The word, lowercased.
    pub text: String,
    /// Its byte range in the analysed text.
    pub span: Range<usize>,
}

/// Stop list and stemmer, built once per index.
pub(crate) struct Analyzer {
    stop: std::collections::HashSet<&'static str>,
    stemmer: Stemmer,
}

impl std::fmt::Debug for Analyzer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Analyzer")
            .field("stop_words", &self.stop.len())
            .finish()
    }
}

impl Default for Analyzer {
    fn default() -> Self {
        Analyzer::new()
    }
}

impl Analyzer {
    /// The English analyzer.
    pub fn new() -> Analyzer {
        Analyzer {
            stop: STOP_WORDS.iter().copied().collect(),
            stemmer: Stemmer::create(Algorithm::English),
        }
    }

    /// Whether a lowercase word is a stop word. A word without any letter (a number, a
    /// single character) carries no routing information either.
    pub(crate) fn is_stop(&self, word: &str) -> bool {
        word.chars().count() < 2 || !word.chars().any(char::is_alphabetic) || self.stop.contains(word)
    }

    /// The stem of a lowercase word.
    pub fn stem<'a>(&self, word: &'a str) -> std::borrow::Cow<'a, str> {
        self.stemmer.stem(word)
    }

    /// The stems of a text's informative words, in order (for building the index).
    pub fn stems(&self, text: &str) -> Vec<String> {
        words(text)
            .filter(|w| !self.is_stop(&w.text))
            .map(|w| self.stem(&w.text).into_owned())
            .collect()
    }
}

/// The words of a text (UAX #29 word boundaries, keeping only words with a letter or digit),
/// lowercased. Apostrophes inside a word stay (`don't`); a possessive `'s` is dropped.
pub fn words(text: &str) -> impl Iterator<Item = Word> + '_ {
    text.unicode_word_indices().map(|(start, w)| {
        let w = w
            .strip_suffix("'s")
            .or_else(|| w.strip_suffix("\u{2019}s"))
            .unwrap_or(w);
        Word {
            text: w.to_lowercase().replace('\u{2019}', "'"),
            span: start..start + w.len(),
        }
    })
}

/// Calls `f` with each word of `text` and its span, exactly as [`words`] yields them, but
/// lowercased into one reused buffer: an ASCII word (the common case) costs no allocation.
pub(crate) fn for_each_word(text: &str, buf: &mut String, mut f: impl FnMut(Range<usize>, &str)) {
    for (start, w) in text.unicode_word_indices() {
        let w = w
            .strip_suffix("'s")
            .or_else(|| w.strip_suffix("\u{2019}s"))
            .unwrap_or(w);
        buf.clear();
        if w.is_ascii() {
            buf.push_str(w);
            buf.make_ascii_lowercase();
        } else {
            buf.push_str(&w.to_lowercase().replace('\u{2019}', "'"));
        }
        f(start..start + w.len(), buf);
    }
}

/// The words of an identifier such as a tool or property name: split at `_`, `-`, `.`,
/// spaces, case changes (`getHealthWorkforce`, `HTTPServer`) and between letters and digits,
/// then joined with spaces so [`words`] reads them.
pub(crate) fn split_identifier(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 8);
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_alphanumeric() {
            out.push(' ');
            continue;
        }
        if i > 0 {
            let prev = chars[i - 1];
            let next = chars.get(i + 1).copied();
            let boundary = (prev.is_lowercase() && c.is_uppercase())
                || (prev.is_alphabetic() && c.is_numeric())
                || (prev.is_numeric() && c.is_alphabetic())
                // The last capital of a run that starts a word: `HTTPServer` -> HTTP Server.
                || (prev.is_uppercase() && c.is_uppercase() && next.is_some_and(char::is_lowercase));
            if boundary {
                out.push(' ');
            }
        }
        out.push(c);
    }
    out
}

/// Words that start a new request inside a sentence ("… and then …", "…, also …").
const CLAUSE_BREAKS: &[&str] = &["and", "then", "also", "plus", "afterwards", "finally"];

/// Cuts a message into segments (byte ranges): sentences end at `.`, `!`, `?`, `;` or a line
/// break followed by a space or the end; clauses start at one of [`CLAUSE_BREAKS`]. A
/// segment that holds no word is dropped, so a message yields its requests one by one.
pub(crate) fn segments(message: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let bytes = message.as_bytes();
    let push = |range: Range<usize>, out: &mut Vec<Range<usize>>| {
        if message[range.clone()].chars().any(char::is_alphanumeric) {
            out.push(range);
        }
    };
    // Sentences first.
    let mut sentences = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        let end_mark = matches!(b, b'.' | b'!' | b'?' | b';' | b'\n');
        let followed_by_space = bytes.get(i + 1).is_none_or(|n| n.is_ascii_whitespace());
        if end_mark && (b == b'\n' || followed_by_space) {
            push(start..i + 1, &mut sentences);
            start = i + 1;
        }
    }
    push(start..message.len(), &mut sentences);
    // Then clauses: a break word, lowercased, between two other words.
    for sentence in sentences {
        let text = &message[sentence.clone()];
        let mut clause_start = sentence.start;
        for (pos, w) in text.unicode_word_indices() {
            let at = sentence.start + pos;
            if at > clause_start
                && CLAUSE_BREAKS.iter().any(|b| w.eq_ignore_ascii_case(b))
                && message[clause_start..at].chars().any(char::is_alphanumeric)
            {
                push(clause_start..at, &mut out);
                clause_start = at;
            }
        }
        push(clause_start..sentence.end, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_split_at_separators_case_changes_and_digits() {
        let cases: &[(&str, &str)] = &[
            ("getHealthWorkforce", "get Health Workforce"),
            ("qbt_list_torrents", "qbt list torrents"),
            ("pi-hole", "pi hole"),
            ("HTTPServer", "HTTP Server"),
            ("getPM2_5Level", "get PM 2 5 Level"),
            ("v2Api", "v 2 Api"),
            ("simple", "simple"),
        ];
        for (name, want) in cases {
            let got = split_identifier(name);
            let got: Vec<&str> = got.split_whitespace().collect();
            let want: Vec<&str> = want.split_whitespace().collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn words_are_lowercased_unicode_words_without_possessives() {
        let cases: &[(&str, &[&str])] = &[
            ("Turn OFF the lights!", &["turn", "off", "the", "lights"]),
            ("Jellyfin's library", &["jellyfin", "library"]),
            ("don’t stop", &["don't", "stop"]),
            ("Spiel das HÖRBUCH", &["spiel", "das", "hörbuch"]),
            ("pi-hole, 3.5 GB", &["pi", "hole", "3.5", "gb"]),
            ("...", &[]),
        ];
        for (text, want) in cases {
            let got: Vec<String> = words(text).map(|w| w.text).collect();
            assert_eq!(&got, want, "{text}");
        }
    }

    #[test]
    fn the_buffered_words_equal_the_allocating_ones() {
        let cases = [
            "Turn OFF the lights!",
            "Jellyfin's library and the NAS\u{2019}s disks",
            "don\u{2019}t stop, don't STOP",
            "Spiel das H\u{d6}RBUCH \u{fc}ber \u{39f}\u{394}\u{3a5}\u{3a3}\u{3a3}\u{395}\u{391}\u{3a3}",
            "pi-hole, 3.5 GB at 10:30; e-mail user_name@example.com",
            "caf\u{e9} na\u{ef}ve \u{130}stanbul \u{1e9e} \u{65e5}\u{672c}\u{8a9e}\u{30c6}\u{30ad}\u{30b9}\u{30c8}",
            "",
            "...",
        ];
        for text in cases {
            let want: Vec<(Range<usize>, String)> = words(text).map(|w| (w.span, w.text)).collect();
            let mut got = Vec::new();
            for_each_word(text, &mut String::new(), |span, w| {
                got.push((span, w.to_string()))
            });
            assert_eq!(got, want, "{text}");
        }
    }

    #[test]
    fn stems_drop_stop_words_and_reduce_inflections() {
        let a = Analyzer::new();
        let cases: &[(&str, &[&str])] = &[
            ("Hi, thanks!", &[]),
            ("ok do it", &[]),
            ("Please tell me the weather", &["weather"]),
            (
                "scheduling scheduled schedules",
                &["schedul", "schedul", "schedul"],
            ),
            ("libraries library", &["librari", "librari"]),
            ("Pause the torrents", &["paus", "torrent"]),
            ("I want to know about 42", &[]),
        ];
        for (text, want) in cases {
            assert_eq!(&a.stems(text), want, "{text}");
        }
    }

    #[test]
    fn messages_are_cut_into_sentences_and_clauses() {
        let cases: &[(&str, &[&str])] = &[
            (
                "Pause the film and dim the hallway",
                &["Pause the film ", "and dim the hallway"],
            ),
            (
                "Check the disk. Then restart nginx!",
                &["Check the disk.", " Then restart nginx!"],
            ),
            ("Set it to 3.5 degrees", &["Set it to 3.5 degrees"]),
            ("and", &["and"]),
            ("first line\nsecond line", &["first line\n", "second line"]),
            (
                "Back up the VM, then snapshot it; also ping me",
                &["Back up the VM, ", "then snapshot it;", " also ping me"],
            ),
            ("", &[]),
            ("?!", &[]),
        ];
        for (message, want) in cases {
            let got: Vec<&str> = segments(message).into_iter().map(|r| &message[r]).collect();
            assert_eq!(&got, want, "{message:?}");
        }
    }
}
