//! Server-side subcommands: `berth up`, `berth control-plane`, `berth node-agent`. Each
//! parses its flags into the library configs, calls the library `serve` functions and
//! shuts down cleanly on Ctrl-C / SIGTERM.

mod cloud;
mod control_plane;
mod credential;
mod flags;
mod gateway;
mod node_agent;
mod up;

pub use control_plane::{ControlPlaneArgs, control_plane};
pub use credential::{NodeCredentialArgs, node_credential};
pub use flags::{ConfigFlag, parse_duration_arg};
pub use node_agent::{NodeAgentArgs, node_agent};
pub use up::{UpArgs, up};
