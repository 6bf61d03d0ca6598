//! gRPC service implementations of a replica.

pub mod admin;
pub mod contract;
pub mod sessions;
pub mod workspace;
