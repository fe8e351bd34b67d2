//! The Ferry gRPC API (`ferry.v1`): generated message and service code, [`convert`], the one
//! place where wire types and the kernel's domain types meet, [`codec`], the wire codec every
//! generated service and client uses, and [`not_owner`], the structured "not the owner" error.
//!
//! Depends on the kernel for domain types only; it must not depend on the store or the servers.

#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations
)]
pub mod v1 {
    tonic::include_proto!("ferry.v1");

    /// Encoded `FileDescriptorSet` of the API, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("ferry_v1_descriptor");
}

pub mod codec;
pub mod convert;
pub mod not_owner;
pub mod settings;

pub use not_owner::{
    not_leader_of, not_leader_status, not_owner_of, not_owner_status, NOT_LEADER_TYPE_URL,
    NOT_OWNER_TYPE_URL,
};

pub use v1 as pb;

/// The stream of events a back-end (and the admin service) hands out; one boxed type, so the
/// back-end service stays usable as a trait object.
pub type EventStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<pb::Event, tonic::Status>> + Send + 'static>,
>;
