//! `multipart/form-data`: parsing a request body (bulk upload) and building an answer
//! (bulk download), as Go's `mime/multipart` does for the daemon.

/// One part: its `name`, its `filename` when it has one, its bytes.
pub struct Part {
    pub name: String,
    pub filename: Option<String>,
    pub content: Vec<u8>,
}

/// The boundary of a `multipart/form-data; boundary=…` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let (kind, rest) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    rest.split(';')
        .map(str::trim)
        .find_map(|param| param.strip_prefix("boundary="))
        .map(|b| b.trim_matches('"').to_owned())
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from > haystack.len() {
        return None;
    }
    haystack[from..].windows(needle.len()).position(|window| window == needle).map(|at| at + from)
}

fn param(disposition: &str, name: &str) -> Option<String> {
    for piece in disposition.split(';').map(str::trim) {
        if let Some(value) = piece.strip_prefix(&format!("{name}=")) {
            let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
            return Some(value.replace("\\\"", "\"").replace("\\\\", "\\"));
        }
    }
    None
}

/// Every part of `body`; `None` when it is not well formed.
pub fn parse(body: &[u8], boundary: &str) -> Option<Vec<Part>> {
    let delimiter = format!("--{boundary}").into_bytes();
    let mut position = find(body, &delimiter, 0)? + delimiter.len();
    let mut parts = Vec::new();
    loop {
        if body.get(position..position + 2) == Some(b"--") {
            return Some(parts);
        }
        if body.get(position..position + 2) != Some(b"\r\n") {
            return None;
        }
        let headers_start = position + 2;
        let headers_end = find(body, b"\r\n\r\n", headers_start)?;
        let headers = String::from_utf8_lossy(&body[headers_start..headers_end]).into_owned();
        let content_start = headers_end + 4;
        let mut closing = b"\r\n".to_vec();
        closing.extend_from_slice(&delimiter);
        let content_end = find(body, &closing, content_start)?;
        let disposition = headers
            .split("\r\n")
            .find_map(|line| {
                let (key, value) = line.split_once(':')?;
                key.trim().eq_ignore_ascii_case("content-disposition").then(|| value.trim().to_owned())
            })
            .unwrap_or_default();
        parts.push(Part {
            name: param(&disposition, "name").unwrap_or_default(),
            filename: param(&disposition, "filename"),
            content: body[content_start..content_end].to_vec(),
        });
        position = content_end + closing.len();
    }
}

/// The head of one answer part.
pub fn part_head(boundary: &str, name: &str, filename: &str, content_type: &str) -> Vec<u8> {
    let escaped = filename.replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{escaped}\"\r\nContent-Type: {content_type}\r\n\r\n"
    )
    .into_bytes()
}
