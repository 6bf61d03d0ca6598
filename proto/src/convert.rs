//! Conversions between `berth.v1` messages and the domain types of `berth-workspace`, and
//! the one mapping of workspace errors to gRPC statuses.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use berth_workspace::backend::{
    DEFAULT_CHUNK_BYTES, DEFAULT_EXEC_TIMEOUT, DEFAULT_MAX_OUTPUT_BYTES, MAX_EXEC_TIMEOUT, MAX_OUTPUT_BYTES_LIMIT,
};
use berth_workspace::{
    ExecEvent, ExecOutput, ExecSpec, FileInfo, FileKind, RelPath, SpawnRole, SpawnSpec, WorkspaceError, WorkspaceSpec,
};
use bytes::Bytes;
use tonic::Status;

use crate::meta::ErrorKind;
use crate::v1;

pub fn timestamp(time: SystemTime) -> prost_types::Timestamp {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp { seconds: since_epoch.as_secs() as i64, nanos: since_epoch.subsec_nanos() as i32 }
}

pub fn timestamp_from_unix_ms(unix_ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: unix_ms.div_euclid(1000), nanos: (unix_ms.rem_euclid(1000) * 1_000_000) as i32 }
}

pub fn system_time(timestamp: &prost_types::Timestamp) -> SystemTime {
    let nanos = timestamp.nanos.clamp(0, 999_999_999) as u32;
    if timestamp.seconds >= 0 { UNIX_EPOCH + Duration::new(timestamp.seconds as u64, nanos) } else { UNIX_EPOCH }
}

pub fn spec_from_proto(spec: Option<v1::WorkspaceSpec>) -> WorkspaceSpec {
    let Some(spec) = spec else { return WorkspaceSpec::default() };
    WorkspaceSpec {
        image: Some(spec.image).filter(|image| !image.is_empty()),
        cpu_millis: spec.cpu_millis,
        memory_bytes: spec.memory_bytes,
        pids: spec.pids,
        network: spec.network,
        env: spec.env.into_iter().collect(),
        labels: spec.labels.into_iter().collect(),
        read_only_root: spec.read_only_root,
        file_size_bytes: spec.file_size_bytes,
        cpu_time_secs: spec.cpu_time_secs,
    }
}

pub fn spec_to_proto(spec: &WorkspaceSpec) -> v1::WorkspaceSpec {
    v1::WorkspaceSpec {
        image: spec.image.clone().unwrap_or_default(),
        cpu_millis: spec.cpu_millis,
        memory_bytes: spec.memory_bytes,
        pids: spec.pids,
        network: spec.network,
        env: spec.env.clone().into_iter().collect(),
        labels: spec.labels.clone().into_iter().collect(),
        read_only_root: spec.read_only_root,
        file_size_bytes: spec.file_size_bytes,
        cpu_time_secs: spec.cpu_time_secs,
    }
}

/// The timeout an exec request asks for (`0`: the default), checked against the limit.
pub fn exec_timeout_from_proto(timeout_ms: u64) -> Result<Duration, WorkspaceError> {
    match timeout_ms {
        0 => Ok(DEFAULT_EXEC_TIMEOUT),
        millis if millis > MAX_EXEC_TIMEOUT.as_millis() as u64 => Err(WorkspaceError::LimitExceeded {
            limit: "exec timeout (ms)",
            size: millis,
            max: MAX_EXEC_TIMEOUT.as_millis() as u64,
        }),
        millis => Ok(Duration::from_millis(millis)),
    }
}

/// Builds and validates an exec from a request, applying defaults (timeout 60 s, output
/// cap 1 MiB per stream).
pub fn exec_spec_from_proto(request: &v1::ExecRequest) -> Result<ExecSpec, WorkspaceError> {
    let timeout = exec_timeout_from_proto(request.timeout_ms)?;
    let max_output_bytes = match request.max_output_bytes {
        0 => DEFAULT_MAX_OUTPUT_BYTES,
        bytes if bytes > MAX_OUTPUT_BYTES_LIMIT as u64 => {
            return Err(WorkspaceError::LimitExceeded {
                limit: "max output bytes",
                size: bytes,
                max: MAX_OUTPUT_BYTES_LIMIT as u64,
            });
        }
        bytes => bytes as usize,
    };
    let spec = ExecSpec {
        spawn: SpawnSpec {
            argv: request.argv.clone(),
            cwd: RelPath::parse(&request.cwd)?,
            env: request.env.clone().into_iter().collect(),
            // A caller's exec is always the agent's; only the node starts secret holders.
            role: SpawnRole::Agent,
            program_sha256: None,
        },
        stdin: Bytes::copy_from_slice(&request.stdin),
        timeout,
        max_output_bytes,
    };
    spec.validate()?;
    Ok(spec)
}

pub fn exec_output_to_proto(output: ExecOutput) -> v1::ExecResult {
    v1::ExecResult {
        exit_code: output.exit_code,
        stdout: output.stdout.to_vec(),
        stderr: output.stderr.to_vec(),
        timed_out: output.timed_out,
        stdout_truncated: output.stdout_truncated,
        stderr_truncated: output.stderr_truncated,
        duration_ms: output.duration.as_millis() as u64,
        signal: output.signal.unwrap_or(0),
    }
}

pub fn exec_event_to_proto(event: ExecEvent) -> v1::ExecChunk {
    use v1::exec_chunk::Kind;
    let kind = match event {
        ExecEvent::Stdout(data) => Kind::Stdout(data.to_vec()),
        ExecEvent::Stderr(data) => Kind::Stderr(data.to_vec()),
        ExecEvent::Exit(output) => Kind::Exit(exec_output_to_proto(output)),
    };
    v1::ExecChunk { kind: Some(kind) }
}

pub fn file_kind_to_proto(kind: FileKind) -> v1::FileKind {
    match kind {
        FileKind::File => v1::FileKind::File,
        FileKind::Directory => v1::FileKind::Directory,
        FileKind::Symlink => v1::FileKind::Symlink,
        FileKind::Other => v1::FileKind::Other,
    }
}

pub fn file_info_to_proto(info: &FileInfo) -> v1::FileInfo {
    v1::FileInfo {
        path: info.path.as_str().to_owned(),
        name: info.name().to_owned(),
        kind: file_kind_to_proto(info.kind) as i32,
        size: info.size,
        mode: info.mode,
        modified: info.modified.map(timestamp),
    }
}

/// Chunk size for a ReadFile request: the client's choice within 4 KiB..1 MiB.
pub fn read_chunk_size(requested: u32) -> usize {
    match requested {
        0 => DEFAULT_CHUNK_BYTES,
        size => (size as usize).clamp(4096, 1024 * 1024),
    }
}

/// The one mapping of workspace errors to gRPC statuses. Client mistakes keep their
/// message (it names the problem); internal failures are masked to their operation.
pub fn status_from_workspace_error(error: &WorkspaceError) -> Status {
    use WorkspaceError as E;
    let message = error.to_string();
    match error {
        E::InvalidPath { .. } | E::InvalidId { .. } | E::InvalidArgument(_) | E::UnknownBackend { .. } => {
            Status::invalid_argument(message)
        }
        E::PathEscapesRoot { .. } => ErrorKind::PathEscapesRoot.attach(Status::permission_denied(message)),
        E::LimitExceeded { .. } => ErrorKind::LimitExceeded.attach(Status::invalid_argument(message)),
        E::NotFound { .. } | E::NameNotFound { .. } => Status::not_found(message),
        E::NameExists { .. } => Status::already_exists(message),
        // Carries a kind, so the router never takes it for an unreachable node.
        E::McpServerFailed { .. } => ErrorKind::McpServerFailed.attach(Status::unavailable(message)),
        E::McpRefused { .. } => Status::permission_denied(message),
        E::AlreadyExists { .. } => Status::already_exists(message),
        E::IsADirectory { .. } | E::NotADirectory { .. } | E::DirectoryNotEmpty { .. } | E::SpawnFailed { .. } => {
            Status::failed_precondition(message)
        }
        E::NotProvisioned { .. } => ErrorKind::WrongGeneration.attach(Status::failed_precondition(message)),
        E::BackendUnavailable { .. } => crate::meta::mark_retryable(Status::unavailable(message)),
        E::Timeout { .. } => Status::deadline_exceeded(message),
        E::Corrupt { .. } => Status::internal(message),
        E::Io { op, path, source } => Status::internal(format!("i/o error during {op} of {path:?}: {}", source.kind())),
        E::Backend { backend, .. } => Status::internal(format!("{backend} backend error: {message}")),
        E::Unsupported { .. } => Status::unimplemented(message),
        E::ProviderQuota { .. } => Status::resource_exhausted(message),
        E::ProviderAuth { .. } => Status::failed_precondition(message),
        E::SandboxFenced { .. } => ErrorKind::StaleGeneration.attach(Status::failed_precondition(message)),
    }
}

/// The messages of a whole WriteFile call: header, `data` in `chunk_size` pieces, commit.
pub fn write_file_messages(header: v1::WriteFileHeader, data: &[u8], chunk_size: usize) -> Vec<v1::WriteFileRequest> {
    use v1::write_file_request::Msg;
    let mut messages = Vec::with_capacity(data.len() / chunk_size.max(1) + 2);
    messages.push(v1::WriteFileRequest { msg: Some(Msg::Header(header)) });
    messages.extend(
        data.chunks(chunk_size.max(1))
            .map(|piece| v1::WriteFileRequest { msg: Some(Msg::Chunk(bytes::Bytes::copy_from_slice(piece))) }),
    );
    messages.push(write_file_commit(data.len() as u64));
    messages
}

/// The closing message of a WriteFile call that sent `size` bytes.
pub fn write_file_commit(size: u64) -> v1::WriteFileRequest {
    v1::WriteFileRequest { msg: Some(v1::write_file_request::Msg::Commit(v1::WriteFileCommit { size })) }
}
