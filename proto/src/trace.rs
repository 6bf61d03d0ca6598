//! W3C trace context on gRPC hops (`traceparent` / `tracestate` metadata), so one client
//! call is one trace across replica and node agent.
//!
//! The calling side injects the context of the current `tracing` span ([`inject`], from a
//! client interceptor); the serving side makes the request span a child of the extracted
//! context ([`set_remote_parent`], from `Server::trace_fn`). Both go through the process's
//! global propagator, which the binary sets to W3C trace context; without an OpenTelemetry
//! layer the current span has no context and nothing is injected.

use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Writes the current span's trace context into outgoing metadata.
pub fn inject(metadata: &mut tonic::metadata::MetadataMap) {
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut MetadataInjector(metadata));
    });
}

/// Reads a trace context from incoming headers (empty when there is none).
pub fn extract(headers: &http::HeaderMap) -> opentelemetry::Context {
    opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&HeaderExtractor(headers)))
}

/// Makes `span` (the span of one inbound request) a child of the trace context the request
/// carries, if it carries one; otherwise the span stays the root of its own trace.
pub fn set_remote_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    let parent = extract(headers);
    if opentelemetry::trace::TraceContextExt::span(&parent).span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// The span of one inbound gRPC request, for `Server::trace_fn`: none for health probes
/// (they would bury the traces operators look for); otherwise `make(rpc path)`, a child of
/// the caller's trace context when the request carries one.
pub fn request_span<B>(request: &http::Request<B>, make: impl FnOnce(&str) -> tracing::Span) -> tracing::Span {
    let rpc = request.uri().path();
    if rpc.starts_with("/grpc.health.v1.Health/") {
        return tracing::Span::none();
    }
    let span = make(rpc);
    set_remote_parent(&span, request.headers());
    span
}

/// Accepted connections of a listener we bound ourselves, with TCP_NODELAY: tonic applies
/// `Server::tcp_nodelay` only to listeners it binds, and without it Nagle + delayed ACK
/// stall every large message 40 ms.
pub fn incoming(listener: impl Into<tonic::transport::server::TcpIncoming>) -> tonic::transport::server::TcpIncoming {
    listener.into().with_nodelay(Some(true))
}

/// Records the workspace a request is about on the current request span (a no-op where the
/// span has no `ws_id` field).
pub fn record_workspace(workspace_id: &str) {
    tracing::Span::current().record("ws_id", workspace_id);
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) =
            (tonic::metadata::MetadataKey::from_bytes(key.as_bytes()), tonic::metadata::MetadataValue::try_from(value))
        {
            self.0.insert(key, value);
        }
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}
