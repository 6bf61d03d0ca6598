//! The workspace contract's features, built on the [`Backend`] primitives only, so every
//! backend gets them unchanged (docs/design.md §3): MCP servers ([`mcp`]: `.mcp`
//! declarations, the node's secret store, a pool of live clients), skills ([`skills`]),
//! context offload ([`offload`]) and directory trees as tar streams ([`tree`]).
//!
//! [`Backend`]: berth_workspace::Backend

pub mod mcp;
pub mod offload;
pub mod skills;
pub mod tree;
