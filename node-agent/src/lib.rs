//! Berth node agent: hosts local / bubblewrap / Docker workspaces under a data directory,
//! serves `NodeAgentService` to replicas and heartbeats to the control plane.
//!
//! Entry point: [`server::serve`].

pub mod auth;
pub mod config;
pub mod contract;
pub mod drivers;
pub mod error;
pub mod fence;
pub mod heartbeat;
pub mod metrics;
pub mod server;
pub mod service;
pub mod state;

pub use config::NodeAgentConfig;
pub use server::{ServeError, serve};
