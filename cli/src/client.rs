//! Connecting to a control plane and turning gRPC failures into one readable line.
//!
//! Every client command goes through [`connect`] and [`RpcResultExt::rpc_context`], so the
//! wording of `error: <what failed>: <why>` is decided here and nowhere else.

use std::fmt;
use std::time::Duration;

use berth_proto::v1::admin_service_client::AdminServiceClient;
use berth_proto::v1::contract_service_client::ContractServiceClient;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// How long to wait for the TCP + HTTP/2 handshake before giving up on the endpoint.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest response the CLI accepts. tonic's default (4 MiB) is smaller than an exec
/// result with a raised `--max-output` (stdout and stderr are capped separately), and the
/// user already chose that cap, so the client should not impose a second, hidden one.
const MAX_RESPONSE_BYTES: usize = 1 << 30;

/// An open channel to one control-plane endpoint.
#[derive(Clone)]
pub struct Connection {
    channel: Channel,
}

impl Connection {
    pub fn workspace(&self) -> WorkspaceServiceClient<Channel> {
        WorkspaceServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    pub fn contract(&self) -> ContractServiceClient<Channel> {
        ContractServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    pub fn admin(&self) -> AdminServiceClient<Channel> {
        AdminServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }
}

/// Opens a channel to `endpoint` eagerly, so an unreachable control plane is reported as
/// such (naming the endpoint) instead of as a failure of whatever call came first.
pub async fn connect(endpoint: &str) -> anyhow::Result<Connection> {
    let uri = normalize_endpoint(endpoint);
    let target = Endpoint::from_shared(uri.clone())
        .map_err(|error| anyhow::anyhow!("invalid endpoint {endpoint:?}: {error}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    match target.connect().await {
        Ok(channel) => Ok(Connection { channel }),
        Err(error) => Err(anyhow::anyhow!("connect to {uri}: {}", describe_connect_error(&error))),
    }
}

/// Accepts `host:port` as a shorthand for `http://host:port`.
pub fn normalize_endpoint(endpoint: &str) -> String {
    let trimmed = endpoint.trim();
    if trimmed.contains("://") { trimmed.to_string() } else { format!("http://{trimmed}") }
}

/// The root cause of a failed connect in words, with a hint when nothing listens there.
fn describe_connect_error(error: &(dyn std::error::Error + 'static)) -> String {
    let mut innermost = error.to_string();
    let mut source = Some(error);
    while let Some(current) = source {
        if let Some(io_error) = current.downcast_ref::<std::io::Error>() {
            match io_error.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    return "connection refused; is a Berth control plane running there? \
                            start one with `berth up`, or point --endpoint / BERTH_ENDPOINT \
                            at a running one"
                        .to_string();
                }
                std::io::ErrorKind::TimedOut => {
                    return format!("no answer within {}", humantime::format_duration(CONNECT_TIMEOUT));
                }
                _ => {}
            }
        }
        innermost = current.to_string();
        source = current.source();
    }
    // hyper's connect timeout is not an io::Error; its message is the best we have.
    if innermost.to_ascii_lowercase().contains("timed out") {
        return format!("no answer within {}", humantime::format_duration(CONNECT_TIMEOUT));
    }
    innermost
}

/// A gRPC status reduced to what a user needs: the code in words and the server's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl From<Status> for RpcError {
    fn from(status: Status) -> Self {
        // tonic reports its own client-side deadline as CANCELLED "Timeout expired"; to the
        // user that is the deadline passing, not a cancellation they asked for.
        if status.code() == Code::Cancelled && status.message() == "Timeout expired" {
            return RpcError {
                code: Code::DeadlineExceeded,
                message: "no answer before the client's deadline".to_string(),
            };
        }
        RpcError { code: status.code(), message: status.message().to_string() }
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let words = code_words(self.code);
        if self.message.is_empty() { f.write_str(words) } else { write!(f, "{words}: {}", self.message) }
    }
}

impl std::error::Error for RpcError {}

/// The gRPC code as lowercase words (`NOT_FOUND` -> `not found`).
pub fn code_words(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown error",
        Code::InvalidArgument => "invalid argument",
        Code::DeadlineExceeded => "deadline exceeded",
        Code::NotFound => "not found",
        Code::AlreadyExists => "already exists",
        Code::PermissionDenied => "permission denied",
        Code::ResourceExhausted => "resource exhausted",
        Code::FailedPrecondition => "failed precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out of range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal error",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// Attaches "what failed" to a gRPC result, producing `<what>: <code words>: <message>`.
pub trait RpcResultExt<T> {
    fn rpc_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> anyhow::Result<T>;
}

impl<T> RpcResultExt<T> for Result<T, Status> {
    fn rpc_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> anyhow::Result<T> {
        self.map_err(|status| anyhow::Error::new(RpcError::from(status)).context(what().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_code_words_and_message() {
        let result: Result<(), Status> = Err(Status::not_found("workspace ws-123 not found"));
        let error = result.rpc_context(|| "exec on ws-123").unwrap_err();
        assert_eq!(format!("{error:#}"), "exec on ws-123: not found: workspace ws-123 not found");
    }

    #[test]
    fn empty_message_prints_only_the_code() {
        let error = RpcError::from(Status::new(Code::PermissionDenied, ""));
        assert_eq!(error.to_string(), "permission denied");
    }

    #[test]
    fn client_deadline_reads_as_deadline_exceeded() {
        let error = RpcError::from(Status::cancelled("Timeout expired"));
        assert_eq!(error.code, Code::DeadlineExceeded);
    }

    #[test]
    fn bare_host_port_gets_http_scheme() {
        assert_eq!(normalize_endpoint("127.0.0.1:7070"), "http://127.0.0.1:7070");
        assert_eq!(normalize_endpoint("https://berth:443"), "https://berth:443");
    }

    #[test]
    fn connection_refused_suggests_berth_up() {
        let error = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let words = describe_connect_error(&error);
        assert!(words.starts_with("connection refused"), "{words}");
        assert!(words.contains("berth up"), "{words}");
    }
}
