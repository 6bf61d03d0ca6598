//! Berth node agent: hosts local / bubblewrap / Docker workspaces under a data directory,
//! or, as a gateway, drives cloud sandboxes (E2B, …) that hold their own data; serves `NodeAgentService` (lifecycle) and the data plane of the public services
//! (`WorkspaceService`, `ContractService`) to replicas, and heartbeats to the control plane.
//!
//! Entry point: [`server::serve`].

pub mod auth;
pub mod cloud;
pub mod config;
pub mod contract;
pub mod data_plane;
pub mod drivers;
pub mod error;
pub mod fence;
pub mod files;
pub mod gate;
pub mod heartbeat;
pub mod limits;
pub mod metrics;
pub mod quarantine;
pub mod read_frames;
pub mod server;
pub mod service;
pub mod snapshots;
pub mod state;
pub mod warm_pool;

pub use config::NodeAgentConfig;
pub use server::{ServeError, serve};
