//! Berth control plane: public gRPC API, registry, binding, placement, routing, sweeper.

pub mod registry;
