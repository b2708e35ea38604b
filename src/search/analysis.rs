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
    "cheers",
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
    // Greetings and farewells, and the small words around them.
    "good",
    "morning",
    "afternoon",
    "evening",
    "day",
    "today",
    "later",
    "back",
    "one",
    "question",
    "talk",
];

/// Stop words of courtesy: a sentence or clause made of one of them and at most one other
/// word is small talk, not a request ("many thanks", "thanks for your time", "good night").
const COURTESY: &[&str] = &[
    "thanks", "thank", "thx", "cheers", "hi", "hello", "hey", "bye", "goodbye", "good",
];

/// Whether a lowercase stop word is one of courtesy.
pub(crate) fn is_courtesy(word: &str) -> bool {
    word.len() <= 7 && COURTESY.contains(&word)
}

/// Whether a character is a Han ideograph (the CJK Unified Ideographs blocks and their
/// compatibility forms).
pub(crate) fn is_han(c: char) -> bool {
    matches!(c,
        '\u{3400}'..='\u{4DBF}' | '\u{4E00}'..='\u{9FFF}' | '\u{F900}'..='\u{FAFF}' | '\u{20000}'..='\u{323AF}')
}

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
    stop: std::collections::HashSet<&'static str, foldhash::fast::FixedState>,
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

    /// Whether a lowercase word is a stop word. A word without any letter (a number) or of a
    /// single character carries no routing information either, but for a Han character:
    /// Chinese and Japanese are written without spaces, so each is a word of its own (UAX #29)
    /// and carries meaning (pairs of them are the index's word pairs).
    pub(crate) fn is_stop(&self, word: &str) -> bool {
        let mut chars = word.chars();
        let one_letter = match (chars.next(), chars.next()) {
            (Some(c), None) => !is_han(c),
            (None, _) => true,
            _ => false,
        };
        one_letter || !word.chars().any(char::is_alphabetic) || self.stop.contains(word)
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
/// lowercased. Apostrophes inside a word stay (`don't`); a possessive `'s` is dropped. A word
/// joined by underscores is its parts (`get_weather` is `get` and `weather`), as in the tool
/// names it may quote.
pub fn words(text: &str) -> impl Iterator<Item = Word> + '_ {
    text.unicode_word_indices().flat_map(|(start, w)| {
        let w = w
            .strip_suffix("'s")
            .or_else(|| w.strip_suffix("\u{2019}s"))
            .unwrap_or(w);
        parts(start, w).map(|(start, w)| Word {
            text: w.to_lowercase().replace('\u{2019}', "'"),
            span: start..start + w.len(),
        })
    })
}

/// The parts of a word at `start` between its underscores, each with its start, keeping those
/// with a letter or digit.
fn parts(start: usize, word: &str) -> impl Iterator<Item = (usize, &str)> {
    word.split('_')
        .scan(start, |at, part| {
            let here = *at;
            *at += part.len() + 1;
            Some((here, part))
        })
        .filter(|(_, part)| part.chars().any(char::is_alphanumeric))
}

/// Calls `f` with each word of `text` and its span, exactly as [`words`] yields them, but
/// lowercased into one reused buffer: an ASCII word (the common case) costs no allocation.
pub(crate) fn for_each_word(text: &str, buf: &mut String, mut f: impl FnMut(Range<usize>, &str)) {
    for (start, w) in text.unicode_word_indices() {
        let w = w
            .strip_suffix("'s")
            .or_else(|| w.strip_suffix("\u{2019}s"))
            .unwrap_or(w);
        for (start, w) in parts(start, w) {
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

/// Whether a comma (`,`, or the full-width, ideographic or Arabic one) comes next in `rest`
/// before any letter or digit (past spaces and symbols: "thanks 🙏, pause the film").
pub(crate) fn comma_follows(rest: &str) -> bool {
    comma_first(rest.chars())
}

/// Whether a comma comes last in `before` after any letter or digit (past spaces and
/// symbols: "pause 🎬, thanks"): [`comma_follows`] read backwards.
pub(crate) fn comma_precedes(before: &str) -> bool {
    comma_first(before.chars().rev())
}

/// Whether a comma comes before any letter or digit among the first characters of `chars`.
fn comma_first(chars: impl Iterator<Item = char>) -> bool {
    chars
        .take(16)
        .find(|&c| c.is_alphanumeric() || matches!(c, ',' | '，' | '、' | '،'))
        .is_some_and(|c| !c.is_alphanumeric())
}

/// A line break: it ends a sentence.
fn is_line_break(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

/// A mark that ends a sentence whatever follows it: the full stops and marks of scripts
/// written without a space after them, and the ellipsis written as one character.
fn is_stop_without_space(c: char) -> bool {
    matches!(c, '。' | '｡' | '！' | '？' | '；' | '…' | '؟')
}

/// A mark that ends a sentence when a space or the end follows it, past closing quotes and
/// brackets (`Say "reboot the node." What is playing?`).
fn is_stop(c: char) -> bool {
    matches!(c, '.' | '!' | '?' | ';')
}

/// A closing quote or bracket, which may stand between a sentence's mark and the space.
fn is_closer(c: char) -> bool {
    matches!(c, '"' | '\'' | ')' | ']' | '”' | '’' | '»' | '」' | '』' | '）')
}

/// Whether the mark [`is_stop`] at the start of `rest` ends a sentence: past closers, a
/// space (any Unicode white space) or the end.
fn stop_ends_sentence(rest: &str) -> bool {
    rest.chars()
        .skip(1)
        .find(|&c| !is_closer(c))
        .is_none_or(char::is_whitespace)
}

/// Cuts a message into segments (byte ranges): sentences end at a line break, at `.`, `!`,
/// `?`, `;` followed (past closing quotes and brackets) by a space or the end, and at the
/// marks of scripts written without spaces (`。`, `！`, `？`, `；`, `…`, `؟`); clauses start at
/// one of [`CLAUSE_BREAKS`]. A segment that holds no word is dropped, so a message yields
/// its requests one by one.
pub(crate) fn segments(message: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let push = |range: Range<usize>, out: &mut Vec<Range<usize>>| {
        if message[range.clone()].chars().any(char::is_alphanumeric) {
            out.push(range);
        }
    };
    // Sentences first.
    let mut sentences = Vec::new();
    for (i, c) in message.char_indices() {
        let ends =
            is_line_break(c) || is_stop_without_space(c) || (is_stop(c) && stop_ends_sentence(&message[i..]));
        if ends {
            let end = i + c.len_utf8();
            push(start..end, &mut sentences);
            start = end;
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

/// A message cut for routing: its segments (as [`segments`] cuts them), each with its words
/// (as [`for_each_word`] yields them on the segment's text), lowercased back to back into one
/// buffer. Reused between messages, so analysing one allocates nothing once warm.
#[derive(Debug, Default)]
pub(crate) struct Segmented {
    /// The lowercased words, back to back.
    text: String,
    /// Per word: its span in the message, and where its lowercase form is in `text`.
    words: Vec<(Range<usize>, Range<usize>)>,
    /// Per segment that holds a word: the range of its words in `words`.
    segments: Vec<Range<usize>>,
}

impl Segmented {
    /// Cuts `message` into segments and words, replacing what was there.
    pub(crate) fn analyse(&mut self, message: &str) {
        self.text.clear();
        self.words.clear();
        self.segments.clear();
        // The lowercase words take at most the message's bytes (for ASCII); English words
        // average about six bytes with their space.
        self.text.reserve(message.len());
        self.words.reserve(message.len() / 6 + 1);
        if message.is_ascii() {
            self.analyse_ascii(message);
        } else {
            let mut buf = String::new();
            for segment in segments(message) {
                let first = self.words.len();
                for_each_word(&message[segment.clone()], &mut buf, |span, w| {
                    let at = self.text.len();
                    self.text.push_str(w);
                    self.words.push((
                        segment.start + span.start..segment.start + span.end,
                        at..self.text.len(),
                    ));
                });
                self.close_segment(first);
            }
        }
    }

    /// The bytes held for the lowercase words.
    pub(crate) fn capacity(&self) -> usize {
        self.text.capacity()
    }

    /// How many segments the message has.
    pub(crate) fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The words of segment `s`: each one's span in the message and its lowercase form.
    pub(crate) fn segment_words(&self, s: usize) -> impl Iterator<Item = (Range<usize>, &str)> {
        self.words[self.segments[s].clone()]
            .iter()
            .map(|(span, at)| (span.clone(), &self.text[at.clone()]))
    }

    /// Appends an ASCII word found at `start` in the message.
    fn push_ascii(&mut self, start: usize, word: &str) {
        let at = self.text.len();
        self.text.push_str(word);
        self.text[at..].make_ascii_lowercase();
        self.words.push((start..start + word.len(), at..self.text.len()));
    }

    /// Ends the segment whose first word is `first`: kept when it holds a word.
    fn close_segment(&mut self, first: usize) {
        if self.words.len() > first {
            self.segments.push(first..self.words.len());
        }
    }

    /// One pass over an ASCII message. For ASCII, UAX #29 words are the runs of letters,
    /// digits and `_` that hold a letter or digit, joined across one `'`, `.` or `:` between
    /// two letters and across one `'`, `.`, `,` or `;` between two digits (WB5-WB13b; the
    /// rules unicode-segmentation's own ASCII path implements). A sentence or clause cut
    /// never falls inside such a run nor next to a joining mark (a sentence mark is followed
    /// by a space, a line break or a closing quote or bracket, a clause starts at a word), so
    /// the words of a segment are
    /// the message's words inside it, and one pass yields what cutting first and splitting
    /// each segment yields. A word's parts between underscores are its words, as in
    /// [`for_each_word`].
    fn analyse_ascii(&mut self, message: &str) {
        let bytes = message.as_bytes();
        let len = bytes.len();
        let core = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        let joins = |b: u8, prev: u8, next: u8| match b {
            b'\'' | b'.' | b':' if prev.is_ascii_alphabetic() && next.is_ascii_alphabetic() => true,
            b'\'' | b'.' | b',' | b';' if prev.is_ascii_digit() && next.is_ascii_digit() => true,
            _ => false,
        };
        let mut first = 0;
        let mut i = 0;
        while i < len {
            let b = bytes[i];
            if core(b) {
                let start = i;
                let mut alphanumeric = b != b'_';
                let mut underscore = b == b'_';
                i += 1;
                while i < len {
                    let c = bytes[i];
                    if core(c) {
                        alphanumeric |= c != b'_';
                        underscore |= c == b'_';
                    } else if !(i + 1 < len && joins(c, bytes[i - 1], bytes[i + 1])) {
                        break;
                    }
                    i += 1;
                }
                if !alphanumeric {
                    continue;
                }
                let raw = &message[start..i];
                // A clause starts at a break word once the clause holds a word.
                if self.words.len() > first && CLAUSE_BREAKS.iter().any(|w| raw.eq_ignore_ascii_case(w)) {
                    self.close_segment(first);
                    first = self.words.len();
                }
                let word = raw.strip_suffix("'s").unwrap_or(raw);
                if underscore {
                    for (start, part) in parts(start, word) {
                        self.push_ascii(start, part);
                    }
                } else {
                    self.push_ascii(start, word);
                }
                continue;
            }
            // As [`segments`] ends a sentence (an ASCII message holds no other marks).
            if matches!(b, b'\n' | b'\r') || (is_stop(b as char) && stop_ends_sentence(&message[i..])) {
                self.close_segment(first);
                first = self.words.len();
            }
            i += 1;
        }
        self.close_segment(first);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comma_beside_a_word_is_found_past_spaces_and_symbols_only() {
        // (text after a word, text before the next one, a comma between them)
        let cases: &[(&str, &str, bool)] = &[
            (", pause", "pause, ", true),
            (" , pause", "pause ,  ", true),
            ("\u{ff0c}pause", "pause\u{3001}", true),
            (" \u{1f64f}, pause", "pause \u{1f3ac}, ", true),
            (" pause", "pause ", false),
            ("", "", false),
            (" a, b", "a, b ", false),
            (". pause", "pause. ", false),
        ];
        for &(after, before, comma) in cases {
            assert_eq!(comma_follows(after), comma, "after {after:?}");
            assert_eq!(comma_precedes(before), comma, "before {before:?}");
        }
    }

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
            (
                "call get_Weather_ or __init__",
                &["call", "get", "weather", "or", "init"],
            ),
            ("the user_name's row", &["the", "user", "name", "row"]),
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
            // Han characters are words of their own; a lone Latin letter is not.
            ("请重启容器 a", &["请", "重", "启", "容", "器"]),
        ];
        for (text, want) in cases {
            assert_eq!(&a.stems(text), want, "{text}");
        }
    }

    /// A message's segments and words as [`segments`] and [`for_each_word`] give them, one
    /// Unicode pass per sentence and per segment. With `unicode_path`, a non-ASCII word is
    /// appended after a space (and its words dropped again), so unicode-segmentation takes its
    /// general Unicode path even for an ASCII message.
    fn reference(message: &str, unicode_path: bool) -> Vec<Vec<(Range<usize>, String)>> {
        let text = if unicode_path {
            format!("{message} \u{e9}")
        } else {
            message.to_string()
        };
        segments(&text)
            .into_iter()
            .map(|segment| {
                let mut words = Vec::new();
                for_each_word(&text[segment.clone()], &mut String::new(), |span, w| {
                    let span = segment.start + span.start..segment.start + span.end;
                    if span.end <= message.len() {
                        words.push((span, w.to_string()));
                    }
                });
                words
            })
            .filter(|words| !words.is_empty())
            .collect()
    }

    /// What [`Segmented::analyse`] gives, in the same shape.
    fn one_pass(message: &str) -> Vec<Vec<(Range<usize>, String)>> {
        let mut s = Segmented::default();
        s.analyse(message);
        (0..s.segment_count())
            .map(|i| {
                s.segment_words(i)
                    .map(|(span, w)| (span, w.to_string()))
                    .collect()
            })
            .collect()
    }

    /// Inputs that exercise the word rules (apostrophes, hyphens, digits, underscores, URLs,
    /// mixed case, joining marks at word and message ends) and the segment rules.
    const TRICKY: &[&str] = &[
        "",
        " ",
        "...",
        "Turn OFF the lights!",
        "Jellyfin's library and the NAS's disks; JELLYFIN'S too",
        "don't stop, don't STOP, o'clock, 'quoted' and rock 'n' roll",
        "pi-hole, 3.5 GB at 10:30; e-mail user_name@example.com",
        "see https://www.example.com/a_b/c.html?x=1&y=2#top now",
        "v1.2.3 and 1,000,000.50 or 1'000 and 3;4 plus 3; 4 and a;b",
        "e.g. i.e. U.S.A. then a.b.c and a..b, a:b:c, a::b, 12:30:45",
        "__init__ ___ _a a_ _1 1_ a_1 1_a snake_case CamelCase",
        "abc123 123abc a1.5 1.a a.1 1'a a'1 a'b' 'a 'a' end'",
        "Back up the VM, then snapshot it; also ping me\nAND then? Finally!",
        "and and and. Then then\n\nalso plus afterwards finally",
        "first line\nsecond line\r\nthird\tline\x0bfourth\x0cfifth",
        "x.\ny!\tz?  w;\u{20}v",
        "Say \"stop.\" Then (go!) and 'wait.' [done.]\x0bnext.\rlast",
        "AND the ANDROID handles Andes; Thence also-ran",
        "hello world's end's",
        "trailing joiners: a. a' a: 1, 1; 1. 1'",
        "caf\u{e9} na\u{ef}ve \u{130}stanbul, don\u{2019}t and the NAS\u{2019}s disks",
        "emoji \u{1f600} and \u{1f1e9}\u{1f1ea} flags then \u{65e5}\u{672c}\u{8a9e}",
        "Spiel das H\u{d6}RBUCH \u{fc}ber \u{39f}\u{394}\u{3a5}\u{3a3}\u{3a3}\u{395}\u{391}\u{3a3}",
    ];

    #[test]
    fn one_pass_analysis_equals_cutting_then_splitting() {
        for message in TRICKY {
            assert_eq!(one_pass(message), reference(message, false), "{message:?}");
        }
    }

    #[test]
    fn the_ascii_pass_equals_the_unicode_rules() {
        for message in TRICKY.iter().filter(|m| m.is_ascii()) {
            assert_eq!(one_pass(message), reference(message, true), "{message:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]
        #[test]
        fn random_ascii_messages_analyse_as_the_unicode_rules_do(
            pieces in proptest::collection::vec(
                proptest::sample::select(&[
                    "a", "Z", "ab", "1", "42", "_", "'", ".", ":", ",", ";", "!", "?", " ", "  ",
                    "\n", "\r", "\t", "\x0b", "-", "/", "\"", ")", "]", "and", "AND", "then", "Also", "plus",
                    "finally", "afterwards", "'s", "'S", "s", "x1", "3.5", "e.g", "@", "#",
                ][..]),
                0..40,
            )
        ) {
            let message: String = pieces.concat();
            proptest::prop_assert_eq!(one_pass(&message), reference(&message, false));
            proptest::prop_assert_eq!(one_pass(&message), reference(&message, true));
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
            // Past closing quotes and brackets; any white space after the mark.
            (
                "Say \"reboot the node.\" What is playing?",
                &["Say \"reboot the node.", "\" What is playing?"],
            ),
            ("(reboot it.) Play", &["(reboot it.", ") Play"]),
            ("reboot.\u{a0}play", &["reboot.", "\u{a0}play"]),
            // Every line break; marks written without a space after them.
            ("reboot\rplay", &["reboot\r", "play"]),
            (
                "reboot\u{2028}play\u{85}pause",
                &["reboot\u{2028}", "play\u{85}", "pause"],
            ),
            (
                "reboot the node\u{3002}what is playing",
                &["reboot the node\u{3002}", "what is playing"],
            ),
            (
                "pause\u{ff01}play\u{ff1f}stop\u{ff1b}go",
                &["pause\u{ff01}", "play\u{ff1f}", "stop\u{ff1b}", "go"],
            ),
            ("reboot\u{2026} what", &["reboot\u{2026}", " what"]),
            // Not inside a number, an abbreviation or an address.
            (
                "Set 3.5 e.g. example.com/a.b now",
                &["Set 3.5 e.g.", " example.com/a.b now"],
            ),
        ];
        for (message, want) in cases {
            let got: Vec<&str> = segments(message).into_iter().map(|r| &message[r]).collect();
            assert_eq!(&got, want, "{message:?}");
        }
    }
}
