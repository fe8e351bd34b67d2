//! The structured "not the owner" answer of a back-end, in the standard gRPC rich error model,
//! so a client in any language can decode it.
//!
//! A back-end asked about a queue it does not own (or not at the placement epoch the request
//! named) answers `FAILED_PRECONDITION` whose `grpc-status-details-bin` trailer holds a
//! `google.rpc.Status` (same code and message) with one detail: a `google.protobuf.Any` whose
//! `type_url` is [`NOT_OWNER_TYPE_URL`] and whose `value` is an encoded [`pb::NotOwner`].
//! [`not_owner_status`] builds that answer and [`not_owner_of`] reads it back.
//!
//! `google.rpc.Status` and `google.protobuf.Any` are declared here with prost rather than
//! generated: two small, frozen messages, and no extra dependency.

use prost::Message;
use tonic::{Code, Status};

use crate::pb;

/// The `type_url` of a [`pb::NotOwner`] packed in a `google.protobuf.Any`.
pub const NOT_OWNER_TYPE_URL: &str = "type.googleapis.com/ferry.v1.NotOwner";

/// The `type_url` of a [`pb::NotLeader`] packed in a `google.protobuf.Any`.
pub const NOT_LEADER_TYPE_URL: &str = "type.googleapis.com/ferry.v1.NotLeader";

/// `google.rpc.Status`, as `grpc-status-details-bin` carries it.
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<Any>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// A back-end's `FAILED_PRECONDITION` answer saying it does not own `n.queue`, with `n` as its
/// structured detail.
pub fn not_owner_status(n: pb::NotOwner) -> Status {
    let owner = if n.owner_node.is_empty() {
        "unknown".to_owned()
    } else {
        format!("node {}", n.owner_node)
    };
    let message = format!(
        "this node does not own queue {} (owner: {owner}, placement epoch {})",
        n.queue, n.epoch
    );
    with_detail(
        Code::FailedPrecondition,
        message,
        NOT_OWNER_TYPE_URL,
        n.encode_to_vec(),
    )
}

/// A status with one structured detail, in the rich error model.
fn with_detail(code: Code, message: String, type_url: &str, value: Vec<u8>) -> Status {
    let details = RpcStatus {
        code: code as i32,
        message: message.clone(),
        details: vec![Any {
            type_url: type_url.to_owned(),
            value,
        }],
    };
    Status::with_details(code, message, details.encode_to_vec().into())
}

/// The detail of `status` packed under `type_url`, if it carries one.
fn detail_of<M: Message + Default>(status: &Status, type_url: &str) -> Option<M> {
    if status.details().is_empty() {
        return None;
    }
    let rpc = RpcStatus::decode(status.details()).ok()?;
    rpc.details
        .iter()
        .find(|a| a.type_url == type_url)
        .and_then(|a| M::decode(a.value.as_slice()).ok())
}

/// A back-end's `UNAVAILABLE` answer saying it does not lead the shard of the queue asked
/// about, with `n` as its structured detail; `message` says so for a person.
pub fn not_leader_status(n: pb::NotLeader, message: String) -> Status {
    with_detail(
        Code::Unavailable,
        message,
        NOT_LEADER_TYPE_URL,
        n.encode_to_vec(),
    )
}

/// The [`pb::NotLeader`] detail of a status, if it is a "not the leader" answer (an
/// `UNAVAILABLE` carrying one).
pub fn not_leader_of(status: &Status) -> Option<pb::NotLeader> {
    if status.code() != Code::Unavailable {
        return None;
    }
    detail_of(status, NOT_LEADER_TYPE_URL)
}

/// The [`pb::NotOwner`] detail of a status, if it is a "not the owner" answer (a
/// `FAILED_PRECONDITION` carrying one).
pub fn not_owner_of(status: &Status) -> Option<pb::NotOwner> {
    if status.code() != Code::FailedPrecondition {
        return None;
    }
    detail_of(status, NOT_OWNER_TYPE_URL)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> pb::NotOwner {
        pb::NotOwner {
            queue: "orders".into(),
            owner_node: "b".into(),
            epoch: 7,
        }
    }

    #[test]
    fn a_not_owner_status_reads_back() {
        let status = not_owner_status(sample());
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(status.message().contains("orders"), "{status:?}");
        assert!(status.message().contains("node b"), "{status:?}");
        assert_eq!(not_owner_of(&status), Some(sample()));
        assert_eq!(not_leader_of(&status), None);
    }

    #[test]
    fn a_not_leader_status_reads_back_and_is_not_a_not_owner() {
        let n = pb::NotLeader {
            shard: 3,
            leader_node: "c".into(),
        };
        let status = not_leader_status(n.clone(), "not the leader of shard 3".into());
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(not_leader_of(&status), Some(n));
        assert_eq!(not_owner_of(&status), None);
        assert_eq!(not_leader_of(&Status::unavailable("plain")), None);
    }

    #[test]
    fn other_statuses_are_not_not_owner() {
        assert_eq!(
            not_owner_of(&Status::failed_precondition("stale receipt")),
            None
        );
        // The same detail under another code is not this answer.
        let s = not_owner_status(sample());
        let other = Status::with_details(Code::Unavailable, "x", s.details().to_vec().into());
        assert_eq!(not_owner_of(&other), None);
        // Garbage details do not decode.
        let garbage = Status::with_details(Code::FailedPrecondition, "x", vec![0xff; 4].into());
        assert_eq!(not_owner_of(&garbage), None);
    }

    // The wire contract other languages rely on, byte for byte: google.rpc.Status { code = 9
    // (FAILED_PRECONDITION), message, details = [Any { type_url, value = NotOwner }] }.
    #[test]
    fn the_details_are_a_google_rpc_status_holding_an_any() {
        let n = pb::NotOwner {
            queue: "q".into(),
            owner_node: "b".into(),
            epoch: 2,
        };
        // NotOwner: field 1 "q", field 2 "b", field 3 varint 2.
        let not_owner = [0x0a, 1, b'q', 0x12, 1, b'b', 0x18, 2];
        assert_eq!(n.encode_to_vec(), not_owner);
        let status = not_owner_status(n);
        let bytes = status.details();
        // google.rpc.Status.code: field 1 varint 9.
        assert_eq!(&bytes[..2], &[0x08, 9]);
        // google.rpc.Status.message: field 2, the status message.
        let message = status.message().as_bytes();
        assert_eq!(bytes[2], 0x12);
        assert_eq!(usize::from(bytes[3]), message.len());
        assert_eq!(&bytes[4..4 + message.len()], message);
        // google.rpc.Status.details[0]: field 3, an Any { 1: type_url, 2: value }.
        let any = &bytes[4 + message.len()..];
        let url = NOT_OWNER_TYPE_URL.as_bytes();
        let mut expected = vec![0x1a, (2 + url.len() + 2 + not_owner.len()) as u8];
        expected.extend([0x0a, url.len() as u8]);
        expected.extend(url);
        expected.extend([0x12, not_owner.len() as u8]);
        expected.extend(not_owner);
        assert_eq!(any, expected.as_slice());
    }
}
