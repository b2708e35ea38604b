//! The answers whose tools are written from bytes encoded once per registry, and the
//! server's side of the generated gRPC code, which sends them.
//!
//! A `Route` or `ListAllTools` answer is mostly tools. Built as `proto` messages, every
//! answer would copy each tool's strings into new ones and prost would copy them again into
//! the frame. A [`Spliced`] answer holds the message's other fields, plus the tools as
//! shared slices of the registry's renders ([`crate::render::Encoded`] for native `Tool`
//! messages, [`crate::render::Rendered`] for `tools_json`), and writes those slices straight
//! into the frame: one copy. Protobuf lets a message's fields come in any order and a
//! repeated field's entries be spread out, so the result decodes as the plain message.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType, encode_key, encode_varint, encoded_len_varint, key_len};

use crate::proto;
use crate::render::{array_len, write_array};

/// The generated server trait (`ToolRouter`) and service (`ToolRouterServer`): requests are
/// the `proto` messages, `RouteResponse` and `ListAllToolsResponse` the ones below.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod server {
    include!(concat!(env!("OUT_DIR"), "/server/toolrouter.v1.rs"));
}

pub use server::tool_router_server;

/// `Route`'s answer as it goes on the wire.
pub type RouteResponse = Spliced<proto::RouteResponse>;

/// `ListAllTools`' answer as it goes on the wire.
pub type ListAllToolsResponse = Spliced<proto::ListAllToolsResponse>;

/// The field number of `tools_json` in `RouteResponse` (its `tools` are field
/// [`crate::render::Encoded::FIELD`]).
pub const ROUTE_TOOLS_JSON: u32 = 5;

/// The field number of `tools_json` in `ListAllToolsResponse` (its `tools` are field
/// [`crate::render::Encoded::FIELD`]).
pub const LIST_ALL_TOOLS_JSON: u32 = 4;

/// The field number of `domains` in `RouteResponse`.
pub const ROUTE_DOMAINS: u32 = 2;

/// One `DomainDecision` of a `Route` answer, as borrowed values (the fields of
/// `proto::DomainDecision`).
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct Decision<'a, K> {
    pub domain: &'a str,
    pub reason: proto::Reason,
    /// `matched_keywords`, in order.
    pub matched_keywords: K,
    pub matched_terms: &'a [String],
    pub score: f32,
    pub tokens: u32,
}

impl<'a, K: Iterator<Item = &'a str> + Clone> Decision<'a, K> {
    /// Appends the decision to `buf` as an entry of `RouteResponse.domains`: the bytes prost
    /// writes for the `proto::DomainDecision` with these values, without building one (a
    /// fallback answer has a decision per domain, each a name that would be copied into a new
    /// string and then into the frame).
    pub fn put(&self, buf: &mut impl BufMut) {
        let reason = i32::from(self.reason);
        let string_len = |tag: u32, s: &str| key_len(tag) + encoded_len_varint(s.len() as u64) + s.len();
        let mut len = 0;
        if !self.domain.is_empty() {
            len += string_len(1, self.domain);
        }
        if reason != 0 {
            len += key_len(2) + encoded_len_varint(i64::from(reason) as u64);
        }
        len += self
            .matched_keywords
            .clone()
            .map(|k| string_len(3, k))
            .sum::<usize>();
        len += self.matched_terms.iter().map(|t| string_len(4, t)).sum::<usize>();
        if self.score != 0.0 {
            len += key_len(5) + 4;
        }
        if self.tokens != 0 {
            len += key_len(6) + encoded_len_varint(u64::from(self.tokens));
        }
        encode_key(ROUTE_DOMAINS, WireType::LengthDelimited, buf);
        encode_varint(len as u64, buf);
        fn put_string(tag: u32, s: &str, buf: &mut impl BufMut) {
            encode_key(tag, WireType::LengthDelimited, buf);
            encode_varint(s.len() as u64, buf);
            buf.put_slice(s.as_bytes());
        }
        if !self.domain.is_empty() {
            put_string(1, self.domain, buf);
        }
        if reason != 0 {
            encode_key(2, WireType::Varint, buf);
            encode_varint(i64::from(reason) as u64, buf);
        }
        for k in self.matched_keywords.clone() {
            put_string(3, k, buf);
        }
        for t in self.matched_terms {
            put_string(4, t, buf);
        }
        if self.score != 0.0 {
            encode_key(5, WireType::ThirtyTwoBit, buf);
            buf.put_f32_le(self.score);
        }
        if self.tokens != 0 {
            encode_key(6, WireType::Varint, buf);
            encode_varint(u64::from(self.tokens), buf);
        }
    }
}

/// A message followed by fields encoded ahead of time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Spliced<M> {
    /// The fields built for this answer.
    pub message: M,
    /// Field entries (key, length, value) encoded ahead of time, written as they are.
    entries: Vec<Bytes>,
    /// A bytes field holding a JSON array of pieces, each a run of values followed by a
    /// comma (see [`write_array`]): the field's number and the pieces.
    array: Option<(u32, Vec<Bytes>)>,
}

impl<M> Spliced<M> {
    /// `message` alone.
    pub fn new(message: M) -> Spliced<M> {
        Spliced {
            message,
            entries: Vec::new(),
            array: None,
        }
    }

    /// Adds field entries encoded ahead of time (whole entries: key, length, value), after
    /// the message's own. Entries of a repeated field follow the message's own entries of it.
    #[must_use]
    pub fn with_entries(mut self, entries: Vec<Bytes>) -> Spliced<M> {
        self.entries = entries;
        self
    }

    /// Adds one more field entry encoded ahead of time (see [`Spliced::with_entries`]).
    #[must_use]
    pub fn and_entry(mut self, entry: Bytes) -> Spliced<M> {
        self.entries.push(entry);
        self
    }

    /// Sets bytes field `field` to the JSON array of `pieces`. The message's own value of
    /// that field must be empty.
    #[must_use]
    pub fn with_array(mut self, field: u32, pieces: Vec<Bytes>) -> Spliced<M> {
        self.array = Some((field, pieces));
        self
    }

    fn spliced_len(&self) -> usize {
        let entries: usize = self.entries.iter().map(Bytes::len).sum();
        let array = self.array.as_ref().map_or(0, |(field, pieces)| {
            let n = array_len(pieces);
            key_len(*field) + encoded_len_varint(n as u64) + n
        });
        entries + array
    }
}

impl<M: prost::Message> prost::Message for Spliced<M> {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.message.encode_raw(buf);
        for e in &self.entries {
            buf.put_slice(e);
        }
        if let Some((field, pieces)) = &self.array {
            encode_key(*field, WireType::LengthDelimited, buf);
            encode_varint(array_len(pieces) as u64, buf);
            write_array(pieces, buf);
        }
    }

    /// Decoding reads every field into the message (the spliced fields are the message's).
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        self.message.merge_field(tag, wire_type, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.message.encoded_len() + self.spliced_len()
    }

    fn clear(&mut self) {
        self.message.clear();
        self.entries.clear();
        self.array = None;
    }
}

#[cfg(test)]
mod tests;
