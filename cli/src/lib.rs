//! The `berth` CLI as a library. Client commands talk to a control plane over gRPC
//! (`client.rs`) and print through `output.rs`.

pub mod client;
pub mod format;
pub mod io;
pub mod output;

pub use crate::io::Io;
