//! `multipart/form-data` bodies (RFC 7578), parsed whole: the uploads of the tests are small.

use axum::body::Bytes;

pub struct Part {
    pub name: String,
    pub data: Bytes,
}

/// The boundary parameter of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|param| {
        let (key, value) = param.trim().split_once('=')?;
        key.trim().eq_ignore_ascii_case("boundary").then(|| value.trim().trim_matches('"').to_owned())
    })
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    (from..=haystack.len() - needle.len()).find(|&index| &haystack[index..index + needle.len()] == needle)
}

/// The parts in order, or `None` when the body is not well-formed.
pub fn parse(body: &Bytes, boundary: &str) -> Option<Vec<Part>> {
    let delimiter = format!("--{boundary}");
    let separator = format!("\r\n--{boundary}");
    let mut position = find(body, delimiter.as_bytes(), 0)? + delimiter.len();
    let mut parts = Vec::new();
    loop {
        if body.get(position..position + 2)? == b"--" {
            return Some(parts);
        }
        if body.get(position..position + 2)? != b"\r\n" {
            return None;
        }
        position += 2;
        let headers_end = find(body, b"\r\n\r\n", position)?;
        let headers = std::str::from_utf8(&body[position..headers_end]).ok()?;
        let data_start = headers_end + 4;
        let data_end = find(body, separator.as_bytes(), data_start)?;
        let name = headers
            .split("\r\n")
            .find(|line| line.to_ascii_lowercase().starts_with("content-disposition:"))
            .and_then(|line| {
                line.split(';').find_map(|param| {
                    let (key, value) = param.trim().split_once('=')?;
                    (key.trim() == "name").then(|| value.trim().trim_matches('"').to_owned())
                })
            })?;
        parts.push(Part { name, data: body.slice(data_start..data_end) });
        position = data_end + separator.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs() {
        let body = Bytes::from_static(
            b"--xyz\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"m\"\r\n\r\n{\"path\":\"/a\"}\r\n--xyz\r\nContent-Disposition: form-data; name=\"file\"\r\nContent-Type: application/octet-stream\r\n\r\nab\r\ncd\r\n--xyz--\r\n",
        );
        let parts = parse(&body, "xyz").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "metadata");
        assert_eq!(&parts[1].data[..], b"ab\r\ncd");
        assert_eq!(boundary("multipart/form-data; boundary=\"xyz\"").as_deref(), Some("xyz"));
    }
}
