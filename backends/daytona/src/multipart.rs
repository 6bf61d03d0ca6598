//! The two multipart bodies of the toolbox's bulk file calls: the upload this backend
//! sends (`files[0].path` then `files[0].file`, the content streamed between a fixed head
//! and tail) and the download answer it reads (one `file` part, or an `error` part with
//! a JSON message), parsed as it streams so a large file is never held in memory.

use bytes::{Buf, Bytes, BytesMut};
use futures::stream::{BoxStream, StreamExt};

use berth_workspace::error::{Result, WorkspaceError};

use super::config::BACKEND_NAME;

/// Most bytes of part headers (or of an error part) accepted.
const MAX_HEAD: usize = 64 * 1024;

/// A fresh boundary (never inside a path: paths go in the body, not in headers).
pub fn boundary() -> String {
    format!("berth-{}", hex::encode(rand::random::<[u8; 16]>()))
}

/// The content type, head and tail of an upload of one file to `path`.
pub fn upload_frame(boundary: &str, path: &str) -> (String, Bytes, Bytes) {
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"files[0].path\"\r\n\r\n{path}\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"files[0].file\"; filename=\"upload\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    (format!("multipart/form-data; boundary={boundary}"), Bytes::from(head), Bytes::from(tail))
}

/// The boundary of a `multipart/form-data; boundary=…` answer.
pub fn answer_boundary(content_type: &str) -> Option<String> {
    let (kind, rest) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    rest.split(';')
        .map(str::trim)
        .find_map(|param| param.strip_prefix("boundary="))
        .map(|value| value.trim_matches('"').to_owned())
        .filter(|value| !value.is_empty())
}

fn broken(reason: impl Into<String>) -> WorkspaceError {
    WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("bulk download: {}", reason.into()) }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// What the first part of a download answer is.
pub enum FirstPart {
    /// The file: its bytes, streamed.
    File(BoxStream<'static, Result<Bytes>>),
    /// An error part: its status code (when the JSON names one) and message.
    Error { status: Option<u64>, message: String },
}

struct Reader {
    source: BoxStream<'static, std::result::Result<Bytes, reqwest::Error>>,
    buffer: BytesMut,
    /// `\r\n--<boundary>`: the end of a part's content.
    delimiter: Vec<u8>,
    done: bool,
}

impl Reader {
    async fn fill(&mut self) -> Result<bool> {
        match self.source.next().await {
            Some(Ok(chunk)) => {
                self.buffer.extend_from_slice(&chunk);
                Ok(true)
            }
            Some(Err(error)) => Err(WorkspaceError::BackendUnavailable {
                backend: BACKEND_NAME,
                reason: format!("bulk download: {error}"),
            }),
            None => Ok(false),
        }
    }

    /// The next piece of the current part's content; `None` at its end.
    async fn content(&mut self) -> Result<Option<Bytes>> {
        if self.done {
            return Ok(None);
        }
        loop {
            if let Some(at) = find(&self.buffer, &self.delimiter) {
                self.done = true;
                if at == 0 {
                    return Ok(None);
                }
                let piece = self.buffer.split_to(at).freeze();
                return Ok(Some(piece));
            }
            // Everything but a possible start of the delimiter can go.
            let keep = self.delimiter.len() - 1;
            if self.buffer.len() > keep {
                let piece = self.buffer.split_to(self.buffer.len() - keep).freeze();
                return Ok(Some(piece));
            }
            if !self.fill().await? {
                return Err(broken("the answer ended inside a part"));
            }
        }
    }
}

/// Parses a bulk download answer's first part.
pub async fn first_part(response: reqwest::Response) -> Result<FirstPart> {
    let content_type =
        response.headers().get(reqwest::header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).unwrap_or("");
    let Some(boundary) = answer_boundary(content_type) else {
        return Err(broken(format!("expected a multipart answer, got {content_type:?}")));
    };
    let mut reader = Reader {
        source: response.bytes_stream().boxed(),
        buffer: BytesMut::new(),
        delimiter: format!("\r\n--{boundary}").into_bytes(),
        done: false,
    };
    // The opening delimiter, then the part's headers up to an empty line.
    let opening = format!("--{boundary}\r\n").into_bytes();
    let headers_end = loop {
        if let Some(start) = find(&reader.buffer, &opening)
            && let Some(end) = find(&reader.buffer[start..], b"\r\n\r\n")
        {
            let headers = String::from_utf8_lossy(&reader.buffer[start + opening.len()..start + end]).into_owned();
            reader.buffer.advance(start + end + 4);
            break headers;
        }
        if reader.buffer.len() > MAX_HEAD {
            return Err(broken("part headers too long"));
        }
        if !reader.fill().await? {
            return Err(broken("no part in the answer"));
        }
    };
    let disposition = headers_end
        .split("\r\n")
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim().eq_ignore_ascii_case("content-disposition").then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    let name = disposition
        .split(';')
        .map(str::trim)
        .find_map(|param| param.strip_prefix("name="))
        .map(|value| value.trim_matches('"').to_owned())
        .unwrap_or_default();
    match name.as_str() {
        "file" => Ok(FirstPart::File(
            futures::stream::unfold(reader, |mut reader| async move {
                match reader.content().await {
                    Ok(Some(piece)) => Some((Ok(piece), reader)),
                    Ok(None) => None,
                    Err(error) => {
                        reader.done = true;
                        Some((Err(error), reader))
                    }
                }
            })
            .boxed(),
        )),
        "error" => {
            let mut text = Vec::new();
            while let Some(piece) = reader.content().await? {
                text.extend_from_slice(&piece);
                if text.len() > MAX_HEAD {
                    break;
                }
            }
            let parsed = serde_json::from_slice::<serde_json::Value>(&text).ok();
            let status = parsed.as_ref().and_then(|value| value.get("statusCode")).and_then(serde_json::Value::as_u64);
            let message = parsed
                .as_ref()
                .and_then(|value| value.get("message"))
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| String::from_utf8_lossy(&text).chars().take(500).collect());
            Ok(FirstPart::Error { status, message })
        }
        other => Err(broken(format!("unexpected part {other:?}"))),
    }
}
