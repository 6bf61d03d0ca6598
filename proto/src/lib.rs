//! The Berth wire contract: generated `berth.v1` types, clients and servers.
//!
//! Everything here is a compatibility contract (docs/design.md §1): field numbers are never
//! reused. Conversions to and from domain types live next to the domain crates' types in
//! [`convert`], so `berth-workspace` never sees gRPC.

pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("berth.v1");
}

pub mod auth;
pub mod backends;
pub mod contract;
pub mod convert;
pub mod credentials;
pub mod frames;
pub mod meta;
pub mod routed;
pub mod tls;
pub mod trace;
pub mod transport;

/// Encoded file descriptor set, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("berth_descriptor");
