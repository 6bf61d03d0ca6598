//! Connecting to a control plane and turning gRPC failures into one readable line.
//!
//! Every client command goes through [`connect`] and [`RpcResultExt::rpc_context`], so the
//! wording of `error: <what failed>: <why>` is decided here and nowhere else.

use std::fmt;
use std::time::Duration;

use berth_proto::v1::admin_service_client::AdminServiceClient;
use berth_proto::v1::contract_service_client::ContractServiceClient;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::global::GlobalArgs;

/// How long to wait for the TCP + HTTP/2 handshake before giving up on the endpoint.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest response the CLI accepts. tonic's default (4 MiB) is smaller than an exec
/// result with a raised `--max-output` (stdout and stderr are capped separately), and the
/// user already chose that cap, so the client should not impose a second, hidden one.
const MAX_RESPONSE_BYTES: usize = 1 << 30;

/// A channel whose every request carries the CLI's credentials.
pub type AuthedChannel = InterceptedService<Channel, Credentials>;
pub type WorkspaceClient = WorkspaceServiceClient<AuthedChannel>;
pub type AdminClient = AdminServiceClient<AuthedChannel>;
pub type ContractClient = ContractServiceClient<AuthedChannel>;

/// `--token` and `--act-as`, added to every request (`authorization: Bearer …`,
/// `x-berth-act-as`). The token is held as a header value only, never printed.
#[derive(Clone, Default)]
pub struct Credentials {
    authorization: Option<MetadataValue<Ascii>>,
    act_as: Option<MetadataValue<Ascii>>,
}

impl Credentials {
    pub fn new(token: Option<&str>, act_as: Option<&str>) -> anyhow::Result<Self> {
        let authorization = token
            .filter(|token| !token.is_empty())
            .map(|token| format!("Bearer {}", token.trim()).parse())
            .transpose()
            .map_err(|_| anyhow::anyhow!("the token contains characters not allowed in a header"))?;
        let act_as = act_as
            .map(|user| user.parse())
            .transpose()
            .map_err(|_| anyhow::anyhow!("--act-as: not a valid user id"))?;
        Ok(Self { authorization, act_as })
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Credentials")
            .field("token", &self.authorization.as_ref().map(|_| "<redacted>"))
            .field("act_as", &self.act_as)
            .finish()
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(value) = &self.authorization {
            request.metadata_mut().insert(berth_proto::auth::AUTHORIZATION, value.clone());
        }
        if let Some(value) = &self.act_as {
            request.metadata_mut().insert(berth_proto::meta::ACT_AS, value.clone());
        }
        Ok(request)
    }
}

/// An open channel to one control-plane endpoint.
#[derive(Clone)]
pub struct Connection {
    channel: Channel,
    credentials: Credentials,
}

impl Connection {
    pub fn workspace(&self) -> WorkspaceClient {
        WorkspaceServiceClient::with_interceptor(self.channel.clone(), self.credentials.clone())
            .max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    pub fn contract(&self) -> ContractClient {
        ContractServiceClient::with_interceptor(self.channel.clone(), self.credentials.clone())
            .max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// The gRPC health service (open: no credentials are sent).
    pub fn health(&self) -> tonic_health::pb::health_client::HealthClient<Channel> {
        tonic_health::pb::health_client::HealthClient::new(self.channel.clone())
    }

    pub fn admin(&self) -> AdminClient {
        AdminServiceClient::with_interceptor(self.channel.clone(), self.credentials.clone())
            .max_decoding_message_size(MAX_RESPONSE_BYTES)
    }
}

/// Opens a channel to the `--endpoint` eagerly, so an unreachable control plane is reported
/// as such (naming the endpoint) instead of as a failure of whatever call came first.
/// `https://` endpoints are verified against `--ca-cert` when given.
pub async fn connect(global: &GlobalArgs) -> anyhow::Result<Connection> {
    let endpoint = global.endpoint.as_str();
    let token = global.token()?;
    let credentials = Credentials::new(token.as_ref().map(|token| token.expose()), global.act_as.as_deref())?;
    let uri = normalize_endpoint(endpoint);
    let mut target = berth_proto::transport::client(
        Endpoint::from_shared(uri.clone())
            .map_err(|error| anyhow::anyhow!("invalid endpoint {endpoint:?}: {error}"))?,
    )
    .connect_timeout(CONNECT_TIMEOUT)
    .tcp_nodelay(true);
    if uri.starts_with("https://") {
        let mut tls = tonic::transport::ClientTlsConfig::new();
        if let Some(ca) = &global.ca_cert {
            let pem = std::fs::read(ca).map_err(|error| anyhow::anyhow!("reading {}: {error}", ca.display()))?;
            tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
        }
        target = target.tls_config(tls).map_err(|error| anyhow::anyhow!("tls: {error}"))?;
    }
    match target.connect().await {
        Ok(channel) => Ok(Connection { channel, credentials }),
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
