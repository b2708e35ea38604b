//! Reading manifest text: duplicate object keys in JSON found, and parser positions as
//! 1-based line and character column.

/// How a duplicate key in a JSON object is reported (serde_json alone keeps the last one
/// silently, so a repeated `"keywords"` would drop the first list unseen).
pub(super) const DUPLICATE_KEY: &str = "duplicate key";

/// Every object key of a JSON text that repeats an earlier key of the same object (compared
/// as decoded strings, as a parser compares them), in document order, each with the byte
/// offset of its closing quote, where a parser stops on it. A scan of the text's structure
/// only: on a text with a syntax error, what precedes the error is what it reads.
pub(super) fn duplicate_keys(text: &str) -> Vec<(usize, String)> {
    /// An open object (its keys so far, and whether a key comes next) or array.
    enum Open {
        Object(std::collections::HashSet<String>, bool),
        Array,
    }
    let bytes = text.as_bytes();
    let mut open: Vec<Open> = Vec::new();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let mut end = i + 1;
                while end < bytes.len() && bytes[end] != b'"' {
                    end += if bytes[end] == b'\\' { 2 } else { 1 };
                }
                if let Some(Open::Object(keys, key_next)) = open.last_mut()
                    && *key_next
                {
                    *key_next = false;
                    let raw = &text[i..=end.min(bytes.len() - 1)];
                    let key = serde_json::from_str::<String>(raw)
                        .unwrap_or_else(|_| raw.trim_matches('"').to_string());
                    if !keys.insert(key.clone()) {
                        out.push((end, key));
                    }
                }
                i = end;
            }
            b'{' => open.push(Open::Object(Default::default(), true)),
            b'[' => open.push(Open::Array),
            b'}' | b']' => {
                open.pop();
            }
            b',' => {
                if let Some(Open::Object(_, key_next)) = open.last_mut() {
                    *key_next = true;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// serde_json's (line, byte column) of the last byte read, as a 1-based (line, character
/// column). Column 0 means it had just read a line break: the problem is at the end of the
/// line before.
pub(super) fn json_position(text: &str, line: usize, column: usize) -> (usize, usize) {
    let lines: Vec<&str> = text.split('\n').collect();
    if column == 0 && line > 1 {
        let prev = lines
            .get(line - 2)
            .map_or(0, |l| l.trim_end_matches('\r').chars().count());
        return (line - 1, prev + 1);
    }
    let l = lines.get(line.saturating_sub(1)).copied().unwrap_or("");
    let upto = column.min(l.len());
    // Back up to a character boundary when the column falls inside a multi-byte character.
    let upto = (0..=upto).rev().find(|&i| l.is_char_boundary(i)).unwrap_or(0);
    (line, l[..upto].chars().count().max(1))
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// The byte offset of a 1-based line and character column, as [`line_col`] gives them (the
/// text's end for a place past it).
pub(super) fn byte_offset(text: &str, line: usize, column: usize) -> usize {
    let mut start = 0;
    for _ in 1..line {
        match text[start..].find('\n') {
            Some(n) => start += n + 1,
            None => return text.len(),
        }
    }
    text[start..]
        .char_indices()
        .nth(column.saturating_sub(1))
        .map_or(text.len(), |(i, _)| start + i)
}
