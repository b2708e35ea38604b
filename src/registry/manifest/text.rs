//! Reading manifest text: JSON with duplicate object keys refused, and parser positions as
//! 1-based line and character column.

use serde_json::{Map, Value};

/// How a duplicate key in a JSON object is reported (serde_json alone keeps the last one
/// silently, so a repeated `"keywords"` would drop the first list unseen).
pub(super) const DUPLICATE_KEY: &str = "duplicate key";

/// A JSON value read with duplicate object keys refused, each reported at its line:column.
pub(super) struct Strict(pub(super) Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Strict, E> {
        Ok(Strict(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Strict, E> {
        Ok(Strict(Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Strict, E> {
        Ok(Strict(Value::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Strict, E> {
        Ok(Strict(
            serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
        ))
    }
    fn visit_str<E>(self, v: &str) -> Result<Strict, E> {
        Ok(Strict(Value::String(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<Strict, E> {
        Ok(Strict(Value::String(v)))
    }
    fn visit_unit<E>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Strict(Value::Array(items)))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        let mut obj = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if obj.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "{DUPLICATE_KEY} `{key}` in a JSON object"
                )));
            }
            let Strict(v) = map.next_value()?;
            obj.insert(key, v);
        }
        Ok(Strict(Value::Object(obj)))
    }
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
