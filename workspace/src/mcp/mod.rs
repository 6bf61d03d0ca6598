//! The MCP part of the contract as data: `.mcp` declarations ([`config`], read and written
//! through the `Backend` primitives) and what clients send and receive ([`spec`]). The
//! service that runs servers and holds secrets is in `berth-features`.

pub mod config;
pub mod spec;

pub use self::config::{ConfigValue, McpServerConfig, McpTransport, secret_ref, validate_server_name};
pub use self::spec::{McpCallOutput, McpServerSpec, McpServerStatus, McpToolInfo, SpecTransport, SpecValue};
