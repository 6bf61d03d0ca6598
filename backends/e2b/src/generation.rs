//! The generation record inside a sandbox (E2B metadata cannot change after create): one
//! line with the generation of the placement that last adopted it, at
//! `E2bConfig::generation_file`, written through a temp file and `Move`.

use serde_json::json;

use berth_workspace::error::{Result, WorkspaceError};

use super::config::BACKEND_NAME;
use super::envd::Envd;
use super::http::{Failure, Retry};

/// The recorded generation; `None` when there is no record (a sandbox created by a gateway
/// that died before writing it: its metadata's generation stands).
pub async fn read(envd: &Envd, file: &str) -> Result<Option<u64>> {
    let response = match envd.download(file).await {
        Ok(response) => response,
        Err(super::envd::EnvdError::Http(Failure::Status(refusal)))
            if refusal.status == reqwest::StatusCode::NOT_FOUND =>
        {
            return Ok(None);
        }
        Err(error) => return Err(error.into_error("read the generation record", file)),
    };
    let text = response.text().await.map_err(|error| WorkspaceError::BackendUnavailable {
        backend: BACKEND_NAME,
        reason: format!("read the generation record: {error}"),
    })?;
    let trimmed = text.trim();
    trimmed.parse().map(Some).map_err(|_| WorkspaceError::Corrupt {
        what: format!("generation record {file} of e2b sandbox {}", envd.sandbox_id()),
        reason: format!("{:?} is not a generation", trimmed.chars().take(40).collect::<String>()),
    })
}

/// Records `generation` (atomically).
pub async fn write(envd: &Envd, file: &str, generation: u64) -> Result<()> {
    let temp = format!("{file}.tmp-{}", hex::encode(rand::random::<[u8; 6]>()));
    envd.upload(&temp, reqwest::Body::from(format!("{generation}\n")))
        .await
        .map_err(|error| error.into_error("write the generation record", file))?;
    envd.unary("filesystem.Filesystem/Move", &json!({"source": temp, "destination": file}), Retry::Refused)
        .await
        .map_err(|error| error.into_error("write the generation record", file))?;
    Ok(())
}
