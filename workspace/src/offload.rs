//! Context offload as data: the limits and what one offload call did. The operations
//! (append to `context.jsonl`, payloads to `data/`) are in `berth-features`.

use crate::error::Result;
use crate::id::validate_id;
use crate::path::RelPath;

/// Most messages in one OffloadContext call.
pub const MAX_MESSAGES: usize = 10_000;
/// Largest single message (JSON text).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// Largest tool result accepted.
pub const MAX_TOOL_RESULT_BYTES: usize = 64 * 1024 * 1024;
/// Threshold used when a request gives none.
pub const DEFAULT_THRESHOLD_BYTES: u64 = 16 * 1024;
/// Bytes of head and of tail in a preview, unless the request asks otherwise.
pub const DEFAULT_PREVIEW_BYTES: usize = 1024;
/// Prefix of references to offloaded data.
pub const REFERENCE_SCHEME: &str = "workspace://";

/// What one OffloadContext call did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContextOffloaded {
    pub path: RelPath,
    pub messages: usize,
    pub bytes_appended: u64,
    /// `workspace://data/...` references made (payloads already present are listed too).
    pub data_refs: Vec<String>,
}

/// What one OffloadToolResult call did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolResultOffloaded {
    /// False when the content was under the threshold and stays inline.
    pub offloaded: bool,
    pub path: Option<RelPath>,
    pub size_bytes: u64,
    pub head: String,
    pub tail: String,
    /// Head, an omission marker naming the file, tail: what goes into the context.
    pub preview: String,
}

pub fn validate_session_id(session_id: &str) -> Result<()> {
    validate_id("session id", session_id)
}

/// Keeps `[A-Za-z0-9._-]` of a tool call id (others become `_`), at most 64 bytes;
/// never empty and never starting with `.`.
pub fn sanitize_tool_call_id(id: &str) -> String {
    let mut clean: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .take(64)
        .collect();
    if clean.starts_with('.') {
        clean.replace_range(..1, "_");
    }
    if clean.is_empty() { "call".to_owned() } else { clean }
}
