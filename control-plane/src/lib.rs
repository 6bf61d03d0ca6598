//! Berth control plane: public gRPC API, registry, binding, placement, routing, sweeper.
//!
//! Entry point: [`server::serve`]. A replica is stateless: everything it knows comes from the
//! registry ([`registry::Registry`]), mirrored in memory by [`view::ReplicaView`].

pub mod auth;
pub mod authz;
pub mod binding;
pub mod config;
pub mod error;
pub mod forward;
pub mod group_commit;
pub mod heartbeat;
pub mod keys;
pub mod lease;
pub mod lock_janitor;
pub mod metrics;
pub mod node_client;
pub mod passthrough;
pub mod placement;
pub mod policy;
pub mod quota;
pub mod records;
pub mod registry;
pub mod registry_metrics;
pub mod router;
pub mod sandbox_janitor;
pub mod server;
pub mod service;
pub mod session_commit;
pub mod snapshots;
pub mod store;
pub mod sweeper;
pub mod txn_commit;
pub mod view;

pub use config::ControlPlaneConfig;
pub use policy::{IsolationPolicy, assign_workspace_id};
pub use registry::{Registry, RegistryRef};
pub use server::{ServeError, serve};
