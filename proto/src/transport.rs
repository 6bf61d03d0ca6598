//! HTTP/2 settings every Berth connection uses, so a file or exec stream is not throttled
//! by the protocol's defaults.
//!
//! HTTP/2 starts every stream with a 64 KiB flow-control window: a sender stops after
//! 64 KiB until the receiver's WINDOW_UPDATE comes back, so a 1 MiB `ReadFile` through a
//! replica waited on ~16 round trips per hop. The windows below let a whole default
//! message (and several of them) travel without waiting. They bound what a receiver buffers
//! for a reader that does not read: at most [`STREAM_WINDOW_BYTES`] per stream and
//! [`CONNECTION_WINDOW_BYTES`] per connection, whatever the number of streams.

use tonic::transport::{Endpoint, Server};

/// Flow-control window of each stream (what may be in flight on it, unacknowledged).
pub const STREAM_WINDOW_BYTES: u32 = 4 * 1024 * 1024;

/// Flow-control window of a whole connection (all its streams together).
pub const CONNECTION_WINDOW_BYTES: u32 = 8 * 1024 * 1024;

/// Largest HTTP/2 frame a Berth peer accepts: a 1 MiB file chunk goes out in 4 frames,
/// not 64.
pub const MAX_FRAME_BYTES: u32 = 256 * 1024;

/// The windows and frame size on a client endpoint.
pub fn client(endpoint: Endpoint) -> Endpoint {
    endpoint
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
}

/// The windows and frame size on a server.
pub fn server<L>(builder: Server<L>) -> Server<L> {
    builder
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
}
