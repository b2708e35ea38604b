//! The automaton floor of the route bench: a bare overlapping scan of a [`Matcher`]'s
//! automaton, without the word rule or anything else `route()` does, over the message
//! prepared as `Matcher::find` prepares it.

use std::borrow::Cow;

use aho_corasick::Input;
use aho_corasick::automaton::Automaton as _;
use toolrouter::matcher::Matcher;

/// How many raw automaton matches `message` has. The automaton is ASCII case-insensitive,
/// so an ASCII message is scanned as it is and any other lowercased first, as `find` does.
pub fn scan(matcher: &Matcher, message: &str) -> usize {
    let Some(automaton) = matcher.automaton() else {
        return 0;
    };
    let text = if message.is_ascii() {
        Cow::Borrowed(message)
    } else {
        Cow::Owned(message.to_lowercase())
    };
    // Built for unanchored overlapping search, so the iterator is always there.
    automaton
        .try_find_overlapping_iter(Input::new(text.as_ref()))
        .map_or(0, Iterator::count)
}

#[cfg(test)]
mod tests {
    use toolrouter::matcher::MatchMode;

    use super::*;

    #[test]
    fn the_scan_counts_every_raw_match_whatever_the_case() {
        let m = Matcher::new(["light"], MatchMode::Word).unwrap();
        assert_eq!(scan(&m, "highlight the LIGHT"), 2);
        let m = Matcher::new(["hörbuch"], MatchMode::Word).unwrap();
        assert_eq!(scan(&m, "HÖRBUCH"), 1);
        let none = Matcher::new(std::iter::empty::<&str>(), MatchMode::Word).unwrap();
        assert_eq!(scan(&none, "anything"), 0);
    }
}
