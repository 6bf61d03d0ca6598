//! Observability test support: scraping a Prometheus text endpoint, and an in-process OTLP
//! trace collector (a real tonic server implementing the OTLP `TraceService`) that keeps
//! every span it is sent.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// One Prometheus sample: `name{labels} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed scrape.
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    pub samples: Vec<Sample>,
    pub text: String,
}

impl Scrape {
    /// Parses the Prometheus text format (enough of it for our own exporter: no escaped
    /// quotes or commas inside label values).
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let mut samples = Vec::new();
        for line in text.lines().map(str::trim).filter(|line| !line.is_empty() && !line.starts_with('#')) {
            let (series, value) =
                line.rsplit_once(' ').ok_or_else(|| anyhow::anyhow!("sample line without value: {line:?}"))?;
            let value: f64 = value.parse().map_err(|error| anyhow::anyhow!("value of {line:?}: {error}"))?;
            let (name, labels) = match series.split_once('{') {
                None => (series.to_owned(), BTreeMap::new()),
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').ok_or_else(|| anyhow::anyhow!("labels of {line:?}"))?;
                    let labels = body
                        .split(',')
                        .filter(|pair| !pair.is_empty())
                        .filter_map(|pair| pair.split_once('='))
                        .map(|(key, value)| (key.to_owned(), value.trim_matches('"').to_owned()))
                        .collect();
                    (name.to_owned(), labels)
                }
            };
            samples.push(Sample { name, labels, value });
        }
        Ok(Self { samples, text: text.to_owned() })
    }

    /// Sum of the samples named `name` whose labels include every pair of `labels`; `None`
    /// when no such series exists.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<f64> = self
            .samples
            .iter()
            .filter(|sample| sample.name == name)
            .filter(|sample| {
                labels.iter().all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(*value))
            })
            .map(|sample| sample.value)
            .collect();
        if matching.is_empty() { None } else { Some(matching.iter().sum()) }
    }
}

/// `GET http://127.0.0.1:<port>/metrics`, parsed.
pub async fn scrape(port: u16) -> anyhow::Result<Scrape> {
    let text = tokio::task::spawn_blocking(move || crate::etcd::http_request(port, "GET", "/metrics", "")).await??;
    Scrape::parse(&text)
}

/// A span as the collector received it.
#[derive(Clone, Debug)]
pub struct CollectedSpan {
    /// `service.name` of the exporting process's resource.
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    /// String and integer attributes, as text.
    pub attributes: BTreeMap<String, String>,
}

/// An OTLP/gRPC trace collector on a loopback port.
pub struct OtlpCollector {
    pub address: SocketAddr,
    spans: Arc<Mutex<Vec<CollectedSpan>>>,
    shutdown: tokio::sync::oneshot::Sender<()>,
}

impl OtlpCollector {
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let spans = Arc::new(Mutex::new(Vec::new()));
        let service = TraceServiceServer::new(Collector { spans: Arc::clone(&spans) });
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(
            TcpListenerStream::new(listener),
            async move {
                let _ = stopped.await;
            },
        ));
        Ok(Self { address, spans, shutdown })
    }

    /// `http://127.0.0.1:<port>`, for `--otlp-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn spans(&self) -> Vec<CollectedSpan> {
        self.spans.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn stop(self) {
        let _ = self.shutdown.send(());
    }
}

struct Collector {
    spans: Arc<Mutex<Vec<CollectedSpan>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut collected = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|resource| &resource.attributes)
                .find(|attribute| attribute.key == "service.name")
                .and_then(|attribute| attribute.value.as_ref().and_then(|value| value.value.as_ref()).map(text))
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    let attributes = span
                        .attributes
                        .iter()
                        .filter_map(|attribute| {
                            let value = attribute.value.as_ref()?.value.as_ref()?;
                            Some((attribute.key.clone(), text(value)))
                        })
                        .collect();
                    collected.push(CollectedSpan {
                        service: service.clone(),
                        name: span.name,
                        trace_id: hex::encode(&span.trace_id),
                        span_id: hex::encode(&span.span_id),
                        parent_span_id: hex::encode(&span.parent_span_id),
                        attributes,
                    });
                }
            }
        }
        self.spans.lock().unwrap_or_else(PoisonError::into_inner).extend(collected);
        Ok(Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::StringValue(text) => text.clone(),
        Value::IntValue(number) => number.to_string(),
        Value::BoolValue(flag) => flag.to_string(),
        Value::DoubleValue(number) => number.to_string(),
        other => format!("{other:?}"),
    }
}
