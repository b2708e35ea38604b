//! Exact token counts with the `o200k_base` encoding (GPT-4o and later), through the
//! `bpe-openai` crate's tokenizer: measured on the seal registry's 4,076 tools rendered in
//! the OpenAI chat format (697 KB), it counted them in 21–34 ms against `tiktoken-rs`'s
//! 30 ms, and built its tokenizer in 69 ms against 130–160 ms (same counts, 142,545 tokens).
//!
//! The tokenizer is built from a table of the encoding. `bpe-openai` keeps a 32 MB one inside
//! its private static, so the table's pages would stay resident for the life of the process;
//! `build.rs` writes the same table without what counting never reads (14.6 MB; the token
//! bytes, the bytes-to-token map and the two overlapping-match automata, which serve encoding
//! and decoding), and this module releases the table's pages once the tokenizer is built
//! from it. So this tokenizer only counts. The pre-tokenization patterns are `bpe-openai`'s
//! for `o200k_base`; the tests check that both tokenizers count alike.

use std::sync::LazyLock;

use bpe_openai::Tokenizer;
use bpe_openai::byte_pair_encoding::BytePairEncoding;

/// The encoding's table, serialized by `build.rs`.
static TABLE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/o200k_base.bpe"));

/// `o200k_base`'s main pre-tokenization pattern, as `bpe-openai` writes it (its
/// alternatives one per line here).
const MAIN_PATTERN: &str = concat!(
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|\\p{N}{1,3}",
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*",
    "|\\s*[\\r\\n]+",
    "|\\s+$",
);

static O200K_BASE: LazyLock<Tokenizer> = LazyLock::new(|| {
    // The table is this crate's own build output: if it does not decode, the build is broken.
    let bpe: BytePairEncoding =
        rmp_serde::from_slice(TABLE).expect("build.rs wrote a valid o200k_base table");
    release(TABLE);
    // The main pattern, then the look-ahead one that stands for `\s+(?!\S)`, then plain
    // whitespace.
    let patterns = [(MAIN_PATTERN, false), ("\\s+\\s", true), ("\\s+", false)];
    Tokenizer::new_lookahead(bpe, &patterns, false).expect("bpe-openai's o200k_base patterns compile")
});

/// Tells the kernel the table's pages are not needed: they are read once, to build the
/// tokenizer (which copies what it keeps), and are clean pages of the executable, so the
/// kernel drops them from memory and would read them back from the file if ever touched.
fn release(table: &'static [u8]) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let start = (table.as_ptr() as usize).next_multiple_of(page);
        let end = (table.as_ptr() as usize + table.len()) / page * page;
        if end > start {
            // SAFETY: the range lies inside `table`, a read-only static of the executable's
            // file mapping: dropping its pages changes no contents, a later read refaults
            // them from the file. madvise only advises; its result is not needed.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = table;
}

/// The tokens of `text` in the `o200k_base` encoding. The first call builds the tokenizer
/// (about 70 ms); [`warm_up`] does that ahead of time.
pub fn count(text: &str) -> usize {
    O200K_BASE.count(text)
}

/// Builds the tokenizer now, so a later first count does not wait for it (the daemon calls
/// this on a thread while it reads its manifests).
pub fn warm_up() {
    LazyLock::force(&O200K_BASE);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same counts as `bpe-openai`'s own `o200k_base` on text of every kind the
    /// patterns tell apart (cases, contractions, digits, punctuation, newlines, trailing
    /// and repeated whitespace, non-Latin scripts, combining marks, emoji).
    #[test]
    fn counts_as_bpe_openai_does() {
        let texts = [
            "",
            "hello world",
            "Hello World HELLO wORLD",
            "It's they'll we'd I'M you're",
            "1234567 3.14159 2026-11-24",
            "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}",
            "line one\nline two\r\n\n  indented\t\ttabs   ",
            "trailing spaces   ",
            "  leading",
            "Grüße, naïve café — déjà vu",
            "日本語のテキストと中文文本",
            "e\u{301}t\u{e9} \u{1f600}\u{1f680} done",
            "path/to/file.rs::main() -> Result<(), Box<dyn Error>>",
        ];
        let theirs = bpe_openai::o200k_base();
        for t in texts {
            assert_eq!(count(t), theirs.count(t), "{t:?}");
        }
    }

    /// The same counts on every tool of the demo registry in every format, the text the
    /// daemon counts (about 100,000 tokens).
    #[test]
    fn counts_rendered_tools_as_bpe_openai_does() {
        use crate::render::{Format, Rendered};
        let registry = crate::registry::Registry::demo();
        let tools = || registry.domains().iter().flat_map(|d| &d.tools);
        let theirs = bpe_openai::o200k_base();
        let mut text = Vec::new();
        for format in Format::ALL {
            text.extend_from_slice(&Rendered::new(tools(), format).all());
        }
        let text = String::from_utf8(text).unwrap();
        assert!(count(&text) > 50_000);
        for piece in text.split_inclusive('}') {
            assert_eq!(count(piece), theirs.count(piece), "{piece:?}");
        }
        assert_eq!(count(&text), theirs.count(text.as_str()));
    }

    proptest::proptest! {
        /// The same counts on any text: ASCII words and symbols, Latin and other scripts,
        /// whitespace runs, digits, emoji.
        #[test]
        fn counts_any_text_as_bpe_openai_does(text in "(\\PC|[ \\t\\n]|[a-z]{1,8}|[0-9]{1,5}|[\\u{100}-\\u{2fff}]|[\\u{1f300}-\\u{1f6ff}]){0,64}") {
            proptest::prop_assert_eq!(count(&text), bpe_openai::o200k_base().count(text.as_str()));
        }
    }
}
