//! Context offload: conversations and large tool results go to the workspace's files, so
//! an agent's context keeps a reference instead of the bytes (docs/design.md §3).
//!
//! - [`offload_context`] appends one JSON line per message to
//!   `sessions/<session_id>/context.jsonl` with the backend's `append_file` (never a
//!   read-modify-write). Inline base64 payloads — `{"type": "image", "data": "<base64>",
//!   "mime_type": "image/png"}` blocks (also `mimeType`) and `data:<mime>;base64,` URLs —
//!   are moved to `data/<sha256>.<ext>` (written once per content) and replaced by a
//!   `workspace://data/<sha256>.<ext>` reference.
//! - [`offload_tool_result`] writes a result over a threshold to
//!   `sessions/<session_id>/tool_result-<id>.txt` (create-exclusive: a second result with
//!   the same id gets a suffixed name, never overwrites) and returns the path with a head
//!   and tail preview.

use base64::Engine as _;
use bytes::Bytes;
use serde_json::Value;
use sha2::{Digest, Sha256};

use berth_workspace::backend::Backend;
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::layout::{DATA_DIR, SESSIONS_DIR};
pub use berth_workspace::offload::*;
use berth_workspace::path::RelPath;

fn session_dir(session_id: &str) -> Result<RelPath> {
    validate_session_id(session_id)?;
    RelPath::parse(SESSIONS_DIR)?.join(session_id)
}

/// Appends `messages` (each a JSON value) to the session's `context.jsonl`, one line each,
/// after moving inline payloads to `data/`.
pub async fn offload_context<B: Backend + ?Sized>(
    backend: &B,
    session_id: &str,
    messages: Vec<Value>,
) -> Result<ContextOffloaded> {
    let path = session_dir(session_id)?.join("context.jsonl")?;
    if messages.len() > MAX_MESSAGES {
        return Err(WorkspaceError::LimitExceeded {
            limit: "messages per call",
            size: messages.len() as u64,
            max: MAX_MESSAGES as u64,
        });
    }
    let mut refs = Vec::new();
    let mut lines = Vec::new();
    for mut message in messages {
        let mut payloads = Vec::new();
        extract_payloads(&mut message, &mut payloads);
        for payload in payloads {
            store_payload(backend, &payload).await?;
            refs.push(payload.reference);
        }
        // serde_json escapes control characters: a message is exactly one line.
        let mut line = serde_json::to_vec(&message)
            .map_err(|error| WorkspaceError::InvalidArgument(format!("message is not serialisable: {error}")))?;
        line.push(b'\n');
        lines.extend_from_slice(&line);
    }
    let count = lines.iter().filter(|&&byte| byte == b'\n').count();
    let appended = if lines.is_empty() { 0 } else { backend.append_file(&path, Bytes::from(lines)).await? };
    Ok(ContextOffloaded { path, messages: count, bytes_appended: appended, data_refs: refs })
}

/// One inline payload found in a message.
struct Payload {
    data: Vec<u8>,
    file: RelPath,
    reference: String,
}

impl Payload {
    fn new(data: Vec<u8>, mime: &str) -> Option<Payload> {
        let digest = hex::encode(Sha256::digest(&data));
        let name = format!("{digest}.{}", extension_for(mime));
        let file = RelPath::parse(DATA_DIR).ok()?.join(&name).ok()?;
        let reference = format!("{REFERENCE_SCHEME}{DATA_DIR}/{name}");
        Some(Payload { data, file, reference })
    }
}

/// Replaces inline payloads in `value` by references, collecting them.
fn extract_payloads(value: &mut Value, found: &mut Vec<Payload>) {
    match value {
        Value::Object(object) => {
            let mime =
                object.get("mime_type").or_else(|| object.get("mimeType")).and_then(Value::as_str).map(str::to_owned);
            let inline = object.get("data").and_then(Value::as_str).map(str::to_owned);
            if let (Some(mime), Some(data)) = (mime, inline)
                && let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(data.trim())
                && let Some(payload) = Payload::new(bytes, &mime)
            {
                object.remove("data");
                object.insert("uri".into(), Value::String(payload.reference.clone()));
                found.push(payload);
            }
            for child in object.values_mut() {
                extract_payloads(child, found);
            }
        }
        Value::Array(items) => {
            for item in items {
                extract_payloads(item, found);
            }
        }
        Value::String(text) => {
            if let Some(payload) = parse_data_url(text) {
                *text = payload.reference.clone();
                found.push(payload);
            }
        }
        _ => {}
    }
}

/// `data:<mime>;base64,<data>`.
fn parse_data_url(text: &str) -> Option<Payload> {
    let rest = text.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let mime = meta.strip_suffix(";base64")?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(data.trim()).ok()?;
    Payload::new(bytes, if mime.is_empty() { "application/octet-stream" } else { mime })
}

fn extension_for(mime: &str) -> &'static str {
    match mime.split(';').next().unwrap_or_default().trim().to_ascii_lowercase().as_str() {
        "image/png" => "png",
        "image/jpeg" | "image/jpg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/svg+xml" => "svg",
        "audio/wav" | "audio/x-wav" => "wav",
        "audio/mpeg" => "mp3",
        "audio/ogg" => "ogg",
        "application/pdf" => "pdf",
        "application/json" => "json",
        "text/plain" => "txt",
        _ => "bin",
    }
}

/// Writes a payload unless a file of that content exists already (same content, same
/// name: written once).
async fn store_payload<B: Backend + ?Sized>(backend: &B, payload: &Payload) -> Result<()> {
    if backend.exists(&payload.file).await? {
        return Ok(());
    }
    backend.write_bytes(&payload.file, Bytes::from(payload.data.clone()), 0o644).await?;
    Ok(())
}

/// Offloads a tool result over `threshold_bytes` (0: the default) to the session folder.
pub async fn offload_tool_result<B: Backend + ?Sized>(
    backend: &B,
    session_id: &str,
    tool_call_id: &str,
    content: Bytes,
    threshold_bytes: u64,
    preview_bytes: usize,
) -> Result<ToolResultOffloaded> {
    let dir = session_dir(session_id)?;
    if content.len() > MAX_TOOL_RESULT_BYTES {
        return Err(WorkspaceError::LimitExceeded {
            limit: "tool result size",
            size: content.len() as u64,
            max: MAX_TOOL_RESULT_BYTES as u64,
        });
    }
    let threshold = if threshold_bytes == 0 { DEFAULT_THRESHOLD_BYTES } else { threshold_bytes };
    let preview_bytes = if preview_bytes == 0 { DEFAULT_PREVIEW_BYTES } else { preview_bytes.min(64 * 1024) };
    let size = content.len() as u64;
    if size <= threshold {
        let text = String::from_utf8_lossy(&content).into_owned();
        return Ok(ToolResultOffloaded {
            offloaded: false,
            path: None,
            size_bytes: size,
            head: text.clone(),
            tail: String::new(),
            preview: text,
        });
    }
    let base = sanitize_tool_call_id(tool_call_id);
    // Written aside, then renamed without replacing: the first result of an id is never
    // overwritten, a later one takes the next free suffix.
    let temp = dir.join(&format!(".tool_result-{base}.{:016x}.tmp", rand::random::<u64>()))?;
    backend.write_bytes(&temp, content.clone(), 0o644).await?;
    let mut placed = None;
    for attempt in 0..1000u32 {
        let name =
            if attempt == 0 { format!("tool_result-{base}.txt") } else { format!("tool_result-{base}-{attempt}.txt") };
        let target = dir.join(&name)?;
        match backend.rename(&temp, &target).await {
            Ok(()) => {
                placed = Some(target);
                break;
            }
            Err(WorkspaceError::AlreadyExists { .. }) => continue,
            Err(error) => {
                let _ = backend.remove(&temp, false).await;
                return Err(error);
            }
        }
    }
    let Some(path) = placed else {
        let _ = backend.remove(&temp, false).await;
        return Err(WorkspaceError::LimitExceeded { limit: "tool results with one id", size: 1000, max: 999 });
    };
    let head = utf8_prefix(&content, preview_bytes);
    let tail = utf8_suffix(&content, preview_bytes);
    let omitted = size.saturating_sub((head.len() + tail.len()) as u64);
    let preview =
        format!("{head}\n[... {omitted} bytes omitted; the full result ({size} bytes) is in {path} ...]\n{tail}");
    Ok(ToolResultOffloaded { offloaded: true, path: Some(path), size_bytes: size, head, tail, preview })
}

/// The longest prefix of at most `limit` bytes ending on a char boundary (lossy for
/// invalid UTF-8).
fn utf8_prefix(data: &[u8], limit: usize) -> String {
    let mut cut = data.len().min(limit);
    while cut > 0 && cut < data.len() && (data[cut] & 0xC0) == 0x80 {
        cut -= 1;
    }
    String::from_utf8_lossy(&data[..cut]).into_owned()
}

fn utf8_suffix(data: &[u8], limit: usize) -> String {
    let mut start = data.len().saturating_sub(limit);
    while start < data.len() && (data[start] & 0xC0) == 0x80 {
        start += 1;
    }
    String::from_utf8_lossy(&data[start..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_replaced_by_references() {
        let png = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG fake");
        let mut message = serde_json::json!({
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "data": png, "mime_type": "image/png"},
                {"type": "image_url", "url": format!("data:image/png;base64,{png}")},
            ]
        });
        let mut found = Vec::new();
        extract_payloads(&mut message, &mut found);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].reference, found[1].reference, "same content, same file");
        let text = message.to_string();
        assert!(!text.contains(&png), "{text}");
        assert!(text.contains("workspace://data/"), "{text}");
        assert!(found[0].reference.ends_with(".png"));
    }

    #[test]
    fn ids_and_previews() {
        assert_eq!(sanitize_tool_call_id("call/../1 x"), "call_.._1_x");
        assert_eq!(sanitize_tool_call_id(".hidden"), "_hidden");
        assert_eq!(sanitize_tool_call_id(""), "call");
        assert_eq!(utf8_prefix("héllo".as_bytes(), 2), "h");
        assert_eq!(utf8_suffix("héllo".as_bytes(), 4), "llo");
        assert_eq!(utf8_suffix("héllo".as_bytes(), 5), "éllo");
    }
}
