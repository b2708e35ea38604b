//! The log formats: one line per event, lists as JSON.

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Fields logged as JSON text (lists). The text log format shows that text
/// (`domains=["system:core","docker:keyword"]`); [`JsonLogFormat`] embeds it as a JSON value,
/// so a list field is a real JSON array, not a string.
pub(crate) const JSON_VALUED_FIELDS: &[&str] = &["domains", "groups", "manifests"];

/// The `--log-format json` event format: tracing-subscriber's JSON format (`F`), with the
/// fields in [`JSON_VALUED_FIELDS`] embedded as JSON values instead of strings. Events
/// without such a field are written by `F` untouched.
///
/// The call log's own events (this module's, outside any span, the common case: one per
/// call) are written directly in `F`'s shape, the JSON text copied in as it is: going through
/// `F` escapes a fallback answer's few kilobytes of domains into a string only to parse them
/// back out, which cost more than the rest of the call's logging.
pub(crate) struct JsonLogFormat<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for JsonLogFormat<F>
where
    F: FormatEvent<S, N>,
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let fields = event.metadata().fields();
        if !JSON_VALUED_FIELDS.iter().any(|name| fields.field(name).is_some()) {
            return self.0.format_event(ctx, writer, event);
        }
        let in_span = event.parent().is_some() || ctx.lookup_current().is_some();
        if event.metadata().target() == super::call_log::TARGET && !in_span {
            return write_call_line(&mut writer, event);
        }
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        for name in JSON_VALUED_FIELDS {
            embed_json_field(&mut line, name);
        }
        writer.write_str(&line)
    }
}

/// The `--log-format text` event format: tracing-subscriber's text format (`F`, which
/// decides on colour itself), with the line breaks an event's fields hold written as `\n`
/// and `\r`, so that one event is one line (SPEC §11) whatever it carries (the problems of
/// a refused manifest, one per line in the caller's status, as a failed call's cause). An
/// event without one is written exactly as `F` writes it.
pub(crate) struct TextLogFormat<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for TextLogFormat<F>
where
    F: FormatEvent<S, N>,
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut line = OneLine {
            inner: &mut writer,
            held: false,
        };
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        if line.held {
            writer.write_char('\n')?;
        }
        Ok(())
    }
}

/// Writes through to `inner` with every `\r` and every `\n` but the last escaped: a
/// trailing `\n` is held back until more text follows it (then escaped) or the event ends
/// (then written).
struct OneLine<'a, 'w> {
    inner: &'a mut Writer<'w>,
    held: bool,
}

impl std::fmt::Write for OneLine<'_, '_> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        if text.is_empty() {
            return Ok(());
        }
        if std::mem::take(&mut self.held) {
            self.inner.write_str("\\n")?;
        }
        let (mut rest, held) = match text.strip_suffix('\n') {
            Some(body) => (body, true),
            None => (text, false),
        };
        while let Some(at) = memchr::memchr2(b'\n', b'\r', rest.as_bytes()) {
            self.inner.write_str(&rest[..at])?;
            self.inner.write_str(if rest.as_bytes()[at] == b'\n' {
                "\\n"
            } else {
                "\\r"
            })?;
            rest = &rest[at + 1..];
        }
        self.inner.write_str(rest)?;
        self.held = held;
        Ok(())
    }
}

/// One event as tracing-subscriber's JSON format writes an event outside any span
/// (`timestamp`, `level`, `fields` in the event's order, `target`), with the fields in
/// [`JSON_VALUED_FIELDS`] copied in as the JSON text this module wrote for them.
fn write_call_line(writer: &mut Writer<'_>, event: &tracing::Event<'_>) -> std::fmt::Result {
    use tracing_subscriber::fmt::time::FormatTime as _;
    let mut line = String::with_capacity(512);
    line.push_str("{\"timestamp\":\"");
    tracing_subscriber::fmt::time::SystemTime.format_time(&mut Writer::new(&mut line))?;
    line.push_str("\",\"level\":\"");
    line.push_str(event.metadata().level().as_str());
    line.push_str("\",\"fields\":{");
    let mut fields = JsonFields {
        line,
        first: true,
        scratch: String::new(),
    };
    event.record(&mut fields);
    let mut line = fields.line;
    line.push_str("},\"target\":");
    push_json_str(&mut line, event.metadata().target());
    line.push_str("}\n");
    writer.write_str(&line)
}

/// Writes an event's fields as JSON members, as `tracing_serde` does: strings, numbers and
/// booleans as themselves, anything else as its `Debug` text.
struct JsonFields {
    line: String,
    first: bool,
    scratch: String,
}

impl JsonFields {
    fn key(&mut self, field: &tracing::field::Field) {
        if !std::mem::take(&mut self.first) {
            self.line.push(',');
        }
        push_json_str(&mut self.line, field.name());
        self.line.push(':');
    }

    fn integer(&mut self, field: &tracing::field::Field, value: impl std::fmt::Display) {
        use std::fmt::Write as _;
        self.key(field);
        let _ = write!(self.line, "{value}");
    }
}

impl tracing::field::Visit for JsonFields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        self.key(field);
        if JSON_VALUED_FIELDS.contains(&field.name()) {
            // JSON text already: written into the line as it is.
            let _ = write!(self.line, "{value:?}");
        } else {
            self.scratch.clear();
            let _ = write!(self.scratch, "{value:?}");
            push_json_str(&mut self.line, &self.scratch);
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.key(field);
        push_json_str(&mut self.line, value);
    }

    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.key(field);
        // As serde_json writes it (shortest round trip; `null` when not finite).
        self.line
            .push_str(&serde_json::to_string(&value).unwrap_or_default());
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.integer(field, value);
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.integer(field, value);
    }

    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.key(field);
        self.line.push_str(if value { "true" } else { "false" });
    }
}

/// Whether `text` needs no escaping inside a JSON string.
pub(super) fn is_plain(text: &str) -> bool {
    text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\')
}

/// Appends `text` as a JSON string.
pub(super) fn push_json_str(out: &mut String, text: &str) {
    if is_plain(text) {
        out.push('"');
        out.push_str(text);
        out.push('"');
    } else {
        // A string always serializes.
        out.push_str(&serde_json::to_string(text).unwrap_or_default());
    }
}

/// Replaces the string value of field `name` in the JSON `line` by the JSON text it holds,
/// when it holds JSON. Inside a JSON string every `"` is escaped, so `"name":` occurs only
/// where the field's key is (under "fields", or at the top level when flattened).
fn embed_json_field(line: &mut String, name: &str) {
    let key = format!("\"{name}\":");
    let Some(at) = line.find(&key) else { return };
    let start = at + key.len();
    let mut values = serde_json::Deserializer::from_str(&line[start..]).into_iter::<String>();
    let Some(Ok(text)) = values.next() else { return };
    let end = start + values.byte_offset();
    if serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok() {
        line.replace_range(start..end, &text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::tests::Captured;

    #[test]
    fn a_json_valued_field_is_embedded_where_its_key_is_and_nowhere_else() {
        let cases = [
            // Under "fields", and flattened at the top level.
            (
                r#"{"level":"INFO","fields":{"message":"call","domains":"[\"a:core\",\"b:fallback\"]","tools":3}}"#,
                r#"{"level":"INFO","fields":{"message":"call","domains":["a:core","b:fallback"],"tools":3}}"#,
            ),
            (r#"{"domains":"[]","x":1}"#, r#"{"domains":[],"x":1}"#),
            // A string that is not JSON stays a string.
            (
                r#"{"domains":"not json","x":1}"#,
                r#"{"domains":"not json","x":1}"#,
            ),
            // The key's text inside another value is escaped there, so it is not the key.
            (
                r#"{"cause":"bad \"domains\":\"[1]\"","domains":"[2]"}"#,
                r#"{"cause":"bad \"domains\":\"[1]\"","domains":[2]}"#,
            ),
            // No such field, or not a string: unchanged.
            (
                r#"{"fields":{"message":"call"}}"#,
                r#"{"fields":{"message":"call"}}"#,
            ),
            (r#"{"domains":7}"#, r#"{"domains":7}"#),
        ];
        for (line, want) in cases {
            let mut got = line.to_string();
            embed_json_field(&mut got, "domains");
            assert_eq!(got, want, "{line}");
            serde_json::from_str::<serde_json::Value>(&got).unwrap();
        }
    }

    /// The lines one `event` gives with `--log-format json`'s event format and with
    /// tracing-subscriber's own JSON format (the reference), timestamps blanked.
    fn json_lines(event: impl Fn()) -> (String, String) {
        let blank_time = |buf: &Captured| {
            let text = buf.text();
            let at = text.find("\",\"level\"").unwrap();
            format!("{{\"timestamp\":\"T{}", &text[at..])
        };
        let (ours, reference) = (Captured::default(), Captured::default());
        let w = ours.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .event_format(JsonLogFormat(tracing_subscriber::fmt::format().json()))
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, &event);
        let w = reference.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, &event);
        (blank_time(&ours), blank_time(&reference))
    }

    #[test]
    fn the_call_line_is_the_json_format_with_its_list_embedded() {
        let domains = r#"["a:core","b\"x:fallback"]"#;
        let (ours, reference) = json_lines(|| {
            // The call log's target, as its events in `Logged` have.
            tracing::info!(
                target: "toolrouter::telemetry",
                method = %"Route",
                code = "OK",
                latency_ms = 0.25,
                big = 1e300,
                nan = f64::NAN,
                conversation = "tab\there \"quoted\" \\ é",
                tools = 3u64,
                below = -3i64,
                domains = %domains,
                fallback = false,
                cause = ?Some("debug"),
                "call"
            );
        });
        let mut want = reference.clone();
        embed_json_field(&mut want, "domains");
        assert_eq!(ours, want);
        assert!(ours.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(&ours).unwrap();
        assert_eq!(v["fields"]["domains"][1], "b\"x:fallback");
        assert_eq!(v["fields"]["nan"], serde_json::Value::Null);

        // Inside a span the reference format writes the span too; the embedding still holds.
        let (ours, reference) = json_lines(|| {
            let span = tracing::info_span!("outer", id = 7);
            let _entered = span.enter();
            tracing::info!(target: "toolrouter::telemetry", domains = %"[]", "call");
        });
        let mut want = reference;
        embed_json_field(&mut want, "domains");
        assert_eq!(ours, want);
        assert!(ours.contains(r#""spans":[{"id":7,"name":"outer"}]"#), "{ours}");
    }

    /// The text one `event` gives with `--log-format text`'s event format and with
    /// tracing-subscriber's own, timestamps left out, with colour codes or without.
    fn text_lines(ansi: bool, event: impl Fn()) -> (String, String) {
        let (ours, reference) = (Captured::default(), Captured::default());
        let w = ours.clone();
        let subscriber = tracing_subscriber::fmt()
            .event_format(TextLogFormat(
                tracing_subscriber::fmt::format().without_time().with_ansi(ansi),
            ))
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, &event);
        let w = reference.clone();
        let subscriber = tracing_subscriber::fmt()
            .without_time()
            .with_ansi(ansi)
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, &event);
        (ours.text(), reference.text())
    }

    #[test]
    fn a_text_log_line_is_one_line_whatever_its_fields_hold() {
        // A failed call's cause listing a refused manifest's problems, one per line.
        let cause = "The domain is refused; nothing changed.\nmanifest_json:1:1: malformed JSON\r\nnext";
        let (ours, reference) = text_lines(false, || {
            tracing::warn!(method = %"UpsertDomain", cause = %cause, "call failed");
        });
        assert_eq!(reference.lines().count(), 3, "{reference}");
        assert_eq!(ours.matches('\n').count(), 1, "{ours}");
        assert!(ours.ends_with('\n'), "{ours}");
        assert!(!ours.contains('\r'), "{ours}");
        assert_eq!(
            ours,
            reference.replace("\r", "\\r").replacen('\n', "\\n", 2),
            "the same line, its breaks escaped"
        );
        // Breaks in the message, and at the end of a field's text, are escaped too.
        let (ours, _) = text_lines(false, || tracing::info!(note = %"ends\n", "two\nlines"));
        assert!(
            ours.contains("two\\nlines") && ours.contains("note=ends\\n"),
            "{ours}"
        );
        assert_eq!(ours.matches('\n').count(), 1, "{ours}");
        // In colour too: the same coloured line, its breaks escaped.
        let (ours, reference) = text_lines(true, || {
            tracing::warn!(method = %"UpsertDomain", cause = %cause, "call failed");
        });
        assert!(ours.contains('\u{1b}'), "{ours}");
        assert_eq!(ours.matches('\n').count(), 1, "{ours}");
        assert_eq!(ours, reference.replace("\r", "\\r").replacen('\n', "\\n", 2));
        // Without a break: exactly tracing-subscriber's line, in colour on a terminal too.
        for ansi in [false, true] {
            let (ours, reference) = text_lines(ansi, || {
                tracing::info!(target: "toolrouter::telemetry", method = %"Route", domains = %r#"["a:core"]"#, "call");
            });
            assert_eq!(ours, reference);
            assert_eq!(ours.contains('\u{1b}'), ansi, "{ours}");
        }
    }
}
