//! Process-wide observability of the server commands: `--metrics-listen` (a Prometheus
//! recorder for the `metrics` facade, served as text on `GET /metrics`) and
//! `--otlp-endpoint` (a `tracing` layer exporting spans over OTLP/gRPC).
//!
//! Both are installed once per process; `berth up` therefore reports its replica and its
//! node agent on one endpoint and in one OTLP resource.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Bucket bounds (seconds) of every latency histogram: etcd calls take well under a
/// millisecond, provisions of a Docker workspace seconds.
const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// How long finished spans wait before they are sent. Short: an operator looking for a
/// trace should find it at once, and a process killed hard loses at most this much.
const SPAN_EXPORT_DELAY: Duration = Duration::from_millis(500);

/// Observability flags of `berth up`, `berth control-plane` and `berth node-agent`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TelemetryFlags {
    /// Serve Prometheus metrics as text on http://ADDR/metrics; ADDR must be loopback
    /// (e.g. 127.0.0.1:9100). For another address use --metrics-listen-network.
    #[arg(long, env = "BERTH_METRICS_LISTEN", conflicts_with = "metrics_listen_network")]
    pub metrics_listen: Option<String>,
    /// Serve the metrics on this non-loopback address (the private or pod network a
    /// Prometheus scrapes from, e.g. 10.0.1.1:9100). `/metrics` is unauthenticated: name an
    /// address only the scraper reaches.
    #[arg(long, env = "BERTH_METRICS_LISTEN_NETWORK")]
    pub metrics_listen_network: Option<String>,
    /// Export trace spans over OTLP/gRPC to this collector (e.g. http://127.0.0.1:4317).
    #[arg(long, env = "BERTH_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// Installs the global `tracing` subscriber: logs to stderr, plus OTLP export when
/// `otlp` is given. Must run inside the Tokio runtime (the OTLP client is a tonic channel).
/// Returns the tracer provider to flush at exit.
pub fn init_tracing(
    default_level: &str,
    otlp: Option<(&str, &'static str)>,
    ansi: bool,
) -> anyhow::Result<Option<SdkTracerProvider>> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let Some((endpoint, service_name)) = otlp else {
        // try_init: a subscriber that cannot be installed is no reason to fail the command.
        let _ = tracing_subscriber::registry().with(filter).with(fmt).try_init();
        return Ok(None);
    };
    opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(Duration::from_secs(5))
        .build()
        .with_context(|| format!("otlp exporter for {endpoint}"))?;
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(BatchConfigBuilder::default().with_scheduled_delay(SPAN_EXPORT_DELAY).build())
        .build();
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service_name).build();
    let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build();
    let tracer = provider.tracer("berth");
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .try_init();
    Ok(Some(provider))
}

/// Sends the spans still buffered (called once the command finished).
pub fn flush_traces(provider: SdkTracerProvider) {
    if let Err(error) = provider.shutdown() {
        tracing::warn!(%error, "flushing trace spans failed");
    }
}

impl TelemetryFlags {
    /// Serves the metrics on `--metrics-listen` (loopback only) or
    /// `--metrics-listen-network` until `shutdown`; `None` when neither is given.
    pub async fn serve_metrics(&self, shutdown: CancellationToken) -> anyhow::Result<Option<SocketAddr>> {
        match (&self.metrics_listen, &self.metrics_listen_network) {
            (Some(listen), _) => serve_metrics(listen, false, shutdown).await.map(Some),
            (None, Some(listen)) => serve_metrics(listen, true, shutdown).await.map(Some),
            (None, None) => Ok(None),
        }
    }
}

/// Installs the process's Prometheus recorder and serves it on `listen` until `shutdown`.
/// Returns the bound address (`listen` may name port 0). Without `beyond_loopback` an
/// address that is not loopback is refused before anything is served.
pub async fn serve_metrics(
    listen: &str,
    beyond_loopback: bool,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("metrics: listening on {listen}"))?;
    let address = listener.local_addr()?;
    anyhow::ensure!(
        beyond_loopback || address.ip().is_loopback(),
        "--metrics-listen {listen} is not a loopback address: /metrics is unauthenticated; name the network \
         address a Prometheus scrapes from with --metrics-listen-network instead"
    );
    let handle = PrometheusBuilder::new()
        .set_buckets(LATENCY_BUCKETS)
        .context("metric buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    // The recorder keeps histogram samples until upkeep folds them in; render() does too,
    // this only bounds memory between scrapes.
    let upkeep = handle.clone();
    let upkeep_shutdown = shutdown.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = upkeep_shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(5)) => upkeep.run_upkeep(),
            }
        }
    });
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|axum::extract::State(handle): axum::extract::State<PrometheusHandle>| async move {
            ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render())
        }),
    );
    let router = router.with_state(handle);
    tokio::spawn(async move {
        let served = axum::serve(listener, router).with_graceful_shutdown(shutdown.cancelled_owned()).await;
        if let Err(error) = served {
            tracing::warn!(%error, "metrics endpoint stopped");
        }
    });
    tracing::info!(%address, "metrics serving on /metrics");
    Ok(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn metrics_stay_on_loopback_unless_a_network_address_is_named() {
        // Refused before the recorder is installed: nothing is served.
        let error = serve_metrics("0.0.0.0:0", false, CancellationToken::new()).await.unwrap_err().to_string();
        assert!(error.contains("not a loopback address") && error.contains("--metrics-listen-network"), "{error}");
        let flags = TelemetryFlags { metrics_listen: Some("0.0.0.0:0".into()), ..Default::default() };
        assert!(flags.serve_metrics(CancellationToken::new()).await.is_err());
        assert_eq!(TelemetryFlags::default().serve_metrics(CancellationToken::new()).await.unwrap(), None);
    }
}
