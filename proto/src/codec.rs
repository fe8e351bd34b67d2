//! The gRPC codec of every `ferry.v1` service: tonic-prost's, except for what a body that does not
//! decode is answered with.
//!
//! tonic-prost answers a body that is not a valid protobuf message (cut short, garbled, a string
//! field holding invalid UTF-8) with `INTERNAL`, which tells the caller the server is at fault.
//! The body is the caller's, so this codec answers `INVALID_ARGUMENT` naming the message type and
//! what is wrong with it (prost's decode error names the field).
//!
//! `proto/build.rs` points code generation at [`FerryCodec`], for servers and clients alike (one
//! build generates both). A client that cannot decode a server's answer therefore reports
//! `INVALID_ARGUMENT` too; its message names the response type.
//!
//! A request over the server's `max_decoding_message_size` never reaches a codec: tonic refuses it
//! from the length in its frame header, before reading the body, with `OUT_OF_RANGE`.

use std::marker::PhantomData;

use prost::{Message, Name};
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstEncoder};

/// A [`Codec`] for prost messages that answers undecodable input with `INVALID_ARGUMENT`.
/// Encodes with tonic-prost's encoder.
#[derive(Debug, Clone)]
pub struct FerryCodec<T, U> {
    prost: ProstCodec<T, U>,
}

impl<T, U> Default for FerryCodec<T, U> {
    fn default() -> Self {
        Self {
            prost: ProstCodec::default(),
        }
    }
}

impl<T, U> Codec for FerryCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Name + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = FerryDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.prost.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        FerryDecoder {
            buffer_settings: self.prost.decoder().buffer_settings(),
            _message: PhantomData,
        }
    }
}

/// Decodes one `U` from a gRPC frame; see [`FerryCodec`].
#[derive(Debug, Clone)]
pub struct FerryDecoder<U> {
    buffer_settings: BufferSettings,
    _message: PhantomData<U>,
}

impl<U: Message + Name + Default> Decoder for FerryDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(not_valid::<U>)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.buffer_settings
    }
}

/// The answer to a body that does not decode as a `U`. prost's error is short whatever the input
/// (a description and the path of fields it was in), so it is quoted whole.
fn not_valid<U: Name>(error: prost::DecodeError) -> Status {
    Status::invalid_argument(format!("not a valid {}: {error}", U::full_name()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;

    fn decode_error<U: Message + Name + Default + std::fmt::Debug>(body: &[u8]) -> Status {
        match U::decode(body) {
            Ok(m) => panic!("{body:?} decoded as {m:?}"),
            Err(e) => not_valid::<U>(e),
        }
    }

    #[test]
    fn a_cut_short_body_is_invalid_argument_naming_the_type() {
        let whole = pb::SendRequest {
            queue: "orders".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let status = decode_error::<pb::SendRequest>(&whole[..whole.len() - 2]);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status
                .message()
                .starts_with("not a valid ferry.v1.SendRequest: "),
            "{status:?}"
        );
    }

    #[test]
    fn invalid_utf8_in_a_string_is_invalid_argument_naming_the_field() {
        // OpenConnectionRequest.client_id is field 1, length-delimited: tag 0x0a, 2 bytes.
        let status = decode_error::<pb::OpenConnectionRequest>(&[0x0a, 2, 0xff, 0xfe]);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        let message = status.message();
        assert!(
            message.starts_with("not a valid ferry.v1.OpenConnectionRequest: "),
            "{message}"
        );
        assert!(message.contains("client_id"), "{message}");
        assert!(message.contains("UTF-8"), "{message}");
    }
}
