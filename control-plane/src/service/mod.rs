//! gRPC service implementations of a replica.

pub mod admin;
pub mod sessions;
pub mod workspace;
