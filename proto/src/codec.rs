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
//!
//! A send whose message carries more than `ferry_kernel::PROPERTIES_PER_MESSAGE_MAX` properties
//! is refused (`RESOURCE_EXHAUSTED`) from a scan of the wire bytes, before it is decoded: decoding
//! builds every property, and millions of tiny ones in one request cost hundreds of MB.

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
        if let Some(field) = outgoing_messages_field(U::full_name().as_str()) {
            // A DecodeBuf is one contiguous frame.
            properties_within_bound(prost::bytes::Buf::chunk(buf), field)?;
        }
        U::decode(buf).map(Some).map_err(not_valid::<U>)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.buffer_settings
    }
}

/// The field number of the repeated `OutgoingMessage` in a send request, if `U` is one.
fn outgoing_messages_field(full_name: &str) -> Option<u64> {
    match full_name {
        "ferry.v1.SendRequest" | "ferry.v1.PublishRequest" => Some(3),
        "ferry.v1.BackendSendRequest" => Some(2),
        _ => None,
    }
}

/// `OutgoingMessage.properties`.
const PROPERTIES_FIELD: u64 = 2;

/// Refuses a send request (wire bytes) with a message of more than
/// `PROPERTIES_PER_MESSAGE_MAX` properties. Bytes that do not parse pass: decoding says why.
fn properties_within_bound(body: &[u8], messages_field: u64) -> Result<(), Status> {
    let max = ferry_kernel::PROPERTIES_PER_MESSAGE_MAX;
    let mut over = None;
    let mut index = 0usize;
    each_len_field(body, |field, message| {
        if field != messages_field {
            return true;
        }
        let mut count = 0usize;
        each_len_field(message, |f, _| {
            count += usize::from(f == PROPERTIES_FIELD);
            count <= max
        });
        if count > max {
            over = Some(index);
            return false;
        }
        index += 1;
        true
    });
    match over {
        Some(i) => Err(Status::resource_exhausted(format!(
            "message {i} has more than {max} properties, over properties_per_message_max = {max}; send fewer"
        ))),
        None => Ok(()),
    }
}

/// Calls `f(field number, bytes)` for each length-delimited field of the protobuf message in `b`,
/// in order, while `f` answers true. Stops at the first thing that does not parse.
fn each_len_field(b: &[u8], mut f: impl FnMut(u64, &[u8]) -> bool) {
    let mut at = 0usize;
    while at < b.len() {
        let Some(key) = varint(b, &mut at) else {
            return;
        };
        let skip = match key & 7 {
            0 => varint(b, &mut at).map(|_| 0),
            1 => Some(8),
            5 => Some(4),
            2 => varint(b, &mut at).and_then(|len| usize::try_from(len).ok()),
            _ => None,
        };
        let Some(end) = skip
            .and_then(|n| at.checked_add(n))
            .filter(|&e| e <= b.len())
        else {
            return;
        };
        if key & 7 == 2 && !f(key >> 3, &b[at..end]) {
            return;
        }
        at = end;
    }
}

/// A base-128 varint at `*at`, moving past it; `None` if cut short or too long.
fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
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

    fn send_with_properties(counts: &[usize]) -> Vec<u8> {
        pb::SendRequest {
            queue: "orders".into(),
            messages: counts
                .iter()
                .map(|&n| pb::OutgoingMessage {
                    body: vec![1, 2, 3].into(),
                    properties: (0..n)
                        .map(|i| {
                            let v = pb::property_value::Value::IntValue(1);
                            (format!("p{i}"), pb::PropertyValue { value: Some(v) })
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    // Postmortem: properties were decoded before any size check; a 34 MiB request with 3 M
    // properties took 390 MiB and 2.5 s before anything refused it.
    #[test]
    fn a_send_with_too_many_properties_is_refused_from_its_bytes() {
        let max = ferry_kernel::PROPERTIES_PER_MESSAGE_MAX;
        let ok = send_with_properties(&[max, 3]);
        assert!(properties_within_bound(&ok, 3).is_ok());
        let over = send_with_properties(&[3, max + 1]);
        let status = properties_within_bound(&over, 3).expect_err("over the bound");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().starts_with("message 1 has more than"),
            "{status:?}"
        );
        assert!(status.message().contains("properties_per_message_max"));
        // Bytes that do not parse are left to the decoder.
        assert!(properties_within_bound(&over[..over.len() / 2], 3).is_ok());
        assert!(properties_within_bound(&[0xff; 16], 3).is_ok());
        assert_eq!(outgoing_messages_field("ferry.v1.AckRequest"), None);
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
