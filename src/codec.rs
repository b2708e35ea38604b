//! The protobuf codec of the `ToolRouter` service: tonic's prost codec, except that a request
//! that does not decode (not protobuf, a string field that is not UTF-8, a field of the
//! wrong wire type) is the caller's mistake, `INVALID_ARGUMENT` through [`Error::Decode`],
//! not `INTERNAL` (SPEC §6). A response that does not decode (the client side of the same
//! generated code) stays `INTERNAL`, as tonic reports it: that is the server's fault. Every
//! call of the service takes one request message; a body that holds more is refused the
//! same way (tonic answered the first and decoded and dropped the rest).

use std::marker::PhantomData;

use tonic::Status;
use tonic::codec::{BufferSettings, DecodeBuf, EncodeBuf};
use tonic_prost::{ProstCodec, ProstEncoder};

use crate::error::Error;

/// The transport's limit on one request. Requests over the field limits but under this one
/// are decoded and answered `INVALID_ARGUMENT` naming the field limit; larger ones are
/// refused before decoding with `RESOURCE_EXHAUSTED`.
pub(crate) const TRANSPORT_LIMIT_BYTES: usize = 4 * 1024 * 1024;

/// A [`ProstCodec`] whose request decode errors are `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct Codec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec {
            inner: ProstCodec::default(),
        }
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = Encoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        Encoder(self.inner.encoder())
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder {
            buffer_settings: BufferSettings::default(),
            decoded: false,
            _decode: PhantomData,
        }
    }
}

/// Encodes with prost, unchanged.
#[derive(Debug)]
pub struct Encoder<T>(ProstEncoder<T>);

impl<T: prost::Message> tonic::codec::Encoder for Encoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        self.0.encode(item, buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// Decodes with prost (as tonic's prost decoder does); a request that does not decode is
/// the caller's mistake.
#[derive(Debug)]
pub struct Decoder<U> {
    buffer_settings: BufferSettings,
    /// Whether it decoded a message already (one decoder reads one call's body).
    decoded: bool,
    _decode: PhantomData<U>,
}

/// What a request body with a second message is told.
const SECOND_MESSAGE: &str =
    "The request is not a gRPC message: it holds more than one message, and each call takes one.";

/// Whether `U` is a request message: the service's inputs are all named `*Request`
/// (the proto's convention), its outputs never are.
fn is_request<U>() -> bool {
    std::any::type_name::<U>().ends_with("Request")
}

impl<U: prost::Message + Default> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        if self.decoded && is_request::<U>() {
            return Err(Status::invalid_argument(SECOND_MESSAGE));
        }
        self.decoded = true;
        match U::decode(buf) {
            Ok(item) => Ok(Some(item)),
            Err(e) if is_request::<U>() => Err(Error::Decode(e).into()),
            Err(e) => Err(Status::internal(e.to_string())),
        }
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.buffer_settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_request_messages_count_as_requests() {
        assert!(is_request::<crate::proto::RouteRequest>());
        assert!(is_request::<crate::proto::LoadToolGroupRequest>());
        assert!(!is_request::<crate::proto::RouteResponse>());
        assert!(!is_request::<crate::proto::Tool>());
    }
}
